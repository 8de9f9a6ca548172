package query

import (
	"context"
	"database/sql/driver"
	"fmt"

	"github.com/duckdb/duckdb-go/v2"
)

// Functions whose answers depend on the session (its settings and user):
// DuckDB calls them with the statement's context, which carries the
// session's settings.

type settingsKey struct{}

func withSettings(ctx context.Context, s *Settings) context.Context {
	return context.WithValue(ctx, settingsKey{}, s)
}

func settingsOf(ctx context.Context) (*Settings, error) {
	s, ok := ctx.Value(settingsKey{}).(*Settings)
	if !ok {
		return nil, fmt.Errorf("query: a session function ran outside a session")
	}
	return s, nil
}

// sessionScalar is a scalar function of VARCHAR arguments returning VARCHAR.
type sessionScalar struct {
	args int
	fn   func(s *Settings, args []driver.Value) (any, error)
}

func (f sessionScalar) Config() duckdb.ScalarFuncConfig {
	varchar, _ := duckdb.NewTypeInfo(duckdb.TYPE_VARCHAR)
	in := make([]duckdb.TypeInfo, f.args)
	for i := range in {
		in[i] = varchar
	}
	return duckdb.ScalarFuncConfig{InputTypeInfos: in, ResultTypeInfo: varchar, Volatile: true}
}

func (f sessionScalar) Executor() duckdb.ScalarFuncExecutor {
	return duckdb.ScalarFuncExecutor{RowContextExecutor: func(ctx context.Context, args []driver.Value) (any, error) {
		s, err := settingsOf(ctx)
		if err != nil {
			return nil, err
		}
		return f.fn(s, args)
	}}
}

// sessionFunctions are registered under these names; the catalog macros
// (current_setting, current_user, …) call them.
var sessionFunctions = map[string]sessionScalar{
	"retina_current_setting": {args: 1, fn: func(s *Settings, args []driver.Value) (any, error) {
		name, _ := args[0].(string)
		v, ok := s.Get(name)
		if !ok {
			return nil, fmt.Errorf("%w %q", ErrUnknownSetting, name)
		}
		return v, nil
	}},
	"retina_current_setting_or_null": {args: 1, fn: func(s *Settings, args []driver.Value) (any, error) {
		name, _ := args[0].(string)
		if v, ok := s.Get(name); ok {
			return v, nil
		}
		return nil, nil
	}},
	"retina_current_schema": {args: 0, fn: func(s *Settings, _ []driver.Value) (any, error) {
		v, _ := s.Get("search_path")
		for _, item := range splitSearchPath(v) {
			if item != "$user" && item != "pg_catalog" && item != "" {
				return item, nil
			}
		}
		return userSchema, nil
	}},
	"retina_session_user": {args: 0, fn: func(s *Settings, _ []driver.Value) (any, error) {
		v, _ := s.Get("session_authorization")
		if v == "" {
			v = retinaUserName
		}
		return v, nil
	}},
}

// settingsTable is retina_settings(): the session's parameters, for pg_settings.
type settingsTable struct {
	rows [][2]string
	next int
}

func (t *settingsTable) ColumnInfos() []duckdb.ColumnInfo {
	varchar, _ := duckdb.NewTypeInfo(duckdb.TYPE_VARCHAR)
	return []duckdb.ColumnInfo{{Name: "name", T: varchar}, {Name: "setting", T: varchar}}
}

func (t *settingsTable) Cardinality() *duckdb.CardinalityInfo {
	return &duckdb.CardinalityInfo{Cardinality: uint(len(t.rows)), Exact: true}
}

func (t *settingsTable) Init() {}

func (t *settingsTable) FillRow(row duckdb.Row) (bool, error) {
	if t.next >= len(t.rows) {
		return false, nil
	}
	r := t.rows[t.next]
	t.next++
	if err := row.SetRowValue(0, r[0]); err != nil {
		return false, err
	}
	return true, row.SetRowValue(1, r[1])
}

func settingsFunction() duckdb.RowTableFunction {
	return duckdb.RowTableFunction{
		BindArgumentsContext: func(ctx context.Context, _ map[string]any, _ ...any) (duckdb.RowTableSource, error) {
			s, err := settingsOf(ctx)
			if err != nil {
				return &settingsTable{}, nil // bound outside a session, e.g. by CREATE VIEW
			}
			return &settingsTable{rows: s.All()}, nil
		},
	}
}
