// Package mysql is a change source that reads MySQL or MariaDB directly:
// the binary log in ROW format for changes, and a copy of every table in
// one consistent snapshot whose binlog position (GTID set, or file and
// offset) is where the stream starts, so the copy and the stream meet
// without a gap or a double. It uses github.com/go-mysql-org/go-mysql for
// the replication protocol and the client.
//
// position.go documents the positions; types.go the type mapping.
package mysql

import (
	"crypto/tls"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/url"
	"regexp"
	"strings"

	"github.com/retinadb/retina/internal/cdc"
)

// Options is a parsed source URI.
type Options struct {
	Addr, User, Password, Database string
	// Tables restricts the source to these tables of Database (empty: all
	// of its base tables, and tables created later).
	Tables []string
	// Name identifies this source's positions in Retina's checkpoints, and
	// ServerID is the replica id it registers with (default: derived from
	// Name; two sources reading one server need different ones).
	Name     string
	ServerID uint32
	// Positions is "gtid" or "file": how stream positions are kept. Empty
	// picks GTIDs when the server has them on.
	Positions string
	// Copy tags the initial copy: a new tag copies every table again.
	Copy string
	// TLS, when set, encrypts both connections.
	TLS *tls.Config
	// Display is the URI without its password, for logs and checkpoints.
	Display string
}

// ErrBadURI is wrapped by every rejection of a source URI.
var ErrBadURI = errors.New("mysql source: bad URI")

var nameRE = regexp.MustCompile(`^[a-z0-9_]{1,48}$`)

// ParseURI reads
//
//	mysql://user[:password]@host[:port]/database[?tables=a,b][&name=NAME][&server_id=N][&positions=gtid|file][&copy=TAG][&tls=true|skip-verify]
//
// (also mariadb://). The port defaults to 3306, name to "retina".
func ParseURI(uri string) (Options, error) {
	u, err := url.Parse(uri)
	if err != nil {
		return Options{}, fmt.Errorf("%w: %v", ErrBadURI, err)
	}
	if u.Scheme != "mysql" && u.Scheme != "mariadb" {
		return Options{}, fmt.Errorf("%w: %q: want mysql://user:password@host:port/database", ErrBadURI, redact(u))
	}
	o := Options{Display: redact(u), Database: strings.TrimPrefix(u.Path, "/"), Name: "retina", Copy: "1"}
	if o.Database == "" || strings.Contains(o.Database, "/") {
		return Options{}, fmt.Errorf("%w: %q names no database (mysql://user@host:port/DATABASE)", ErrBadURI, o.Display)
	}
	if u.User == nil || u.User.Username() == "" {
		return Options{}, fmt.Errorf("%w: %q names no user (mysql://USER:password@host:port/database)", ErrBadURI, o.Display)
	}
	o.User = u.User.Username()
	o.Password, _ = u.User.Password()
	host, port := u.Hostname(), u.Port()
	if host == "" {
		return Options{}, fmt.Errorf("%w: %q names no host", ErrBadURI, o.Display)
	}
	if port == "" {
		port = "3306"
	}
	o.Addr = net.JoinHostPort(host, port)
	q := u.Query()
	for k := range q {
		switch k {
		case "tables", "name", "server_id", "positions", "copy", "tls":
		default:
			return Options{}, fmt.Errorf("%w: %q: unknown parameter %q (tables, name, server_id, positions, copy, tls)", ErrBadURI, o.Display, k)
		}
	}
	if t := q.Get("tables"); t != "" {
		for _, name := range strings.Split(t, ",") {
			name = strings.TrimSpace(name)
			if name == "" || strings.Contains(name, ".") {
				return Options{}, fmt.Errorf("%w: %q: table %q: name tables of database %s without a schema", ErrBadURI, o.Display, name, o.Database)
			}
			o.Tables = append(o.Tables, name)
		}
	}
	if n := q.Get("name"); n != "" {
		o.Name = n
	}
	if c := q.Get("copy"); c != "" {
		o.Copy = c
	}
	for what, v := range map[string]string{"name": o.Name, "copy": o.Copy} {
		if !nameRE.MatchString(v) {
			return Options{}, fmt.Errorf("%w: %q: %s %q: use lower-case letters, digits and _ (at most 48)", ErrBadURI, o.Display, what, v)
		}
	}
	if id := q.Get("server_id"); id != "" {
		var n uint64
		if _, err := fmt.Sscan(id, &n); err != nil || n == 0 || n >= 1<<32 {
			return Options{}, fmt.Errorf("%w: %q: server_id %q: want a number from 1 to 4294967295, unique among the server's replicas", ErrBadURI, o.Display, id)
		}
		o.ServerID = uint32(n)
	} else {
		o.ServerID = defaultServerID(o.Name)
	}
	switch o.Positions = q.Get("positions"); o.Positions {
	case "", "gtid", "file":
	default:
		return Options{}, fmt.Errorf("%w: %q: positions %q: want gtid or file", ErrBadURI, o.Display, o.Positions)
	}
	switch v := q.Get("tls"); v {
	case "", "false":
	case "true":
		o.TLS = &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12}
	case "skip-verify":
		o.TLS = &tls.Config{InsecureSkipVerify: true}
	default:
		return Options{}, fmt.Errorf("%w: %q: tls %q: want true, skip-verify or false", ErrBadURI, o.Display, v)
	}
	return o, nil
}

// defaultServerID derives a replica id from the source's name (FNV-1a),
// kept away from the small ids servers are usually given.
func defaultServerID(name string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(name))
	return 1<<30 | h.Sum32()&(1<<30-1)
}

// IsURI tells whether uri is for this source.
func IsURI(uri string) bool {
	return strings.HasPrefix(uri, "mysql://") || strings.HasPrefix(uri, "mariadb://")
}

// Name is how Retina's checkpoints know the source: its URI without the
// password and without the copy tag, which may change between runs (a new
// tag copies every table again into the same data directory).
func Name(uri string) string {
	u, err := url.Parse(uri)
	if err != nil {
		return uri
	}
	if q := u.Query(); q.Has("copy") {
		q.Del("copy")
		u.RawQuery = q.Encode()
	}
	return redact(u)
}

func redact(u *url.URL) string { return cdc.RedactURL(u) }
