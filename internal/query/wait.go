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
// taken after it returns.
type SourceWaiter interface {
	WaitLSN(ctx context.Context, lsn uint64) error
}

// ErrNoWaiter is returned by retina_wait_lsn when no source can answer it.
var ErrNoWaiter = errors.New("retina_wait_lsn: this server has no PostgreSQL source")

// defaultWaitTimeout bounds retina_wait_lsn without a timeout argument.
const defaultWaitTimeout = time.Minute

// waitStmt is SELECT retina_wait_lsn('X/Y' [, seconds]).
var waitStmt = regexp.MustCompile(`(?is)^\s*select\s+retina_wait_lsn\s*\(\s*'([0-9a-f]{1,8})/([0-9a-f]{1,8})'\s*(?:,\s*([0-9]+(?:\.[0-9]*)?)\s*)?\)\s*;?\s*$`)

// waitCall is a parsed retina_wait_lsn call.
type waitCall struct {
	lsn     uint64
	timeout time.Duration
}

func parseWait(stmt string) (waitCall, bool) {
	m := waitStmt.FindStringSubmatch(stmt)
	if m == nil {
		return waitCall{}, false
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

// waitColumns describe retina_wait_lsn's result.
var waitColumns = []Column{{Name: "retina_wait_lsn", Type: Type{Kind: TypeBool}}}

// wait runs retina_wait_lsn: true once the commits before the LSN are
// visible; an error naming the LSN when the timeout passes first.
func (s *Session) wait(ctx context.Context, w waitCall) (*Result, error) {
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
