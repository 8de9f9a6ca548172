package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/apache/arrow-go/v18/arrow/decimal128"
	"github.com/jackc/pgx/v5"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/cdc"
	"github.com/retinadb/retina/internal/hybench"
	"github.com/retinadb/retina/internal/types"
)

// The crash benchmark's oracle is every table's final state computed from
// the stream file alone: each change decoded and applied to a map in file
// order (the source's commit order), with none of Retina's replay, index,
// visibility or checkpoints in between. Rows are compared as text, rendered
// the same way on both sides (see renderSQL).

// tableState is one table of the oracle: primary key → row text.
type tableState map[string]string

// oracleTables maps the workload's tables by name.
type oracleTables map[string]*catalog.Table

func (o oracleTables) Table(name string) (*catalog.Table, bool) {
	t, ok := o[strings.ToLower(name)]
	return t, ok
}

func workloadTables() (oracleTables, error) {
	out := oracleTables{}
	for i, t := range hybench.Tables() {
		sc, err := t.Schema()
		if err != nil {
			return nil, err
		}
		out[strings.ToLower(t.Name)] = &catalog.Table{ID: uint32(i + 1), Name: t.Name, Schema: sc}
	}
	return out, nil
}

// buildOracle applies the stream file to maps.
func buildOracle(path string) (map[string]tableState, error) {
	tables, err := workloadTables()
	if err != nil {
		return nil, err
	}
	state := map[string]tableState{}
	for _, t := range tables {
		state[t.Name] = tableState{}
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	dec := cdc.NewDecoder(tables, nil, cdc.DecoderOptions{})
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	line := int64(0)
	for sc.Scan() {
		line++
		rec, err := dec.Decode(cdc.Message{Pos: cdc.Position{Stream: path, Offset: line}, Value: sc.Bytes()})
		if err != nil {
			return nil, fmt.Errorf("oracle: line %d: %w", line, err)
		}
		if rec.Kind != cdc.Change {
			continue
		}
		t, _ := tables.Table(rec.Table)
		rows := state[t.Name]
		keyOf := func(row []any) string {
			return renderValue(t.Schema.Columns[t.Schema.KeyColumns()[0]].Type, row[t.Schema.KeyColumns()[0]])
		}
		switch rec.Op {
		case cdc.OpCreate, cdc.OpRead, cdc.OpUpdate:
			if rec.Op == cdc.OpUpdate && rec.Before != nil {
				delete(rows, keyOf(rec.Before))
			}
			rows[keyOf(rec.After)] = renderRow(t, rec.After)
		case cdc.OpDelete:
			if rec.Before != nil {
				delete(rows, keyOf(rec.Before))
			} else {
				delete(rows, renderValue(t.Schema.Columns[t.Schema.KeyColumns()[0]].Type, rec.Key[0]))
			}
		case cdc.OpTruncate:
			clear(rows)
		}
	}
	return state, sc.Err()
}

func renderRow(t *catalog.Table, row []any) string {
	parts := make([]string, len(row))
	for i, v := range row {
		parts[i] = renderValue(t.Schema.Columns[i].Type, v)
	}
	return strings.Join(parts, "|")
}

// renderValue renders a decoded value as renderSQL renders its column.
func renderValue(t types.Type, v any) string {
	if v == nil {
		return "<null>"
	}
	switch t.Kind {
	case types.Decimal:
		return v.(decimal128.Num).ToString(int32(t.Scale))
	case types.Date:
		return time.Unix(int64(v.(types.DateDays))*86400, 0).UTC().Format(time.DateOnly)
	case types.Timestamp, types.TimestampTZ:
		return strconv.FormatInt(int64(v.(types.TimestampMicros)), 10)
	case types.Bool:
		return strconv.FormatBool(v.(bool))
	case types.String:
		return v.(string)
	}
	return fmt.Sprint(v)
}

// renderSQL is a select list rendering every column as text, the way
// renderValue does.
func renderSQL(t *catalog.Table) string {
	cols := make([]string, len(t.Schema.Columns))
	for i, c := range t.Schema.Columns {
		expr := c.Name + "::VARCHAR"
		if c.Type.Kind == types.Timestamp || c.Type.Kind == types.TimestampTZ {
			expr = "epoch_us(" + c.Name + ")::VARCHAR"
		}
		cols[i] = "coalesce(" + expr + ", '<null>')"
	}
	return strings.Join(cols, " || '|' || ")
}

// compareWithOracle reads every table over SQL and counts the rows the
// oracle has that Retina lacks or has otherwise (lost) and the rows Retina
// has beyond the oracle's (doubled: a key twice, or a key the oracle does
// not have).
func compareWithOracle(ctx context.Context, conn *pgx.Conn, want map[string]tableState) (lost, doubled int, detail []string, err error) {
	tables, err := workloadTables()
	if err != nil {
		return 0, 0, nil, err
	}
	for _, t := range tables {
		key := t.Schema.Columns[t.Schema.KeyColumns()[0]]
		rows, err := conn.Query(ctx, fmt.Sprintf("SELECT %s::VARCHAR, %s FROM %s", key.Name, renderSQL(t), t.Name))
		if err != nil {
			return 0, 0, nil, fmt.Errorf("read %s: %w", t.Name, err)
		}
		got := map[string]string{}
		tableLost, tableDoubled := 0, 0
		for rows.Next() {
			var k, row string
			if err := rows.Scan(&k, &row); err != nil {
				rows.Close()
				return 0, 0, nil, err
			}
			if _, dup := got[k]; dup {
				tableDoubled++
				continue
			}
			got[k] = row
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return 0, 0, nil, fmt.Errorf("read %s: %w", t.Name, err)
		}
		w := want[t.Name]
		for k, row := range w {
			if got[k] != row {
				tableLost++
				if len(detail) < 5 {
					detail = append(detail, fmt.Sprintf("%s key %s: want %q, got %q", t.Name, k, row, got[k]))
				}
			}
		}
		for k := range got {
			if _, ok := w[k]; !ok {
				tableDoubled++
				if len(detail) < 5 {
					detail = append(detail, fmt.Sprintf("%s key %s: not in the source", t.Name, k))
				}
			}
		}
		lost += tableLost
		doubled += tableDoubled
	}
	return lost, doubled, detail, nil
}
