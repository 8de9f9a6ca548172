package sqlexec

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
	"vitess.io/vitess/go/sqltypes"

	"github.com/retinadb/retina/internal/oltp/skeena"
	"github.com/retinadb/retina/internal/oltp/sqlstore"
)

// TestLogic runs the SQL scripts in testdata/logic, one file per feature,
// against the engine over a real store (sqllogictest style; regenerate the
// expected output with -rewrite). Commands:
//
//	exec [session=NAME]    statements, each ending with ";" at a line end:
//	                       "ok" with the rows affected, or the error
//	query [session=NAME]   one statement: its columns, then its rows
//	restart                close the store cleanly and open it again
//
// Sessions are opened on first use (database "test"); "a" is the default.
func TestLogic(t *testing.T) {
	datadriven.Walk(t, "testdata/logic", func(t *testing.T, path string) {
		h := openLogic(t, t.TempDir())
		defer h.close()
		datadriven.RunTest(t, path, func(t *testing.T, td *datadriven.TestData) string {
			switch td.Cmd {
			case "exec":
				var out strings.Builder
				for _, stmt := range splitStatements(td.Input) {
					res, err := h.session(t, td).Execute(context.Background(), stmt, nil)
					switch {
					case err != nil:
						out.WriteString(errorLine(err))
					case len(res.Fields) > 0:
						fmt.Fprintf(&out, "ok, %d rows\n", len(res.Rows))
					case res.RowsAffected > 0:
						fmt.Fprintf(&out, "ok, %d affected\n", res.RowsAffected)
					default:
						out.WriteString("ok\n")
					}
				}
				return out.String()
			case "query":
				res, err := h.session(t, td).Execute(context.Background(), strings.TrimSuffix(strings.TrimSpace(td.Input), ";"), nil)
				if err != nil {
					return errorLine(err)
				}
				return formatResult(res)
			case "restart":
				h.restart(t)
				return "ok\n"
			}
			td.Fatalf(t, "unknown command %s", td.Cmd)
			return ""
		})
	})
}

// logic is a store, its catalog and engine, and the scripts' sessions.
type logic struct {
	dir      string
	store    *skeena.Store
	eng      *Engine
	sessions map[string]*Session
}

func openLogic(t *testing.T, dir string) *logic {
	t.Helper()
	h := &logic{dir: dir}
	h.open(t)
	return h
}

func (h *logic) open(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	quiet := slog.New(slog.DiscardHandler)
	store, err := skeena.Open(ctx, skeena.Options{Dir: h.dir, Tables: sqlstore.PhysicalTables(), Logger: quiet, CheckpointEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	cat, err := sqlstore.OpenCatalog(ctx, store)
	if err != nil {
		store.Close()
		t.Fatal(err)
	}
	eng, err := New(store, cat, Config{MemoryTables: map[string]bool{"mem": true}, Logger: quiet})
	if err != nil {
		store.Close()
		t.Fatal(err)
	}
	h.store, h.eng, h.sessions = store, eng, map[string]*Session{}
}

func (h *logic) session(t *testing.T, td *datadriven.TestData) *Session {
	name := "a"
	if td.HasArg("session") {
		td.ScanArgs(t, "session", &name)
	}
	s, ok := h.sessions[name]
	if !ok {
		s = h.eng.NewSession()
		if _, err := s.Execute(context.Background(), "CREATE DATABASE IF NOT EXISTS test", nil); err == nil {
			s.SetDatabase("test")
		}
		h.sessions[name] = s
	}
	return s
}

func (h *logic) close() {
	for _, s := range h.sessions {
		s.Close()
	}
	h.store.Close()
}

func (h *logic) restart(t *testing.T) {
	t.Helper()
	for _, s := range h.sessions {
		s.Close()
	}
	if err := h.store.Close(); err != nil {
		t.Fatal(err)
	}
	h.open(t)
}

// splitStatements cuts a script into statements at lines ending with ";".
func splitStatements(input string) []string {
	var out []string
	var cur strings.Builder
	for line := range strings.SplitSeq(input, "\n") {
		cur.WriteString(line)
		cur.WriteByte('\n')
		if strings.HasSuffix(strings.TrimSpace(line), ";") {
			out = append(out, strings.TrimSuffix(strings.TrimSpace(cur.String()), ";"))
			cur.Reset()
		}
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		out = append(out, s)
	}
	return out
}

// errorLine is an error as a client sees it: the MySQL code and message.
func errorLine(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return fmt.Sprintf("error %d: %s\n", e.Code, e.Msg)
	}
	return fmt.Sprintf("error: %v\n", err)
}

// formatResult prints the column names, then one line a row, values
// separated by " | " and NULL as NULL.
func formatResult(res *sqltypes.Result) string {
	var b strings.Builder
	names := make([]string, len(res.Fields))
	for i, f := range res.Fields {
		names[i] = f.Name
	}
	b.WriteString(strings.Join(names, " | "))
	b.WriteByte('\n')
	for _, row := range res.Rows {
		vals := make([]string, len(row))
		for i, v := range row {
			if v.IsNull() {
				vals[i] = "NULL"
			} else {
				vals[i] = v.ToString()
			}
		}
		b.WriteString(strings.Join(vals, " | "))
		b.WriteByte('\n')
	}
	return b.String()
}
