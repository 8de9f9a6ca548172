package catalog

import "strings"

// A table's name says its schema: "orders" is in schema public, and
// "sales.orders" is table orders of schema sales. Sources name tables so:
// a table of PostgreSQL's (or any source's) schema public, or of a source
// without schemas, by its plain name; any other schema's table with the
// schema first. Two source tables with one name in different schemas are
// two Retina tables. Schema names with a dot in them are not told apart.

// DefaultSchema is the schema of plainly named tables.
const DefaultSchema = "public"

// TableName is the catalog name of a source's table in a schema.
func TableName(schema, table string) string {
	if schema == "" || schema == DefaultSchema {
		return table
	}
	return schema + "." + table
}

// AppendTableName is TableName into dst, for a caller that interns names.
func AppendTableName(dst []byte, schema, table []byte) []byte {
	if len(schema) > 0 && string(schema) != DefaultSchema {
		dst = append(append(dst, schema...), '.')
	}
	return append(dst, table...)
}

// SplitTableName is a catalog name's schema and table.
func SplitTableName(name string) (schema, table string) {
	if s, t, ok := strings.Cut(name, "."); ok && s != "" && t != "" {
		return s, t
	}
	return DefaultSchema, name
}
