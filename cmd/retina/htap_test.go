package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
)

// TestHTAPRecoversAfterKill runs bank transfers through the MySQL endpoint
// of `retina serve --mysql-addr`, each one a cross-engine transaction
// (accounts in the memory engine, its ledger row in the storage engine),
// and kills the process with SIGKILL while they run, twice. Every Retina
// snapshot read while they run keeps the bank's invariants (money is
// conserved; every ledger row has its account update), and after each
// restart Retina's tables equal the store's.
func TestHTAPRecoversAfterKill(t *testing.T) {
	if testing.Short() {
		t.Skip("starts retina serve several times")
	}
	dir := t.TempDir()
	args := []string{"--data", filepath.Join(dir, "data"), "--mysql-addr", "127.0.0.1:0", "--memory-tables", "accounts",
		"--checkpoint-interval", "1s"}
	const accounts, start = 40, 1000
	s := startServe(t, args...)
	db := openMySQL(t, s.mysqlAddr)
	mustExec(t, db,
		"CREATE TABLE accounts (id INT PRIMARY KEY, balance BIGINT NOT NULL, transfers_out INT NOT NULL)",
		"CREATE TABLE ledger (id BIGINT PRIMARY KEY, src INT NOT NULL, dst INT NOT NULL, amount BIGINT NOT NULL)")
	var values []string
	for i := 1; i <= accounts; i++ {
		values = append(values, fmt.Sprintf("(%d, %d, 0)", i, start))
	}
	mustExec(t, db, "INSERT INTO accounts VALUES "+strings.Join(values, ", "))
	invariants := []string{
		"SELECT sum(balance) = " + fmt.Sprint(accounts*start) + " FROM accounts",
		"SELECT (SELECT count(*) FROM ledger) = (SELECT coalesce(sum(transfers_out), 0) FROM accounts)",
	}
	s.waitRows("SELECT count(*) FROM accounts", fmt.Sprint(accounts))
	s.waitRows("SELECT count(*) FROM ledger", "0")
	var nextID atomic.Int64
	for round := range 3 {
		ctx, stop := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		var committed atomic.Int64
		for w := range 3 {
			wg.Go(func() { transfers(ctx, db, rand.New(rand.NewSource(int64(round*10+w))), accounts, &nextID, &committed) })
		}
		// Read Retina while the transfers run: every snapshot keeps the
		// invariants (one read transaction per check).
		for committed.Load() < 150 {
			for _, q := range invariants {
				if got := strings.Join(s.query(q), ";"); got != "true" {
					t.Fatalf("round %d: %s on a Retina snapshot: %s", round, q, got)
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
		if round < 2 {
			s.cmd.Process.Signal(syscall.SIGKILL)
			<-s.exited
		}
		stop()
		wg.Wait()
		db.Close()
		if round < 2 {
			s = startServe(t, args...)
		}
		db = openMySQL(t, s.mysqlAddr)
		// The store is what it acknowledged (or more); Retina must equal it.
		for _, q := range []string{"SELECT id, balance, transfers_out FROM accounts ORDER BY id", "SELECT id, src, dst, amount FROM ledger ORDER BY id"} {
			s.waitRows(q, strings.Join(mysqlRows(t, db, q), "; "))
		}
		for _, q := range invariants {
			s.waitRows(q, "true")
		}
	}
	db.Close()
	s.stop()
}

// transfers moves money between random accounts until ctx ends or the
// server goes away; each transfer also writes a ledger row.
func transfers(ctx context.Context, db *sql.DB, rng *rand.Rand, accounts int, nextID, committed *atomic.Int64) {
	for ctx.Err() == nil {
		a, b := 1+rng.Intn(accounts), 1+rng.Intn(accounts)
		if a == b {
			continue
		}
		amount := 1 + rng.Intn(20)
		id := nextID.Add(1)
		err := func() error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback()
			for _, q := range []string{
				fmt.Sprintf("UPDATE accounts SET balance = balance - %d, transfers_out = transfers_out + 1 WHERE id = %d", amount, a),
				fmt.Sprintf("UPDATE accounts SET balance = balance + %d WHERE id = %d", amount, b),
				fmt.Sprintf("INSERT INTO ledger VALUES (%d, %d, %d, %d)", id, a, b, amount),
			} {
				if _, err := tx.ExecContext(ctx, q); err != nil {
					return err
				}
			}
			return tx.Commit()
		}()
		if err == nil {
			committed.Add(1)
		} else if errors.Is(err, context.Canceled) {
			return
		}
		// Conflicts are retried with new transfers; a dead server ends
		// the loop through ctx.
	}
}

func openMySQL(t *testing.T, addr string) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", fmt.Sprintf("root@tcp(%s)/bank?timeout=5s&readTimeout=30s&writeTimeout=30s", addr))
	if err != nil {
		t.Fatal(err)
	}
	return db
}

func mustExec(t *testing.T, db *sql.DB, stmts ...string) {
	t.Helper()
	for _, q := range stmts {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("mysql: %s: %v", q, err)
		}
	}
}

// mysqlRows renders each row as pgx's Values do in served.query: values
// separated by spaces.
func mysqlRows(t *testing.T, db *sql.DB, q string) []string {
	t.Helper()
	rs, err := db.Query(q)
	if err != nil {
		t.Fatalf("mysql: %s: %v", q, err)
	}
	defer rs.Close()
	cols, _ := rs.Columns()
	var out []string
	for rs.Next() {
		vals := make([]sql.RawBytes, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rs.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		parts := make([]string, len(vals))
		for i, v := range vals {
			parts[i] = string(v)
		}
		out = append(out, strings.Join(parts, " "))
	}
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
