// Package pgwire serves the query engine over the PostgreSQL wire protocol
// (simple and extended query protocols, cancel requests), so psql, pgx, JDBC
// and BI tools can query Retina. Message framing is pgx's pgproto3.
package pgwire

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/duckdb/duckdb-go/v2"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/retinadb/retina/internal/query"
)

// Server accepts PostgreSQL clients.
type Server struct {
	engine *query.Engine
	log    *slog.Logger
	ln     net.Listener

	mu      sync.Mutex
	conns   map[uint32]*clientConn // by backend pid, for cancel requests
	nextPID uint32
	wg      sync.WaitGroup
	closed  atomic.Bool
}

// Listen binds addr (e.g. 127.0.0.1:5433).
func Listen(addr string, engine *query.Engine, log *slog.Logger) (*Server, error) {
	if log == nil {
		log = slog.Default()
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("pgwire: listen on %s: %w", addr, err)
	}
	return &Server{engine: engine, log: log.With("component", "pgwire"), ln: ln, conns: map[uint32]*clientConn{}}, nil
}

// Addr is the address clients connect to.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Serve accepts connections until ctx ends, then closes the listener and
// the open sessions (their running statements are cancelled).
func (s *Server) Serve(ctx context.Context) error {
	go func() {
		<-ctx.Done()
		s.Close()
	}()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if s.closed.Load() {
				s.wg.Wait()
				return nil
			}
			return fmt.Errorf("pgwire: accept: %w", err)
		}
		s.wg.Go(func() { s.handle(ctx, c) })
	}
}

// Close stops accepting and closes every client connection.
func (s *Server) Close() error {
	if !s.closed.CompareAndSwap(false, true) {
		return nil
	}
	err := s.ln.Close()
	s.mu.Lock()
	for _, cc := range s.conns {
		cc.cancelRunning()
		cc.net.Close()
	}
	s.mu.Unlock()
	return err
}

// Sessions is the number of connected clients.
func (s *Server) Sessions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

type prepared struct {
	query     string
	paramOIDs []uint32
	colNames  []string // empty: no rows
	colOIDs   []uint32
}

type portal struct {
	stmt    *prepared
	args    []any
	formats []int16
}

// clientConn is one client session.
type clientConn struct {
	srv     *Server
	net     net.Conn
	be      *pgproto3.Backend
	sess    *query.Session
	pid     uint32
	secret  []byte
	stmts   map[string]*prepared
	portals map[string]*portal

	runMu   sync.Mutex
	running context.CancelFunc // the statement in progress, for cancel
}

func (c *clientConn) cancelRunning() {
	c.runMu.Lock()
	defer c.runMu.Unlock()
	if c.running != nil {
		c.running()
	}
}

func (s *Server) handle(ctx context.Context, nc net.Conn) {
	defer nc.Close()
	be := pgproto3.NewBackend(nc, nc)
	cc := &clientConn{srv: s, net: nc, be: be, stmts: map[string]*prepared{}, portals: map[string]*portal{}}
	ok, err := cc.startup()
	if err != nil || !ok {
		if err != nil && !errors.Is(err, io.EOF) {
			s.log.Debug("startup failed", "remote", nc.RemoteAddr(), "err", err)
		}
		return
	}
	sess, err := s.engine.NewSession(ctx)
	if err != nil {
		cc.sendError(err)
		be.Flush()
		return
	}
	cc.sess = sess
	defer sess.Close() // ends a read transaction's snapshot too
	s.mu.Lock()
	s.nextPID++
	cc.pid = s.nextPID
	s.conns[cc.pid] = cc
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.conns, cc.pid)
		s.mu.Unlock()
	}()
	cc.secret = make([]byte, 4)
	rand.Read(cc.secret)
	be.Send(&pgproto3.AuthenticationOk{})
	for k, v := range map[string]string{
		"server_version": "15.0 (Retina)", "server_encoding": "UTF8", "client_encoding": "UTF8",
		"DateStyle": "ISO, MDY", "TimeZone": "UTC", "integer_datetimes": "on",
		"standard_conforming_strings": "on", "application_name": "",
	} {
		be.Send(&pgproto3.ParameterStatus{Name: k, Value: v})
	}
	be.Send(&pgproto3.BackendKeyData{ProcessID: cc.pid, SecretKey: cc.secret})
	cc.ready()
	if err := be.Flush(); err != nil {
		return
	}
	if err := cc.loop(ctx); err != nil && !errors.Is(err, io.EOF) && !s.closed.Load() {
		s.log.Debug("client connection ended", "remote", nc.RemoteAddr(), "err", err)
	}
}

// startup handles SSL negotiation and cancel requests; it returns true
// for a regular session start.
func (c *clientConn) startup() (bool, error) {
	for {
		msg, err := c.be.ReceiveStartupMessage()
		if err != nil {
			return false, err
		}
		switch m := msg.(type) {
		case *pgproto3.SSLRequest, *pgproto3.GSSEncRequest:
			if _, err := c.net.Write([]byte{'N'}); err != nil {
				return false, err
			}
		case *pgproto3.CancelRequest:
			c.srv.cancel(m.ProcessID, m.SecretKey)
			return false, nil
		case *pgproto3.StartupMessage:
			return true, nil
		default:
			return false, fmt.Errorf("unexpected startup message %T", msg)
		}
	}
}

func (s *Server) cancel(pid uint32, secret []byte) {
	s.mu.Lock()
	cc := s.conns[pid]
	s.mu.Unlock()
	if cc != nil && subtle.ConstantTimeCompare(cc.secret, secret) == 1 {
		cc.cancelRunning()
	}
}

// ready reports the transaction state and waits for the next command.
func (c *clientConn) ready() {
	status := byte('I')
	if c.sess != nil && c.sess.InTransaction() {
		status = 'T'
	}
	c.be.Send(&pgproto3.ReadyForQuery{TxStatus: status})
}

func (c *clientConn) loop(ctx context.Context) error {
	skipToSync := false // after an error in the extended protocol
	for {
		msg, err := c.receive()
		if err != nil {
			return err
		}
		if skipToSync {
			if _, ok := msg.(*pgproto3.Sync); !ok {
				continue
			}
			skipToSync = false
		}
		switch m := msg.(type) {
		case *pgproto3.Query:
			c.simpleQuery(ctx, m.String)
			c.ready()
		case *pgproto3.Parse:
			err = c.parse(ctx, m)
			if err == nil {
				c.be.Send(&pgproto3.ParseComplete{})
			}
		case *pgproto3.Bind:
			err = c.bind(m)
			if err == nil {
				c.be.Send(&pgproto3.BindComplete{})
			}
		case *pgproto3.Describe:
			err = c.describe(m)
		case *pgproto3.Execute:
			err = c.execute(ctx, m)
		case *pgproto3.Close:
			if m.ObjectType == 'S' {
				delete(c.stmts, m.Name)
			} else {
				delete(c.portals, m.Name)
			}
			c.be.Send(&pgproto3.CloseComplete{})
		case *pgproto3.Sync:
			c.ready()
		case *pgproto3.Flush:
		case *pgproto3.Terminate:
			return nil
		default:
			err = fmt.Errorf("%w: unsupported message %T", errProtocol, msg)
		}
		if err != nil {
			c.sendError(err)
			skipToSync = true
		}
		switch msg.(type) {
		case *pgproto3.Query, *pgproto3.Sync, *pgproto3.Flush, *pgproto3.Execute:
			if err := c.be.Flush(); err != nil {
				return err
			}
		}
	}
}

var errProtocol = errors.New("pgwire: protocol violation")

// errStatementTimeout cancels a statement that ran past statement_timeout.
var errStatementTimeout = errors.New("canceling statement due to statement timeout")

// errIdleInTransaction ends a session left idle inside a transaction for
// longer than its idle_in_transaction_session_timeout: its snapshot would
// hold back the low watermark, and with it every GC, for good.
var errIdleInTransaction = errors.New("terminating connection due to idle-in-transaction timeout")

// receive waits for the client's next message. Inside a transaction it
// waits no longer than idle_in_transaction_session_timeout, then ends the
// session as PostgreSQL does (FATAL, SQLSTATE 25P03).
func (c *clientConn) receive() (pgproto3.FrontendMessage, error) {
	var idle time.Duration
	if c.sess.InTransaction() {
		idle = c.sess.Settings().Duration("idle_in_transaction_session_timeout")
	}
	deadline := time.Time{}
	if idle > 0 {
		deadline = time.Now().Add(idle)
	}
	if err := c.net.SetReadDeadline(deadline); err != nil {
		return nil, err
	}
	msg, err := c.be.Receive()
	var ne net.Error
	if err != nil && idle > 0 && errors.As(err, &ne) && ne.Timeout() {
		c.srv.log.Info("ended a session idle in a transaction", "remote", c.net.RemoteAddr(), "idle_in_transaction_session_timeout", idle)
		c.be.Send(&pgproto3.ErrorResponse{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "25P03", Message: errIdleInTransaction.Error()})
		c.be.Flush()
		return nil, errIdleInTransaction
	}
	return msg, err
}

// run executes one statement with cancellation wired to cancel requests.
func (c *clientConn) run(ctx context.Context, q string, args []any) (*query.Result, context.CancelFunc, error) {
	rctx, cancel := context.WithCancel(ctx)
	if d := c.sess.Settings().Duration("statement_timeout"); d > 0 {
		rctx, cancel = context.WithTimeoutCause(ctx, d, errStatementTimeout)
	}
	c.runMu.Lock()
	c.running = cancel
	c.runMu.Unlock()
	res, err := c.sess.Run(rctx, q, args...)
	if err != nil {
		if context.Cause(rctx) == errStatementTimeout {
			err = fmt.Errorf("%w: %w", errStatementTimeout, err)
		}
		c.clearRunning(cancel)
		return nil, nil, err
	}
	return res, cancel, nil
}

func (c *clientConn) clearRunning(cancel context.CancelFunc) {
	c.runMu.Lock()
	c.running = nil
	c.runMu.Unlock()
	cancel()
}

func (c *clientConn) simpleQuery(ctx context.Context, text string) {
	stmts := query.SplitStatements(text)
	if len(stmts) == 0 {
		c.be.Send(&pgproto3.EmptyQueryResponse{})
		return
	}
	for _, q := range stmts {
		res, cancel, err := c.run(ctx, q, nil)
		if err != nil {
			c.sendError(err)
			return
		}
		err = c.sendResult(res, nil, true)
		c.clearRunning(cancel)
		if err != nil {
			c.sendError(err)
			return
		}
	}
}

// sendResult streams a result's rows (with its row description when
// describe is set) and its command tag, and closes it.
func (c *clientConn) sendResult(res *query.Result, formats []int16, describe bool) (err error) {
	defer func() {
		if cerr := res.Close(); err == nil {
			err = cerr
		}
	}()
	if res.Columns == nil {
		c.be.Send(&pgproto3.CommandComplete{CommandTag: []byte(res.Tag)})
		return nil
	}
	names := make([]string, len(res.Columns))
	oids := make([]uint32, len(res.Columns))
	for i, col := range res.Columns {
		names[i], oids[i] = col.Name, oidOf(col.Type)
	}
	if describe {
		c.be.Send(rowDescription(names, oids, formats))
	}
	for res.Next() {
		vals, err := res.Values()
		if err != nil {
			return err
		}
		row := make([][]byte, len(vals))
		for i, v := range vals {
			if formatFor(formats, i) == 1 {
				if row[i], err = encodeBinary(v, oids[i]); err != nil {
					return err
				}
			} else {
				row[i] = encodeText(v, oids[i])
			}
		}
		c.be.Send(&pgproto3.DataRow{Values: row})
	}
	if err := res.Err(); err != nil {
		return err
	}
	tag := []byte(res.Tag)
	if res.Tag == "SELECT" { // PostgreSQL counts rows for SELECT, not for SHOW
		tag = fmt.Appendf(nil, "%s %d", res.Tag, res.Rows())
	}
	c.be.Send(&pgproto3.CommandComplete{CommandTag: tag})
	return nil
}

func formatFor(formats []int16, i int) int16 {
	switch len(formats) {
	case 0:
		return 0
	case 1:
		return formats[0]
	}
	if i < len(formats) {
		return formats[i]
	}
	return 0
}

func rowDescription(names []string, oids []uint32, formats []int16) *pgproto3.RowDescription {
	rd := &pgproto3.RowDescription{}
	for i, name := range names {
		rd.Fields = append(rd.Fields, pgproto3.FieldDescription{
			Name: []byte(name), DataTypeOID: oids[i], DataTypeSize: -1, TypeModifier: -1, Format: formatFor(formats, i),
		})
	}
	return rd
}

// parse prepares a statement: DuckDB reports its parameter types and, for
// queries, its result columns.
func (c *clientConn) parse(ctx context.Context, m *pgproto3.Parse) error {
	p := &prepared{query: m.Query, paramOIDs: append([]uint32(nil), m.ParameterOIDs...)}
	word := strings.ToUpper(strings.Fields(strings.TrimSpace(m.Query) + " x")[0])
	switch word {
	case "BEGIN", "START", "COMMIT", "END", "ROLLBACK", "ABORT", "X":
		c.stmts[m.Name] = p
		return nil
	}
	if cols, ok, err := c.sess.DescribeSetting(m.Query); err != nil {
		return err
	} else if ok {
		for _, col := range cols {
			p.colNames = append(p.colNames, col.Name)
			p.colOIDs = append(p.colOIDs, oidOf(col.Type))
		}
		c.stmts[m.Name] = p
		return nil
	}
	err := c.sess.Describe(ctx, m.Query, func(st *duckdb.Stmt) error {
		n := st.NumInput()
		for i := len(p.paramOIDs); i < n; i++ {
			p.paramOIDs = append(p.paramOIDs, 0)
		}
		for i := range n {
			if p.paramOIDs[i] == 0 {
				t, err := st.ParamType(i + 1)
				if err != nil {
					return err
				}
				p.paramOIDs[i] = oidOfType(t)
			}
		}
		cols, err := st.ColumnCount()
		if err != nil {
			return err
		}
		for i := range cols {
			name, err := st.ColumnName(i)
			if err != nil {
				return err
			}
			t, err := st.ColumnType(i)
			if err != nil {
				return err
			}
			p.colNames = append(p.colNames, name)
			p.colOIDs = append(p.colOIDs, oidOfType(t))
		}
		return nil
	})
	if err != nil {
		return err
	}
	c.stmts[m.Name] = p
	return nil
}

func (c *clientConn) bind(m *pgproto3.Bind) error {
	p, ok := c.stmts[m.PreparedStatement]
	if !ok {
		return fmt.Errorf("%w: prepared statement %q does not exist", errUndefined, m.PreparedStatement)
	}
	if len(m.Parameters) != len(p.paramOIDs) {
		return fmt.Errorf("%w: %d parameters for %d placeholders", errProtocol, len(m.Parameters), len(p.paramOIDs))
	}
	args := make([]any, len(m.Parameters))
	for i, raw := range m.Parameters {
		v, err := decodeParam(raw, p.paramOIDs[i], formatFor(m.ParameterFormatCodes, i))
		if err != nil {
			return fmt.Errorf("parameter $%d: %w", i+1, err)
		}
		args[i] = v
	}
	c.portals[m.DestinationPortal] = &portal{stmt: p, args: args, formats: append([]int16(nil), m.ResultFormatCodes...)}
	return nil
}

var errUndefined = errors.New("pgwire: undefined object")

func (c *clientConn) describe(m *pgproto3.Describe) error {
	var p *prepared
	var formats []int16
	if m.ObjectType == 'S' {
		var ok bool
		if p, ok = c.stmts[m.Name]; !ok {
			return fmt.Errorf("%w: prepared statement %q does not exist", errUndefined, m.Name)
		}
		c.be.Send(&pgproto3.ParameterDescription{ParameterOIDs: p.paramOIDs})
	} else {
		pt, ok := c.portals[m.Name]
		if !ok {
			return fmt.Errorf("%w: portal %q does not exist", errUndefined, m.Name)
		}
		p, formats = pt.stmt, pt.formats
	}
	if len(p.colNames) == 0 {
		c.be.Send(&pgproto3.NoData{})
		return nil
	}
	c.be.Send(rowDescription(p.colNames, p.colOIDs, formats))
	return nil
}

func (c *clientConn) execute(ctx context.Context, m *pgproto3.Execute) error {
	pt, ok := c.portals[m.Portal]
	if !ok {
		return fmt.Errorf("%w: portal %q does not exist", errUndefined, m.Portal)
	}
	if strings.TrimSpace(pt.stmt.query) == "" {
		c.be.Send(&pgproto3.EmptyQueryResponse{})
		return nil
	}
	res, cancel, err := c.run(ctx, pt.stmt.query, pt.args)
	if err != nil {
		return err
	}
	defer c.clearRunning(cancel)
	return c.sendResult(res, pt.formats, false)
}

// sendError reports err with a SQLSTATE.
func (c *clientConn) sendError(err error) {
	c.be.Send(&pgproto3.ErrorResponse{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: sqlState(err), Message: err.Error()})
}

// sqlState maps errors to PostgreSQL error codes.
func sqlState(err error) string {
	var de *duckdb.Error
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded), errors.Is(err, errStatementTimeout):
		return "57014" // query_canceled
	case errors.Is(err, query.ErrReadOnly):
		return "25006" // read_only_sql_transaction
	case errors.Is(err, query.ErrUnknownSetting):
		return "42704" // undefined_object
	case errors.Is(err, query.ErrSetting):
		return "22023" // invalid_parameter_value
	case errors.Is(err, errUndefined):
		return "26000" // invalid_sql_statement_name
	case errors.Is(err, errProtocol):
		return "08P01" // protocol_violation
	case errors.As(err, &de):
		switch de.Type {
		case duckdb.ErrorTypeParser, duckdb.ErrorTypeSyntax:
			return "42601"
		case duckdb.ErrorTypeCatalog:
			return "42P01"
		case duckdb.ErrorTypeBinder:
			return "42703"
		case duckdb.ErrorTypePermission:
			return "42501"
		case duckdb.ErrorTypeDivideByZero:
			return "22012"
		case duckdb.ErrorTypeConversion, duckdb.ErrorTypeInvalidInput, duckdb.ErrorTypeOutOfRange, duckdb.ErrorTypeMismatchType:
			return "22000"
		case duckdb.ErrorTypeInterrupt:
			return "57014"
		case duckdb.ErrorTypeOutOfMemory:
			return "53200"
		case duckdb.ErrorTypeNotImplemented:
			return "0A000"
		}
	}
	if strings.Contains(err.Error(), "INTERRUPT") || strings.Contains(err.Error(), "Interrupted") {
		return "57014"
	}
	return "XX000"
}
