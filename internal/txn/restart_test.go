package txn

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/retinadb/retina/internal/etcdtest"
)

// allocateSome hands out ranges and commits a random-looking subset, and
// returns the largest timestamp handed out.
func allocateSome(t *testing.T, s Service, rounds int) uint64 {
	t.Helper()
	var last uint64
	for i := range rounds {
		r, err := s.BeginMirror(t.Context(), 1+i%50)
		if err != nil {
			t.Fatal(err)
		}
		if i%3 != 0 {
			if err := s.CommitMirror(t.Context(), r.First); err != nil {
				t.Fatal(err)
			}
		}
		last = r.Last()
	}
	return last
}

// TestRestartNeverReissues: after allocations and an unclean stop (the
// service is dropped without Close, the directory lock released as by
// process death), a new service hands out only larger timestamps and starts
// with everything before counted as done.
func TestRestartNeverReissues(t *testing.T) {
	dir := t.TempDir()
	var highest uint64
	for round := range 5 {
		fs, err := OpenFileStore(dir)
		if err != nil {
			t.Fatal(err)
		}
		s, err := NewLocal(t.Context(), fs, Options{ReserveSize: 64, Logger: quietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		w, _ := s.Watermarks(t.Context())
		if w.Next <= highest || w.HWM != w.Next {
			t.Fatalf("round %d: restarted at %+v, highest handed out %d", round, w, highest)
		}
		highest = allocateSome(t, s, 200)
		// The process "dies": no Close, the lock goes with the process. Its
		// last reservation has landed (a dead process writes nothing more).
		s.bg.Wait()
		fs.lock.Close()
	}
}

func TestFileStoreRejectsSecondUserAndCorruption(t *testing.T) {
	dir := t.TempDir()
	fs := openFileStore(t, dir)
	if _, err := OpenFileStore(dir); err == nil {
		t.Fatal("second open of a locked directory succeeded")
	}
	if err := fs.Raise(t.Context(), 0, 10); err != nil {
		t.Fatal(err)
	}
	if err := fs.Raise(t.Context(), 0, 20); !errors.Is(err, ErrConflict) {
		t.Fatalf("stale raise: %v", err)
	}
	fs.Close()
	data, _ := os.ReadFile(filepath.Join(dir, fileStoreName))
	data[9] ^= 0xff
	os.WriteFile(filepath.Join(dir, fileStoreName), data, 0o644)
	if _, err := OpenFileStore(dir); err == nil {
		t.Fatal("corrupt bound accepted")
	}
}

// TestHelperAllocateForever is not a test on its own: the kill test runs the
// test binary with it selected, and it allocates until killed, printing the
// last timestamp of every range it was handed.
func TestHelperAllocateForever(t *testing.T) {
	dir := os.Getenv("RETINA_TXN_HELPER_DIR")
	if dir == "" {
		t.Skip("helper process for TestKillAndRestart")
	}
	fs, err := OpenFileStore(dir)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(2)
	}
	s, err := NewLocal(context.Background(), fs, Options{ReserveSize: 1000, Logger: quietLogger()})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(2)
	}
	out := bufio.NewWriter(os.Stdout)
	for {
		r, err := s.BeginMirror(context.Background(), 37)
		if err != nil {
			fmt.Println("error", err)
			os.Exit(2)
		}
		fmt.Fprintln(out, r.Last())
		out.Flush()
	}
}

// TestKillAndRestart kills a process in the middle of allocating (SIGKILL)
// and checks that a new service never hands out a timestamp it printed.
func TestKillAndRestart(t *testing.T) {
	dir := t.TempDir()
	for round := range 3 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperAllocateForever$")
		cmd.Env = append(os.Environ(), "RETINA_TXN_HELPER_DIR="+dir)
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(stdout)
		var highest uint64
		lines := 0
		deadline := time.Now().Add(20 * time.Second)
		for lines < 5000+round*3000 && sc.Scan() && time.Now().Before(deadline) {
			v, err := strconv.ParseUint(sc.Text(), 10, 64)
			if err != nil {
				cmd.Process.Kill()
				t.Fatalf("helper said %q", sc.Text())
			}
			highest = max(highest, v)
			lines++
		}
		cmd.Process.Kill()
		cmd.Wait()
		// Timestamps printed after our last read are lost with the pipe; any
		// of them was handed out too, so read the helper's high mark from
		// what it managed to print at all.
		for sc.Scan() {
			if v, err := strconv.ParseUint(sc.Text(), 10, 64); err == nil {
				highest = max(highest, v)
			}
		}
		if lines == 0 {
			t.Fatal("helper printed nothing")
		}
		fs := openFileStore(t, dir)
		s := newTestLocal(t, fs, 1000)
		r, err := s.BeginMirror(t.Context(), 1)
		if err != nil {
			t.Fatal(err)
		}
		if r.First <= highest {
			t.Fatalf("round %d: reissued %d after the killed process handed out up to %d", round, r.First, highest)
		}
		s.Close()
		fs.Close()
	}
}

func TestEtcdStoreRestartAndConcurrentServices(t *testing.T) {
	client := etcdtest.Start(t)
	const key = "/retina/test/txn/reserved"
	store := NewEtcdStore(client, key)
	s1 := newTestLocal(t, store, 50)
	highest := allocateSome(t, s1, 100)
	// A second service on the same key takes over: the first is fenced at
	// its next reservation and never hands out a timestamp of the second.
	s2 := newTestLocal(t, NewEtcdStore(client, key), 50)
	w2, _ := s2.Watermarks(t.Context())
	if w2.Next <= highest {
		t.Fatalf("second service starts at %d, first handed out up to %d", w2.Next, highest)
	}
	var mu sync.Mutex
	seen := map[uint64]int{}
	var wg sync.WaitGroup
	fenced := 0
	for i, s := range []*Local{s1, s2} {
		wg.Go(func() {
			for range 300 {
				r, err := s.BeginMirror(t.Context(), 3)
				if errors.Is(err, ErrFenced) {
					mu.Lock()
					fenced++
					mu.Unlock()
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				for ts := r.First; ts <= r.Last(); ts++ {
					if owner, dup := seen[ts]; dup {
						t.Errorf("ts %d handed out by service %d and %d", ts, owner, i)
					}
					seen[ts] = i
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if fenced == 0 {
		t.Fatal("two services raised one key without either being fenced")
	}
	// Restart on etcd: a fresh service starts above everything handed out.
	var top uint64
	for ts := range seen {
		top = max(top, ts)
	}
	s3 := newTestLocal(t, NewEtcdStore(client, key), 50)
	r, err := s3.BeginMirror(t.Context(), 1)
	if err != nil || r.First <= top {
		t.Fatalf("restart on etcd handed out %d (highest before %d): %v", r.First, top, err)
	}
}

// TestEtcdRacingRaises: many raises from the same expected value; exactly
// one wins.
func TestEtcdRacingRaises(t *testing.T) {
	client := etcdtest.Start(t)
	store := NewEtcdStore(client, "/race")
	var wins sync.WaitGroup
	var mu sync.Mutex
	won := 0
	for i := range 8 {
		wins.Go(func() {
			err := store.Raise(t.Context(), 0, uint64(100+i))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				won++
			case !errors.Is(err, ErrConflict):
				t.Error(err)
			}
		})
	}
	wins.Wait()
	if won != 1 {
		t.Fatalf("%d raises from 0 won", won)
	}
}
