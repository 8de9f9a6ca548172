package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/retinadb/retina/internal/console"
	"github.com/retinadb/retina/internal/server"
	"github.com/retinadb/retina/internal/server/servertest"
)

// The console's tests drive Debian's Chromium (.ci/install installs it)
// with chromedp against a running server.

// browser starts a headless Chromium; the test fails without one.
func browser(t *testing.T) context.Context {
	t.Helper()
	path := "/usr/bin/chromium"
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("Chromium is not installed at %s (.ci/install installs Debian's chromium)", path)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("no-first-run", true), chromedp.Flag("disable-quic", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1400, 1000))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil { // starts the browser (no timeout on this first call)
		t.Fatalf("start Chromium: %v", err)
	}
	return ctx
}

// do runs browser steps, bounded in time.
func do(ctx context.Context, steps ...chromedp.Action[chromedp.Void]) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return chromedp.Do(ctx, steps...)
}

// run runs one browser action that returns a value, bounded in time.
func run[T any](ctx context.Context, a chromedp.Action[T]) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return chromedp.Run(ctx, a)
}

// consoleServer is a running server fed by a growing file source.
type consoleServer struct {
	srv  *server.Server
	src  string
	stop context.CancelFunc
	done chan error
}

func startConsoleServer(t *testing.T, extra func(*server.Config), lines ...string) *consoleServer {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(dir, "in.jsonl")
	if err := os.WriteFile(src, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := server.DefaultConfig()
	cfg.DataDir, cfg.SQLAddr, cfg.HTTPAddr = filepath.Join(dir, "data"), "127.0.0.1:0", "127.0.0.1:0"
	cfg.Sources = []string{"file:" + src}
	cfg.CheckpointInterval = time.Second
	cfg.Tables = []server.TableDecl{{Name: "account", PrimaryKey: []string{"id"}, Columns: []server.ColumnDecl{
		{Name: "id", Type: "int64"}, {Name: "balance", Type: "int64"}}}}
	if extra != nil {
		extra(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, err := server.Start(ctx, cfg, server.Options{Logger: servertest.Quiet()})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	cs := &consoleServer{srv: srv, src: src, stop: stop, done: make(chan error, 1)}
	go func() { cs.done <- srv.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		<-cs.done
	})
	return cs
}

// accountTxn is a Debezium transaction writing account rows.
func accountTxn(id string, ops ...string) []string {
	out := []string{fmt.Sprintf(`{"status":"BEGIN","id":%q}`, id)}
	for i, op := range ops {
		out = append(out, strings.Replace(op, "}}", fmt.Sprintf(`},"transaction":{"id":%q,"total_order":%d}}`, id, i+1), 1))
	}
	return append(out, fmt.Sprintf(`{"status":"END","id":%q,"event_count":%d,"data_collections":[{"data_collection":"bank.account","event_count":%d}]}`, id, len(ops), len(ops)))
}

func insertAccount(id, balance int) string {
	return fmt.Sprintf(`{"op":"c","source":{"table":"account","ts_ms":%d},"before":null,"after":{"id":%d,"balance":%d}}`, time.Now().UnixMilli(), id, balance)
}

// feed appends a transaction of inserts every 20 ms until stop closes.
func (cs *consoleServer) feed(t *testing.T, from int, stop <-chan struct{}) {
	for i := from; ; i++ {
		select {
		case <-stop:
			return
		case <-time.After(20 * time.Millisecond):
		}
		var ops []string
		for k := range 20 {
			ops = append(ops, insertAccount(i*20+k, 100))
		}
		f, err := os.OpenFile(cs.src, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Error(err)
			return
		}
		f.WriteString(strings.Join(accountTxn(fmt.Sprint("t", i), ops...), "\n") + "\n")
		f.Close()
	}
}

func (cs *consoleServer) status(t *testing.T) console.Status {
	t.Helper()
	resp, err := http.Get("http://" + cs.srv.HTTPAddr() + "/api/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st console.Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

func (cs *consoleServer) metric(t *testing.T, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + cs.srv.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^` + name + ` (\S+)$`).FindSubmatch(body)
	if m == nil {
		t.Fatalf("metric %s not found", name)
	}
	v, _ := strconv.ParseFloat(string(m[1]), 64)
	return v
}

// shots is where the console's screenshots go: the test's artifact
// directory (kept with go test -artifacts), or RETINA_CONSOLE_SHOTS.
func shots(t *testing.T) string {
	if d := os.Getenv("RETINA_CONSOLE_SHOTS"); d != "" {
		return d
	}
	return t.ArtifactDir()
}

func screenshot(t *testing.T, ctx context.Context, dir, name, sel string) {
	t.Helper()
	action := chromedp.FullScreenshot(100) // 100: PNG
	if sel != "" {
		action = chromedp.Screenshot(chromedp.CSS(sel))
	}
	png, err := run(ctx, action)
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

func textOf(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	s, err := run(ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		t.Fatalf("%s: %v", sel, err)
	}
	return strings.TrimSpace(s)
}

// TestConsoleInABrowser: the page loads in Chromium while a stream runs,
// its charts move, and once the stream has stopped its figures equal
// /api/status's and /metrics'; screenshots of every view are written.
func TestConsoleInABrowser(t *testing.T) {
	cs := startConsoleServer(t, nil, accountTxn("t0", insertAccount(1_000_000, 5))...)
	ctx := browser(t)
	if err := do(ctx, chromedp.Navigate(cs.srv.ConsoleURL()), chromedp.WaitVisible(chromedp.CSS("#health.ok"))); err != nil {
		t.Fatalf("load the console: %v", err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { cs.feed(t, 1, stop) })
	points := func() (n int, last int64) {
		ps, err := run(ctx, chromedp.AttributeValue(chromedp.CSS("#chart-rows"), "data-points"))
		if err != nil {
			t.Fatal(err)
		}
		ls, err := run(ctx, chromedp.AttributeValue(chromedp.CSS("#chart-rows"), "data-last"))
		if err != nil {
			t.Fatal(err)
		}
		n, _ = strconv.Atoi(ps.Value)
		last, _ = strconv.ParseInt(ls.Value, 10, 64)
		return n, last
	}
	_, last0 := points()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if n, last := points(); last >= last0+3 && n >= 3 && textOf(t, ctx, "#rows-per-sec") != "0" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the charts did not move in 30s (rows/s shown: %s)", textOf(t, ctx, "#rows-per-sec"))
		}
		time.Sleep(200 * time.Millisecond)
	}
	dir := shots(t)
	screenshot(t, ctx, dir, "console.png", "")
	for _, view := range []string{"pipeline", "charts", "tables-section", "watermarks", "queries-section"} {
		screenshot(t, ctx, dir, "console-"+view+".png", "#"+view)
	}
	close(stop)
	wg.Wait()

	// Quiet: what the page shows settles and must equal the endpoints.
	want := cs.status(t)
	deadline = time.Now().Add(30 * time.Second)
	for {
		time.Sleep(1500 * time.Millisecond)
		st := cs.status(t)
		if st.Watermarks.HWM == want.Watermarks.HWM && st.TablesAt.After(time.Now().Add(-10*time.Second)) && st.Checkpoint.TS == st.Watermarks.HWM-1 {
			want = st
			break
		}
		want = st
		if time.Now().After(deadline) {
			t.Fatal("the server did not settle in 30s")
		}
	}
	time.Sleep(1500 * time.Millisecond) // the page polls every second
	if got := textOf(t, ctx, "#hwm"); got != fmt.Sprint(want.Watermarks.HWM) {
		t.Errorf("the page shows HWM %s, /api/status %d", got, want.Watermarks.HWM)
	}
	if got, m := textOf(t, ctx, "#hwm"), cs.metric(t, "retina_hwm"); got != strconv.FormatFloat(m, 'f', -1, 64) {
		t.Errorf("the page shows HWM %s, /metrics %v", got, m)
	}
	if got := textOf(t, ctx, "#lwm"); got != fmt.Sprint(want.Watermarks.LWM) {
		t.Errorf("the page shows LWM %s, /api/status %d", got, want.Watermarks.LWM)
	}
	if got := textOf(t, ctx, "#dead-count"); got != "0" {
		t.Errorf("dead letters: %s", got)
	}
	tableLive := textOf(t, ctx, `#table-list tr[data-table="account"] td:nth-child(2)`)
	var live int64
	for _, tb := range want.Tables {
		if tb.Name == "account" {
			live = tb.LiveRows
		}
	}
	if strings.ReplaceAll(tableLive, ",", "") != fmt.Sprint(live) || live == 0 {
		t.Errorf("the page shows %s live rows of account, /api/status %d", tableLive, live)
	}
	if got := textOf(t, ctx, `#sources td[data-state]`); got != console.Following {
		t.Errorf("the source is shown %q", got)
	}
}

// TestConsoleShowsAStoppedSource: a transaction that cannot be applied stops
// ingestion; the page shows the source stopped with the reason and its
// position.
func TestConsoleShowsAStoppedSource(t *testing.T) {
	lines := accountTxn("t0", insertAccount(1, 5))
	lines = append(lines, accountTxn("t1", insertAccount(1, 6))...) // the key exists: cannot be applied
	cs := startConsoleServer(t, nil, lines...)
	ctx := browser(t)
	if err := do(ctx, chromedp.Navigate(cs.srv.ConsoleURL()), chromedp.WaitVisible(chromedp.CSS("#health.bad"))); err != nil {
		t.Fatalf("load the console: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		state := textOf(t, ctx, `#sources td[data-state]`)
		if strings.HasPrefix(state, console.Stopped+": ") && strings.Contains(state, "cannot be applied") && strings.Contains(state, cs.src) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the source is shown %q, want stopped with the reason", state)
		}
		time.Sleep(200 * time.Millisecond)
	}
	screenshot(t, ctx, shots(t), "console-stopped.png", "#pipeline")
}

// TestConsoleFirstRenderWith100Tables measures how long the page takes to
// show a server's 100 tables.
func TestConsoleFirstRenderWith100Tables(t *testing.T) {
	cs := startConsoleServer(t, func(c *server.Config) {
		for i := range 99 {
			c.Tables = append(c.Tables, server.TableDecl{Name: fmt.Sprintf("t%03d", i), PrimaryKey: []string{"id"},
				Columns: []server.ColumnDecl{{Name: "id", Type: "int64"}, {Name: "v", Type: "string", Nullable: true}}})
		}
	}, accountTxn("t0", insertAccount(1, 5))...)
	deadline := time.Now().Add(30 * time.Second)
	for len(cs.status(t).Tables) < 100 {
		if time.Now().After(deadline) {
			t.Fatal("the tables were not measured in 30s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	ctx := browser(t)
	start := time.Now()
	if err := do(ctx, chromedp.Navigate(cs.srv.ConsoleURL()), chromedp.WaitVisible(chromedp.CSS(`#table-list tr[data-table="t098"]`))); err != nil {
		t.Fatalf("load the console: %v", err)
	}
	rows, err := run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#table-list tbody tr").length`))
	if err != nil {
		t.Fatal(err)
	}
	if rows != 100 {
		t.Fatalf("the page shows %d tables, want 100", rows)
	}
	t.Logf("first render with 100 tables: %d ms", time.Since(start).Milliseconds())
}
