package sqlexec

import (
	"context"
	"fmt"
	"strings"

	"vitess.io/vitess/go/sqltypes"
	querypb "vitess.io/vitess/go/vt/proto/query"
	"vitess.io/vitess/go/vt/sqlparser"

	"github.com/retinadb/retina/internal/oltp/engine"
)

// isolationName is the MySQL spelling of an isolation level.
func isolationName(i engine.Isolation) string {
	if i == engine.Serializable {
		return "SERIALIZABLE"
	}
	return "REPEATABLE-READ"
}

// parseIsolation maps a MySQL isolation level to the store's: SERIALIZABLE
// to serializable, the others to snapshot isolation, which gives at least
// what each of them promises.
func parseIsolation(v string) (engine.Isolation, error) {
	n := strings.NewReplacer("-", " ", "_", " ").Replace(strings.ToLower(strings.TrimSpace(v)))
	switch n {
	case "serializable":
		return engine.Serializable, nil
	case "repeatable read", "read committed", "read uncommitted", "snapshot":
		return engine.SnapshotIsolation, nil
	}
	return 0, errorf(ErWrongValue, "transaction isolation level %q is unknown; use READ COMMITTED, REPEATABLE READ or SERIALIZABLE", v)
}

// systemVar is a session or global variable's value as clients read it.
func (s *Session) systemVar(name string) (sqltypes.Value, error) {
	b := func(v bool) sqltypes.Value {
		if v {
			return sqltypes.NewInt64(1)
		}
		return sqltypes.NewInt64(0)
	}
	switch strings.ToLower(name) {
	case "autocommit":
		return b(s.autocommit), nil
	case "transaction_isolation", "tx_isolation":
		return sqltypes.NewVarChar(isolationName(s.iso)), nil
	case "transaction_read_only", "tx_read_only", "read_only", "super_read_only":
		return b(false), nil
	case "version":
		return sqltypes.NewVarChar(ServerVersion), nil
	case "version_comment":
		return sqltypes.NewVarChar("Retina OLTP (Skeena)"), nil
	case "max_allowed_packet":
		return sqltypes.NewInt64(64 << 20), nil
	case "sql_mode":
		return sqltypes.NewVarChar("STRICT_TRANS_TABLES,NO_ENGINE_SUBSTITUTION"), nil
	case "character_set_client", "character_set_connection", "character_set_results", "character_set_server", "character_set_database":
		return sqltypes.NewVarChar("utf8mb4"), nil
	case "collation_connection", "collation_server", "collation_database":
		return sqltypes.NewVarChar("utf8mb4_bin"), nil
	case "lower_case_table_names":
		return sqltypes.NewInt64(1), nil
	case "time_zone", "system_time_zone":
		return sqltypes.NewVarChar("UTC"), nil
	case "wait_timeout", "interactive_timeout":
		return sqltypes.NewInt64(28800), nil
	case "net_write_timeout":
		return sqltypes.NewInt64(60), nil
	case "auto_increment_increment":
		return sqltypes.NewInt64(1), nil
	case "license":
		return sqltypes.NewVarChar("Apache-2.0"), nil
	case "performance_schema":
		return b(false), nil
	case "query_cache_size", "query_cache_type":
		return sqltypes.NewInt64(0), nil
	case "last_insert_id", "identity":
		return sqltypes.NewInt64(0), nil
	}
	return sqltypes.NULL, errorf(ErUnknownVar, "unknown system variable '%s'", name)
}

// set runs SET: autocommit and isolation take effect; character-set and
// similar session settings that this server fixes are accepted; user
// variables are kept.
func (s *Session) set(ctx context.Context, st *sqlparser.Set, bind map[string]*querypb.BindVariable) error {
	for _, se := range st.Exprs {
		name := strings.ToLower(se.Var.Name.String())
		val, err := s.constant(se.Expr, bind)
		if err != nil {
			return err
		}
		switch {
		case se.Var.Scope == sqlparser.VariableScope:
			s.userVars[name] = val
		case name == "autocommit":
			on, err := truthy(val)
			if err != nil {
				return errorf(ErWrongValue, "autocommit: %v", err)
			}
			if on && !s.autocommit {
				// Turning autocommit on commits the open transaction.
				if err := s.commit(ctx); err != nil {
					return err
				}
			}
			s.autocommit = on
		case name == "transaction_isolation" || name == "tx_isolation":
			iso, err := parseIsolation(val.ToString())
			if err != nil {
				return err
			}
			if se.Var.Scope == sqlparser.NextTxScope {
				s.nextIso = &iso
			} else {
				s.iso = iso
			}
		case name == "transaction_read_only" || name == "tx_read_only":
			// Accepted: read-only transactions need nothing special here.
		default:
			// Names, character sets, timeouts, sql_mode and the like: the
			// server has one fixed setting; reading them reports it.
			if _, err := s.systemVar(name); err != nil && se.Var.Scope != sqlparser.VariableScope {
				s.e.log.Debug("sql: SET of an unknown variable ignored", "variable", name)
			}
		}
	}
	return nil
}

func truthy(v sqltypes.Value) (bool, error) {
	switch strings.ToLower(v.ToString()) {
	case "1", "on", "true":
		return true, nil
	case "0", "off", "false":
		return false, nil
	}
	return false, fmt.Errorf("%q is neither ON nor OFF", v.ToString())
}

// constant evaluates an expression that references no columns.
func (s *Session) constant(e sqlparser.Expr, bind map[string]*querypb.BindVariable) (sqltypes.Value, error) {
	switch e := e.(type) {
	case *sqlparser.ColName: // SET x = ON / OFF arrives as a column name
		return sqltypes.NewVarChar(e.Name.String()), nil
	}
	ev, err := s.compile(e, &scope{})
	if err != nil {
		return sqltypes.NULL, err
	}
	env := s.env(bind)
	return ev.eval(env)
}

// show answers the SHOW statements clients and tools send.
func (s *Session) show(_ context.Context, st *sqlparser.Show) (*sqltypes.Result, error) {
	switch sh := st.Internal.(type) {
	case *sqlparser.ShowBasic:
		switch sh.Command {
		case sqlparser.Table:
			res := &sqltypes.Result{Fields: []*querypb.Field{{Name: "Tables_in_" + s.dbName(), Type: querypb.Type_VARCHAR}}}
			for _, t := range s.e.cat.Tables() {
				res.Rows = append(res.Rows, []sqltypes.Value{sqltypes.NewVarChar(t.Name)})
			}
			return res, nil
		case sqlparser.Database:
			return &sqltypes.Result{Fields: []*querypb.Field{{Name: "Database", Type: querypb.Type_VARCHAR}},
				Rows: [][]sqltypes.Value{{sqltypes.NewVarChar(s.dbName())}}}, nil
		case sqlparser.VariableSession, sqlparser.VariableGlobal:
			res := &sqltypes.Result{Fields: []*querypb.Field{{Name: "Variable_name", Type: querypb.Type_VARCHAR}, {Name: "Value", Type: querypb.Type_VARCHAR}}}
			for _, n := range []string{"autocommit", "transaction_isolation", "version", "version_comment", "max_allowed_packet", "sql_mode", "character_set_server", "collation_server", "lower_case_table_names", "time_zone"} {
				v, _ := s.systemVar(n)
				if sh.Filter != nil && sh.Filter.Like != "" && !likeMatch(sh.Filter.Like, n) {
					continue
				}
				res.Rows = append(res.Rows, []sqltypes.Value{sqltypes.NewVarChar(n), sqltypes.NewVarChar(v.ToString())})
			}
			return res, nil
		case sqlparser.Engines:
			return &sqltypes.Result{Fields: []*querypb.Field{{Name: "Engine", Type: querypb.Type_VARCHAR}, {Name: "Support", Type: querypb.Type_VARCHAR}, {Name: "Comment", Type: querypb.Type_VARCHAR}},
				Rows: [][]sqltypes.Value{
					{sqltypes.NewVarChar("InnoDB"), sqltypes.NewVarChar("DEFAULT"), sqltypes.NewVarChar("Skeena's storage engine (Pebble)")},
					{sqltypes.NewVarChar("MEMORY"), sqltypes.NewVarChar("YES"), sqltypes.NewVarChar("Skeena's in-memory engine (redo-logged, durable)")},
				}}, nil
		}
	case *sqlparser.ShowCreate:
		if sh.Command == sqlparser.CreateTbl {
			t, err := s.e.cat.Table(sh.Op.Name.String())
			if err != nil {
				return nil, err
			}
			return &sqltypes.Result{Fields: []*querypb.Field{{Name: "Table", Type: querypb.Type_VARCHAR}, {Name: "Create Table", Type: querypb.Type_VARCHAR}},
				Rows: [][]sqltypes.Value{{sqltypes.NewVarChar(t.Name), sqltypes.NewVarChar(t.DefinitionSQL())}}}, nil
		}
	}
	return nil, unsupported(fmt.Sprintf("%q", sqlparser.String(st)))
}

func (s *Session) dbName() string {
	if s.db == "" {
		return "retina"
	}
	return s.db
}

// likeMatch matches a LIKE pattern with % and _ (no escapes), case-insensitively.
func likeMatch(pattern, s string) bool {
	p, t := strings.ToLower(pattern), strings.ToLower(s)
	var match func(i, j int) bool
	match = func(i, j int) bool {
		for i < len(p) {
			switch p[i] {
			case '%':
				for k := j; k <= len(t); k++ {
					if match(i+1, k) {
						return true
					}
				}
				return false
			case '_':
				if j >= len(t) {
					return false
				}
			default:
				if j >= len(t) || t[j] != p[i] {
					return false
				}
			}
			i, j = i+1, j+1
		}
		return j == len(t)
	}
	return match(0, 0)
}
