package diskengine

import (
	"encoding/binary"
	"errors"
)

// Key layout in Pebble (all integers big-endian):
//
//	row version   'r' | uvarint len(table) | table | esc(pk) | ^cts uint64
//	index entry   'i' | uvarint len(table) | table | uvarint len(index) | index | esc(sec) | esc(pk)
//	txn record    'x' | cts uint64
//	forgotten     'f'  (value: uint64, txn records through it were dropped)
//
// esc(b) writes b with 0x00 as 0x00 0xFF and ends with 0x00 0x01, which
// keeps byte order and makes every key a prefix-free, ordered encoding.
// Versions of a row sort newest first (^cts). A row version's value is a
// kind byte (0 put, 1 delete) followed by the row. An index entry has an
// empty value and no version: readers check the row at their snapshot
// still has that index key. A txn record's value is
//
//	uvarint snapshot | uvarint len(tag) | tag | uvarint n | (uvarint len(key) | key)*
//
// listing the row-version keys the transaction wrote, so recovery can take
// a dropped transaction back out.

const (
	prefixRow   = 'r'
	prefixIndex = 'i'
	prefixTxn   = 'x'
	keyForgot   = 'f'
	kindPut     = 0
	kindDelete  = 1
)

func appendEscaped(dst, b []byte) []byte {
	for _, c := range b {
		if c == 0 {
			dst = append(dst, 0, 0xFF)
		} else {
			dst = append(dst, c)
		}
	}
	return append(dst, 0, 1)
}

var errBadKey = errors.New("malformed escaped key")

// readEscaped decodes one escaped field and returns it and the rest.
func readEscaped(b []byte) (field, rest []byte, err error) {
	for i := 0; i < len(b); i++ {
		if b[i] != 0 {
			field = append(field, b[i])
			continue
		}
		if i+1 >= len(b) {
			return nil, nil, errBadKey
		}
		switch b[i+1] {
		case 0xFF:
			field = append(field, 0)
			i++
		case 1:
			return field, b[i+2:], nil
		default:
			return nil, nil, errBadKey
		}
	}
	return nil, nil, errBadKey
}

func tablePrefix(prefix byte, table string) []byte {
	b := []byte{prefix}
	b = binary.AppendUvarint(b, uint64(len(table)))
	return append(b, table...)
}

func indexPrefix(table, index string) []byte {
	b := tablePrefix(prefixIndex, table)
	b = binary.AppendUvarint(b, uint64(len(index)))
	return append(b, index...)
}

// rowPrefix is the key prefix of every version of (table, pk).
func rowPrefix(tp, pk []byte) []byte {
	return appendEscaped(append([]byte(nil), tp...), pk)
}

func versionKey(rp []byte, cts uint64) []byte {
	return binary.BigEndian.AppendUint64(append([]byte(nil), rp...), ^cts)
}

func versionTS(key []byte) uint64 {
	return ^binary.BigEndian.Uint64(key[len(key)-8:])
}

func txnKey(cts uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{prefixTxn}, cts)
}

// upperOf is the smallest key above every key with prefix p.
func upperOf(p []byte) []byte {
	u := append([]byte(nil), p...)
	for i := len(u) - 1; i >= 0; i-- {
		if u[i] != 0xFF {
			u[i]++
			return u[:i+1]
		}
	}
	return nil
}
