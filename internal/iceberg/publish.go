package iceberg

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	ice "github.com/apache/iceberg-go"
	"github.com/apache/iceberg-go/table"
	"github.com/google/uuid"

	"github.com/retinadb/retina/internal/failpoint"
)

// publication makes one snapshot of every table at one state. Nothing it
// does is visible before commit: it works on copies of the tables' states,
// writes files no current snapshot names, and the publication record,
// written last, makes them current at once.
type publication struct {
	p   *Publisher
	st  *State
	id  int64 // every table's new snapshot id
	now time.Time

	mu sync.Mutex // tables are published side by side
	// written are the objects it wrote, removed again if it fails.
	written []string
	bytes   Bytes
}

// wrote records an object the publication wrote and its bytes.
func (pb *publication) wrote(key string, add func(b *Bytes)) {
	pb.mu.Lock()
	defer pb.mu.Unlock()
	if key != "" {
		pb.written = append(pb.written, key)
	}
	add(&pb.bytes)
}

// Bytes counts what a publication wrote, by kind.
type Bytes struct {
	Data, Deletes, Metadata int64
	// PieceRows are the rows written into pieces.
	PieceRows int64
}

// maxDeleteFiles bounds a table's positional delete files.
const maxDeleteFiles = 8

// metadataLogMax is how many earlier metadata files a table's metadata
// lists (and keeps): more than its version hint may lag.
const metadataLogMax = hintEvery + 2

// put writes a file of the publication. Every one has a fresh name and is
// read once the publication record names it, so it is written in place
// (lake.PutNew), but for metadata files: readers that open a table by its
// location look for the next version's, which must appear whole.
func (pb *publication) put(ctx context.Context, key string, data []byte, kind func(*Bytes) *int64) error {
	write := pb.p.cfg.Lake.PutNew
	if strings.HasSuffix(key, ".metadata.json") {
		write = pb.p.cfg.Lake.Put
	}
	if err := write(ctx, key, data); err != nil {
		return fmt.Errorf("iceberg: write %s: %w", key, err)
	}
	pb.wrote(key, func(b *Bytes) { *kind(b) += int64(len(data)) })
	return nil
}

func dataBytes(b *Bytes) *int64     { return &b.Data }
func deleteBytes(b *Bytes) *int64   { return &b.Deletes }
func metadataBytes(b *Bytes) *int64 { return &b.Metadata }

// table publishes one table: prev is its state so far (nil for a table
// never published).
func (pb *publication) table(ctx context.Context, prev *tableState, ts TableState) (*tableState, error) {
	t := ts.Table
	format := pb.p.cfg.FormatVersion
	var next *tableState
	if prev == nil || prev.TableID != t.ID || prev.Format != format {
		// New, or the Retina table was dropped and made again under its
		// name, or the format version changed: a new Iceberg table.
		dir, err := pb.p.tableDir(t)
		if err != nil {
			return nil, err
		}
		loc, _ := pb.p.cfg.Lake.ObjectURI(dir)
		next = newTableState(t, format, dir, loc)
		if prev != nil && prev.Dir == dir {
			next.Version = prev.Version
		}
	} else {
		next = prev.clone()
	}
	snap := pb.id
	seq := int64(1)
	var parent *int64
	if next.Meta != nil {
		seq = next.Meta.LastSequenceNumber() + 1
		if cur := next.Meta.CurrentSnapshot(); cur != nil {
			id := cur.SnapshotID
			parent = &id
		}
	}

	// Retina's regular files are data files as they are.
	virtual := map[uint64]virtualAt{}
	files := map[uint64]FileState{}
	regularKeys := map[string]FileState{}
	for _, f := range ts.Files {
		if f.Virtual && f.Rows > 0 {
			if rows, ok := pb.p.cfg.Combined(f.ID); ok && rows >= f.Rows {
				// Combined since the checkpoint: its regular object holds
				// the rows of the state first, and the rest, which came
				// later, are masked, so no piece need hold them.
				hidden := make([]uint64, words(rows))
				copy(hidden, f.Deleted)
				setRange(hidden, f.Rows, rows)
				f = FileState{ID: f.ID, Key: f.Key, Replayer: f.Replayer, Rows: rows, Deleted: hidden}
			}
		}
		files[f.ID] = f
		if f.Virtual {
			if f.Rows > 0 {
				virtual[f.ID] = virtualAt{Rows: f.Rows, Deleted: f.Deleted}
			}
			continue
		}
		regularKeys[f.Key] = f
	}
	pieceKeys := map[string]bool{}
	for _, pc := range next.Pieces {
		pieceKeys[pc.Key] = true
	}
	for path, e := range next.Data {
		if _, ok := regularKeys[e.Key]; !ok && !pieceKeys[e.Key] {
			delete(next.Data, path)
		}
	}
	masks := map[string][]uint64{}
	for _, key := range slices.Sorted(maps.Keys(regularKeys)) {
		f := regularKeys[key]
		path, err := pb.p.uri(key)
		if err != nil {
			return nil, err
		}
		if _, ok := next.Data[path]; !ok {
			size, err := pb.p.cfg.Lake.Size(ctx, key)
			if err != nil {
				return nil, fmt.Errorf("iceberg: table %s file %d: %w", t.Name, f.ID, err)
			}
			next.Data[path] = &entry{Path: path, Key: key, Content: ice.EntryContentData, Format: ice.ParquetFile,
				Records: f.Rows, Size: size, Snapshot: snap, Seq: seq}
		}
		if f.Deleted != nil {
			masks[path] = trimmed(f.Deleted, f.Rows)
		}
	}
	for id := range next.Upto {
		if _, ok := virtual[id]; !ok {
			delete(next.Upto, id) // regular now, or gone
		}
	}

	// Pieces: rows of virtual files.
	if err := pb.pieces(ctx, next, ts, files, virtual, masks, len(regularKeys), snap, seq); err != nil {
		return nil, err
	}
	if err := pb.deletes(ctx, next, masks, snap, seq); err != nil {
		return nil, err
	}
	next.Masked = masks
	pb.p.cfg.Failpoints.Hit(failpoint.IcebergAfterData)

	schema, schemaChanged, err := pb.schema(next, ts)
	if err != nil {
		return nil, err
	}
	listKey, refs, addedRows, err := pb.manifests(ctx, next, schema, snap, parent, seq)
	if err != nil {
		return nil, err
	}
	pb.p.cfg.Failpoints.Hit(failpoint.IcebergAfterManifests)
	if err := pb.metadata(ctx, next, ts, schema, schemaChanged, listKey, refs, snap, parent, seq, addedRows); err != nil {
		return nil, err
	}
	return next, nil
}

// pieces brings the table's pieces to the state: drops the ones whose
// rows are all masked, and writes the rows virtual files gained (merged
// with the newest pieces, as mergeFrom decides) into one new piece.
func (pb *publication) pieces(ctx context.Context, next *tableState, ts TableState, files map[uint64]FileState, virtual map[uint64]virtualAt,
	masks map[string][]uint64, regular int, snap, seq int64) error {
	var alive []*piece
	var live []int64
	for _, pc := range next.Pieces {
		bm, n := pc.masked(virtual)
		if n == 0 {
			delete(next.Data, pc.Path)
			continue
		}
		alive = append(alive, pc)
		live = append(live, n)
		masks[pc.Path] = bm
	}
	next.Pieces = alive
	var fresh []span
	var freshRows int64
	for _, id := range slices.Sorted(maps.Keys(virtual)) {
		v := virtual[id]
		if lo := next.Upto[id]; v.Rows > lo {
			fresh = append(fresh, span{id, lo, v.Rows})
			freshRows += v.Rows - lo - count(bitsFrom(v.Deleted, lo, v.Rows-lo))
		}
	}
	if len(fresh) == 0 {
		return nil
	}
	from := mergeFrom(live, freshRows, max(2, regular+2*len(virtual)))
	spans := spansOf(alive[from:], virtual, fresh)
	key := fmt.Sprintf("%s/data/p-%d.parquet", next.Dir, snap)
	path, err := pb.p.uri(key)
	if err != nil {
		return err
	}
	obj, err := pb.p.cfg.Lake.CreateNew(ctx, key)
	if err != nil {
		return fmt.Errorf("iceberg: table %s: %w", ts.Table.Name, err)
	}
	// The Parquet writer closes a writer that can be closed: the object is
	// committed (or dropped) here instead.
	w, err := newPieceWriter(ts.Table, struct{ io.Writer }{obj}, pb.p.mem)
	if err != nil {
		obj.Abort()
		return err
	}
	for _, s := range spans {
		if err := w.span(ctx, &pb.p.reader, files[s.File], s, virtual[s.File].Deleted); err != nil {
			w.abort()
			obj.Abort()
			return err
		}
	}
	if err := w.finish(); err != nil {
		obj.Abort()
		return err
	}
	if w.rows == 0 { // every row written since is deleted already
		obj.Abort()
	} else {
		if err := obj.Close(); err != nil {
			return fmt.Errorf("iceberg: table %s: %w", ts.Table.Name, err)
		}
		pb.wrote(key, func(b *Bytes) { b.Data += obj.Size() })
	}
	for _, pc := range alive[from:] {
		delete(next.Data, pc.Path)
		delete(masks, pc.Path)
	}
	next.Pieces = alive[:from]
	for _, s := range fresh {
		next.Upto[s.File] = s.Hi
	}
	pb.wrote("", func(b *Bytes) { b.PieceRows += w.rows })
	if w.rows == 0 {
		return nil
	}
	pc := &piece{entry: &entry{Path: path, Key: key, Content: ice.EntryContentData, Format: ice.ParquetFile,
		Records: w.rows, Size: obj.Size(), Snapshot: snap, Seq: seq}, Segs: w.segs}
	next.Pieces = append(next.Pieces, pc)
	next.Data[path] = pc.entry
	return nil
}

// deletes brings the table's delete information to masks: positional
// delete files in format version 2, deletion vectors in version 3.
func (pb *publication) deletes(ctx context.Context, next *tableState, masks map[string][]uint64, snap, seq int64) error {
	if next.Format >= 3 {
		return pb.deletionVectors(ctx, next, masks, snap, seq)
	}
	return pb.positionDeletes(ctx, next, masks, snap, seq)
}

// deleteFile is a positional delete file with how many of its positions
// each data file has (nil: unknown, loaded at a start).
type deleteFile struct {
	*entry
	covers map[string]int64
}

// positionDeletes writes the positions masked since the last publication
// into one new delete file, merged with the newest ones as mergeFrom
// decides; delete files all of whose positions are of data files the
// table no longer has leave it. A data file's masked positions only grow,
// but for one: a file combined since its state's checkpoint is published
// with the rows it gained after the checkpoint masked, and they show in
// the next publication. The delete files holding such a file's positions
// are then merged again without the positions no longer masked.
func (pb *publication) positionDeletes(ctx context.Context, next *tableState, masks map[string][]uint64, snap, seq int64) error {
	var rows []position
	fresh := next.Masked == nil
	unmasked := map[string]bool{}
	for _, path := range slices.Sorted(maps.Keys(masks)) {
		bm := masks[path]
		if !fresh {
			bm = andNot(bm, next.Masked[path])
		}
		eachSet(bm, func(i int64) { rows = append(rows, position{path, i}) })
	}
	if !fresh {
		for path, prev := range next.Masked {
			if _, ok := next.Data[path]; ok && count(andNot(prev, masks[path])) > 0 {
				unmasked[path] = true
			}
		}
	}
	var kept []*deleteFile
	var live []int64
	for _, d := range next.Deletes {
		if fresh {
			continue // written anew below
		}
		n := int64(0)
		for path, c := range d.covers {
			if _, ok := next.Data[path]; ok {
				n += c
			}
		}
		if n == 0 {
			continue
		}
		kept, live = append(kept, d), append(live, n)
	}
	from := len(kept)
	if len(rows) > 0 || len(kept) > maxDeleteFiles {
		from = mergeFrom(live, int64(len(rows)), maxDeleteFiles)
	}
	for i, d := range kept {
		if i >= from {
			break
		}
		for path := range unmasked {
			if d.covers[path] > 0 {
				from = i
				break
			}
		}
	}
	for _, d := range kept[from:] {
		data, err := pb.p.cfg.Lake.Get(ctx, d.Key)
		if err != nil {
			return fmt.Errorf("iceberg: merge delete files: %w", err)
		}
		old, err := decodePositionDeletes(ctx, data, pb.p.mem)
		if err != nil {
			return fmt.Errorf("iceberg: merge delete files: %s: %w", d.Key, err)
		}
		for _, r := range old {
			if _, ok := next.Data[r.path]; ok && (!unmasked[r.path] || bitAt(masks[r.path], r.pos)) {
				rows = append(rows, r)
			}
		}
	}
	next.Deletes = kept[:from]
	if len(rows) == 0 {
		return nil
	}
	data, err := encodePositionDeletes(rows, pb.p.mem)
	if err != nil {
		return err
	}
	key := fmt.Sprintf("%s/data/d-%d.parquet", next.Dir, snap)
	if err := pb.put(ctx, key, data, deleteBytes); err != nil {
		return err
	}
	path, err := pb.p.uri(key)
	if err != nil {
		return err
	}
	covers := map[string]int64{}
	for _, r := range rows {
		covers[r.path]++
	}
	next.Deletes = append(next.Deletes, &deleteFile{entry: &entry{Path: path, Key: key, Content: ice.EntryContentPosDeletes,
		Format: ice.ParquetFile, Records: int64(len(rows)), Size: int64(len(data)), Snapshot: snap, Seq: seq}, covers: covers})
	return nil
}

// deletionVectors writes a deletion vector for every data file whose
// masked positions changed (one Puffin file for the table), and keeps the
// others' as they are.
func (pb *publication) deletionVectors(ctx context.Context, next *tableState, masks map[string][]uint64, snap, seq int64) error {
	fresh := next.Masked == nil
	var blobs []dvBlob
	for _, path := range slices.Sorted(maps.Keys(masks)) {
		bm := masks[path]
		n := count(bm)
		old, ok := next.DVs[path]
		switch {
		case n == 0:
			delete(next.DVs, path)
		case ok && old.Records == n && !fresh:
		default:
			blobs = append(blobs, dvBlob{data: path, deleted: bm})
		}
	}
	for path := range next.DVs {
		if _, ok := masks[path]; !ok {
			delete(next.DVs, path)
		}
	}
	if len(blobs) == 0 {
		return nil
	}
	data, placed, err := encodeDVs(blobs)
	if err != nil {
		return err
	}
	key := fmt.Sprintf("%s/data/dv-%d.puffin", next.Dir, snap)
	if err := pb.put(ctx, key, data, deleteBytes); err != nil {
		return err
	}
	path, err := pb.p.uri(key)
	if err != nil {
		return err
	}
	for _, pl := range placed {
		next.DVs[pl.data] = &entry{Path: path, Key: key, Content: ice.EntryContentPosDeletes, Format: ice.PuffinFile,
			Records: pl.cardinality, Size: int64(len(data)), Snapshot: snap, Seq: seq, Referenced: pl.data, Offset: pl.off, Length: pl.length}
	}
	return nil
}

// schema is the table's Iceberg schema at the state: the current one, or
// a new one with the next id when the Retina table gained columns.
func (pb *publication) schema(next *tableState, ts TableState) (*ice.Schema, bool, error) {
	if next.Meta == nil {
		s, err := schemaOf(ts.Table, 0)
		return s, true, err
	}
	cur := next.Meta.CurrentSchema()
	s, err := schemaOf(ts.Table, cur.ID)
	if err != nil {
		return nil, false, err
	}
	if sameFields(cur, s) {
		return cur, false, nil
	}
	id := 0
	for _, old := range next.Meta.Schemas() {
		id = max(id, old.ID+1)
	}
	s, err = schemaOf(ts.Table, id)
	return s, true, err
}

// manifests writes the snapshot's manifests (reusing the current ones
// whose files did not change) and manifest list. It returns the list's
// key, the objects the snapshot names, and (format version 3) the rows the
// snapshot adds to the table's row ids.
func (pb *publication) manifests(ctx context.Context, next *tableState, schema *ice.Schema, snap int64, parent *int64, seq int64) (string, []string, int64, error) {
	dataFiles := slices.SortedFunc(maps.Values(next.Data), func(a, b *entry) int {
		// Added files first: format version 3 numbers their rows from the
		// manifest's first row id, in this order.
		if (a.Snapshot == snap) != (b.Snapshot == snap) {
			if a.Snapshot == snap {
				return -1
			}
			return 1
		}
		return cmp.Compare(a.Path, b.Path)
	})
	var delFiles []*entry
	if next.Format >= 3 {
		delFiles = slices.SortedFunc(maps.Values(next.DVs), func(a, b *entry) int { return cmp.Compare(a.Referenced, b.Referenced) })
	} else {
		for _, d := range next.Deletes {
			delFiles = append(delFiles, d.entry)
		}
	}
	var manifests []ice.ManifestFile
	var refs []string
	newData := false
	for _, kind := range []struct {
		content ice.ManifestContent
		files   []*entry
		cur     *ice.ManifestFile
		set     *string
		name    string
	}{
		{ice.ManifestContentData, dataFiles, &next.DataManifest, &next.dataSet, "data"},
		{ice.ManifestContentDeletes, delFiles, &next.DeleteManifest, &next.deleteSet, "deletes"},
	} {
		if len(kind.files) == 0 {
			*kind.cur, *kind.set = nil, ""
			continue
		}
		set := fingerprint(kind.files)
		if *kind.cur == nil || *kind.set != set {
			key := fmt.Sprintf("%s/metadata/m-%d-%s.avro", next.Dir, snap, kind.name)
			path, err := pb.p.uri(key)
			if err != nil {
				return "", nil, 0, err
			}
			data, mf, err := encodeManifest(next.Format, schema, snap, kind.content, kind.files, path)
			if err != nil {
				return "", nil, 0, fmt.Errorf("iceberg: table %s: %w", next.Name, err)
			}
			if err := pb.put(ctx, key, data, metadataBytes); err != nil {
				return "", nil, 0, err
			}
			*kind.cur, *kind.set = mf, set
			newData = newData || kind.content == ice.ManifestContentData
		}
		manifests = append(manifests, *kind.cur)
		key, err := pb.p.keyOf((*kind.cur).FilePath())
		if err != nil {
			return "", nil, 0, err
		}
		refs = append(refs, key)
		for _, e := range kind.files {
			refs = append(refs, e.Key)
		}
	}
	var firstRowID int64
	if next.Meta != nil {
		firstRowID = next.Meta.NextRowID()
	}
	listKey := fmt.Sprintf("%s/metadata/snap-%d.avro", next.Dir, snap)
	data, recorded, err := encodeManifestList(next.Format, snap, parent, seq, firstRowID, manifests)
	if err != nil {
		return "", nil, 0, fmt.Errorf("iceberg: table %s: %w", next.Name, err)
	}
	if err := pb.put(ctx, listKey, data, metadataBytes); err != nil {
		return "", nil, 0, err
	}
	var added int64
	for _, mf := range recorded {
		switch mf.ManifestContent() {
		case ice.ManifestContentData:
			if newData && next.Format >= 3 && mf.FirstRowID() != nil {
				// Files this snapshot adds take their row ids from the
				// manifest's, in order; later snapshots list them with it.
				id := *mf.FirstRowID()
				for _, e := range dataFiles {
					if e.Snapshot == snap && e.FirstRowID == nil {
						v := id
						e.FirstRowID = &v
						id += e.Records
					}
				}
				added = mf.AddedRows() + mf.ExistingRows()
			}
			next.DataManifest = mf
		case ice.ManifestContentDeletes:
			next.DeleteManifest = mf
		}
	}
	return listKey, append(refs, listKey), added, nil
}

// fingerprint identifies a set of files (their paths and the snapshots
// that added them).
func fingerprint(files []*entry) string {
	h := sha256.New()
	for _, e := range slices.SortedFunc(slices.Values(files), func(a, b *entry) int {
		return cmp.Or(cmp.Compare(a.Path, b.Path), cmp.Compare(a.Referenced, b.Referenced))
	}) {
		fmt.Fprintf(h, "%s|%s|%d|%d\n", e.Path, e.Referenced, e.Snapshot, e.Records)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// metadata writes the table's next metadata file: the new snapshot, the
// schema, the retention policy applied.
func (pb *publication) metadata(ctx context.Context, next *tableState, ts TableState, schema *ice.Schema, schemaChanged bool,
	listKey string, refs []string, snap int64, parent *int64, seq, addedRows int64) error {
	t := ts.Table
	var b *table.MetadataBuilder
	var err error
	if next.Meta == nil {
		if b, err = table.NewMetadataBuilder(next.Format); err != nil {
			return fmt.Errorf("iceberg: table %s: %w", t.Name, err)
		}
		// Copies: the builder numbers what it is given, and these are
		// iceberg-go's shared values.
		spec, order := *ice.UnpartitionedSpec, table.UnsortedSortOrder
		err = firstOf(b.SetUUID(uuid.New()), b.SetLoc(next.Location), b.AddSchema(schema), b.SetCurrentSchemaID(-1),
			b.AddPartitionSpec(&spec, true), b.SetDefaultSpecID(-1), b.AddSortOrder(&order),
			b.SetDefaultSortOrderID(-1))
	} else {
		cur, uerr := pb.p.uri(next.MetaKey)
		if uerr != nil {
			return uerr
		}
		if b, err = table.MetadataBuilderFromBase(next.Meta, cur); err != nil {
			return fmt.Errorf("iceberg: table %s: %w", t.Name, err)
		}
		if schemaChanged {
			err = firstOf(b.AddSchema(schema), b.SetCurrentSchemaID(-1))
		}
	}
	if err != nil {
		return fmt.Errorf("iceberg: table %s: %w", t.Name, err)
	}
	mapping, err := nameMapping(t)
	if err != nil {
		return err
	}
	if err := b.SetProperties(ice.Properties{"schema.name-mapping.default": mapping, "retina.table-id": strconv.FormatUint(uint64(t.ID), 10),
		"retina.table": t.Name, "write.metadata.previous-versions-max": strconv.Itoa(metadataLogMax)}); err != nil {
		return fmt.Errorf("iceberg: table %s: %w", t.Name, err)
	}
	listURI, err := pb.p.uri(listKey)
	if err != nil {
		return err
	}
	sid := schema.ID
	s := &table.Snapshot{SnapshotID: snap, ParentSnapshotID: parent, SequenceNumber: seq, TimestampMs: pb.now.UnixMilli(),
		ManifestList: listURI, SchemaID: &sid, Summary: &table.Summary{Operation: table.OpOverwrite, Properties: pb.summary(next)}}
	if next.Format >= 3 {
		first := int64(0)
		if next.Meta != nil {
			first = next.Meta.NextRowID()
		}
		s.FirstRowID, s.AddedRows = &first, &addedRows
	}
	if err := firstOf(b.AddSnapshot(s), b.SetSnapshotRef(table.MainBranch, snap, table.BranchRef)); err != nil {
		return fmt.Errorf("iceberg: table %s: snapshot %d: %w", t.Name, snap, err)
	}
	var snaps []snapTime
	if next.Meta != nil {
		for _, old := range next.Meta.Snapshots() {
			snaps = append(snaps, snapTime{old.SnapshotID, time.UnixMilli(old.TimestampMs)})
		}
	}
	snaps = append(snaps, snapTime{snap, pb.now})
	if gone := expired(snaps, pb.now, pb.p.cfg.Retention); len(gone) > 0 {
		if err := b.RemoveSnapshots(gone, false); err != nil {
			return fmt.Errorf("iceberg: table %s: expire snapshots: %w", t.Name, err)
		}
		for _, id := range gone {
			delete(next.Refs, id)
		}
	}
	b.TrimMetadataLogs(metadataLogMax)
	md, err := b.Build()
	if err != nil {
		return fmt.Errorf("iceberg: table %s: metadata: %w", t.Name, err)
	}
	data, err := json.Marshal(md)
	if err != nil {
		return fmt.Errorf("iceberg: table %s: encode metadata: %w", t.Name, err)
	}
	next.Version++
	key := fmt.Sprintf("%s/metadata/v%d.metadata.json", next.Dir, next.Version)
	if err := pb.put(ctx, key, data, metadataBytes); err != nil {
		return err
	}
	next.Meta, next.MetaKey, next.metaJSON = md, key, data
	next.Refs[snap] = refs
	return nil
}

// summary is a snapshot's summary: where Retina stood and what the table
// holds.
func (pb *publication) summary(next *tableState) ice.Properties {
	var records, deletes int64
	for _, e := range next.Data {
		records += e.Records
	}
	delFiles := len(next.DVs)
	for _, d := range next.Deletes {
		deletes += d.Records
		delFiles++
	}
	for _, d := range next.DVs {
		deletes += d.Records
	}
	sources, _ := json.Marshal(pb.st.Sources)
	return ice.Properties{
		"retina.snapshot-ts":     strconv.FormatUint(pb.st.TS, 10),
		"retina.sources":         string(sources),
		"total-records":          strconv.FormatInt(records, 10),
		"total-data-files":       strconv.Itoa(len(next.Data)),
		"total-delete-files":     strconv.Itoa(delFiles),
		"total-position-deletes": strconv.FormatInt(deletes, 10),
	}
}

func firstOf(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
