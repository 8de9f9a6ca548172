package query

import (
	"testing"
)

func TestParseCopy(t *testing.T) {
	for _, c := range []struct {
		text, query string
		out         CopyOut
		code        string // SQLSTATE of the refusal, "" when accepted
	}{
		{text: `COPY ( select 1 as a, 'x' as b ) TO STDOUT csv header`, query: `select 1 as a, 'x' as b`,
			out: CopyOut{CSV: true, Header: true, Delimiter: ',', Null: "", Quote: '"'}},
		{text: `copy account to stdout`, query: `SELECT * FROM account`,
			out: CopyOut{Delimiter: '\t', Null: `\N`, Quote: '"'}},
		{text: `COPY account (id, owner) TO STDOUT WITH (FORMAT csv, HEADER false, DELIMITER ';', NULL 'nil')`, query: `SELECT id, owner FROM account`,
			out: CopyOut{CSV: true, Delimiter: ';', Null: "nil", Quote: '"'}},
		{text: `COPY (SELECT ')') TO STDOUT DELIMITER AS '|'`, query: `SELECT ')'`,
			out: CopyOut{Delimiter: '|', Null: `\N`, Quote: '"'}},
		{text: `COPY account FROM STDIN`, code: "25006"},
		{text: `COPY account TO '/tmp/x'`, code: "0A000"},
		{text: `COPY account TO STDOUT (FORMAT binary)`, code: "0A000"},
		{text: `COPY (SELECT 1 TO STDOUT`, code: "42601"},
	} {
		q, out, ok, err := parseCopy(c.text)
		if !ok {
			t.Errorf("%s: not taken for a COPY", c.text)
			continue
		}
		if c.code != "" {
			if SQLState(err) != c.code {
				t.Errorf("%s: %v, want SQLSTATE %s", c.text, err, c.code)
			}
			continue
		}
		if err != nil || q != c.query || out != c.out {
			t.Errorf("%s:\n got %q %+v %v\nwant %q %+v", c.text, q, out, err, c.query, c.out)
		}
	}
	if _, _, ok, _ := parseCopy("SELECT 1"); ok {
		t.Error("a SELECT taken for a COPY")
	}
}

func TestCopyRows(t *testing.T) {
	row := [][]byte{[]byte("1"), []byte("a,b"), []byte(""), nil, []byte("tab\there\\"), []byte(`say "hi"`)}
	csv := CopyOut{CSV: true, Delimiter: ',', Quote: '"'}
	if got, want := string(csv.AppendCopyRow(nil, row)), "1,\"a,b\",\"\",,tab\there\\,\"say \"\"hi\"\"\"\n"; got != want {
		t.Errorf("csv: got %q want %q", got, want)
	}
	text := CopyOut{Delimiter: '\t', Null: `\N`}
	if got, want := string(text.AppendCopyRow(nil, row)), "1\ta,b\t\t\\N\ttab\\there\\\\\tsay \"hi\"\n"; got != want {
		t.Errorf("text: got %q want %q", got, want)
	}
}
