package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/cdc"
	"github.com/retinadb/retina/internal/types"
)

// Catalog is what the source needs of Retina's catalog.
type Catalog = cdc.Catalog

// Columns a table without a primary key or replica-identity index gets in
// Retina: together they are its key (the commit LSN of the transaction that
// inserted the row, 0 for the initial copy, and the row's ordinal in it).
const (
	keylessLSN = "_pg_lsn"
	keylessRow = "_pg_row"
)

// errDropped: a table in the change stream is no longer in PostgreSQL's
// catalog (dropped since the changes were written).
var errDropped = errors.New("not in PostgreSQL's catalog any more")

// ErrSchemaChange is wrapped when a published table changed in a way this
// source cannot follow.
var ErrSchemaChange = errors.New("postgres source: unsupported schema change")

// table is one published table as PostgreSQL has it and as Retina holds it.
type table struct {
	OID             uint32
	Namespace, Name string
	Identity        byte // pg_class.relreplident: d(efault), f(ull), i(ndex), n(othing)
	Cols            []column
	Key             []string // PostgreSQL's key columns: primary key or replica-identity index
	// Set by bind: the Retina table, where each source column goes in its
	// rows, and where the key columns are.
	retina *catalog.Table
	pos    []int
	keyPos []int // positions in Retina rows of Retina's key columns
	absent []int // positions of Retina's columns the source no longer has
}

func (t *table) String() string { return t.Namespace + "." + t.Name }

// retinaName is the table's name in Retina's catalog: its plain name in
// schema public, schema.name in any other (catalog.TableName).
func (t *table) retinaName() string { return catalog.TableName(t.Namespace, t.Name) }

func (t *table) keyless() bool { return len(t.Key) == 0 }

// schema is the Retina schema this table gets when Retina creates it.
func (t *table) schema() catalog.Schema {
	var s catalog.Schema
	for _, c := range t.Cols {
		s.Columns = append(s.Columns, catalog.Column{Name: c.Name, Type: c.Type, Nullable: !c.NotNull || !slices.Contains(t.Key, c.Name), SourceID: c.Attnum})
	}
	// A key column is NOT NULL in Retina even when PostgreSQL only has it
	// in a unique index (whose columns must be NOT NULL to be an identity).
	for i := range s.Columns {
		if slices.Contains(t.Key, s.Columns[i].Name) {
			s.Columns[i].Nullable = false
		}
	}
	s.PrimaryKey = slices.Clone(t.Key)
	if t.keyless() {
		s.Columns = append(s.Columns,
			catalog.Column{Name: keylessLSN, Type: types.Of(types.Int64)},
			catalog.Column{Name: keylessRow, Type: types.Of(types.Int64)})
		s.PrimaryKey = []string{keylessLSN, keylessRow}
		s.GeneratedKey = true
	}
	return s
}

// checkAdded says whether c, a column of the source Retina's table lacks, can
// be added to it: it is not a column Retina has under another name (a
// rename, told by PostgreSQL's attnum, or not told apart when Retina's
// column has none or PostgreSQL no longer knows c), and, unless copying,
// PostgreSQL did not give the rows it had a value the stream does not carry.
func (t *table) checkAdded(have catalog.Schema, c column, copying bool) error {
	if c.Filled && !copying {
		return fmt.Errorf("%w: %s has column %s (%s) with a default, which the rows it had when the column was added got in PostgreSQL and not in the change stream: add a column without a default (set one after with ALTER COLUMN … SET DEFAULT), or start over for this table: drop it in Retina and the slot", ErrSchemaChange, t, c.Name, c.PGType)
	}
	for _, hc := range have.Columns {
		if hc.Name == keylessLSN || hc.Name == keylessRow || slices.ContainsFunc(t.Cols, func(sc column) bool { return strings.EqualFold(sc.Name, hc.Name) }) {
			continue
		}
		switch {
		case hc.SourceID != 0 && hc.SourceID == c.Attnum:
			return fmt.Errorf("%w: %s column %s is Retina's column %s renamed: Retina cannot follow a rename; rename it back, or start over for this table: drop it in Retina and the slot", ErrSchemaChange, t, c.Name, hc.Name)
		case hc.SourceID == 0 || c.Attnum == 0:
			return fmt.Errorf("%w: %s has column %s and no longer column %s: Retina cannot tell a rename (which it cannot follow) from a drop and an add; to start over for this table, drop it in Retina and the slot", ErrSchemaChange, t, c.Name, hc.Name)
		}
	}
	return nil
}

// querier runs catalog queries: a connection, or a transaction at the
// slot's snapshot.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// publishedTables lists the tables of the publication with their columns
// and keys, in name order.
func publishedTables(ctx context.Context, q querier, publication string) ([]*table, error) {
	rows, err := q.Query(ctx, `SELECT c.oid, n.nspname, c.relname, c.relreplident::text
		FROM pg_publication_tables p
		JOIN pg_namespace n ON n.nspname = p.schemaname
		JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = p.tablename
		WHERE p.pubname = $1 ORDER BY n.nspname, c.relname`, publication)
	if err != nil {
		return nil, fmt.Errorf("list the tables of publication %s: %w", publication, err)
	}
	type rel struct {
		oid      uint32
		ns, name string
		ident    string
	}
	var rels []rel
	for rows.Next() {
		var r rel
		if err := rows.Scan(&r.oid, &r.ns, &r.name, &r.ident); err != nil {
			rows.Close()
			return nil, err
		}
		rels = append(rels, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list the tables of publication %s: %w", publication, err)
	}
	var out []*table
	names := map[string]string{}
	for _, r := range rels {
		if other, dup := names[r.name]; dup {
			return nil, fmt.Errorf("publication %s has %s.%s and %s: Retina names tables without their schema, so these would collide; publish one of them (tables=… in the source URI) or rename it", publication, r.ns, r.name, other)
		}
		names[r.name] = r.ns + "." + r.name
		t, err := describe(ctx, q, r.oid, r.ns, r.name, r.ident)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, nil
}

// describeByName reads one table's columns and key.
func describeByName(ctx context.Context, q querier, namespace, name string) (*table, error) {
	rows, err := q.Query(ctx, `SELECT c.oid, c.relreplident::text FROM pg_class c
		JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2`, namespace, name)
	if err != nil {
		return nil, fmt.Errorf("look up %s.%s: %w", namespace, name, err)
	}
	var oid uint32
	var ident string
	found := false
	for rows.Next() {
		found = true
		if err := rows.Scan(&oid, &ident); err != nil {
			rows.Close()
			return nil, fmt.Errorf("look up %s.%s: %w", namespace, name, err)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("look up %s.%s: %w", namespace, name, err)
	}
	if !found {
		return nil, fmt.Errorf("%w: %s.%s", errDropped, namespace, name)
	}
	return describe(ctx, q, oid, namespace, name, ident)
}

func describe(ctx context.Context, q querier, oid uint32, ns, name, ident string) (*table, error) {
	t := &table{OID: oid, Namespace: ns, Name: name}
	if ident != "" {
		t.Identity = ident[0]
	}
	rows, err := q.Query(ctx, `SELECT attname, attnum, atttypid, atttypmod, attnotnull, atthasdef OR atthasmissing, format_type(atttypid, atttypmod)
		FROM pg_attribute WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped ORDER BY attnum`, oid)
	if err != nil {
		return nil, fmt.Errorf("columns of %s: %w", t, err)
	}
	for rows.Next() {
		var c column
		if err := rows.Scan(&c.Name, &c.Attnum, &c.OID, &c.TypMod, &c.NotNull, &c.Filled, &c.PGType); err != nil {
			rows.Close()
			return nil, fmt.Errorf("columns of %s: %w", t, err)
		}
		c.Type = mapType(c.OID, c.TypMod)
		t.Cols = append(t.Cols, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("columns of %s: %w", t, err)
	}
	// The key Retina finds rows by is what PostgreSQL sends as the old key:
	// the replica-identity index when there is one, else the primary key.
	rows, err = q.Query(ctx, `SELECT a.attname FROM pg_index i
		CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
		WHERE i.indrelid = $1 AND CASE WHEN $2 = 'i' THEN i.indisreplident ELSE i.indisprimary END
		ORDER BY k.ord`, oid, ident)
	if err != nil {
		return nil, fmt.Errorf("key of %s: %w", t, err)
	}
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			rows.Close()
			return nil, fmt.Errorf("key of %s: %w", t, err)
		}
		t.Key = append(t.Key, k)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("key of %s: %w", t, err)
	}
	return t, nil
}

// bind finds or creates the Retina table and maps the source columns onto
// it. A Retina table created earlier must hold every source column with
// the same type, or gains it as a nullable column: the rows it has read
// NULL in it, as PostgreSQL's do for a column added without a default.
// Copying says every row arrives with all its values (the initial copy);
// otherwise a column with a default cannot be added, since PostgreSQL
// gave the rows it had the default and the stream does not carry it. A
// column Retina has and the source no longer has (dropped upstream) must
// be nullable and reads NULL from then on.
func (t *table) bind(ctx context.Context, cat Catalog, copying bool) error {
	want := t.schema()
	name := t.retinaName()
	rt, ok := cat.Snapshot().Table(name)
	if !ok {
		var err error
		rt, err = cat.CreateTable(ctx, name, want)
		if errors.Is(err, catalog.ErrExists) {
			rt, ok = cat.Snapshot().Table(name)
		}
		if err != nil && !ok {
			return fmt.Errorf("create table %s for %s: %w", name, t, err)
		}
	}
	pos := make([]int, len(t.Cols))
	for i, c := range t.Cols {
		j := rt.Schema.ColumnIndex(c.Name)
		if j >= 0 {
			if id := rt.Schema.Columns[j].SourceID; id != 0 && c.Attnum != 0 && id != c.Attnum {
				return fmt.Errorf("%w: %s column %s was dropped and added again in PostgreSQL: Retina's rows written before hold the old column's values; to start over for this table, drop it in Retina and the slot", ErrSchemaChange, t, c.Name)
			}
		} else {
			if err := t.checkAdded(rt.Schema, c, copying); err != nil {
				return err
			}
			var err error
			if rt, err = cat.AddColumn(ctx, rt.ID, catalog.Column{Name: c.Name, Type: c.Type, Nullable: true, SourceID: c.Attnum}); err != nil {
				return fmt.Errorf("add column %s (%s) of %s to Retina's table %s: %w", c.Name, c.PGType, t, name, err)
			}
			j = rt.Schema.ColumnIndex(c.Name)
		}
		if rt.Schema.Columns[j].Type != c.Type {
			return fmt.Errorf("%w: %s column %s is %s in PostgreSQL (%s), %s in Retina: Retina cannot change a column's type", ErrSchemaChange, t, c.Name, c.Type, c.PGType, rt.Schema.Columns[j].Type)
		}
		pos[i] = j
	}
	have := rt.Schema
	var absent []int
	for j, hc := range have.Columns {
		if slices.Contains(pos, j) || (t.keyless() && (hc.Name == keylessLSN || hc.Name == keylessRow)) {
			continue
		}
		absent = append(absent, j)
		if !hc.Nullable {
			return fmt.Errorf("%w: %s has no column %s, which is NOT NULL in Retina (renamed or dropped upstream)", ErrSchemaChange, t, hc.Name)
		}
	}
	if !slices.EqualFunc(want.PrimaryKey, have.PrimaryKey, strings.EqualFold) {
		return fmt.Errorf("%w: %s has key (%s), Retina's table %s (%s)", ErrSchemaChange, t, strings.Join(want.PrimaryKey, ", "), name, strings.Join(have.PrimaryKey, ", "))
	}
	t.retina, t.pos, t.keyPos, t.absent = rt, pos, have.KeyColumns(), absent
	return nil
}
