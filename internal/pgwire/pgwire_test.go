package pgwire_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow/decimal128"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/change"
	"github.com/retinadb/retina/internal/pgwire"
	"github.com/retinadb/retina/internal/server"
	"github.com/retinadb/retina/internal/server/servertest"
	"github.com/retinadb/retina/internal/types"
)

// serve starts the endpoint on 127.0.0.1 for the node.
func serve(t *testing.T, n *server.Node) string {
	t.Helper()
	return "postgres://retina@" + serveWith(t, n, pgwire.Options{}) + "/retina?sslmode=disable"
}

func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func accountCols() []catalog.Column {
	return []catalog.Column{
		{Name: "id", Type: types.Of(types.Int64)},
		{Name: "owner", Type: types.Of(types.String), Nullable: true},
		{Name: "balance", Type: types.Of(types.Int64)},
	}
}

func TestProtocolsAndTypes(t *testing.T) {
	n := servertest.OpenNode(t)
	tb := servertest.CreateTable(t, n, "typed", []catalog.Column{
		{Name: "id", Type: types.Of(types.Int32)},
		{Name: "amount", Type: types.DecimalOf(12, 3), Nullable: true},
		{Name: "name", Type: types.Of(types.String), Nullable: true},
		{Name: "day", Type: types.Of(types.Date), Nullable: true},
		{Name: "stamp", Type: types.Of(types.Timestamp), Nullable: true},
		{Name: "ok", Type: types.Of(types.Bool), Nullable: true},
		{Name: "raw", Type: types.Of(types.Bytes), Nullable: true},
		{Name: "ratio", Type: types.Of(types.Float64), Nullable: true},
	}, "id")
	amt, _ := decimal128.FromString("-1234.5", 12, 3)
	servertest.Apply(t, n,
		change.Op{Table: tb.ID, Kind: change.Insert, Row: []any{int64(1), amt, "héllo", types.DateDays(19783), types.TimestampMicros(1709290800123456), true, []byte{0, 1, 255}, 0.25}},
		change.Op{Table: tb.ID, Kind: change.Insert, Row: []any{int64(2), nil, nil, nil, nil, nil, nil, nil}},
	)
	c := connect(t, serve(t, n))
	ctx := context.Background()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheStatement, pgx.QueryExecModeDescribeExec} {
		var (
			id     int32
			amount pgtype.Numeric
			name   pgtype.Text
			day    pgtype.Date
			at     pgtype.Timestamp
			ok     pgtype.Bool
			raw    []byte
			ratio  pgtype.Float8
		)
		err := c.QueryRow(ctx, "SELECT id, amount, name, day, stamp, ok, raw, ratio FROM typed WHERE id = $1", mode, 1).
			Scan(&id, &amount, &name, &day, &at, &ok, &raw, &ratio)
		if err != nil {
			t.Fatalf("mode %v: %v", mode, err)
		}
		f, _ := amount.Float64Value()
		if id != 1 || f.Float64 != -1234.5 || name.String != "héllo" || day.Time.Format("2006-01-02") != "2024-03-01" ||
			at.Time.UnixMicro() != 1709290800123456 || !ok.Bool || string(raw) != "\x00\x01\xff" || ratio.Float64 != 0.25 {
			t.Fatalf("mode %v: %v %v %v %v %v %v %v %v", mode, id, f, name, day.Time, at.Time, ok, raw, ratio)
		}
		err = c.QueryRow(ctx, "SELECT amount, name, day, stamp, ok, raw FROM typed WHERE id = $1", mode, 2).
			Scan(&amount, &name, &day, &at, &ok, &raw)
		if err != nil || amount.Valid || name.Valid || day.Valid || at.Valid || ok.Valid || raw != nil {
			t.Fatalf("mode %v NULLs: %v", mode, err)
		}
		var s string
		var big pgtype.Numeric
		if err := c.QueryRow(ctx, "SELECT $1::VARCHAR || '!', $2::DECIMAL(10,2) * 2", mode, "x", "2.25").Scan(&s, &big); err != nil {
			t.Fatalf("mode %v parameters: %v", mode, err)
		}
		if bf, _ := big.Float64Value(); s != "x!" || bf.Float64 != 4.5 {
			t.Fatalf("mode %v parameters: %q %v", mode, s, bf)
		}
	}
	// Several statements in one simple query; an error carries a SQLSTATE.
	if _, err := c.Exec(ctx, "SELECT 1; SELECT 2", pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatal(err)
	}
	_, err := c.Exec(ctx, "SELECT * FROM no_such_table")
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "42P01" {
		t.Fatalf("unknown table: %v", err)
	}
	_, err = c.Exec(ctx, "SELECT * FROM read_csv('/etc/passwd')")
	if !errors.As(err, &pe) || pe.Code != "42501" {
		t.Fatalf("file access: %v", err)
	}
	_, err = c.Exec(ctx, "CREATE TABLE x (a INT)")
	if !errors.As(err, &pe) || pe.Code != "25006" {
		t.Fatalf("write: %v", err)
	}
	// The session still works after errors.
	var one int64
	if err := c.QueryRow(ctx, "SELECT count(*) FROM typed").Scan(&one); err != nil || one != 2 {
		t.Fatalf("after errors: %v %v", one, err)
	}
}

// TestCancel: a cancel request (the protocol's CancelRequest, on a second
// connection) stops the running statement on the server: the client gets
// SQLSTATE 57014 on the same connection, which stays usable, and no
// snapshot stays registered.
func TestCancel(t *testing.T) {
	n := servertest.OpenNode(t)
	c := connect(t, serve(t, n))
	errc := make(chan error, 1)
	go func() {
		_, err := c.Exec(context.Background(), "SELECT count(*) FROM range(100000000000) a")
		errc <- err
	}()
	// Cancel once the statement runs: it holds its snapshot.
	waitFor(t, "the statement to start", func() bool {
		w, _ := n.Txn.Watermarks(context.Background())
		return w.Running == 1
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.PgConn().CancelRequest(ctx); err != nil {
		t.Fatal(err)
	}
	var err error
	select {
	case err = <-errc:
	case <-time.After(60 * time.Second):
		t.Fatal("the statement went on for 60s after the cancel request")
	}
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "57014" {
		t.Fatalf("want query_canceled (57014) from the server, got %v", err)
	}
	var one int
	if err := c.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("the connection is not usable after the cancel: %v", err)
	}
	waitFor(t, "the snapshot to be released", func() bool {
		w, _ := n.Txn.Watermarks(context.Background())
		return w.Running == 0
	})
}

// waitFor polls cond until it holds; a minute without it fails the test.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited a minute for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestBankInvariant: transfers between accounts are replayed at full speed
// while clients over the wire check, thousands of times, that the total
// balance and the number of accounts never change.
func TestBankInvariant(t *testing.T) {
	n := servertest.OpenNodeWith(t, 4096, 16)
	tb := servertest.CreateTable(t, n, "account", accountCols(), "id")
	const accounts, start = 50, 1000
	var load []change.Op
	for i := range accounts {
		load = append(load, change.Op{Table: tb.ID, Kind: change.Insert, Row: []any{int64(i), "o", int64(start)}})
	}
	servertest.Apply(t, n, load...)
	url := serve(t, n)
	// Counted, not timed: the transfers run, and each reader checks until
	// they are done and it checked its share, however slow the machine.
	transferCount, readerChecks := 3000, 250
	if testing.Short() {
		transferCount, readerChecks = 500, 20
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	var transfers, checks atomic.Int64
	wg.Go(func() {
		defer cancel()
		rng := rand.New(rand.NewPCG(1, 1))
		bal := make([]int64, accounts)
		for i := range bal {
			bal[i] = start
		}
		for transfers.Load() < int64(transferCount) {
			i, j := rng.IntN(accounts), rng.IntN(accounts)
			if i == j {
				continue
			}
			amt := rng.Int64N(50)
			bal[i] -= amt
			bal[j] += amt
			servertest.Apply(t, n,
				change.Op{Table: tb.ID, Kind: change.Update, Row: []any{int64(i), "o", bal[i]}},
				change.Op{Table: tb.ID, Kind: change.Update, Row: []any{int64(j), "o", bal[j]}})
			if transfers.Add(1)%10 == 0 {
				time.Sleep(4 * time.Millisecond) // pacing only: leave the cores to the readers
			}
		}
	})
	for k := range 4 {
		wg.Go(func() {
			c := connect(t, url)
			mode := []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheStatement}[k%2]
			for did := 0; ctx.Err() == nil || did < readerChecks; did++ {
				var sum, count int64
				err := c.QueryRow(context.Background(), "SELECT sum(balance), count(*) FROM account", mode).Scan(&sum, &count)
				if err != nil {
					t.Error(err)
					return
				}
				if sum != accounts*start || count != accounts {
					t.Errorf("invariant broken: sum %d count %d", sum, count)
					return
				}
				checks.Add(1)
			}
		})
	}
	wg.Wait()
	t.Logf("%d transfers, %d invariant checks over the wire", transfers.Load(), checks.Load())
}

// TestJoinConsistency: each transaction inserts an order and bumps its
// customer's counter; joins must always see both or neither.
func TestJoinConsistency(t *testing.T) {
	n := servertest.OpenNodeWith(t, 1024, 8)
	cust := servertest.CreateTable(t, n, "customer", []catalog.Column{
		{Name: "cid", Type: types.Of(types.Int64)}, {Name: "orders", Type: types.Of(types.Int64)},
	}, "cid")
	ord := servertest.CreateTable(t, n, "orders", []catalog.Column{
		{Name: "oid", Type: types.Of(types.Int64)}, {Name: "cid", Type: types.Of(types.Int64)},
	}, "oid")
	const customers = 10
	var load []change.Op
	for i := range customers {
		load = append(load, change.Op{Table: cust.ID, Kind: change.Insert, Row: []any{int64(i), int64(0)}})
	}
	servertest.Apply(t, n, load...)
	url := serve(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() {
		counts := make([]int64, customers)
		for oid := int64(1); ctx.Err() == nil; oid++ {
			c := oid % customers
			counts[c]++
			servertest.Apply(t, n,
				change.Op{Table: ord.ID, Kind: change.Insert, Row: []any{oid, c}},
				change.Op{Table: cust.ID, Kind: change.Update, Row: []any{c, counts[c]}})
			if oid%20 == 0 {
				time.Sleep(2 * time.Millisecond)
			}
		}
	})
	var checks atomic.Int64
	for range 4 {
		wg.Go(func() {
			c := connect(t, url)
			for ctx.Err() == nil {
				rows, err := c.Query(context.Background(), `SELECT c.cid, c.orders, count(o.oid) FROM customer c LEFT JOIN orders o ON o.cid = c.cid GROUP BY c.cid, c.orders`)
				if err != nil {
					t.Error(err)
					return
				}
				for rows.Next() {
					var cid, counter, joined int64
					if err := rows.Scan(&cid, &counter, &joined); err != nil {
						t.Error(err)
						return
					}
					if counter != joined {
						t.Errorf("customer %d: counter %d, joined orders %d", cid, counter, joined)
					}
				}
				if rows.Err() != nil {
					t.Error(rows.Err())
					return
				}
				checks.Add(1)
			}
		})
	}
	wg.Wait()
	if checks.Load() < 50 {
		t.Fatalf("only %d checks", checks.Load())
	}
}

// TestSnapshotsAreReleased: thousands of statements, including failed and
// cancelled ones and abandoned read transactions, leave no snapshot.
func TestSnapshotsAreReleased(t *testing.T) {
	n := servertest.OpenNode(t)
	servertest.CreateTable(t, n, "account", accountCols(), "id")
	url := serve(t, n)
	var wg sync.WaitGroup
	for k := range 4 {
		wg.Go(func() {
			c := connect(t, url)
			for i := range 500 {
				ctx := context.Background()
				var cancel context.CancelFunc = func() {}
				q := "SELECT count(*) FROM account"
				switch i % 5 {
				case 1:
					q = "SELECT * FROM missing_table"
				case 2:
					q = "SELECT 1/0::INTEGER, count(*) FROM account"
				case 3:
					ctx, cancel = context.WithTimeout(ctx, time.Millisecond)
					q = "SELECT count(*) FROM range(1000000000)"
				}
				rows, err := c.Query(ctx, q)
				if err == nil {
					for rows.Next() {
					}
					rows.Close()
				}
				cancel()
				if c.IsClosed() {
					c = connect(t, url)
				}
				if k == 0 && i%100 == 0 {
					c.Exec(context.Background(), "BEGIN")
					c.Exec(context.Background(), "SELECT count(*) FROM account")
					c.Close(context.Background()) // gone inside a transaction
					c = connect(t, url)
				}
			}
		})
	}
	wg.Wait()
	deadline := time.Now().Add(5 * time.Second)
	for {
		w, _ := n.Txn.Watermarks(context.Background())
		if w.Running == 0 && w.LWM == w.HWM-1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("snapshots left: %+v", w)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSettings covers SET, SHOW and RESET as drivers send them, and the
// two timeouts: a statement past statement_timeout is cancelled (57014),
// and a session idle inside a transaction past
// idle_in_transaction_session_timeout is ended (FATAL 25P03), which ends
// its snapshot so the low watermark moves on.
func TestSettings(t *testing.T) {
	n := servertest.OpenNode(t)
	url := serve(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := connect(t, url)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeDescribeExec} {
		if _, err := c.Exec(ctx, "SET extra_float_digits = 3", mode); err != nil {
			t.Fatalf("mode %v: JDBC's start-up SET: %v", mode, err)
		}
		if _, err := c.Exec(ctx, "SET application_name = 'retina test'", mode); err != nil {
			t.Fatal(err)
		}
		var app, version string
		if err := c.QueryRow(ctx, "SHOW application_name", mode).Scan(&app); err != nil || app != "retina test" {
			t.Fatalf("mode %v: SHOW application_name: %q %v", mode, app, err)
		}
		if err := c.QueryRow(ctx, "SHOW server_version", mode).Scan(&version); err != nil || version == "" {
			t.Fatalf("mode %v: SHOW server_version: %q %v", mode, version, err)
		}
		var pe *pgconn.PgError
		if _, err := c.Exec(ctx, "SET TimeZone = 'Europe/Berlin'", mode); !errors.As(err, &pe) || pe.Code != "22023" {
			t.Fatalf("mode %v: a time zone Retina cannot honour: %v", mode, err)
		}
		if _, err := c.Exec(ctx, "SET no_such_parameter = 1", mode); !errors.As(err, &pe) || pe.Code != "42704" {
			t.Fatalf("mode %v: an unknown parameter: %v", mode, err)
		}
	}

	if _, err := c.Exec(ctx, "SET statement_timeout = '100ms'"); err != nil {
		t.Fatal(err)
	}
	var pe *pgconn.PgError
	_, err := c.Exec(ctx, "SELECT count(*) FROM range(100000000000) t(i) WHERE i % 7 = 3")
	if !errors.As(err, &pe) || pe.Code != "57014" {
		t.Fatalf("a statement past statement_timeout: %v, want SQLSTATE 57014", err)
	}
	if _, err := c.Exec(ctx, "RESET statement_timeout"); err != nil {
		t.Fatal(err)
	}
	var one int
	if err := c.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("the session after a cancelled statement: %v", err)
	}

	idle := connect(t, url)
	if _, err := idle.Exec(ctx, "SET idle_in_transaction_session_timeout = 200"); err != nil {
		t.Fatal(err)
	}
	if _, err := idle.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if err := idle.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
		t.Fatal(err)
	}
	if w, err := n.Txn.Watermarks(ctx); err != nil || w.Running != 1 {
		t.Fatalf("the open transaction holds no snapshot: %+v %v", w, err)
	}
	// The server speaks next: it ends the session.
	err = idle.PgConn().WaitForNotification(ctx)
	if !errors.As(err, &pe) || pe.Code != "25P03" || pe.Severity != "FATAL" {
		t.Fatalf("a session idle in a transaction: %v, want FATAL 25P03", err)
	}
	for {
		w, err := n.Txn.Watermarks(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if w.Running == 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the ended session still holds its snapshot: %+v", w)
		case <-time.After(10 * time.Millisecond):
		}
	}
}
