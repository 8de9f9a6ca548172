package iceberg

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/apache/arrow-go/v18/arrow/memory"
	"golang.org/x/sync/errgroup"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/failpoint"
	"github.com/retinadb/retina/internal/lake"
)

// Config configures a publisher.
type Config struct {
	Lake *lake.Store
	// Buffers reads rows of virtual files from the replayers' buffers.
	Buffers Buffers
	// FormatVersion is the Iceberg format version of the tables: 2
	// (positional delete files, the default) or 3 (deletion vectors).
	FormatVersion int
	// Interval is the least time between two publications (default 1s).
	Interval time.Duration
	// Retention is how long a snapshot stays listed (see expired).
	Retention time.Duration
	// Live says Retina's catalog still names an object: the publisher
	// deletes an object of Retina's that no retained snapshot names any
	// more only once Retina no longer has it.
	Live func(key string) bool
	// Combined says a file is regular now and how many rows its object
	// holds: a file virtual in a state but combined by the time it is
	// published is published as it is rather than rewritten in a piece.
	Combined   func(file uint64) (rows int64, ok bool)
	Failpoints *failpoint.Set
	Logger     *slog.Logger
	// Now is the clock (tests set it).
	Now func() time.Time
}

// Default settings.
const (
	DefaultFormatVersion = 2
	DefaultInterval      = time.Second
	DefaultRetention     = 10 * time.Minute
)

// RecordKey is the lake key of the publication record.
const RecordKey = "iceberg/catalog.json"

// recordFormat is the version of the publication record's format.
const recordFormat = 1

// record is the publication record: which metadata file is current for
// every table. Replacing it commits a publication (see doc.go).
type record struct {
	Format        int           `json:"format"`
	Publication   int64         `json:"publication"`
	SnapshotTS    uint64        `json:"snapshot_ts"`
	Published     time.Time     `json:"published"`
	FormatVersion int           `json:"format_version"`
	Tables        []recordTable `json:"tables"`
}

type recordTable struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	TableID   uint32 `json:"table_id"`
	Metadata  string `json:"metadata"`
	Version   int    `json:"version"`
}

// Published describes one committed publication.
type Published struct {
	ID                int64
	TS                uint64
	Sealed, Committed time.Time
	Duration          time.Duration
	Bytes             Bytes
	Tables            []PublishedTable
}

// PublishedTable is one table of a publication.
type PublishedTable struct {
	Namespace, Name                       string
	DataFiles, DeleteFiles, Pieces, Snaps int
	RetinaFiles                           int // Retina's own files of the table (regular and virtual)
}

// Stats count the publisher's work.
type Stats struct {
	Publications, Failures uint64
	Last                   Published
	// Retained is the snapshots all tables list now; Written what every
	// publication wrote together.
	Retained int
	Written  Bytes
}

// Publisher publishes Retina's tables as Iceberg tables.
type Publisher struct {
	cfg    Config
	log    *slog.Logger
	mem    memory.Allocator
	reader rowReader
	base   string // the URI prefix of lake keys

	running sync.Mutex // one publication at a time

	mu      sync.Mutex
	tables  map[uint32]*tableState // the committed tables, by Retina table id
	rec     *record
	nextID  int64
	kept    map[string]bool // objects retained snapshots name, metadata files
	pending map[string]int  // objects of offered states not published yet
	offered *State
	wake    chan struct{}
	stats   Stats
	history []Published
	observe func(Published) // set by Observe; guarded by mu
	hold    func() bool     // set by HoldWhile; guarded by mu
}

// HoldWhile defers publication while held returns true: a source's
// initial copy is running, and its tables, partial, are no snapshot of the
// source worth publishing (nor the work: publication would write the rows
// of the copy's write-buffer blocks out as pieces, again and again).
func (p *Publisher) HoldWhile(held func() bool) {
	p.mu.Lock()
	p.hold = held
	p.mu.Unlock()
}

// Observe has fn told of every publication committed from now on (nil
// stops it). fn runs on the publishing goroutine: it must not block.
func (p *Publisher) Observe(fn func(Published)) {
	p.mu.Lock()
	p.observe = fn
	p.mu.Unlock()
}

// publishWorkers is how many tables a publication publishes at once.
const publishWorkers = 2

// historyMax bounds the publications Publisher.History keeps.
const historyMax = 4096

// Open loads what was published before from the lake: the current record,
// every table's metadata and the files its retained snapshots name, so
// that Keeps answers before anything else touches the lake. A record or
// metadata file that cannot be read refuses the start.
func Open(ctx context.Context, cfg Config) (*Publisher, error) {
	if cfg.Lake == nil || cfg.Buffers == nil {
		return nil, fmt.Errorf("iceberg: a lake and the write buffers are required")
	}
	if cfg.FormatVersion == 0 {
		cfg.FormatVersion = DefaultFormatVersion
	}
	if cfg.FormatVersion != 2 && cfg.FormatVersion != 3 {
		return nil, fmt.Errorf("iceberg: format version %d: want 2 (positional delete files) or 3 (deletion vectors)", cfg.FormatVersion)
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Retention <= 0 {
		cfg.Retention = DefaultRetention
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Live == nil {
		cfg.Live = func(string) bool { return true }
	}
	if cfg.Combined == nil {
		cfg.Combined = func(uint64) (int64, bool) { return 0, false }
	}
	probe, ok := cfg.Lake.ObjectURI("iceberg")
	if !ok {
		return nil, fmt.Errorf("iceberg: the lake %s has no addresses other engines can open: publish from a file:// or s3:// lake", cfg.Lake.URL())
	}
	p := &Publisher{cfg: cfg, log: cfg.Logger.With("component", "iceberg"), mem: memory.DefaultAllocator,
		base: strings.TrimSuffix(probe, "iceberg"), tables: map[uint32]*tableState{}, kept: map[string]bool{},
		pending: map[string]int{}, wake: make(chan struct{}, 1), nextID: 1}
	p.reader = rowReader{lake: cfg.Lake, buffers: cfg.Buffers, mem: p.mem}
	if err := p.load(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// load reads the publication record and the tables it names.
func (p *Publisher) load(ctx context.Context) error {
	data, err := p.cfg.Lake.Get(ctx, RecordKey)
	if errors.Is(err, lake.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("iceberg: read the publication record %s: %w", RecordKey, err)
	}
	var rec record
	if err := json.Unmarshal(data, &rec); err != nil || rec.Format != recordFormat || rec.Publication <= 0 {
		return fmt.Errorf("iceberg: the publication record %s is damaged (%v, format %d, publication %d): remove every object under iceberg/ to publish the tables anew, or restore them from a backup", RecordKey, err, rec.Format, rec.Publication)
	}
	for _, rt := range rec.Tables {
		t, err := p.loadTable(ctx, rt)
		if err != nil {
			return fmt.Errorf("iceberg: table %s.%s: %w: remove every object under iceberg/ to publish the tables anew, or restore them from a backup", rt.Namespace, rt.Name, err)
		}
		p.tables[rt.TableID] = t
	}
	p.rec, p.nextID = &rec, rec.Publication+1
	p.kept = p.keptBy(p.tables)
	p.log.Info("loaded the Iceberg publication", "publication", rec.Publication, "snapshot_ts", rec.SnapshotTS, "tables", len(rec.Tables))
	return nil
}

// keptBy is every object the tables' retained snapshots and metadata
// files name.
func (p *Publisher) keptBy(tables map[uint32]*tableState) map[string]bool {
	kept := map[string]bool{}
	for _, t := range tables {
		for _, refs := range t.Refs {
			for _, k := range refs {
				kept[k] = true
			}
		}
		for _, k := range p.metadataKeys(t) {
			kept[k] = true
		}
	}
	return kept
}

// metadataKeys are a table's current metadata file, the earlier ones its
// metadata lists, and its version hint.
func (p *Publisher) metadataKeys(t *tableState) []string {
	if t.Meta == nil {
		return nil
	}
	out := []string{t.MetaKey, hintKey(t.Dir)}
	for e := range t.Meta.PreviousFiles() {
		if k, err := p.keyOf(e.MetadataFile); err == nil {
			out = append(out, k)
		}
	}
	return out
}

func hintKey(dir string) string { return dir + "/metadata/version-hint.text" }

// hintEvery is how many versions a table's version hint may lag: writing
// it with every publication cost a sixth of the publisher's writes, and a
// reader that opens a table by its location then reads a version at most
// this many publications old, which the table keeps (metadataLogMax).
const hintEvery = 10

// Keeps says a retained snapshot, or a publication under way, names the
// object: Retina's GC must leave it to the publisher.
func (p *Publisher) Keeps(key string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.kept[key] || p.pending[key] > 0
}

// Sweep deletes the objects under iceberg/ that nothing current names: what
// a publication that did not commit left. Call it at the start, before
// publishing.
func (p *Publisher) Sweep(ctx context.Context) error {
	objs, err := p.cfg.Lake.List(ctx, "iceberg/")
	if err != nil {
		return fmt.Errorf("iceberg: list iceberg/: %w", err)
	}
	p.mu.Lock()
	kept := maps.Clone(p.kept)
	p.mu.Unlock()
	n := 0
	for _, o := range objs {
		if o.Key == RecordKey || kept[o.Key] {
			continue
		}
		if err := p.cfg.Lake.Delete(ctx, o.Key); err != nil {
			return fmt.Errorf("iceberg: delete %s, left by a publication that did not commit: %w", o.Key, err)
		}
		n++
	}
	if n > 0 {
		p.log.Info("deleted what publications that did not commit left", "objects", n)
	}
	return nil
}

// Offer hands the publisher a durable state to publish. A state offered
// while another waits replaces it; the objects a waiting or running
// publication needs are kept from Retina's GC (Keeps) until it ends.
func (p *Publisher) Offer(st *State) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.offered != nil {
		p.release(p.offered)
	}
	p.offered = st
	for _, k := range st.keys() {
		p.pending[k]++
	}
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// release lets go of a state's objects. Called with mu held.
func (p *Publisher) release(st *State) {
	for _, k := range st.keys() {
		if p.pending[k]--; p.pending[k] <= 0 {
			delete(p.pending, k)
		}
	}
}

// CPULabelKey and CPULabel mark the publisher's goroutine in CPU
// profiles (pprof labels), so its share of the CPU can be measured.
const (
	CPULabelKey = "retina"
	CPULabel    = "iceberg"
)

// Run publishes what is offered, at most once an interval, until ctx
// ends.
func (p *Publisher) Run(ctx context.Context) {
	pprof.Do(ctx, pprof.Labels(CPULabelKey, CPULabel), p.run)
}

func (p *Publisher) run(ctx context.Context) {
	var last time.Time // when the last published state was sealed
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		}
		// Checkpoints set the pace; a state sealed sooner than the
		// interval after the last one published waits (and may be
		// replaced by a newer one meanwhile).
		p.mu.Lock()
		st, hold := p.offered, p.hold
		p.mu.Unlock()
		if st == nil {
			continue
		}
		if hold != nil && hold() {
			continue // the next checkpoint offers a newer state
		}
		if due := last.Add(p.cfg.Interval * 9 / 10); st.Sealed.Before(due) {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Until(due)):
			}
		}
		p.mu.Lock()
		st = p.offered
		p.offered = nil
		p.mu.Unlock()
		if st == nil {
			continue
		}
		err := p.Publish(ctx, st)
		p.mu.Lock()
		p.release(st)
		p.mu.Unlock()
		if err != nil && ctx.Err() == nil {
			p.log.Warn("Iceberg publication failed; the previous snapshots stay current and the next checkpoint tries again", "snapshot_ts", st.TS, "err", err)
			continue
		}
		last = st.Sealed
	}
}

// Publish commits one snapshot of every table at st. On error nothing
// changes: the previous snapshots stay current.
func (p *Publisher) Publish(ctx context.Context, st *State) error {
	p.running.Lock()
	defer p.running.Unlock()
	start := time.Now()
	p.mu.Lock()
	id, prev := p.nextID, maps.Clone(p.tables)
	if p.rec != nil && st.TS <= p.rec.SnapshotTS && p.rec.FormatVersion == p.cfg.FormatVersion {
		p.mu.Unlock()
		return nil // published already
	}
	p.mu.Unlock()
	pb := &publication{p: p, st: st, id: id, now: p.cfg.Now()}
	byDir := map[string]*tableState{}
	for _, t := range prev {
		byDir[t.Dir] = t
	}
	next := map[uint32]*tableState{}
	tables := slices.SortedFunc(slices.Values(st.Tables), func(a, b TableState) int { return strings.Compare(a.Table.Name, b.Table.Name) })
	// Tables are published side by side: a publication's time is mostly
	// waiting for writes and for a core, and the lag is its time.
	var nextMu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(publishWorkers)
	for _, ts := range tables {
		old := prev[ts.Table.ID]
		if old == nil {
			if dir, err := p.tableDir(ts.Table); err == nil {
				old = byDir[dir] // a table of the same name before: carry its version numbers on
			}
		}
		g.Go(func() error {
			nt, err := pb.table(gctx, old, ts)
			if err != nil {
				return err
			}
			nextMu.Lock()
			next[ts.Table.ID] = nt
			nextMu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		p.fail(ctx, pb)
		return err
	}
	p.cfg.Failpoints.Hit(failpoint.IcebergAfterMetadata)
	rec := &record{Format: recordFormat, Publication: id, SnapshotTS: st.TS, Published: pb.now.UTC(), FormatVersion: p.cfg.FormatVersion}
	for _, ts := range tables {
		t := next[ts.Table.ID]
		rec.Tables = append(rec.Tables, recordTable{Namespace: t.Namespace, Name: t.Name, TableID: t.TableID, Metadata: t.MetaKey, Version: t.Version})
	}
	data, err := json.MarshalIndent(rec, "", " ")
	if err != nil {
		p.fail(ctx, pb)
		return fmt.Errorf("iceberg: encode the publication record: %w", err)
	}
	if err := p.cfg.Lake.Put(ctx, RecordKey, data); err != nil {
		p.fail(ctx, pb)
		return fmt.Errorf("iceberg: commit publication %d: %w", id, err)
	}
	committed := time.Now()
	p.cfg.Failpoints.Hit(failpoint.IcebergAfterCommit)
	p.mu.Lock()
	oldKept, oldTables := p.kept, p.tables
	p.tables, p.rec, p.nextID = next, rec, id+1
	p.kept = p.keptBy(next)
	newKept := p.kept
	p.mu.Unlock()

	for _, t := range next {
		old := oldTables[t.TableID]
		if !st.Final && old != nil && old.Dir == t.Dir && old.hinted > 0 && t.Version-old.hinted < hintEvery {
			t.hinted = old.hinted
			continue
		}
		if err := p.cfg.Lake.Put(ctx, hintKey(t.Dir), []byte(strconv.Itoa(t.Version))); err != nil {
			p.log.Warn("could not write a table's version hint; readers that open the table by its location see an earlier version", "table", t.Namespace+"."+t.Name, "err", err)
			continue
		}
		t.hinted = t.Version
	}
	p.cfg.Failpoints.Hit(failpoint.IcebergBeforeExpire)
	p.expire(ctx, oldKept, newKept, oldTables, next)

	res := Published{ID: id, TS: st.TS, Sealed: st.Sealed, Committed: committed, Duration: time.Since(start), Bytes: pb.bytes}
	retinaFiles := map[uint32]int{}
	for _, ts := range st.Tables {
		retinaFiles[ts.Table.ID] = len(ts.Files)
	}
	retained := 0
	for _, t := range next {
		n := len(t.Meta.Snapshots())
		retained += n
		res.Tables = append(res.Tables, PublishedTable{Namespace: t.Namespace, Name: t.Name, DataFiles: len(t.Data),
			DeleteFiles: len(t.Deletes) + len(t.DVs), Pieces: len(t.Pieces), Snaps: n, RetinaFiles: retinaFiles[t.TableID]})
	}
	p.mu.Lock()
	p.stats.Publications++
	p.stats.Last, p.stats.Retained = res, retained
	p.stats.Written.Data += pb.bytes.Data
	p.stats.Written.Deletes += pb.bytes.Deletes
	p.stats.Written.Metadata += pb.bytes.Metadata
	p.stats.Written.PieceRows += pb.bytes.PieceRows
	p.history = append(p.history, res)
	if len(p.history) > historyMax {
		p.history = slices.Delete(p.history, 0, len(p.history)-historyMax)
	}
	observe := p.observe
	p.mu.Unlock()
	if observe != nil {
		observe(res)
	}
	p.log.Debug("published Iceberg snapshots", "publication", id, "snapshot_ts", st.TS, "tables", len(next),
		"took", res.Duration.Round(time.Millisecond), "lag", committed.Sub(st.Sealed).Round(time.Millisecond))
	return nil
}

// fail removes what a publication that will not commit wrote.
func (p *Publisher) fail(ctx context.Context, pb *publication) {
	p.mu.Lock()
	p.stats.Failures++
	p.mu.Unlock()
	for _, k := range pb.written {
		if err := p.cfg.Lake.Delete(context.WithoutCancel(ctx), k); err != nil {
			p.log.Warn("could not delete a file of a failed publication; the next start deletes it", "key", k, "err", err)
		}
	}
}

// expire deletes what the retained snapshots no longer name: objects
// under iceberg/ at once, Retina's own once its catalog no longer has them
// (until then Retina owns them and deletes them itself).
func (p *Publisher) expire(ctx context.Context, oldKept, newKept map[string]bool, oldTables, newTables map[uint32]*tableState) {
	for id, t := range oldTables {
		if _, ok := newTables[id]; !ok && t.Meta != nil {
			// A table Retina dropped: its version hint goes too.
			if nt := p.byDir(newTables, t.Dir); nt == nil {
				oldKept[hintKey(t.Dir)] = true
			}
		}
	}
	for k := range oldKept {
		if newKept[k] {
			continue
		}
		if !strings.HasPrefix(k, "iceberg/") {
			p.mu.Lock()
			busy := p.pending[k] > 0
			p.mu.Unlock()
			if busy || p.cfg.Live(k) {
				continue
			}
		}
		if err := p.cfg.Lake.Delete(ctx, k); err != nil {
			p.log.Warn("could not delete a file no retained snapshot names; the next start deletes it", "key", k, "err", err)
		}
	}
}

func (p *Publisher) byDir(tables map[uint32]*tableState, dir string) *tableState {
	for _, t := range tables {
		if t.Dir == dir {
			return t
		}
	}
	return nil
}

// tableDir is the lake key prefix of a table's location: iceberg/<ns>/<name>
// when both are plain names (letters, digits, '.', '_', '-'), else
// iceberg/t<id>.
func (p *Publisher) tableDir(t *catalog.Table) (string, error) {
	ns, name := splitName(t.Name)
	if plain(ns) && plain(name) {
		return "iceberg/" + ns + "/" + name, nil
	}
	return fmt.Sprintf("iceberg/t%d", t.ID), nil
}

func plain(s string) bool {
	if strings.Trim(s, ".") == "" {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// uri is the address readers open a lake key by.
func (p *Publisher) uri(key string) (string, error) {
	u, ok := p.cfg.Lake.ObjectURI(key)
	if !ok {
		return "", fmt.Errorf("iceberg: object %s of %s has no address other engines can open", key, p.cfg.Lake.URL())
	}
	return u, nil
}

// keyOf is the lake key of a URI the publisher wrote.
func (p *Publisher) keyOf(uri string) (string, error) {
	k, ok := strings.CutPrefix(uri, p.base)
	if !ok {
		return "", fmt.Errorf("iceberg: %s is not in the lake %s", uri, p.cfg.Lake.URL())
	}
	return k, nil
}

// Close releases what the publisher keeps in memory.
func (p *Publisher) Close() { p.reader.blocks.clear() }

// Stats reports the publisher's counters.
func (p *Publisher) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// History lists the last publications, oldest first.
func (p *Publisher) History() []Published {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.history)
}

// Interval is the least time between publications.
func (p *Publisher) Interval() time.Duration { return p.cfg.Interval }

// CatalogTable is a published table as the REST catalog serves it.
type CatalogTable struct {
	Namespace, Name  string
	MetadataLocation string
	Metadata         []byte // the current metadata file's JSON
}

// Tables lists the published tables by namespace and name.
func (p *Publisher) Tables() []CatalogTable {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]CatalogTable, 0, len(p.tables))
	for _, t := range p.tables {
		loc, _ := p.cfg.Lake.ObjectURI(t.MetaKey)
		out = append(out, CatalogTable{Namespace: t.Namespace, Name: t.Name, MetadataLocation: loc, Metadata: t.metaJSON})
	}
	slices.SortFunc(out, func(a, b CatalogTable) int {
		return strings.Compare(a.Namespace+"\x00"+a.Name, b.Namespace+"\x00"+b.Name)
	})
	return out
}

// Current is the committed publication: its id and snapshot timestamp (0
// when nothing was published).
func (p *Publisher) Current() (id int64, ts uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.rec == nil {
		return 0, 0
	}
	return p.rec.Publication, p.rec.SnapshotTS
}
