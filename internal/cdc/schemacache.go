package cdc

import (
	"bytes"

	"github.com/valyala/fastjson"
)

// A Kafka Connect converter with schemas on repeats the same schema, a few
// kilobytes, in every message of a table. The decoder still parses it with
// the rest of the message (fastjson has no lazy parse), but turns it into
// fields only once per distinct text: the raw schema bytes, found by a
// byte scan, key a cache of what rowFields and parseFields would build.

// schemaFields is what one schema text says: the row image's fields, in
// order and by name.
type schemaFields struct {
	list   []field
	byName map[string]field
}

// maxCachedSchemas bounds each cache; a source that never repeats a schema
// gets a cleared cache rather than a growing one.
const maxCachedSchemas = 256

// schemaCache maps raw schema text to its fields.
type schemaCache map[string]*schemaFields

// get returns the fields of raw, building them with build on a miss. An
// empty raw (no schema text found) is never cached.
func (c schemaCache) get(raw []byte, build func() []field) *schemaFields {
	if len(raw) > 0 {
		if sf, ok := c[string(raw)]; ok {
			return sf
		}
	}
	list := build()
	sf := &schemaFields{list: list, byName: byName(list)}
	if len(raw) > 0 {
		if len(c) >= maxCachedSchemas {
			clear(c)
		}
		c[string(raw)] = sf
	}
	return sf
}

// rowSchema returns the fields of a value's schema (value is the raw
// envelope): from the cache when its text was seen before.
func (d *Decoder) rowSchema(value []byte, schema *fastjson.Value) *schemaFields {
	if schema == nil {
		return nil
	}
	return d.rowSchemas.get(member(value, "schema"), func() []field { return rowFields(schema) })
}

// keySchema is rowSchema for a message key's schema (its fields are the
// key columns).
func (d *Decoder) keySchema(key []byte, schema *fastjson.Value) *schemaFields {
	if schema == nil {
		return nil
	}
	return d.keySchemas.get(member(key, "schema"), func() []field { return parseFields(schema.GetArray("fields")) })
}

// member returns the raw text of the top-level member name of the JSON
// object in b, or nil. It trusts b to be valid JSON (fastjson has parsed
// it) and only finds where values end.
func member(b []byte, name string) []byte {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return nil
	}
	i++
	for {
		i = skipSpace(b, i)
		if i >= len(b) || b[i] != '"' {
			return nil
		}
		keyEnd := skipString(b, i)
		if keyEnd < 0 {
			return nil
		}
		key := b[i+1 : keyEnd-1]
		i = skipSpace(b, keyEnd)
		if i >= len(b) || b[i] != ':' {
			return nil
		}
		i = skipSpace(b, i+1)
		end := skipValue(b, i)
		if end < 0 {
			return nil
		}
		if string(key) == name {
			return b[i:end]
		}
		i = skipSpace(b, end)
		if i >= len(b) || b[i] != ',' {
			return nil
		}
		i++
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the string starting at b[i] ('"'),
// or -1.
func skipString(b []byte, i int) int {
	for j := i + 1; j < len(b); {
		k := bytes.IndexAny(b[j:], `"\`)
		if k < 0 {
			return -1
		}
		j += k
		if b[j] == '\\' {
			j += 2
			continue
		}
		return j + 1
	}
	return -1
}

// skipValue returns the index after the value starting at b[i], or -1.
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				end := skipString(b, j)
				if end < 0 {
					return -1
				}
				j = end - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	}
	// A number, true, false or null: up to the next delimiter.
	j := i
	for j < len(b) && b[j] != ',' && b[j] != '}' && b[j] != ']' && b[j] != ' ' && b[j] != '\t' && b[j] != '\n' && b[j] != '\r' {
		j++
	}
	return j
}
