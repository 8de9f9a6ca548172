package query

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/retinadb/retina/internal/catalog"
)

// ErrSetting is a SET the session refuses: an unknown parameter, a value
// it cannot take, or one Retina cannot honour.
var ErrSetting = errors.New("query: setting refused")

// ErrUnknownSetting names a parameter neither PostgreSQL nor Retina has.
var ErrUnknownSetting = errors.New("unrecognized configuration parameter")

// param is a run-time parameter a session can SET, RESET and SHOW, as
// PostgreSQL has it. check returns the value as SHOW renders it, or why
// the value cannot be taken.
type param struct {
	name     string // as PostgreSQL spells it in SHOW ALL
	def      string
	readOnly bool
	check    func(string) (string, error)
}

// params are the parameters clients and drivers send. Retina accepts the
// values it honours and refuses, with a reason, the ones it would ignore.
func params(idleInTxn time.Duration) []param {
	anything := func(v string) (string, error) { return v, nil }
	return []param{
		{name: "application_name", check: anything},
		{name: "client_encoding", def: "UTF8", check: func(v string) (string, error) {
			switch strings.ToUpper(strings.ReplaceAll(v, "-", "")) {
			case "UTF8", "UNICODE":
				return "UTF8", nil
			}
			return "", fmt.Errorf("client_encoding %q: Retina speaks UTF8 only", v)
		}},
		{name: "DateStyle", def: "ISO, MDY", check: func(v string) (string, error) {
			if u := strings.ToUpper(v); strings.HasPrefix(u, "ISO") || u == "MDY" || u == "DMY" || u == "YMD" {
				return v, nil
			}
			return "", fmt.Errorf("DateStyle %q: Retina renders dates in ISO style only", v)
		}},
		{name: "IntervalStyle", def: "postgres", check: func(v string) (string, error) {
			if strings.EqualFold(v, "postgres") {
				return "postgres", nil
			}
			return "", fmt.Errorf("IntervalStyle %q: Retina renders intervals in postgres style only", v)
		}},
		{name: "TimeZone", def: "UTC", check: func(v string) (string, error) {
			switch strings.ToUpper(v) {
			case "UTC", "ETC/UTC", "GMT", "ETC/GMT", "UCT", "Z", "ZULU", "UNIVERSAL", "+00", "0":
				return "UTC", nil
			}
			return "", fmt.Errorf("TimeZone %q: Retina renders time stamps in UTC only", v)
		}},
		{name: "extra_float_digits", def: "1", check: func(v string) (string, error) {
			// Above 0, PostgreSQL (12 on) renders floats shortest-exact, as
			// Retina always does; 0 and below would round them.
			n, err := strconv.Atoi(v)
			if err != nil || n < -15 || n > 3 {
				return "", fmt.Errorf("extra_float_digits %q: want an integer from -15 to 3", v)
			}
			if n <= 0 {
				return "", fmt.Errorf("extra_float_digits %d: Retina renders floats shortest-exact only (1 to 3)", n)
			}
			return v, nil
		}},
		{name: "search_path", def: `"$user", public`, check: anything},
		{name: "statement_timeout", def: "0", check: checkDuration},
		{name: "idle_in_transaction_session_timeout", def: formatDuration(idleInTxn), check: checkDuration},
		{name: "lock_timeout", def: "0", check: checkDuration},
		{name: "standard_conforming_strings", def: "on", check: func(v string) (string, error) {
			if b, ok := parseBool(v); ok && b {
				return "on", nil
			}
			return "", fmt.Errorf("standard_conforming_strings %q: Retina has standard-conforming strings only", v)
		}},
		{name: "bytea_output", def: "hex", check: func(v string) (string, error) {
			if strings.EqualFold(v, "hex") {
				return "hex", nil
			}
			return "", fmt.Errorf("bytea_output %q: Retina renders bytea in hex only", v)
		}},
		{name: asOfSetting, def: "", check: func(v string) (string, error) {
			if strings.TrimSpace(v) == "" || strings.EqualFold(strings.TrimSpace(v), "now") {
				return "", nil
			}
			if _, err := parseAsOf(v); err != nil {
				return "", err
			}
			return strings.TrimSpace(v), nil
		}},
		{name: "server_version", def: ServerVersion, readOnly: true},
		{name: "server_version_num", def: ServerVersionNum, readOnly: true},
		{name: "session_authorization", def: "", readOnly: true},
		{name: "server_encoding", def: "UTF8", readOnly: true},
		{name: "integer_datetimes", def: "on", readOnly: true},
		{name: "max_identifier_length", def: "63", readOnly: true},
		{name: "is_superuser", def: "off", readOnly: true},
		{name: "transaction_read_only", def: "on", readOnly: true},
		{name: "default_transaction_read_only", def: "on", readOnly: true},
	}
}

// searchPath is the session's search_path as the schemas to look in, in
// order ("$user" and pg_catalog left out); nil when it names none but
// public, where every session works anyway.
func (s *Session) searchPath() []string {
	v, _ := s.settings.Get("search_path")
	var out []string
	others := false
	for _, item := range splitSearchPath(v) {
		switch item {
		case "$user", "pg_catalog", "":
			continue
		case catalog.DefaultSchema:
		default:
			others = true
		}
		out = append(out, item)
	}
	if !others {
		return nil
	}
	return out
}

// splitSearchPath reads a search_path value: names separated by commas,
// folded to lower case unless double-quoted.
func splitSearchPath(v string) []string {
	var out []string
	for _, part := range strings.Split(v, ",") {
		part = strings.TrimSpace(part)
		if len(part) >= 2 && part[0] == '"' && part[len(part)-1] == '"' {
			out = append(out, strings.ReplaceAll(part[1:len(part)-1], `""`, `"`))
			continue
		}
		out = append(out, strings.ToLower(part))
	}
	return out
}

// asOfSetting makes a session read the past (history.go).
const asOfSetting = "retina.as_of"

// Settings are one session's parameter values.
type Settings struct {
	known    []param
	values   map[string]string // lower-case name → value; custom (dotted) names too
	defaults map[string]string // what the client's startup message set: RESET returns here
}

func newSettings(idleInTxn time.Duration) *Settings {
	return &Settings{known: params(idleInTxn), values: map[string]string{}, defaults: map[string]string{}}
}

// SetDefault sets a parameter from the client's startup message: it holds
// for the session and RESET returns to it, as in PostgreSQL.
func (s *Settings) SetDefault(name, value string) error {
	if err := s.Set(name, value); err != nil {
		return err
	}
	key := strings.ToLower(name)
	s.defaults[key] = s.values[key]
	delete(s.values, key)
	return nil
}

// SetUser records the session's user (session_authorization).
func (s *Settings) SetUser(name string) { s.defaults["session_authorization"] = name }

func (s *Settings) lookup(name string) (param, bool) {
	i := slices.IndexFunc(s.known, func(p param) bool { return strings.EqualFold(p.name, name) })
	if i < 0 {
		return param{}, false
	}
	return s.known[i], true
}

// custom says whether name is a placeholder parameter (class.name), which
// PostgreSQL lets any session set.
func custom(name string) bool {
	i := strings.IndexByte(name, '.')
	return i > 0 && i < len(name)-1
}

// Get is a parameter's value, and whether the parameter exists.
func (s *Settings) Get(name string) (string, bool) {
	key := strings.ToLower(name)
	if v, ok := s.values[key]; ok {
		return v, true
	}
	if v, ok := s.defaults[key]; ok {
		return v, true
	}
	if p, ok := s.lookup(name); ok {
		return p.def, true
	}
	return "", false
}

// Set changes a parameter for the rest of the session.
func (s *Settings) Set(name, value string) error {
	if p, ok := s.lookup(name); ok {
		if p.readOnly {
			return fmt.Errorf("%w: parameter %q cannot be changed", ErrSetting, p.name)
		}
		v, err := p.check(value)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrSetting, err)
		}
		s.values[strings.ToLower(name)] = v
		return nil
	}
	if custom(name) {
		s.values[strings.ToLower(name)] = value
		return nil
	}
	return fmt.Errorf("%w: %w %q", ErrSetting, ErrUnknownSetting, name)
}

// Reset returns a parameter (or, for "all", every one) to its default.
func (s *Settings) Reset(name string) error {
	if strings.EqualFold(name, "all") {
		clear(s.values)
		return nil
	}
	if p, ok := s.lookup(name); ok && p.readOnly {
		return fmt.Errorf("%w: parameter %q cannot be changed", ErrSetting, p.name)
	} else if !ok && !custom(name) {
		return fmt.Errorf("%w: %w %q", ErrSetting, ErrUnknownSetting, name)
	}
	delete(s.values, strings.ToLower(name))
	return nil
}

// Duration is a time parameter's value (0: off).
func (s *Settings) Duration(name string) time.Duration {
	v, _ := s.Get(name)
	d, _ := parseDuration(v)
	return d
}

// All lists every known parameter and set custom one with its value.
func (s *Settings) All() [][2]string {
	var out [][2]string
	for _, p := range s.known {
		v, _ := s.Get(p.name)
		out = append(out, [2]string{p.name, v})
	}
	seen := map[string]bool{}
	for _, m := range []map[string]string{s.values, s.defaults} {
		for k := range m {
			if custom(k) && !seen[k] {
				seen[k] = true
				v, _ := s.Get(k)
				out = append(out, [2]string{k, v})
			}
		}
	}
	slices.SortFunc(out, func(a, b [2]string) int { return strings.Compare(strings.ToLower(a[0]), strings.ToLower(b[0])) })
	return out
}

func checkDuration(v string) (string, error) {
	d, err := parseDuration(v)
	if err != nil {
		return "", err
	}
	return formatDuration(d), nil
}

// parseDuration reads a PostgreSQL time parameter: milliseconds, or a
// number with a unit (us, ms, s, min, h, d).
func parseDuration(v string) (time.Duration, error) {
	v = strings.TrimSpace(v)
	i := strings.IndexFunc(v, func(r rune) bool { return !(unicode.IsDigit(r) || r == '.' || r == '-' || r == '+') })
	num, unit := v, ""
	if i >= 0 {
		num, unit = v[:i], strings.TrimSpace(v[i:])
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) {
		return 0, fmt.Errorf("invalid time value %q: want milliseconds or a number with a unit (us, ms, s, min, h, d)", v)
	}
	scale := map[string]time.Duration{"": time.Millisecond, "us": time.Microsecond, "ms": time.Millisecond,
		"s": time.Second, "min": time.Minute, "h": time.Hour, "d": 24 * time.Hour}
	u, ok := scale[unit]
	if !ok {
		return 0, fmt.Errorf("invalid time unit in %q: valid units are us, ms, s, min, h and d", v)
	}
	if f*float64(u) > float64(math.MaxInt32)*float64(time.Millisecond) {
		return 0, fmt.Errorf("time value %q is out of range (at most %d ms)", v, math.MaxInt32)
	}
	return time.Duration(math.Round(f*float64(u)/float64(time.Millisecond))) * time.Millisecond, nil
}

// formatDuration renders as SHOW does: the largest unit that divides it.
func formatDuration(d time.Duration) string {
	ms := d.Milliseconds()
	if ms == 0 {
		return "0"
	}
	for _, u := range []struct {
		name string
		ms   int64
	}{{"d", 86_400_000}, {"h", 3_600_000}, {"min", 60_000}, {"s", 1000}} {
		if ms%u.ms == 0 {
			return fmt.Sprintf("%d%s", ms/u.ms, u.name)
		}
	}
	return fmt.Sprintf("%dms", ms)
}

func parseBool(v string) (bool, bool) {
	switch strings.ToLower(v) {
	case "on", "true", "yes", "1", "t", "y":
		return true, true
	case "off", "false", "no", "0", "f", "n":
		return false, true
	}
	return false, false
}

// settingStmt is a parsed SET, RESET or SHOW of a parameter.
type settingStmt struct {
	verb  string // SET, RESET or SHOW
	name  string
	value string // SET only; "" with def for DEFAULT
	def   bool
}

// parseSetting recognises SET [SESSION] name {TO|=} value, SET TIME ZONE
// value, RESET name|ALL and SHOW name|ALL. ok is false for anything else
// (SET LOCAL, SHOW TABLES, …), which is left to DuckDB or refused there.
func parseSetting(stmt string, isParam func(string) bool) (settingStmt, bool, error) {
	toks, err := settingTokens(stripLeadingComments(stmt))
	if err != nil || len(toks) < 2 {
		return settingStmt{}, false, nil
	}
	verb := strings.ToUpper(toks[0])
	switch verb {
	case "SHOW", "RESET":
		if len(toks) != 2 {
			return settingStmt{}, false, nil
		}
		name := toks[1]
		if !strings.EqualFold(name, "all") && !isParam(name) && !custom(name) {
			if verb == "RESET" {
				return settingStmt{}, true, fmt.Errorf("%w: %w %q", ErrSetting, ErrUnknownSetting, name)
			}
			return settingStmt{}, false, nil // SHOW TABLES and the like
		}
		return settingStmt{verb: verb, name: name}, true, nil
	case "SET":
	default:
		return settingStmt{}, false, nil
	}
	toks = toks[1:]
	if strings.EqualFold(toks[0], "SESSION") && len(toks) > 1 && !strings.EqualFold(toks[1], "AUTHORIZATION") && !strings.EqualFold(toks[1], "CHARACTERISTICS") {
		toks = toks[1:]
	}
	if len(toks) >= 3 && strings.EqualFold(toks[0], "TIME") && strings.EqualFold(toks[1], "ZONE") {
		st := settingStmt{verb: "SET", name: "TimeZone", value: strings.Join(toks[2:], " ")}
		st.def = strings.EqualFold(st.value, "DEFAULT") || strings.EqualFold(st.value, "LOCAL")
		return st, true, nil
	}
	if len(toks) < 3 || !(toks[1] == "=" || strings.EqualFold(toks[1], "TO")) {
		return settingStmt{}, false, nil
	}
	st := settingStmt{verb: "SET", name: toks[0]}
	vals := toks[2:]
	if len(vals) == 1 && strings.EqualFold(vals[0], "DEFAULT") {
		st.def = true
		return st, true, nil
	}
	var parts []string
	for i, v := range vals {
		if i%2 == 1 {
			if v != "," {
				return settingStmt{}, true, fmt.Errorf("%w: SET %s: values are separated by commas", ErrSetting, st.name)
			}
			continue
		}
		parts = append(parts, v)
	}
	st.value = strings.Join(parts, ", ")
	return st, true, nil
}

// settingTokens splits a SET statement: words, numbers, quoted strings
// (unquoted), "=", ",", and quoted identifiers (kept with their case).
func settingTokens(s string) ([]string, error) {
	var toks []string
	s = strings.TrimRight(strings.TrimSpace(s), "; \t\n")
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '=' || c == ',':
			toks = append(toks, string(c))
			i++
		case c == '\'' || c == '"':
			var b strings.Builder
			j := i + 1
			for ; j < len(s); j++ {
				if s[j] == c {
					if j+1 < len(s) && s[j+1] == c {
						b.WriteByte(c)
						j++
						continue
					}
					break
				}
				b.WriteByte(s[j])
			}
			if j >= len(s) {
				return nil, fmt.Errorf("unterminated quote")
			}
			toks = append(toks, b.String())
			i = j + 1
		default:
			j := i
			for j < len(s) && !strings.ContainsRune(" \t\n\r=,'\"", rune(s[j])) {
				j++
			}
			toks = append(toks, s[i:j])
			i = j
		}
	}
	return toks, nil
}
