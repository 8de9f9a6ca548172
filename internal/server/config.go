package server

import (
	"crypto/tls"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/cdc"
	"github.com/retinadb/retina/internal/pgwire"
	"github.com/retinadb/retina/internal/sink"
	"github.com/retinadb/retina/internal/types"
)

// Config is the configuration of `retina serve`. Values come from, in
// increasing precedence: the defaults, one YAML file, RETINA_* environment
// variables, and command-line flags.
type Config struct {
	DataDir   string   `yaml:"data"`
	Lake      string   `yaml:"lake"`
	Sources   []string `yaml:"sources"`
	SourceEOF string   `yaml:"source_eof"` // follow (default) or stop
	SQLAddr   string   `yaml:"sql_addr"`
	// SQLUsers may log in to the SQL endpoint with SCRAM-SHA-256 (none:
	// no password is asked). RETINA_SQL_USER and RETINA_SQL_PASSWORD add one.
	SQLUsers []SQLUser `yaml:"sql_users"`
	// SQLTLSCert and SQLTLSKey are PEM files; with them TLS is offered, and
	// with SQLTLSRequired clients without TLS are refused.
	SQLTLSCert     string `yaml:"sql_tls_cert"`
	SQLTLSKey      string `yaml:"sql_tls_key"`
	SQLTLSRequired bool   `yaml:"sql_tls_required"`
	HTTPAddr       string `yaml:"http_addr"`
	// MySQLAddr, when set, runs the OLTP store (Skeena) in this process
	// with a MySQL-protocol endpoint there; its commits replicate into
	// Retina's tables of the same names (HTAP).
	MySQLAddr string `yaml:"mysql_addr"`
	// OLTPData is the store's data directory (default: oltp under data).
	OLTPData string `yaml:"oltp_data"`
	// OLTPMemoryTables go to the store's memory engine when their CREATE
	// TABLE names no engine.
	OLTPMemoryTables []string `yaml:"oltp_memory_tables"`
	// MySQLUsers is a users file for the MySQL endpoint (default: root
	// without a password).
	MySQLUsers   string `yaml:"mysql_users"`
	LogFormat    string `yaml:"log_format"` // text (default) or json
	IndexBackend string `yaml:"index"`      // memory (default) or pebble
	Replayers    int    `yaml:"replayers"`
	Buckets      int    `yaml:"buckets"`
	BadInput     string `yaml:"bad_input"`   // fail (default) or dead-letter
	DeadLetter   string `yaml:"dead_letter"` // file for dead-lettered messages and transactions
	// DecimalHandling is how messages without a Connect schema encode
	// DECIMAL columns: precise (default), string or double, as Debezium's
	// decimal.handling.mode.
	DecimalHandling string `yaml:"decimal_handling"`
	// CheckpointInterval is how often a replay checkpoint is taken (it is
	// also taken after 100000 transactions); a crash redoes what came after
	// the last one from the sources.
	CheckpointInterval time.Duration `yaml:"checkpoint_interval"`
	// IndexPurgeInterval is how often the index drops the versions no
	// running query can see (a purge walks the whole index).
	IndexPurgeInterval time.Duration `yaml:"index_purge_interval"`
	// IdleInTransactionTimeout ends SQL sessions left idle inside an
	// explicit transaction this long (SQLSTATE 25P03), so a forgotten
	// BEGIN cannot hold back GC; sessions may SET their own (0: no limit).
	IdleInTransactionTimeout time.Duration `yaml:"idle_in_transaction_session_timeout"`
	// VisibilityCheckpointAfter is the age at which a query or read
	// transaction gets a visibility checkpoint: its deleted bitmaps are
	// materialized and it stops holding LWM back (0: never).
	VisibilityCheckpointAfter time.Duration `yaml:"visibility_checkpoint_after"`
	// QueryHistory is how far back SQL sessions can read with SET
	// retina.as_of; memory GC, index purge and storage GC keep what that
	// needs, so it costs memory in proportion to the change rate (0: off).
	QueryHistory time.Duration `yaml:"query_history"`
	// StorageGCInterval is how often storage GC looks for files to rewrite
	// (0 turns it off); StorageGCStaleShare is the share of a file's
	// versions that must be stale before it is rewritten.
	StorageGCInterval   time.Duration `yaml:"storage_gc_interval"`
	StorageGCStaleShare float64       `yaml:"storage_gc_stale_share"`
	// BlockRows and FileBlocks shape the write buffers: rows per block
	// (default 8192) and blocks per file (default 128); a file is combined
	// into one Parquet object once full.
	BlockRows  int `yaml:"block_rows"`
	FileBlocks int `yaml:"file_blocks"`
	// IcebergInterval is how often every table is published as an Iceberg
	// snapshot, all at one Retina timestamp (0: not published); replay
	// checkpoints are taken at least this often while it is on.
	// IcebergFormatVersion is 2 (positional delete files) or 3 (deletion
	// vectors); IcebergRetention how long snapshots stay listed.
	IcebergInterval      time.Duration `yaml:"iceberg_interval"`
	IcebergFormatVersion int           `yaml:"iceberg_format_version"`
	IcebergRetention     time.Duration `yaml:"iceberg_retention"`
	// IcebergAddr, when set, serves the Iceberg REST catalog there.
	IcebergAddr string `yaml:"iceberg_addr"`
	// BlockCacheMiB bounds the flushed write-buffer blocks kept decoded in
	// memory for scans (default 0: off; in the soak benchmark it cost more
	// memory than it saved query time).
	BlockCacheMiB int `yaml:"block_cache_mib"`
	// Tables declared up front (for sources whose messages carry no schema).
	Tables []TableDecl `yaml:"tables"`
}

// SQLUser is an account of the SQL endpoint. Password is the password
// itself or PostgreSQL's stored form of it (SCRAM-SHA-256$…), so a config
// file need not hold the password.
type SQLUser struct {
	Name     string `yaml:"name"`
	Password string `yaml:"password"`
}

// TableDecl declares a table.
type TableDecl struct {
	Name       string       `yaml:"name"`
	Columns    []ColumnDecl `yaml:"columns"`
	PrimaryKey []string     `yaml:"primary_key"`
}

// ColumnDecl declares a column; type is as types.Parse reads it.
type ColumnDecl struct {
	Name     string `yaml:"name"`
	Type     string `yaml:"type"`
	Nullable bool   `yaml:"nullable"`
}

// DefaultConfig works with nothing else given.
func DefaultConfig() Config {
	return Config{
		DataDir: "retina-data", SourceEOF: "follow", SQLAddr: "127.0.0.1:5433", HTTPAddr: "127.0.0.1:9187",
		LogFormat: "text", IndexBackend: defaultIndexBackend, Replayers: defaultReplayers, Buckets: sink.DefaultBuckets, BadInput: "fail", DecimalHandling: "precise",
		CheckpointInterval: 5 * time.Second, IndexPurgeInterval: time.Minute,
		IdleInTransactionTimeout: 10 * time.Minute, VisibilityCheckpointAfter: 30 * time.Second,
		StorageGCInterval: 2 * time.Second, StorageGCStaleShare: 0.5,
		IcebergInterval: time.Second, IcebergFormatVersion: 2, IcebergRetention: 10 * time.Minute,
	}
}

// LoadFile overlays a YAML file on c. Unknown keys are errors.
func (c *Config) LoadFile(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	dec.KnownFields(true)
	if err := dec.Decode(c); err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	return nil
}

// ApplyEnv overlays RETINA_* variables (sources comma-separated).
func (c *Config) ApplyEnv(getenv func(string) string) error {
	str := map[string]*string{
		"RETINA_DATA": &c.DataDir, "RETINA_LAKE": &c.Lake, "RETINA_SOURCE_EOF": &c.SourceEOF,
		"RETINA_SQL_ADDR": &c.SQLAddr, "RETINA_MYSQL_ADDR": &c.MySQLAddr, "RETINA_OLTP_DATA": &c.OLTPData, "RETINA_HTTP_ADDR": &c.HTTPAddr, "RETINA_LOG_FORMAT": &c.LogFormat,
		"RETINA_INDEX": &c.IndexBackend, "RETINA_BAD_INPUT": &c.BadInput, "RETINA_DEAD_LETTER": &c.DeadLetter,
		"RETINA_DECIMAL_HANDLING": &c.DecimalHandling, "RETINA_SQL_TLS_CERT": &c.SQLTLSCert, "RETINA_SQL_TLS_KEY": &c.SQLTLSKey,
		"RETINA_ICEBERG_ADDR": &c.IcebergAddr,
	}
	for k, p := range str {
		if v := getenv(k); v != "" {
			*p = v
		}
	}
	for k, p := range map[string]*int{"RETINA_REPLAYERS": &c.Replayers, "RETINA_BUCKETS": &c.Buckets, "RETINA_ICEBERG_FORMAT_VERSION": &c.IcebergFormatVersion} {
		if v := getenv(k); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil {
				return fmt.Errorf("config: %s=%q is not a number", k, v)
			}
			*p = n
		}
	}
	if user, pw := getenv("RETINA_SQL_USER"), getenv("RETINA_SQL_PASSWORD"); user != "" || pw != "" {
		if user == "" || pw == "" {
			return fmt.Errorf("config: RETINA_SQL_USER and RETINA_SQL_PASSWORD go together")
		}
		c.SQLUsers = append(c.SQLUsers, SQLUser{Name: user, Password: pw})
	}
	if v := getenv("RETINA_SQL_TLS_REQUIRED"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("config: RETINA_SQL_TLS_REQUIRED=%q: want true or false", v)
		}
		c.SQLTLSRequired = b
	}
	if v := getenv("RETINA_SOURCE"); v != "" {
		c.Sources = strings.Split(v, ",")
	}
	for k, p := range map[string]*time.Duration{"RETINA_CHECKPOINT_INTERVAL": &c.CheckpointInterval, "RETINA_INDEX_PURGE_INTERVAL": &c.IndexPurgeInterval,
		"RETINA_IDLE_IN_TRANSACTION_SESSION_TIMEOUT": &c.IdleInTransactionTimeout,
		"RETINA_STORAGE_GC_INTERVAL":                 &c.StorageGCInterval,
		"RETINA_VISIBILITY_CHECKPOINT_AFTER":         &c.VisibilityCheckpointAfter,
		"RETINA_QUERY_HISTORY":                       &c.QueryHistory,
		"RETINA_ICEBERG_INTERVAL":                    &c.IcebergInterval,
		"RETINA_ICEBERG_RETENTION":                   &c.IcebergRetention} {
		if v := getenv(k); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil {
				return fmt.Errorf("config: %s=%q is not a duration (like 5s)", k, v)
			}
			*p = d
		}
	}
	return nil
}

// Validate checks the values that have a fixed set of choices.
func (c *Config) Validate() error {
	switch {
	case c.SourceEOF != "follow" && c.SourceEOF != "stop":
		return fmt.Errorf("config: source_eof %q: want follow or stop", c.SourceEOF)
	case c.LogFormat != "text" && c.LogFormat != "json":
		return fmt.Errorf("config: log_format %q: want text or json", c.LogFormat)
	case c.IndexBackend != "memory" && c.IndexBackend != "pebble":
		return fmt.Errorf("config: index %q: want memory or pebble", c.IndexBackend)
	case c.BadInput != "fail" && c.BadInput != "dead-letter":
		return fmt.Errorf("config: bad_input %q: want fail or dead-letter", c.BadInput)
	case c.BadInput == "dead-letter" && c.DeadLetter == "":
		return fmt.Errorf("config: bad_input dead-letter needs dead_letter (a file)")
	case c.Replayers < 1 || c.Buckets < 1:
		return fmt.Errorf("config: replayers and buckets must be positive")
	}
	if c.BlockRows < 0 || c.FileBlocks < 0 || int64(c.BlockRows)*int64(max(c.FileBlocks, 1)) >= 1<<32 {
		return fmt.Errorf("config: block_rows %d × file_blocks %d: want positive values below 2^32 rows a file", c.BlockRows, c.FileBlocks)
	}
	if c.CheckpointInterval < time.Second {
		return fmt.Errorf("config: checkpoint_interval %s: at least 1s", c.CheckpointInterval)
	}
	if c.IdleInTransactionTimeout < 0 || c.IdleInTransactionTimeout > math.MaxInt32*time.Millisecond {
		return fmt.Errorf("config: idle_in_transaction_session_timeout %s: want 0 (no limit) up to %s", c.IdleInTransactionTimeout, math.MaxInt32*time.Millisecond)
	}
	if c.BlockCacheMiB < 0 {
		return fmt.Errorf("config: block_cache_mib %d: want 0 (off) or a size in MiB", c.BlockCacheMiB)
	}
	if c.VisibilityCheckpointAfter < 0 {
		return fmt.Errorf("config: visibility_checkpoint_after %s: want 0 (never) or a positive age", c.VisibilityCheckpointAfter)
	}
	if c.QueryHistory < 0 {
		return fmt.Errorf("config: query_history %s: want 0 (no time travel) or a positive duration", c.QueryHistory)
	}
	if c.StorageGCInterval < 0 {
		return fmt.Errorf("config: storage_gc_interval %s: want 0 (off) or a positive interval", c.StorageGCInterval)
	}
	if c.StorageGCStaleShare <= 0 || c.StorageGCStaleShare > 1 {
		return fmt.Errorf("config: storage_gc_stale_share %g: want a share in (0, 1]", c.StorageGCStaleShare)
	}
	if c.IcebergInterval != 0 && c.IcebergInterval < time.Second {
		return fmt.Errorf("config: iceberg_interval %s: want 0 (not published) or at least 1s", c.IcebergInterval)
	}
	if c.IcebergFormatVersion != 2 && c.IcebergFormatVersion != 3 {
		return fmt.Errorf("config: iceberg_format_version %d: want 2 (positional delete files) or 3 (deletion vectors)", c.IcebergFormatVersion)
	}
	if c.IcebergRetention <= 0 {
		return fmt.Errorf("config: iceberg_retention %s: want a positive duration", c.IcebergRetention)
	}
	if c.IcebergAddr != "" && c.IcebergInterval == 0 {
		return fmt.Errorf("config: iceberg_addr %s serves published tables, and iceberg_interval 0 publishes none: give an interval", c.IcebergAddr)
	}
	if c.IndexPurgeInterval < time.Second {
		return fmt.Errorf("config: index_purge_interval %s: at least 1s", c.IndexPurgeInterval)
	}
	if (c.SQLTLSCert == "") != (c.SQLTLSKey == "") {
		return fmt.Errorf("config: sql_tls_cert and sql_tls_key go together (a PEM certificate and its key)")
	}
	if c.SQLTLSRequired && c.SQLTLSCert == "" {
		return fmt.Errorf("config: sql_tls_required needs sql_tls_cert and sql_tls_key")
	}
	if _, err := c.sqlUsers(); err != nil {
		return fmt.Errorf("config: sql_users: %w", err)
	}
	if _, err := cdc.ParseDecimalMode(c.DecimalHandling); err != nil {
		return fmt.Errorf("config: decimal_handling: %w", err)
	}
	for _, t := range c.Tables {
		if _, err := t.schema(); err != nil {
			return err
		}
	}
	return nil
}

func (t TableDecl) schema() (catalog.Schema, error) {
	sc := catalog.Schema{PrimaryKey: t.PrimaryKey}
	for _, c := range t.Columns {
		ty, err := types.Parse(c.Type)
		if err != nil {
			return sc, fmt.Errorf("config: table %s column %s: %w", t.Name, c.Name, err)
		}
		sc.Columns = append(sc.Columns, catalog.Column{Name: c.Name, Type: ty, Nullable: c.Nullable})
	}
	return sc, nil
}

// sqlUsers builds the SQL endpoint's accounts.
func (c *Config) sqlUsers() (pgwire.Users, error) {
	users := pgwire.Users{}
	for _, u := range c.SQLUsers {
		if err := users.AddUser(u.Name, u.Password); err != nil {
			return nil, err
		}
	}
	return users, nil
}

// sqlTLS loads the SQL endpoint's certificate, if one is configured.
func (c *Config) sqlTLS() (*tls.Config, error) {
	if c.SQLTLSCert == "" {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(c.SQLTLSCert, c.SQLTLSKey)
	if err != nil {
		return nil, fmt.Errorf("config: TLS certificate %s with key %s: %w", c.SQLTLSCert, c.SQLTLSKey, err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}
