package query

import "strings"

// SplitStatements splits a query string at semicolons outside quotes,
// dollar-quoted strings and comments, dropping empty statements.
func SplitStatements(q string) []string {
	var out []string
	start := 0
	for i := 0; i < len(q); i++ {
		switch c := q[i]; {
		case c == '\'' || c == '"':
			i = skipQuoted(q, i, c)
		case c == '-' && i+1 < len(q) && q[i+1] == '-':
			if j := strings.IndexByte(q[i:], '\n'); j >= 0 {
				i += j
			} else {
				i = len(q)
			}
		case c == '/' && i+1 < len(q) && q[i+1] == '*':
			if j := strings.Index(q[i+2:], "*/"); j >= 0 {
				i += j + 3
			} else {
				i = len(q)
			}
		case c == '$':
			if tag, ok := dollarTag(q[i:]); ok {
				if j := strings.Index(q[i+len(tag):], tag); j >= 0 {
					i += len(tag) + j + len(tag) - 1
				} else {
					i = len(q)
				}
			}
		case c == ';':
			if s := strings.TrimSpace(q[start:i]); s != "" {
				out = append(out, s)
			}
			start = i + 1
		}
	}
	if s := strings.TrimSpace(q[start:]); s != "" && strings.TrimSpace(stripLeadingComments(s)) != "" {
		out = append(out, s)
	}
	return out
}

// skipQuoted returns the index of the quote closing the one at i (” and ""
// inside escape the quote).
func skipQuoted(q string, i int, quote byte) int {
	for j := i + 1; j < len(q); j++ {
		if q[j] == quote {
			if j+1 < len(q) && q[j+1] == quote {
				j++
				continue
			}
			return j
		}
	}
	return len(q)
}

// dollarTag recognises $tag$ at the start of s.
func dollarTag(s string) (string, bool) {
	for j := 1; j < len(s); j++ {
		switch c := s[j]; {
		case c == '$':
			return s[:j+1], true
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' && j > 1:
		default:
			return "", false
		}
	}
	return "", false
}
