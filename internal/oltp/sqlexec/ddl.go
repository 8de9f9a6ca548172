package sqlexec

import (
	"context"
	"fmt"
	"strings"

	"vitess.io/vitess/go/vt/sqlparser"

	"github.com/retinadb/retina/internal/oltp/sqlstore"
	"github.com/retinadb/retina/internal/types"
)

// columnType maps a MySQL column type to a stored type, its declared text
// and the length bound of strings.
func columnType(ct *sqlparser.ColumnType) (types.Type, string, int, error) {
	name := strings.ToLower(ct.Type)
	length := 0
	if ct.Length != nil {
		length = *ct.Length
	}
	decl := name
	if ct.Length != nil {
		if ct.Scale != nil {
			decl = fmt.Sprintf("%s(%d,%d)", name, *ct.Length, *ct.Scale)
		} else {
			decl = fmt.Sprintf("%s(%d)", name, *ct.Length)
		}
	}
	if ct.Unsigned {
		decl += " unsigned"
	}
	unsigned := func(k, wider types.Kind) types.Type {
		if ct.Unsigned {
			return types.Of(wider)
		}
		return types.Of(k)
	}
	switch name {
	case "tinyint":
		if length == 1 && !ct.Unsigned {
			return types.Of(types.Int8), decl, 0, nil
		}
		return unsigned(types.Int8, types.Int16), decl, 0, nil
	case "bool", "boolean":
		return types.Of(types.Int8), "tinyint(1)", 0, nil
	case "smallint":
		return unsigned(types.Int16, types.Int32), decl, 0, nil
	case "mediumint", "int", "integer":
		return unsigned(types.Int32, types.Int64), decl, 0, nil
	case "bigint":
		return types.Of(types.Int64), decl, 0, nil
	case "float":
		return types.Of(types.Float32), decl, 0, nil
	case "double", "real", "double precision":
		return types.Of(types.Float64), decl, 0, nil
	case "decimal", "numeric", "dec", "fixed":
		p, s := 10, 0
		if ct.Length != nil {
			p = *ct.Length
		}
		if ct.Scale != nil {
			s = *ct.Scale
		}
		if p < 1 || p > types.MaxDecimalPrecision || s < 0 || s > p {
			return types.Type{}, "", 0, fmt.Errorf("%s: precision must be 1 to %d and scale 0 to the precision", decl, types.MaxDecimalPrecision)
		}
		return types.DecimalOf(uint8(p), uint8(s)), fmt.Sprintf("decimal(%d,%d)", p, s), 0, nil
	case "char", "varchar", "nchar", "nvarchar":
		if name == "char" && ct.Length == nil {
			length, decl = 1, "char(1)"
		}
		return types.Of(types.String), decl, length, nil
	case "tinytext", "text", "mediumtext", "longtext", "json", "enum", "set":
		return types.Of(types.String), decl, 0, nil
	case "binary", "varbinary":
		return types.Of(types.Bytes), decl, length, nil
	case "tinyblob", "blob", "mediumblob", "longblob":
		return types.Of(types.Bytes), decl, 0, nil
	case "date":
		return types.Of(types.Date), decl, 0, nil
	case "datetime", "timestamp":
		return types.Of(types.Timestamp), decl, 0, nil
	}
	return types.Type{}, "", 0, fmt.Errorf("column type %s is not supported; use an integer, decimal, float, double, char, varchar, text, binary, blob, date, datetime or timestamp type", ct.Type)
}

// tableFromDDL builds a table definition from CREATE TABLE. defaultEngine
// places the table when its DDL names no engine.
func tableFromDDL(ct *sqlparser.CreateTable, defaultEngine string) (sqlstore.Table, error) {
	name := ct.Table.Name.String()
	if ct.TableSpec == nil {
		return sqlstore.Table{}, fmt.Errorf("table %s: CREATE TABLE … LIKE and … AS SELECT are not supported; list the columns", name)
	}
	t := sqlstore.Table{Name: name, Engine: defaultEngine}
	colIndex := func(n string) (int, error) {
		if i := t.ColumnIndex(n); i >= 0 {
			return i, nil
		}
		return 0, fmt.Errorf("table %s: key column %s is not a column of the table", name, n)
	}
	for _, cd := range ct.TableSpec.Columns {
		typ, decl, maxLen, err := columnType(cd.Type)
		if err != nil {
			return t, fmt.Errorf("table %s, column %s: %w", name, cd.Name.String(), err)
		}
		c := sqlstore.Column{Name: cd.Name.String(), Type: typ, SQLType: decl, Nullable: true, MaxLen: maxLen}
		if o := cd.Type.Options; o != nil {
			if o.Null != nil && !*o.Null {
				c.Nullable = false
			}
			if o.Autoincrement {
				return t, fmt.Errorf("table %s, column %s: AUTO_INCREMENT is not supported yet; supply the values", name, c.Name)
			}
			if o.Default != nil {
				if _, isNull := o.Default.(*sqlparser.NullVal); !isNull {
					c.Default, c.HasDefault = sqlparser.String(o.Default), true
				}
			}
			switch o.KeyOpt {
			case sqlparser.ColKeyPrimary:
				if len(t.PK) > 0 {
					return t, fmt.Errorf("table %s: more than one primary key", name)
				}
				t.PK = []int{len(t.Columns)}
				c.Nullable = false
			case sqlparser.ColKeyUnique, sqlparser.ColKeyUniqueKey:
				t.Indexes = append(t.Indexes, sqlstore.Index{Name: c.Name, Columns: []int{len(t.Columns)}, Unique: true})
			}
		}
		t.Columns = append(t.Columns, c)
	}
	for _, id := range ct.TableSpec.Indexes {
		var cols []int
		for _, ic := range id.Columns {
			if ic.Expression != nil {
				return t, fmt.Errorf("table %s: index %s: expression keys are not supported", name, id.Info.Name.String())
			}
			i, err := colIndex(ic.Column.String())
			if err != nil {
				return t, err
			}
			cols = append(cols, i)
		}
		switch id.Info.Type {
		case sqlparser.IndexTypePrimary:
			if len(t.PK) > 0 {
				return t, fmt.Errorf("table %s: more than one primary key", name)
			}
			t.PK = cols
			for _, c := range cols {
				t.Columns[c].Nullable = false
			}
		case sqlparser.IndexTypeDefault, sqlparser.IndexTypeUnique:
			ixName := id.Info.Name.String()
			if ixName == "" {
				ixName = t.Columns[cols[0]].Name
			}
			t.Indexes = append(t.Indexes, sqlstore.Index{Name: ixName, Columns: cols, Unique: id.Info.Type == sqlparser.IndexTypeUnique})
		default:
			return t, fmt.Errorf("table %s: index %s: FULLTEXT and SPATIAL indexes are not supported", name, id.Info.Name.String())
		}
	}
	for _, o := range ct.TableSpec.Options {
		if strings.EqualFold(o.Name, "engine") {
			e, err := sqlstore.EngineName(o.String)
			if err != nil {
				return t, fmt.Errorf("table %s: %w", name, err)
			}
			t.Engine = e
		}
	}
	return t, nil
}

func (s *Session) createTable(ctx context.Context, ct *sqlparser.CreateTable) error {
	if ct.Temp {
		return fmt.Errorf("table %s: temporary tables are not supported", ct.Table.Name.String())
	}
	def, err := tableFromDDL(ct, s.e.placement(ct.Table.Name.String()))
	if err != nil {
		return err
	}
	return s.e.cat.Create(ctx, def, ct.IfNotExists)
}
