// Package postgres is a change source that reads PostgreSQL directly: the
// pgoutput logical replication protocol for changes, and a copy of every
// published table from the snapshot the replication slot exported when it
// was created, so the copy and the stream meet without a gap or a double.
//
// Positions (see position.go) put every commit at its commit LSN in one
// stream named after the slot, so the replay checkpoint's resume offset is
// the LSN streaming restarts from and the flush LSN the slot may confirm.
package postgres

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/retinadb/retina/internal/cdc"
)

// Options is a parsed source URI.
type Options struct {
	// Conn is the connection string without the source's own parameters.
	Conn string
	// Slot and Publication name the replication slot and the publication;
	// both are created when missing.
	Slot, Publication string
	// Tables, as schema.table, restrict a publication this source creates
	// (empty: all tables). An existing publication is used as it is.
	Tables []string
	// Display is the URI without its password, for logs and checkpoints.
	Display string
}

// ErrBadURI is wrapped by every rejection of a source URI.
var ErrBadURI = errors.New("postgres source: bad URI")

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// ParseURI reads
//
//	postgres://user[:password]@host:port/db?slot=NAME&publication=NAME[&tables=s.t1,s.t2][&sslmode=…]
//
// (also postgresql://). slot and publication default to "retina"; every
// other parameter is passed to the connection as libpq would take it.
func ParseURI(uri string) (Options, error) {
	u, err := url.Parse(uri)
	if err != nil {
		return Options{}, fmt.Errorf("%w: %v", ErrBadURI, err)
	}
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return Options{}, fmt.Errorf("%w: %q: want postgres://user@host:port/db?slot=NAME&publication=NAME", ErrBadURI, redact(u))
	}
	if strings.TrimPrefix(u.Path, "/") == "" {
		return Options{}, fmt.Errorf("%w: %q names no database (postgres://user@host:port/DB)", ErrBadURI, redact(u))
	}
	q := u.Query()
	o := Options{Slot: q.Get("slot"), Publication: q.Get("publication"), Display: redact(u)}
	if o.Slot == "" {
		o.Slot = "retina"
	}
	if o.Publication == "" {
		o.Publication = "retina"
	}
	for what, name := range map[string]string{"slot": o.Slot, "publication": o.Publication} {
		if !identRE.MatchString(name) {
			return Options{}, fmt.Errorf("%w: %q: %s %q: use lower-case letters, digits and _ (at most 63)", ErrBadURI, o.Display, what, name)
		}
	}
	if t := q.Get("tables"); t != "" {
		for _, name := range strings.Split(t, ",") {
			schema, table, ok := strings.Cut(strings.TrimSpace(name), ".")
			if !ok || schema == "" || table == "" {
				return Options{}, fmt.Errorf("%w: %q: table %q: write it as schema.table", ErrBadURI, o.Display, name)
			}
			o.Tables = append(o.Tables, schema+"."+table)
		}
	}
	for _, k := range []string{"slot", "publication", "tables"} {
		q.Del(k)
	}
	u.RawQuery = q.Encode()
	o.Conn = u.String()
	if _, err := pgconn.ParseConfig(o.Conn); err != nil {
		return Options{}, fmt.Errorf("%w: %q: %v", ErrBadURI, o.Display, err)
	}
	return o, nil
}

// IsURI tells whether uri is for this source.
func IsURI(uri string) bool {
	return strings.HasPrefix(uri, "postgres://") || strings.HasPrefix(uri, "postgresql://")
}

// Redact returns uri without its password, for names kept on disk and in
// logs; an unparsable uri comes back unchanged.
func Redact(uri string) string {
	u, err := url.Parse(uri)
	if err != nil {
		return uri
	}
	return redact(u)
}

func redact(u *url.URL) string { return cdc.RedactURL(u) }
