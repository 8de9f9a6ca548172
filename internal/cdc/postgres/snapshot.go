package postgres

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/retinadb/retina/internal/cdc"
)

// snapshot creates the slot, copies every published table from the
// snapshot the slot exported, and leaves streaming to start at the slot's
// consistent point: what the copy saw is exactly what committed before it.
// A copy that started before and did not finish is not resumed (its
// exported snapshot is gone): the slot is created again and the copy
// starts over, truncating the tables first.
func (s *Source) snapshot(ctx context.Context, conn *pgx.Conn, rc *pgconn.PgConn) error {
	res, err := pglogrepl.CreateReplicationSlot(ctx, rc, s.opts.Slot, "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{SnapshotAction: "EXPORT_SNAPSHOT", Mode: pglogrepl.LogicalReplication})
	if err != nil {
		return fmt.Errorf("postgres source %s: create slot %s: %w (the user needs the REPLICATION attribute)", s.opts.Display, s.opts.Slot, err)
	}
	consistent, err := pglogrepl.ParseLSN(res.ConsistentPoint)
	if err != nil {
		return fmt.Errorf("postgres source %s: slot %s consistent point %q: %w", s.opts.Display, s.opts.Slot, res.ConsistentPoint, err)
	}
	s.log.Info("created replication slot", "slot", s.opts.Slot, "consistent_point", consistent.String(), "snapshot", res.SnapshotName)
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("postgres source %s: begin the copy: %w", s.opts.Display, err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, "SET TRANSACTION SNAPSHOT '"+res.SnapshotName+"'"); err != nil {
		return fmt.Errorf("postgres source %s: use the slot's snapshot %s: %w", s.opts.Display, res.SnapshotName, err)
	}
	tables, err := publishedTables(ctx, tx, s.opts.Publication)
	if err != nil {
		return fmt.Errorf("postgres source %s: %w", s.opts.Display, err)
	}
	var estimate int64
	for _, t := range tables {
		if err := t.bind(ctx, s.cfg.Catalog, true); err != nil {
			return fatal(fmt.Errorf("postgres source %s: %w", s.opts.Display, err))
		}
		var n float64
		if err := tx.QueryRow(ctx, "SELECT reltuples FROM pg_class WHERE oid = $1", t.OID).Scan(&n); err == nil && n > 0 {
			estimate += int64(n)
		}
	}
	s.stats.copy.Start(int64(len(tables)), estimate)
	stream := snapshotStream(s.opts.Slot, consistent)
	s.copyStream.Store(stream)
	if s.delivered || s.start.delivered {
		if err := s.truncateAll(ctx, stream, "postgres-recopy@"+consistent.String(), tables); err != nil {
			return err
		}
	}
	off := int64(1)
	tm := newTypeMap()
	for _, t := range tables {
		if err := s.copyTable(ctx, tx, tm, t, stream, &off); err != nil {
			return err
		}
		s.stats.copy.TablesDone.Add(1)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("postgres source %s: end the copy: %w", s.opts.Display, err)
	}
	// The stream's marker first: a checkpoint that has the copy complete
	// has the stream's start too (readResume).
	if consistent > 0 {
		if err := s.emit(ctx, record(cdc.Position{Stream: s.main, Offset: int64(consistent) - 1}, cdc.Record{Kind: cdc.Skip, SkipReason: "start of the change stream"})); err != nil {
			return err
		}
	}
	if err := s.emit(ctx, record(cdc.Position{Stream: stream, Offset: snapshotDone}, cdc.Record{Kind: cdc.Skip, SkipReason: "initial copy complete"})); err != nil {
		return err
	}
	s.copied, s.next = true, consistent
	rows, secs := s.stats.copy.Finished()
	s.log.Info("initial copy done", "tables", len(tables), "rows", rows, "seconds", fmt.Sprintf("%.1f", secs),
		"rows_per_sec", int64(float64(rows)/max(secs, 1e-3)), "stream_from", consistent.String())
	return nil
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

// copyTable streams one table with COPY … TO STDOUT (text format) and
// delivers each row as a snapshot read.
func (s *Source) copyTable(ctx context.Context, tx pgx.Tx, tm typeMap, t *table, stream string, off *int64) error {
	cols := make([]string, len(t.Cols))
	for i, c := range t.Cols {
		cols[i] = pgx.Identifier{c.Name}.Sanitize()
	}
	sql := "COPY " + pgx.Identifier{t.Namespace, t.Name}.Sanitize() + " (" + strings.Join(cols, ", ") + ") TO STDOUT"
	pr, pw := io.Pipe()
	copied := make(chan error, 1)
	go func() {
		_, err := tx.Conn().PgConn().CopyTo(ctx, pw, sql)
		pw.CloseWithError(err)
		copied <- err
	}()
	waited := false
	defer func() {
		if !waited { // stop the copy; its connection is not used again
			pr.CloseWithError(errors.New("copy abandoned"))
			<-copied
		}
	}()
	br := bufio.NewReaderSize(pr, 1<<20)
	var long []byte
	fields := make([][]byte, 0, len(t.Cols))
	nulls := make([]bool, 0, len(t.Cols))
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			long = append(long, line...)
			continue
		}
		if err == io.EOF && len(line) == 0 && len(long) == 0 {
			break
		}
		if err != nil && err != io.EOF {
			return fmt.Errorf("postgres source %s: copy %s: %w", s.opts.Display, t, err)
		}
		if long != nil {
			line, long = append(long, line...), nil
		}
		line = line[:len(line)-1] // the newline
		fields, nulls = splitCopyLine(line, fields[:0], nulls[:0])
		if len(fields) != len(t.Cols) {
			return fatal(fmt.Errorf("postgres source %s: copy %s: a row has %d fields for %d columns", s.opts.Display, t, len(fields), len(t.Cols)))
		}
		row := make([]any, len(t.retina.Schema.Columns))
		for i, f := range fields {
			if nulls[i] {
				continue
			}
			v, err := tm.value(&t.Cols[i], f)
			if err != nil {
				return fatal(fmt.Errorf("postgres source %s: copy of %s (Retina table %s): %w", s.opts.Display, t, t.retina.Name, err))
			}
			row[t.pos[i]] = v
		}
		if t.keyless() {
			row[t.keyPos[0]], row[t.keyPos[1]] = int64(0), *off
		}
		if err := s.emit(ctx, record(cdc.Position{Stream: stream, Offset: *off}, cdc.Record{Kind: cdc.Change, Table: t.retina.Name, Op: cdc.OpRead, After: row})); err != nil {
			return err
		}
		*off++
		s.stats.copy.Row(s.log, t.String())
	}
	waited = true
	if err := <-copied; err != nil {
		return fmt.Errorf("postgres source %s: copy %s: %w", s.opts.Display, t, err)
	}
	return nil
}

// splitCopyLine splits one line of COPY's text format into its fields,
// unescaping each in place; nulls[i] marks \N.
func splitCopyLine(line []byte, fields [][]byte, nulls []bool) ([][]byte, []bool) {
	start := 0
	for i := 0; i <= len(line); i++ {
		if i < len(line) && line[i] != '\t' {
			continue
		}
		f := line[start:i]
		start = i + 1
		if len(f) == 2 && f[0] == '\\' && f[1] == 'N' {
			fields, nulls = append(fields, nil), append(nulls, true)
			continue
		}
		fields, nulls = append(fields, unescapeCopy(f)), append(nulls, false)
	}
	return fields, nulls
}

// unescapeCopy undoes COPY's text escapes (backslash sequences), in place.
func unescapeCopy(f []byte) []byte {
	w := 0
	for r := 0; r < len(f); r++ {
		c := f[r]
		if c != '\\' || r+1 == len(f) {
			f[w] = c
			w++
			continue
		}
		r++
		switch c = f[r]; c {
		case 'b':
			c = '\b'
		case 'f':
			c = '\f'
		case 'n':
			c = '\n'
		case 'r':
			c = '\r'
		case 't':
			c = '\t'
		case 'v':
			c = '\v'
		case 'x':
			v, n := 0, 0
			for n < 2 && r+1 < len(f) && isHex(f[r+1]) {
				r++
				v = v*16 + hexVal(f[r])
				n++
			}
			if n > 0 {
				c = byte(v)
			}
		default:
			if c >= '0' && c <= '7' {
				v := int(c - '0')
				for n := 1; n < 3 && r+1 < len(f) && f[r+1] >= '0' && f[r+1] <= '7'; n++ {
					r++
					v = v*8 + int(f[r]-'0')
				}
				c = byte(v)
			}
		}
		f[w] = c
		w++
	}
	return f[:w]
}

func isHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }

func hexVal(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	}
	return int(c-'A') + 10
}
