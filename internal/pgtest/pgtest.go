// Package pgtest runs a private PostgreSQL cluster on loopback for tests
// and benchmarks: initdb in a temporary directory, wal_level=logical, a
// free port, stopped and removed by Stop. It uses the server binaries of
// Debian's postgresql package (or any pg_ctl on PATH); as root it runs
// them as the postgres user, since PostgreSQL refuses to run as root.
package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// ErrNotInstalled is returned when no PostgreSQL server binaries are found.
var ErrNotInstalled = errors.New("pgtest: PostgreSQL server binaries not found: install Debian's postgresql package (.ci/install does)")

// Options tune the cluster.
type Options struct {
	// Durable keeps fsync on (benchmarks); tests run without it.
	Durable bool
	// Settings are extra postgresql.conf lines.
	Settings []string
}

// Cluster is one running private PostgreSQL server.
type Cluster struct {
	Bin  string // directory of the server binaries
	Dir  string // data directory
	Port int
	// User is the superuser every test connects as (trust auth on loopback).
	User string
	run  *user.User // the OS user the server runs as, nil for ourselves
	root string     // the directory to remove
}

// Find locates the server binaries.
func Find() (string, error) {
	if dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin"); len(dirs) > 0 {
		sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
		for _, d := range dirs {
			if _, err := os.Stat(filepath.Join(d, "pg_ctl")); err == nil {
				return d, nil
			}
		}
	}
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", ErrNotInstalled
}

func version(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

// Start creates and starts a cluster.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	bin, err := Find()
	if err != nil {
		return nil, err
	}
	root, err := os.MkdirTemp("", "retina-pg-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	c := &Cluster{Bin: bin, Dir: filepath.Join(root, "data"), User: "retina", root: root}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(root)
		}
	}()
	if os.Geteuid() == 0 {
		if c.run, err = user.Lookup("postgres"); err != nil {
			return nil, fmt.Errorf("pgtest: running as root needs the postgres user (Debian's postgresql package creates it): %w", err)
		}
		uid, _ := strconv.Atoi(c.run.Uid)
		gid, _ := strconv.Atoi(c.run.Gid)
		if err := os.Chown(root, uid, gid); err != nil {
			return nil, fmt.Errorf("pgtest: %w", err)
		}
	}
	if out, err := c.cmd(ctx, "initdb", "-D", c.Dir, "-U", c.User, "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("pgtest: initdb: %w\n%s", err, out)
	}
	if c.Port, err = freePort(); err != nil {
		return nil, err
	}
	conf := []string{
		"listen_addresses = '127.0.0.1'",
		fmt.Sprintf("port = %d", c.Port),
		fmt.Sprintf("unix_socket_directories = '%s'", root),
		"wal_level = logical",
		"max_replication_slots = 16",
		"max_wal_senders = 16",
		"max_connections = 60",
		"shared_buffers = 128MB",
		"log_min_messages = warning",
	}
	if !opts.Durable {
		conf = append(conf, "fsync = off", "full_page_writes = off")
	}
	conf = append(conf, opts.Settings...)
	f, err := os.OpenFile(filepath.Join(c.Dir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	_, err = f.WriteString("\n" + strings.Join(conf, "\n") + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("pgtest: postgresql.conf: %w", err)
	}
	if err := c.Start(ctx); err != nil {
		return nil, err
	}
	ok = true
	return c, nil
}

// cmd runs one of the server binaries as the server's OS user.
func (c *Cluster) cmd(ctx context.Context, name string, args ...string) *exec.Cmd {
	path := filepath.Join(c.Bin, name)
	if c.run != nil {
		return exec.CommandContext(ctx, "runuser", append([]string{"-u", c.run.Username, "--", path}, args...)...)
	}
	return exec.CommandContext(ctx, path, args...)
}

// Start starts the (stopped) server and waits until it accepts connections.
func (c *Cluster) Start(ctx context.Context) error {
	log := filepath.Join(c.root, "server.log")
	if out, err := c.cmd(ctx, "pg_ctl", "start", "-w", "-t", "60", "-D", c.Dir, "-l", log).CombinedOutput(); err != nil {
		tail, _ := os.ReadFile(log)
		return fmt.Errorf("pgtest: pg_ctl start: %w\n%s\n%s", err, out, lastLines(tail, 20))
	}
	return nil
}

// Stop stops the server (fast shutdown), or kills it with immediate.
func (c *Cluster) Stop(ctx context.Context, immediate bool) error {
	mode := "fast"
	if immediate {
		mode = "immediate"
	}
	if out, err := c.cmd(ctx, "pg_ctl", "stop", "-w", "-t", "60", "-m", mode, "-D", c.Dir).CombinedOutput(); err != nil {
		return fmt.Errorf("pgtest: pg_ctl stop: %w\n%s", err, out)
	}
	return nil
}

// Close stops the server and removes its files.
func (c *Cluster) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := c.Stop(ctx, false)
	if rerr := os.RemoveAll(c.root); err == nil {
		err = rerr
	}
	return err
}

// DSN is a connection URI for database db as the superuser.
func (c *Cluster) DSN(db string) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", c.User, c.Port, db)
}

// Run runs a client program of the server's installation (psql, pgbench)
// against database db and returns its output.
func (c *Cluster) Run(ctx context.Context, db, name string, args ...string) ([]byte, error) {
	full := append([]string{"-h", "127.0.0.1", "-p", strconv.Itoa(c.Port), "-U", c.User}, args...)
	full = append(full, db)
	cmd := exec.CommandContext(ctx, filepath.Join(c.Bin, name), full...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		return out.Bytes(), fmt.Errorf("pgtest: %s: %w\n%s", name, err, lastLines(out.Bytes(), 20))
	}
	return out.Bytes(), nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgtest: find a free port: %w", err)
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
