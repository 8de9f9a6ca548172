package cdc

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// FatalError stops a database source for good (bad input, a position the
// server no longer has, a schema change it cannot follow); any other error
// of a replication session is retried.
type FatalError struct{ Err error }

func (e FatalError) Error() string { return e.Err.Error() }
func (e FatalError) Unwrap() error { return e.Err }

// Fatal marks err as stopping the source for good.
func Fatal(err error) error { return FatalError{err} }

// RunSessions runs replication sessions until ctx ends or one fails with
// a FatalError, reconnecting after any other failure with backoff (100 ms
// doubling to 30 s; back to 100 ms after a session that lasted a minute).
// It returns why it stopped: ctx's error or the fatal one. what names the
// source in log lines; reconnected is called before each new session.
func RunSessions(ctx context.Context, log *slog.Logger, what string, session func(context.Context) error, reconnected func()) error {
	backoff := 100 * time.Millisecond
	for {
		began := time.Now()
		err := session(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var fe FatalError
		if errors.As(err, &fe) {
			log.Error(what+" stopped", "err", fe.Err)
			return fe.Err
		}
		if time.Since(began) > time.Minute {
			backoff = 100 * time.Millisecond
		}
		log.Warn(what+" interrupted; reconnecting", "err", err, "in", backoff)
		reconnected()
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return ctx.Err()
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}
