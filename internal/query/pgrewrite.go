package query

import (
	"bytes"
	"context"
	"database/sql/driver"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/duckdb/duckdb-go/v2"

	"github.com/retinadb/retina/internal/catalog"
)

// A SELECT is parsed by DuckDB (json_serialize_sql) before it is planned,
// for two things PostgreSQL clients expect:
//   - references to pg_catalog and information_schema, and calls of the
//     PostgreSQL functions Retina provides, go to Retina's catalogs
//     (pgcatalog.go); casts to PostgreSQL's catalog types (regclass, oid, …)
//     become lookups; COLLATE pg_catalog.default goes. The tree is turned
//     back into SQL by DuckDB (json_deserialize_sql).
//   - result columns get PostgreSQL's names (pgnames.go).
//
// Statements other than SELECT (EXPLAIN, SHOW, …) are planned as written.

// parsed is a statement as DuckDB parsed it.
type parsed struct {
	stmt     map[string]any // the one statement's tree; nil if DuckDB could not serialize it
	text     string         // SQL to plan: the rewritten tree, or the original text
	describe string         // SQL that describes the statement's parameters and columns
}

// rewriteWords are what a statement needing a rewrite mentions: catalog
// schemas and tables, the functions Retina provides, catalog types and the
// keywords DuckDB reads otherwise.
var rewriteWords = func() []string {
	words := []string{"pg_", "information_schema", "current_user", "session_user", "current_role", "regclass", "regtype",
		"regproc", "regnamespace", "regrole", "::oid", "as oid", "collate", "extract", "bytea", "::name", "as name",
		"::char", "as char", `"char"`, "::bpchar"}
	for _, m := range []map[string]bool{pgFunctionNames, infoFunctionNames} {
		for name := range m {
			words = append(words, name)
		}
	}
	return words
}()

// mayNeedRewrite reports a statement that may mention what the rewrite
// changes; false is certain, true is a guess.
func mayNeedRewrite(text string) bool {
	lower := strings.ToLower(text)
	for _, w := range rewriteWords {
		if strings.Contains(lower, w) {
			return true
		}
	}
	return false
}

// mayBePointLookup reports a statement that may select by key equality.
func mayBePointLookup(text string) bool {
	lower := strings.ToLower(text)
	return strings.Contains(lower, "where") && strings.Contains(lower, "=")
}

// plainNames reports columns DuckDB named as PostgreSQL would: every name
// an identifier, as DuckDB gives a column reference or an alias. A
// constant true, false or null is named by its text, not as PostgreSQL
// names it.
func plainNames(cols []Column) bool {
	for _, c := range cols {
		switch strings.ToLower(c.Name) {
		case "true", "false", "null", "":
			return false
		}
		for i, r := range c.Name {
			if !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= 0x80 || i > 0 && (r >= '0' && r <= '9' || r == '$')) {
				return false
			}
		}
	}
	return true
}

// parse serializes text's tree and, when rewrite is set, rewrites it where
// needed and returns the SQL to plan.
func (s *Session) parse(ctx context.Context, text string, rewrite bool) (parsed, error) {
	out := parsed{text: text, describe: text}
	raw, err := s.scalarString(ctx, "SELECT json_serialize_sql($1::VARCHAR)", text)
	if err != nil {
		return out, err
	}
	decode := func() (map[string]any, error) {
		dec := json.NewDecoder(strings.NewReader(raw))
		dec.UseNumber() // keeps 64-bit locations exact
		var doc map[string]any
		if err := dec.Decode(&doc); err != nil {
			return nil, fmt.Errorf("query: parse tree of %q: %w", text, err)
		}
		return doc, nil
	}
	doc, err := decode()
	if err != nil {
		return out, err
	}
	if b, _ := doc["error"].(bool); b {
		return out, nil // not a SELECT: planned as written
	}
	stmts := arr(doc["statements"])
	if len(stmts) != 1 {
		return out, nil
	}
	out.stmt = obj(stmts[0])
	if !rewrite {
		return out, nil
	}
	// The rewrite works on a copy: columns are named by what the client
	// wrote.
	snap := s.e.cfg.Catalog.Snapshot()
	rw := &rewriter{text: text, path: s.searchPath(), has: func(name string) bool { _, ok := snap.Table(name); return ok }}
	if s.e.cfg.Index != nil {
		rw.pointKey = func(name string) (string, bool) {
			t, ok := snap.Table(name)
			if !ok || len(t.Schema.PrimaryKey) != 1 || t.Schema.GeneratedKey {
				return "", false
			}
			c := t.Schema.ColumnIndex(t.Schema.PrimaryKey[0])
			return t.Schema.PrimaryKey[0], c >= 0 && pointLookupKind(t.Schema.Columns[c].Type)
		}
	}
	if out.text, err = s.rewritten(ctx, text, decode, rw); err != nil {
		return out, err
	}
	out.describe = out.text
	if rw.lookups > 0 {
		// DuckDB cannot type a table function's result before its
		// arguments' values are known: the statement is described by the
		// same rewrite without point lookups.
		rw.pointKey, rw.lookups = nil, 0
		if out.describe, err = s.rewritten(ctx, text, decode, rw); err != nil {
			return out, err
		}
	}
	return out, nil
}

// rewritten is text's tree rewritten by rw, as SQL (text itself when
// nothing changed).
func (s *Session) rewritten(ctx context.Context, text string, decode func() (map[string]any, error), rw *rewriter) (string, error) {
	doc, err := decode()
	if err != nil {
		return "", err
	}
	if !rw.rewriteCatalogRefs(obj(arr(doc["statements"])[0])) {
		return text, nil
	}
	clampLocations(doc)
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(doc); err != nil {
		return "", err
	}
	sql, err := s.scalarString(ctx, "SELECT json_deserialize_sql($1::JSON)", buf.String())
	if err != nil {
		return "", fmt.Errorf("query: rewriting %q for Retina's catalogs: %w", text, err)
	}
	return sql, nil
}

// scalarString runs a one-value query on the session's connection; the
// session keeps the query prepared.
func (s *Session) scalarString(ctx context.Context, q string, arg string) (string, error) {
	st, ok := s.helpers[q]
	if !ok {
		ds, err := s.conn.PrepareContext(ctx, q)
		if err != nil {
			return "", engineError(err)
		}
		if st, ok = ds.(*duckdb.Stmt); !ok {
			ds.Close()
			return "", fmt.Errorf("query: unexpected statement type %T", ds)
		}
		if s.helpers == nil {
			s.helpers = map[string]*duckdb.Stmt{}
		}
		s.helpers[q] = st
	}
	rows, err := st.QueryContext(ctx, []driver.NamedValue{{Ordinal: 1, Value: arg}})
	if err != nil {
		return "", engineError(err)
	}
	defer rows.Close()
	dst := make([]driver.Value, 1)
	if err := rows.Next(dst); err != nil {
		if err == io.EOF {
			return "", fmt.Errorf("query: %s returned no row", q)
		}
		return "", engineError(err)
	}
	switch v := dst[0].(type) {
	case string:
		return v, nil
	case []byte:
		return string(v), nil
	case map[string]any, []any: // a JSON value the driver decoded
		b, err := json.Marshal(v)
		return string(b), err
	}
	return fmt.Sprint(dst[0]), nil
}

// rewriter rewrites one statement's tree.
type rewriter struct {
	text string // the statement the tree was parsed from
	// path are the schemas an unqualified table is looked for in (the
	// session's search_path beyond public); has says whether Retina has a
	// table of that catalog name.
	path []string
	has  func(name string) bool
	ctes map[string]bool // names of common table expressions, never tables
	// pointKey is the primary-key column of a table point lookups serve
	// (lookup.go), by catalog name.
	pointKey func(name string) (string, bool)
	lookups  int // point lookups rewritten
}

// rewriteCatalogRefs points catalog references of a tree at Retina's
// catalogs and unqualified tables at their schema on the search path; it
// reports whether anything changed.
func (r *rewriter) rewriteCatalogRefs(n any) bool {
	r.ctes = map[string]bool{}
	collectCTEs(n, r.ctes)
	changed := false
	var walk func(v any) any
	walk = func(v any) any {
		switch x := v.(type) {
		case []any:
			for i := range x {
				x[i] = walk(x[i])
			}
			return x
		case map[string]any:
			if y, ok := r.rewriteNode(x); ok {
				changed = true
				x = y
			}
			for k, child := range x {
				x[k] = walk(child)
			}
			return x
		}
		return v
	}
	walk(n)
	return changed
}

// resolve is the catalog name an unqualified or schema-qualified table
// reference means, if Retina has that table.
func (r *rewriter) resolve(schema, table string) (string, bool) {
	if schema != "" {
		name := catalog.TableName(schema, table)
		return name, r.has(name)
	}
	if r.ctes[table] {
		return "", false
	}
	for _, s := range r.path {
		if name := catalog.TableName(s, table); r.has(name) {
			return name, true
		}
	}
	return table, r.has(table)
}

// pointLookup reads a SELECT of one Retina table whose WHERE says its
// primary key equals a constant or a parameter through retina_lookup.
func (r *rewriter) pointLookup(x map[string]any) (map[string]any, bool) {
	from := obj(x["from_table"])
	if str(from["type"]) != "BASE_TABLE" || str(from["catalog_name"]) != "" || len(arr(from["column_name_alias"])) > 0 {
		return nil, false
	}
	table := str(from["table_name"])
	name, ok := r.resolve(strings.ToLower(str(from["schema_name"])), strings.ToLower(table))
	if !ok {
		return nil, false
	}
	pk, ok := r.pointKey(name)
	if !ok {
		return nil, false
	}
	ref := str(from["alias"])
	if ref == "" {
		ref = table
	}
	value := keyEquality(obj(x["where_clause"]), pk, ref)
	if value == nil {
		return nil, false
	}
	key := map[string]any{"class": "CAST", "type": "OPERATOR_CAST", "alias": "", "query_location": json.Number("0"),
		"try_cast": false, "child": cloneTree(value),
		"type_expr": map[string]any{"class": "TYPE", "type": "TYPE", "alias": "", "catalog": "", "schema": "",
			"type_name": "VARCHAR", "children": []any{}, "qualified_name": map[string]any{"path": []any{"VARCHAR"}},
			"query_location": json.Number("0")}}
	fn := callIn("", "retina_lookup", map[string]any{"class": "CONSTANT", "type": "VALUE_CONSTANT", "alias": "",
		"query_location": json.Number("0"), "literal": map[string]any{"kind": "STRING", "text": name}})
	fn["arguments"] = append(arr(fn["arguments"]), map[string]any{"name": "", "expression": key})
	r.lookups++
	x["from_table"] = map[string]any{"type": "TABLE_FUNCTION", "alias": ref, "sample": nil,
		"query_location": json.Number("0"), "function": fn, "column_name_alias": []any{},
		"with_ordinality": "WITHOUT_ORDINALITY"}
	return x, true
}

// keyEquality finds, among the top-level conjuncts of where, column = value
// for the key column (bare or qualified by ref) and a constant or
// parameter value, and returns the value.
func keyEquality(where map[string]any, column, ref string) map[string]any {
	if where == nil {
		return nil
	}
	if str(where["type"]) == "CONJUNCTION_AND" {
		for _, c := range arr(where["children"]) {
			if v := keyEquality(obj(c), column, ref); v != nil {
				return v
			}
		}
		return nil
	}
	if str(where["type"]) != "COMPARE_EQUAL" {
		return nil
	}
	isKey := func(e map[string]any) bool {
		names := arr(e["column_names"])
		if str(e["class"]) != "COLUMN_REF" || len(names) == 0 || len(names) > 2 || !strings.EqualFold(str(names[len(names)-1]), column) {
			return false
		}
		return len(names) == 1 || strings.EqualFold(str(names[0]), ref)
	}
	isValue := func(e map[string]any) bool {
		switch str(e["class"]) {
		case "PARAMETER":
			return true
		case "CONSTANT":
			return str(obj(e["literal"])["kind"]) != "NULL" && e["literal"] != nil
		case "CAST":
			c := obj(e["child"])
			return str(c["class"]) == "PARAMETER" || str(c["class"]) == "CONSTANT"
		}
		return false
	}
	l, rt := obj(where["left"]), obj(where["right"])
	switch {
	case isKey(l) && isValue(rt):
		return rt
	case isKey(rt) && isValue(l):
		return l
	}
	return nil
}

// cloneTree copies a parse tree.
func cloneTree(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, c := range x {
			out[k] = cloneTree(c)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, c := range x {
			out[i] = cloneTree(c)
		}
		return out
	}
	return v
}

// collectCTEs gathers the names of the tree's common table expressions.
func collectCTEs(v any, out map[string]bool) {
	switch x := v.(type) {
	case []any:
		for _, c := range x {
			collectCTEs(c, out)
		}
	case map[string]any:
		if m := obj(x["cte_map"]); m != nil {
			for _, e := range arr(m["map"]) {
				out[strings.ToLower(str(obj(e)["key"]))] = true
			}
		}
		for _, c := range x {
			collectCTEs(c, out)
		}
	}
}

// rewriteNode rewrites one node, or reports it unchanged.
func (r *rewriter) rewriteNode(x map[string]any) (map[string]any, bool) {
	text := r.text
	switch {
	case str(x["type"]) == "SELECT_NODE" && r.pointKey != nil:
		return r.pointLookup(x)
	case str(x["type"]) == "BASE_TABLE":
		schema, table := strings.ToLower(str(x["schema_name"])), strings.ToLower(str(x["table_name"]))
		target := ""
		switch {
		case schema == "" && str(x["catalog_name"]) == "" && len(r.path) > 0 && !r.ctes[table] && !strings.HasPrefix(table, "pg_"):
			// The first schema of the search path that has the table; a
			// table of public needs nothing (every session works there).
			for _, s := range r.path {
				if r.has(catalog.TableName(s, table)) {
					if s != catalog.DefaultSchema {
						target = s
					}
					break
				}
			}
		case schema == "pg_catalog" && catalogTables[catalogSchema][table]:
			target = catalogSchema
		case schema == "information_schema" && catalogTables[infoSchema][table]:
			target = infoSchema
		case schema == "" && str(x["catalog_name"]) == "" && strings.HasPrefix(table, "pg_") && catalogTables[catalogSchema][table]:
			target = catalogSchema // pg_catalog is always on PostgreSQL's search path
		}
		if target == "" {
			return nil, false
		}
		x["catalog_name"], x["schema_name"], x["table_name"] = dbName, target, table
		x["qualified_name"] = map[string]any{"path": []any{dbName, target, table}}
		return x, true
	case str(x["class"]) == "FUNCTION" || str(x["class"]) == "WINDOW":
		schema, name := strings.ToLower(str(x["schema"])), strings.ToLower(str(x["function_name"]))
		if b, _ := x["is_operator"].(bool); b {
			if schema == "pg_catalog" {
				x["schema"] = ""
				return x, true
			}
			return nil, false
		}
		if name == "date_part" && schema == "" && functionName(x, text) == "extract" {
			return rewriteExtract(x)
		}
		switch {
		case schema == "information_schema" && infoFunctionNames[name]:
			x["catalog"], x["schema"], x["function_name"] = dbName, infoSchema, name
			x["qualified_name"] = map[string]any{"path": []any{dbName, infoSchema, name}}
			return x, true
		case (schema == "pg_catalog" || schema == "") && pgFunctionNames[name]:
			x["catalog"], x["schema"], x["function_name"] = dbName, catalogSchema, name
			x["qualified_name"] = map[string]any{"path": []any{dbName, catalogSchema, name}}
			return x, true
		case schema == "pg_catalog":
			x["schema"] = "" // a DuckDB built-in of that name
			x["qualified_name"] = map[string]any{"path": []any{name}}
			return x, true
		}
	case str(x["class"]) == "COLUMN_REF":
		// CURRENT_USER and its kin are keywords in PostgreSQL; DuckDB's
		// parser leaves them as column names.
		names := arr(x["column_names"])
		if len(names) != 1 {
			return nil, false
		}
		switch name := strings.ToLower(str(names[0])); name {
		case "current_user", "session_user", "current_role", "current_schema":
			c := call(name, nil)
			c["arguments"] = []any{}
			c["alias"] = name
			return c, true
		}
	case str(x["class"]) == "CAST":
		child := obj(x["child"])
		switch name := strings.ToLower(str(obj(x["type_expr"])["type_name"])); name {
		case "bytea", "blob":
			// '\x0aff'::bytea is PostgreSQL's hex form; DuckDB would read
			// \x0a as an escape and the rest as text.
			lit := obj(child["literal"])
			if v := str(lit["text"]); str(child["class"]) == "CONSTANT" && str(lit["kind"]) == "STRING" && strings.HasPrefix(v, `\x`) {
				lit["text"] = v[2:]
				c := callIn("", "unhex", child)
				c["alias"] = x["alias"]
				return c, true
			}
		case "regclass", "regtype", "regnamespace", "regproc", "regprocedure":
			if name == "regprocedure" {
				name = "regproc"
			}
			return call(name, x["child"]), true
		}
	case str(x["class"]) == "TYPE":
		name, schema := strings.ToLower(str(x["type_name"])), strings.ToLower(str(x["schema"]))
		switch name {
		case "oid", "xid", "cid", "tid", "regclass", "regtype", "regnamespace", "regproc", "regprocedure", "regrole":
			setType(x, "BIGINT") // PostgreSQL's catalog types are numbers here
			return x, true
		case "name", "char", "bpchar", "int2vector", "oidvector", "pg_node_tree", "aclitem":
			setType(x, "VARCHAR")
			return x, true
		}
		if schema == "pg_catalog" {
			setType(x, name)
			return x, true
		}
	case str(x["class"]) == "COLLATE":
		// Retina compares strings one way; PostgreSQL's default collation
		// names that way (and C and POSIX are byte order as well).
		c := strings.ToLower(strings.Trim(str(x["collation"]), `"`))
		if c == "pg_catalog.default" || c == "default" || c == "c" || c == "posix" || c == `pg_catalog."c"` || c == "pg_catalog.c" {
			if child := obj(x["child"]); child != nil {
				if alias := str(x["alias"]); alias != "" {
					child["alias"] = alias
				}
				return child, true
			}
		}
	}
	return nil, false
}

// clampLocations sets the "no location" marker (2^64 − 1), which DuckDB
// writes but does not read back as a number, to 0.
func clampLocations(v any) {
	switch x := v.(type) {
	case []any:
		for _, c := range x {
			clampLocations(c)
		}
	case map[string]any:
		for k, c := range x {
			if n, ok := c.(json.Number); ok {
				if _, err := n.Int64(); err != nil {
					x[k] = json.Number("0")
				}
				continue
			}
			clampLocations(c)
		}
	}
}

// rewriteExtract gives EXTRACT PostgreSQL's result type, numeric: whole
// for most fields, with six decimals for second and epoch, three for
// milliseconds.
func rewriteExtract(x map[string]any) (map[string]any, bool) {
	args := arr(x["arguments"])
	if len(args) != 2 {
		return nil, false
	}
	field := obj(obj(args[0])["expression"])
	if str(field["class"]) != "CONSTANT" {
		return nil, false
	}
	name := "pg_extract_int"
	keep := args
	switch strings.ToLower(str(obj(field["literal"])["text"])) {
	case "second", "seconds":
		name, keep = "pg_extract_second", args[1:]
	case "millisecond", "milliseconds":
		name, keep = "pg_extract_milliseconds", args[1:]
	case "epoch":
		name, keep = "pg_extract_epoch", args[1:]
	}
	x["function_name"], x["schema"], x["catalog"], x["arguments"] = name, catalogSchema, dbName, keep
	x["qualified_name"] = map[string]any{"path": []any{dbName, catalogSchema, name}}
	if str(x["alias"]) == "" {
		x["alias"] = "extract"
	}
	return x, true
}

// call makes a call of a catalog function of one argument.
func call(name string, arg any) map[string]any { return callIn(catalogSchema, name, arg) }

// callIn makes a call of a function of one argument in schema ("" for
// DuckDB's built-ins).
func callIn(schema, name string, arg any) map[string]any {
	catalog, path := "", []any{name}
	if schema != "" {
		catalog, path = dbName, []any{dbName, schema, name}
	}
	return map[string]any{
		"class": "FUNCTION", "type": "FUNCTION", "alias": "", "query_location": json.Number("0"),
		"function_name": name, "schema": schema, "catalog": catalog,
		"qualified_name": map[string]any{"path": path},
		"arguments":      []any{map[string]any{"name": "", "expression": arg}},
		"distinct":       false, "is_operator": false, "export_state": false, "filter": nil,
		"order_bys": map[string]any{"type": "ORDER_MODIFIER", "orders": []any{}},
	}
}

func setType(t map[string]any, name string) {
	t["type_name"], t["schema"], t["catalog"] = name, "", ""
	t["qualified_name"] = map[string]any{"path": []any{name}}
}
