package query

import (
	"context"
	"errors"
	"strings"

	"github.com/duckdb/duckdb-go/v2"
)

// Error is a statement the engine could not plan or run, with the SQLSTATE
// PostgreSQL would report for it.
type Error struct {
	Code string // SQLSTATE, e.g. 42P01 for an unknown table
	Err  error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// engineError classifies an error of the embedded engine.
func engineError(err error) error {
	if err == nil {
		return nil
	}
	var qe *Error
	if errors.As(err, &qe) {
		return err
	}
	return &Error{Code: duckState(err), Err: err}
}

// SQLState is the SQLSTATE of an error this package returned.
func SQLState(err error) string {
	var qe *Error
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "57014" // query_canceled
	case errors.Is(err, ErrReadOnly):
		return "25006" // read_only_sql_transaction
	case errors.Is(err, ErrUnknownSetting):
		return "42704" // undefined_object
	case errors.Is(err, ErrSetting):
		return "22023" // invalid_parameter_value
	case errors.As(err, &qe):
		return qe.Code
	}
	return "XX000" // internal_error
}

func duckState(err error) string {
	var de *duckdb.Error
	if errors.As(err, &de) {
		switch de.Type {
		case duckdb.ErrorTypeParser, duckdb.ErrorTypeSyntax:
			return "42601" // syntax_error
		case duckdb.ErrorTypeCatalog:
			return "42P01" // undefined_table
		case duckdb.ErrorTypeBinder:
			return "42703" // undefined_column
		case duckdb.ErrorTypePermission:
			return "42501" // insufficient_privilege
		case duckdb.ErrorTypeDivideByZero:
			return "22012" // division_by_zero
		case duckdb.ErrorTypeConversion, duckdb.ErrorTypeInvalidInput, duckdb.ErrorTypeMismatchType:
			return "22P02" // invalid_text_representation
		case duckdb.ErrorTypeOutOfRange:
			return "22003" // numeric_value_out_of_range
		case duckdb.ErrorTypeInterrupt:
			return "57014" // query_canceled
		case duckdb.ErrorTypeOutOfMemory:
			return "53200" // out_of_memory
		case duckdb.ErrorTypeNotImplemented:
			return "0A000" // feature_not_supported
		}
	}
	if strings.Contains(err.Error(), "INTERRUPT") || strings.Contains(err.Error(), "Interrupted") {
		return "57014"
	}
	return "XX000"
}
