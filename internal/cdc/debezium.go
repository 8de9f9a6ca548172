package cdc

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/valyala/fastjson"

	"github.com/retinadb/retina/internal/catalog"
)

// Tables resolves table names to their catalog definitions.
type Tables interface {
	Table(name string) (*catalog.Table, bool)
}

// field is what a Kafka Connect schema says about one column.
type field struct {
	name     string
	typ      string // int8 … float64, boolean, string, bytes, struct
	logical  string // e.g. io.debezium.time.MicroTimestamp
	optional bool
	params   map[string]string
}

// Decoder turns Debezium JSON into records. It is not safe for concurrent
// use (it reuses parsers); use one per goroutine.
//
// Both converter shapes are accepted: {"schema":…,"payload":…} and the bare
// payload. The table is source.table (the plain name). Values are converted
// to the catalog column types; Kafka Connect logical types from the schema
// decide units when present, and schema-less numbers for timestamps are
// read as microseconds (Debezium's default for most temporal columns).
type Decoder struct {
	tables Tables
	log    *slog.Logger
	opts   DecoderOptions
	vp, kp fastjson.Parser
	warned map[string]bool
	cols   map[*catalog.Table]*columnOrder
	// Schemas by their text, table names interned, and the last
	// transaction id: messages repeat all three.
	rowSchemas, keySchemas schemaCache
	names                  map[string]string
	nameBuf                []byte // a table's catalog name, built before interning
	lastTxRaw              []byte
	lastTxID               string
	// slab is where rows are cut from: one allocation for many rows, as
	// every message makes one or two.
	slab []any
	// Skipped counts logical messages and tombstones.
	Skipped uint64
}

// DecimalMode is how schema-less messages encode DECIMAL columns, as
// Debezium's decimal.handling.mode names it.
type DecimalMode string

// The decimal modes.
const (
	// DecimalPrecise (the default, Debezium's too): the base64 of the
	// big-endian two's-complement unscaled value, at the column's scale.
	DecimalPrecise DecimalMode = "precise"
	// DecimalString: the value as text, "12.34".
	DecimalString DecimalMode = "string"
	// DecimalDouble: a JSON number.
	DecimalDouble DecimalMode = "double"
)

// ParseDecimalMode reads a mode name; "" is precise.
func ParseDecimalMode(s string) (DecimalMode, error) {
	switch m := DecimalMode(s); m {
	case "":
		return DecimalPrecise, nil
	case DecimalPrecise, DecimalString, DecimalDouble:
		return m, nil
	}
	return "", fmt.Errorf("cdc: decimal handling %q: want precise, string or double (Debezium's decimal.handling.mode)", s)
}

// DecoderOptions tune decoding.
type DecoderOptions struct {
	// Decimals is how messages without a Connect schema encode DECIMAL
	// columns. A string is ambiguous without it: "1234" is both the number
	// 1234 and the base64 of three bytes. With a schema, the schema decides.
	// A JSON number is read as a number in every mode.
	Decimals DecimalMode
}

// NewDecoder makes a decoder resolving tables through tables.
func NewDecoder(tables Tables, log *slog.Logger, opts DecoderOptions) *Decoder {
	if log == nil {
		log = slog.Default()
	}
	if opts.Decimals == "" {
		opts.Decimals = DecimalPrecise
	}
	return &Decoder{tables: tables, log: log, opts: opts, warned: map[string]bool{}, cols: map[*catalog.Table]*columnOrder{},
		rowSchemas: schemaCache{}, keySchemas: schemaCache{}, names: map[string]string{}}
}

// SetTables replaces the table resolver (after the catalog changed).
func (d *Decoder) SetTables(t Tables) { d.tables = t }

func reject(pos Position, format string, args ...any) error {
	return &DecodeError{Pos: pos, Reason: fmt.Sprintf(format, args...)}
}

// Decode decodes one message. It never panics; every error is a
// *DecodeError naming the message's position.
func (d *Decoder) Decode(m Message) (rec Record, err error) {
	defer func() {
		if p := recover(); p != nil { // a converter bug must not take the pipeline down
			rec, err = Record{}, reject(m.Pos, "internal decoder error: %v", p)
		}
	}()
	rec.Pos = m.Pos
	if m.Record != nil {
		rec = *m.Record
		rec.Pos = m.Pos
		return rec, nil
	}
	if isNull(m.Value) {
		d.Skipped++
		return Record{Kind: Skip, Pos: m.Pos, SkipReason: "tombstone"}, nil
	}
	v, err := d.vp.ParseBytes(m.Value)
	if err != nil {
		return rec, reject(m.Pos, "value is not JSON: %v", err)
	}
	// A file line may carry both: {"key": …, "value": …}.
	keyVal := (*fastjson.Value)(nil)
	rawValue, rawKey := m.Value, m.Key
	top := membersOf(v)
	if top.value != nil && top.payload == nil && top.op == nil {
		keyVal, v = top.key, top.value
		top = membersOf(v)
		rawValue, rawKey = member(m.Value, "value"), member(m.Value, "key")
		if v.Type() == fastjson.TypeNull {
			d.Skipped++
			return Record{Kind: Skip, Pos: m.Pos, SkipReason: "tombstone"}, nil
		}
	} else if !isNull(m.Key) {
		if keyVal, err = d.kp.ParseBytes(m.Key); err != nil {
			return rec, reject(m.Pos, "key is not JSON: %v", err)
		}
	}
	payload, schema, pm := v, (*fastjson.Value)(nil), top
	if top.payload != nil && top.schema != nil { // a converter envelope
		payload, schema = top.payload, top.schema
		pm = membersOf(payload)
	}
	if payload == nil || payload.Type() == fastjson.TypeNull {
		d.Skipped++
		return Record{Kind: Skip, Pos: m.Pos, SkipReason: "null payload"}, nil
	}
	if payload.Type() != fastjson.TypeObject {
		return rec, reject(m.Pos, "payload is %s, not an object", payload.Type())
	}
	if st := pm.status.GetStringBytes(); st != nil {
		return d.boundary(m.Pos, payload, string(st))
	}
	op := pm.op.GetStringBytes()
	if len(op) != 1 {
		return rec, reject(m.Pos, "missing or bad \"op\" (not a Debezium change event?)")
	}
	rec.Op = Op(op[0])
	source := pm.source
	if rec.Op == OpMessage {
		d.Skipped++
		return Record{Kind: Skip, Pos: m.Pos, SkipReason: "logical message"}, nil
	}
	rec.Kind = Change
	if source == nil {
		return rec, reject(m.Pos, "change event without \"source\"")
	}
	// The table's schema, where the source has schemas (PostgreSQL, SQL
	// Server, Oracle): catalog.TableName.
	table := source.GetStringBytes("table")
	if len(table) == 0 {
		return rec, reject(m.Pos, "source.table is missing")
	}
	d.nameBuf = catalog.AppendTableName(d.nameBuf[:0], source.GetStringBytes("schema"), table)
	rec.Table = d.intern(d.nameBuf)
	rec.SourceTSms = source.GetInt64("ts_ms")
	if tx := pm.transaction; tx != nil && tx.Type() == fastjson.TypeObject {
		rec.TxID = d.txID(tx.GetStringBytes("id"))
		rec.TotalOrder = tx.GetInt64("total_order")
	}
	switch rec.Op {
	case OpCreate, OpUpdate, OpDelete, OpRead, OpTruncate:
	default:
		return rec, reject(m.Pos, "unknown op %q", op)
	}
	t, ok := d.tables.Table(rec.Table)
	sf := d.rowSchema(rawValue, schema)
	var fieldList []field
	var fields map[string]field
	if sf != nil {
		fieldList, fields = sf.list, sf.byName
	}
	if !ok {
		if fieldList == nil {
			return rec, reject(m.Pos, "table %q is not in the catalog and the message has no schema to create it from (declare the table, or enable schemas in the converter)", rec.Table)
		}
		sc, err := d.deriveSchema(keyVal, fieldList)
		if err != nil {
			return rec, reject(m.Pos, "table %q: cannot derive a schema: %v", rec.Table, err)
		}
		return rec, &UnknownTableError{Pos: m.Pos, Table: rec.Table, Schema: sc}
	}
	if rec.Op == OpTruncate {
		return rec, nil
	}
	if rec.Before, err = d.row(m.Pos, t, pm.before, fields); err != nil {
		return rec, err
	}
	if rec.After, err = d.row(m.Pos, t, pm.after, fields); err != nil {
		return rec, err
	}
	if keyVal != nil && keyVal.Type() != fastjson.TypeNull {
		if rec.Key, err = d.key(m.Pos, t, keyVal, rawKey); err != nil {
			return rec, err
		}
	}
	switch {
	case rec.Op == OpDelete && rec.Key == nil && rec.Before == nil:
		return rec, reject(m.Pos, "delete without key or before image")
	case rec.Op != OpDelete && rec.After == nil:
		return rec, reject(m.Pos, "%c event without an after image", rec.Op)
	}
	return rec, nil
}

// isNull reports an absent or JSON-null message part. Only short inputs can
// be "null" with spaces around, so long messages cost nothing here.
func isNull(b []byte) bool {
	if len(b) > 16 {
		return false
	}
	b = bytes.TrimSpace(b)
	return len(b) == 0 || string(b) == "null"
}

// members are the parts of a message object Decode reads: those of an
// envelope or of a payload (a bare payload is both at once).
type members struct {
	value, payload, key, schema                    *fastjson.Value
	status, op, source, transaction, before, after *fastjson.Value
}

// membersOf reads them in one pass over the object (the first of
// duplicates, as Get does); none when v is not an object.
func membersOf(v *fastjson.Value) (m members) {
	o, err := v.Object()
	if err != nil {
		return m
	}
	o.Visit(func(k []byte, x *fastjson.Value) {
		var slot **fastjson.Value
		switch string(k) {
		case "value":
			slot = &m.value
		case "payload":
			slot = &m.payload
		case "key":
			slot = &m.key
		case "schema":
			slot = &m.schema
		case "status":
			slot = &m.status
		case "op":
			slot = &m.op
		case "source":
			slot = &m.source
		case "transaction":
			slot = &m.transaction
		case "before":
			slot = &m.before
		case "after":
			slot = &m.after
		default:
			return
		}
		if *slot == nil {
			*slot = x
		}
	})
	return m
}

// unwrap separates the payload from a schema envelope, if there is one.
func unwrap(v *fastjson.Value) (payload, schema *fastjson.Value) {
	if v.Type() == fastjson.TypeObject {
		if p := v.Get("payload"); p != nil && v.Get("schema") != nil {
			return p, v.Get("schema")
		}
	}
	return v, nil
}

// normaliseTxID keeps PostgreSQL's transaction number: its connector writes
// "txId:lsn" with the LSN of each event, so ids of one transaction differ.
// The rule looks at the id only (numbers:number), because transaction
// metadata messages do not name their connector; MySQL GTIDs ("uuid:n")
// and binlog positions ("file=…,pos=…") never have that shape.
func normaliseTxID(id string) string {
	i := strings.IndexByte(id, ':')
	if i <= 0 || i == len(id)-1 || !allDigits(id[:i]) || !allDigits(id[i+1:]) {
		return id
	}
	return id[:i]
}

func allDigits(s string) bool {
	for i := range len(s) {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

func (d *Decoder) boundary(pos Position, p *fastjson.Value, status string) (Record, error) {
	rec := Record{Pos: pos, TxID: d.txID(p.GetStringBytes("id"))}
	if rec.TxID == "" {
		return rec, reject(pos, "transaction %s without an id", status)
	}
	switch status {
	case "BEGIN":
		rec.Kind = Begin
	case "END":
		rec.Kind = End
		rec.EventCount = p.GetInt64("event_count")
		rec.PerTable = map[string]int64{}
		for _, dc := range p.GetArray("data_collections") {
			name := string(dc.GetStringBytes("data_collection"))
			if i := strings.LastIndexByte(name, '.'); i >= 0 {
				name = name[i+1:] // "db.table" or "schema.table" → table
			}
			rec.PerTable[name] += dc.GetInt64("event_count")
		}
	default:
		return rec, reject(pos, "unknown transaction status %q", status)
	}
	return rec, nil
}

// rowFields extracts the column schema of the before/after structs, in
// column order.
func rowFields(schema *fastjson.Value) []field {
	if schema == nil {
		return nil
	}
	for _, f := range schema.GetArray("fields") {
		name := string(f.GetStringBytes("field"))
		if name != "after" && name != "before" {
			continue
		}
		return parseFields(f.GetArray("fields"))
	}
	return nil
}

func byName(fs []field) map[string]field {
	if fs == nil {
		return nil
	}
	m := make(map[string]field, len(fs))
	for _, f := range fs {
		m[f.name] = f
	}
	return m
}

func parseFields(fs []*fastjson.Value) []field {
	out := make([]field, 0, len(fs))
	for _, f := range fs {
		fd := field{
			name:     string(f.GetStringBytes("field")),
			typ:      string(f.GetStringBytes("type")),
			logical:  string(f.GetStringBytes("name")),
			optional: f.GetBool("optional"),
		}
		if ps := f.GetObject("parameters"); ps != nil {
			fd.params = map[string]string{}
			ps.Visit(func(k []byte, v *fastjson.Value) {
				if s := v.GetStringBytes(); s != nil {
					fd.params[string(k)] = string(s)
				}
			})
		}
		out = append(out, fd)
	}
	return out
}

// row converts a before/after object to the table's column order.
// ErrUnknownTable is wrapped by *UnknownTableError.
var ErrUnknownTable = errors.New("cdc: table not in the catalog")

// UnknownTableError reports a schema-enabled message of a table the catalog
// does not have, with the schema derived from the message: create the table
// and decode the message again.
type UnknownTableError struct {
	Pos    Position
	Table  string
	Schema catalog.Schema
}

func (e *UnknownTableError) Error() string {
	return fmt.Sprintf("cdc: %s: table %q is not in the catalog", e.Pos, e.Table)
}

func (e *UnknownTableError) Unwrap() error { return ErrUnknownTable }

// deriveSchema builds a table schema from the value schema's row fields and
// the primary key from the message key's fields.
func (d *Decoder) deriveSchema(kv *fastjson.Value, fields []field) (catalog.Schema, error) {
	var sc catalog.Schema
	for _, f := range fields {
		t, err := d.columnType(f)
		if err != nil {
			return sc, err
		}
		sc.Columns = append(sc.Columns, catalog.Column{Name: f.name, Type: t, Nullable: f.optional})
	}
	if kv == nil || kv.Type() == fastjson.TypeNull {
		return sc, fmt.Errorf("no message key to take the primary key from")
	}
	payload, schema := unwrap(kv)
	if schema != nil {
		for _, f := range parseFields(schema.GetArray("fields")) {
			sc.PrimaryKey = append(sc.PrimaryKey, f.name)
		}
	} else if o, err := payload.Object(); err == nil {
		o.Visit(func(k []byte, _ *fastjson.Value) { sc.PrimaryKey = append(sc.PrimaryKey, string(k)) })
	}
	if len(sc.PrimaryKey) == 0 {
		return sc, fmt.Errorf("the message key names no columns")
	}
	for _, k := range sc.PrimaryKey {
		if i := sc.ColumnIndex(k); i >= 0 {
			sc.Columns[i].Nullable = false
		}
	}
	return sc, nil
}

func (d *Decoder) row(pos Position, t *catalog.Table, obj *fastjson.Value, fields map[string]field) ([]any, error) {
	if obj == nil || obj.Type() == fastjson.TypeNull {
		return nil, nil
	}
	o, err := obj.Object()
	if err != nil {
		return nil, reject(pos, "row image is %s, not an object", obj.Type())
	}
	cols := t.Schema.Columns
	row := d.newRow(len(cols))
	seen := 0
	var bad error
	co := d.columnOrder(t)
	o.Visit(func(k []byte, v *fastjson.Value) {
		if bad != nil {
			return
		}
		i := co.position(seen, k, t)
		if i < 0 {
			bad = reject(pos, "table %s has no column %q (schema change at the source?)", t.Name, k)
			return
		}
		seen++
		fd := fields[string(k)]
		val, err := d.convert(v, cols[i], fd)
		if err != nil {
			bad = reject(pos, "table %s column %s: %v", t.Name, cols[i].Name, err)
			return
		}
		row[i] = val
	})
	if bad != nil {
		return nil, bad
	}
	for i, c := range cols {
		if row[i] == nil && !c.Nullable {
			return nil, reject(pos, "table %s: NOT NULL column %s is missing or null", t.Name, c.Name)
		}
	}
	return row, nil
}

// rowSlabValues is the size of a row slab: small enough that a row kept
// long (an undo record) pins little, large enough to allocate rarely.
const rowSlabValues = 1024

// newRow is a row of n values. Its capacity is n: appending to it copies
// rather than writing into the next row.
func (d *Decoder) newRow(n int) []any {
	if n > rowSlabValues/4 {
		return make([]any, n)
	}
	if len(d.slab) < n {
		d.slab = make([]any, rowSlabValues)
	}
	row := d.slab[:n:n]
	d.slab = d.slab[n:]
	return row
}

// columnOrder maps a table's column names to positions, once per table
// version (a schema change makes a new *Table). Messages of one table name
// their columns in the same order, so the position of the n-th name seen
// last time is checked first, by comparing the name, before the map.
type columnOrder struct {
	index map[string]int
	last  []int // position of the n-th name of the last row, -1 unknown
}

func (d *Decoder) columnOrder(t *catalog.Table) *columnOrder {
	co, ok := d.cols[t]
	if !ok {
		co = &columnOrder{index: make(map[string]int, len(t.Schema.Columns))}
		for i, c := range t.Schema.Columns {
			co.index[c.Name] = i
		}
		if len(d.cols) > 1024 {
			clear(d.cols)
		}
		d.cols[t] = co
	}
	return co
}

// position is the column named k, the n-th name of a row image, or -1.
func (co *columnOrder) position(n int, k []byte, t *catalog.Table) int {
	cols := t.Schema.Columns
	if n < len(co.last) {
		if i := co.last[n]; i >= 0 && cols[i].Name == string(k) {
			return i
		}
	}
	i, ok := co.index[string(k)]
	if !ok {
		i = t.Schema.ColumnIndex(string(k)) // names differing only in case
	}
	for len(co.last) <= n {
		co.last = append(co.last, -1)
	}
	co.last[n] = i
	return i
}

// intern returns b as a string, the same one for the same bytes (table
// names repeat in every message).
func (d *Decoder) intern(b []byte) string {
	if s, ok := d.names[string(b)]; ok {
		return s
	}
	if len(d.names) >= 4096 {
		clear(d.names)
	}
	s := string(b)
	d.names[s] = s
	return s
}

// txID normalises a transaction id, reusing the last one: a transaction's
// changes arrive together.
func (d *Decoder) txID(raw []byte) string {
	if d.lastTxRaw != nil && bytes.Equal(raw, d.lastTxRaw) {
		return d.lastTxID
	}
	d.lastTxRaw = append(d.lastTxRaw[:0], raw...)
	d.lastTxID = normaliseTxID(string(raw))
	return d.lastTxID
}

// key converts a message key to primary-key values.
func (d *Decoder) key(pos Position, t *catalog.Table, v *fastjson.Value, raw []byte) ([]any, error) {
	var err error
	payload, schema := unwrap(v)
	var fields map[string]field
	if sf := d.keySchema(raw, schema); sf != nil {
		fields = sf.byName
	}
	out := make([]any, len(t.Schema.PrimaryKey))
	for i, k := range t.Schema.PrimaryKey {
		kv := payload.Get(k)
		if kv == nil {
			return nil, reject(pos, "key has no primary-key column %q of table %s", k, t.Name)
		}
		c := t.Schema.Columns[t.Schema.ColumnIndex(k)]
		if out[i], err = d.convert(kv, c, fields[k]); err != nil {
			return nil, reject(pos, "key column %s: %v", k, err)
		}
		if out[i] == nil {
			return nil, reject(pos, "key column %s is null", k)
		}
	}
	return out, nil
}
