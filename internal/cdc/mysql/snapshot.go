package mysql

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/go-mysql-org/go-mysql/client"
	gomysql "github.com/go-mysql-org/go-mysql/mysql"

	"github.com/retinadb/retina/internal/cdc"
)

// snapshot copies every selected table in one consistent snapshot and
// leaves streaming to start at the snapshot's binlog position: what the
// copy saw is exactly what committed before it.
//
// Locks: on MariaDB none beyond what any reading transaction holds.
// START TRANSACTION WITH CONSISTENT SNAPSHOT gives the binlog position of
// the snapshot itself (binlog_snapshot_file and _position), so writes go
// on during the copy; DDL on a copied table waits for the copy's
// transaction (its metadata lock) once the copy has read the table. On
// MySQL, which has no such status, FLUSH TABLES WITH READ LOCK is held
// from before the transaction starts until the binlog position is read,
// a few milliseconds, and needs the RELOAD privilege.
//
// A copy that did not finish is not resumed (its snapshot is gone): a new
// one starts, truncating the tables first.
func (s *Source) snapshot(ctx context.Context) error {
	c, err := s.connect(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	defer closeOnDone(ctx, c)()
	q := query(c)
	for _, set := range []string{"SET SESSION time_zone = '+00:00'", "SET SESSION character_set_results = NULL",
		"SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ"} {
		if _, err := c.Execute(set); err != nil {
			return fmt.Errorf("mysql source %s: %s: %w", s.opts.Display, set, err)
		}
	}
	start, err := s.beginSnapshot(ctx, c)
	if err != nil {
		return err
	}
	s.log.Info("initial copy: snapshot taken", "start", start.String())
	rows, err := q(ctx, `SELECT TABLE_NAME, COALESCE(TABLE_ROWS, 0) FROM information_schema.TABLES
		WHERE TABLE_SCHEMA = ? AND TABLE_TYPE = 'BASE TABLE' ORDER BY TABLE_NAME`, s.opts.Database)
	if err != nil {
		return fmt.Errorf("mysql source %s: list the tables of %s: %w", s.opts.Display, s.opts.Database, err)
	}
	var tables []*table
	var estimate int64
	names := map[string]string{}
	for _, r := range rows {
		if r[0] == nil || !s.selected(*r[0]) {
			continue
		}
		t, err := describe(ctx, q, s.opts.Database, *r[0])
		if err != nil {
			return fatal(fmt.Errorf("mysql source %s: %w", s.opts.Display, err))
		}
		if other, dup := names[t.retinaName()]; dup {
			return fatal(fmt.Errorf("mysql source %s: tables %s and %s have the same name in lower case, which Retina's would share: leave one out (tables=…)", s.opts.Display, other, t.Name))
		}
		names[t.retinaName()] = t.Name
		if err := t.bind(ctx, s.cfg.Catalog, true); err != nil {
			return fatal(fmt.Errorf("mysql source %s: %w", s.opts.Display, err))
		}
		n, _ := strconv.ParseInt(deref(r[1]), 10, 64)
		estimate += n
		tables = append(tables, t)
	}
	s.stats.copy.Start(int64(len(tables)), estimate)
	stream := prefix(s.opts) + "/copy@" + start.String()
	s.setCopyStream(stream)
	if s.delivered || s.start.delivered {
		if err := s.truncateAll(ctx, stream, "mysql-recopy@"+stream, tables); err != nil {
			return err
		}
	}
	off := int64(1)
	for _, t := range tables {
		if err := s.copyTable(ctx, c, t, stream, &off); err != nil {
			return err
		}
		s.stats.copy.TablesDone.Add(1)
	}
	if _, err := c.Execute("COMMIT"); err != nil {
		return fmt.Errorf("mysql source %s: end the copy: %w", s.opts.Display, err)
	}
	if err := s.emit(ctx, record(cdc.Position{Stream: stream, Offset: copyDone}, cdc.Record{Kind: cdc.Skip, SkipReason: "initial copy complete"})); err != nil {
		return err
	}
	s.copied, s.next = true, start
	n, secs := s.stats.copy.Finished()
	s.log.Info("initial copy done", "tables", len(tables), "rows", n, "seconds", fmt.Sprintf("%.1f", secs),
		"rows_per_sec", int64(float64(n)/max(secs, 1e-3)), "stream_from", start.String())
	return nil
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// beginSnapshot starts the copy's transaction and returns the binlog
// position it is consistent with.
func (s *Source) beginSnapshot(ctx context.Context, c *client.Conn) (position, error) {
	q := query(c)
	one := func(sql string, args ...any) ([]*string, error) {
		r, err := q(ctx, sql, args...)
		if err != nil {
			return nil, fmt.Errorf("mysql source %s: %s: %w", s.opts.Display, sql, err)
		}
		if len(r) == 0 {
			return nil, fmt.Errorf("mysql source %s: %s returned nothing (is the binary log on?)", s.opts.Display, sql)
		}
		return r[0], nil
	}
	var file string
	var offset uint64
	var gtidText string
	if s.flavor == gomysql.MariaDBFlavor {
		if _, err := c.Execute("START TRANSACTION WITH CONSISTENT SNAPSHOT"); err != nil {
			return position{}, fmt.Errorf("mysql source %s: start the copy's transaction: %w", s.opts.Display, err)
		}
		st, err := q(ctx, "SHOW STATUS LIKE 'binlog_snapshot_%'")
		if err != nil {
			return position{}, fmt.Errorf("mysql source %s: read the snapshot's binlog position: %w", s.opts.Display, err)
		}
		for _, r := range st {
			switch deref(r[0]) {
			case "Binlog_snapshot_file":
				file = deref(r[1])
			case "Binlog_snapshot_position":
				offset, _ = strconv.ParseUint(deref(r[1]), 10, 32)
			}
		}
		if file == "" {
			return position{}, fmt.Errorf("mysql source %s: the server gives no binlog position of the snapshot (is the binary log on?)", s.opts.Display)
		}
		if s.gtid {
			r, err := one("SELECT BINLOG_GTID_POS(?, ?)", file, offset)
			if err != nil {
				return position{}, err
			}
			gtidText = deref(r[0])
		}
	} else {
		if _, err := c.Execute("FLUSH TABLES WITH READ LOCK"); err != nil {
			return position{}, fmt.Errorf("mysql source %s: FLUSH TABLES WITH READ LOCK (a few milliseconds, to read a binlog position consistent with the copy; needs the RELOAD privilege): %w", s.opts.Display, err)
		}
		locked := true
		defer func() {
			if locked {
				c.Execute("UNLOCK TABLES")
			}
		}()
		if _, err := c.Execute("START TRANSACTION WITH CONSISTENT SNAPSHOT"); err != nil {
			return position{}, fmt.Errorf("mysql source %s: start the copy's transaction: %w", s.opts.Display, err)
		}
		r, err := q(ctx, "SHOW MASTER STATUS")
		if err != nil {
			r, err = q(ctx, "SHOW BINARY LOG STATUS") // MySQL 8.4
		}
		if err != nil || len(r) == 0 {
			return position{}, fmt.Errorf("mysql source %s: read the binlog position (is the binary log on?): %v", s.opts.Display, err)
		}
		file = deref(r[0][0])
		offset, _ = strconv.ParseUint(deref(r[0][1]), 10, 32)
		if s.gtid {
			g, err := one("SELECT @@GLOBAL.gtid_executed")
			if err != nil {
				return position{}, err
			}
			gtidText = strings.ReplaceAll(deref(g[0]), "\n", "")
		}
		if _, err := c.Execute("UNLOCK TABLES"); err != nil {
			return position{}, fmt.Errorf("mysql source %s: UNLOCK TABLES: %w", s.opts.Display, err)
		}
		locked = false
	}
	if s.gtid {
		g, err := gomysql.ParseGTIDSet(s.flavor, gtidText)
		if err != nil {
			return position{}, fmt.Errorf("mysql source %s: the snapshot's GTID set %q: %w", s.opts.Display, gtidText, err)
		}
		return position{gtid: g, flavor: s.flavor}, nil
	}
	if _, _, ok := fileOffset(file, uint32(offset)); !ok {
		return position{}, fatal(fmt.Errorf("mysql source %s: binlog file %q has no numbered extension", s.opts.Display, file))
	}
	return position{file: file, offset: uint32(offset)}, nil
}

// truncateAll empties the tables before a copy that replaces an earlier,
// unfinished one: one transaction, at offset 0 of the copy's stream.
func (s *Source) truncateAll(ctx context.Context, stream, id string, tables []*table) error {
	names := make([]string, len(tables))
	for i, t := range tables {
		names[i] = t.retina.Name
	}
	for _, r := range cdc.TruncateAll(cdc.Position{Stream: stream}, id, names) {
		if err := s.emit(ctx, record(r.Pos, r)); err != nil {
			return err
		}
	}
	return nil
}

func quoteIdent(name string) string { return "`" + strings.ReplaceAll(name, "`", "``") + "`" }

// copyTable streams one table's rows and delivers each as a snapshot read.
// The rows come in the binary protocol (a prepared statement): numbers as
// they are stored, FLOAT's single-precision value exactly, and neither
// side printing and parsing them as text. Dates and times are asked for
// as text, which the server prints more cheaply than the client library
// formats their binary form.
func (s *Source) copyTable(ctx context.Context, c *client.Conn, t *table, stream string, off *int64) error {
	cols := make([]string, len(t.Cols))
	for i, col := range t.Cols {
		cols[i] = quoteIdent(col.Name)
		switch col.Kind {
		case kDate, kDatetime, kTimestamp, kTime:
			cols[i] = "CAST(" + cols[i] + " AS CHAR)"
		}
	}
	sql := "SELECT " + strings.Join(cols, ", ") + " FROM " + quoteIdent(t.Database) + "." + quoteIdent(t.Name)
	stmt, err := c.Prepare(sql)
	if err != nil {
		return fmt.Errorf("mysql source %s: copy %s: prepare %s: %w", s.opts.Display, t, sql, err)
	}
	defer stmt.Close()
	name := t.String()
	var alloc rowAlloc
	var result gomysql.Result
	var emitErr error
	err = stmt.ExecuteSelectStreaming(&result, func(row []gomysql.FieldValue) error {
		out := alloc.values(len(t.retina.Schema.Columns))
		for i := range row {
			if b, ok := t.Cols[i].text(&row[i]); ok {
				alloc.text(t.pos[i], b)
				continue
			}
			x, err := t.Cols[i].field(&row[i])
			if err != nil {
				emitErr = fatal(fmt.Errorf("mysql source %s: copy of %s (Retina table %s): %w", s.opts.Display, t, t.retina.Name, err))
				return emitErr
			}
			out[t.pos[i]] = x
		}
		alloc.setText(out)
		if t.keyless() {
			out[t.keyPos[0]], out[t.keyPos[1]] = int64(0), *off
		}
		pos := cdc.Position{Stream: stream, Offset: *off}
		r := alloc.record()
		*r = cdc.Record{Kind: cdc.Change, Pos: pos, Table: t.retina.Name, Op: cdc.OpRead, After: out}
		if err := s.emit(ctx, cdc.Message{Pos: pos, Record: r}); err != nil {
			emitErr = err
			return err
		}
		*off++
		s.stats.copy.Row(s.log, name)
		return nil
	}, nil)
	if emitErr != nil {
		return emitErr
	}
	if err != nil {
		return fmt.Errorf("mysql source %s: copy %s: %w", s.opts.Display, t, err)
	}
	return nil
}

// rowAlloc hands out the copy's records and row slices from chunks, and
// gives a row's text values one allocation: the copy's rows are many and
// small, and per-value allocations were a large part of its cost.
type rowAlloc struct {
	records []cdc.Record
	vals    []any
	buf     []byte
	spans   []textSpan
}

// textSpan is where a text value of the current row lies in buf.
type textSpan struct{ col, end int }

const allocChunk = 256

func (a *rowAlloc) record() *cdc.Record {
	if len(a.records) == 0 {
		a.records = make([]cdc.Record, allocChunk)
	}
	r := &a.records[0]
	a.records = a.records[1:]
	return r
}

// values returns a zeroed row of n values.
func (a *rowAlloc) values(n int) []any {
	if len(a.vals) < n {
		a.vals = make([]any, n*allocChunk)
	}
	out := a.vals[:n:n]
	a.vals = a.vals[n:]
	return out
}

// text queues b as the value of column col of the current row.
func (a *rowAlloc) text(col int, b []byte) {
	a.buf = append(a.buf, b...)
	a.spans = append(a.spans, textSpan{col: col, end: len(a.buf)})
}

// setText stores the current row's queued text values into out.
func (a *rowAlloc) setText(out []any) {
	if len(a.spans) == 0 {
		return
	}
	all := string(a.buf)
	start := 0
	for _, sp := range a.spans {
		out[sp.col] = all[start:sp.end]
		start = sp.end
	}
	a.buf, a.spans = a.buf[:0], a.spans[:0]
}
