package query

import (
	"strings"
)

// PostgreSQL names a result column the engine did not get an alias for by
// the expression's form (FigureColname): a column reference by its column,
// a function call by its function, a cast by what it casts (or the type),
// CASE by its ELSE branch or "case", and anything else "?column?". DuckDB
// names them by the expression's text ("count_star()", "(a + 1)"), which
// drivers and BI tools show and key results by. The names are worked out
// from DuckDB's own parse of the statement (json_serialize_sql).

// unknownName is PostgreSQL's name for an expression it cannot name.
const unknownName = "?column?"

// pgColumnNames names the columns of a parsed SELECT; entries are "" where
// the engine's name stands (columns a * expanded to, DuckDB-only forms).
// columns is how many columns the statement returns.
func pgColumnNames(stmt map[string]any, text string, columns int) []string {
	node := obj(stmt["node"])
	for node != nil && str(node["type"]) == "SET_OPERATION_NODE" {
		// A UNION's columns are named by its first SELECT.
		kids := arr(node["children"])
		if len(kids) == 0 {
			if node = obj(node["left"]); node == nil {
				return nil
			}
			continue
		}
		node = obj(kids[0])
	}
	if node == nil || str(node["type"]) != "SELECT_NODE" {
		return nil
	}
	list := arr(node["select_list"])
	stars := 0
	for _, e := range list {
		if str(obj(e)["class"]) == "STAR" {
			stars++
		}
	}
	// A * stands for as many columns as are left over; with two or more
	// stars the split is unknown, and the engine's names stay.
	if stars > 1 || (stars == 0 && len(list) != columns) || len(list)-stars > columns {
		return nil
	}
	out := make([]string, 0, columns)
	for _, e := range list {
		if str(obj(e)["class"]) == "STAR" {
			for range columns - (len(list) - 1) {
				out = append(out, "")
			}
			continue
		}
		name, _ := figureName(obj(e), text)
		out = append(out, name)
	}
	return out
}

// figureName names one select-list expression. strength is PostgreSQL's:
// 2 for a name taken from a column or an alias, 1 for a fallback such as a
// function or type name, 0 for none.
func figureName(e map[string]any, text string) (string, int) {
	if e == nil {
		return unknownName, 0
	}
	if alias := str(e["alias"]); alias != "" {
		return alias, 2
	}
	switch str(e["class"]) {
	case "COLUMN_REF":
		names := arr(e["column_names"])
		if len(names) > 0 {
			return str(names[len(names)-1]), 2
		}
	case "FUNCTION", "WINDOW", "AGGREGATE":
		if b, _ := e["is_operator"].(bool); b {
			return unknownName, 0
		}
		return functionName(e, text), 1
	case "CAST":
		if name, strength := figureName(obj(e["child"]), text); strength > 0 {
			return name, strength
		}
		return castTypeName(obj(e["type_expr"])), 1
	case "CASE":
		if name, strength := figureName(obj(e["else_expr"]), text); strength == 2 {
			return name, 2
		}
		return "case", 1
	case "OPERATOR":
		switch str(e["type"]) {
		case "OPERATOR_COALESCE":
			return "coalesce", 1
		}
	case "SUBQUERY":
		switch str(e["subquery_type"]) {
		case "EXISTS":
			return "exists", 1
		case "SCALAR":
			sub := obj(e["subquery"])
			if node := obj(sub["node"]); node != nil {
				if list := arr(node["select_list"]); len(list) > 0 {
					return figureName(obj(list[0]), text)
				}
			}
		case "ANY":
			return unknownName, 0
		}
	}
	return unknownName, 0
}

// functionName is a call's name as PostgreSQL's grammar has it.
func functionName(e map[string]any, text string) string {
	name := strings.ToLower(str(e["function_name"]))
	switch name {
	case "count_star":
		return "count"
	case "date_part":
		// EXTRACT(field FROM x) reaches DuckDB as date_part; PostgreSQL
		// names the column extract.
		if loc, ok := location(e); ok && loc < len(text) && strings.HasPrefix(strings.ToLower(text[loc:]), "extract") {
			return "extract"
		}
	case "list_value":
		return "array"
	}
	return name
}

// castTypeName is the name PostgreSQL gives a cast to a type: its
// internal type name (int4 for integer, and so on).
func castTypeName(t map[string]any) string {
	name := strings.ToLower(str(t["type_name"]))
	switch name {
	case "integer", "int", "int4", "signed":
		return "int4"
	case "bigint", "int8", "long":
		return "int8"
	case "smallint", "int2", "short":
		return "int2"
	case "real", "float4", "float":
		return "float4"
	case "double", "float8", "double precision":
		return "float8"
	case "boolean", "bool", "logical":
		return "bool"
	case "decimal", "numeric":
		return "numeric"
	case "timestamptz", "timestamp with time zone":
		return "timestamptz"
	case "string", "char", "bpchar":
		if name == "string" {
			return "varchar"
		}
		return "bpchar"
	case "":
		return unknownName
	}
	return name
}

func location(e map[string]any) (int, bool) {
	n, ok := e["query_location"].(interface{ Int64() (int64, error) })
	if !ok {
		return 0, false
	}
	v, err := n.Int64()
	return int(v), err == nil && v >= 0
}

func obj(v any) map[string]any { m, _ := v.(map[string]any); return m }
func arr(v any) []any          { a, _ := v.([]any); return a }
func str(v any) string         { s, _ := v.(string); return s }
