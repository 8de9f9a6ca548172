// Package htap feeds Retina from the Skeena store running in the same
// process. Its Source is a cdc.Source whose transactions are the store's
// commits in the store's one global commit order (a cross-engine
// transaction is one transaction), so the sink replays each as one mirror
// transaction.
//
// The store's commit stream lives in memory, so every start begins with a
// copy: one transaction that empties the replicated tables in Retina and
// writes every row the store holds at one cross-engine snapshot. The
// stream then continues with exactly the commits that snapshot does not
// include. Whatever a crash lost on either side, Retina equals the store
// once the copy is applied (a table dropped while Retina was not following
// is emptied by the copy too: the store keeps a tombstone of its name). The
// copy reads everything, so a start takes time in proportion to the data.
// When the source stops, it stops the store's stream, which then holds
// nothing until the store is opened again (the next start).
//
// Positions: every start uses a stream of its own, "skeena/E" (E: the SQL
// catalog's epoch, which grows with every open), offset 1 for the copy and
// then one offset per commit, so a replay checkpoint never makes the sink
// drop a commit of a later start as a duplicate.
package htap

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/cdc"
	"github.com/retinadb/retina/internal/oltp/engine"
	"github.com/retinadb/retina/internal/oltp/skeena"
	"github.com/retinadb/retina/internal/oltp/sqlstore"
	"github.com/retinadb/retina/internal/oltp/streamorder"
	"github.com/retinadb/retina/internal/types"
)

// Catalog is what the source needs of Retina's catalog.
type Catalog interface {
	Snapshot() *catalog.Snapshot
	CreateTable(ctx context.Context, name string, schema catalog.Schema) (*catalog.Table, error)
}

// RowIDColumn is the key column a table without a primary key gets in
// Retina: the store's hidden row id.
const RowIDColumn = "_skeena_row_id"

// Stats describe the source's progress.
type Stats struct {
	CopyDone   bool
	CopyRows   int64
	Commits    int64 // commits delivered after the copy
	LastCommit time.Time
}

// Source is the store's commit stream as a cdc.Source.
type Source struct {
	store  *skeena.Store
	sql    *sqlstore.Catalog
	retina Catalog
	log    *slog.Logger
	stream string

	out    chan cdc.Message
	done   chan struct{}
	err    error
	cancel context.CancelFunc

	copyRows, commits atomic.Int64
	copyDone          atomic.Bool
	lastCommit        atomic.Int64
}

// Open starts the copy and the stream in the background. The store must
// have been opened with its commit stream on.
func Open(store *skeena.Store, sql *sqlstore.Catalog, retina Catalog, log *slog.Logger) (*Source, error) {
	if store.Commits() == nil {
		return nil, errors.New("htap: the store was opened without its commit stream")
	}
	if log == nil {
		log = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Source{store: store, sql: sql, retina: retina, log: log.With("source", "skeena"),
		stream: fmt.Sprintf("skeena/%d", sql.Epoch()), out: make(chan cdc.Message, 4096), done: make(chan struct{}), cancel: cancel}
	go s.run(ctx)
	return s, nil
}

// Name is how the source is named in Retina's checkpoints.
const Name = "skeena:"

// Next returns the next message.
func (s *Source) Next(ctx context.Context) (cdc.Message, error) {
	select {
	case m := <-s.out:
		return m, nil
	case <-ctx.Done():
		return cdc.Message{}, ctx.Err()
	case <-s.done:
		select {
		case m := <-s.out:
			return m, nil
		default:
		}
		if s.err != nil {
			return cdc.Message{}, s.err
		}
		return cdc.Message{}, io.EOF
	}
}

// Commit needs nothing: every start copies.
func (s *Source) Commit(context.Context, map[string]int64) error { return nil }

// Contiguous: each transaction's records arrive together and in commit
// order, so the sink may apply the copy in parts.
func (s *Source) Contiguous() bool { return true }

// Stream is the stream name of this start.
func (s *Source) Stream() string { return s.stream }

// Close stops the source.
func (s *Source) Close() error {
	s.cancel()
	<-s.done
	return nil
}

// Stats reports progress.
func (s *Source) Stats() Stats {
	st := Stats{CopyDone: s.copyDone.Load(), CopyRows: s.copyRows.Load(), Commits: s.commits.Load()}
	if ms := s.lastCommit.Load(); ms > 0 {
		st.LastCommit = time.UnixMilli(ms)
	}
	return st
}

func (s *Source) run(ctx context.Context) {
	defer close(s.done)
	err := s.follow(ctx)
	// Nobody reads the store's stream any more: stop it, or it would hold
	// every later commit in memory. The next start copies again.
	s.store.StopStream(fmt.Errorf("htap: Retina stopped following the store: %w", cmp.Or(err, io.EOF)))
	if err != nil && !errors.Is(err, context.Canceled) {
		s.log.Error("skeena source stopped; Retina follows the store again after a restart", "err", err)
		s.err = err
	}
}

func (s *Source) emit(ctx context.Context, r cdc.Record) error {
	m := cdc.Message{Pos: r.Pos, Record: &r}
	select {
	case s.out <- m:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// follow copies, then delivers the stream.
func (s *Source) follow(ctx context.Context) error {
	anchor, storage, err := s.copy(ctx)
	if err != nil {
		return err
	}
	offset := int64(1)
	for {
		var c streamorder.Commit
		var ok bool
		select {
		case c, ok = <-s.store.Commits():
		case <-ctx.Done():
			return ctx.Err()
		}
		if !ok {
			if err := s.store.StreamErr(); err != nil {
				return fmt.Errorf("skeena source: %w", err)
			}
			return nil // the store closed
		}
		if c.Mem != 0 && c.Mem <= anchor || c.Storage != 0 && c.Storage <= storage {
			continue // the copy has it
		}
		cs, _ := c.Payload.(*sqlstore.ChangeSet)
		if cs == nil {
			continue
		}
		offset++
		if err := s.deliver(ctx, offset, c, cs); err != nil {
			return err
		}
	}
}

// table is a replicated table as Retina holds it.
func (s *Source) table(ctx context.Context, t *sqlstore.Table) (*catalog.Table, error) {
	name := strings.ToLower(t.Name)
	want := schemaOf(t)
	if rt, ok := s.retina.Snapshot().Table(name); ok {
		if !sameShape(rt.Schema, want) {
			return nil, fmt.Errorf("htap: Retina's table %s does not have the columns and key of the store's table %s (%s); give the store's table another name or remove Retina's", name, t.Name, t.DefinitionSQL())
		}
		return rt, nil
	}
	rt, err := s.retina.CreateTable(ctx, name, want)
	if err != nil && errors.Is(err, catalog.ErrExists) {
		if rt, ok := s.retina.Snapshot().Table(name); ok {
			return rt, nil
		}
	}
	if err != nil {
		return nil, fmt.Errorf("htap: create Retina's table %s: %w", name, err)
	}
	return rt, nil
}

// schemaOf is the Retina schema of a store table: the same columns and
// key, or the hidden row id as key.
func schemaOf(t *sqlstore.Table) catalog.Schema {
	var sc catalog.Schema
	for _, c := range t.Columns {
		sc.Columns = append(sc.Columns, catalog.Column{Name: strings.ToLower(c.Name), Type: c.Type, Nullable: c.Nullable})
	}
	for _, i := range t.PK {
		sc.PrimaryKey = append(sc.PrimaryKey, strings.ToLower(t.Columns[i].Name))
		sc.Columns[i].Nullable = false
	}
	if t.HiddenPK() {
		sc.Columns = append(sc.Columns, catalog.Column{Name: RowIDColumn, Type: types.Of(types.Int64)})
		sc.PrimaryKey = []string{RowIDColumn}
	}
	return sc
}

func sameShape(a, b catalog.Schema) bool {
	if len(a.Columns) != len(b.Columns) || !slices.Equal(a.PrimaryKey, b.PrimaryKey) {
		return false
	}
	for i := range a.Columns {
		if a.Columns[i].Name != b.Columns[i].Name || a.Columns[i].Type != b.Columns[i].Type {
			return false
		}
	}
	return true
}

// row is a store row as Retina holds it.
func row(t *sqlstore.Table, vals, pk []any) []any {
	if !t.HiddenPK() {
		return vals
	}
	return append(slices.Clip(vals), pk[0])
}

// copy delivers one transaction that makes Retina's replicated tables equal
// to the store at one snapshot, and returns that snapshot.
func (s *Source) copy(ctx context.Context) (anchor, storage uint64, err error) {
	// Snapshot isolation whatever the store's default: a read-only copy
	// has nothing to validate, and under serializable any concurrent write
	// to what it read would fail it.
	tx := s.store.BeginTx(skeena.TxOptions{Isolation: engine.SnapshotIsolation})
	defer tx.Rollback()
	if anchor, storage, err = tx.Snapshots(ctx); err != nil {
		return 0, 0, fmt.Errorf("skeena source: take the copy's snapshot: %w", err)
	}
	// The tables as the snapshot has them, not as the catalog has them now:
	// DDL committed around the snapshot is either in the copy or on the
	// stream after it.
	tables, err := sqlstore.TablesAt(ctx, tx)
	if err != nil {
		return 0, 0, fmt.Errorf("skeena source: list the copy's tables: %w", err)
	}
	dropped, err := sqlstore.DroppedAt(ctx, tx)
	if err != nil {
		return 0, 0, fmt.Errorf("skeena source: %w", err)
	}
	id := s.stream + "@copy"
	pos := cdc.Position{Stream: s.stream, Offset: 1}
	began := time.Now()
	var n int64
	per := map[string]int64{}
	change := func(r cdc.Record) error {
		r.Kind, r.Pos, r.TxID, r.TotalOrder = cdc.Change, pos, id, n
		n++
		per[r.Table]++
		return s.emit(ctx, r)
	}
	for _, t := range tables {
		rt, err := s.table(ctx, t)
		if err != nil {
			return 0, 0, err
		}
		if err := change(cdc.Record{Table: rt.Name, Op: cdc.OpTruncate}); err != nil {
			return 0, 0, err
		}
	}
	// A drop the last run committed but Retina never applied leaves rows
	// there; the drop's tombstone says to empty them, as the drop would.
	for _, def := range dropped {
		// Only a table that is still the dropped one's shape: a later table
		// of that name from elsewhere is not ours to empty.
		if rt, ok := s.retina.Snapshot().Table(strings.ToLower(def.Name)); ok && sameShape(rt.Schema, schemaOf(def)) {
			if err := change(cdc.Record{Table: rt.Name, Op: cdc.OpTruncate}); err != nil {
				return 0, 0, err
			}
		}
	}
	rows := sqlstore.Rows{Tx: tx, Cat: s.sql}
	for _, t := range tables {
		name := strings.ToLower(t.Name)
		err := rows.Each(ctx, t, func(r sqlstore.Row) error {
			s.copyRows.Add(1)
			return change(cdc.Record{Table: name, Op: cdc.OpRead, After: row(t, r.Vals, r.PK)})
		})
		if err != nil {
			return 0, 0, fmt.Errorf("skeena source: copy table %s: %w", t.Name, err)
		}
	}
	// Committing the read-only transaction waits until everything it read
	// is durable in both engines: Retina never shows a copy that a crash of
	// the store could take back.
	if err := tx.Commit(ctx); err != nil {
		return 0, 0, fmt.Errorf("skeena source: wait for the copy's snapshot to be durable: %w", err)
	}
	if err := s.emit(ctx, cdc.Record{Kind: cdc.End, Pos: pos, TxID: id, EventCount: n, PerTable: per}); err != nil {
		return 0, 0, err
	}
	s.copyDone.Store(true)
	s.log.Info("copied the store into Retina", "tables", len(tables), "rows", s.copyRows.Load(),
		"seconds", fmt.Sprintf("%.1f", time.Since(began).Seconds()), "anchor", anchor, "storage", storage)
	return anchor, storage, nil
}

// deliver sends one commit as one transaction.
func (s *Source) deliver(ctx context.Context, offset int64, c streamorder.Commit, cs *sqlstore.ChangeSet) error {
	id := fmt.Sprintf("%s@%d", s.stream, offset)
	pos := cdc.Position{Stream: s.stream, Offset: offset}
	now := time.Now().UnixMilli()
	var n int64
	per := map[string]int64{}
	change := func(r cdc.Record) error {
		r.Kind, r.Pos, r.TxID, r.TotalOrder, r.SourceTSms = cdc.Change, pos, id, n, now
		n++
		per[r.Table]++
		return s.emit(ctx, r)
	}
	for _, t := range cs.Created {
		rt, err := s.table(ctx, t)
		if err != nil {
			return err
		}
		if err := change(cdc.Record{Table: rt.Name, Op: cdc.OpTruncate}); err != nil {
			return err
		}
	}
	for _, t := range cs.Dropped {
		// Retina keeps the table, empty: queries on it keep working.
		if rt, ok := s.retina.Snapshot().Table(strings.ToLower(t.Name)); ok {
			if err := change(cdc.Record{Table: rt.Name, Op: cdc.OpTruncate}); err != nil {
				return err
			}
		}
	}
	for _, ch := range cs.Changes {
		name := strings.ToLower(ch.Table.Name)
		var r cdc.Record
		switch {
		case ch.Existed && ch.Row == nil:
			r = cdc.Record{Table: name, Op: cdc.OpDelete, Key: keyOf(ch)}
		case ch.Existed:
			r = cdc.Record{Table: name, Op: cdc.OpUpdate, Key: keyOf(ch), After: row(ch.Table, ch.Row, ch.PK)}
		case ch.Row != nil:
			r = cdc.Record{Table: name, Op: cdc.OpCreate, After: row(ch.Table, ch.Row, ch.PK)}
		default:
			continue // inserted and deleted again
		}
		if err := change(r); err != nil {
			return err
		}
	}
	if n == 0 {
		return s.emit(ctx, cdc.Record{Kind: cdc.Skip, Pos: pos, SkipReason: "commit without row changes"})
	}
	if err := s.emit(ctx, cdc.Record{Kind: cdc.End, Pos: pos, TxID: id, EventCount: n, PerTable: per, SourceTSms: now}); err != nil {
		return err
	}
	s.commits.Add(1)
	s.lastCommit.Store(now)
	return nil
}

func keyOf(ch *sqlstore.Change) []any { return ch.PK }
