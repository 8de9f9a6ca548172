package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/cdc"
)

// statusEvery is how often the slot hears how far Retina is: the flush LSN
// a durable checkpoint covers.
const statusEvery = time.Second

// openTxn is the source transaction being received.
type openTxn struct {
	id       string
	pos      cdc.Position
	commitMS int64
	n        int64
	perTable map[string]int64
}

// streamer decodes one replication session's messages.
type streamer struct {
	s    *Source
	conn *pgx.Conn // catalog lookups for Relation messages
	tm   typeMap
	rels map[uint32]*table
	tx   *openTxn
	// lastMark is when the last idle position was marked handled.
	lastMark time.Time
}

// stream starts replication where the last delivered commit left off and
// delivers every commit as one transaction, in commit order.
func (s *Source) stream(ctx context.Context, conn *pgx.Conn, rc *pgconn.PgConn) error {
	args := []string{"proto_version '1'", "publication_names '" + s.opts.Publication + "'"}
	if err := pglogrepl.StartReplication(ctx, rc, s.opts.Slot, s.next, pglogrepl.StartReplicationOptions{PluginArgs: args}); err != nil {
		return fmt.Errorf("postgres source %s: start replication on slot %s at %s: %w", s.opts.Display, s.opts.Slot, s.next, err)
	}
	s.log.Info("streaming changes", "slot", s.opts.Slot, "from", s.next.String())
	st := &streamer{s: s, conn: conn, tm: newTypeMap(), rels: map[uint32]*table{}}
	nextStatus, nextSlotCheck := time.Now(), time.Now()
	for {
		if !time.Now().Before(nextStatus) {
			if err := s.sendStatus(ctx, rc); err != nil {
				return err
			}
			nextStatus = time.Now().Add(statusEvery)
		}
		if !time.Now().Before(nextSlotCheck) {
			s.checkSlot(ctx, conn)
			nextSlotCheck = time.Now().Add(slotCheckEvery)
		}
		rctx, cancel := context.WithDeadline(ctx, nextStatus)
		raw, err := rc.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			if pgconn.Timeout(err) && ctx.Err() == nil {
				continue
			}
			return fmt.Errorf("postgres source %s: receive: %w", s.opts.Display, err)
		}
		switch msg := raw.(type) {
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("postgres source %s: replication: %w", s.opts.Display, pgconn.ErrorResponseToPgError(msg))
		case *pgproto3.CopyDone:
			return fmt.Errorf("postgres source %s: the server ended replication", s.opts.Display)
		case *pgproto3.CopyData:
			if len(msg.Data) == 0 {
				continue
			}
			switch msg.Data[0] {
			case pglogrepl.PrimaryKeepaliveMessageByteID:
				ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(msg.Data[1:])
				if err != nil {
					return fmt.Errorf("postgres source %s: keepalive: %w", s.opts.Display, err)
				}
				s.seenWAL(ka.ServerWALEnd)
				if err := st.idle(ctx, ka.ServerWALEnd); err != nil {
					return err
				}
				if ka.ReplyRequested {
					nextStatus = time.Time{}
				}
			case pglogrepl.XLogDataByteID:
				xld, err := pglogrepl.ParseXLogData(msg.Data[1:])
				if err != nil {
					return fmt.Errorf("postgres source %s: XLogData: %w", s.opts.Display, err)
				}
				s.seenWAL(xld.ServerWALEnd)
				m, err := pglogrepl.Parse(xld.WALData)
				if err != nil {
					return fatal(fmt.Errorf("postgres source %s: at %s: pgoutput message: %w", s.opts.Display, xld.WALStart, err))
				}
				if err := st.handle(ctx, m); err != nil {
					return err
				}
			}
		}
	}
}

// slotCheckEvery is how often the WAL the slot retains is polled.
const slotCheckEvery = 10 * time.Second

// checkSlot polls how much WAL the slot keeps; a failure only leaves the
// figure stale (the stream's own errors end the session).
func (s *Source) checkSlot(ctx context.Context, conn *pgx.Conn) {
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var retained int64
	err := conn.QueryRow(qctx, `SELECT coalesce(pg_current_wal_lsn() - restart_lsn, 0)::bigint FROM pg_replication_slots WHERE slot_name = $1`, s.opts.Slot).Scan(&retained)
	if err != nil {
		s.log.Warn("could not read the slot's retained WAL", "slot", s.opts.Slot, "err", err)
		return
	}
	s.stats.slotRetained.Store(retained)
	s.stats.slotChecked.Store(time.Now().UnixMicro())
}

func (s *Source) seenWAL(lsn pglogrepl.LSN) {
	for {
		cur := s.stats.walEnd.Load()
		if uint64(lsn) <= cur || s.stats.walEnd.CompareAndSwap(cur, uint64(lsn)) {
			return
		}
	}
}

// sendStatus tells the server how far Retina has durably applied: the
// slot keeps the WAL after that and releases the rest.
func (s *Source) sendStatus(ctx context.Context, rc *pgconn.PgConn) error {
	flush := pglogrepl.LSN(s.confirmed.Load())
	write := max(pglogrepl.LSN(s.stats.received.Load()), flush)
	err := pglogrepl.SendStandbyStatusUpdate(ctx, rc, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: write, WALFlushPosition: flush, WALApplyPosition: flush, ClientTime: time.Now()})
	if err != nil {
		return fmt.Errorf("postgres source %s: standby status: %w", s.opts.Display, err)
	}
	return nil
}

// idle marks the server's sent position handled when no transaction is
// open: every commit not yet sent lies at or beyond it, so WAL before it
// holds nothing for Retina, and the slot may release it once a checkpoint
// covers the mark.
func (st *streamer) idle(ctx context.Context, walEnd pglogrepl.LSN) error {
	s := st.s
	if st.tx != nil || walEnd <= s.next || time.Since(st.lastMark) < statusEvery {
		return nil
	}
	st.lastMark = time.Now()
	s.next = walEnd
	return s.emit(ctx, record(cdc.Position{Stream: s.main, Offset: int64(walEnd) - 1}, cdc.Record{Kind: cdc.Skip, SkipReason: "no published changes"}))
}

// handle decodes one pgoutput message.
func (st *streamer) handle(ctx context.Context, m pglogrepl.Message) error {
	s := st.s
	switch m := m.(type) {
	case *pglogrepl.RelationMessage:
		t, err := st.relation(ctx, m)
		if err != nil {
			return err
		}
		st.rels[m.RelationID] = t
	case *pglogrepl.BeginMessage:
		st.tx = &openTxn{id: fmt.Sprintf("%d@%s", m.Xid, m.FinalLSN), pos: cdc.Position{Stream: s.main, Offset: int64(m.FinalLSN)},
			commitMS: m.CommitTime.UnixMilli(), perTable: map[string]int64{}}
	case *pglogrepl.InsertMessage:
		t, err := st.table(m.RelationID)
		if err != nil {
			return err
		}
		row, err := st.fullRow(t, m.Tuple, "insert")
		if err != nil {
			return err
		}
		if t.keyless() {
			row[t.keyPos[0]], row[t.keyPos[1]] = int64(st.tx.pos.Offset), st.tx.n
		}
		return st.change(ctx, t, cdc.Record{Op: cdc.OpCreate, After: row})
	case *pglogrepl.UpdateMessage:
		t, err := st.table(m.RelationID)
		if err != nil {
			return err
		}
		if t.keyless() {
			return st.keylessUpdate(ctx, t, m)
		}
		var old []any
		if m.OldTuple != nil {
			if old, err = st.fullRow(t, m.OldTuple, "update (old row)"); err != nil {
				return err
			}
		}
		full := m.OldTupleType == pglogrepl.UpdateMessageTupleTypeOld
		var base []any
		if full {
			base = old
		}
		row, unchanged, err := st.row(t, m.NewTuple, base, "update")
		if err != nil {
			return err
		}
		if len(unchanged) > 0 && m.OldTupleType == pglogrepl.UpdateMessageTupleTypeKey {
			// The key moved: the row's current version may be in another
			// bucket than the new one, so the replayer cannot complete it.
			return fatal(fmt.Errorf("postgres source %s: update of %s at %s changes the key and leaves TOASTed column %s unchanged, which PostgreSQL does not send; run ALTER TABLE %s REPLICA IDENTITY FULL so the old row carries it",
				s.opts.Display, t, st.tx.pos, t.retina.Schema.Columns[unchanged[0]].Name, pgx.Identifier{t.Namespace, t.Name}.Sanitize()))
		}
		r := cdc.Record{Op: cdc.OpUpdate, After: row, Unchanged: unchanged}
		if old != nil {
			r.Key = pick(old, t.keyPos)
		}
		if full {
			r.Before = old
		}
		return st.change(ctx, t, r)
	case *pglogrepl.DeleteMessage:
		t, err := st.table(m.RelationID)
		if err != nil {
			return err
		}
		if t.keyless() {
			return st.keylessDelete(ctx, t, m)
		}
		if m.OldTuple == nil {
			return fatal(fmt.Errorf("postgres source %s: delete from %s at %s carries no old key (REPLICA IDENTITY NOTHING?)", s.opts.Display, t, st.tx.pos))
		}
		old, err := st.fullRow(t, m.OldTuple, "delete")
		if err != nil {
			return err
		}
		r := cdc.Record{Op: cdc.OpDelete, Key: pick(old, t.keyPos)}
		if m.OldTupleType == pglogrepl.DeleteMessageTupleTypeOld {
			r.Before = old
		}
		return st.change(ctx, t, r)
	case *pglogrepl.TruncateMessage:
		for _, id := range m.RelationIDs {
			t, err := st.table(id)
			if err != nil {
				return err
			}
			if err := st.change(ctx, t, cdc.Record{Op: cdc.OpTruncate}); err != nil {
				return err
			}
		}
	case *pglogrepl.CommitMessage:
		if st.tx == nil {
			return fatal(fmt.Errorf("postgres source %s: COMMIT at %s without BEGIN", s.opts.Display, m.CommitLSN))
		}
		tx := st.tx
		st.tx = nil
		var r cdc.Record
		if tx.n == 0 {
			r = cdc.Record{Kind: cdc.Skip, SkipReason: "transaction without published changes"}
		} else {
			r = cdc.Record{Kind: cdc.End, TxID: tx.id, EventCount: tx.n, PerTable: tx.perTable, SourceTSms: tx.commitMS}
		}
		// The end sits one before the commit record's end: the stream then
		// resumes at that end, which is where the next commit can start.
		end := cdc.Position{Stream: s.main, Offset: int64(m.TransactionEndLSN) - 1}
		if err := s.emit(ctx, record(end, r)); err != nil {
			return err
		}
		s.next = m.TransactionEndLSN
		s.stats.received.Store(uint64(m.TransactionEndLSN))
		s.stats.lastCommit.Store(m.CommitTime.UnixMicro())
	}
	// Type messages need nothing: a type Retina has no column type for is
	// held as text, whatever its OID. Origin and logical decoding messages
	// carry no rows.
	return nil
}

// change delivers one row change of the open transaction.
func (st *streamer) change(ctx context.Context, t *table, r cdc.Record) error {
	if st.tx == nil {
		return fatal(fmt.Errorf("postgres source %s: a change of %s outside a transaction", st.s.opts.Display, t))
	}
	r.Kind, r.Table, r.TxID, r.TotalOrder, r.SourceTSms = cdc.Change, t.retina.Name, st.tx.id, st.tx.n, st.tx.commitMS
	st.tx.n++
	st.tx.perTable[t.retina.Name]++
	return st.s.emit(ctx, record(st.tx.pos, r))
}

func (st *streamer) table(id uint32) (*table, error) {
	t, ok := st.rels[id]
	if !ok {
		return nil, fatal(fmt.Errorf("postgres source %s: a change of relation %d before its Relation message", st.s.opts.Display, id))
	}
	if st.tx == nil {
		return nil, fatal(fmt.Errorf("postgres source %s: a change of %s outside a transaction", st.s.opts.Display, t))
	}
	return t, nil
}

// keylessUpdate delivers an update of a table without a key: PostgreSQL
// sends one only under REPLICA IDENTITY FULL, with the whole old row, by
// which the replayer finds the row.
func (st *streamer) keylessUpdate(ctx context.Context, t *table, m *pglogrepl.UpdateMessage) error {
	if err := st.keylessFindable(t, "update", m.OldTupleType == pglogrepl.UpdateMessageTupleTypeOld); err != nil {
		return err
	}
	old, err := st.fullRow(t, m.OldTuple, "update (old row)")
	if err != nil {
		return err
	}
	row, _, err := st.row(t, m.NewTuple, old, "update")
	if err != nil {
		return err
	}
	return st.change(ctx, t, cdc.Record{Op: cdc.OpUpdate, Before: old, After: row, Unmatched: t.absent})
}

// keylessDelete delivers a delete of a table without a key, as
// keylessUpdate does.
func (st *streamer) keylessDelete(ctx context.Context, t *table, m *pglogrepl.DeleteMessage) error {
	if err := st.keylessFindable(t, "delete", m.OldTupleType == pglogrepl.DeleteMessageTupleTypeOld); err != nil {
		return err
	}
	old, err := st.fullRow(t, m.OldTuple, "delete")
	if err != nil {
		return err
	}
	return st.change(ctx, t, cdc.Record{Op: cdc.OpDelete, Before: old, Unmatched: t.absent})
}

// keylessFindable checks that an update or delete of a table without a key
// can name its row: the message carries the whole old row, and Retina's
// table finds rows by content.
func (st *streamer) keylessFindable(t *table, what string, oldRow bool) error {
	switch {
	case !oldRow:
		return fatal(fmt.Errorf("postgres source %s: %s of %s at %s carries no old row: a table without a primary key needs ALTER TABLE %s REPLICA IDENTITY FULL for Retina to find the row",
			st.s.opts.Display, what, t, st.tx.pos, pgx.Identifier{t.Namespace, t.Name}.Sanitize()))
	case !t.retina.Schema.GeneratedKey:
		return fatal(fmt.Errorf("postgres source %s: %s of %s at %s: Retina's table %s was created by an earlier version that cannot find rows by content; drop it and the slot to copy it again",
			st.s.opts.Display, what, t, st.tx.pos, t.retina.Name))
	}
	return nil
}

// relation binds a Relation message's table: its columns as the message
// gives them (the schema at this point of the stream), nullability and key
// from PostgreSQL's catalog.
func (st *streamer) relation(ctx context.Context, m *pglogrepl.RelationMessage) (*table, error) {
	s := st.s
	cur, err := describeByName(ctx, st.conn, m.Namespace, m.RelationName)
	switch {
	case errors.Is(err, errDropped):
		// Changes written before the table was dropped (Retina was behind):
		// the message is all there is; the key is the one Retina's table has.
		cur = &table{}
		if rt, ok := s.cfg.Catalog.Snapshot().Table(catalog.TableName(m.Namespace, m.RelationName)); ok {
			cur.Key = rt.Schema.PrimaryKey
			if slices.Contains(cur.Key, keylessLSN) {
				cur.Key = nil
			}
		}
	case err != nil:
		return nil, fmt.Errorf("postgres source %s: %w", s.opts.Display, err)
	}
	t := &table{OID: cur.OID, Namespace: m.Namespace, Name: m.RelationName, Identity: m.ReplicaIdentity, Key: cur.Key}
	var flagged []string
	for _, mc := range m.Columns {
		c := column{Name: mc.Name, OID: mc.DataType, TypMod: mc.TypeModifier, Type: mapType(mc.DataType, mc.TypeModifier), PGType: fmt.Sprintf("type oid %d", mc.DataType)}
		for _, cc := range cur.Cols {
			if cc.Name == c.Name {
				c.NotNull, c.Filled, c.Attnum = cc.NotNull, cc.Filled, cc.Attnum
				if cc.OID == c.OID {
					c.PGType = cc.PGType
				}
			}
		}
		if mc.Flags&1 != 0 {
			flagged = append(flagged, mc.Name)
		}
		t.Cols = append(t.Cols, c)
	}
	// The old key PostgreSQL sends is the identity's: follow it when it no
	// longer matches the key found in the catalog.
	if m.ReplicaIdentity != 'f' && len(flagged) > 0 && !sameSet(flagged, t.Key) {
		t.Key = flagged
	}
	if err := t.bind(ctx, s.cfg.Catalog, false); err != nil {
		return nil, fatal(fmt.Errorf("postgres source %s: %w", s.opts.Display, err))
	}
	return t, nil
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range a {
		if !slices.Contains(b, x) {
			return false
		}
	}
	return true
}

// fullRow is row for a tuple that must carry every value.
func (st *streamer) fullRow(t *table, tup *pglogrepl.TupleData, what string) ([]any, error) {
	row, unchanged, err := st.row(t, tup, nil, what)
	if err == nil && len(unchanged) > 0 {
		err = fatal(fmt.Errorf("postgres source %s: %s of %s at %s: column %s was not sent", st.s.opts.Display, what, t, st.tx.pos, t.retina.Schema.Columns[unchanged[0]].Name))
	}
	return row, err
}

// row turns a tuple into a Retina row. An unchanged TOAST value comes from
// base, the old row PostgreSQL sends under REPLICA IDENTITY FULL; without
// it, its Retina column is listed in unchanged, for the replayer to take
// from the row's current version.
func (st *streamer) row(t *table, tup *pglogrepl.TupleData, base []any, what string) (row []any, unchanged []int, err error) {
	s := st.s
	if tup == nil || len(tup.Columns) != len(t.Cols) {
		n := 0
		if tup != nil {
			n = len(tup.Columns)
		}
		return nil, nil, fatal(fmt.Errorf("postgres source %s: %s of %s at %s: %d values for %d columns", s.opts.Display, what, t, st.tx.pos, n, len(t.Cols)))
	}
	row = make([]any, len(t.retina.Schema.Columns))
	for i, c := range tup.Columns {
		j := t.pos[i]
		switch c.DataType {
		case pglogrepl.TupleDataTypeNull:
		case pglogrepl.TupleDataTypeToast:
			if base == nil {
				unchanged = append(unchanged, j)
				continue
			}
			row[j] = base[j]
		case pglogrepl.TupleDataTypeText:
			v, err := st.tm.value(&t.Cols[i], c.Data)
			if err != nil {
				return nil, nil, fatal(fmt.Errorf("postgres source %s: %s of %s (Retina table %s) at %s: %w", s.opts.Display, what, t, t.retina.Name, st.tx.pos, err))
			}
			row[j] = v
		default:
			return nil, nil, fatal(fmt.Errorf("postgres source %s: %s of %s at %s: column %s in format %q", s.opts.Display, what, t, st.tx.pos, t.Cols[i].Name, c.DataType))
		}
	}
	return row, unchanged, nil
}

func pick(row []any, at []int) []any {
	out := make([]any, len(at))
	for i, j := range at {
		out[i] = row[j]
	}
	return out
}
