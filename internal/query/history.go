package query

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Time travel: a session that sets retina.as_of reads the tables as they
// were at that time (or at that snapshot timestamp), within the history
// the engine keeps (Config.History).
//
// Keeping history means holding GC back: memory GC, index purge and
// storage GC only drop what no snapshot at or above LWM can see, and the
// engine keeps a registered query ("pin") at a snapshot from the start of
// the window, so LWM stays at or below it. A second every tick it records
// (time, snapshot) samples, which map a wall-clock time to the snapshot a
// query started then would have read: time travel is to the tick. Pins are
// taken every History/8, so the window reaches back between History and
// History × 9/8.
//
// An as-of statement reads through a visibility checkpoint (readview.go)
// made at its snapshot when it starts, so it does not need a registration
// of its own; storage GC keeps the files a checkpointed view names.

// ErrSnapshotTooOld is an as-of time or snapshot outside the kept history.
var ErrSnapshotTooOld = errors.New("snapshot too old")

// historyTick is how often a sample is taken.
const historyTick = 100 * time.Millisecond

type historySample struct {
	at time.Time
	ts uint64
}

type historyPin struct {
	historySample
	handle uint64
}

// history is the engine's record of past snapshots.
type history struct {
	mu      sync.Mutex
	keep    time.Duration
	samples []historySample // ascending; none older than the oldest pin
	pins    []historyPin    // ascending
}

// TickHistory records the current snapshot and moves the window: a new
// pin every History/8, pins whose successor is older than the window
// ended. The server calls it every 100 ms; now is passed for tests.
func (e *Engine) TickHistory(ctx context.Context, now time.Time) error {
	h := &e.history
	if h.keep <= 0 {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if n := len(h.pins); n == 0 || now.Sub(h.pins[n-1].at) >= max(h.keep/8, time.Second) {
		q, err := e.cfg.Txn.BeginQuery(ctx)
		if err != nil {
			return fmt.Errorf("query: history pin: %w", err)
		}
		p := historyPin{historySample{now, q.Snapshot}, q.Handle}
		h.pins = append(h.pins, p)
		h.samples = append(h.samples, p.historySample)
	} else {
		w, err := e.cfg.Txn.Watermarks(ctx)
		if err != nil {
			return fmt.Errorf("query: history sample: %w", err)
		}
		h.samples = append(h.samples, historySample{now, w.HWM - 1})
	}
	// The window starts at the newest pin at or before now − keep.
	for len(h.pins) > 1 && !h.pins[1].at.After(now.Add(-h.keep)) {
		if err := e.cfg.Txn.EndQuery(context.WithoutCancel(ctx), h.pins[0].handle); err != nil {
			return fmt.Errorf("query: history: end pin at snapshot %d: %w", h.pins[0].ts, err)
		}
		h.pins = h.pins[1:]
	}
	first := sort.Search(len(h.samples), func(i int) bool { return !h.samples[i].at.Before(h.pins[0].at) })
	h.samples = h.samples[first:]
	return nil
}

// closeHistory ends the pins.
func (e *Engine) closeHistory(ctx context.Context) {
	h := &e.history
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, p := range h.pins {
		e.cfg.Txn.EndQuery(ctx, p.handle)
	}
	h.pins, h.samples = nil, nil
}

// asOf is a parsed retina.as_of: a time, or a snapshot timestamp.
type asOf struct {
	at   time.Time
	ts   uint64
	isTS bool
}

// parseAsOf reads retina.as_of: a snapshot timestamp (what retina_snapshot()
// returns) or a time stamp with a time zone ('2026-12-03 10:00:00+00',
// RFC 3339, or without a zone for UTC).
func parseAsOf(v string) (asOf, error) {
	v = strings.TrimSpace(v)
	if n, err := strconv.ParseUint(v, 10, 64); err == nil {
		return asOf{ts: n, isTS: true}, nil
	}
	if len(v) > 10 && (v[10] == 'T' || v[10] == 't') {
		v = v[:10] + " " + v[11:] // RFC 3339's T, PostgreSQL's blank
	}
	for _, layout := range []string{"2006-01-02 15:04:05.999999999Z07:00", "2006-01-02 15:04:05.999999999Z07",
		"2006-01-02 15:04:05.999999999", "2006-01-02"} {
		if t, err := time.Parse(layout, v); err == nil {
			return asOf{at: t}, nil
		}
	}
	return asOf{}, fmt.Errorf("retina.as_of %q: want a time stamp such as '2026-12-03 10:00:00+00' or a snapshot number", v)
}

// viewAsOf makes the read view of a time-travel statement: a visibility
// checkpoint at the snapshot the as-of names, taken while the history's
// pin holds LWM at or below it.
func (e *Engine) viewAsOf(ctx context.Context, setting string) (*readView, error) {
	a, err := parseAsOf(setting)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSetting, err)
	}
	h := &e.history
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.keep <= 0 || len(h.pins) == 0 {
		return nil, &Error{Code: "72000", Err: fmt.Errorf("retina.as_of: %w: this server keeps no history (set query_history, e.g. 15m)", ErrSnapshotTooOld)}
	}
	oldest := h.pins[0]
	var ts uint64
	if a.isTS {
		w, err := e.cfg.Txn.Watermarks(ctx)
		if err != nil {
			return nil, err
		}
		if a.ts < oldest.ts || a.ts >= w.HWM {
			return nil, &Error{Code: "72000", Err: fmt.Errorf("retina.as_of: %w: snapshot %d is outside the kept history (snapshots %d to %d)", ErrSnapshotTooOld, a.ts, oldest.ts, w.HWM-1)}
		}
		ts = a.ts
	} else {
		if a.at.Before(oldest.at) {
			return nil, &Error{Code: "72000", Err: fmt.Errorf("retina.as_of: %w: %s is before the kept history, which starts at %s (query_history %s)",
				ErrSnapshotTooOld, a.at.UTC().Format(time.RFC3339Nano), oldest.at.UTC().Format(time.RFC3339Nano), h.keep)}
		}
		i := sort.Search(len(h.samples), func(i int) bool { return h.samples[i].at.After(a.at) })
		ts = h.samples[max(i-1, 0)].ts
	}
	v := &readView{ts: ts, began: time.Now()}
	fs, err := e.frozenAt(ts)
	if err != nil {
		return nil, err
	}
	v.frozen = fs
	e.readers.add(v)
	return v, nil
}
