package demo

import (
	"context"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	icerest "github.com/apache/iceberg-go/catalog/rest"
	icetable "github.com/apache/iceberg-go/table"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retinadb/retina/internal/hybench"
)

// icebergReader reads Retina's published tables as another engine would:
// Apache iceberg-go through the REST catalog.
type icebergReader struct {
	cat *icerest.Catalog
}

func newIcebergReader(ctx context.Context, uri string) (*icebergReader, error) {
	cat, err := icerest.NewCatalog(ctx, "retina", uri)
	if err != nil {
		return nil, fmt.Errorf("iceberg catalog %s: %w", uri, err)
	}
	return &icebergReader{cat: cat}, nil
}

// scanAt reads a table's snapshot whose retina.snapshot-ts is ts (the
// given fields only, all when none).
func (r *icebergReader) scanAt(ctx context.Context, name string, ts uint64, fields ...string) (arrow.Table, error) {
	tbl, err := r.cat.LoadTable(ctx, icetable.Identifier{"public", name})
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", name, err)
	}
	want := strconv.FormatUint(ts, 10)
	var id int64 = -1
	for _, s := range tbl.Metadata().Snapshots() {
		if s.Summary != nil && s.Summary.Properties["retina.snapshot-ts"] == want {
			id = s.SnapshotID
		}
	}
	if id < 0 {
		return nil, fmt.Errorf("%s lists no snapshot at Retina timestamp %d", name, ts)
	}
	opts := []icetable.ScanOption{icetable.WithSnapshotID(id)}
	if len(fields) > 0 {
		opts = append(opts, icetable.WithSelectedFields(fields...))
	}
	at, err := tbl.Scan(opts...).ToArrowTable(ctx)
	if err != nil {
		return nil, fmt.Errorf("scan %s at snapshot %d: %w", name, id, err)
	}
	return at, nil
}

// bankInvariants checks HyBench's invariants across tables in the
// snapshots of one Retina timestamp: the balances of both account tables
// sum to total (cents), and every accepted loan application has its loan.
func (r *icebergReader) bankInvariants(ctx context.Context, ts uint64, total int64) ([]string, error) {
	var sum int64
	for _, t := range []string{hybench.SavingAccount, hybench.CheckingAccount} {
		at, err := r.scanAt(ctx, t, ts, "balance")
		if err != nil {
			return nil, err
		}
		err = eachCell(at, 0, func(a arrow.Array, i int) {
			if !a.IsNull(i) {
				sum += int64(a.(*array.Decimal128).Value(i).LowBits()) // cents: the column is decimal(15,2)
			}
		})
		at.Release()
		if err != nil {
			return nil, err
		}
	}
	var failures []string
	if sum != total {
		failures = append(failures, fmt.Sprintf("iceberg at %d: total balance %d cents, want %d", ts, sum, total))
	}
	apps, err := r.scanAt(ctx, hybench.LoanApps, ts, "status")
	if err != nil {
		return nil, err
	}
	accepted := 0
	err = eachCell(apps, 0, func(a arrow.Array, i int) {
		if !a.IsNull(i) && a.(*array.String).Value(i) == "accept" {
			accepted++
		}
	})
	apps.Release()
	if err != nil {
		return nil, err
	}
	loans, err := r.scanAt(ctx, hybench.LoanTrans, ts, "id")
	if err != nil {
		return nil, err
	}
	n := int(loans.NumRows())
	loans.Release()
	if accepted != n {
		failures = append(failures, fmt.Sprintf("iceberg at %d: %d accepted applications, %d loans", ts, accepted, n))
	}
	return failures, nil
}

func eachCell(at arrow.Table, col int, fn func(a arrow.Array, i int)) error {
	if int(at.NumCols()) <= col {
		return fmt.Errorf("the scan has %d columns", at.NumCols())
	}
	for _, c := range at.Column(col).Data().Chunks() {
		for i := range c.Len() {
			fn(c, i)
		}
	}
	return nil
}

// digest identifies a multiset of rows regardless of their order: the
// count and the sum of each row's hash.
type digest struct {
	Rows int64
	Sum  uint64
}

func (d *digest) add(cells []string) {
	h := fnv.New64a()
	for _, c := range cells {
		h.Write([]byte(c))
		h.Write([]byte{0x1f})
	}
	d.Rows++
	d.Sum += h.Sum64()
}

// arrowDigest digests every row of a scan, each cell rendered as
// sqlDigest renders it.
func arrowDigest(at arrow.Table) (digest, error) {
	var d digest
	tr := array.NewTableReader(at, 1<<14)
	defer tr.Release()
	for tr.Next() {
		rec := tr.RecordBatch()
		cells := make([]string, rec.NumCols())
		for i := range int(rec.NumRows()) {
			for c := range cells {
				s, err := renderCell(rec.Column(c), i)
				if err != nil {
					return d, err
				}
				cells[c] = s
			}
			d.add(cells)
		}
	}
	return d, tr.Err()
}

func renderCell(a arrow.Array, i int) (string, error) {
	if a.IsNull(i) {
		return "NULL", nil
	}
	switch a := a.(type) {
	case *array.Int32:
		return strconv.FormatInt(int64(a.Value(i)), 10), nil
	case *array.Int64:
		return strconv.FormatInt(a.Value(i), 10), nil
	case *array.Decimal128:
		return a.Value(i).ToString(a.DataType().(*arrow.Decimal128Type).Scale), nil
	case *array.String:
		return a.Value(i), nil
	case *array.Boolean:
		return strconv.FormatBool(a.Value(i)), nil
	case *array.Date32:
		return a.Value(i).ToTime().Format("2006-01-02"), nil
	case *array.Timestamp:
		return strconv.FormatInt(int64(a.Value(i)), 10), nil
	}
	return "", fmt.Errorf("no rendering for Arrow type %s", a.DataType())
}

// sqlDigest digests a HyBench table over Retina's SQL at the current
// snapshot.
func sqlDigest(ctx context.Context, db *pgxpool.Pool, t hybench.Table) (digest, error) {
	var exprs []string
	for _, c := range t.Columns {
		q := `"` + c.Name + `"`
		if c.Type == "timestamp" {
			q = "epoch_us(" + q + ")"
		}
		exprs = append(exprs, "CAST("+q+" AS VARCHAR)")
	}
	var d digest
	rows, err := db.Query(ctx, "SELECT "+strings.Join(exprs, ", ")+" FROM "+t.Name)
	if err != nil {
		return d, fmt.Errorf("read %s: %w", t.Name, err)
	}
	defer rows.Close()
	cells := make([]string, len(exprs))
	ptrs := make([]any, len(exprs))
	vals := make([]*string, len(exprs))
	for i := range ptrs {
		ptrs[i] = &vals[i]
	}
	for rows.Next() {
		if err := rows.Scan(ptrs...); err != nil {
			return d, fmt.Errorf("read %s: %w", t.Name, err)
		}
		for i, v := range vals {
			if v == nil {
				cells[i] = "NULL"
			} else {
				cells[i] = *v
			}
		}
		d.add(cells)
	}
	return d, rows.Err()
}

// tablesEqual compares every HyBench table's published snapshot at ts with
// Retina's SQL, which must be at ts too (nothing committed since).
func (r *icebergReader) tablesEqual(ctx context.Context, db *pgxpool.Pool, ts uint64) ([]string, error) {
	var diffs []string
	for _, t := range hybench.Tables() {
		at, err := r.scanAt(ctx, t.Name, ts)
		if err != nil {
			return nil, err
		}
		got, err := arrowDigest(at)
		at.Release()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", t.Name, err)
		}
		want, err := sqlDigest(ctx, db, t)
		if err != nil {
			return nil, err
		}
		if got != want {
			diffs = append(diffs, fmt.Sprintf("%s: iceberg %d rows (digest %x), Retina %d rows (digest %x)", t.Name, got.Rows, got.Sum, want.Rows, want.Sum))
		}
	}
	return diffs, nil
}
