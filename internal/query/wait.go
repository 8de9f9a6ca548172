package query

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"time"
)

// SourceWaiter waits for the change sources: WaitLSN returns once every
// PostgreSQL commit that starts before lsn is visible to query snapshots
// taken after it returns; WaitMySQL once every MySQL or MariaDB
// transaction up to a binlog position (a GTID set, or FILE:OFFSET) is.
type SourceWaiter interface {
	WaitLSN(ctx context.Context, lsn uint64) error
	WaitMySQL(ctx context.Context, pos string) error
}

// ErrNoWaiter is returned by retina_wait_lsn when no source can answer it.
var ErrNoWaiter = errors.New("retina_wait_lsn: this server has no PostgreSQL source")

// ErrNoMySQLWaiter is returned by retina_wait_mysql when no source can
// answer it.
var ErrNoMySQLWaiter = errors.New("retina_wait_mysql: this server has no MySQL or MariaDB source")

// defaultWaitTimeout bounds retina_wait_lsn without a timeout argument.
const defaultWaitTimeout = time.Minute

// waitStmt is SELECT retina_wait_lsn('X/Y' [, seconds]).
var waitStmt = regexp.MustCompile(`(?is)^\s*select\s+retina_wait_lsn\s*\(\s*'([0-9a-f]{1,8})/([0-9a-f]{1,8})'\s*(?:,\s*([0-9]+(?:\.[0-9]*)?)\s*)?\)\s*;?\s*$`)

// waitMySQLStmt is SELECT retina_wait_mysql('position' [, seconds]).
var waitMySQLStmt = regexp.MustCompile(`(?is)^\s*select\s+retina_wait_mysql\s*\(\s*'([^'\\]*)'\s*(?:,\s*([0-9]+(?:\.[0-9]*)?)\s*)?\)\s*;?\s*$`)

// waitCall is a parsed retina_wait_lsn or retina_wait_mysql call.
type waitCall struct {
	lsn     uint64
	mysql   string // the binlog position, for retina_wait_mysql
	isMySQL bool
	timeout time.Duration
}

func parseWait(stmt string) (waitCall, bool) {
	m := waitStmt.FindStringSubmatch(stmt)
	if m == nil {
		if m = waitMySQLStmt.FindStringSubmatch(stmt); m == nil {
			return waitCall{}, false
		}
		w := waitCall{mysql: m[1], isMySQL: true, timeout: defaultWaitTimeout}
		if m[2] != "" {
			secs, _ := strconv.ParseFloat(m[2], 64)
			w.timeout = time.Duration(secs * float64(time.Second))
		}
		return w, true
	}
	hi, _ := strconv.ParseUint(m[1], 16, 32)
	lo, _ := strconv.ParseUint(m[2], 16, 32)
	w := waitCall{lsn: hi<<32 | lo, timeout: defaultWaitTimeout}
	if m[3] != "" {
		secs, _ := strconv.ParseFloat(m[3], 64)
		w.timeout = time.Duration(secs * float64(time.Second))
	}
	return w, true
}

// waitColumns describe retina_wait_lsn's result, waitMySQLColumns
// retina_wait_mysql's.
var (
	waitColumns      = []Column{{Name: "retina_wait_lsn", Type: Type{Kind: TypeBool}}}
	waitMySQLColumns = []Column{{Name: "retina_wait_mysql", Type: Type{Kind: TypeBool}}}
)

// wait runs retina_wait_lsn: true once the commits before the LSN are
// visible; an error naming the LSN when the timeout passes first.
func (s *Session) wait(ctx context.Context, w waitCall) (*Result, error) {
	if w.isMySQL {
		return s.waitMySQL(ctx, w)
	}
	if s.e.cfg.Waiter == nil {
		return nil, ErrNoWaiter
	}
	wctx, cancel := context.WithTimeout(ctx, w.timeout)
	defer cancel()
	lsn := fmt.Sprintf("%X/%X", w.lsn>>32, uint32(w.lsn))
	if err := s.e.cfg.Waiter.WaitLSN(wctx, w.lsn); err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			return nil, fmt.Errorf("retina_wait_lsn: the commits before %s are not all applied after %s", lsn, w.timeout)
		}
		return nil, fmt.Errorf("retina_wait_lsn(%s): %w", lsn, err)
	}
	return &Result{Tag: "SELECT", Columns: waitColumns, static: [][]any{{true}}}, nil
}

// waitMySQL runs retina_wait_mysql: true once the transactions up to the
// position are visible; an error naming it when the timeout passes first.
func (s *Session) waitMySQL(ctx context.Context, w waitCall) (*Result, error) {
	if s.e.cfg.Waiter == nil {
		return nil, ErrNoMySQLWaiter
	}
	wctx, cancel := context.WithTimeout(ctx, w.timeout)
	defer cancel()
	if err := s.e.cfg.Waiter.WaitMySQL(wctx, w.mysql); err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			return nil, fmt.Errorf("retina_wait_mysql: the transactions up to %q are not all applied after %s", w.mysql, w.timeout)
		}
		return nil, fmt.Errorf("retina_wait_mysql(%q): %w", w.mysql, err)
	}
	return &Result{Tag: "SELECT", Columns: waitMySQLColumns, static: [][]any{{true}}}, nil
}
