package main

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/retinadb/retina/internal/server"
)

func TestVersionCommand(t *testing.T) {
	var out bytes.Buffer
	root := newRootCommand()
	root.SetOut(&out)
	root.SetArgs([]string{"version"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "retina ") || !strings.Contains(out.String(), "go1.") {
		t.Fatalf("version output %q", out.String())
	}
}

func TestUnknownCommandFails(t *testing.T) {
	root := newRootCommand()
	root.SetOut(&bytes.Buffer{})
	root.SetErr(&bytes.Buffer{})
	root.SetArgs([]string{"no-such-command"})
	if err := root.Execute(); err == nil {
		t.Fatal("unknown command accepted")
	}
}

// TestServeFlagsOverrideOnlyWhenGiven: the serve command's real flags,
// parsed from a command line, override the config file and the environment
// only where they are given; a flag given at its default value still wins.
func TestServeFlagsOverrideOnlyWhenGiven(t *testing.T) {
	file := filepath.Join(t.TempDir(), "retina.yaml")
	os.WriteFile(file, []byte("sql_addr: 127.0.0.1:7000\ndata: /file/data\nbuckets: 4\nlog_format: json\n"), 0o644)
	env := map[string]string{"RETINA_REPLAYERS": "3", "RETINA_BUCKETS": "8", "RETINA_DECIMAL_HANDLING": "string"}
	cmd, sf := serveCommand()
	err := cmd.Flags().Parse([]string{"--config", file, "--data", "/flag/data", "--source", "file:/a", "--source", "file:/b", "--buckets", "16"})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := sf.resolve(cmd.Flags(), func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	want := server.DefaultConfig()
	want.DataDir, want.Sources, want.Buckets = "/flag/data", []string{"file:/a", "file:/b"}, 16 // flags
	want.Replayers, want.DecimalHandling = 3, "string"                                          // environment
	want.SQLAddr, want.LogFormat = "127.0.0.1:7000", "json"                                     // file
	if !reflect.DeepEqual(cfg, want) {
		t.Fatalf("merged config:\n got %+v\nwant %+v", cfg, want)
	}
	// A value no setting accepts is refused with the setting named.
	cmd, sf = serveCommand()
	cmd.Flags().Parse([]string{"--decimal-handling", "exact"})
	if _, err := sf.resolve(cmd.Flags(), func(string) string { return "" }); err == nil || !strings.Contains(err.Error(), "decimal_handling") {
		t.Fatalf("bad decimal handling: %v", err)
	}
}
