package query

import (
	"errors"
	"testing"
	"time"
)

func TestParseSetting(t *testing.T) {
	known := func(name string) bool { _, ok := newSettings(0).lookup(name); return ok }
	for _, c := range []struct {
		stmt string
		want settingStmt
		ok   bool
	}{
		{"SET extra_float_digits = 3", settingStmt{verb: "SET", name: "extra_float_digits", value: "3"}, true},
		{"set application_name to 'psql'", settingStmt{verb: "SET", name: "application_name", value: "psql"}, true},
		{"/* driver */ SET SESSION DateStyle TO 'ISO', 'MDY';", settingStmt{verb: "SET", name: "DateStyle", value: "ISO, MDY"}, true},
		{"SET TIME ZONE 'UTC'", settingStmt{verb: "SET", name: "TimeZone", value: "UTC"}, true},
		{"SET statement_timeout TO DEFAULT", settingStmt{verb: "SET", name: "statement_timeout", def: true}, true},
		{"SET retina.note = 'it''s'", settingStmt{verb: "SET", name: "retina.note", value: "it's"}, true},
		{"RESET ALL", settingStmt{verb: "RESET", name: "ALL"}, true},
		{"SHOW server_version", settingStmt{verb: "SHOW", name: "server_version"}, true},
		{"SHOW TABLES", settingStmt{}, false}, // DuckDB's
		{"SET LOCAL statement_timeout = 5", settingStmt{}, false},
		{"SELECT 1", settingStmt{}, false},
	} {
		got, ok, err := parseSetting(c.stmt, known)
		if err != nil || ok != c.ok || got != c.want {
			t.Errorf("%q: got %+v ok=%v err=%v, want %+v ok=%v", c.stmt, got, ok, err, c.want, c.ok)
		}
	}
}

func TestSettings(t *testing.T) {
	s := newSettings(10 * time.Minute)
	if v, _ := s.Get("idle_in_transaction_session_timeout"); v != "10min" {
		t.Fatalf("default idle timeout %q", v)
	}
	for _, c := range []struct{ name, value, show string }{
		{"statement_timeout", "1500", "1500ms"},
		{"statement_timeout", "2s", "2s"},
		{"statement_timeout", "90 s", "90s"},
		{"idle_in_transaction_session_timeout", "60000", "1min"},
		{"idle_in_transaction_session_timeout", "0", "0"},
		{"extra_float_digits", "3", "3"},
		{"client_encoding", "utf-8", "UTF8"},
		{"TIMEZONE", "Etc/UTC", "UTC"},
		{"application_name", "DBeaver 24", "DBeaver 24"},
	} {
		if err := s.Set(c.name, c.value); err != nil {
			t.Fatalf("SET %s = %s: %v", c.name, c.value, err)
		}
		if v, _ := s.Get(c.name); v != c.show {
			t.Errorf("SET %s = %s shows %q, want %q", c.name, c.value, v, c.show)
		}
	}
	if d := s.Duration("statement_timeout"); d != 90*time.Second {
		t.Fatalf("statement_timeout %v", d)
	}
	for _, c := range []struct{ name, value string }{
		{"statement_timeout", "soon"},
		{"statement_timeout", "5 weeks"},
		{"statement_timeout", "-1"},
		{"extra_float_digits", "0"}, // would round floats; Retina does not
		{"TimeZone", "Europe/Berlin"},
		{"client_encoding", "LATIN1"},
		{"server_version", "16"},
	} {
		if err := s.Set(c.name, c.value); !errors.Is(err, ErrSetting) {
			t.Errorf("SET %s = %s: %v, want a refusal", c.name, c.value, err)
		}
	}
	if err := s.Set("no_such_thing", "1"); !errors.Is(err, ErrUnknownSetting) {
		t.Fatalf("unknown parameter: %v", err)
	}
	if err := s.Reset("statement_timeout"); err != nil || s.Duration("statement_timeout") != 0 {
		t.Fatalf("RESET: %v, %v", err, s.Duration("statement_timeout"))
	}
	if err := s.Reset("all"); err != nil {
		t.Fatal(err)
	}
	if v, _ := s.Get("application_name"); v != "" {
		t.Fatalf("RESET ALL left application_name %q", v)
	}
}
