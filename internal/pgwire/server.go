// Package pgwire serves the query engine over the PostgreSQL wire protocol
// (simple and extended query protocols, cancel requests), so psql, pgx, JDBC
// and BI tools can query Retina. Message framing is pgx's pgproto3.
package pgwire

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/retinadb/retina/internal/query"
)

// Options configure who may connect and how.
type Options struct {
	// Users may log in with SCRAM-SHA-256; none means no password is
	// asked, which suits a server only this machine can reach.
	Users Users
	// TLS, when set, is offered to clients that ask (sslmode=require,
	// verify-full, …); RequireTLS refuses those that do not.
	TLS        *tls.Config
	RequireTLS bool
	Logger     *slog.Logger
}

// Server accepts PostgreSQL clients.
type Server struct {
	engine *query.Engine
	opts   Options
	log    *slog.Logger
	ln     net.Listener
	// saltKey makes the salts of unknown users: stable per name, like a
	// real user's, so the exchange does not tell which names exist.
	saltKey []byte

	mu      sync.Mutex
	conns   map[uint32]*clientConn // by backend pid, for cancel requests
	nextPID uint32
	wg      sync.WaitGroup
	closed  atomic.Bool
}

// Listen binds addr (e.g. 127.0.0.1:5433).
func Listen(addr string, engine *query.Engine, opts Options) (*Server, error) {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	if opts.RequireTLS && opts.TLS == nil {
		return nil, fmt.Errorf("pgwire: TLS is required but no certificate and key are configured (sql_tls_cert, sql_tls_key)")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("pgwire: listen on %s: %w", addr, err)
	}
	s := &Server{engine: engine, opts: opts, log: log.With("component", "pgwire"), ln: ln, conns: map[uint32]*clientConn{}, saltKey: make([]byte, 32)}
	rand.Read(s.saltKey)
	if !isLoopback(ln.Addr()) && len(opts.Users) == 0 {
		s.log.Warn("the SQL endpoint is reachable beyond this machine and asks no password: anyone who can reach it can read every table; configure sql_users (or RETINA_SQL_USER and RETINA_SQL_PASSWORD)", "addr", ln.Addr().String())
	}
	return s, nil
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

// prepared is a statement of the extended protocol: the session's plan and
// the parameter types the client named or the plan implies.
type prepared struct {
	stmt      *query.Statement
	paramOIDs []uint32
}

// portal is a bound statement; res is its result while suspended (an
// Execute with a row limit stopped before the end).
type portal struct {
	stmt    *prepared
	args    []any
	formats []int16
	res     *query.Result
	done    bool // ran to completion: a further Execute returns no rows
}

func (p *portal) close() {
	if p.res != nil {
		p.res.Close()
		p.res = nil
	}
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
	user    string
	client  string
	query   string    // the statement in progress, or the last one
	started time.Time // when it started
}

// Activity is what a client session does now.
type Activity struct {
	PID          uint32
	User, Client string
	// Query is the statement running, or the last one when State is not
	// "active".
	Query   string
	State   string // active, idle in transaction, idle
	Started time.Time
	// Snapshot is what the session reads at (a running statement's or its
	// transaction's) and when it was taken; 0 when it holds none.
	Snapshot      uint64
	SnapshotTaken time.Time
}

// Activity lists what every client session does now.
func (s *Server) Activity() []Activity {
	s.mu.Lock()
	conns := make([]*clientConn, 0, len(s.conns))
	for _, cc := range s.conns {
		conns = append(conns, cc)
	}
	s.mu.Unlock()
	out := make([]Activity, 0, len(conns))
	for _, cc := range conns {
		cc.runMu.Lock()
		a := Activity{PID: cc.pid, User: cc.user, Client: cc.client, Query: cc.query, Started: cc.started, State: "idle"}
		running := cc.running != nil
		sess := cc.sess
		cc.runMu.Unlock()
		if sess == nil {
			continue // still logging in
		}
		switch {
		case running:
			a.State = "active"
		case sess.InTransaction():
			a.State = "idle in transaction"
		}
		a.Snapshot, a.SnapshotTaken, _ = sess.Snapshot()
		out = append(out, a)
	}
	slices.SortFunc(out, func(a, b Activity) int { return int(a.PID) - int(b.PID) })
	return out
}

// Cancel cancels the statement session pid runs, as a cancel request
// with its key would; false when it runs none.
func (s *Server) Cancel(pid uint32) bool {
	s.mu.Lock()
	cc := s.conns[pid]
	s.mu.Unlock()
	if cc == nil {
		return false
	}
	cc.runMu.Lock()
	defer cc.runMu.Unlock()
	if cc.running == nil {
		return false
	}
	cc.running()
	return true
}

func (c *clientConn) cancelRunning() {
	c.runMu.Lock()
	defer c.runMu.Unlock()
	if c.running != nil {
		c.running()
	}
}

func (s *Server) handle(ctx context.Context, nc net.Conn) {
	cc := &clientConn{srv: s, net: nc, be: pgproto3.NewBackend(nc, nc), stmts: map[string]*prepared{}, portals: map[string]*portal{}}
	defer func() { cc.net.Close() }()
	// A client has this long to start, negotiate TLS and log in, as
	// PostgreSQL's authentication_timeout gives it.
	nc.SetDeadline(time.Now().Add(authTimeout))
	startup, err := cc.startup()
	if err != nil || startup == nil {
		if err != nil && !errors.Is(err, io.EOF) {
			s.log.Debug("startup failed", "remote", nc.RemoteAddr(), "err", err)
		}
		return
	}
	user := startup.Parameters["user"]
	if err := cc.admit(user); err != nil {
		s.log.Info("refused a client", "remote", nc.RemoteAddr(), "user", user, "err", err)
		cc.sendFatal(err)
		return
	}
	cc.net.SetDeadline(time.Time{})
	sess, err := s.engine.NewSession(ctx)
	if err != nil {
		cc.sendError(err)
		cc.be.Flush()
		return
	}
	cc.runMu.Lock()
	cc.sess, cc.user, cc.client = sess, user, nc.RemoteAddr().String()
	if app := startup.Parameters["application_name"]; app != "" {
		cc.client += " (" + app + ")"
	}
	cc.runMu.Unlock()
	defer func() {
		cc.closePortals()
		for name := range cc.stmts {
			cc.closeStatement(name)
		}
		sess.Close() // ends a read transaction's snapshot too
	}()
	cc.applyStartupParameters(startup.Parameters)
	cc.secret = make([]byte, 4) // before the cancel map can hand cc out
	rand.Read(cc.secret)
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
	cc.be.Send(&pgproto3.AuthenticationOk{})
	for _, name := range reportedParameters {
		v, _ := sess.Settings().Get(name)
		cc.be.Send(&pgproto3.ParameterStatus{Name: name, Value: v})
	}
	cc.be.Send(&pgproto3.BackendKeyData{ProcessID: cc.pid, SecretKey: cc.secret})
	cc.ready()
	if err := cc.be.Flush(); err != nil {
		return
	}
	if err := cc.loop(ctx); err != nil && !errors.Is(err, io.EOF) && !s.closed.Load() {
		s.log.Debug("client connection ended", "remote", nc.RemoteAddr(), "err", err)
	}
}

// reportedParameters are sent at start-up as PostgreSQL sends them
// (GUC_REPORT); drivers read server_version and integer_datetimes.
var reportedParameters = []string{"application_name", "client_encoding", "DateStyle", "integer_datetimes",
	"IntervalStyle", "is_superuser", "server_encoding", "server_version", "session_authorization",
	"standard_conforming_strings", "TimeZone"}

// admit checks TLS and the password before a session starts.
func (c *clientConn) admit(user string) error {
	if _, isTLS := c.net.(*tls.Conn); c.srv.opts.RequireTLS && !isTLS {
		return errTLSRequired
	}
	if user == "" {
		return fmt.Errorf("%w: no user name in the startup message", errProtocol)
	}
	return c.authenticate(user)
}

// applyStartupParameters sets what the client sent with its startup
// message (application_name, DateStyle, …) as session settings. Drivers
// send values Retina may not honour (a JVM's own TimeZone, say); those are
// kept at Retina's default and logged, rather than refusing the client:
// ParameterStatus then tells the driver the value in force.
func (c *clientConn) applyStartupParameters(params map[string]string) {
	c.sess.Settings().SetUser(params["user"])
	for name, v := range params {
		switch name {
		case "user", "database", "replication", "options":
			continue
		}
		if err := c.sess.Settings().SetDefault(name, v); err != nil {
			c.srv.log.Debug("a startup parameter was not applied", "remote", c.net.RemoteAddr(), "parameter", name, "value", v, "err", err)
		}
	}
}

// startup handles TLS negotiation and cancel requests; it returns the
// startup message of a regular session, or nil after a cancel request.
func (c *clientConn) startup() (*pgproto3.StartupMessage, error) {
	for {
		msg, err := c.be.ReceiveStartupMessage()
		if err != nil {
			return nil, err
		}
		switch m := msg.(type) {
		case *pgproto3.SSLRequest:
			if _, isTLS := c.net.(*tls.Conn); c.srv.opts.TLS == nil || isTLS {
				if _, err := c.net.Write([]byte{'N'}); err != nil {
					return nil, err
				}
				continue
			}
			if _, err := c.net.Write([]byte{'S'}); err != nil {
				return nil, err
			}
			tc := tls.Server(c.net, c.srv.opts.TLS)
			if err := tc.Handshake(); err != nil {
				return nil, fmt.Errorf("TLS handshake: %w", err)
			}
			c.net = tc
			c.be = pgproto3.NewBackend(tc, tc)
		case *pgproto3.GSSEncRequest:
			if _, err := c.net.Write([]byte{'N'}); err != nil {
				return nil, err
			}
		case *pgproto3.CancelRequest:
			c.srv.cancel(m.ProcessID, m.SecretKey)
			return nil, nil
		case *pgproto3.StartupMessage:
			return m, nil
		default:
			return nil, fmt.Errorf("unexpected startup message %T", msg)
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
	switch {
	case c.sess != nil && c.sess.Failed():
		status = 'E'
	case c.sess != nil && c.sess.InTransaction():
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
				c.closeStatement(m.Name)
			} else {
				c.closePortal(m.Name)
			}
			c.be.Send(&pgproto3.CloseComplete{})
		case *pgproto3.Sync:
			if !c.sess.InTransaction() {
				c.closePortals() // the implicit transaction ends, and its portals with it
			}
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

// authTimeout bounds the start of a session (PostgreSQL's
// authentication_timeout default).
const authTimeout = time.Minute

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

// run executes one statement with cancellation wired to cancel requests
// and statement_timeout.
func (c *clientConn) run(ctx context.Context, st *query.Statement, args []any) (*query.Result, context.CancelFunc, error) {
	var (
		rctx   context.Context
		cancel context.CancelFunc
	)
	if d := c.sess.Settings().Duration("statement_timeout"); d > 0 {
		rctx, cancel = context.WithTimeoutCause(ctx, d, errStatementTimeout)
	} else {
		rctx, cancel = context.WithCancel(ctx)
	}
	c.runMu.Lock()
	c.running = cancel
	c.query, c.started = st.Text, time.Now()
	c.runMu.Unlock()
	res, err := c.sess.Execute(rctx, st, args)
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
	texts := query.SplitStatements(text)
	if len(texts) == 0 {
		c.be.Send(&pgproto3.EmptyQueryResponse{})
		return
	}
	for _, q := range texts {
		if err := c.simpleStatement(ctx, q); err != nil {
			c.sendError(err)
			return
		}
	}
}

func (c *clientConn) simpleStatement(ctx context.Context, text string) error {
	st, err := c.sess.Prepare(ctx, text)
	if err != nil {
		return err
	}
	defer st.Close()
	if st.Empty() {
		c.be.Send(&pgproto3.EmptyQueryResponse{})
		return nil
	}
	res, cancel, err := c.run(ctx, st, nil)
	if err != nil {
		return err
	}
	defer c.clearRunning(cancel)
	defer res.Close()
	if res.Tag == "COMMIT" || res.Tag == "ROLLBACK" {
		c.closePortals() // a transaction's portals end with it
	}
	if st.Copy != nil {
		return c.sendCopy(res, *st.Copy)
	}
	if res.Columns != nil {
		c.be.Send(rowDescription(res.Columns, nil))
	}
	_, err = c.sendRows(res, nil, 0)
	return err
}

// sendCopy streams a result as COPY … TO STDOUT does: CopyOutResponse,
// one CopyData per row, CopyDone, and the tag COPY n.
func (c *clientConn) sendCopy(res *query.Result, out query.CopyOut) error {
	c.be.Send(&pgproto3.CopyOutResponse{OverallFormat: 0, ColumnFormatCodes: make([]uint16, len(res.Columns))})
	vals := make([][]byte, len(res.Columns))
	var line []byte
	if out.Header {
		for i, col := range res.Columns {
			vals[i] = []byte(col.Name)
		}
		line = out.AppendCopyRow(line[:0], vals)
		c.be.Send(&pgproto3.CopyData{Data: line})
	}
	n := 0
	for res.Next() {
		row, err := res.Values()
		if err != nil {
			return err
		}
		for i, v := range row {
			vals[i] = encodeText(v, oidOf(res.Columns[i].Type))
		}
		line = out.AppendCopyRow(nil, vals)
		c.be.Send(&pgproto3.CopyData{Data: line})
		n++
	}
	if err := res.Err(); err != nil {
		return err
	}
	c.be.Send(&pgproto3.CopyDone{})
	c.be.Send(&pgproto3.CommandComplete{CommandTag: fmt.Appendf(nil, "COPY %d", n)})
	return nil
}

// sendRows streams up to max rows of a result (all for 0) and, when the
// result ends, its command tag. It reports whether rows remain.
func (c *clientConn) sendRows(res *query.Result, formats []int16, max int) (more bool, err error) {
	if res.Columns == nil {
		c.be.Send(&pgproto3.CommandComplete{CommandTag: []byte(res.Tag)})
		return false, nil
	}
	sent := 0
	for {
		if max > 0 && sent == max {
			c.be.Send(&pgproto3.PortalSuspended{})
			return true, nil
		}
		if !res.Next() {
			break
		}
		vals, err := res.Values()
		if err != nil {
			return false, err
		}
		row := make([][]byte, len(vals))
		for i, v := range vals {
			oid := oidOf(res.Columns[i].Type)
			if formatFor(formats, i) == 1 {
				if row[i], err = encodeBinary(v, oid); err != nil {
					return false, fmt.Errorf("column %q: %w", res.Columns[i].Name, err)
				}
			} else {
				row[i] = encodeText(v, oid)
			}
		}
		c.be.Send(&pgproto3.DataRow{Values: row})
		sent++
	}
	if err := res.Err(); err != nil {
		return false, err
	}
	tag := []byte(res.Tag)
	if res.Tag == "SELECT" || res.Tag == "FETCH" { // PostgreSQL counts this Execute's rows, not for SHOW
		tag = fmt.Appendf(nil, "%s %d", res.Tag, sent)
	}
	c.be.Send(&pgproto3.CommandComplete{CommandTag: tag})
	return false, nil
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

func rowDescription(cols []query.Column, formats []int16) *pgproto3.RowDescription {
	rd := &pgproto3.RowDescription{}
	for i, col := range cols {
		rd.Fields = append(rd.Fields, pgproto3.FieldDescription{
			Name: []byte(col.Name), DataTypeOID: oidOf(col.Type), DataTypeSize: typeSize(col.Type),
			TypeModifier: typeModifier(col.Type), Format: formatFor(formats, i),
		})
	}
	return rd
}

// parse prepares a statement once; Bind and Execute reuse the plan.
func (c *clientConn) parse(ctx context.Context, m *pgproto3.Parse) error {
	st, err := c.sess.Prepare(ctx, m.Query)
	if err != nil {
		return err
	}
	if len(m.ParameterOIDs) > len(st.Params) {
		st.Close()
		return fmt.Errorf("%w: %d parameter types for a statement with %d placeholders", errProtocol, len(m.ParameterOIDs), len(st.Params))
	}
	p := &prepared{stmt: st, paramOIDs: make([]uint32, len(st.Params))}
	for i, t := range st.Params {
		p.paramOIDs[i] = oidOf(t)
		if i < len(m.ParameterOIDs) && m.ParameterOIDs[i] != 0 {
			p.paramOIDs[i] = m.ParameterOIDs[i]
		}
	}
	if _, exists := c.stmts[m.Name]; exists && m.Name != "" {
		st.Close()
		return fmt.Errorf("%w: prepared statement %q already exists", errDuplicate, m.Name)
	}
	c.closeStatement(m.Name) // the unnamed statement is replaced
	c.stmts[m.Name] = p
	return nil
}

func (c *clientConn) closeStatement(name string) {
	if p, ok := c.stmts[name]; ok {
		p.stmt.Close()
		delete(c.stmts, name)
	}
}

func (c *clientConn) closePortal(name string) {
	if pt, ok := c.portals[name]; ok {
		pt.close()
		delete(c.portals, name)
	}
}

func (c *clientConn) closePortals() { c.closePortalsExcept(nil) }

func (c *clientConn) closePortalsExcept(keep *portal) {
	for name, pt := range c.portals {
		if pt != keep {
			c.closePortal(name)
		}
	}
}

// completedTag is the tag of a portal Executed again after it finished.
func completedTag(st *query.Statement) string {
	switch {
	case st.Copy != nil:
		return "COPY 0"
	case st.Columns != nil:
		return "SELECT 0"
	}
	return ""
}

func (c *clientConn) bind(m *pgproto3.Bind) error {
	p, ok := c.stmts[m.PreparedStatement]
	if !ok {
		return fmt.Errorf("%w: prepared statement %q does not exist", errUndefined, m.PreparedStatement)
	}
	if len(m.Parameters) != len(p.paramOIDs) {
		return fmt.Errorf("%w: %d parameters for %d placeholders", errProtocol, len(m.Parameters), len(p.paramOIDs))
	}
	for _, codes := range [][]int16{m.ParameterFormatCodes, m.ResultFormatCodes} {
		for _, f := range codes {
			if f != 0 && f != 1 {
				return fmt.Errorf("%w: format code %d (0 is text, 1 binary)", errProtocol, f)
			}
		}
	}
	args := make([]any, len(m.Parameters))
	for i, raw := range m.Parameters {
		v, err := decodeParam(raw, p.paramOIDs[i], formatFor(m.ParameterFormatCodes, i))
		if err != nil {
			return fmt.Errorf("%w: parameter $%d: %w", errBadParam, i+1, err)
		}
		args[i] = v
	}
	c.closePortal(m.DestinationPortal)
	c.portals[m.DestinationPortal] = &portal{stmt: p, args: args, formats: append([]int16(nil), m.ResultFormatCodes...)}
	return nil
}

var (
	errUndefined = errors.New("pgwire: undefined object")
	errNoPortal  = errors.New("pgwire: undefined portal")
	errDuplicate = errors.New("pgwire: duplicate prepared statement")
	errBadParam  = errors.New("pgwire: invalid parameter value")
)

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
			return fmt.Errorf("%w: portal %q does not exist", errNoPortal, m.Name)
		}
		p, formats = pt.stmt, pt.formats
	}
	if p.stmt.Columns == nil || p.stmt.Copy != nil {
		c.be.Send(&pgproto3.NoData{})
		return nil
	}
	c.be.Send(rowDescription(p.stmt.Columns, formats))
	return nil
}

// execute runs a portal, or resumes a suspended one, sending at most
// MaxRows rows (all for 0).
func (c *clientConn) execute(ctx context.Context, m *pgproto3.Execute) error {
	pt, ok := c.portals[m.Portal]
	if !ok {
		return fmt.Errorf("%w: portal %q does not exist", errNoPortal, m.Portal)
	}
	if pt.stmt.stmt.Empty() {
		c.be.Send(&pgproto3.EmptyQueryResponse{})
		return nil
	}
	if pt.done {
		// PostgreSQL runs a portal once; another Execute finds it spent.
		c.be.Send(&pgproto3.CommandComplete{CommandTag: []byte(completedTag(pt.stmt.stmt))})
		return nil
	}
	if pt.res == nil {
		res, cancel, err := c.run(ctx, pt.stmt.stmt, pt.args)
		if err != nil {
			pt.done = true
			return err
		}
		c.clearRunning(cancel)
		pt.res = res
		if res.Tag == "COMMIT" || res.Tag == "ROLLBACK" {
			c.closePortalsExcept(pt) // a transaction's portals end with it
		}
	}
	if pt.stmt.stmt.Copy != nil {
		err := c.sendCopy(pt.res, *pt.stmt.stmt.Copy)
		pt.close()
		pt.done = true
		return err
	}
	more, err := c.sendRows(pt.res, pt.formats, int(m.MaxRows))
	if err != nil || !more {
		pt.close()
		pt.done = true
	}
	return err
}

// sendError reports err with a SQLSTATE; it fails the transaction in
// progress, if any.
func (c *clientConn) sendError(err error) {
	if c.sess != nil {
		c.sess.Fail()
	}
	c.be.Send(&pgproto3.ErrorResponse{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: sqlState(err), Message: err.Error()})
}

// sendFatal reports an error that ends the connection.
func (c *clientConn) sendFatal(err error) {
	c.be.Send(&pgproto3.ErrorResponse{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: sqlState(err), Message: err.Error()})
	c.be.Flush()
}

// sqlState maps errors to PostgreSQL error codes.
func sqlState(err error) string {
	switch {
	case errors.Is(err, errStatementTimeout):
		return "57014" // query_canceled
	case errors.Is(err, errUndefined):
		return "26000" // invalid_sql_statement_name
	case errors.Is(err, errNoPortal):
		return "34000" // invalid_cursor_name
	case errors.Is(err, errDuplicate):
		return "42P05" // duplicate_prepared_statement
	case errors.Is(err, errBadParam):
		return "22P02" // invalid_text_representation
	case errors.Is(err, errProtocol):
		return "08P01" // protocol_violation
	case errors.Is(err, errAuth):
		return "28P01" // invalid_password
	case errors.Is(err, errTLSRequired):
		return "28000" // invalid_authorization_specification
	}
	return query.SQLState(err)
}
