package cdc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow/decimal128"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/types"
)

// tableMap is a fixed set of catalog tables for decoding tests.
type tableMap map[string]*catalog.Table

func (m tableMap) Table(name string) (*catalog.Table, bool) { t, ok := m[name]; return t, ok }

func customerTable() *catalog.Table {
	return &catalog.Table{ID: 1, Name: "customer", PrimaryIndexID: 1, Schema: catalog.Schema{
		Columns: []catalog.Column{
			{Name: "id", Type: types.Of(types.Int64)},
			{Name: "name", Type: types.Of(types.String), Nullable: true},
			{Name: "balance", Type: types.DecimalOf(12, 2), Nullable: true},
			{Name: "updated", Type: types.Of(types.Timestamp), Nullable: true},
		},
		PrimaryKey: []string{"id"},
	}}
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

func readAll(t *testing.T, path string, d *Decoder) ([]Record, []error) {
	t.Helper()
	src, err := OpenFileSource(path, FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	var recs []Record
	var errs []error
	for {
		m, err := src.Next(context.Background())
		if errors.Is(err, io.EOF) {
			return recs, errs
		}
		if err != nil {
			t.Fatal(err)
		}
		r, err := d.Decode(m)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		recs = append(recs, r)
	}
}

func dec(s string, scale int32) decimal128.Num {
	n, err := decimal128.FromString(s, 38, scale)
	if err != nil {
		panic(err)
	}
	return n
}

func TestMySQLTransactionsSchemaless(t *testing.T) {
	d := NewDecoder(tableMap{"customer": customerTable()}, quiet(), DecoderOptions{})
	recs, errs := readAll(t, "testdata/mysql_tx.jsonl", d)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	kinds := ""
	for _, r := range recs {
		kinds += map[Kind]string{Change: "C", Begin: "B", End: "E", Skip: "S"}[r.Kind]
	}
	if kinds != "BCCEBCCESCS" {
		t.Fatalf("record kinds %s", kinds)
	}
	c := recs[1]
	if c.Pos.Stream != "file:testdata/mysql_tx.jsonl" || c.Pos.Offset != 2 || c.Table != "customer" || c.Op != OpCreate {
		t.Fatalf("first change: %+v", c)
	}
	if c.TxID != "3e11fa47-71ca-11e1-9e33-c80aa9429562:23" || c.TotalOrder != 1 {
		t.Fatalf("MySQL GTID kept as the transaction id: %q %d", c.TxID, c.TotalOrder)
	}
	if c.After[2] != dec("100.00", 2) || c.After[3] != types.TimestampMicros(1711929600000000) {
		t.Fatalf("values: %v", c.After)
	}
	if e := recs[3]; e.EventCount != 2 || e.PerTable["customer"] != 2 {
		t.Fatalf("END: %+v", e)
	}
	if u := recs[6]; u.Before[2] != dec("99.99", 2) || u.After[2] != dec("-5.00", 2) {
		t.Fatalf("update images: %v → %v", u.Before, u.After)
	}
	if del := recs[9]; del.Op != OpDelete || del.TxID != "" || del.Before[0] != int64(1002) {
		t.Fatalf("delete without transaction: %+v", del)
	}
}

func TestPostgresWithSchemasAndKeys(t *testing.T) {
	// The catalog does not have the table: the first message creates it.
	tables := tableMap{}
	d := NewDecoder(tables, quiet(), DecoderOptions{})
	src, err := OpenFileSource("testdata/postgres_schema.jsonl", FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	ctx := context.Background()
	m, _ := src.Next(ctx) // BEGIN
	if r, err := d.Decode(m); err != nil || r.Kind != Begin || r.TxID != "571" {
		t.Fatalf("BEGIN: %+v %v", r, err)
	}
	m, _ = src.Next(ctx)
	_, err = d.Decode(m)
	var ut *UnknownTableError
	if !errors.As(err, &ut) || ut.Table != "orders" {
		t.Fatalf("first change of an unknown table: %v", err)
	}
	sc := ut.Schema
	want := []string{"id:int32:false", "amount:decimal(10,2):true", "status:string:true", "created:timestamptz:true", "shipped:timestamp:true", "day:date:true"}
	for i, c := range sc.Columns {
		if got := c.Name + ":" + c.Type.String() + ":" + map[bool]string{true: "true", false: "false"}[c.Nullable]; got != want[i] {
			t.Fatalf("derived column %d: %s, want %s", i, got, want[i])
		}
	}
	if len(sc.PrimaryKey) != 1 || sc.PrimaryKey[0] != "id" {
		t.Fatalf("derived primary key %v", sc.PrimaryKey)
	}
	tables["orders"] = &catalog.Table{ID: 2, Name: "orders", PrimaryIndexID: 2, Schema: sc}
	r, err := d.Decode(m)
	if err != nil {
		t.Fatal(err)
	}
	if r.TxID != "571" || r.Key[0] != int64(1) {
		t.Fatalf("PostgreSQL txId:lsn not normalised, or key missing: %q %v", r.TxID, r.Key)
	}
	created, _ := time.Parse(time.RFC3339Nano, "2024-03-01T10:15:30.123456Z")
	if r.After[1] != dec("12.50", 2) || r.After[3] != types.TimestampMicros(created.UnixMicro()) || r.After[5] != types.DateDays(19783) || r.After[4] != nil {
		t.Fatalf("values: %v", r.After)
	}
	var all []Record
	for {
		m, err := src.Next(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		r, err := d.Decode(m)
		if err != nil {
			t.Fatalf("%s: %v", m.Pos, err)
		}
		all = append(all, r)
	}
	// 2nd create: a zoned timestamp with an offset is stored in UTC.
	at, _ := time.Parse(time.RFC3339, "2024-03-01T09:00:00Z")
	if all[0].After[3] != types.TimestampMicros(at.UnixMicro()) || all[0].After[4] != types.TimestampMicros(1709290800000000) {
		t.Fatalf("second create: %v", all[0].After)
	}
	// REPLICA IDENTITY DEFAULT: the update has no before image, the key
	// comes from the message key; deletes too.
	upd := all[3]
	if upd.Op != OpUpdate || upd.Before != nil || upd.Key[0] != int64(1) || upd.TxID != "572" {
		t.Fatalf("update: %+v", upd)
	}
	if del := all[4]; del.Op != OpDelete || del.Key[0] != int64(2) || del.Before[0] != int64(2) {
		t.Fatalf("delete with a key-only before image: %+v", del)
	}
	if del := all[6]; del.Op != OpDelete || del.Key[0] != int64(1) || del.Before != nil {
		t.Fatalf("delete with before null: %+v", del)
	}
	if all[5].Kind != Skip || all[9].Kind != End || all[9].PerTable["orders"] != 4 {
		t.Fatalf("tombstone and END: %+v %+v", all[5], all[9])
	}
	if last := all[len(all)-1]; last.Kind != Skip || last.SkipReason != "logical message" {
		t.Fatalf("logical message: %+v", last)
	}
}

func TestDecimalAndTimeEncodings(t *testing.T) {
	d := NewDecoder(tableMap{}, quiet(), DecoderOptions{})
	col := catalog.Column{Name: "x", Type: types.DecimalOf(12, 3)}
	cases := []struct {
		json string
		f    field
		want string
	}{
		{`"BOI="`, field{logical: ltConnectDecimal, params: map[string]string{"scale": "2"}}, "12.500"},
		{`{"scale":1,"value":"BOI="}`, field{logical: ltVarDecimal}, "125.000"},
		{`"12.345"`, field{typ: "string"}, "12.345"}, // decimal.handling.mode=string, with a schema
		{`-7.5`, field{}, "-7.500"},
		{`"/w=="`, field{}, "-0.001"},
	}
	for _, c := range cases {
		v, err := d.vp.Parse(c.json)
		if err != nil {
			t.Fatal(err)
		}
		got, err := d.convert(v, col, c.f)
		if err != nil {
			t.Fatalf("%s: %v", c.json, err)
		}
		if s := got.(decimal128.Num).ToString(3); s != c.want {
			t.Fatalf("%s: %s, want %s", c.json, s, c.want)
		}
	}
	v, _ := d.vp.Parse(`{"scale":4,"value":"BOM="}`) // 0.1251: too many decimals for scale 3
	if _, err := d.convert(v, col, field{logical: ltVarDecimal}); err == nil {
		t.Fatal("decimal losing digits accepted")
	}
	ts := catalog.Column{Name: "t", Type: types.Of(types.Timestamp)}
	for _, c := range []struct {
		json, logical string
		want          int64
	}{
		{`1700000000123`, ltTimestamp, 1700000000123000},
		{`1700000000123456`, ltMicroTimestamp, 1700000000123456},
		{`1700000000123456789`, ltNanoTimestamp, 1700000000123456},
		{`"2023-11-14T22:13:20.123456Z"`, ltZonedTimestamp, 1700000000123456},
	} {
		v, _ := d.vp.Parse(c.json)
		got, err := d.convert(v, ts, field{logical: c.logical})
		if err != nil || got != types.TimestampMicros(c.want) {
			t.Fatalf("%s (%s): %v %v", c.json, c.logical, got, err)
		}
	}
}

// TestAmbiguousDecimalStrings: without a schema a string of digits is both a
// number and base64. The decimal handling mode decides, never a guess:
// "0000" is the base64 of 0xD34D34 (−2929356 unscaled) in precise mode and
// the number 0 in string mode; a string that is not the mode's form is an
// error naming the setting, not a silently different value.
func TestAmbiguousDecimalStrings(t *testing.T) {
	col := catalog.Column{Name: "x", Type: types.DecimalOf(12, 3)}
	for _, c := range []struct {
		mode       DecimalMode
		json, want string // want "" expects an error
		f          field
	}{
		{DecimalPrecise, `"0000"`, "-2929.356", field{}},
		{DecimalString, `"0000"`, "0.000", field{}},
		{DecimalPrecise, `"1234"`, "-2658.824", field{}}, // 0xD76DF8
		{DecimalString, `"1234"`, "1234.000", field{}},
		{DecimalPrecise, `"12.345"`, "", field{}},
		{DecimalString, `"12.345"`, "12.345", field{}},
		{DecimalString, `"BOI="`, "", field{}},
		{DecimalDouble, `"12.345"`, "", field{}},
		{DecimalDouble, `12.345`, "12.345", field{}},
		{DecimalString, `12.345`, "12.345", field{}},
		// A schema overrides the mode either way.
		{DecimalString, `"0000"`, "-2929.356", field{typ: "bytes", logical: ltConnectDecimal, params: map[string]string{"scale": "3"}}},
		{DecimalPrecise, `"0000"`, "0.000", field{typ: "string"}},
	} {
		d := NewDecoder(tableMap{}, quiet(), DecoderOptions{Decimals: c.mode})
		v, err := d.vp.Parse(c.json)
		if err != nil {
			t.Fatal(err)
		}
		got, err := d.convert(v, col, c.f)
		if c.want == "" {
			if err == nil {
				t.Errorf("%s %s: got %v, want an error", c.mode, c.json, got.(decimal128.Num).ToString(3))
			} else if c.f.typ == "" && c.mode == DecimalPrecise && !strings.Contains(err.Error(), "decimal handling") {
				t.Errorf("%s %s: the error does not name the setting: %v", c.mode, c.json, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s %s: %v", c.mode, c.json, err)
			continue
		}
		if s := got.(decimal128.Num).ToString(3); s != c.want {
			t.Errorf("%s %s: %s, want %s", c.mode, c.json, s, c.want)
		}
	}
	if _, err := ParseDecimalMode("exact"); err == nil {
		t.Error("unknown decimal mode accepted")
	}
}

func TestRejectionsNamePositions(t *testing.T) {
	d := NewDecoder(tableMap{"customer": customerTable()}, quiet(), DecoderOptions{})
	bad := []string{
		`not json`,
		`{"op":"c"}`,
		`{"op":"x","source":{"table":"customer"},"after":{"id":1}}`,
		`{"op":"c","source":{"table":"nosuch"},"after":{"id":1}}`,
		`{"op":"c","source":{"table":"customer"},"after":{"id":"one"}}`,
		`{"op":"c","source":{"table":"customer"},"after":{"id":1,"extra":2}}`,
		`{"op":"c","source":{"table":"customer"},"after":{"name":"no id"}}`,
		`{"op":"d","source":{"table":"customer"},"before":null}`,
		`{"status":"COMMIT","id":"1"}`,
		`[1,2,3]`,
	}
	for i, b := range bad {
		pos := Position{Stream: "file:x", Offset: int64(100 + i)}
		_, err := d.Decode(Message{Pos: pos, Value: []byte(b)})
		var de *DecodeError
		if !errors.As(err, &de) || de.Pos != pos || !strings.Contains(err.Error(), pos.String()) {
			t.Errorf("%s: %v", b, err)
		}
	}
}

func TestFileSourceDirectoryFollowAndResume(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "b.jsonl"), []byte("{\"n\":3}\n{\"n\":4}"), 0o644)
	os.WriteFile(filepath.Join(dir, "a.jsonl"), []byte("{\"n\":1}\n\n{\"n\":2}\n"), 0o644)
	os.WriteFile(filepath.Join(dir, ".swp"), []byte("junk\n"), 0o644)
	a := "file:" + filepath.Join(dir, "a.jsonl")
	src, err := OpenFileSource(dir, FileOptions{Follow: true, Resume: map[string]int64{a: 3}})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var got []string
	for len(got) < 2 {
		m, err := src.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, string(m.Value)+"@"+filepath.Base(m.Pos.Stream)+":"+strconv.FormatInt(m.Pos.Offset, 10))
	}
	want := []string{`{"n":2}@a.jsonl:3`, `{"n":3}@b.jsonl:1`}
	if got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("got %v", got)
	}
	// The last file is followed: a line appended later arrives.
	f, _ := os.OpenFile(filepath.Join(dir, "b.jsonl"), os.O_APPEND|os.O_WRONLY, 0)
	w := bufio.NewWriter(f)
	w.WriteString("\n{\"n\":5}\n")
	w.Flush()
	f.Close()
	// The unterminated last line was held back until its newline came.
	for _, want := range []string{`{"n":4}`, `{"n":5}`} {
		m, err := src.Next(ctx)
		if err != nil || string(m.Value) != want {
			t.Fatalf("followed line: %q %v, want %s", m.Value, err, want)
		}
	}
}

func FuzzDecode(f *testing.F) {
	for _, name := range []string{"testdata/mysql_tx.jsonl", "testdata/postgres_schema.jsonl"} {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			f.Add([]byte(line), []byte(`{"id":1}`))
		}
	}
	f.Fuzz(func(t *testing.T, value, key []byte) {
		tables := tableMap{"customer": customerTable(), "orders": {ID: 2, Name: "orders", PrimaryIndexID: 2, Schema: catalog.Schema{
			Columns:    []catalog.Column{{Name: "id", Type: types.Of(types.Int32)}, {Name: "amount", Type: types.DecimalOf(10, 2), Nullable: true}},
			PrimaryKey: []string{"id"},
		}}}
		d := NewDecoder(tables, quiet(), DecoderOptions{})
		pos := Position{Stream: "fuzz", Offset: 7}
		_, err := d.Decode(Message{Pos: pos, Key: key, Value: value})
		if err == nil {
			return
		}
		var de *DecodeError
		var ut *UnknownTableError
		switch {
		case errors.As(err, &ut):
		case !errors.As(err, &de) || de.Pos != pos:
			t.Fatalf("error without the position: %v", err)
		case strings.Contains(err.Error(), "internal decoder error"):
			t.Fatalf("decoder panicked: %v", err)
		}
	})
}

func TestOpenURI(t *testing.T) {
	if s, err := OpenURI("file:testdata/mysql_tx.jsonl", false, nil); err != nil {
		t.Fatal(err)
	} else {
		s.Close()
	}
	for _, bad := range []string{"nothing", "file:", "ftp://x", "kafka://", "kafka://127.0.0.1:1"} {
		if s, err := OpenURI(bad, false, nil); err == nil {
			s.Close()
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestFileSourceLinesLongerThanItsBuffer: a line longer than the reader's
// buffer comes whole, messages cut from one arena do not overlap, and a
// line past the arena's end gets its own.
func TestFileSourceLinesLongerThanItsBuffer(t *testing.T) {
	long := `{"x":"` + strings.Repeat("a", 3<<20) + `"}`
	var want []string
	for i := range 2000 {
		want = append(want, fmt.Sprintf(`{"n":%d}`, i))
		if i == 7 {
			want = append(want, long)
		}
	}
	path := filepath.Join(t.TempDir(), "lines.jsonl")
	if err := os.WriteFile(path, []byte(strings.Join(want, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	src, err := OpenFileSource(path, FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	var got [][]byte
	for {
		m, err := src.Next(context.Background())
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, m.Value)
	}
	if len(got) != len(want) {
		t.Fatalf("%d messages, want %d", len(got), len(want))
	}
	for i := range got {
		_ = append(got[i], '!') // must not write into the next message
	}
	for i := range got {
		if string(got[i]) != want[i] {
			t.Fatalf("message %d: %.40q…, want %.40q…", i, got[i], want[i])
		}
	}
}

// A table of a schema other than public is schema.table in Retina, so two
// source tables with one name in different schemas do not meet.
func TestTablesOfSchemasStayApart(t *testing.T) {
	d := NewDecoder(tableMap{"customer": customerTable(), "crm.customer": customerTable()}, quiet(), DecoderOptions{})
	for _, c := range []struct{ source, want string }{
		{`{"schema":"public","table":"customer"}`, "customer"},
		{`{"table":"customer","db":"shop"}`, "customer"}, // MySQL: databases are not schemas here
		{`{"schema":"crm","table":"customer"}`, "crm.customer"},
	} {
		msg := `{"op":"c","source":` + c.source + `,"after":{"id":1,"name":"a"}}`
		r, err := d.Decode(Message{Pos: Position{Stream: "file:x"}, Value: []byte(msg)})
		if err != nil || r.Table != c.want {
			t.Errorf("source %s: table %q (%v), want %q", c.source, r.Table, err, c.want)
		}
	}
	_, err := d.Decode(Message{Pos: Position{Stream: "file:x"}, Value: []byte(`{"op":"c","source":{"schema":"hr","table":"customer"},"after":{"id":1}}`)})
	var ut *UnknownTableError
	if !errors.As(err, &ut) && !strings.Contains(fmt.Sprint(err), `"hr.customer"`) {
		t.Errorf("a table of an unknown schema: %v", err)
	}
}
