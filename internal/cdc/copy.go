package cdc

import (
	"log/slog"
	"sync/atomic"
	"time"
)

// CopyProgress counts a database source's initial copy: the figures are
// read from any goroutine, Start, Row and TableDone are called by the
// copying one, which logs the progress every few seconds.
type CopyProgress struct {
	Tables, TablesDone, Rows, RowsEstimate atomic.Int64
	Done                                   atomic.Bool
	began, last                            time.Time
}

// Start begins a copy of tables holding about estimate rows.
func (p *CopyProgress) Start(tables, estimate int64) {
	p.Tables.Store(tables)
	p.TablesDone.Store(0)
	p.Rows.Store(0)
	p.RowsEstimate.Store(estimate)
	p.began = time.Now()
	p.last = p.began
}

// Row counts one row of table copied.
func (p *CopyProgress) Row(log *slog.Logger, table string) {
	rows := p.Rows.Add(1)
	if rows%1024 != 0 || time.Since(p.last) < 5*time.Second {
		return
	}
	p.last = time.Now()
	rate := float64(rows) / time.Since(p.began).Seconds()
	args := []any{"table", table, "tables_done", p.TablesDone.Load(), "tables", p.Tables.Load(), "rows", rows, "rows_per_sec", int64(rate)}
	if left := p.RowsEstimate.Load() - rows; left > 0 && rate > 0 {
		args = append(args, "eta", (time.Duration(float64(left)/rate) * time.Second).Round(time.Second))
	}
	log.Info("initial copy", args...)
}

// Finished marks the copy complete and returns its rows and seconds.
func (p *CopyProgress) Finished() (rows int64, secs float64) {
	p.Done.Store(true)
	return p.Rows.Load(), time.Since(p.began).Seconds()
}

// TruncateAll is the transaction that empties tables before a copy that
// replaces an earlier, unfinished one, every record at pos.
func TruncateAll(pos Position, id string, tables []string) []Record {
	out := make([]Record, 0, len(tables)+1)
	per := map[string]int64{}
	for i, t := range tables {
		per[t]++
		out = append(out, Record{Kind: Change, Pos: pos, Table: t, Op: OpTruncate, TxID: id, TotalOrder: int64(i)})
	}
	return append(out, Record{Kind: End, Pos: pos, TxID: id, EventCount: int64(len(tables)), PerTable: per})
}
