// Package pebblelog routes Pebble's log lines to log/slog: its routine
// chatter (WAL replay, compactions) at debug level, its errors as errors.
package pebblelog

import (
	"errors"
	"fmt"
	"log/slog"
)

// Logger adapts a *slog.Logger to Pebble's logger interface.
type Logger struct{ Log *slog.Logger }

// Infof logs at debug level.
func (l Logger) Infof(format string, args ...any) {
	l.Log.Debug("pebble: " + fmt.Sprintf(format, args...))
}

// Errorf logs an error.
func (l Logger) Errorf(format string, args ...any) {
	l.Log.Error("pebble: " + fmt.Sprintf(format, args...))
}

// Fatalf logs and panics, as Pebble requires: it calls Fatalf only on an
// invariant violation inside Pebble itself.
func (l Logger) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	l.Log.Error("pebble: fatal: " + msg)
	panic(errors.New("pebble: " + msg))
}
