package skeena

import (
	"bufio"
	"context"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The kill -9 tests run a child copy of this test binary that commits
// transactions as fast as it can and prints a line for each acknowledged
// one; the parent SIGKILLs it mid-stream, reopens the store (recovery)
// and checks that every acknowledged transaction is there and that no
// cross-engine transaction is in one engine only. Several rounds run on
// one directory, so recovery also starts from a recovered store.

const (
	envKillDir   = "SKEENA_KILL_CHILD_DIR"
	envKillMode  = "SKEENA_KILL_CHILD_MODE"
	envKillFirst = "SKEENA_KILL_CHILD_FIRST"
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(envKillDir); dir != "" {
		os.Exit(killChild(dir, os.Getenv(envKillMode), os.Getenv(envKillFirst)))
	}
	os.Exit(m.Run())
}

// killChild writes transactions until killed. Transaction i writes key
// "<i>" to the memory table, the storage table or both (mode mem, disk,
// cross: a random mix of the three).
func killChild(dir, mode, firstArg string) int {
	first, _ := strconv.Atoi(firstArg)
	s, err := Open(context.Background(), Options{Dir: dir, Tables: testTables(), StorageCacheBytes: 8 << 20,
		CSRPartSize: 64, CheckpointEvery: 30 * time.Millisecond})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if mode == "cross" {
		// Two accounts, one per engine, that transfers keep at 2000.
		tx := s.Begin()
		ctx := context.Background()
		if _, ok, err := tx.Get(ctx, "m", []byte("acct")); err == nil && !ok {
			_ = tx.Put(ctx, "m", []byte("acct"), []byte("b:1000"))
			_ = tx.Put(ctx, "d", []byte("acct"), []byte("b:1000"))
		}
		if err := tx.Commit(ctx); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
	}
	out := bufio.NewWriter(os.Stdout)
	var mu sync.Mutex
	var next atomic.Int64
	next.Store(int64(first))
	fmt.Fprintln(out, "ready")
	out.Flush()
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func(seed int64) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(seed))
			for {
				if mode == "cross" && seed%4 == 0 {
					transferAcct(s, rng.Intn(21)-10)
					continue
				}
				id := next.Add(1)
				where := mode
				if mode == "cross" {
					where = []string{"mem", "disk", "cross"}[rng.Intn(3)]
				}
				key := []byte(strconv.FormatInt(id, 10))
				val := []byte("g:" + where)
				tx := s.Begin()
				ctx := context.Background()
				if where != "disk" {
					_ = tx.Put(ctx, "m", key, val)
				}
				if where != "mem" {
					_ = tx.Put(ctx, "d", key, val)
				}
				if err := tx.Commit(ctx); err != nil {
					continue
				}
				mu.Lock()
				fmt.Fprintf(out, "ack %d %s\n", id, where)
				out.Flush()
				mu.Unlock()
			}
		}(int64(w) + int64(first))
	}
	wg.Wait()
	return 0
}

// transferAcct moves amount from the storage account to the memory one.
func transferAcct(s *Store, amount int) {
	ctx := context.Background()
	tx := s.Begin()
	defer tx.Rollback()
	var bal [2]int
	for i, table := range []string{"m", "d"} {
		v, ok, err := tx.Get(ctx, table, []byte("acct"))
		if err != nil || !ok {
			return
		}
		bal[i], _ = strconv.Atoi(strings.TrimPrefix(string(v), "b:"))
	}
	if tx.Put(ctx, "m", []byte("acct"), []byte("b:"+strconv.Itoa(bal[0]+amount))) != nil ||
		tx.Put(ctx, "d", []byte("acct"), []byte("b:"+strconv.Itoa(bal[1]-amount))) != nil {
		return
	}
	_ = tx.Commit(ctx)
}

func TestKill9(t *testing.T) {
	rounds := 4
	if testing.Short() {
		rounds = 2
	}
	for _, mode := range []string{"mem", "disk", "cross"} {
		t.Run(mode, func(t *testing.T) {
			dir := t.TempDir()
			acked := map[int64]string{}
			first := 0
			for round := 0; round < rounds; round++ {
				runUntilKilled(t, dir, mode, first, 200+rand.Intn(400), acked)
				first += 1_000_000
				verifyAfterKill(t, dir, acked)
			}
		})
	}
}

func runUntilKilled(t *testing.T, dir, mode string, first, acks int, acked map[int64]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envKillDir+"="+dir, envKillMode+"="+mode, envKillFirst+"="+strconv.Itoa(first))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stdout)
	n := 0
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 3 && f[0] == "ack" {
			id, _ := strconv.ParseInt(f[1], 10, 64)
			acked[id] = f[2]
			if n++; n == acks {
				_ = cmd.Process.Kill() // SIGKILL
				break
			}
		}
	}
	// Acks already written to the pipe before the kill count too.
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 3 && f[0] == "ack" {
			id, _ := strconv.ParseInt(f[1], 10, 64)
			acked[id] = f[2]
		}
	}
	_ = cmd.Wait()
	if n < acks {
		t.Fatalf("child stopped after %d acknowledgements: %s", n, stderr.String())
	}
}

func verifyAfterKill(t *testing.T, dir string, acked map[int64]string) {
	t.Helper()
	s := openStore(t, dir, nil)
	defer s.Close()
	ctx := context.Background()
	tx := s.Begin()
	defer tx.Rollback()
	rows := map[string]map[string]string{"m": {}, "d": {}}
	for table, m := range rows {
		if err := tx.Scan(ctx, table, "", nil, nil, func(k, v []byte) bool {
			m[string(k)] = string(v)
			return true
		}); err != nil {
			t.Fatal(err)
		}
	}
	if m, d := rows["m"]["acct"], rows["d"]["acct"]; m != "" || d != "" {
		bm, _ := strconv.Atoi(strings.TrimPrefix(m, "b:"))
		bd, _ := strconv.Atoi(strings.TrimPrefix(d, "b:"))
		if bm+bd != 2000 {
			t.Errorf("after recovery the cross-engine accounts hold %s + %s, want a total of 2000", m, d)
		}
		t.Logf("cross-engine accounts after recovery: memory %d, storage %d", bm, bd)
	}
	for id, where := range acked {
		k := strconv.FormatInt(id, 10)
		if where != "disk" && rows["m"][k] == "" {
			t.Fatalf("acknowledged %s transaction %d lost its memory row", where, id)
		}
		if where != "mem" && rows["d"][k] == "" {
			t.Fatalf("acknowledged %s transaction %d lost its storage row", where, id)
		}
	}
	delete(rows["m"], "acct")
	delete(rows["d"], "acct")
	halves := 0
	for k, v := range rows["m"] {
		if v == "g:cross" && rows["d"][k] != "g:cross" {
			t.Errorf("cross-engine transaction %s survived in memory only", k)
			halves++
		}
	}
	for k, v := range rows["d"] {
		if v == "g:cross" && rows["m"][k] != "g:cross" {
			t.Errorf("cross-engine transaction %s survived in storage only", k)
			halves++
		}
	}
	t.Logf("after kill: %d acknowledged, %d memory rows, %d storage rows, %d half transactions",
		len(acked), len(rows["m"]), len(rows["d"]), halves)
}
