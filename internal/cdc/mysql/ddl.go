package mysql

import (
	"context"
	"fmt"
	"strings"

	"vitess.io/vitess/go/vt/sqlparser"

	"github.com/retinadb/retina/internal/cdc"
)

// DDL from the binlog, as the PostgreSQL source handles schema changes:
//
//	CREATE TABLE        Retina creates the table (an existing one of the name
//	                    is emptied: the source's is new)
//	DROP TABLE          Retina empties its table and keeps it
//	TRUNCATE TABLE      Retina empties its table
//	ALTER … ADD COLUMN  followed when the column is NULL without a default
//	                    (the rows it had read NULL in MySQL too); otherwise the
//	                    source stops naming the table and column
//	ALTER … DROP COLUMN followed: Retina's column (which must be nullable)
//	                    reads NULL from then on
//	ALTER … MODIFY/CHANGE  followed when the Retina type stays the same;
//	                    a rename of a column or a table stops the source
//
// Every stop says how to proceed: undo the change, or copy every table
// again with a new copy=TAG in the source URI.

// parser is vitess's MySQL parser with its default server version.
var parser = mustParser()

func mustParser() *sqlparser.Parser {
	p, err := sqlparser.New(sqlparser.Options{})
	if err != nil {
		return sqlparser.NewTestParser()
	}
	return p
}

// ddl applies one statement of a Query event (schema: its default
// database) within the open transaction.
func (st *streamer) ddl(ctx context.Context, schema, query string) error {
	s := st.s
	stmt, err := parser.Parse(query)
	if err != nil {
		if mentions(query, s.opts.Database) || strings.EqualFold(schema, s.opts.Database) {
			s.log.Warn("a statement in the binlog Retina cannot parse; ignored (if it changes a table read, the next change of that table stops the source if it no longer fits)",
				"at", st.where(), "statement", truncate(query, 200), "err", err)
		}
		return nil
	}
	mine := func(tn sqlparser.TableName) (string, bool) {
		db := tn.Qualifier.String()
		if db == "" {
			db = schema
		}
		name := tn.Name.String()
		return name, strings.EqualFold(db, s.opts.Database) && s.selected(name)
	}
	switch d := stmt.(type) {
	case *sqlparser.CreateTable:
		name, ok := mine(d.Table)
		if !ok || d.Temp {
			return nil
		}
		return st.created(ctx, name)
	case *sqlparser.DropTable:
		if d.Temp {
			return nil
		}
		for _, tn := range d.FromTables {
			if name, ok := mine(tn); ok {
				if err := st.truncate(ctx, name); err != nil {
					return err
				}
			}
		}
	case *sqlparser.TruncateTable:
		if name, ok := mine(d.Table); ok {
			return st.truncate(ctx, name)
		}
	case *sqlparser.RenameTable:
		for _, p := range d.TablePairs {
			from, fromMine := mine(p.FromTable)
			to, toMine := mine(p.ToTable)
			if fromMine || toMine {
				return fatal(fmt.Errorf("mysql source %s: at %s: table %s.%s is renamed to %s: Retina cannot follow a table rename; rename it back, or copy every table again with a new copy=TAG in the source URI",
					s.opts.Display, st.where(), s.opts.Database, from, to))
			}
		}
	case *sqlparser.AlterTable:
		name, ok := mine(d.Table)
		if !ok {
			return nil
		}
		return st.altered(name, d)
	}
	return nil
}

// altered checks an ALTER TABLE of a table read for what Retina cannot
// follow.
func (st *streamer) altered(name string, d *sqlparser.AlterTable) error {
	s := st.s
	stop := func(format string, args ...any) error {
		return fatal(fmt.Errorf("mysql source %s: at %s: %w: %s", s.opts.Display, st.where(), ErrSchemaChange, fmt.Sprintf(format, args...)))
	}
	for _, opt := range d.AlterOptions {
		switch o := opt.(type) {
		case *sqlparser.AddColumns:
			for _, c := range o.Columns {
				opts := c.Type.Options
				if opts == nil {
					continue
				}
				filled := opts.Default != nil && !isNull(opts.Default) || opts.Null != nil && !*opts.Null || opts.As != nil || opts.Autoincrement
				if filled {
					return stop("%s.%s gains column %s with a value for the rows it had (a default, NOT NULL, generated or AUTO_INCREMENT), which the binlog does not carry: add it as NULL without a default and fill it with UPDATE, or copy every table again with a new copy=TAG in the source URI",
						s.opts.Database, name, c.Name.String())
				}
			}
		case *sqlparser.RenameColumn:
			return stop("%s.%s column %s is renamed to %s: Retina cannot follow a rename; rename it back, or copy every table again with a new copy=TAG in the source URI",
				s.opts.Database, name, o.OldName.Name.String(), o.NewName.Name.String())
		case *sqlparser.ChangeColumn:
			if !strings.EqualFold(o.OldColumn.Name.String(), o.NewColDefinition.Name.String()) {
				return stop("%s.%s column %s is renamed to %s: Retina cannot follow a rename; rename it back, or copy every table again with a new copy=TAG in the source URI",
					s.opts.Database, name, o.OldColumn.Name.String(), o.NewColDefinition.Name.String())
			}
		case *sqlparser.RenameTableName:
			return stop("table %s.%s is renamed to %s: Retina cannot follow a table rename; rename it back, or copy every table again with a new copy=TAG in the source URI",
				s.opts.Database, name, o.Table.Name.String())
		}
	}
	return nil
}

func isNull(e sqlparser.Expr) bool {
	_, ok := e.(*sqlparser.NullVal)
	return ok
}

// created makes Retina's table for a table the source created: an empty
// one (a table of the name Retina had is emptied).
func (st *streamer) created(ctx context.Context, name string) error {
	s := st.s
	if _, ok := s.cfg.Catalog.Snapshot().Table(strings.ToLower(name)); ok {
		return st.truncate(ctx, name)
	}
	c, err := s.connect(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	t, err := describe(ctx, query(c), s.opts.Database, name)
	if err != nil {
		// Dropped again since (Retina is behind): its changes, if any,
		// bind it from their table maps.
		s.log.Info("a table created in the binlog is gone from the server; Retina creates it at its first change", "table", name, "at", st.where())
		return nil
	}
	if err := t.bind(ctx, s.cfg.Catalog, true); err != nil {
		return fatal(fmt.Errorf("mysql source %s: at %s: %w", s.opts.Display, st.where(), err))
	}
	return nil
}

// truncate empties Retina's table of a source table, when Retina has it.
func (st *streamer) truncate(ctx context.Context, name string) error {
	rt, ok := st.s.cfg.Catalog.Snapshot().Table(strings.ToLower(name))
	if !ok {
		return nil
	}
	for id, t := range st.tables {
		if strings.EqualFold(t.Name, name) {
			delete(st.tables, id) // a new definition comes with a new table map
		}
	}
	return st.change(ctx, &table{Name: name, retina: rt}, cdc.Record{Op: cdc.OpTruncate})
}

func mentions(query, db string) bool {
	return strings.Contains(strings.ToLower(query), strings.ToLower(db))
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
