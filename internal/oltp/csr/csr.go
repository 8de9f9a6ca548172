// Package csr is the cross-engine snapshot registry: a deterministic state
// machine (no goroutines, clock or I/O; the caller serializes calls) that
// keeps the two engines' views of one global order consistent.
//
// The memory engine is the anchor. The registry holds points (a, st) from
// anchor timestamps to storage timestamps of two kinds:
//
//	commit   (c1, c2): a transaction committed at c1 in the anchor and c2 in
//	         storage. A snapshot s sees it in both engines or in neither:
//	         s ≥ c1 ⇒ v ≥ c2 and s < c1 ⇒ v < c2.
//	snapshot (s, [lo, hi]): transactions reading at anchor snapshot s read
//	         storage at versions from lo to hi. Readers at other anchors
//	         must agree: s' < s ⇒ v' ≤ lo and s' > s ⇒ v' ≥ hi (no long
//	         fork between readers). Readers at the same anchor need not
//	         agree with each other, so when the anchor is idle storage-only
//	         readers still read storage's newest snapshot.
//
// These rules make storage timestamps non-decreasing in a over all points,
// so every decision needs only the neighbours of a: the last point below
// it (or a commit at it) and the first point above it.
//
// Points live in parts, each covering a contiguous anchor range; the last
// part is open and new points with anchors above every part go there. A
// full open part is closed and a new one opened. Recycle drops the oldest
// parts that no active transaction can need and keeps their last point as
// the floor; a snapshot below the floor's anchor can no longer be served.
package csr

import (
	"errors"
	"fmt"
	"sort"
)

// Kind of a point.
type Kind uint8

const (
	// Commit points sort before snapshot points at the same anchor.
	Commit Kind = iota
	Snapshot
)

func (k Kind) String() string {
	if k == Commit {
		return "commit"
	}
	return "snapshot"
}

// Point maps an anchor timestamp to a storage timestamp: c2 for a commit,
// the highest selected version for a snapshot (Low is the lowest).
type Point struct {
	Anchor, Storage uint64
	Low             uint64 // snapshot points only
	Kind            Kind
}

func (p Point) less(q Point) bool {
	if p.Anchor != q.Anchor {
		return p.Anchor < q.Anchor
	}
	return p.Kind < q.Kind
}

// Errors the cross-engine layer maps to its typed errors.
var (
	// ErrTooOld: the snapshot's neighbours were recycled.
	ErrTooOld = errors.New("csr: anchor snapshot is older than the recycled range")
	// ErrOrder: the point would cross another point.
	ErrOrder = errors.New("csr: the point would order the engines differently")
)

// Registry is the multi-part registry.
type Registry struct {
	parts    []*part
	partSize int
	floor    *Point // last point of the recycled parts
	points   int
}

type part struct {
	points []Point // sorted by (Anchor, Kind)
}

func (p *part) lo() uint64 { return p.points[0].Anchor }

// New returns an empty registry whose parts hold partSize points each.
func New(partSize int) *Registry {
	if partSize < 1 {
		partSize = 1
	}
	return &Registry{partSize: partSize}
}

// Bounds is what a snapshot selection may choose: Lower ≤ v ≤ Upper.
// Upper is ^uint64(0) when nothing above constrains it.
type Bounds struct {
	Lower, Upper uint64
}

// Bounds returns the storage snapshots anchor snapshot s may read at.
func (r *Registry) Bounds(s uint64) (Bounds, error) {
	if r.floor != nil && s < r.floor.Anchor {
		return Bounds{}, fmt.Errorf("%w (snapshot %d, recycled through %d)", ErrTooOld, s, r.floor.Anchor)
	}
	b := Bounds{Upper: ^uint64(0)}
	// Below: everything under s, and a commit at s (s sees it).
	if p, ok := r.atOrBelow(Point{Anchor: s, Kind: Commit}); ok {
		b.Lower = p.Storage
	}
	if q, ok := r.above(Point{Anchor: s, Kind: Snapshot}); ok {
		b.Upper = q.Low
		if q.Kind == Commit {
			b.Upper = q.Storage - 1
		}
	}
	return b, nil
}

// Select records that anchor snapshot s reads storage at v, which must lie
// within Bounds(s).
func (r *Registry) Select(s, v uint64) error {
	b, err := r.Bounds(s)
	if err != nil {
		return err
	}
	if v < b.Lower || v > b.Upper {
		return fmt.Errorf("%w: snapshot %d→%d outside [%d, %d]", ErrOrder, s, v, b.Lower, b.Upper)
	}
	if p := r.find(Point{Anchor: s, Kind: Snapshot}); p != nil {
		p.Low, p.Storage = min(p.Low, v), max(p.Storage, v)
		return nil
	}
	r.insert(Point{Anchor: s, Storage: v, Low: v, Kind: Snapshot})
	return nil
}

// CommitCheck records a transaction committing at c1 in the anchor and c2
// in storage, or fails with ErrOrder (nothing recorded) when some point
// orders the engines the other way.
func (r *Registry) CommitCheck(c1, c2 uint64) error {
	if r.floor != nil && c1 <= r.floor.Anchor {
		return fmt.Errorf("%w (commit %d, recycled through %d)", ErrTooOld, c1, r.floor.Anchor)
	}
	me := Point{Anchor: c1, Storage: c2, Kind: Commit}
	if p, ok := r.atOrBelow(Point{Anchor: c1 - 1, Kind: Snapshot}); ok && c2 <= p.Storage {
		return fmt.Errorf("%w: commit %d→%d after %s %d→%d", ErrOrder, c1, c2, p.Kind, p.Anchor, p.Storage)
	}
	if q, ok := r.above(Point{Anchor: c1 - 1, Kind: Snapshot}); ok {
		bad := c2 >= q.Storage
		if q.Kind == Snapshot {
			bad = c2 > q.Low
		}
		if bad || (q.Anchor == c1 && q.Kind == Commit) {
			return fmt.Errorf("%w: commit %d→%d before %s %d→%d", ErrOrder, c1, c2, q.Kind, q.Anchor, q.Storage)
		}
	}
	r.insert(me)
	return nil
}

// Recycle drops the oldest closed parts whose every anchor is below
// oldestActive (the smallest anchor snapshot any running or future
// transaction may still select with), keeping keep closed parts at least.
// It returns how many parts it dropped.
func (r *Registry) Recycle(oldestActive uint64, keep int) int {
	dropped := 0
	for len(r.parts)-1 > keep {
		p := r.parts[0]
		last := p.points[len(p.points)-1]
		if last.Anchor >= oldestActive {
			break
		}
		r.floor = &last
		r.points -= len(p.points)
		r.parts = r.parts[1:]
		dropped++
	}
	return dropped
}

// Stats reports the number of parts and points held.
func (r *Registry) Stats() (parts, points int) { return len(r.parts), r.points }

// Floor returns the last recycled point, if any.
func (r *Registry) Floor() (Point, bool) {
	if r.floor == nil {
		return Point{}, false
	}
	return *r.floor, true
}

func (r *Registry) insert(p Point) {
	r.points++
	n := len(r.parts)
	if n == 0 || (len(r.parts[n-1].points) >= r.partSize && r.parts[n-1].points[len(r.parts[n-1].points)-1].less(p)) {
		r.parts = append(r.parts, &part{points: []Point{p}})
		return
	}
	// The part whose range holds p: the last with lo ≤ p.Anchor.
	i := sort.Search(n, func(i int) bool { return r.parts[i].lo() > p.Anchor }) - 1
	if i < 0 {
		i = 0
	}
	pts := r.parts[i].points
	j := sort.Search(len(pts), func(j int) bool { return p.less(pts[j]) })
	pts = append(pts, Point{})
	copy(pts[j+1:], pts[j:])
	pts[j] = p
	r.parts[i].points = pts
}

// find returns the point equal to p in anchor and kind, or nil.
func (r *Registry) find(p Point) *Point {
	for i := len(r.parts) - 1; i >= 0; i-- {
		pts := r.parts[i].points
		if p.less(pts[0]) {
			continue
		}
		j := sort.Search(len(pts), func(j int) bool { return !pts[j].less(p) })
		if j < len(pts) && pts[j].Anchor == p.Anchor && pts[j].Kind == p.Kind {
			return &pts[j]
		}
		return nil
	}
	return nil
}

// atOrBelow is the greatest point ≤ p (the floor when the parts hold none).
func (r *Registry) atOrBelow(p Point) (Point, bool) {
	for i := len(r.parts) - 1; i >= 0; i-- {
		pts := r.parts[i].points
		if !p.less(pts[0]) {
			j := sort.Search(len(pts), func(j int) bool { return p.less(pts[j]) })
			if j > 0 {
				return pts[j-1], true
			}
		}
	}
	if r.floor != nil {
		return *r.floor, true
	}
	return Point{}, false
}

// above is the least point > p.
func (r *Registry) above(p Point) (Point, bool) {
	for _, pt := range r.parts {
		pts := pt.points
		if !p.less(pts[len(pts)-1]) {
			continue
		}
		j := sort.Search(len(pts), func(j int) bool { return p.less(pts[j]) })
		return pts[j], true
	}
	return Point{}, false
}
