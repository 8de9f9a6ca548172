package console

import (
	"context"
	"embed"
	"encoding/json"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"time"
)

// Provider is what the console reads from the server.
type Provider interface {
	// Collect fills what the server knows now: everything but the rates,
	// the freshness, the tables and the history, which the console keeps.
	Collect(ctx context.Context) (Status, Counters)
	// Tables measures every table's storage (costly: every few seconds).
	Tables(ctx context.Context) ([]Table, error)
	// Cancel cancels the statement a client runs; false when there is
	// none of that pid.
	Cancel(pid uint32) bool
}

// Counters are the running totals the rates are computed from.
type Counters struct {
	Rows, Transactions, Messages uint64
	// SourceEvents counts each source's events, in the order of
	// Status.Sources.
	SourceEvents []uint64
	OLTPCommits  uint64
}

// Settings of the console.
const (
	historyPoints  = 15 * 60         // a point a second for 15 minutes
	freshSamples   = 2048            // freshness samples kept per second
	tablesEvery    = 5 * time.Second // how often the tables are measured
	CPULabelKey    = "retina"        // pprof label of the console's work
	CPULabel       = "console"
	maxStatusQuery = 200 // characters of a statement shown
)

// Console keeps the history and serves the page and /api/status.
type Console struct {
	p     Provider
	log   *slog.Logger
	start time.Time

	mu          sync.Mutex
	fresh       []float64 // the current second's samples (ms)
	seen        int       // samples offered this second
	freshness   Freshness
	points      []Point
	last        Counters
	lastAt      time.Time
	rates       Rates
	sourceRates []float64
	oltpRate    float64
	tables      []Table
	tablesAt    time.Time
	rng         *rand.Rand
}

// New makes a console over a provider.
func New(p Provider, log *slog.Logger) *Console {
	if log == nil {
		log = slog.Default()
	}
	return &Console{p: p, log: log, start: time.Now(), rng: rand.New(rand.NewPCG(1, 2))}
}

// Visible records one transaction becoming visible: its source commit
// time and when (the sink's hook).
func (c *Console) Visible(sourceMS int64, at time.Time) {
	ms := float64(at.UnixMicro()-sourceMS*1000) / 1000
	if ms < 0 {
		ms = 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seen++
	if len(c.fresh) < freshSamples {
		c.fresh = append(c.fresh, ms)
	} else if i := c.rng.IntN(c.seen); i < freshSamples {
		c.fresh[i] = ms // a uniform sample of the second
	}
}

// Run samples every second until ctx ends.
func (c *Console) Run(ctx context.Context) {
	pprof.Do(ctx, pprof.Labels(CPULabelKey, CPULabel), func(ctx context.Context) {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		lastTables := time.Time{}
		for {
			c.sample(ctx)
			if time.Since(lastTables) >= tablesEvery {
				lastTables = time.Now()
				c.measureTables(ctx)
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})
}

// sample closes a second: rates from the counters, the freshness
// percentiles, a point of history.
func (c *Console) sample(ctx context.Context) {
	st, cnt := c.p.Collect(ctx)
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.lastAt.IsZero() {
		secs := now.Sub(c.lastAt).Seconds()
		rate := func(now, before uint64) float64 {
			if now < before || secs <= 0 {
				return 0
			}
			return float64(now-before) / secs
		}
		c.rates = Rates{Rows: rate(cnt.Rows, c.last.Rows), Transactions: rate(cnt.Transactions, c.last.Transactions), Messages: rate(cnt.Messages, c.last.Messages)}
		c.sourceRates = make([]float64, len(cnt.SourceEvents))
		for i, n := range cnt.SourceEvents {
			if i < len(c.last.SourceEvents) {
				c.sourceRates[i] = rate(n, c.last.SourceEvents[i])
			}
		}
		c.oltpRate = rate(cnt.OLTPCommits, c.last.OLTPCommits)
	}
	c.last, c.lastAt = cnt, now
	c.freshness = Freshness{Samples: c.seen}
	if len(c.fresh) > 0 {
		slices.Sort(c.fresh)
		c.freshness.P50 = percentile(c.fresh, 0.50)
		c.freshness.P99 = percentile(c.fresh, 0.99)
	}
	c.fresh, c.seen = c.fresh[:0], 0
	c.points = append(c.points, Point{T: now.Unix(), Rows: round(c.rates.Rows), FreshP50: c.freshness.P50, FreshP99: c.freshness.P99,
		HWMLag: st.Watermarks.HWMLag})
	if len(c.points) > historyPoints {
		c.points = slices.Delete(c.points, 0, len(c.points)-historyPoints)
	}
}

func percentile(sorted []float64, q float64) float64 {
	i := int(q * float64(len(sorted)-1))
	return float64(int64(sorted[i]*100+0.5)) / 100
}

func round(x float64) float64 { return float64(int64(x + 0.5)) }

// measureTables refreshes the tables' storage figures.
func (c *Console) measureTables(ctx context.Context) {
	tables, err := c.p.Tables(ctx)
	if err != nil {
		if ctx.Err() == nil {
			c.log.Debug("console: measuring the tables failed; the next round tries again", "err", err)
		}
		return
	}
	c.mu.Lock()
	c.tables, c.tablesAt = tables, time.Now()
	c.mu.Unlock()
}

// Status is the document /api/status serves; since > 0 keeps only the
// history after that Unix second.
func (c *Console) Status(ctx context.Context, since int64) Status {
	st, _ := c.p.Collect(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	st.Time = time.Now().UTC()
	st.Uptime = time.Since(c.start).Seconds()
	st.Rates, st.Freshness = c.rates, c.freshness
	for i := range st.Sources {
		if i < len(c.sourceRates) {
			st.Sources[i].EventsPerSec = round(c.sourceRates[i])
		}
	}
	if st.OLTP != nil {
		st.OLTP.CommitsPerSec = round(c.oltpRate)
	}
	st.Tables, st.TablesAt = slices.Clone(c.tables), c.tablesAt
	if st.Tables == nil {
		st.Tables = []Table{}
	}
	i, _ := slices.BinarySearchFunc(c.points, since+1, func(p Point, t int64) int { return int(p.T - t) })
	st.History = History{Interval: 1, Points: slices.Clone(c.points[i:])}
	if st.History.Points == nil {
		st.History.Points = []Point{}
	}
	return st
}

//go:embed assets
var assets embed.FS

// Authenticator checks a user's password.
type Authenticator interface {
	Verify(user, password string) bool
}

// HandlerOptions say who may use the console.
type HandlerOptions struct {
	// Users, when set, must log in (HTTP basic authentication, over TLS
	// when the endpoint has a certificate); nil leaves the console open,
	// without the cancel button.
	Users Authenticator
}

// Register adds the console's routes to mux: the page at /, its assets,
// GET /api/status and POST /api/queries/{pid}/cancel.
func (c *Console) Register(mux *http.ServeMux, opts HandlerOptions) {
	static, _ := fs.Sub(assets, "assets")
	files := http.FileServerFS(static)
	guard := func(h http.HandlerFunc) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if opts.Users != nil {
				user, pw, ok := r.BasicAuth()
				if !ok || !opts.Users.Verify(user, pw) {
					w.Header().Set("WWW-Authenticate", `Basic realm="retina", charset="UTF-8"`)
					http.Error(w, "log in with a user of the SQL endpoint", http.StatusUnauthorized)
					return
				}
			}
			pprof.Do(r.Context(), pprof.Labels(CPULabelKey, CPULabel), func(context.Context) { h(w, r) })
		}
	}
	mux.HandleFunc("GET /{$}", guard(func(w http.ResponseWriter, r *http.Request) { files.ServeHTTP(w, r) }))
	mux.HandleFunc("GET /assets/", guard(func(w http.ResponseWriter, r *http.Request) {
		http.StripPrefix("/assets", files).ServeHTTP(w, r)
	}))
	mux.HandleFunc("GET /api/status", guard(func(w http.ResponseWriter, r *http.Request) {
		since, _ := strconv.ParseInt(r.URL.Query().Get("since"), 10, 64)
		st := c.Status(r.Context(), since)
		st.Auth = opts.Users != nil
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		json.NewEncoder(w).Encode(st)
	}))
	mux.HandleFunc("POST /api/queries/{pid}/cancel", guard(func(w http.ResponseWriter, r *http.Request) {
		if opts.Users == nil {
			http.Error(w, "cancelling statements needs an authenticated console: configure sql_users", http.StatusForbidden)
			return
		}
		pid, err := strconv.ParseUint(r.PathValue("pid"), 10, 32)
		if err != nil {
			http.Error(w, "pid "+strconv.Quote(r.PathValue("pid"))+" is not a number", http.StatusBadRequest)
			return
		}
		if !c.p.Cancel(uint32(pid)) {
			http.Error(w, "no statement runs in session "+strconv.FormatUint(pid, 10), http.StatusNotFound)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
}
