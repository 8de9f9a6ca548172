package demo

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/google/pprof/profile"

	"github.com/retinadb/retina/internal/iceberg"
	"github.com/retinadb/retina/internal/server"
)

// IcebergConfig parameterises `retina bench iceberg`.
type IcebergConfig struct {
	SF   float64
	Seed uint64
	// Rate row changes/s stream for Duration while every table is
	// published each Interval.
	Rate          int
	Duration      time.Duration
	Interval      time.Duration
	FormatVersion int
	// SustainFor is how long each pipeline (publication off, and on)
	// streams at full speed, in turns, for the ingest slowdown.
	SustainFor time.Duration
	// CheckEvery is how often the bank invariants are checked in the
	// published snapshots while the stream runs.
	CheckEvery time.Duration
	// ProfilePath, when set, gets the CPU profile of the stream's phase
	// (the publisher's goroutine labelled retina=iceberg).
	ProfilePath string
	Logger      *slog.Logger
}

// DefaultIcebergConfig is the issue's: 50K row changes/s for 60 s,
// publishing every second.
func DefaultIcebergConfig() IcebergConfig {
	return IcebergConfig{SF: 0.05, Seed: 1, Rate: 50_000, Duration: 60 * time.Second, Interval: time.Second, FormatVersion: 2,
		SustainFor: 24 * time.Second, CheckEvery: 5 * time.Second}
}

// IcebergResult are the figures of one run.
type IcebergResult struct {
	RowsPerSecOff, RowsPerSecOn float64
	IngestSlowdown              float64
	// GCShareOff and GCShareOn are the share of the CPU Go's collector
	// took in the full-speed turns without and with publication.
	GCShareOff, GCShareOn float64
	// CPUPerRowOff and CPUPerRowOn are the process's CPU seconds per row
	// committed in those turns.
	CPUPerRowOff, CPUPerRowOn float64
	Publications              int
	LagP50, LagP99            time.Duration
	CPUShare                  float64
	// Per table, the most data and delete files a published snapshot had,
	// and the most files Retina itself had then; DataOverRetina is the
	// largest data files / Retina's files of any table and publication.
	DataFilesMax, DeleteFilesMax, RetinaFilesMax map[string]int
	DataOverRetina                               float64
	// MetadataBytes is the metadata written per table snapshot over the
	// run; Early and Late over seconds 20–30 and the last 10 s.
	MetadataBytes, MetadataEarly, MetadataLate float64
	// Written is what the publications of the stream's phase wrote.
	Written                            iceberg.Bytes
	RowsEqual                          bool
	Differences                        []string
	InvariantChecks, InvariantFailures int
	Failures                           []string
}

// RunIceberg runs the benchmark: full-speed phases in turns in two
// pipelines (publication off in one, on in the other) for the ingest
// slowdown, then the stream at Rate for Duration with publication on, the
// bank invariants checked in the published snapshots meanwhile, and at
// the end every table's last snapshot compared with Retina's SQL.
func RunIceberg(ctx context.Context, cfg IcebergConfig, logf func(format string, args ...any)) (*IcebergResult, error) {
	res := &IcebergResult{DataFilesMax: map[string]int{}, DeleteFilesMax: map[string]int{}, RetinaFilesMax: map[string]int{}}
	var mu sync.Mutex
	var pubs []iceberg.Published
	tune := func(publish bool) func(*server.NodeConfig) {
		return func(nc *server.NodeConfig) {
			nc.Iceberg = server.IcebergConfig{}
			if publish {
				nc.Iceberg = server.IcebergConfig{Interval: cfg.Interval, FormatVersion: cfg.FormatVersion, Retention: 10 * time.Minute}
			}
		}
	}
	// Two pipelines with the same data, publication off in one and on in
	// the other, streamed into at full speed in turns (the machine's speed
	// drifts; turns make the ratio fair), then the one that publishes
	// streams at the rate.
	off, err := startPipeline(ctx, pipelineConfig{SF: cfg.SF, Seed: cfg.Seed, Logger: cfg.Logger, Node: tune(false)})
	if err != nil {
		return nil, err
	}
	defer off.close()
	p, err := startPipeline(ctx, pipelineConfig{SF: cfg.SF, Seed: cfg.Seed, Logger: cfg.Logger, Node: tune(true),
		Server: func(c *server.Config) { c.IcebergAddr = "127.0.0.1:0" }})
	if err != nil {
		return nil, err
	}
	defer p.close()
	pub := p.srv.Node.Iceberg
	if pub == nil {
		return nil, fmt.Errorf("iceberg bench: the server does not publish")
	}
	for _, q := range []*pipeline{off, p} {
		if err := q.load(ctx); err != nil {
			return nil, err
		}
	}
	var offRates, onRates []float64
	var gcShare [2][2]float64   // off, on: GC CPU seconds, all CPU seconds
	var cpuPerRow [2][2]float64 // off, on: process CPU seconds, rows
	for range sustainTurns {
		for _, q := range []*pipeline{off, p} {
			gc0, all0 := cpuSeconds()
			ru0 := processCPU()
			rows0 := q.srv.IngestStats().Committed
			rate, err := q.fullSpeed(ctx, cfg.SustainFor/sustainTurns)
			if err != nil {
				return nil, err
			}
			gc1, all1 := cpuSeconds()
			k := 0
			if q == p {
				k = 1
			}
			gcShare[k][0] += gc1 - gc0
			gcShare[k][1] += all1 - all0
			cpuPerRow[k][0] += processCPU() - ru0
			cpuPerRow[k][1] += float64(q.srv.IngestStats().Committed - rows0)
			if err := q.waitCommitted(ctx); err != nil {
				return nil, err
			}
			if q == p { // its publications catch up before the other's turn
				if err := p.waitPublished(ctx); err != nil {
					return nil, err
				}
			}
			if q == off {
				offRates = append(offRates, rate)
			} else {
				onRates = append(onRates, rate)
			}
		}
	}
	if err := off.close(); err != nil {
		return nil, err
	}
	res.RowsPerSecOff, res.RowsPerSecOn = medianOf(offRates), medianOf(onRates)
	res.IngestSlowdown = res.RowsPerSecOff / res.RowsPerSecOn
	res.GCShareOff, res.GCShareOn = gcShare[0][0]/gcShare[0][1], gcShare[1][0]/gcShare[1][1]
	res.CPUPerRowOff, res.CPUPerRowOn = cpuPerRow[0][0]/cpuPerRow[0][1], cpuPerRow[1][0]/cpuPerRow[1][1]
	logf("full speed in %d turns: publication off %.0f rows/s %v, on %.0f rows/s %v (slowdown %.3f); CPU per row %.2f µs and %.2f µs; Go's collector took %.3f and %.3f of the CPU", sustainTurns,
		res.RowsPerSecOff, roundAll(offRates), res.RowsPerSecOn, roundAll(onRates), res.IngestSlowdown, res.CPUPerRowOff*1e6, res.CPUPerRowOn*1e6, res.GCShareOff, res.GCShareOn)

	reader, err := newIcebergReader(ctx, p.srv.IcebergURI())
	if err != nil {
		return nil, err
	}
	pub.Observe(func(r iceberg.Published) {
		mu.Lock()
		pubs = append(pubs, r)
		mu.Unlock()
	})
	var prof bytes.Buffer
	if err := pprof.StartCPUProfile(&prof); err != nil {
		return nil, fmt.Errorf("iceberg bench: CPU profile: %w", err)
	}
	start := time.Now()
	pr := newProbes()
	err = p.withStream(ctx, cfg.Rate, pr, false, func(ctx context.Context) error {
		tick := time.NewTicker(cfg.CheckEvery)
		defer tick.Stop()
		deadline := time.After(cfg.Duration)
		for {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-deadline:
				return nil
			case <-tick.C:
			}
			_, ts := pub.Current()
			failures, err := reader.bankInvariants(ctx, ts, p.gen.TotalBalance())
			if err != nil {
				return err
			}
			res.InvariantChecks++
			res.InvariantFailures += len(failures)
			res.Failures = append(res.Failures, failures...)
		}
	})
	pprof.StopCPUProfile()
	if err != nil {
		return nil, err
	}
	if res.CPUShare, err = labelledShare(prof.Bytes(), iceberg.CPULabelKey, iceberg.CPULabel); err != nil {
		return nil, err
	}
	if cfg.ProfilePath != "" {
		if err := os.WriteFile(cfg.ProfilePath, prof.Bytes(), 0o644); err != nil {
			return nil, fmt.Errorf("iceberg bench: %w", err)
		}
	}
	if err := p.waitCommitted(ctx); err != nil {
		return nil, err
	}

	// Everything is committed: wait for the publication of the last
	// commit, then compare every table with Retina's SQL.
	if err := p.waitPublished(ctx); err != nil {
		return nil, err
	}
	w, err := p.srv.Node.Txn.Watermarks(ctx)
	if err != nil {
		return nil, err
	}
	diffs, err := reader.tablesEqual(ctx, p.db, w.HWM-1)
	if err != nil {
		return nil, err
	}
	res.RowsEqual, res.Differences = len(diffs) == 0, diffs
	failures, err := reader.bankInvariants(ctx, w.HWM-1, p.gen.TotalBalance())
	if err != nil {
		return nil, err
	}
	res.InvariantChecks++
	res.InvariantFailures += len(failures)
	res.Failures = append(res.Failures, failures...)

	mu.Lock()
	pubs = slices.Clone(pubs)
	mu.Unlock()
	res.summarize(pubs, start)
	logf("published %d times: lag P50 %.0f ms, P99 %.0f ms; CPU share %.3f; metadata %.0f B per table snapshot (seconds 20-30: %.0f, last 10 s: %.0f)",
		res.Publications, ms(res.LagP50), ms(res.LagP99), res.CPUShare, res.MetadataBytes, res.MetadataEarly, res.MetadataLate)
	return res, p.close()
}

// fullSpeed streams as fast as the pipeline takes it and returns the rows
// committed per second after a second of warm-up.
func (p *pipeline) fullSpeed(ctx context.Context, d time.Duration) (float64, error) {
	var from, to uint64
	var tFrom, tTo time.Time
	err := p.withStream(ctx, 0, newProbes(), false, func(ctx context.Context) error {
		if err := sleepFor(time.Second)(ctx); err != nil {
			return err
		}
		from, tFrom = p.srv.IngestStats().Committed, time.Now()
		if err := sleepFor(d)(ctx); err != nil {
			return err
		}
		to, tTo = p.srv.IngestStats().Committed, time.Now()
		return nil
	})
	if err != nil {
		return 0, err
	}
	return float64(to-from) / tTo.Sub(tFrom).Seconds(), nil
}

// waitPublished waits until the publication covers every commit so far.
func (p *pipeline) waitPublished(ctx context.Context) error {
	w, err := p.srv.Node.Txn.Watermarks(ctx)
	if err != nil {
		return err
	}
	for {
		if _, ts := p.srv.Node.Iceberg.Current(); ts >= w.HWM-1 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// cpuSeconds reads the process's CPU time spent by Go's collector and in
// all (runtime/metrics' estimates).
func cpuSeconds() (gc, all float64) {
	samples := []metrics.Sample{{Name: "/cpu/classes/gc/total:cpu-seconds"}, {Name: "/cpu/classes/total:cpu-seconds"}}
	metrics.Read(samples)
	return samples[0].Value.Float64(), samples[1].Value.Float64()
}

// processCPU is the process's user and system CPU time so far, in seconds.
func processCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// sustainTurns is how many turns each pipeline streams at full speed.
const sustainTurns = 3

func medianOf(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

func roundAll(xs []float64) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = float64(int64(x + 0.5))
	}
	return out
}

// summarize computes the publication figures of the stream's phase.
func (res *IcebergResult) summarize(pubs []iceberg.Published, start time.Time) {
	var lags []time.Duration
	var early, late [2]float64 // bytes, table snapshots
	var all [2]float64
	end := start
	for _, p := range pubs {
		if p.Committed.After(end) {
			end = p.Committed
		}
	}
	for _, p := range pubs {
		if p.Committed.Before(start) {
			continue
		}
		res.Publications++
		res.Written.Data += p.Bytes.Data
		res.Written.Deletes += p.Bytes.Deletes
		res.Written.Metadata += p.Bytes.Metadata
		res.Written.PieceRows += p.Bytes.PieceRows
		lags = append(lags, p.Committed.Sub(p.Sealed))
		for _, t := range p.Tables {
			name := t.Name
			res.DataFilesMax[name] = max(res.DataFilesMax[name], t.DataFiles)
			res.DeleteFilesMax[name] = max(res.DeleteFilesMax[name], t.DeleteFiles)
			res.RetinaFilesMax[name] = max(res.RetinaFilesMax[name], t.RetinaFiles)
			if t.RetinaFiles > 0 {
				res.DataOverRetina = max(res.DataOverRetina, float64(t.DataFiles)/float64(t.RetinaFiles))
			}
		}
		n := float64(len(p.Tables))
		b := float64(p.Bytes.Metadata)
		all[0], all[1] = all[0]+b, all[1]+n
		at := p.Committed.Sub(start)
		if at >= 20*time.Second && at < 30*time.Second {
			early[0], early[1] = early[0]+b, early[1]+n
		}
		if end.Sub(p.Committed) < 10*time.Second {
			late[0], late[1] = late[0]+b, late[1]+n
		}
	}
	per := func(x [2]float64) float64 {
		if x[1] == 0 {
			return 0
		}
		return x[0] / x[1]
	}
	res.MetadataBytes, res.MetadataEarly, res.MetadataLate = per(all), per(early), per(late)
	res.LagP50, res.LagP99 = percentile(lags, 50), percentile(lags, 99)
}

// labelledShare is the share of a CPU profile's samples taken while a
// goroutine carrying the label key=value ran.
func labelledShare(data []byte, key, value string) (float64, error) {
	prof, err := profile.ParseData(data)
	if err != nil {
		return 0, fmt.Errorf("read the CPU profile: %w", err)
	}
	idx := -1
	for i, st := range prof.SampleType {
		if st.Type == "cpu" {
			idx = i
		}
	}
	if idx < 0 {
		return 0, fmt.Errorf("the CPU profile has no cpu samples")
	}
	var total, labelled int64
	for _, s := range prof.Sample {
		total += s.Value[idx]
		if slices.Contains(s.Label[key], value) {
			labelled += s.Value[idx]
		}
	}
	if total == 0 {
		return 0, nil
	}
	return float64(labelled) / float64(total), nil
}
