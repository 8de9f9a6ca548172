package mysql

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/cdc"
	"github.com/retinadb/retina/internal/types"
)

// Catalog is what the source needs of Retina's catalog.
type Catalog = cdc.Catalog

// Columns a table without a primary key gets in Retina: together they are
// its key (the binlog position of the transaction that inserted the row,
// 0 for the initial copy, and the row's ordinal in it).
const (
	keylessPos = "_mysql_pos"
	keylessRow = "_mysql_row"
)

// ErrSchemaChange is wrapped when a source table changed in a way this
// source cannot follow.
var ErrSchemaChange = errors.New("mysql source: unsupported schema change")

// table is one source table as MySQL has it and as Retina holds it.
type table struct {
	Database, Name string
	Cols           []column
	Key            []string // primary key columns, in key order
	// Set by bind: the Retina table, where each source column goes in its
	// rows, where Retina's key columns are, and Retina's columns the
	// source no longer has.
	retina *catalog.Table
	pos    []int
	keyPos []int
	absent []int
}

func (t *table) String() string { return t.Database + "." + t.Name }

// retinaName is the table's name in Retina: its name in lower case (MySQL
// table names are case-insensitive on most servers).
func (t *table) retinaName() string { return strings.ToLower(t.Name) }

func (t *table) keyless() bool { return len(t.Key) == 0 }

// schema is the Retina schema this table gets when Retina creates it.
func (t *table) schema() catalog.Schema {
	var s catalog.Schema
	for _, c := range t.Cols {
		s.Columns = append(s.Columns, catalog.Column{Name: c.Name, Type: c.Type, Nullable: !slices.Contains(t.Key, c.Name) && c.Nullable})
	}
	s.PrimaryKey = slices.Clone(t.Key)
	if t.keyless() {
		s.Columns = append(s.Columns,
			catalog.Column{Name: keylessPos, Type: types.Of(types.Int64)},
			catalog.Column{Name: keylessRow, Type: types.Of(types.Int64)})
		s.PrimaryKey = []string{keylessPos, keylessRow}
		s.GeneratedKey = true
	}
	return s
}

// bind finds or creates the Retina table and maps the source columns onto
// it. A Retina table created earlier must hold every source column with
// the same type, or gains it as a nullable column: a column the source
// added as NULL without a default, whose rows read NULL. Copying says every
// row arrives with all its values (the initial copy), so any column may be
// added. A column Retina has and the source no longer has (dropped
// upstream) must be nullable and reads NULL from then on.
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
		if j < 0 {
			if !copying && !c.Nullable {
				return fmt.Errorf("%w: %s has column %s (%s) NOT NULL, which the rows it had when it was added got a value of in MySQL and not in the binlog: add columns as NULL without a default (fill them with UPDATE), or copy every table again with a new copy=TAG in the source URI",
					ErrSchemaChange, t, c.Name, c.SQLType)
			}
			var err error
			if rt, err = cat.AddColumn(ctx, rt.ID, catalog.Column{Name: c.Name, Type: c.Type, Nullable: true}); err != nil {
				return fmt.Errorf("add column %s (%s) of %s to Retina's table %s: %w", c.Name, c.SQLType, t, name, err)
			}
			j = rt.Schema.ColumnIndex(c.Name)
		}
		if rt.Schema.Columns[j].Type != c.Type {
			return fmt.Errorf("%w: %s column %s is %s in MySQL (Retina type %s), %s in Retina: Retina cannot change a column's type; change it back, or copy every table again with a new copy=TAG in the source URI after dropping Retina's table",
				ErrSchemaChange, t, c.Name, c.SQLType, c.Type, rt.Schema.Columns[j].Type)
		}
		pos[i] = j
	}
	var absent []int
	for j, hc := range rt.Schema.Columns {
		if slices.Contains(pos, j) || (t.keyless() && (hc.Name == keylessPos || hc.Name == keylessRow)) {
			continue
		}
		absent = append(absent, j)
		if !hc.Nullable {
			return fmt.Errorf("%w: %s has no column %s, which is NOT NULL in Retina (renamed or dropped in MySQL): add it back, or copy every table again with a new copy=TAG in the source URI after dropping Retina's table", ErrSchemaChange, t, hc.Name)
		}
	}
	if !slices.EqualFunc(want.PrimaryKey, rt.Schema.PrimaryKey, strings.EqualFold) {
		return fmt.Errorf("%w: %s has key (%s), Retina's table %s (%s): Retina cannot change a table's key", ErrSchemaChange, t, strings.Join(want.PrimaryKey, ", "), name, strings.Join(rt.Schema.PrimaryKey, ", "))
	}
	t.retina, t.pos, t.keyPos, t.absent = rt, pos, rt.Schema.KeyColumns(), absent
	return nil
}

// fromTableMap reads a table's columns from a binlog table map event: the
// table as it was at that point of the binlog. It needs the full metadata
// (binlog_row_metadata = FULL): names, signedness, character sets, ENUM
// and SET values and the primary key. collations maps collation ids to
// character sets.
func fromTableMap(e *replication.TableMapEvent, collations map[uint64]string) (*table, error) {
	t := &table{Database: string(e.Schema), Name: string(e.Table)}
	names := e.ColumnNameString()
	if len(names) != int(e.ColumnCount) {
		return nil, fmt.Errorf("the binlog's table map of %s has no column names: set binlog_row_metadata = FULL", t)
	}
	unsigned := e.UnsignedMap()
	coll := e.CollationMap()
	enumSetColl := e.EnumSetCollationMap()
	enums, sets := e.EnumStrValueMap(), e.SetStrValueMap()
	for i := range int(e.ColumnCount) {
		c := column{Name: names[i], Unsigned: unsigned[i]}
		if ok, null := e.Nullable(i); ok {
			c.Nullable = null
		}
		tp, meta := e.ColumnType[i], e.ColumnMeta[i]
		if tp == gomysql.MYSQL_TYPE_STRING && meta >= 256 {
			b0, b1 := byte(meta>>8), byte(meta)
			if b0&0x30 != 0x30 { // long CHAR: part of the length sits in b0
				c.Pad = int(uint16(b1) | uint16((b0&0x30)^0x30)<<4)
				b0 |= 0x30
			} else {
				c.Pad = int(b1)
			}
			if b0 == gomysql.MYSQL_TYPE_ENUM || b0 == gomysql.MYSQL_TYPE_SET {
				tp = b0
			}
		}
		switch tp {
		case gomysql.MYSQL_TYPE_TINY:
			c.Kind, c.Bits, c.SQLType = kInt, 8, "tinyint"
		case gomysql.MYSQL_TYPE_SHORT:
			c.Kind, c.Bits, c.SQLType = kInt, 16, "smallint"
		case gomysql.MYSQL_TYPE_INT24:
			c.Kind, c.Bits, c.SQLType = kInt, 24, "mediumint"
		case gomysql.MYSQL_TYPE_LONG:
			c.Kind, c.Bits, c.SQLType = kInt, 32, "int"
		case gomysql.MYSQL_TYPE_LONGLONG:
			c.Kind, c.Bits, c.SQLType = kInt, 64, "bigint"
		case gomysql.MYSQL_TYPE_NEWDECIMAL:
			c.Kind, c.Precision, c.Scale = kDecimal, int(meta>>8), int(meta&0xff)
			c.SQLType = fmt.Sprintf("decimal(%d,%d)", c.Precision, c.Scale)
		case gomysql.MYSQL_TYPE_FLOAT:
			c.Kind, c.SQLType = kFloat, "float"
		case gomysql.MYSQL_TYPE_DOUBLE:
			c.Kind, c.SQLType = kDouble, "double"
		case gomysql.MYSQL_TYPE_DATE, gomysql.MYSQL_TYPE_NEWDATE:
			c.Kind, c.SQLType = kDate, "date"
		case gomysql.MYSQL_TYPE_DATETIME, gomysql.MYSQL_TYPE_DATETIME2:
			c.Kind, c.SQLType = kDatetime, "datetime"
			if tp == gomysql.MYSQL_TYPE_DATETIME2 {
				c.Scale = int(meta)
			}
		case gomysql.MYSQL_TYPE_TIMESTAMP, gomysql.MYSQL_TYPE_TIMESTAMP2:
			c.Kind, c.SQLType = kTimestamp, "timestamp"
			if tp == gomysql.MYSQL_TYPE_TIMESTAMP2 {
				c.Scale = int(meta)
			}
		case gomysql.MYSQL_TYPE_TIME, gomysql.MYSQL_TYPE_TIME2:
			c.Kind, c.SQLType = kTime, "time"
			if tp == gomysql.MYSQL_TYPE_TIME2 {
				c.Scale = int(meta)
			}
		case gomysql.MYSQL_TYPE_YEAR:
			c.Kind, c.SQLType = kYear, "year"
		case gomysql.MYSQL_TYPE_BIT:
			c.Kind, c.Bits, c.SQLType = kBit, int(meta>>8)*8+int(meta&0xff), "bit"
		case gomysql.MYSQL_TYPE_JSON:
			c.Kind, c.Charset, c.SQLType = kJSON, "utf8mb4", "json"
		case gomysql.MYSQL_TYPE_GEOMETRY:
			c.Kind, c.SQLType = kGeometry, "geometry"
		case gomysql.MYSQL_TYPE_ENUM, gomysql.MYSQL_TYPE_SET:
			c.Kind, c.SQLType, c.Values = kEnum, "enum", enums[i]
			if tp == gomysql.MYSQL_TYPE_SET {
				c.Kind, c.SQLType, c.Values = kSet, "set", sets[i]
			}
			c.Charset = collations[enumSetColl[i]]
			c.Pad = 0
		case gomysql.MYSQL_TYPE_STRING, gomysql.MYSQL_TYPE_VARCHAR, gomysql.MYSQL_TYPE_VAR_STRING, gomysql.MYSQL_TYPE_BLOB:
			id, ok := coll[i]
			if !ok {
				return nil, fmt.Errorf("the binlog's table map of %s has no character set of column %s: set binlog_row_metadata = FULL", t, c.Name)
			}
			if id == 63 { // binary
				c.Kind, c.SQLType = kBinary, "binary"
				if tp != gomysql.MYSQL_TYPE_STRING {
					c.Pad, c.SQLType = 0, "varbinary or blob"
				}
			} else {
				cs, ok := collations[id]
				if !ok {
					return nil, fmt.Errorf("%s column %s has collation id %d, which the server does not list in information_schema.COLLATIONS", t, c.Name, id)
				}
				c.Kind, c.Charset, c.Pad, c.SQLType = kText, cs, 0, "text ("+cs+")"
			}
		default:
			return nil, fmt.Errorf("%s column %s has binlog type %d, which Retina does not know", t, c.Name, tp)
		}
		if c.Unsigned {
			c.SQLType += " unsigned"
		}
		if err := c.prepare(); err != nil {
			return nil, fmt.Errorf("%s: %w", t, err)
		}
		t.Cols = append(t.Cols, c)
	}
	for _, k := range e.PrimaryKey {
		if int(k) < len(t.Cols) {
			t.Key = append(t.Key, t.Cols[k].Name)
		}
	}
	return t, nil
}

// querier runs a query and hands back its rows as strings (NULL as nil).
type querier func(ctx context.Context, sql string, args ...any) ([][]*string, error)

// describe reads a table's columns and key from information_schema: the
// table as it is now (the initial copy reads it in its snapshot, and DDL
// on it waits for the copy's transaction).
func describe(ctx context.Context, q querier, db, name string) (*table, error) {
	t := &table{Database: db, Name: name}
	rows, err := q(ctx, `SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE, NUMERIC_PRECISION, NUMERIC_SCALE,
		DATETIME_PRECISION, CHARACTER_SET_NAME, CHARACTER_OCTET_LENGTH
		FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION`, db, name)
	if err != nil {
		return nil, fmt.Errorf("columns of %s: %w", t, err)
	}
	num := func(p *string) int {
		if p == nil {
			return 0
		}
		n, _ := strconv.Atoi(*p)
		return n
	}
	str := func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	}
	for _, r := range rows {
		c := column{Name: str(r[0]), Nullable: str(r[3]) == "YES", SQLType: str(r[2])}
		dt, ct := strings.ToLower(str(r[1])), strings.ToLower(str(r[2]))
		c.Unsigned = strings.Contains(ct, "unsigned")
		switch dt {
		case "tinyint":
			c.Kind, c.Bits = kInt, 8
		case "smallint":
			c.Kind, c.Bits = kInt, 16
		case "mediumint":
			c.Kind, c.Bits = kInt, 24
		case "int", "integer":
			c.Kind, c.Bits = kInt, 32
		case "bigint":
			c.Kind, c.Bits = kInt, 64
		case "decimal", "numeric":
			c.Kind, c.Precision, c.Scale = kDecimal, num(r[4]), num(r[5])
		case "float":
			c.Kind = kFloat
		case "double", "real", "double precision":
			c.Kind = kDouble
		case "date":
			c.Kind = kDate
		case "datetime":
			c.Kind, c.Scale = kDatetime, num(r[6])
		case "timestamp":
			c.Kind, c.Scale = kTimestamp, num(r[6])
		case "time":
			c.Kind, c.Scale = kTime, num(r[6])
		case "year":
			c.Kind = kYear
		case "bit":
			c.Kind, c.Bits = kBit, num(r[4])
		case "json":
			c.Kind, c.Charset = kJSON, "utf8mb4"
		case "enum", "set":
			c.Kind, c.Charset = kEnum, str(r[7])
			if dt == "set" {
				c.Kind = kSet
			}
			if c.Values, err = enumValues(str(r[2])); err != nil {
				return nil, fmt.Errorf("%s column %s: %w", t, c.Name, err)
			}
		case "char", "varchar", "tinytext", "text", "mediumtext", "longtext":
			c.Kind, c.Charset = kText, str(r[7])
			if c.Charset == "binary" || c.Charset == "" {
				c.Kind = kBinary
				if dt == "char" {
					c.Pad = num(r[8])
				}
			}
		case "binary":
			c.Kind, c.Pad = kBinary, num(r[8])
		case "varbinary", "tinyblob", "blob", "mediumblob", "longblob":
			c.Kind = kBinary
		case "geometry", "point", "linestring", "polygon", "multipoint", "multilinestring", "multipolygon", "geometrycollection", "geomcollection":
			c.Kind = kGeometry
		default:
			return nil, fmt.Errorf("%s column %s has type %s, which Retina does not know: leave the table out (tables=…)", t, c.Name, ct)
		}
		if err := c.prepare(); err != nil {
			return nil, fmt.Errorf("%s: %w", t, err)
		}
		t.Cols = append(t.Cols, c)
	}
	if len(t.Cols) == 0 {
		return nil, fmt.Errorf("table %s not found (or the user may not read it: GRANT SELECT ON %s.* TO the source's user)", t, db)
	}
	keys, err := q(ctx, `SELECT COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE
		WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? AND CONSTRAINT_NAME = 'PRIMARY' ORDER BY ORDINAL_POSITION`, db, name)
	if err != nil {
		return nil, fmt.Errorf("key of %s: %w", t, err)
	}
	for _, k := range keys {
		if k[0] != nil {
			t.Key = append(t.Key, *k[0])
		}
	}
	return t, nil
}

// enumValues reads the names of enum('a','b') or set('a','b').
func enumValues(colType string) ([]string, error) {
	open := strings.IndexByte(colType, '(')
	if open < 0 || !strings.HasSuffix(colType, ")") {
		return nil, fmt.Errorf("cannot read the values of %s", colType)
	}
	s := colType[open+1 : len(colType)-1]
	var out []string
	for i := 0; i < len(s); {
		if s[i] != '\'' {
			return nil, fmt.Errorf("cannot read the values of %s", colType)
		}
		var b strings.Builder
		i++
		for ; i < len(s); i++ {
			if s[i] == '\'' {
				if i+1 < len(s) && s[i+1] == '\'' {
					b.WriteByte('\'')
					i++
					continue
				}
				break
			}
			if s[i] == '\\' && i+1 < len(s) {
				i++
			}
			b.WriteByte(s[i])
		}
		out = append(out, b.String())
		i++ // closing quote
		if i < len(s) && s[i] == ',' {
			i++
		}
	}
	return out, nil
}
