package iceberg

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/compress"
	"github.com/apache/arrow-go/v18/parquet/file"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"
	ice "github.com/apache/iceberg-go"
	"github.com/apache/iceberg-go/puffin"
	"github.com/apache/iceberg-go/table/dv"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/lake"
	"github.com/retinadb/retina/internal/writebuffer"
)

// The files a publication writes, encoded with Arrow's Parquet writer and
// Apache iceberg-go (manifests, manifest lists, Puffin, deletion vectors).

// fieldIDKey is the Arrow field metadata the Parquet writer takes a field
// id from.
const fieldIDKey = "PARQUET:field_id"

func numbered(f arrow.Field, id int) arrow.Field {
	f.Metadata = arrow.NewMetadata([]string{fieldIDKey}, []string{strconv.Itoa(id)})
	return f
}

// pieceSchema is the Arrow schema of a table's pieces: its columns with
// their field ids.
func pieceSchema(t *catalog.Table) *arrow.Schema {
	plain := writebuffer.Schema(writebuffer.TableColumns(t.Schema))
	fields := plain.Fields()
	for i := range fields {
		fields[i] = numbered(fields[i], lake.FieldID(i))
	}
	return arrow.NewSchema(fields, nil)
}

// pieceProps are the writer settings of pieces: they live until their
// rows' files are combined, seconds to minutes, and are rewritten a few
// times meanwhile, so they are written as cheaply as Parquet allows:
// uncompressed, plain encoding and no statistics (measured in retina bench
// iceberg: compression took a fifth of the publisher's CPU, statistics a
// twelfth; a piece is small, so readers lose little by reading it whole).
func pieceProps() *parquet.WriterProperties {
	return parquet.NewWriterProperties(parquet.WithCompression(compress.Codecs.Uncompressed),
		parquet.WithDictionaryDefault(false), parquet.WithStats(false), parquet.WithMaxRowGroupLength(1<<20), parquet.WithCreatedBy("retina"))
}

// pieceWriter writes the visible rows of spans into one Parquet file.
type pieceWriter struct {
	t      *catalog.Table
	schema *arrow.Schema
	fw     *pqarrow.FileWriter
	rows   int64
	segs   []segment
	mem    memory.Allocator
}

func newPieceWriter(t *catalog.Table, out io.Writer, mem memory.Allocator) (*pieceWriter, error) {
	w := &pieceWriter{t: t, schema: pieceSchema(t), mem: mem}
	fw, err := pqarrow.NewFileWriter(w.schema, out, pieceProps(), pqarrow.DefaultWriterProps())
	if err != nil {
		return nil, fmt.Errorf("iceberg: table %s: piece writer: %w", t.Name, err)
	}
	w.fw = fw
	return w, nil
}

// sliceRuns is how many runs of visible rows a record may have for them to
// be written as slices of it; with more, the visible rows are copied out.
const sliceRuns = 8

// span writes the rows of [s.Lo, s.Hi) of file f that are not deleted in
// deleted, reading them with read.
func (w *pieceWriter) span(ctx context.Context, r *rowReader, f FileState, s span, deleted []uint64) error {
	seg := segment{File: s.File, Lo: s.Lo, Hi: s.Hi, Written: make([]uint64, words(s.Hi-s.Lo))}
	err := r.read(ctx, w.t, f, s.Lo, s.Hi, func(off int64, rec arrow.RecordBatch) error {
		n := rec.NumRows()
		mask, visible := lake.VisibleMask(nil, int(n), bitsFrom(deleted, off, n), nil, 0)
		if visible == 0 {
			return nil
		}
		var runs [][2]int64
		if visible == int(n) {
			runs = [][2]int64{{0, n}}
		} else {
			eachRun(mask, func(lo, hi int64) { runs = append(runs, [2]int64{lo, hi}) })
		}
		for _, run := range runs {
			setRange(seg.Written, off-s.Lo+run[0], off-s.Lo+run[1])
		}
		cols := rec.Columns()[:rec.NumCols()-1] // without create_ts
		if len(runs) <= sliceRuns {
			// Few runs: each is written as a slice of rec, nothing copied.
			whole := array.NewRecordBatch(w.schema, cols, n)
			defer whole.Release()
			for _, run := range runs {
				part := whole.NewSlice(run[0], run[1])
				err := w.fw.WriteBuffered(part)
				part.Release()
				if err != nil {
					return fmt.Errorf("iceberg: table %s: write piece: %w", w.t.Name, err)
				}
			}
		} else {
			out, err := lake.FilterVisible(ctx, rec, mask, visible, w.mem)
			if err != nil {
				return err
			}
			defer out.Release()
			numbered := array.NewRecordBatch(w.schema, out.Columns()[:out.NumCols()-1], out.NumRows())
			defer numbered.Release()
			if err := w.fw.WriteBuffered(numbered); err != nil {
				return fmt.Errorf("iceberg: table %s: write piece: %w", w.t.Name, err)
			}
		}
		w.rows += int64(visible)
		seg.Rows += int64(visible)
		return nil
	})
	if err != nil {
		return err
	}
	w.segs = append(w.segs, seg)
	return nil
}

// finish writes the file's footer.
func (w *pieceWriter) finish() error {
	if err := w.fw.Close(); err != nil {
		return fmt.Errorf("iceberg: table %s: finish piece: %w", w.t.Name, err)
	}
	return nil
}

// abort stops writing the file.
func (w *pieceWriter) abort() { w.fw.Close() }

// position is one row of a positional delete file.
type position struct {
	path string
	pos  int64
}

// encodePositionDeletes writes a positional delete file, its rows sorted
// by path and position as the format asks.
func encodePositionDeletes(rows []position, mem memory.Allocator) ([]byte, error) {
	if !slices.IsSortedFunc(rows, comparePositions) {
		slices.SortFunc(rows, comparePositions)
	}
	// The paths go in as a dictionary array: the writer then stores the
	// indexes as they are instead of hashing every row's path.
	dict := array.NewStringBuilder(mem)
	defer dict.Release()
	idx := array.NewInt32Builder(mem)
	defer idx.Release()
	pos := array.NewInt64Builder(mem)
	defer pos.Release()
	idx.Reserve(len(rows))
	pos.Reserve(len(rows))
	n := int32(-1)
	for i, r := range rows {
		if i == 0 || r.path != rows[i-1].path {
			dict.Append(r.path)
			n++
		}
		idx.Append(n)
		pos.Append(r.pos)
	}
	dictArr, idxArr, posArr := dict.NewArray(), idx.NewArray(), pos.NewArray()
	defer dictArr.Release()
	defer idxArr.Release()
	defer posArr.Release()
	pathType := &arrow.DictionaryType{IndexType: arrow.PrimitiveTypes.Int32, ValueType: arrow.BinaryTypes.String}
	paths := array.NewDictionaryArray(pathType, idxArr, dictArr)
	defer paths.Release()
	schema := arrow.NewSchema([]arrow.Field{
		numbered(arrow.Field{Name: "file_path", Type: pathType}, 2147483546),
		numbered(arrow.Field{Name: "pos", Type: arrow.PrimitiveTypes.Int64}, 2147483545),
	}, nil)
	rec := array.NewRecordBatch(schema, []arrow.Array{paths, posArr}, int64(len(rows)))
	defer rec.Release()
	var buf bytes.Buffer
	props := parquet.NewWriterProperties(parquet.WithCompression(compress.Codecs.Zstd), parquet.WithCompressionLevel(1),
		parquet.WithDictionaryDefault(false), parquet.WithDictionaryFor("file_path", true),
		parquet.WithStats(true), parquet.WithMaxRowGroupLength(1<<20), parquet.WithCreatedBy("retina"))
	fw, err := pqarrow.NewFileWriter(schema, &buf, props, pqarrow.DefaultWriterProps())
	if err != nil {
		return nil, fmt.Errorf("iceberg: positional delete writer: %w", err)
	}
	if err := fw.Write(rec); err != nil {
		fw.Close()
		return nil, fmt.Errorf("iceberg: write positional deletes: %w", err)
	}
	if err := fw.Close(); err != nil {
		return nil, fmt.Errorf("iceberg: finish positional deletes: %w", err)
	}
	return buf.Bytes(), nil
}

func comparePositions(a, b position) int {
	if a.path != b.path {
		return strings.Compare(a.path, b.path)
	}
	return cmp.Compare(a.pos, b.pos)
}

// decodePositionDeletes reads a positional delete file back.
func decodePositionDeletes(ctx context.Context, data []byte, mem memory.Allocator) ([]position, error) {
	pf, err := file.NewParquetReader(bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	defer pf.Close()
	fr, err := pqarrow.NewFileReader(pf, pqarrow.ArrowReadProperties{BatchSize: 1 << 16}, mem)
	if err != nil {
		return nil, err
	}
	tbl, err := fr.ReadTable(ctx)
	if err != nil {
		return nil, err
	}
	defer tbl.Release()
	if tbl.NumCols() != 2 {
		return nil, fmt.Errorf("%d columns, want file_path and pos", tbl.NumCols())
	}
	out := make([]position, 0, tbl.NumRows())
	paths, poss := tbl.Column(0).Data().Chunks(), tbl.Column(1).Data().Chunks()
	for i := range paths {
		ps, ok1 := paths[i].(*array.String)
		pp, ok2 := poss[i].(*array.Int64)
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("columns are %s and %s, want string and int64", paths[i].DataType(), poss[i].DataType())
		}
		for j := range ps.Len() {
			out = append(out, position{ps.Value(j), pp.Value(j)})
		}
	}
	return out, nil
}

// dvBlob is one deletion vector for a Puffin file.
type dvBlob struct {
	data    string // the data file's path
	deleted []uint64
}

// dvPlaced is where a deletion vector went in its Puffin file.
type dvPlaced struct {
	data        string // the data file's path
	off, length int64
	cardinality int64
}

// encodeDVs writes deletion vectors into one Puffin file.
func encodeDVs(blobs []dvBlob) ([]byte, []dvPlaced, error) {
	var buf bytes.Buffer
	w, err := puffin.NewWriter(&buf)
	if err != nil {
		return nil, nil, fmt.Errorf("iceberg: puffin writer: %w", err)
	}
	if err := w.SetCreatedBy("retina"); err != nil {
		return nil, nil, err
	}
	out := make([]dvPlaced, 0, len(blobs))
	for _, b := range blobs {
		bm := dv.NewRoaringPositionBitmap()
		eachRun(b.deleted, func(lo, hi int64) { bm.SetRange(uint64(lo), uint64(hi)) })
		bm.RunLengthEncode()
		data, err := dv.SerializeDV(bm)
		if err != nil {
			return nil, nil, fmt.Errorf("iceberg: deletion vector of %s: %w", b.data, err)
		}
		card := bm.Cardinality()
		meta, err := w.AddBlob(puffin.BlobMetadataInput{Type: puffin.BlobTypeDeletionVector, SnapshotID: -1, SequenceNumber: -1,
			Fields: []int32{}, Properties: map[string]string{"referenced-data-file": b.data, "cardinality": strconv.FormatInt(card, 10)}}, data)
		if err != nil {
			return nil, nil, fmt.Errorf("iceberg: deletion vector of %s: %w", b.data, err)
		}
		out = append(out, dvPlaced{b.data, meta.Offset, meta.Length, card})
	}
	if err := w.Finish(); err != nil {
		return nil, nil, fmt.Errorf("iceberg: finish puffin file: %w", err)
	}
	return buf.Bytes(), out, nil
}

// encodeManifest writes a manifest of snapshot snap.
func encodeManifest(format int, schema *ice.Schema, snap int64, content ice.ManifestContent, entries []*entry, path string) ([]byte, ice.ManifestFile, error) {
	var buf bytes.Buffer
	w, err := ice.NewManifestWriter(format, &buf, *ice.UnpartitionedSpec, schema, snap, ice.WithManifestWriterContent(content))
	if err != nil {
		return nil, nil, fmt.Errorf("iceberg: manifest writer: %w", err)
	}
	for _, e := range entries {
		me, err := e.manifestEntry(snap)
		if err != nil {
			return nil, nil, err
		}
		if e.Snapshot == snap {
			err = w.Add(me)
		} else {
			err = w.Existing(me)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("iceberg: manifest entry %s: %w", e.Path, err)
		}
	}
	if err := w.Close(); err != nil {
		return nil, nil, fmt.Errorf("iceberg: finish manifest: %w", err)
	}
	mf, err := w.ToManifestFile(path, int64(buf.Len()))
	if err != nil {
		return nil, nil, fmt.Errorf("iceberg: manifest %s: %w", path, err)
	}
	return buf.Bytes(), mf, nil
}

// encodeManifestList writes a snapshot's manifest list and returns the
// manifests as it records them (sequence numbers and, in format version
// 3, first row ids assigned), ready to be named again by a later snapshot.
func encodeManifestList(format int, snap int64, parent *int64, seq, firstRowID int64, manifests []ice.ManifestFile) ([]byte, []ice.ManifestFile, error) {
	var buf bytes.Buffer
	if err := ice.WriteManifestList(format, &buf, snap, parent, &seq, firstRowID, manifests); err != nil {
		return nil, nil, fmt.Errorf("iceberg: manifest list: %w", err)
	}
	recorded, err := ice.ReadManifestList(bytes.NewReader(buf.Bytes()))
	if err != nil {
		return nil, nil, fmt.Errorf("iceberg: read back the manifest list: %w", err)
	}
	return buf.Bytes(), recorded, nil
}
