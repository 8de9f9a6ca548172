package cdc

import (
	"fmt"
	"testing"
)

func TestMemberFindsRawText(t *testing.T) {
	doc := []byte(` { "a" : "x\"}{" , "schema":{"f":[1,{"g":"]"}],"h":null} ,"n": -1.5e3, "t":true}`)
	for name, want := range map[string]string{
		"a":      `"x\"}{"`,
		"schema": `{"f":[1,{"g":"]"}],"h":null}`,
		"n":      `-1.5e3`,
		"t":      `true`,
		"none":   ``,
	} {
		if got := string(member(doc, name)); got != want {
			t.Errorf("member %q = %q, want %q", name, got, want)
		}
	}
	for _, bad := range []string{``, `[]`, `{"a":`, `{"a" 1}`, `{"a":"unterminated}`} {
		if got := member([]byte(bad), "a"); got != nil {
			t.Errorf("member of %q = %q, want nil", bad, got)
		}
	}
}

// TestSchemaCacheFollowsSchemaText: two messages of one table whose schemas
// give a column different units decode each by its own schema, in either
// order and again after both were cached.
func TestSchemaCacheFollowsSchemaText(t *testing.T) {
	d := NewDecoder(tableMap{"customer": customerTable()}, quiet(), DecoderOptions{})
	msg := func(unit string) []byte {
		return []byte(`{"schema":{"type":"struct","fields":[{"type":"struct","field":"after","fields":[` +
			`{"type":"int64","field":"id"},{"type":"int64","optional":true,"name":"` + unit + `","field":"updated"}]}]},` +
			`"payload":{"before":null,"after":{"id":1,"updated":1700000000000},"source":{"table":"customer","ts_ms":1},"op":"c"}}`)
	}
	decode := func(unit string) string {
		r, err := d.Decode(Message{Pos: Position{Stream: "s"}, Value: msg(unit)})
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprint(r.After[3])
	}
	millis, micros := "io.debezium.time.Timestamp", "io.debezium.time.MicroTimestamp"
	first := map[string]string{millis: decode(millis), micros: decode(micros)}
	if first[millis] != "1700000000000000" || first[micros] != "1700000000000" { // microseconds
		t.Fatalf("units not applied: millis %s, micros %s", first[millis], first[micros])
	}
	for range 2 {
		for _, unit := range []string{micros, millis} {
			if got := decode(unit); got != first[unit] {
				t.Fatalf("%s decoded %s from the cache, %s the first time", unit, got, first[unit])
			}
		}
	}
	if len(d.rowSchemas) != 2 {
		t.Fatalf("%d schemas cached, want 2", len(d.rowSchemas))
	}
}
