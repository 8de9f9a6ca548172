package pgwire_test

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/retinadb/retina/internal/change"
	"github.com/retinadb/retina/internal/server/servertest"
)

// rawClient speaks the protocol message by message, for what drivers do
// not expose (row limits on Execute, portals kept across Syncs).
type rawClient struct {
	t  *testing.T
	fe *pgproto3.Frontend
}

func dialRaw(t *testing.T, url string) *rawClient {
	t.Helper()
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := net.DialTimeout("tcp", fmt.Sprintf("%s:%d", cfg.Host, cfg.Port), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	nc.SetDeadline(time.Now().Add(30 * time.Second))
	t.Cleanup(func() { nc.Close() })
	c := &rawClient{t: t, fe: pgproto3.NewFrontend(nc, nc)}
	c.send(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersionNumber, Parameters: map[string]string{"user": "retina"}})
	c.until("Z")
	return c
}

func (c *rawClient) send(msgs ...pgproto3.FrontendMessage) {
	c.t.Helper()
	for _, m := range msgs {
		c.fe.Send(m)
	}
	if err := c.fe.Flush(); err != nil {
		c.t.Fatal(err)
	}
}

// until reads messages up to the first of the given type letter and
// returns a transcript: one letter per message, D rows as their text.
func (c *rawClient) until(last string) string {
	c.t.Helper()
	var b strings.Builder
	for {
		m, err := c.fe.Receive()
		if err != nil {
			c.t.Fatalf("after %q: %v", b.String(), err)
		}
		var letter string
		switch m := m.(type) {
		case *pgproto3.ParseComplete:
			letter = "1"
		case *pgproto3.BindComplete:
			letter = "2"
		case *pgproto3.CloseComplete:
			letter = "3"
		case *pgproto3.RowDescription:
			letter = "T"
		case *pgproto3.DataRow:
			letter = "D" + string(m.Values[0])
		case *pgproto3.PortalSuspended:
			letter = "s"
		case *pgproto3.CommandComplete:
			letter = "C(" + string(m.CommandTag) + ")"
		case *pgproto3.ReadyForQuery:
			letter = "Z" + string(m.TxStatus)
		case *pgproto3.ErrorResponse:
			letter = "E(" + m.Code + ")"
		case *pgproto3.NoData:
			letter = "n"
		default:
			letter = fmt.Sprintf("%T", m)
		}
		b.WriteString(letter + " ")
		if strings.HasPrefix(letter, last) {
			return strings.TrimSpace(b.String())
		}
	}
}

func TestPortalsSuspendAndResume(t *testing.T) {
	n := servertest.OpenNode(t)
	tb := servertest.CreateTable(t, n, "account", accountCols(), "id")
	var ops []change.Op
	for i := range 5 {
		ops = append(ops, change.Op{Table: tb.ID, Kind: change.Insert, Row: []any{int64(i), "o", int64(10)}})
	}
	servertest.Apply(t, n, ops...)
	c := dialRaw(t, serve(t, n))

	// Row limits within one Sync: two rows, two rows, the rest.
	sel := &pgproto3.Parse{Name: "s", Query: "SELECT id FROM account ORDER BY id"}
	c.send(sel, &pgproto3.Bind{PreparedStatement: "s"},
		&pgproto3.Execute{MaxRows: 2}, &pgproto3.Execute{MaxRows: 2}, &pgproto3.Execute{}, &pgproto3.Sync{})
	if got, want := c.until("Z"), "1 2 D0 D1 s D2 D3 s D4 C(SELECT 1) ZI"; got != want {
		t.Fatalf("limited executes:\n got %s\nwant %s", got, want)
	}

	// Inside a transaction a portal outlives Sync, as JDBC's fetch size
	// relies on; a second portal of the same statement runs beside it.
	c.send(&pgproto3.Query{String: "/* a comment first */ BEGIN"})
	if got := c.until("Z"); got != "C(BEGIN) ZT" {
		t.Fatalf("BEGIN after a comment: %s", got)
	}
	c.send(&pgproto3.Bind{PreparedStatement: "s", DestinationPortal: "p"}, &pgproto3.Execute{Portal: "p", MaxRows: 3}, &pgproto3.Sync{})
	if got, want := c.until("Z"), "2 D0 D1 D2 s ZT"; got != want {
		t.Fatalf("first fetch: got %s want %s", got, want)
	}
	c.send(&pgproto3.Bind{PreparedStatement: "s", DestinationPortal: "q"}, &pgproto3.Execute{Portal: "q", MaxRows: 1}, &pgproto3.Sync{})
	if got, want := c.until("Z"), "2 D0 s ZT"; got != want {
		t.Fatalf("second portal: got %s want %s", got, want)
	}
	c.send(&pgproto3.Execute{Portal: "p", MaxRows: 3}, &pgproto3.Sync{})
	if got, want := c.until("Z"), "D3 D4 C(SELECT 2) ZT"; got != want {
		t.Fatalf("resumed fetch: got %s want %s", got, want)
	}
	c.send(&pgproto3.Query{String: "COMMIT"})
	c.until("Z")

	// Outside a transaction, Sync ends the portal.
	c.send(&pgproto3.Bind{PreparedStatement: "s", DestinationPortal: "p"}, &pgproto3.Execute{Portal: "p", MaxRows: 1}, &pgproto3.Sync{})
	c.until("Z")
	c.send(&pgproto3.Execute{Portal: "p"}, &pgproto3.Sync{})
	if got, want := c.until("Z"), "E(34000) ZI"; got != want {
		t.Fatalf("portal after Sync: got %s want %s", got, want)
	}

}

// An error inside a transaction fails it, as in PostgreSQL: statements are
// refused (25P02) until its end, and COMMIT then rolls back.
func TestFailedTransaction(t *testing.T) {
	n := servertest.OpenNode(t)
	servertest.CreateTable(t, n, "account", accountCols(), "id")
	c := dialRaw(t, serve(t, n))
	for _, step := range []struct{ sql, want string }{
		{"BEGIN", "C(BEGIN) ZT"},
		{"SELECT nosuch FROM account", "E(42703) ZE"},
		{"SELECT 1", "E(25P02) ZE"},
		{"COMMIT", "C(ROLLBACK) ZI"},
		{"SELECT 1", "T D1 C(SELECT 1) ZI"},
		{"BEGIN", "C(BEGIN) ZT"},
		{"SELECT 1/0 FROM nosuch", "E(42P01) ZE"},
		{"ROLLBACK", "C(ROLLBACK) ZI"},
	} {
		c.send(&pgproto3.Query{String: step.sql})
		if got := c.until("Z"); got != step.want {
			t.Fatalf("%s: got %s, want %s", step.sql, got, step.want)
		}
	}
}

// What the review of the protocol found: each step is PostgreSQL's answer.
func TestProtocolEdges(t *testing.T) {
	n := servertest.OpenNode(t)
	tb := servertest.CreateTable(t, n, "account", accountCols(), "id")
	servertest.Apply(t, n,
		change.Op{Table: tb.ID, Kind: change.Insert, Row: []any{int64(1), "o", int64(10)}},
		change.Op{Table: tb.ID, Kind: change.Insert, Row: []any{int64(2), "o", int64(10)}})
	c := dialRaw(t, serve(t, n))
	sel := "SELECT id FROM account ORDER BY id"
	for _, step := range []struct {
		name string
		msgs []pgproto3.FrontendMessage
		want string
	}{
		{"a text DuckDB reads as three statements is refused, and nothing of it runs",
			[]pgproto3.FrontendMessage{&pgproto3.Query{String: "SELECT 1 AS a$b$; DROP VIEW account; SELECT 1 AS c$b$"}}, "E(42601) ZI"},
		{"the table is still there", []pgproto3.FrontendMessage{&pgproto3.Query{String: "SELECT count(*) FROM account"}}, "T D2 C(SELECT 1) ZI"},
		{"begin", []pgproto3.FrontendMessage{&pgproto3.Query{String: "BEGIN"}}, "C(BEGIN) ZT"},
		{"a portal suspended on the unnamed statement",
			[]pgproto3.FrontendMessage{&pgproto3.Parse{Query: sel}, &pgproto3.Bind{DestinationPortal: "p"}, &pgproto3.Execute{Portal: "p", MaxRows: 1}, &pgproto3.Sync{}},
			"1 2 D1 s ZT"},
		{"the unnamed statement replaced while the portal is open (a crash before)",
			[]pgproto3.FrontendMessage{&pgproto3.Parse{Query: "SELECT 42"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{}},
			"1 2 D42 C(SELECT 1) ZT"},
		{"the portal goes on", []pgproto3.FrontendMessage{&pgproto3.Execute{Portal: "p"}, &pgproto3.Sync{}}, "D2 C(SELECT 1) ZT"},
		{"a finished portal has no more rows", []pgproto3.FrontendMessage{&pgproto3.Execute{Portal: "p"}, &pgproto3.Sync{}}, "C(SELECT 0) ZT"},
		{"a named statement twice", []pgproto3.FrontendMessage{&pgproto3.Parse{Name: "s", Query: sel}, &pgproto3.Parse{Name: "s", Query: sel}, &pgproto3.Sync{}}, "1 E(42P05) ZE"},
		{"which fails the transaction, as any error in it", []pgproto3.FrontendMessage{&pgproto3.Query{String: "ROLLBACK; BEGIN"}}, "C(ROLLBACK) C(BEGIN) ZT"},
		{"savepoint", []pgproto3.FrontendMessage{&pgproto3.Query{String: "SAVEPOINT sp"}}, "C(SAVEPOINT) ZT"},
		{"an error fails the transaction", []pgproto3.FrontendMessage{&pgproto3.Query{String: "SELECT nosuch"}}, "E(42703) ZE"},
		{"rollback to the savepoint goes on", []pgproto3.FrontendMessage{&pgproto3.Query{String: "ROLLBACK TO SAVEPOINT sp"}}, "C(ROLLBACK) ZT"},
		{"and the transaction works", []pgproto3.FrontendMessage{&pgproto3.Query{String: "RELEASE sp; SELECT 7"}}, "C(RELEASE) T D7 C(SELECT 1) ZT"},
		{"a cursor is declared for a query only", []pgproto3.FrontendMessage{&pgproto3.Query{String: "DECLARE c CURSOR FOR COMMIT"}}, "E(42601) ZE"},
		{"commit of a failed transaction rolls back", []pgproto3.FrontendMessage{&pgproto3.Query{String: "COMMIT"}}, "C(ROLLBACK) ZI"},
		{"a bad parameter value", []pgproto3.FrontendMessage{&pgproto3.Parse{Query: "SELECT $1::int8"}, &pgproto3.Bind{Parameters: [][]byte{[]byte("x1")}}, &pgproto3.Sync{}}, "1 E(22P02) ZI"},
	} {
		c.send(step.msgs...)
		if got := c.until("Z"); got != step.want {
			t.Fatalf("%s: got %s, want %s", step.name, got, step.want)
		}
	}
}
