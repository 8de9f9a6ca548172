package main

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/retinadb/retina/internal/mysqltest"
)

// TestMySQLSourceRecoversAfterKill runs transfers on a private MariaDB
// while `retina serve --source mysql://…` copies and follows it, and kills
// Retina with SIGKILL twice: in the middle of the initial copy and in the
// middle of the stream. Every Retina snapshot read keeps the money
// conserved, and at the end Retina's tables equal MariaDB's.
func TestMySQLSourceRecoversAfterKill(t *testing.T) {
	if testing.Short() {
		t.Skip("starts MariaDB and retina serve several times")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	m, err := mysqltest.Start(ctx, mysqltest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	const accounts = 400_000
	if err := m.Exec("", "CREATE DATABASE bank"); err != nil {
		t.Fatal(err)
	}
	if err := m.Exec("bank", "CREATE TABLE acct (id int PRIMARY KEY, bal bigint NOT NULL, note varchar(20))",
		"CREATE TABLE ledger (id bigint PRIMARY KEY AUTO_INCREMENT, src int, dst int, amount int)",
		fmt.Sprintf("INSERT INTO acct SELECT seq, 100, concat('n', seq) FROM seq_1_to_%d", accounts)); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("mysql", m.DSN("bank"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		rng := rand.New(rand.NewSource(1))
		for {
			select {
			case <-stop:
				return
			default:
			}
			a, b := 1+rng.Intn(accounts), 1+rng.Intn(accounts)
			tx, err := db.Begin()
			if err != nil {
				t.Error(err)
				return
			}
			for _, q := range []string{
				fmt.Sprintf("UPDATE acct SET bal = bal - 3 WHERE id = %d", a),
				fmt.Sprintf("UPDATE acct SET bal = bal + 3 WHERE id = %d", b),
				fmt.Sprintf("INSERT INTO ledger (src, dst, amount) VALUES (%d, %d, 3)", a, b),
			} {
				if _, err := tx.Exec(q); err != nil {
					t.Error(err)
					tx.Rollback()
					return
				}
			}
			if err := tx.Commit(); err != nil {
				t.Error(err)
				return
			}
		}
	})
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()
	args := []string{"--data", t.TempDir(), "--source", m.URI("bank", ""), "--checkpoint-interval", "1s"}
	checkConserved := func(s *served) {
		t.Helper()
		rows, err := s.tryQuery("SELECT coalesce(sum(bal), 0), count(*) FROM acct")
		if err != nil {
			return // the copy may not have made the table yet
		}
		if n := strings.Fields(rows[0]); n[1] == fmt.Sprint(accounts) && n[0] != fmt.Sprint(accounts*100) {
			t.Fatalf("a Retina snapshot holds %s in %s accounts, want %d", n[0], n[1], accounts*100)
		}
	}

	// First kill: in the middle of the initial copy.
	s := startServe(t, args...)
	deadline := time.Now().Add(90 * time.Second)
	for {
		copied, _ := s.metricIf("retina_source_snapshot_rows")
		if copied > 1000 && copied < accounts/2 {
			break
		}
		if copied >= accounts/2 || time.Now().After(deadline) {
			t.Fatalf("the kill missed the copy: %v rows copied", copied)
		}
		time.Sleep(5 * time.Millisecond)
	}
	s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.exited

	// Second kill: streaming, after a checkpoint.
	s = startServe(t, args...)
	for deadline := time.Now().Add(90 * time.Second); s.metric("retina_source_transactions") < 200; time.Sleep(20 * time.Millisecond) {
		s.healthy()
		if time.Now().After(deadline) {
			t.Fatal("Retina did not stream 200 transactions in 90s")
		}
	}
	for deadline := time.Now().Add(30 * time.Second); s.metric("retina_checkpoints_total") < 1 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	checkConserved(s)
	s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.exited

	s = startServe(t, args...)
	for range 20 {
		checkConserved(s)
		time.Sleep(50 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	var pos string
	if err := db.QueryRow("SELECT @@gtid_binlog_pos").Scan(&pos); err != nil {
		t.Fatal(err)
	}
	if got := s.query(fmt.Sprintf("SELECT retina_wait_mysql('%s', 90)", pos)); got[0] != "true" {
		t.Fatalf("retina_wait_mysql: %v", got)
	}
	for _, q := range []string{
		"SELECT count(*), CAST(sum(bal) AS CHAR), CAST(sum(id * bal) AS CHAR) FROM acct",
		"SELECT count(*), CAST(sum(src) AS CHAR), CAST(sum(dst) AS CHAR), max(id) FROM ledger",
	} {
		want := strings.Join(mysqlRows(t, db, q), "; ")
		if got := strings.Join(s.query(strings.ReplaceAll(q, "AS CHAR", "AS VARCHAR")), "; "); got != want {
			t.Fatalf("%s: Retina %q, MariaDB %q", q, got, want)
		}
	}
	s.healthy()
	s.stop()
}
