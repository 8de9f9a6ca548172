// Package mysqltest runs a private MariaDB server on loopback for tests and
// benchmarks: mariadb-install-db in a temporary directory, the binary log
// on in ROW format with full row images and full metadata (what the MySQL
// source needs), a free port, stopped and removed by Close. It uses the
// binaries of Debian's mariadb-server package; as root it runs the server
// as the mysql user.
package mysqltest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-mysql-org/go-mysql/client"
)

// ErrNotInstalled is returned when the MariaDB server binaries are missing.
var ErrNotInstalled = errors.New("mysqltest: MariaDB server binaries (mariadbd, mariadb-install-db) not found: install Debian's mariadb-server package (.ci/install does)")

// Options tune the server.
type Options struct {
	// Durable keeps the redo log and binary log synced at every commit
	// (benchmarks); tests run without.
	Durable bool
	// Settings are extra server options (--name=value).
	Settings []string
}

// Server is one running private MariaDB server.
type Server struct {
	Port int
	// User is the account every test connects as: root over TCP, no
	// password, on loopback only.
	User string
	root string // the directory to remove
	data string
	opts Options
	cmd  *exec.Cmd
	done chan error
	run  *user.User
}

func find(names ...string) (string, error) {
	for _, n := range names {
		if p, err := exec.LookPath(n); err == nil {
			return p, nil
		}
		for _, dir := range []string{"/usr/sbin", "/usr/bin"} {
			if p := filepath.Join(dir, n); isFile(p) {
				return p, nil
			}
		}
	}
	return "", ErrNotInstalled
}

func isFile(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}

// Installed tells whether the server binaries are there.
func Installed() error {
	if _, err := find("mariadbd", "mysqld"); err != nil {
		return err
	}
	_, err := find("mariadb-install-db", "mysql_install_db")
	return err
}

// Start creates a data directory and starts a server on it.
func Start(ctx context.Context, opts Options) (*Server, error) {
	install, err := find("mariadb-install-db", "mysql_install_db")
	if err != nil {
		return nil, err
	}
	root, err := os.MkdirTemp("", "retina-mariadb-")
	if err != nil {
		return nil, fmt.Errorf("mysqltest: %w", err)
	}
	s := &Server{User: "root", root: root, data: filepath.Join(root, "data"), opts: opts}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(root)
		}
	}()
	args := []string{"--no-defaults", "--datadir=" + s.data, "--auth-root-authentication-method=normal", "--skip-test-db"}
	if os.Geteuid() == 0 {
		if s.run, err = user.Lookup("mysql"); err != nil {
			return nil, fmt.Errorf("mysqltest: running as root needs the mysql user (Debian's mariadb-server package creates it): %w", err)
		}
		uid, _ := strconv.Atoi(s.run.Uid)
		gid, _ := strconv.Atoi(s.run.Gid)
		if err := os.Chown(root, uid, gid); err != nil {
			return nil, fmt.Errorf("mysqltest: %w", err)
		}
		args = append(args, "--user=mysql")
	}
	if out, err := exec.CommandContext(ctx, install, args...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("mysqltest: %s: %w\n%s", filepath.Base(install), err, lastLines(out, 20))
	}
	if err := s.Start(ctx); err != nil {
		return nil, err
	}
	ok = true
	return s, nil
}

// Start starts the (stopped) server and waits until it accepts
// connections: on a free port the first time, on the same port after Stop.
func (s *Server) Start(ctx context.Context) error {
	bin, err := find("mariadbd", "mysqld")
	if err != nil {
		return err
	}
	if s.Port == 0 {
		if s.Port, err = freePort(); err != nil {
			return err
		}
	}
	flush := "2"
	syncBinlog := "0"
	if s.opts.Durable {
		flush, syncBinlog = "1", "1"
	}
	args := []string{"--no-defaults", "--datadir=" + s.data, "--socket=" + filepath.Join(s.root, "sock"),
		"--port=" + strconv.Itoa(s.Port), "--bind-address=127.0.0.1", "--skip-name-resolve",
		"--pid-file=" + filepath.Join(s.root, "pid"), "--log-error=" + filepath.Join(s.root, "server.log"),
		"--log-bin=binlog", "--server-id=1", "--binlog-format=ROW", "--binlog-row-image=FULL", "--binlog-row-metadata=FULL",
		"--innodb-flush-log-at-trx-commit=" + flush, "--sync-binlog=" + syncBinlog,
		"--innodb-buffer-pool-size=256M", "--max-connections=200", "--character-set-server=utf8mb4", "--collation-server=utf8mb4_general_ci"}
	if s.run != nil {
		args = append(args, "--user=mysql")
	}
	args = append(args, s.opts.Settings...)
	s.cmd = exec.Command(bin, args...)
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("mysqltest: start %s: %w", bin, err)
	}
	s.done = make(chan error, 1)
	go func() { s.done <- s.cmd.Wait() }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		c, err := s.Connect("")
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case werr := <-s.done:
			log, _ := os.ReadFile(filepath.Join(s.root, "server.log"))
			return fmt.Errorf("mysqltest: mariadbd exited: %v\n%s", werr, lastLines(log, 20))
		case <-ctx.Done():
			s.kill()
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.kill()
			log, _ := os.ReadFile(filepath.Join(s.root, "server.log"))
			return fmt.Errorf("mysqltest: mariadbd did not accept connections within a minute: %v\n%s", err, lastLines(log, 20))
		}
	}
}

func (s *Server) kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		s.cmd.Process.Kill()
		<-s.done
		s.cmd = nil
	}
}

// Stop shuts the server down cleanly.
func (s *Server) Stop() error {
	if s.cmd == nil {
		return nil
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(60 * time.Second):
		s.cmd.Process.Kill()
		<-s.done
	}
	s.cmd = nil
	return nil
}

// Close stops the server and removes its files.
func (s *Server) Close() error {
	err := s.Stop()
	if rerr := os.RemoveAll(s.root); err == nil {
		err = rerr
	}
	return err
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port)) }

// URI is the Retina source URI of database db (with extra query
// parameters, "" for none).
func (s *Server) URI(db, query string) string {
	u := fmt.Sprintf("mysql://%s@%s/%s", s.User, s.Addr(), db)
	if query != "" {
		u += "?" + query
	}
	return u
}

// DSN is a go-sql-driver/mysql data source name for database db.
func (s *Server) DSN(db string) string {
	return fmt.Sprintf("%s@tcp(%s)/%s?parseTime=false&multiStatements=true", s.User, s.Addr(), db)
}

// Connect opens a client connection to database db ("" for none).
func (s *Server) Connect(db string) (*client.Conn, error) {
	return client.ConnectWithTimeout(s.Addr(), s.User, "", db, 5*time.Second)
}

// Exec runs statements in database db ("" for none), in order.
func (s *Server) Exec(db string, stmts ...string) error {
	c, err := s.Connect(db)
	if err != nil {
		return fmt.Errorf("mysqltest: connect: %w", err)
	}
	defer c.Close()
	for _, q := range stmts {
		if _, err := c.Execute(q); err != nil {
			return fmt.Errorf("mysqltest: %.200s: %w", q, err)
		}
	}
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("mysqltest: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
