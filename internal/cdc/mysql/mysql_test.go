package mysql

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
)

func TestParseURI(t *testing.T) {
	o, err := ParseURI("mysql://repl:s3cret@db.example:3307/shop?tables=a,B&name=east&positions=file")
	if err != nil {
		t.Fatal(err)
	}
	if o.Addr != "db.example:3307" || o.User != "repl" || o.Password != "s3cret" || o.Database != "shop" || strings.Join(o.Tables, ",") != "a,B" ||
		o.Name != "east" || o.Positions != "file" || o.Copy != "1" || o.ServerID == 0 || strings.Contains(o.Display, "s3cret") {
		t.Fatalf("parsed %+v", o)
	}
	if o2, _ := ParseURI("mariadb://repl@h/shop"); o2.Addr != "h:3306" || o2.ServerID != defaultServerID("retina") {
		t.Fatalf("defaults: %+v", o2)
	}
	for _, bad := range []string{"mysql://repl@h/", "mysql://h/shop", "mysql://repl@h/shop?slot=x", "mysql://repl@h/shop?tables=s.t",
		"mysql://repl@h/shop?server_id=0", "mysql://repl@h/shop?positions=lsn", "mysql://repl@h/shop?name=Bad-Name", "postgres://x@h/db"} {
		if _, err := ParseURI(bad); !errors.Is(err, ErrBadURI) {
			t.Errorf("%s: %v, want ErrBadURI", bad, err)
		}
	}
	if n := Name("mysql://repl:pw@h/shop?copy=2&tables=a"); n != "mysql://repl:xxxxx@h/shop?tables=a" {
		t.Errorf("Name = %s", n)
	}
}

// TestInvalidTextIsRefused: text that is not valid in its character set
// is an error naming the column, never written.
func TestInvalidTextIsRefused(t *testing.T) {
	for _, c := range []struct {
		charset string
		value   []byte
	}{{"utf8mb4", []byte{'a', 0xff}}, {"utf8mb3", []byte{0xc3}}, {"ascii", []byte{0x80}}, {"sjis", []byte{0x81}}} {
		col := column{Name: "title", Kind: kText, Charset: c.charset, SQLType: "varchar(10)"}
		if err := col.prepare(); err != nil {
			t.Fatal(err)
		}
		_, err := col.value(c.value)
		if err == nil || !strings.Contains(err.Error(), "column title") {
			t.Errorf("%s %x: %v, want an error naming the column", c.charset, c.value, err)
		}
	}
	col := column{Name: "t", Kind: kText, Charset: "latin1"}
	col.prepare()
	if v, err := col.value([]byte{'c', 'a', 'f', 0xe9, 0x80, 0x81}); err != nil || v != "café€\u0081" {
		t.Errorf("latin1: %q %v", v, err)
	}
	col = column{Name: "t", Kind: kText, Charset: "armscii8"}
	if err := col.prepare(); err == nil || !strings.Contains(err.Error(), "armscii8") {
		t.Errorf("unknown charset: %v", err)
	}
}

func TestValues(t *testing.T) {
	for _, c := range []struct {
		col  column
		in   any
		want string
	}{
		{column{Kind: kInt, Bits: 8, Unsigned: true}, int8(-1), "255"},
		{column{Kind: kInt, Bits: 24, Unsigned: true}, int32(-1), "16777215"},
		{column{Kind: kInt, Bits: 32, Unsigned: true}, int32(-1), "4294967295"},
		{column{Kind: kInt, Bits: 64, Unsigned: true}, int64(-1), "18446744073709551615"},
		{column{Kind: kInt, Bits: 64, Unsigned: true}, uint64(math.MaxUint64), "18446744073709551615"},
		{column{Kind: kTime, Scale: 2}, "-838:00:00.25", "-838:00:00.25"},
		{column{Kind: kTime, Scale: 3}, "01:02:03.4", "01:02:03.400"},
		{column{Kind: kTime}, "-00:00:00", "00:00:00"},
		{column{Kind: kSet, Values: []string{"p", "q", "r"}}, int64(5), "p,r"},
		{column{Kind: kEnum, Values: []string{"x", "y"}}, int64(2), "y"},
		{column{Kind: kBinary, Pad: 4}, []byte{1}, "[1 0 0 0]"},
		{column{Kind: kBit, Bits: 10}, []byte{0x02, 0xaa}, "682"},
		{column{Kind: kFloat}, 1.2345677614212036, "1.2345677614212036"},
		{column{Kind: kDecimal, Precision: 12, Scale: 3}, []byte("-123456789.125"), "-123456789125"},
		{column{Kind: kDecimal, Precision: 12, Scale: 3}, []byte("0.5"), "500"},
		{column{Kind: kDecimal, Precision: 5, Scale: 0}, "-0", "0"},
		{column{Kind: kDecimal, Precision: 30, Scale: 2}, "1234567890123456789012.34", "123456789012345678901234"},
	} {
		c.col.Name = "c"
		if err := c.col.prepare(); err != nil {
			t.Fatal(err)
		}
		got, err := c.col.value(c.in)
		if err != nil {
			t.Errorf("%v of %+v: %v", c.in, c.col, err)
			continue
		}
		if d, ok := got.(interface{ ToString(int32) string }); ok {
			got = d.ToString(0)
		}
		if g := fmt.Sprint(got); g != c.want {
			t.Errorf("%v of kind %d: %s, want %s", c.in, c.col.Kind, g, c.want)
		}
	}
	for _, zero := range []string{"0000-00-00", "2024-00-10", "2024-03-00"} {
		c := column{Name: "d", Kind: kDate}
		c.prepare()
		if _, err := c.value(zero); !errors.Is(err, errZeroDate) {
			t.Errorf("%s: %v, want the zero-date error", zero, err)
		}
	}
}

func TestEnumValues(t *testing.T) {
	got, err := enumValues(`enum('a','it''s','b,c','back\\slash')`)
	if err != nil || strings.Join(got, "|") != `a|it's|b,c|back\slash` {
		t.Fatalf("%q %v", got, err)
	}
}

// TestResume: a checkpoint's streams give the position streaming resumes
// at, per flavour; an unfinished copy is not a resume point.
func TestResume(t *testing.T) {
	o, _ := ParseURI("mysql://u@h/db")
	st, err := readResume(o, "mariadb", map[string]int64{
		"mysql/retina/1/copy@gtid:0-1-10,1-2-5": math.MaxInt64,
		"mysql/retina/1/gtid/0-1":               15, // 0-1-14 applied
		"mysql/retina/1/gtid/1-3":               3,  // older than the copy's 1-2-5
	})
	if err != nil || !st.copied || st.start.String() != "gtid:0-1-14,1-2-5" {
		t.Fatalf("mariadb: %+v %v", st, err)
	}
	st, err = readResume(o, "mysql", map[string]int64{
		"mysql/retina/1/copy@gtid:3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5": math.MaxInt64,
		"mysql/retina/1/gtid/3e11fa47-71ca-11e1-9e33-c80aa9429562":          9,
	})
	if err != nil || st.start.String() != "gtid:3e11fa47-71ca-11e1-9e33-c80aa9429562:1-8" {
		t.Fatalf("mysql: %+v %v", st, err)
	}
	st, err = readResume(o, "mysql", map[string]int64{
		"mysql/retina/1/copy@file:binlog.000002:400": math.MaxInt64,
		"mysql/retina/1/binlog/binlog":               3<<32 | 120,
	})
	if err != nil || st.start.String() != "file:binlog.000003:120" {
		t.Fatalf("file: %+v %v", st, err)
	}
	st, _ = readResume(o, "mariadb", map[string]int64{"mysql/retina/1/copy@gtid:0-1-10": 77})
	if st.copied || !st.delivered {
		t.Fatalf("unfinished copy: %+v", st)
	}
	o2, _ := ParseURI("mysql://u@h/db?copy=2")
	st, _ = readResume(o2, "mariadb", map[string]int64{"mysql/retina/1/copy@gtid:0-1-10": math.MaxInt64})
	if st.copied || !st.delivered {
		t.Fatalf("a new copy tag: %+v", st)
	}
}

// TestFieldFastPaths: the copy's fast paths give what the general
// conversion gives.
func TestFieldFastPaths(t *testing.T) {
	for _, c := range []struct {
		col column
		in  string
	}{
		{column{Kind: kDecimal, Precision: 12, Scale: 2}, "-1234.5"},
		{column{Kind: kDecimal, Precision: 12, Scale: 2}, "0.07"},
		{column{Kind: kDecimal, Precision: 30, Scale: 2}, "1234567890123456789012.34"},
		{column{Kind: kDatetime, Scale: 6}, "2024-02-29 12:34:56.123456"},
		{column{Kind: kDatetime}, "1969-12-31 23:59:59"},
		{column{Kind: kTimestamp, Scale: 3}, "2024-01-01 00:00:00.5"},
		{column{Kind: kText, Charset: "utf8mb4"}, "héllo"},
	} {
		c.col.Name = "c"
		if err := c.col.prepare(); err != nil {
			t.Fatal(err)
		}
		var fv gomysql.FieldValue
		r := gomysql.RowData(append([]byte{byte(len(c.in))}, c.in...))
		vals, err := r.ParseText([]*gomysql.Field{{Type: gomysql.MYSQL_TYPE_VAR_STRING}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		fv = vals[0]
		fast, err1 := c.col.field(&fv)
		slow, err2 := c.col.convert(c.in)
		if err1 != nil || err2 != nil || fmt.Sprint(fast) != fmt.Sprint(slow) {
			t.Errorf("%s as %d: fast %v (%v), general %v (%v)", c.in, c.col.Kind, fast, err1, slow, err2)
		}
	}
	zero := column{Name: "z", Kind: kDatetime}
	zero.prepare()
	if _, ok := datetimeDigits([]byte("0000-00-00 00:00:00")); ok {
		t.Error("a zero datetime took the fast path")
	}
	if _, ok := datetimeDigits([]byte("2023-02-31 00:00:00")); ok {
		t.Error("31 February took the fast path")
	}
}
