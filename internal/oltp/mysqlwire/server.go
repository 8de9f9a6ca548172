// Package mysqlwire serves the MySQL wire protocol over the SQL engine of
// package sqlexec, using vitess's MySQL server for the protocol itself
// (handshake, authentication, text and binary protocols, prepared
// statements). One connection is one sqlexec session.
package mysqlwire

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"vitess.io/vitess/go/mysql"
	"vitess.io/vitess/go/mysql/replication"
	"vitess.io/vitess/go/mysql/sqlerror"
	"vitess.io/vitess/go/sqltypes"
	querypb "vitess.io/vitess/go/vt/proto/query"
	"vitess.io/vitess/go/vt/vtenv"

	"github.com/retinadb/retina/internal/oltp/sqlexec"
)

// Config configures a server.
type Config struct {
	// Addr is host:port to listen on (127.0.0.1:3306 by default).
	Addr string
	// UsersFile, if set, is a JSON file of users and passwords in vitess's
	// static format ({"user": [{"Password": "…"}]}); otherwise user root
	// with an empty password is the only user.
	UsersFile string
	Logger    *slog.Logger
}

// Server is a MySQL-protocol listener.
type Server struct {
	mysql.UnimplementedHandler
	eng      *sqlexec.Engine
	listener *mysql.Listener
	log      *slog.Logger
	ctx      context.Context
	cancel   context.CancelFunc

	mu    sync.Mutex
	conns map[*mysql.Conn]struct{}
	open  sync.WaitGroup // connections whose session is not yet closed
}

// Listen binds the address; Serve accepts connections.
func Listen(eng *sqlexec.Engine, cfg Config) (*Server, error) {
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:3306"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	var auth mysql.AuthServer
	if cfg.UsersFile != "" {
		b, err := os.ReadFile(cfg.UsersFile)
		if err != nil {
			return nil, fmt.Errorf("mysql users file %s: %w", cfg.UsersFile, err)
		}
		var check map[string][]map[string]any
		if err := json.Unmarshal(b, &check); err != nil {
			return nil, fmt.Errorf("mysql users file %s: not a JSON object of users: %w", cfg.UsersFile, err)
		}
		auth = mysql.NewAuthServerStatic(cfg.UsersFile, "", 0)
	} else {
		auth = mysql.NewAuthServerStatic("", `{"root": [{"Password": ""}]}`, 0)
	}
	s := &Server{eng: eng, log: cfg.Logger, conns: make(map[*mysql.Conn]struct{})}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	l, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("mysql listener on %s: %w (is another server using the port? choose one with --mysql-addr)", cfg.Addr, err)
	}
	ml, err := mysql.NewListenerWithConfig(mysql.ListenerConfig{
		Listener:            l,
		AuthServer:          auth,
		Handler:             s,
		ConnReadBufferSize:  16 << 10,
		ConnKeepAlivePeriod: 30 * time.Second,
	})
	if err != nil {
		l.Close()
		return nil, fmt.Errorf("mysql listener on %s: %w", cfg.Addr, err)
	}
	s.listener = ml
	return s, nil
}

// Addr is the bound address.
func (s *Server) Addr() net.Addr { return s.listener.Addr() }

// Serve accepts connections until Close.
func (s *Server) Serve() { s.listener.Accept() }

// Close stops accepting, cancels running statements, closes every
// connection and returns once each connection's transaction is rolled back,
// so the store can be closed next.
func (s *Server) Close() {
	s.listener.Close()
	s.cancel()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.open.Wait()
}

func session(c *mysql.Conn) *sqlexec.Session {
	sess, _ := c.ClientData.(*sqlexec.Session)
	return sess
}

// NewConnection implements mysql.Handler.
func (s *Server) NewConnection(c *mysql.Conn) {
	s.open.Add(1)
	s.mu.Lock()
	s.conns[c] = struct{}{}
	s.mu.Unlock()
	c.ClientData = s.eng.NewSession()
	c.StatusFlags |= mysql.ServerStatusAutocommit
}

// ConnectionClosed implements mysql.Handler: an open transaction rolls back.
func (s *Server) ConnectionClosed(c *mysql.Conn) {
	if sess := session(c); sess != nil {
		sess.Close()
	}
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	s.open.Done()
}

// ComResetConnection implements mysql.Handler.
func (s *Server) ComResetConnection(c *mysql.Conn) {
	if sess := session(c); sess != nil {
		sess.Close()
	}
	c.ClientData = s.eng.NewSession()
	c.StatusFlags |= mysql.ServerStatusAutocommit
}

func (s *Server) status(c *mysql.Conn, sess *sqlexec.Session) {
	c.StatusFlags &^= mysql.ServerStatusAutocommit | mysql.ServerStatusInTrans
	if sess.Autocommit() {
		c.StatusFlags |= mysql.ServerStatusAutocommit
	}
	if sess.InTransaction() {
		c.StatusFlags |= mysql.ServerStatusInTrans
	}
}

// ComQuery implements mysql.Handler.
func (s *Server) ComQuery(c *mysql.Conn, query string, callback func(*sqltypes.Result) error) error {
	return s.execute(c, query, nil, callback)
}

// ComQueryMulti implements mysql.Handler (the listener does not enable
// multi-query mode, so vitess splits statements itself).
func (s *Server) ComQueryMulti(c *mysql.Conn, sql string, callback func(qr sqltypes.QueryResponse, more bool, firstPacket bool) error) error {
	return s.execute(c, sql, nil, func(r *sqltypes.Result) error {
		return callback(sqltypes.QueryResponse{QueryResult: r}, false, true)
	})
}

func (s *Server) execute(c *mysql.Conn, query string, bind map[string]*querypb.BindVariable, callback func(*sqltypes.Result) error) error {
	sess := session(c)
	if sess == nil {
		return sqlerror.NewSQLError(sqlerror.ERUnknownError, sqlerror.SSUnknownSQLState, "connection has no session")
	}
	res, err := sess.Execute(s.ctx, query, bind)
	s.status(c, sess)
	if err != nil {
		s.log.Debug("mysql: statement failed", "conn", c.ConnectionID, "err", err)
		return err
	}
	return callback(res)
}

// ComPrepare implements mysql.Handler: the statement is parsed and its
// placeholders counted; columns are described when it runs.
func (s *Server) ComPrepare(c *mysql.Conn, query string) ([]*querypb.Field, uint16, error) {
	sess := session(c)
	if sess == nil {
		return nil, 0, sqlerror.NewSQLError(sqlerror.ERUnknownError, sqlerror.SSUnknownSQLState, "connection has no session")
	}
	_, n, err := sess.Parse(query)
	if err != nil {
		var se *sqlexec.Error
		if errors.As(err, &se) {
			return nil, 0, sqlerror.NewSQLError(se.Code, sqlerror.SSClientError, se.Msg)
		}
		return nil, 0, err
	}
	return nil, uint16(n), nil
}

// ComStmtExecute implements mysql.Handler.
func (s *Server) ComStmtExecute(c *mysql.Conn, prepare *mysql.PrepareData, callback func(*sqltypes.Result) error) error {
	return s.execute(c, prepare.PrepareStmt, prepare.BindVars, callback)
}

// ComRegisterReplica implements mysql.Handler: replication is not served.
func (s *Server) ComRegisterReplica(*mysql.Conn, string, uint16, string, string) error {
	return sqlerror.NewSQLError(sqlerror.ERNotSupportedYet, sqlerror.SSUnknownSQLState, "replication is not supported")
}

// ComBinlogDump implements mysql.Handler.
func (s *Server) ComBinlogDump(*mysql.Conn, string, uint32) error {
	return sqlerror.NewSQLError(sqlerror.ERNotSupportedYet, sqlerror.SSUnknownSQLState, "binlog streaming is not supported")
}

// ComBinlogDumpGTID implements mysql.Handler.
func (s *Server) ComBinlogDumpGTID(*mysql.Conn, string, uint64, replication.GTIDSet, uint16) error {
	return sqlerror.NewSQLError(sqlerror.ERNotSupportedYet, sqlerror.SSUnknownSQLState, "binlog streaming is not supported")
}

// WarningCount implements mysql.Handler.
func (s *Server) WarningCount(*mysql.Conn) uint16 { return 0 }

// Env implements mysql.Handler.
func (s *Server) Env() *vtenv.Environment { return s.eng.Env() }
