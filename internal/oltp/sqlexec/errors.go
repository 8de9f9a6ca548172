package sqlexec

import (
	"context"
	"errors"
	"fmt"

	"vitess.io/vitess/go/mysql/sqlerror"

	"github.com/retinadb/retina/internal/oltp/engine"
	"github.com/retinadb/retina/internal/oltp/skeena"
	"github.com/retinadb/retina/internal/oltp/sqlstore"
)

// MySQL error numbers this package reports.
const (
	ErParse        = sqlerror.ERParseError
	ErUnsupported  = sqlerror.ERNotSupportedYet
	ErBadField     = sqlerror.ERBadFieldError
	ErNonUnique    = sqlerror.ERNonUniq
	ErValueCount   = sqlerror.ERWrongValueCountOnRow
	ErNoDefault    = sqlerror.ERNoDefaultForField
	ErUnknownVar   = sqlerror.ERUnknownSystemVariable
	ErUnknown      = sqlerror.ERUnknownError
	ErWrongValue   = sqlerror.ErrorCode(1366) // ER_TRUNCATED_WRONG_VALUE_FOR_FIELD
	ErOutOfRange   = sqlerror.ErrorCode(1264) // ER_WARN_DATA_OUT_OF_RANGE
	ErUnknownTable = sqlerror.ERNoSuchTable
)

// Error is a statement error with its MySQL number.
type Error struct {
	Code sqlerror.ErrorCode
	Msg  string
	Err  error
}

func (e *Error) Error() string { return e.Msg }
func (e *Error) Unwrap() error { return e.Err }

func unsupported(what string) error {
	return &Error{Code: ErUnsupported, Msg: what + " is not supported"}
}

func errorf(code sqlerror.ErrorCode, format string, args ...any) error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// toError gives err the MySQL number and SQLSTATE a client acts on; the
// message keeps the subject (table, column, key).
func toError(err error) error {
	var se *sqlerror.SQLError
	if errors.As(err, &se) {
		return err
	}
	var e *Error
	if errors.As(err, &e) {
		return sqlerror.NewSQLError(e.Code, "", err.Error())
	}
	var dup *sqlstore.DuplicateKeyError
	var null *sqlstore.NullError
	var val *sqlstore.ValueError
	var unack *skeena.UnacknowledgedError
	switch {
	case errors.As(err, &unack):
		return sqlerror.NewSQLError(sqlerror.ERUnknownError, sqlerror.SSUnknownSQLState, err.Error()+"; check whether the transaction's changes are there before retrying")
	case engine.Retryable(err):
		return sqlerror.NewSQLError(sqlerror.ERLockDeadlock, sqlerror.SSLockDeadlock, err.Error()+"; try restarting transaction")
	case errors.As(err, &dup):
		return sqlerror.NewSQLError(sqlerror.ERDupEntry, sqlerror.SSConstraintViolation, err.Error())
	case errors.As(err, &null):
		return sqlerror.NewSQLError(sqlerror.ERBadNullError, sqlerror.SSConstraintViolation, err.Error())
	case errors.As(err, &val):
		switch {
		case val.TooLong:
			return sqlerror.NewSQLError(sqlerror.ERDataTooLong, sqlerror.SSDataTooLong, err.Error())
		case val.OutOfRange:
			return sqlerror.NewSQLError(ErOutOfRange, sqlerror.SSDataOutOfRange, err.Error())
		}
		return sqlerror.NewSQLError(ErWrongValue, "HY000", err.Error())
	case errors.Is(err, sqlstore.ErrNoSuchTable):
		return sqlerror.NewSQLError(sqlerror.ERNoSuchTable, sqlerror.SSUnknownTable, err.Error())
	case errors.Is(err, sqlstore.ErrTableExists):
		return sqlerror.NewSQLError(sqlerror.ERTableExists, sqlerror.SSUnknownTable, err.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return sqlerror.NewSQLError(sqlerror.ERQueryInterrupted, sqlerror.SSQueryInterrupted, err.Error())
	}
	return sqlerror.NewSQLError(sqlerror.ERUnknownError, sqlerror.SSUnknownSQLState, err.Error())
}
