package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow/array"
	icerest "github.com/apache/iceberg-go/catalog/rest"
	icetable "github.com/apache/iceberg-go/table"

	"github.com/retinadb/retina/internal/failpoint"
)

// streamTransfers appends balance-preserving transfers between the accounts to
// a source file until stop closes; balances is the accounts' state.
func streamTransfers(t *testing.T, src string, balances []int64, stop <-chan struct{}) {
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		case <-time.After(100 * time.Millisecond):
		}
		from, to := i%len(balances), (i*7+3)%len(balances)
		if from == to {
			continue
		}
		c := newChanges()
		owner := func(id int) string { return fmt.Sprint("o", id+1) }
		before := [2]string{accountRow(from+1, owner(from), balances[from]), accountRow(to+1, owner(to), balances[to])}
		balances[from] -= 10
		balances[to] += 10
		c.txn(fmt.Sprint("move", i),
			event{"u", before[0], accountRow(from+1, owner(from), balances[from])},
			event{"u", before[1], accountRow(to+1, owner(to), balances[to])})
		f, err := os.OpenFile(src, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			return
		}
		f.WriteString(strings.Join(c.lines, "\n") + "\n")
		f.Close()
	}
}

// TestIcebergPublicationSurvivesKills: `retina serve` is killed with
// SIGKILL at each step of an Iceberg publication while transfers stream
// in; after a restart the REST catalog serves whole snapshots only: every
// snapshot it lists loads and scans (no metadata names a missing file) and
// holds the bank's invariant, and publication goes on.
func TestIcebergPublicationSurvivesKills(t *testing.T) {
	if testing.Short() {
		t.Skip("starts retina serve twice per failpoint")
	}
	c := newChanges()
	var rows []string
	balances := make([]int64, 100)
	for id := range balances {
		balances[id] = 100
		rows = append(rows, accountRow(id+1, fmt.Sprint("o", id+1), 100))
	}
	c.snapshot(rows...)
	for _, point := range failpoint.Iceberg() {
		t.Run(point, func(t *testing.T) {
			dir := t.TempDir()
			src := filepath.Join(dir, "in.jsonl")
			c.write(t, src)
			config := accountConfig(t, dir, "block_rows: 16\nfile_blocks: 4\n")
			args := []string{"--config", config, "--data", filepath.Join(dir, "data"), "--source", "file:" + src,
				"--iceberg-interval", "1s", "--iceberg-addr", "127.0.0.1:0", "--storage-gc-interval", "1s", "--storage-gc-stale-share", "0.2"}
			armed := exec.Command(os.Args[0], append([]string{"serve", "--sql-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}, args...)...)
			// Killed at a later publication as often as at the first: the
			// earlier one must stay current.
			armed.Env = append(os.Environ(), "RETINA_TEST_RUN_MAIN=1", failpoint.EnvVar+"="+point+"=kill@0.4")
			var out lockedBuffer
			armed.Stdout, armed.Stderr = &out, &out
			if err := armed.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- armed.Wait() }()
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Go(func() { streamTransfers(t, src, append([]int64(nil), balances...), stop) })
			defer func() {
				close(stop)
				wg.Wait()
			}()
			select {
			case err := <-done:
				if ws, ok := err.(*exec.ExitError); !ok || ws.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
					t.Fatalf("the server ended with %v, not killed at %s:\n%s", err, point, out.String())
				}
			case <-time.After(60 * time.Second):
				armed.Process.Kill()
				t.Fatalf("%s was never reached in 60s:\n%s", point, out.String())
			}
			s := startServe(t, args...)
			s.waitRows("SELECT count(*), sum(balance)::VARCHAR FROM account", "100 10000.00")
			checkIcebergSnapshots(t, s.icebergURI, 100, 10000_00)
			s.healthy()
			s.stop()
		})
	}
}

// checkIcebergSnapshots loads the account table from the catalog and scans
// every snapshot it lists: each has rows accounts summing to cents.
func checkIcebergSnapshots(t *testing.T, uri string, accounts int, cents int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cat, err := icerest.NewCatalog(ctx, "retina", uri)
	if err != nil {
		t.Fatal(err)
	}
	var tbl *icetable.Table
	for {
		if tbl, err = cat.LoadTable(ctx, icetable.Identifier{"public", "account"}); err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the catalog serves no account table: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	snaps := tbl.Metadata().Snapshots()
	if len(snaps) == 0 {
		t.Fatal("the account table lists no snapshot")
	}
	for _, s := range snaps {
		at, err := tbl.Scan(icetable.WithSnapshotID(s.SnapshotID), icetable.WithSelectedFields("balance")).ToArrowTable(ctx)
		if err != nil {
			t.Fatalf("snapshot %d (retina.snapshot-ts %s): %v", s.SnapshotID, s.Summary.Properties["retina.snapshot-ts"], err)
		}
		var sum int64
		n := 0
		for _, chunk := range at.Column(0).Data().Chunks() {
			d := chunk.(*array.Decimal128)
			for i := range d.Len() {
				sum += int64(d.Value(i).LowBits())
				n++
			}
		}
		at.Release()
		if n != accounts || sum != cents {
			t.Fatalf("snapshot %d (retina.snapshot-ts %s): %d accounts with %d cents, want %d with %d", s.SnapshotID,
				s.Summary.Properties["retina.snapshot-ts"], n, sum, accounts, cents)
		}
	}
}
