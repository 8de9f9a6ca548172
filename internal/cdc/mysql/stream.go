package mysql

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"
	"github.com/google/uuid"

	"github.com/retinadb/retina/internal/cdc"
)

// markEvery bounds how often an idle file-position stream is marked
// handled.
const markEvery = time.Second

// openTxn is the source transaction being received.
type openTxn struct {
	id       string
	pos      cdc.Position        // where its changes sit
	gtidPos  bool                // pos is a GTID stream's: the end sits there too
	gtid     string              // its GTID, when there is one
	filePos  string              // FILE:OFFSET of its first event
	mariadb  gomysql.MariadbGTID // its GTID on MariaDB
	sid      uuid.UUID           // and on MySQL
	gno      int64
	startPos int64 // packed binlog file offset of its first event
	commitMS int64
	n        int64
	perTable map[string]int64
	begun    bool // opened by BEGIN: a Query event other than COMMIT is within it
}

// streamer decodes one replication session's events.
type streamer struct {
	s       *Source
	tables  map[uint64]*table // by binlog table id, the tables read
	ignored map[uint64]bool   // binlog table ids of tables not read
	file    string            // the binlog file being read
	tx      *openTxn
	// lastEnd is the packed end of the last event read in file mode;
	// lastMark when the idle position was last marked.
	lastEnd  int64
	lastMark time.Time
	// domains holds, per MariaDB domain, the newest GTID delivered; mysql
	// the MySQL GTID set delivered (for s.next).
	domains map[uint32]gomysql.MariadbGTID
}

// stream follows the binlog from s.next and delivers every transaction
// that changes a table read as one transaction, in commit order.
func (s *Source) stream(ctx context.Context) error {
	cfg := replication.BinlogSyncerConfig{
		ServerID: s.opts.ServerID, Flavor: s.flavor, User: s.opts.User, Password: s.opts.Password,
		TLSConfig: s.opts.TLS, ParseTime: false, TimestampStringLocation: time.UTC, UseDecimal: false,
		HeartbeatPeriod: time.Second, ReadTimeout: 10 * time.Second, DisableRetrySync: true,
		MaxReconnectAttempts: 1, Logger: discardLogger(),
	}
	host, port, err := splitHostPort(s.opts.Addr)
	if err != nil {
		return fatal(fmt.Errorf("mysql source %s: %w", s.opts.Display, err))
	}
	cfg.Host, cfg.Port = host, port
	syncer := replication.NewBinlogSyncer(cfg)
	defer syncer.Close()
	var bs *replication.BinlogStreamer
	if s.next.gtid != nil {
		bs, err = syncer.StartSyncGTID(s.next.gtid.Clone())
	} else {
		bs, err = syncer.StartSync(gomysql.Position{Name: s.next.file, Pos: s.next.offset})
	}
	if err != nil {
		return s.syncError(err)
	}
	s.log.Info("streaming changes", "from", s.next.String())
	st := &streamer{s: s, tables: map[uint64]*table{}, ignored: map[uint64]bool{}, file: s.next.file, domains: map[uint32]gomysql.MariadbGTID{}}
	if s.next.gtid != nil && s.flavor == gomysql.MariaDBFlavor {
		for _, per := range s.next.gtid.(*gomysql.MariadbGTIDSet).Sets {
			for _, g := range per {
				if cur, ok := st.domains[g.DomainID]; !ok || g.SequenceNumber > cur.SequenceNumber {
					st.domains[g.DomainID] = *g
				}
			}
		}
	}
	defer st.nextSet()
	for {
		ev, err := bs.GetEvent(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return s.syncError(err)
		}
		if err := st.handle(ctx, ev); err != nil {
			return err
		}
	}
}

// discardLogger quiets the replication library, whose errors reach the
// source as errors.
func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// syncError names a binlog error; a position the server no longer has is
// fatal, with what to do.
func (s *Source) syncError(err error) error {
	var me *gomysql.MyError
	if errors.As(err, &me) && me.Code == gomysql.ER_MASTER_FATAL_ERROR_READING_BINLOG {
		return fatal(fmt.Errorf("mysql source %s: the server cannot send the binlog from %s (%s): the binlog there was purged (binlog_expire_logs_seconds, PURGE BINARY LOGS) or the server was reset, so Retina would miss changes; copy every table again with a new copy=TAG in the source URI (for example copy=2)",
			s.opts.Display, s.next.String(), me.Message))
	}
	return fmt.Errorf("mysql source %s: binlog at %s: %w", s.opts.Display, s.next.String(), err)
}

func splitHostPort(addr string) (string, uint16, error) {
	i := strings.LastIndexByte(addr, ':')
	if i < 0 {
		return "", 0, fmt.Errorf("address %q has no port", addr)
	}
	p, err := strconv.ParseUint(addr[i+1:], 10, 16)
	if err != nil {
		return "", 0, fmt.Errorf("address %q: port: %w", addr, err)
	}
	return strings.Trim(addr[:i], "[]"), uint16(p), nil
}

// handle decodes one binlog event.
func (st *streamer) handle(ctx context.Context, ev *replication.BinlogEvent) error {
	s := st.s
	h := ev.Header
	start := int64(h.LogPos) - int64(h.EventSize)
	switch e := ev.Event.(type) {
	case *replication.RotateEvent:
		st.file = string(e.NextLogName)
		return nil
	case *replication.MariadbGTIDEvent:
		g := e.GTID
		tx := st.begin(h, start)
		tx.id, tx.gtid, tx.mariadb = g.String(), g.String(), g
		if s.gtid {
			tx.pos, tx.gtidPos = cdc.Position{Stream: fmt.Sprintf("%s/gtid/%d-%d", prefix(s.opts), g.DomainID, g.ServerID), Offset: int64(g.SequenceNumber)}, true
		}
		return nil
	case *replication.GTIDEvent:
		sid, err := uuid.FromBytes(e.SID)
		if err != nil {
			return fatal(fmt.Errorf("mysql source %s: a GTID event with server UUID %x: %w", s.opts.Display, e.SID, err))
		}
		tx := st.begin(h, start)
		tx.id = fmt.Sprintf("%s:%d", sid, e.GNO)
		tx.gtid, tx.sid, tx.gno = tx.id, sid, e.GNO
		if e.OriginalCommitTimestamp > 0 {
			tx.commitMS = int64(e.OriginalCommitTimestamp / 1000)
		}
		if s.gtid {
			tx.pos, tx.gtidPos = cdc.Position{Stream: prefix(s.opts) + "/gtid/" + sid.String(), Offset: e.GNO}, true
		}
		return nil
	case *replication.QueryEvent:
		q := strings.TrimSpace(string(e.Query))
		switch {
		case strings.EqualFold(q, "BEGIN"):
			if st.tx == nil {
				st.begin(h, start)
			}
			st.tx.begun = true
			return nil
		case strings.EqualFold(q, "COMMIT"), strings.EqualFold(q, "ROLLBACK"):
			// ROLLBACK ends a transaction that changed non-transactional
			// tables: what it logged stays.
			return st.commit(ctx, h)
		}
		if st.tx != nil && st.tx.begun {
			return nil // SAVEPOINT and the like, within a transaction
		}
		if st.tx == nil {
			st.begin(h, start)
		}
		if err := st.ddl(ctx, string(e.Schema), q); err != nil {
			return err
		}
		return st.commit(ctx, h)
	case *replication.TableMapEvent:
		return st.tableMap(ctx, e)
	case *replication.RowsEvent:
		return st.rows(ctx, ev.Header.EventType, e)
	case *replication.XIDEvent:
		return st.commit(ctx, h)
	case *replication.TransactionPayloadEvent:
		for _, inner := range e.Events {
			if err := st.handle(ctx, inner); err != nil {
				return err
			}
		}
		return nil
	}
	// Format descriptions, GTID lists, checkpoints, annotations and
	// heartbeats carry no rows: an idle file stream marks its position.
	if !s.gtid && st.tx == nil && h.LogPos > 0 && st.file != "" && h.EventType != replication.HEARTBEAT_EVENT && h.EventType != replication.HEARTBEAT_LOG_EVENT_V2 {
		if _, packed, ok := fileOffset(st.file, h.LogPos); ok && packed > st.lastEnd {
			st.lastEnd = packed
		}
	}
	return st.idle(ctx)
}

// idle marks the file position read so far handled when no transaction is
// open, at most every markEvery: a wait for a position past events that
// carry no rows then returns.
func (st *streamer) idle(ctx context.Context) error {
	s := st.s
	if s.gtid || st.tx != nil || st.lastEnd == 0 || time.Since(st.lastMark) < markEvery {
		return nil
	}
	base, next, _ := fileOffset(s.next.file, s.next.offset)
	if st.lastEnd <= next {
		return nil
	}
	st.lastMark = time.Now()
	s.next.file, s.next.offset = fileAt(base, st.lastEnd)
	return s.emit(ctx, record(cdc.Position{Stream: prefix(s.opts) + "/binlog/" + base, Offset: st.lastEnd - 1}, cdc.Record{Kind: cdc.Skip, SkipReason: "no changes of the tables read"}))
}

// begin opens a transaction at the event at start.
func (st *streamer) begin(h *replication.EventHeader, start int64) *openTxn {
	s := st.s
	_, packed, _ := fileOffset(st.file, uint32(start))
	tx := &openTxn{startPos: packed, commitMS: int64(h.Timestamp) * 1000, perTable: map[string]int64{}}
	tx.id = fmt.Sprintf("%s:%d", st.file, start)
	tx.filePos = tx.id
	if !s.gtid {
		base, _, _ := fileOffset(st.file, 0)
		tx.pos = cdc.Position{Stream: prefix(s.opts) + "/binlog/" + base, Offset: packed}
	}
	st.tx = tx
	return tx
}

// commit ends the open transaction: its End record (a Skip when it changed
// no table read) at its position.
func (st *streamer) commit(ctx context.Context, h *replication.EventHeader) error {
	s := st.s
	tx := st.tx
	if tx == nil {
		return nil // a commit of a transaction begun before the start position
	}
	st.tx = nil
	var r cdc.Record
	if tx.n == 0 {
		r = cdc.Record{Kind: cdc.Skip, SkipReason: "transaction without changes of the tables read"}
	} else {
		r = cdc.Record{Kind: cdc.End, TxID: tx.id, EventCount: tx.n, PerTable: tx.perTable, SourceTSms: tx.commitMS}
	}
	end := tx.pos
	_, packedEnd, _ := fileOffset(st.file, h.LogPos)
	if !tx.gtidPos {
		// One before the commit event's end: the stream then resumes at
		// that end, where the next transaction can start.
		end.Offset = packedEnd - 1
	}
	if err := s.emit(ctx, record(end, r)); err != nil {
		return err
	}
	st.lastEnd = max(st.lastEnd, packedEnd)
	st.advance(tx, h)
	return nil
}

// advance moves the reconnect position past a delivered transaction.
func (st *streamer) advance(tx *openTxn, h *replication.EventHeader) {
	s := st.s
	switch {
	case !s.gtid:
		s.next.file, s.next.offset = st.file, h.LogPos
		s.stats.position.Store(s.next.String())
	case s.flavor == gomysql.MariaDBFlavor:
		// The set is made from the domains when a session ends (nextSet).
		st.domains[tx.mariadb.DomainID] = tx.mariadb
		s.stats.position.Store("gtid:" + tx.gtid)
	default:
		if set, ok := s.next.gtid.(*gomysql.MysqlGTIDSet); ok {
			set.AddGTID(tx.sid, tx.gno)
		}
		s.stats.position.Store("gtid:" + tx.gtid)
	}
	s.stats.txns.Add(1)
	s.stats.lastCommit.Store(tx.commitMS * 1000)
}

// nextSet makes the MariaDB GTID set streaming resumes at from the newest
// GTID delivered per domain.
func (st *streamer) nextSet() {
	s := st.s
	if !s.gtid || s.flavor != gomysql.MariaDBFlavor || len(st.domains) == 0 {
		return
	}
	set := &gomysql.MariadbGTIDSet{Sets: map[uint32]map[uint32]*gomysql.MariadbGTID{}}
	for d, g := range st.domains {
		set.Sets[d] = map[uint32]*gomysql.MariadbGTID{g.ServerID: g.Clone()}
	}
	s.next.gtid = set
}

// tableMap binds a table map event's table when the source reads it.
func (st *streamer) tableMap(ctx context.Context, e *replication.TableMapEvent) error {
	s := st.s
	if !strings.EqualFold(string(e.Schema), s.opts.Database) || !s.selected(string(e.Table)) {
		st.ignored[e.TableID] = true
		delete(st.tables, e.TableID)
		return nil
	}
	delete(st.ignored, e.TableID)
	if t, ok := st.tables[e.TableID]; ok && sameShape(t, e) {
		return nil
	}
	t, err := fromTableMap(e, s.collations)
	if err != nil {
		return fatal(fmt.Errorf("mysql source %s: at %s: %w", s.opts.Display, st.where(), err))
	}
	if err := t.bind(ctx, s.cfg.Catalog, false); err != nil {
		return fatal(fmt.Errorf("mysql source %s: at %s: %w", s.opts.Display, st.where(), err))
	}
	st.tables[e.TableID] = t
	return nil
}

// sameShape tells whether a bound table still matches a table map event
// of its id (ids are reused only for the same definition, but cheap to
// check).
func sameShape(t *table, e *replication.TableMapEvent) bool {
	names := e.ColumnNameString()
	if len(names) != len(t.Cols) {
		return false
	}
	for i, n := range names {
		if n != t.Cols[i].Name {
			return false
		}
	}
	return true
}

// where names the open transaction's position for messages.
func (st *streamer) where() string {
	if st.tx != nil {
		if st.tx.gtid != "" {
			return fmt.Sprintf("GTID %s (binlog %s)", st.tx.gtid, st.tx.filePos)
		}
		return "binlog " + st.tx.filePos
	}
	return "binlog " + st.file
}

// rows delivers a rows event's changes.
func (st *streamer) rows(ctx context.Context, et replication.EventType, e *replication.RowsEvent) error {
	s := st.s
	if st.ignored[e.TableID] {
		return nil
	}
	t, ok := st.tables[e.TableID]
	if !ok {
		return fatal(fmt.Errorf("mysql source %s: at %s: rows of table id %d before its table map", s.opts.Display, st.where(), e.TableID))
	}
	if st.tx == nil {
		return fatal(fmt.Errorf("mysql source %s: at %s: rows of %s outside a transaction", s.opts.Display, st.where(), t))
	}
	for _, skipped := range e.SkippedColumns {
		if len(skipped) > 0 {
			return fatal(fmt.Errorf("mysql source %s: at %s: a row of %s lacks columns: set binlog_row_image = FULL", s.opts.Display, st.where(), t))
		}
	}
	if e.Type() != replication.EnumRowsEventTypeInsert && t.keyless() {
		if err := st.keylessFindable(t, e.Type().String()); err != nil {
			return err
		}
	}
	switch e.Type() {
	case replication.EnumRowsEventTypeInsert:
		for _, r := range e.Rows {
			row, err := st.row(t, r, "insert")
			if err != nil {
				return err
			}
			if t.keyless() {
				row[t.keyPos[0]], row[t.keyPos[1]] = st.tx.startPos, st.tx.n
			}
			if err := st.change(ctx, t, cdc.Record{Op: cdc.OpCreate, After: row}); err != nil {
				return err
			}
		}
	case replication.EnumRowsEventTypeUpdate:
		if len(e.Rows)%2 != 0 {
			return fatal(fmt.Errorf("mysql source %s: at %s: an update of %s with %d row images", s.opts.Display, st.where(), t, len(e.Rows)))
		}
		for i := 0; i < len(e.Rows); i += 2 {
			old, err := st.row(t, e.Rows[i], "update (old row)")
			if err != nil {
				return err
			}
			row, err := st.row(t, e.Rows[i+1], "update")
			if err != nil {
				return err
			}
			if err := st.change(ctx, t, identified(t, cdc.Record{Op: cdc.OpUpdate, Before: old, After: row})); err != nil {
				return err
			}
		}
	case replication.EnumRowsEventTypeDelete:
		for _, rr := range e.Rows {
			old, err := st.row(t, rr, "delete")
			if err != nil {
				return err
			}
			if err := st.change(ctx, t, identified(t, cdc.Record{Op: cdc.OpDelete, Before: old})); err != nil {
				return err
			}
		}
	default:
		return fatal(fmt.Errorf("mysql source %s: at %s: rows event %s of %s, which Retina does not read (binlog_row_value_options = PARTIAL_JSON is not supported: set it empty)", s.opts.Display, st.where(), et, t))
	}
	return nil
}

// identified names the row an update or delete changes: by its key, or,
// in a table without one, by its whole old row.
func identified(t *table, r cdc.Record) cdc.Record {
	if t.keyless() {
		r.Unmatched = t.absent
	} else {
		r.Key = pick(r.Before, t.keyPos)
	}
	return r
}

// keylessFindable checks that Retina's table of a table without a key
// finds rows by content.
func (st *streamer) keylessFindable(t *table, what string) error {
	if !t.retina.Schema.GeneratedKey {
		return fatal(fmt.Errorf("mysql source %s: %s of %s at %s: Retina's table %s was not created by this source and cannot find rows by content; drop it in Retina and copy again (copy=TAG)",
			st.s.opts.Display, what, t, st.where(), t.retina.Name))
	}
	return nil
}

// row turns a row image into a Retina row.
func (st *streamer) row(t *table, image []any, what string) ([]any, error) {
	if len(image) != len(t.Cols) {
		return nil, fatal(fmt.Errorf("mysql source %s: %s of %s at %s: %d values for %d columns", st.s.opts.Display, what, t, st.where(), len(image), len(t.Cols)))
	}
	row := make([]any, len(t.retina.Schema.Columns))
	for i, v := range image {
		x, err := t.Cols[i].value(v)
		if err != nil {
			return nil, fatal(fmt.Errorf("mysql source %s: %s of %s (Retina table %s) at %s: %w", st.s.opts.Display, what, t, t.retina.Name, st.where(), err))
		}
		row[t.pos[i]] = x
	}
	return row, nil
}

// change delivers one row change of the open transaction.
func (st *streamer) change(ctx context.Context, t *table, r cdc.Record) error {
	tx := st.tx
	r.Kind, r.Table, r.TxID, r.TotalOrder, r.SourceTSms = cdc.Change, t.retina.Name, tx.id, tx.n, tx.commitMS
	tx.n++
	tx.perTable[t.retina.Name]++
	return st.s.emit(ctx, record(tx.pos, r))
}

func pick(row []any, at []int) []any {
	out := make([]any, len(at))
	for i, j := range at {
		out[i] = row[j]
	}
	return out
}
