package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// child is a `retina serve` process the crash benchmark starts and kills.
type child struct {
	cmd     *exec.Cmd
	started time.Time
	sqlAddr string
	httpURL string
	exited  chan struct{} // closed once the process is reaped
	exitErr error         // how it ended, set before exited closes
	serving chan struct{}
	// mysqlAddr is the OLTP endpoint of a child started with --mysql-addr,
	// set before mysql closes.
	mysqlAddr string
	mysql     chan struct{}
}

var (
	servingLine = regexp.MustCompile(`retina serving: SQL on (\S+) .*metrics on (http://\S+)/metrics`)
	mysqlLine   = regexp.MustCompile(`retina serving: OLTP writes over MySQL protocol on (\S+) `)
)

// startChild runs the retina command with args; its stderr goes to log.
func startChild(command []string, env []string, args []string, log io.Writer) (*child, error) {
	cmd := exec.Command(command[0], append(append([]string{}, command[1:]...), args...)...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = log
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, exited: make(chan struct{}), serving: make(chan struct{}), mysql: make(chan struct{})}
	c.started = time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", command[0], err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := servingLine.FindStringSubmatch(sc.Text()); m != nil && c.sqlAddr == "" {
				c.sqlAddr, c.httpURL = m[1], m[2]
				close(c.serving)
			}
			if m := mysqlLine.FindStringSubmatch(sc.Text()); m != nil && c.mysqlAddr == "" {
				c.mysqlAddr = m[1]
				close(c.mysql)
			}
		}
		c.exitErr = cmd.Wait()
		close(c.exited)
	}()
	return c, nil
}

// waitServing waits until the child serves, exits, or the timeout passes.
func (c *child) waitServing(timeout time.Duration) error {
	select {
	case <-c.serving:
		return nil
	case <-c.exited:
		return fmt.Errorf("exited before serving: %v", c.exitErr)
	case <-time.After(timeout):
		return fmt.Errorf("not serving after %s", timeout)
	}
}

// waitMySQL waits until the child serves its MySQL endpoint.
func (c *child) waitMySQL(timeout time.Duration) error {
	select {
	case <-c.mysql:
		return nil
	case <-c.exited:
		return fmt.Errorf("exited before serving MySQL: %v", c.exitErr)
	case <-time.After(timeout):
		return fmt.Errorf("not serving MySQL after %s", timeout)
	}
}

// kill stops the child with SIGKILL, as a power cut would, and waits.
func (c *child) kill() {
	c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.exited
}

// stop stops the child with SIGTERM and waits for its clean exit.
func (c *child) stop(timeout time.Duration) error {
	c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
		return c.exitErr
	case <-time.After(timeout):
		c.kill()
		return fmt.Errorf("no clean stop within %s", timeout)
	}
}

// alive reports whether the child still runs.
func (c *child) alive() bool {
	select {
	case <-c.exited:
		return false
	default:
		return true
	}
}

// metric reads one sample of the child's Prometheus endpoint.
func (c *child) metric(name string) (float64, error) {
	cl := http.Client{Timeout: 5 * time.Second}
	resp, err := cl.Get(c.httpURL + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, fmt.Errorf("metric %s missing", name)
}

// connect opens a SQL connection to the child.
func (c *child) connect(ctx context.Context) (*pgx.Conn, error) {
	return pgx.Connect(ctx, "postgres://retina@"+c.sqlAddr+"/retina?sslmode=disable")
}

// logTail is the end of a child's log, for an error message.
func logTail(path string) string {
	data, _ := os.ReadFile(path)
	if len(data) > 3000 {
		data = data[len(data)-3000:]
	}
	return string(data)
}

// childRun fills in the retina command (default: this executable) and the
// work directory (default: a temporary one, removed by the returned
// cleanup).
func childRun(command []string, dir, prefix string) ([]string, string, func(), error) {
	if len(command) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return nil, "", nil, err
		}
		command = []string{exe}
	}
	if dir != "" {
		return command, dir, func() {}, os.MkdirAll(dir, 0o755)
	}
	tmp, err := os.MkdirTemp("", prefix)
	if err != nil {
		return nil, "", nil, err
	}
	return command, tmp, func() { os.RemoveAll(tmp) }, nil
}
