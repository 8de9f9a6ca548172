package query

import (
	"context"
	"database/sql"
	"fmt"
	"hash/fnv"
	"strings"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/types"
)

// PostgreSQL's catalogs, as clients query them (psql's \d commands, JDBC's
// DatabaseMetaData, BI tools' schema browsers), describing Retina's tables
// with PostgreSQL's names, type OIDs and type names. DuckDB has catalogs
// under the same names, but they describe DuckDB's own objects in DuckDB's
// types, and its pg_catalog schema cannot be added to; so Retina keeps its
// own in two schemas of the database, and pgrewrite.go points a statement's
// pg_catalog and information_schema references at them.
//
// The database is "retina"; every table is in schema "public".

const (
	dbName        = "retina"
	userSchema    = "public"
	catalogSchema = "pgcompat_catalog" // PostgreSQL's pg_catalog
	infoSchema    = "pgcompat_info"    // PostgreSQL's information_schema

	oidPGCatalog   = 11
	oidPublic      = 2200
	oidInfoSchema  = 13000
	oidDatabase    = 16383
	oidHeap        = 2
	oidBtree       = 403
	oidUser        = 10
	firstTableOID  = 16384
	oidsPerTable   = 16 // the table, its primary key index, up to 14 more indexes
	retinaUserName = "retina"
)

// firstSchemaOID is where the OIDs of schemas other than public start.
const firstSchemaOID = 1 << 30

// schemaOID is a schema's OID: stable for its name (a hash), unique among
// the schemas taken.
func schemaOID(name string, taken map[string]int64) int64 {
	h := fnv.New32a()
	h.Write([]byte(name))
	oid := firstSchemaOID + int64(h.Sum32()%(1<<29))
	for used := true; used; {
		used = false
		for _, o := range taken {
			if o == oid {
				used, oid = true, oid+1
			}
		}
	}
	return oid
}

// tableOID is a table's OID: stable for its catalog id.
func tableOID(id uint32) int64 { return firstTableOID + int64(id)*oidsPerTable }

// pgType is a row of pg_type.
type pgType struct {
	oid      int64
	name     string // typname
	format   string // format_type's rendering
	length   int
	category string
}

var pgTypes = []pgType{
	{pgtype.BoolOID, "bool", "boolean", 1, "B"},
	{pgtype.ByteaOID, "bytea", "bytea", -1, "U"},
	{pgtype.QCharOID, "char", `"char"`, 1, "Z"},
	{pgtype.NameOID, "name", "name", 64, "S"},
	{pgtype.Int8OID, "int8", "bigint", 8, "N"},
	{pgtype.Int2OID, "int2", "smallint", 2, "N"},
	{pgtype.Int4OID, "int4", "integer", 4, "N"},
	{pgtype.TextOID, "text", "text", -1, "S"},
	{pgtype.OIDOID, "oid", "oid", 4, "N"},
	{pgtype.JSONOID, "json", "json", -1, "U"},
	{pgtype.Float4OID, "float4", "real", 4, "N"},
	{pgtype.Float8OID, "float8", "double precision", 8, "N"},
	{pgtype.BPCharOID, "bpchar", "character", -1, "S"},
	{pgtype.VarcharOID, "varchar", "character varying", -1, "S"},
	{pgtype.DateOID, "date", "date", 4, "D"},
	{pgtype.TimeOID, "time", "time without time zone", 8, "D"},
	{pgtype.TimestampOID, "timestamp", "timestamp without time zone", 8, "D"},
	{pgtype.TimestamptzOID, "timestamptz", "timestamp with time zone", 8, "D"},
	{pgtype.IntervalOID, "interval", "interval", 16, "T"},
	{pgtype.NumericOID, "numeric", "numeric", -1, "N"},
	{pgtype.UUIDOID, "uuid", "uuid", 16, "U"},
}

func typeByOID(oid int64) pgType {
	for _, t := range pgTypes {
		if t.oid == oid {
			return t
		}
	}
	return pgType{oid: oid, name: "text", format: "text", length: -1, category: "S"}
}

// columnType is a Retina column's PostgreSQL type: OID and typmod.
func columnType(t types.Type) (oid int64, typmod int64) {
	switch t.Kind {
	case types.Int8, types.Int16:
		return pgtype.Int2OID, -1
	case types.Int32:
		return pgtype.Int4OID, -1
	case types.Int64:
		return pgtype.Int8OID, -1
	case types.Float32:
		return pgtype.Float4OID, -1
	case types.Float64:
		return pgtype.Float8OID, -1
	case types.Decimal:
		return pgtype.NumericOID, int64(t.Precision)<<16 | int64(t.Scale) + 4
	case types.Bytes:
		return pgtype.ByteaOID, -1
	case types.Bool:
		return pgtype.BoolOID, -1
	case types.Date:
		return pgtype.DateOID, -1
	case types.Timestamp:
		return pgtype.TimestampOID, -1
	case types.TimestampTZ:
		return pgtype.TimestamptzOID, -1
	}
	return pgtype.TextOID, -1
}

// catalogDDL creates the catalogs' tables; columns are PostgreSQL 15's,
// with DuckDB types close to PostgreSQL's (oid as BIGINT, arrays as lists).
var catalogDDL = []string{
	`CREATE SCHEMA IF NOT EXISTS ` + catalogSchema,
	`CREATE SCHEMA IF NOT EXISTS ` + infoSchema,
	`CREATE TABLE ` + catalogSchema + `.pg_namespace (oid BIGINT, nspname VARCHAR, nspowner BIGINT, nspacl VARCHAR[])`,
	`CREATE TABLE ` + catalogSchema + `.pg_class (oid BIGINT, relname VARCHAR, relnamespace BIGINT, reltype BIGINT,
		reloftype BIGINT, relowner BIGINT, relam BIGINT, relfilenode BIGINT, reltablespace BIGINT, relpages INTEGER,
		reltuples REAL, relallvisible INTEGER, reltoastrelid BIGINT, relhasindex BOOLEAN, relisshared BOOLEAN,
		relpersistence VARCHAR, relkind VARCHAR, relnatts SMALLINT, relchecks SMALLINT, relhasrules BOOLEAN,
		relhastriggers BOOLEAN, relhassubclass BOOLEAN, relrowsecurity BOOLEAN, relforcerowsecurity BOOLEAN,
		relispopulated BOOLEAN, relreplident VARCHAR, relispartition BOOLEAN, relrewrite BIGINT, relfrozenxid BIGINT,
		relminmxid BIGINT, relacl VARCHAR[], reloptions VARCHAR[], relpartbound VARCHAR)`,
	`CREATE TABLE ` + catalogSchema + `.pg_attribute (attrelid BIGINT, attname VARCHAR, atttypid BIGINT,
		attstattarget INTEGER, attlen SMALLINT, attnum SMALLINT, attndims INTEGER, attcacheoff INTEGER, atttypmod INTEGER,
		attbyval BOOLEAN, attalign VARCHAR, attstorage VARCHAR, attcompression VARCHAR, attnotnull BOOLEAN,
		atthasdef BOOLEAN, atthasmissing BOOLEAN, attidentity VARCHAR, attgenerated VARCHAR, attisdropped BOOLEAN,
		attislocal BOOLEAN, attinhcount INTEGER, attcollation BIGINT, attacl VARCHAR[], attoptions VARCHAR[],
		attfdwoptions VARCHAR[], attmissingval VARCHAR)`,
	`CREATE TABLE ` + catalogSchema + `.pg_type (oid BIGINT, typname VARCHAR, typnamespace BIGINT, typowner BIGINT,
		typlen SMALLINT, typbyval BOOLEAN, typtype VARCHAR, typcategory VARCHAR, typispreferred BOOLEAN,
		typisdefined BOOLEAN, typdelim VARCHAR, typrelid BIGINT, typsubscript BIGINT, typelem BIGINT, typarray BIGINT,
		typinput VARCHAR, typoutput VARCHAR, typreceive VARCHAR, typsend VARCHAR, typmodin VARCHAR, typmodout VARCHAR,
		typanalyze VARCHAR, typalign VARCHAR, typstorage VARCHAR, typnotnull BOOLEAN, typbasetype BIGINT,
		typtypmod INTEGER, typndims INTEGER, typcollation BIGINT, typdefaultbin VARCHAR, typdefault VARCHAR,
		typacl VARCHAR[], format_name VARCHAR)`,
	`CREATE TABLE ` + catalogSchema + `.pg_index (indexrelid BIGINT, indrelid BIGINT, indnatts SMALLINT,
		indnkeyatts SMALLINT, indisunique BOOLEAN, indnullsnotdistinct BOOLEAN, indisprimary BOOLEAN,
		indisexclusion BOOLEAN, indimmediate BOOLEAN, indisclustered BOOLEAN, indisvalid BOOLEAN,
		indcheckxmin BOOLEAN, indisready BOOLEAN, indislive BOOLEAN, indisreplident BOOLEAN, indkey SMALLINT[],
		indcollation BIGINT[], indclass BIGINT[], indoption SMALLINT[], indexprs VARCHAR, indpred VARCHAR,
		indexdef VARCHAR, constraintdef VARCHAR)`,
	`CREATE TABLE ` + catalogSchema + `.pg_constraint (oid BIGINT, conname VARCHAR, connamespace BIGINT,
		contype VARCHAR, condeferrable BOOLEAN, condeferred BOOLEAN, convalidated BOOLEAN, conrelid BIGINT,
		contypid BIGINT, conindid BIGINT, conparentid BIGINT, confrelid BIGINT, confupdtype VARCHAR,
		confdeltype VARCHAR, confmatchtype VARCHAR, conislocal BOOLEAN, coninhcount INTEGER, connoinherit BOOLEAN,
		conkey SMALLINT[], confkey SMALLINT[], conpfeqop BIGINT[], conppeqop BIGINT[], conffeqop BIGINT[],
		confdelsetcols SMALLINT[], conexclop BIGINT[], conbin VARCHAR, condef VARCHAR)`,
	`CREATE TABLE ` + catalogSchema + `.pg_database (oid BIGINT, datname VARCHAR, datdba BIGINT, encoding INTEGER,
		datlocprovider VARCHAR, datistemplate BOOLEAN, datallowconn BOOLEAN, datconnlimit INTEGER,
		datfrozenxid BIGINT, datminmxid BIGINT, dattablespace BIGINT, datcollate VARCHAR, datctype VARCHAR,
		daticulocale VARCHAR, datcollversion VARCHAR, datacl VARCHAR[])`,
	`CREATE TABLE ` + catalogSchema + `.pg_am (oid BIGINT, amname VARCHAR, amhandler VARCHAR, amtype VARCHAR)`,
	`CREATE TABLE ` + catalogSchema + `.pg_roles (oid BIGINT, rolname VARCHAR, rolsuper BOOLEAN, rolinherit BOOLEAN,
		rolcreaterole BOOLEAN, rolcreatedb BOOLEAN, rolcanlogin BOOLEAN, rolreplication BOOLEAN, rolconnlimit INTEGER,
		rolpassword VARCHAR, rolvaliduntil TIMESTAMPTZ, rolbypassrls BOOLEAN, rolconfig VARCHAR[])`,
	`CREATE TABLE ` + catalogSchema + `.pg_auth_members (oid BIGINT, roleid BIGINT, member BIGINT, grantor BIGINT, admin_option BOOLEAN)`,
	`CREATE TABLE ` + catalogSchema + `.pg_description (objoid BIGINT, classoid BIGINT, objsubid INTEGER, description VARCHAR)`,
	`CREATE TABLE ` + catalogSchema + `.pg_attrdef (oid BIGINT, adrelid BIGINT, adnum SMALLINT, adbin VARCHAR)`,
	`CREATE TABLE ` + catalogSchema + `.pg_collation (oid BIGINT, collname VARCHAR, collnamespace BIGINT)`,
	`CREATE TABLE ` + catalogSchema + `.pg_inherits (inhrelid BIGINT, inhparent BIGINT, inhseqno INTEGER, inhdetachpending BOOLEAN)`,
	`CREATE TABLE ` + catalogSchema + `.pg_proc (oid BIGINT, proname VARCHAR, pronamespace BIGINT, proowner BIGINT,
		prolang BIGINT, procost REAL, prorows REAL, provariadic BIGINT, prosupport VARCHAR, prokind VARCHAR,
		prosecdef BOOLEAN, proleakproof BOOLEAN, proisstrict BOOLEAN, proretset BOOLEAN, provolatile VARCHAR,
		proparallel VARCHAR, pronargs SMALLINT, pronargdefaults SMALLINT, prorettype BIGINT, proargtypes BIGINT[],
		proallargtypes BIGINT[], proargmodes VARCHAR[], proargnames VARCHAR[], proargdefaults VARCHAR,
		protrftypes BIGINT[], prosrc VARCHAR, probin VARCHAR, prosqlbody VARCHAR, proconfig VARCHAR[], proacl VARCHAR[])`,
	`CREATE TABLE ` + catalogSchema + `.pg_tablespace (oid BIGINT, spcname VARCHAR, spcowner BIGINT)`,
	`CREATE TABLE ` + catalogSchema + `.pg_policy (oid BIGINT, polname VARCHAR, polrelid BIGINT, polcmd VARCHAR,
		polpermissive BOOLEAN, polroles BIGINT[], polqual VARCHAR, polwithcheck VARCHAR)`,
	`CREATE TABLE ` + catalogSchema + `.pg_statistic_ext (oid BIGINT, stxrelid BIGINT, stxname VARCHAR,
		stxnamespace BIGINT, stxowner BIGINT, stxstattarget INTEGER, stxkeys SMALLINT[], stxkind VARCHAR[], stxexprs VARCHAR)`,
	`CREATE TABLE ` + catalogSchema + `.pg_publication (oid BIGINT, pubname VARCHAR, pubowner BIGINT, puballtables BOOLEAN,
		pubinsert BOOLEAN, pubupdate BOOLEAN, pubdelete BOOLEAN, pubtruncate BOOLEAN, pubviaroot BOOLEAN)`,
	`CREATE TABLE ` + catalogSchema + `.pg_publication_rel (oid BIGINT, prpubid BIGINT, prrelid BIGINT, prqual VARCHAR, prattrs SMALLINT[])`,
	`CREATE TABLE ` + catalogSchema + `.pg_publication_namespace (oid BIGINT, pnpubid BIGINT, pnnspid BIGINT)`,
	`CREATE TABLE ` + catalogSchema + `.pg_trigger (oid BIGINT, tgrelid BIGINT, tgparentid BIGINT, tgname VARCHAR,
		tgfoid BIGINT, tgtype SMALLINT, tgenabled VARCHAR, tgisinternal BOOLEAN)`,
	`CREATE TABLE ` + catalogSchema + `.pg_rewrite (oid BIGINT, rulename VARCHAR, ev_class BIGINT, ev_type VARCHAR, ev_enabled VARCHAR, is_instead BOOLEAN)`,
	`CREATE TABLE ` + catalogSchema + `.pg_foreign_table (ftrelid BIGINT, ftserver BIGINT, ftoptions VARCHAR[])`,
	`CREATE TABLE ` + catalogSchema + `.pg_partitioned_table (partrelid BIGINT, partstrat VARCHAR, partnatts SMALLINT)`,
	`CREATE TABLE ` + catalogSchema + `.pg_extension (oid BIGINT, extname VARCHAR, extowner BIGINT, extnamespace BIGINT, extversion VARCHAR)`,
	`CREATE TABLE ` + catalogSchema + `.pg_enum (oid BIGINT, enumtypid BIGINT, enumsortorder REAL, enumlabel VARCHAR)`,
	`CREATE TABLE ` + catalogSchema + `.pg_range (rngtypid BIGINT, rngsubtype BIGINT)`,
	`CREATE VIEW ` + catalogSchema + `.pg_user AS SELECT rolname AS usename, oid AS usesysid, rolcreatedb AS usecreatedb,
		rolsuper AS usesuper, rolreplication AS userepl, rolbypassrls AS usebypassrls, '********' AS passwd,
		rolvaliduntil AS valuntil, rolconfig AS useconfig FROM ` + catalogSchema + `.pg_roles`,
	`CREATE VIEW ` + catalogSchema + `.pg_tables AS SELECT n.nspname AS schemaname, c.relname AS tablename,
		'` + retinaUserName + `' AS tableowner, NULL::VARCHAR AS tablespace, c.relhasindex AS hasindexes,
		false AS hasrules, false AS hastriggers, false AS rowsecurity
		FROM ` + catalogSchema + `.pg_class c JOIN ` + catalogSchema + `.pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind = 'r'`,
	`CREATE VIEW ` + catalogSchema + `.pg_indexes AS SELECT n.nspname AS schemaname, t.relname AS tablename,
		c.relname AS indexname, NULL::VARCHAR AS tablespace, i.indexdef
		FROM ` + catalogSchema + `.pg_index i JOIN ` + catalogSchema + `.pg_class c ON c.oid = i.indexrelid
		JOIN ` + catalogSchema + `.pg_class t ON t.oid = i.indrelid JOIN ` + catalogSchema + `.pg_namespace n ON n.oid = t.relnamespace`,
	`CREATE VIEW ` + catalogSchema + `.pg_views AS SELECT ''::VARCHAR AS schemaname, ''::VARCHAR AS viewname,
		''::VARCHAR AS viewowner, ''::VARCHAR AS definition WHERE false`,
	`CREATE VIEW ` + catalogSchema + `.pg_matviews AS SELECT ''::VARCHAR AS schemaname, ''::VARCHAR AS matviewname,
		''::VARCHAR AS matviewowner, ''::VARCHAR AS definition WHERE false`,
	`CREATE VIEW ` + catalogSchema + `.pg_settings AS SELECT name, setting, NULL::VARCHAR AS unit,
		'Retina'::VARCHAR AS category, ''::VARCHAR AS short_desc, NULL::VARCHAR AS extra_desc,
		'user'::VARCHAR AS context, 'string'::VARCHAR AS vartype, 'session'::VARCHAR AS source,
		NULL::VARCHAR AS min_val, NULL::VARCHAR AS max_val, NULL::VARCHAR[] AS enumvals, NULL::VARCHAR AS boot_val,
		NULL::VARCHAR AS reset_val, NULL::VARCHAR AS sourcefile, NULL::INTEGER AS sourceline, false AS pending_restart
		FROM retina_settings()`,

	`CREATE VIEW ` + infoSchema + `.schemata AS SELECT '` + dbName + `' AS catalog_name, nspname AS schema_name,
		'` + retinaUserName + `' AS schema_owner, NULL::VARCHAR AS default_character_set_catalog,
		NULL::VARCHAR AS default_character_set_schema, NULL::VARCHAR AS default_character_set_name, NULL::VARCHAR AS sql_path
		FROM ` + catalogSchema + `.pg_namespace`,
	`CREATE VIEW ` + infoSchema + `.tables AS SELECT '` + dbName + `' AS table_catalog, n.nspname AS table_schema,
		c.relname AS table_name, 'BASE TABLE' AS table_type, NULL::VARCHAR AS self_referencing_column_name,
		NULL::VARCHAR AS reference_generation, NULL::VARCHAR AS user_defined_type_catalog,
		NULL::VARCHAR AS user_defined_type_schema, NULL::VARCHAR AS user_defined_type_name,
		'NO' AS is_insertable_into, 'NO' AS is_typed, NULL::VARCHAR AS commit_action
		FROM ` + catalogSchema + `.pg_class c JOIN ` + catalogSchema + `.pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind = 'r'`,
	`CREATE TABLE ` + infoSchema + `.columns (table_catalog VARCHAR, table_schema VARCHAR, table_name VARCHAR,
		column_name VARCHAR, ordinal_position INTEGER, column_default VARCHAR, is_nullable VARCHAR, data_type VARCHAR,
		character_maximum_length INTEGER, character_octet_length INTEGER, numeric_precision INTEGER,
		numeric_precision_radix INTEGER, numeric_scale INTEGER, datetime_precision INTEGER, interval_type VARCHAR,
		interval_precision INTEGER, character_set_catalog VARCHAR, character_set_schema VARCHAR,
		character_set_name VARCHAR, collation_catalog VARCHAR, collation_schema VARCHAR, collation_name VARCHAR,
		domain_catalog VARCHAR, domain_schema VARCHAR, domain_name VARCHAR, udt_catalog VARCHAR, udt_schema VARCHAR,
		udt_name VARCHAR, scope_catalog VARCHAR, scope_schema VARCHAR, scope_name VARCHAR,
		maximum_cardinality INTEGER, dtd_identifier VARCHAR, is_self_referencing VARCHAR, is_identity VARCHAR,
		identity_generation VARCHAR, identity_start VARCHAR, identity_increment VARCHAR, identity_maximum VARCHAR,
		identity_minimum VARCHAR, identity_cycle VARCHAR, is_generated VARCHAR, generation_expression VARCHAR,
		is_updatable VARCHAR)`,
	`CREATE TABLE ` + infoSchema + `.table_constraints (constraint_catalog VARCHAR, constraint_schema VARCHAR,
		constraint_name VARCHAR, table_catalog VARCHAR, table_schema VARCHAR, table_name VARCHAR,
		constraint_type VARCHAR, is_deferrable VARCHAR, initially_deferred VARCHAR, enforced VARCHAR, nulls_distinct VARCHAR)`,
	`CREATE TABLE ` + infoSchema + `.key_column_usage (constraint_catalog VARCHAR, constraint_schema VARCHAR,
		constraint_name VARCHAR, table_catalog VARCHAR, table_schema VARCHAR, table_name VARCHAR, column_name VARCHAR,
		ordinal_position INTEGER, position_in_unique_constraint INTEGER)`,
	`CREATE VIEW ` + infoSchema + `.views AS SELECT ''::VARCHAR AS table_catalog, ''::VARCHAR AS table_schema,
		''::VARCHAR AS table_name, ''::VARCHAR AS view_definition WHERE false`,
	`CREATE VIEW ` + infoSchema + `.routines AS SELECT ''::VARCHAR AS routine_catalog, ''::VARCHAR AS routine_schema,
		''::VARCHAR AS routine_name, ''::VARCHAR AS routine_type WHERE false`,
}

// catalogTables are the relations of the compatibility schemas, by schema.
var catalogTables = func() map[string]map[string]bool {
	out := map[string]map[string]bool{catalogSchema: {}, infoSchema: {}}
	for _, ddl := range catalogDDL {
		f := strings.Fields(ddl)
		if len(f) >= 3 && (f[1] == "TABLE" || f[1] == "VIEW") {
			schema, name, _ := strings.Cut(f[2], ".")
			out[schema][name] = true
		}
	}
	return out
}()

// pgFunctions are the PostgreSQL functions Retina defines as macros in
// the catalog schema, replacing DuckDB's where DuckDB has one of the name.
var pgFunctions = []string{
	`pg_get_userbyid(id) AS '` + retinaUserName + `'`,
	`pg_table_is_visible(id) AS coalesce((SELECT relnamespace IN (` + fmt.Sprint(oidPublic) + `, ` + fmt.Sprint(oidPGCatalog) + `) FROM ` + catalogSchema + `.pg_class WHERE oid = id), true)`,
	`pg_type_is_visible(id) AS true`,
	`pg_function_is_visible(id) AS true`,
	`pg_encoding_to_char(id) AS 'UTF8'`,
	`pg_char_to_encoding(name) AS 6`,
	`pg_get_expr(expr, rel) AS NULL::VARCHAR, (expr, rel, pretty) AS NULL::VARCHAR`,
	`obj_description(id) AS NULL::VARCHAR, (id, cat) AS NULL::VARCHAR`,
	`col_description(id, n) AS NULL::VARCHAR`,
	`shobj_description(id, cat) AS NULL::VARCHAR`,
	`has_table_privilege(a) AS true, (a, b) AS true, (a, b, c) AS true`,
	`has_schema_privilege(a) AS true, (a, b) AS true, (a, b, c) AS true`,
	`has_database_privilege(a) AS true, (a, b) AS true, (a, b, c) AS true`,
	`has_column_privilege(a, b) AS true, (a, b, c) AS true, (a, b, c, d) AS true`,
	`pg_has_role(a, b) AS true, (a, b, c) AS true`,
	`format_type(id, typmod) AS CASE WHEN id = 1700 AND typmod >= 4 THEN 'numeric(' || ((typmod - 4) >> 16) || ',' || ((typmod - 4) & 65535) || ')'
		ELSE (SELECT format_name FROM ` + catalogSchema + `.pg_type WHERE oid = id) END`,
	`pg_get_indexdef(id) AS (SELECT indexdef FROM ` + catalogSchema + `.pg_index WHERE indexrelid = id),
		(id, col, pretty) AS (SELECT indexdef FROM ` + catalogSchema + `.pg_index WHERE indexrelid = id)`,
	`pg_get_constraintdef(id) AS (SELECT condef FROM ` + catalogSchema + `.pg_constraint WHERE oid = id),
		(id, pretty) AS (SELECT condef FROM ` + catalogSchema + `.pg_constraint WHERE oid = id)`,
	`pg_get_viewdef(id) AS NULL::VARCHAR, (id, pretty) AS NULL::VARCHAR`,
	`pg_get_function_result(id) AS NULL::VARCHAR`,
	`pg_get_function_arguments(id) AS NULL::VARCHAR`,
	`pg_get_function_identity_arguments(id) AS NULL::VARCHAR`,
	`pg_get_statisticsobjdef_columns(id) AS NULL::VARCHAR`,
	`pg_relation_is_publishable(id) AS false`,
	`pg_get_partkeydef(id) AS NULL::VARCHAR`,
	`pg_total_relation_size(id) AS 0::BIGINT`,
	`pg_relation_size(id) AS 0::BIGINT, (id, fork) AS 0::BIGINT`,
	`pg_table_size(id) AS 0::BIGINT`,
	`pg_backend_pid() AS 0`,
	`pg_extract_int(field, x) AS CAST(date_part(field, x) AS DECIMAL(18,0))`,
	`pg_extract_second(x) AS CAST(date_part('microseconds', x) AS DECIMAL(18,0)) * CAST(0.000001 AS DECIMAL(7,6))`,
	`pg_extract_milliseconds(x) AS CAST(date_part('microseconds', x) AS DECIMAL(18,0)) * CAST(0.001 AS DECIMAL(4,3))`,
	`pg_extract_epoch(x) AS CAST(epoch_us(x) AS DECIMAL(38,0)) * CAST(0.000001 AS DECIMAL(7,6))`,
	`length(x) AS CAST(length(x) AS INTEGER)`,
	`char_length(x) AS CAST(length(x) AS INTEGER)`,
	`character_length(x) AS CAST(length(x) AS INTEGER)`,
	`array_upper(a, d) AS CASE WHEN d = 1 AND len(a) > 0 THEN len(a) END`,
	`array_lower(a, d) AS CASE WHEN d = 1 AND len(a) > 0 THEN 1 END`,
	`current_schemas(implicit) AS CASE WHEN implicit THEN ['pg_catalog', 'public'] ELSE ['public'] END`,
	`regclass(v) AS coalesce(TRY_CAST(v AS BIGINT), (SELECT oid FROM ` + catalogSchema + `.pg_class
		WHERE relname = lower(replace(replace(v::VARCHAR, '"', ''), 'public.', '')) LIMIT 1))`,
	`regtype(v) AS coalesce(TRY_CAST(v AS BIGINT), (SELECT oid FROM ` + catalogSchema + `.pg_type WHERE typname = v::VARCHAR OR format_name = v::VARCHAR LIMIT 1))`,
	`regnamespace(v) AS coalesce(TRY_CAST(v AS BIGINT), (SELECT oid FROM ` + catalogSchema + `.pg_namespace WHERE nspname = v::VARCHAR LIMIT 1))`,
	`regproc(v) AS TRY_CAST(v AS BIGINT)`,
	`version() AS '` + versionString() + `'`,
	`current_setting(name) AS retina_current_setting(name),
		(name, missing_ok) AS CASE WHEN missing_ok THEN retina_current_setting_or_null(name) ELSE retina_current_setting(name) END`,
	`current_user() AS retina_session_user()`,
	`current_schema() AS retina_current_schema()`,
	`session_user() AS retina_session_user()`,
	`"user"() AS retina_session_user()`,
	`current_role() AS retina_session_user()`,
}

// infoFunctions are information_schema's helper functions drivers call
// (pgjdbc's getPrimaryKeys: _pg_expandarray(a) gives each element x of an
// array with its position n, one row each).
var infoFunctions = []string{
	`_pg_expandarray(a) AS unnest(list_transform(generate_series(1, len(a)), lambda i: {'x': a[i], 'n': i}))`,
}

// infoFunctionNames are the names infoFunctions define.
var infoFunctionNames = func() map[string]bool {
	out := map[string]bool{}
	for _, f := range infoFunctions {
		name, _, _ := strings.Cut(f, "(")
		out[name] = true
	}
	return out
}()

// pgFunctionNames are the names pgFunctions define.
var pgFunctionNames = func() map[string]bool {
	out := map[string]bool{}
	for _, f := range pgFunctions {
		name, _, _ := strings.Cut(f, "(")
		out[name] = true
	}
	return out
}()

// createCatalogs makes the compatibility schemas and their fixed rows.
func createCatalogs(ctx context.Context, c *sql.Conn) error {
	for _, ddl := range catalogDDL {
		if _, err := c.ExecContext(ctx, ddl); err != nil {
			return fmt.Errorf("query: PostgreSQL catalogs: %w (in %.60s…)", err, ddl)
		}
	}
	for _, f := range pgFunctions {
		if _, err := c.ExecContext(ctx, "CREATE MACRO "+catalogSchema+"."+f); err != nil {
			return fmt.Errorf("query: PostgreSQL function %.40s…: %w", f, err)
		}
	}
	for _, f := range infoFunctions {
		if _, err := c.ExecContext(ctx, "CREATE MACRO "+infoSchema+"."+f); err != nil {
			return fmt.Errorf("query: information_schema function %.40s…: %w", f, err)
		}
	}
	cs := catalogSchema
	fixed := []string{
		fmt.Sprintf(`INSERT INTO %s.pg_namespace VALUES (%d, 'pg_catalog', %d, NULL), (%d, 'public', %d, NULL), (%d, 'information_schema', %d, NULL)`,
			cs, oidPGCatalog, oidUser, oidPublic, oidUser, oidInfoSchema, oidUser),
		fmt.Sprintf(`INSERT INTO %s.pg_database VALUES (%d, '%s', %d, 6, 'c', false, true, -1, 0, 0, 1663, 'C.UTF-8', 'C.UTF-8', NULL, NULL, NULL)`,
			cs, oidDatabase, dbName, oidUser),
		fmt.Sprintf(`INSERT INTO %s.pg_am VALUES (%d, 'heap', 'heap_tableam_handler', 't'), (%d, 'btree', 'bthandler', 'i')`, cs, oidHeap, oidBtree),
		fmt.Sprintf(`INSERT INTO %s.pg_roles VALUES (%d, '%s', false, true, false, false, true, false, -1, '********', NULL, false, NULL)`,
			cs, oidUser, retinaUserName),
		fmt.Sprintf(`INSERT INTO %s.pg_tablespace VALUES (1663, 'pg_default', %d)`, cs, oidUser),
	}
	for _, t := range pgTypes {
		fixed = append(fixed, fmt.Sprintf(`INSERT INTO %s.pg_type (oid, typname, typnamespace, typowner, typlen, typbyval, typtype,
			typcategory, typispreferred, typisdefined, typdelim, typrelid, typelem, typarray, typinput, typoutput, typalign,
			typstorage, typnotnull, typbasetype, typtypmod, typndims, typcollation, format_name)
			VALUES (%d, '%s', %d, %d, %d, %t, 'b', '%s', false, true, ',', 0, 0, 0, '%sin', '%sout', 'i', 'p', false, 0, -1, 0, 0, '%s')`,
			cs, t.oid, t.name, oidPGCatalog, oidUser, t.length, t.length > 0 && t.length <= 8, t.category, t.name, t.name, strings.ReplaceAll(t.format, "'", "''")))
	}
	for _, q := range fixed {
		if _, err := c.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("query: PostgreSQL catalogs: %w", err)
		}
	}
	return nil
}

// fillCatalogs rewrites the rows that describe Retina's tables.
func fillCatalogs(ctx context.Context, c *sql.Conn, tables []*catalog.Table) error {
	cs, is := catalogSchema, infoSchema
	stmts := []string{
		"DELETE FROM " + cs + ".pg_class", "DELETE FROM " + cs + ".pg_attribute", "DELETE FROM " + cs + ".pg_index",
		"DELETE FROM " + cs + ".pg_constraint", "DELETE FROM " + is + ".columns", "DELETE FROM " + is + ".table_constraints",
		"DELETE FROM " + is + ".key_column_usage", fmt.Sprintf("DELETE FROM %s.pg_namespace WHERE oid >= %d", cs, firstSchemaOID),
	}
	var args [][]any
	for range stmts {
		args = append(args, nil)
	}
	add := func(q string, a ...any) { stmts = append(stmts, q); args = append(args, a) }
	namespaces := map[string]int64{catalog.DefaultSchema: oidPublic}
	for _, t := range tables {
		oid := tableOID(t.ID)
		schema, name := catalog.SplitTableName(t.Name)
		name = strings.ToLower(name)
		ns, ok := namespaces[schema]
		if !ok {
			ns = schemaOID(schema, namespaces)
			namespaces[schema] = ns
			add(`INSERT INTO `+cs+`.pg_namespace VALUES (?, ?, ?, NULL)`, ns, schema, oidUser)
		}
		sc := t.Schema
		add(`INSERT INTO `+cs+`.pg_class VALUES (?, ?, ?, 0, 0, ?, ?, ?, 0, 0, -1, 0, 0, ?, false, 'p', 'r', ?, 0, false,
			false, false, false, false, true, 'd', false, 0, 0, 0, NULL, NULL, NULL)`,
			oid, name, ns, oidUser, oidHeap, oid, len(sc.PrimaryKey) > 0 || len(sc.Indexes) > 0, len(sc.Columns))
		attnum := map[string]int{}
		for i, col := range sc.Columns {
			attnum[strings.ToLower(col.Name)] = i + 1
			typ, mod := columnType(col.Type)
			pt := typeByOID(typ)
			length := pt.length
			add(`INSERT INTO `+cs+`.pg_attribute VALUES (?, ?, ?, -1, ?, ?, 0, -1, ?, ?, 'i', 'p', '', ?, false, false, '', '',
				false, true, 0, 0, NULL, NULL, NULL, NULL)`,
				oid, col.Name, typ, length, i+1, mod, length > 0 && length <= 8, !col.Nullable)
			var prec, scale, radix any
			switch col.Type.Kind {
			case types.Decimal:
				prec, scale, radix = int(col.Type.Precision), int(col.Type.Scale), 10
			case types.Int8, types.Int16:
				prec, scale, radix = 16, 0, 2
			case types.Int32:
				prec, scale, radix = 32, 0, 2
			case types.Int64:
				prec, scale, radix = 64, 0, 2
			case types.Float32:
				prec, radix = 24, 2
			case types.Float64:
				prec, radix = 53, 2
			}
			udt, dataType := pt.name, pt.format
			add(`INSERT INTO `+is+`.columns (table_catalog, table_schema, table_name, column_name, ordinal_position,
				is_nullable, data_type, numeric_precision, numeric_precision_radix, numeric_scale, udt_catalog, udt_schema,
				udt_name, dtd_identifier, is_self_referencing, is_identity, is_generated, is_updatable)
				VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pg_catalog', ?, ?, 'NO', 'NO', 'NEVER', 'NO')`,
				dbName, schema, name, col.Name, i+1, yesNo(col.Nullable), dataType, prec, radix, scale, dbName, udt, fmt.Sprint(i+1))
		}
		if len(sc.PrimaryKey) > 0 && !sc.GeneratedKey {
			idx := oid + 1
			keys := make([]string, len(sc.PrimaryKey))
			nums := make([]any, len(sc.PrimaryKey))
			for i, k := range sc.PrimaryKey {
				keys[i] = quotePGIdent(k)
				nums[i] = attnum[strings.ToLower(k)]
			}
			conName := name + "_pkey"
			addIndex(add, cs, ns, oid, idx, conName, true, true, keys, nums, schema, name)
			add(`INSERT INTO `+cs+`.pg_constraint (oid, conname, connamespace, contype, condeferrable, condeferred,
				convalidated, conrelid, contypid, conindid, conparentid, confrelid, conislocal, coninhcount, connoinherit,
				conkey, condef) VALUES (?, ?, ?, 'p', false, false, true, ?, 0, ?, 0, 0, true, 0, true, ?::SMALLINT[], ?)`,
				idx, conName, ns, oid, idx, intList(nums), "PRIMARY KEY ("+strings.Join(keys, ", ")+")")
			add(`INSERT INTO `+is+`.table_constraints VALUES (?, ?, ?, ?, ?, ?, 'PRIMARY KEY', 'NO', 'NO', 'YES', NULL)`,
				dbName, schema, conName, dbName, schema, name)
			for i, k := range sc.PrimaryKey {
				add(`INSERT INTO `+is+`.key_column_usage VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL)`,
					dbName, schema, conName, dbName, schema, name, k, i+1)
			}
		}
		for i, ix := range sc.Indexes {
			if i >= oidsPerTable-2 {
				break // OIDs run out; the index still works, it is just not listed
			}
			keys := make([]string, len(ix.Columns))
			nums := make([]any, len(ix.Columns))
			for j, k := range ix.Columns {
				keys[j] = quotePGIdent(k)
				nums[j] = attnum[strings.ToLower(k)]
			}
			addIndex(add, cs, ns, oid, oid+2+int64(i), strings.ToLower(ix.Name), ix.Unique, false, keys, nums, schema, name)
		}
	}
	for i, q := range stmts {
		if _, err := c.ExecContext(ctx, q, args[i]...); err != nil {
			return fmt.Errorf("query: PostgreSQL catalogs: %w", err)
		}
	}
	return nil
}

func addIndex(add func(string, ...any), cs string, ns, table, idx int64, name string, unique, primary bool, keys []string, nums []any, schema, tableName string) {
	add(`INSERT INTO `+cs+`.pg_class VALUES (?, ?, ?, 0, 0, ?, ?, ?, 0, 0, -1, 0, 0, false, false, 'p', 'i', ?, 0, false,
		false, false, false, false, true, 'n', false, 0, 0, 0, NULL, NULL, NULL)`,
		idx, name, ns, oidUser, oidBtree, idx, len(keys))
	def := "CREATE INDEX "
	if unique {
		def = "CREATE UNIQUE INDEX "
	}
	def += quotePGIdent(name) + " ON " + quotePGIdent(schema) + "." + quotePGIdent(tableName) + " USING btree (" + strings.Join(keys, ", ") + ")"
	add(`INSERT INTO `+cs+`.pg_index VALUES (?, ?, ?, ?, ?, false, ?, false, true, false, true, false, true, true, false,
		?::SMALLINT[], NULL, NULL, NULL, NULL, NULL, ?, NULL)`,
		idx, table, len(keys), len(keys), unique, primary, intList(nums), def)
}

// intList renders small integers as a DuckDB list literal argument.
func intList(nums []any) string {
	parts := make([]string, len(nums))
	for i, n := range nums {
		parts[i] = fmt.Sprint(n)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

func yesNo(b bool) string {
	if b {
		return "YES"
	}
	return "NO"
}

// quotePGIdent quotes an identifier where PostgreSQL would need it.
func quotePGIdent(s string) string {
	plain := s != ""
	for i, r := range s {
		if !(r >= 'a' && r <= 'z' || r == '_' || i > 0 && r >= '0' && r <= '9') {
			plain = false
		}
	}
	if plain {
		return s
	}
	return quoteIdent(s)
}
