package console

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/retinadb/retina/internal/pgwire"
)

// counting is a provider whose counters grow by a fixed step a second.
type counting struct {
	rows      uint64
	cancelled []uint32
}

func (c *counting) Collect(context.Context) (Status, Counters) {
	c.rows += 1000
	return Status{Health: "ok", Sources: []Source{{Name: "file:x", State: Following}}}, Counters{Rows: c.rows, SourceEvents: []uint64{c.rows}}
}

func (c *counting) Tables(context.Context) ([]Table, error) {
	return []Table{{Name: "account", LiveRows: 5, Versions: 10, StaleShare: 0.5}}, nil
}

func (c *counting) Cancel(pid uint32) bool {
	c.cancelled = append(c.cancelled, pid)
	return pid == 7
}

// TestHistoryAndFreshness: a second's freshness samples make its
// percentiles, the rates come from the counters, the history keeps one
// point a second and since= returns only the newer ones.
func TestHistoryAndFreshness(t *testing.T) {
	c := New(&counting{}, nil)
	ctx := context.Background()
	c.sample(ctx)
	now := time.Now()
	for i := range 100 {
		c.Visible(now.Add(-time.Duration(i+1)*time.Millisecond).UnixMilli(), now)
	}
	c.lastAt = c.lastAt.Add(-time.Second) // a second passed
	c.sample(ctx)
	st := c.Status(ctx, 0)
	if st.Freshness.Samples != 100 || st.Freshness.P50 < 45 || st.Freshness.P50 > 55 || st.Freshness.P99 < 95 {
		t.Fatalf("freshness %+v, want 100 samples from 1 to 100 ms", st.Freshness)
	}
	if st.Rates.Rows < 900 || st.Rates.Rows > 1100 || st.Sources[0].EventsPerSec < 900 {
		t.Fatalf("rates %+v, sources %+v: want about 1000/s", st.Rates, st.Sources)
	}
	if len(st.History.Points) != 2 {
		t.Fatalf("%d points, want 2", len(st.History.Points))
	}
	if newer := c.Status(ctx, st.History.Points[0].T); len(newer.History.Points) != 1 && st.History.Points[0].T != st.History.Points[1].T {
		t.Fatalf("since the first point: %d points, want 1", len(newer.History.Points))
	}
	for range historyPoints + 10 {
		c.sample(ctx)
	}
	if n := len(c.Status(ctx, 0).History.Points); n != historyPoints {
		t.Fatalf("history keeps %d points, want %d", n, historyPoints)
	}
}

// TestAuthentication: with users, the page and the API ask for one of
// them and the cancel button's route works; without, the console is open
// and refuses to cancel.
func TestAuthentication(t *testing.T) {
	users := pgwire.Users{}
	if err := users.AddUser("alice", "s3cret"); err != nil {
		t.Fatal(err)
	}
	p := &counting{}
	c := New(p, nil)
	mux := http.NewServeMux()
	c.Register(mux, HandlerOptions{Users: users})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	call := func(method, path, user, pw string) int {
		req, _ := http.NewRequest(method, srv.URL+path, nil)
		if user != "" {
			req.SetBasicAuth(user, pw)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, path := range []string{"/", "/api/status", "/assets/console.js"} {
		if code := call("GET", path, "", ""); code != 401 {
			t.Errorf("GET %s without a user: %d, want 401", path, code)
		}
		if code := call("GET", path, "alice", "wrong"); code != 401 {
			t.Errorf("GET %s with a wrong password: %d, want 401", path, code)
		}
		if code := call("GET", path, "alice", "s3cret"); code != 200 {
			t.Errorf("GET %s as alice: %d, want 200", path, code)
		}
	}
	if code := call("POST", "/api/queries/7/cancel", "", ""); code != 401 {
		t.Errorf("cancel without a user: %d", code)
	}
	if code := call("POST", "/api/queries/7/cancel", "alice", "s3cret"); code != 204 || len(p.cancelled) != 1 {
		t.Errorf("cancel as alice: %d (cancelled %v)", code, p.cancelled)
	}
	if code := call("POST", "/api/queries/8/cancel", "alice", "s3cret"); code != 404 {
		t.Errorf("cancel of a session running nothing: %d, want 404", code)
	}
	req, _ := http.NewRequest("GET", srv.URL+"/api/status", nil)
	req.SetBasicAuth("alice", "s3cret")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var st Status
	json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if !st.Auth {
		t.Error("an authenticated console says it is not")
	}

	open := http.NewServeMux()
	New(&counting{}, nil).Register(open, HandlerOptions{})
	osrv := httptest.NewServer(open)
	defer osrv.Close()
	resp, err = http.Post(osrv.URL+"/api/queries/7/cancel", "", strings.NewReader(""))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 403 {
		t.Errorf("cancel on an open console: %d, want 403", resp.StatusCode)
	}
}
