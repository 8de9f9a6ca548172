package query

import (
	"fmt"
	"strings"
)

// CopyOut is how a COPY … TO STDOUT renders its rows (PostgreSQL's text
// or CSV format).
type CopyOut struct {
	CSV       bool
	Header    bool
	Delimiter byte
	Null      string
	Quote     byte
}

// errCopy is a COPY Retina does not run, with the reason.
func errCopy(format string, args ...any) error {
	return &Error{Code: "0A000", Err: fmt.Errorf("COPY: "+format, args...)}
}

// parseCopy reads COPY { table [(columns)] | (query) } TO STDOUT [options]
// and returns the query to run. ok is false for a statement that is not a
// COPY; COPY FROM, COPY to a file and binary format are refused.
func parseCopy(text string) (query string, out CopyOut, ok bool, err error) {
	s := strings.TrimSpace(stripLeadingComments(text))
	s = strings.TrimRight(s, "; \t\r\n")
	if len(s) < 4 || !strings.EqualFold(s[:4], "COPY") {
		return "", out, false, nil
	}
	rest := strings.TrimSpace(s[4:])
	out = CopyOut{Delimiter: '\t', Null: `\N`, Quote: '"'}
	if strings.HasPrefix(rest, "(") {
		end := closingParen(rest)
		if end < 0 {
			return "", out, true, &Error{Code: "42601", Err: fmt.Errorf("COPY: unbalanced parentheses around the query")}
		}
		query, rest = strings.TrimSpace(rest[1:end]), strings.TrimSpace(rest[end+1:])
	} else {
		i := strings.IndexFunc(rest, func(r rune) bool { return r == ' ' || r == '\t' || r == '\n' || r == '(' })
		if i < 0 {
			return "", out, true, &Error{Code: "42601", Err: fmt.Errorf("COPY: expected TO STDOUT")}
		}
		table, cols := rest[:i], "*"
		rest = strings.TrimSpace(rest[i:])
		if strings.HasPrefix(rest, "(") {
			end := closingParen(rest)
			if end < 0 {
				return "", out, true, &Error{Code: "42601", Err: fmt.Errorf("COPY: unbalanced column list")}
			}
			cols, rest = rest[1:end], strings.TrimSpace(rest[end+1:])
		}
		query = "SELECT " + cols + " FROM " + table
	}
	words := copyWords(rest)
	if len(words) < 2 || !strings.EqualFold(words[0], "TO") {
		if len(words) > 0 && strings.EqualFold(words[0], "FROM") {
			return "", out, true, &Error{Code: "25006", Err: fmt.Errorf("COPY FROM: %w", ErrReadOnly)}
		}
		return "", out, true, &Error{Code: "42601", Err: fmt.Errorf("COPY: expected TO STDOUT")}
	}
	if !strings.EqualFold(words[1], "STDOUT") {
		return "", out, true, errCopy("Retina writes no files; use COPY … TO STDOUT (psql's \\copy does)")
	}
	opts := words[2:]
	if len(opts) > 0 && strings.EqualFold(opts[0], "WITH") {
		opts = opts[1:]
	}
	if err := out.options(opts); err != nil {
		return "", out, true, err
	}
	return query, out, true, nil
}

// options applies COPY options, both the parenthesized list and the
// older bare-word form (CSV HEADER DELIMITER ',').
func (o *CopyOut) options(words []string) error {
	if len(words) > 0 && words[0] == "(" {
		words = words[1:]
		if len(words) == 0 || words[len(words)-1] != ")" {
			return &Error{Code: "42601", Err: fmt.Errorf("COPY: unbalanced option list")}
		}
		words = words[:len(words)-1]
	}
	for i := 0; i < len(words); i++ {
		w := strings.ToUpper(words[i])
		value := func() (string, error) {
			j := i + 1
			if j < len(words) && strings.EqualFold(words[j], "AS") {
				j++
			}
			if j >= len(words) || words[j] == "," {
				return "", &Error{Code: "42601", Err: fmt.Errorf("COPY: option %s needs a value", w)}
			}
			i = j
			return words[j], nil
		}
		switch w {
		case ",":
		case "CSV":
			o.CSV = true
		case "BINARY":
			return errCopy("binary format is not supported; use text or csv")
		case "FORMAT":
			v, err := value()
			if err != nil {
				return err
			}
			switch strings.ToLower(v) {
			case "csv":
				o.CSV = true
			case "text":
				o.CSV = false
			default:
				return errCopy("format %q is not supported; use text or csv", v)
			}
		case "HEADER":
			o.Header = true
			if i+1 < len(words) {
				if b, ok := parseBool(words[i+1]); ok {
					o.Header = b
					i++
				}
			}
		case "DELIMITER", "NULL", "QUOTE":
			v, err := value()
			if err != nil {
				return err
			}
			if w != "NULL" && len(v) != 1 {
				return errCopy("%s must be a single one-byte character", w)
			}
			switch w {
			case "DELIMITER":
				o.Delimiter = v[0]
			case "NULL":
				o.Null = v
			case "QUOTE":
				o.Quote = v[0]
			}
		default:
			return errCopy("option %s is not supported", words[i])
		}
	}
	if o.CSV && o.Delimiter == '\t' && !hasWord(words, "DELIMITER") {
		o.Delimiter = ','
	}
	if o.CSV && o.Null == `\N` && !hasWord(words, "NULL") {
		o.Null = ""
	}
	return nil
}

func hasWord(words []string, w string) bool {
	for _, x := range words {
		if strings.EqualFold(x, w) {
			return true
		}
	}
	return false
}

// closingParen finds the parenthesis closing the one s starts with,
// skipping quoted text.
func closingParen(s string) int {
	depth := 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\'', '"':
			i = skipQuoted(s, i, c)
		case '(':
			depth++
		case ')':
			depth--
			if depth == 0 {
				return i
			}
		}
	}
	return -1
}

// copyWords splits COPY's tail into words, quoted strings (unquoted) and
// the punctuation ( ) ,.
func copyWords(s string) []string {
	var out []string
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '(' || c == ')' || c == ',':
			out = append(out, string(c))
			i++
		case c == '\'':
			j := skipQuoted(s, i, '\'')
			out = append(out, strings.ReplaceAll(s[i+1:min(j, len(s))], "''", "'"))
			i = j + 1
		case (c == 'E' || c == 'e') && i+1 < len(s) && s[i+1] == '\'':
			j := skipQuoted(s, i+1, '\'')
			v := strings.ReplaceAll(s[i+2:min(j, len(s))], "''", "'")
			out = append(out, strings.NewReplacer(`\t`, "\t", `\n`, "\n", `\\`, `\`).Replace(v))
			i = j + 1
		default:
			j := i
			for j < len(s) && !strings.ContainsRune(" \t\n\r(),'", rune(s[j])) {
				j++
			}
			out = append(out, s[i:j])
			i = j
		}
	}
	return out
}

// AppendCopyRow renders one row of text values (nil for NULL) in the
// format, with its line end.
func (o CopyOut) AppendCopyRow(dst []byte, vals [][]byte) []byte {
	for i, v := range vals {
		if i > 0 {
			dst = append(dst, o.Delimiter)
		}
		switch {
		case v == nil:
			dst = append(dst, o.Null...)
		case o.CSV:
			dst = o.appendCSV(dst, v)
		default:
			dst = appendCopyText(dst, v, o.Delimiter)
		}
	}
	return append(dst, '\n')
}

// appendCSV quotes a value when it holds the delimiter, the quote, a line
// break, or equals the NULL string (so an empty string is "" when NULL is
// the empty field).
func (o CopyOut) appendCSV(dst, v []byte) []byte {
	needs := string(v) == o.Null
	for _, c := range v {
		if c == o.Delimiter || c == o.Quote || c == '\n' || c == '\r' {
			needs = true
			break
		}
	}
	if !needs {
		return append(dst, v...)
	}
	dst = append(dst, o.Quote)
	for _, c := range v {
		if c == o.Quote {
			dst = append(dst, o.Quote)
		}
		dst = append(dst, c)
	}
	return append(dst, o.Quote)
}

// appendCopyText escapes as PostgreSQL's text format does.
func appendCopyText(dst, v []byte, delim byte) []byte {
	for _, c := range v {
		switch c {
		case '\\':
			dst = append(dst, '\\', '\\')
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			if c == delim {
				dst = append(dst, '\\')
			}
			dst = append(dst, c)
		}
	}
	return dst
}
