// Package console is Retina's web console and the status it shows: one JSON
// document, GET /api/status, that the page (served from the binary, no
// network needed) polls every second and that `retina status` prints in a
// terminal.
//
// # /api/status
//
// Every figure is the server's own, the same the Prometheus endpoint
// exports where both have it. Times are RFC 3339, durations seconds.
//
//	time, version, uptime_seconds, health ("ok" or why ingestion stopped)
//	rates        rows_per_sec, transactions_per_sec, messages_per_sec (the last second)
//	freshness    p50_ms, p99_ms, samples: source commit to visible in Retina,
//	             over the transactions of the last second that carried
//	             their source commit time
//	watermarks   hwm, lwm, lwm_age_seconds (how old the snapshot holding LWM
//	             is), hwm_lag (HWM − 1 minus the newest committed timestamp:
//	             transactions granted but not yet visible), oldest_reader
//	             (the statement or transaction holding LWM, when a client's)
//	checkpoint   ts, age_seconds, duration_seconds, count, errors
//	recovery     checkpoint_ts, clean, seconds, files_dropped, redoing,
//	             redone_transactions, redo_seconds
//	sources[]    name, state (copying, following, redoing, stopped, finished),
//	             position, lag_seconds, lag_bytes, lag_events, events_per_sec,
//	             reason (why it stopped)
//	dead_letters count, file, last (the last record, as written)
//	tables[]     name, live_rows, versions, stale_share, regular_files,
//	             virtual_files, lake_bytes, visibility_bytes, last_gc_rewrite
//	             (measured every few seconds: tables_at says when)
//	queries[]    pid, user, client, query, state, duration_seconds,
//	             snapshot, snapshot_age_seconds
//	storage_gc   rewrites, files_rewritten, files_dropped, errors
//	iceberg      publications, failures, snapshot_ts, lag_seconds (when on)
//	oltp         commits, aborts, commits_per_sec, memory_tables,
//	             storage_tables, memory_records (rows the memory engine
//	             holds), storage_bytes (the storage engine's disk space),
//	             stream_lag_commits (when the store runs)
//	history      interval_seconds (1) and points[] of the last 15 minutes:
//	             t (Unix seconds), rows_per_sec, fresh_p50_ms, fresh_p99_ms,
//	             hwm_lag; ?since=<t> returns only the points after t
package console

import "time"

// Status is the document /api/status serves.
type Status struct {
	Time        time.Time   `json:"time"`
	Version     string      `json:"version"`
	Uptime      float64     `json:"uptime_seconds"`
	Health      string      `json:"health"`
	Rates       Rates       `json:"rates"`
	Freshness   Freshness   `json:"freshness"`
	Watermarks  Watermarks  `json:"watermarks"`
	Checkpoint  Checkpoint  `json:"checkpoint"`
	Recovery    Recovery    `json:"recovery"`
	Sources     []Source    `json:"sources"`
	DeadLetters DeadLetters `json:"dead_letters"`
	Tables      []Table     `json:"tables"`
	TablesAt    time.Time   `json:"tables_at"`
	Queries     []Query     `json:"queries"`
	StorageGC   StorageGC   `json:"storage_gc"`
	Iceberg     *Iceberg    `json:"iceberg,omitempty"`
	OLTP        *OLTP       `json:"oltp,omitempty"`
	History     History     `json:"history"`
	Auth        bool        `json:"authenticated"`
}

// Rates are the throughput of the last second.
type Rates struct {
	Rows         float64 `json:"rows_per_sec"`
	Transactions float64 `json:"transactions_per_sec"`
	Messages     float64 `json:"messages_per_sec"`
}

// Freshness is the source-commit-to-visible time of the last second.
type Freshness struct {
	P50     float64 `json:"p50_ms"`
	P99     float64 `json:"p99_ms"`
	Samples int     `json:"samples"`
}

// Watermarks are Retina's MVCC watermarks.
type Watermarks struct {
	HWM          uint64  `json:"hwm"`
	LWM          uint64  `json:"lwm"`
	LWMAge       float64 `json:"lwm_age_seconds"`
	HWMLag       uint64  `json:"hwm_lag"`
	OldestReader *Query  `json:"oldest_reader,omitempty"`
}

// Checkpoint is the last replay checkpoint.
type Checkpoint struct {
	TS       uint64  `json:"ts"`
	Age      float64 `json:"age_seconds"`
	Duration float64 `json:"duration_seconds"`
	Count    uint64  `json:"count"`
	Errors   uint64  `json:"errors"`
}

// Recovery is what the last start restored and redid.
type Recovery struct {
	CheckpointTS uint64  `json:"checkpoint_ts"`
	Clean        bool    `json:"clean"`
	Seconds      float64 `json:"seconds"`
	FilesDropped int     `json:"files_dropped"`
	Redoing      bool    `json:"redoing"`
	Redone       uint64  `json:"redone_transactions"`
	RedoSeconds  float64 `json:"redo_seconds"`
}

// Source is one change source.
type Source struct {
	Name         string  `json:"name"`
	State        string  `json:"state"`
	Position     string  `json:"position"`
	LagSeconds   float64 `json:"lag_seconds"`
	LagBytes     int64   `json:"lag_bytes"`
	LagEvents    int64   `json:"lag_events"`
	EventsPerSec float64 `json:"events_per_sec"`
	Reason       string  `json:"reason,omitempty"`
}

// Source states.
const (
	Copying   = "copying"
	Following = "following"
	Redoing   = "redoing"
	Stopped   = "stopped"
	Finished  = "finished"
)

// DeadLetters are the inputs set aside.
type DeadLetters struct {
	Count uint64 `json:"count"`
	File  string `json:"file,omitempty"`
	Last  string `json:"last,omitempty"`
}

// Table is one table's storage.
type Table struct {
	Name            string     `json:"name"`
	LiveRows        int64      `json:"live_rows"`
	Versions        int64      `json:"versions"`
	StaleShare      float64    `json:"stale_share"`
	RegularFiles    int        `json:"regular_files"`
	VirtualFiles    int        `json:"virtual_files"`
	LakeBytes       int64      `json:"lake_bytes"`
	VisibilityBytes int64      `json:"visibility_bytes"`
	LastGCRewrite   *time.Time `json:"last_gc_rewrite,omitempty"`
}

// Query is a running statement or an open read transaction.
type Query struct {
	PID         uint32  `json:"pid"`
	User        string  `json:"user"`
	Client      string  `json:"client"`
	Query       string  `json:"query"`
	State       string  `json:"state"`
	Duration    float64 `json:"duration_seconds"`
	Snapshot    uint64  `json:"snapshot"`
	SnapshotAge float64 `json:"snapshot_age_seconds"`
}

// StorageGC counts storage GC's work.
type StorageGC struct {
	Rewrites       uint64 `json:"rewrites"`
	FilesRewritten uint64 `json:"files_rewritten"`
	FilesDropped   uint64 `json:"files_dropped"`
	Errors         uint64 `json:"errors"`
}

// Iceberg is the publication's state.
type Iceberg struct {
	Publications uint64  `json:"publications"`
	Failures     uint64  `json:"failures"`
	SnapshotTS   uint64  `json:"snapshot_ts"`
	Lag          float64 `json:"lag_seconds"`
}

// OLTP is the store's activity, when it runs in the process.
type OLTP struct {
	Commits          uint64  `json:"commits"`
	Aborts           uint64  `json:"aborts"`
	CommitsPerSec    float64 `json:"commits_per_sec"`
	MemoryTables     int     `json:"memory_tables"`
	StorageTables    int     `json:"storage_tables"`
	MemoryRecords    int64   `json:"memory_records"`
	StorageBytes     int64   `json:"storage_bytes"`
	StreamLagCommits int64   `json:"stream_lag_commits"`
}

// History is the last 15 minutes, one point a second.
type History struct {
	Interval float64 `json:"interval_seconds"`
	Points   []Point `json:"points"`
}

// Point is one second of history.
type Point struct {
	T        int64   `json:"t"`
	Rows     float64 `json:"rows_per_sec"`
	FreshP50 float64 `json:"fresh_p50_ms"`
	FreshP99 float64 `json:"fresh_p99_ms"`
	HWMLag   uint64  `json:"hwm_lag"`
}
