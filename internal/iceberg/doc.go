// Package iceberg publishes Retina's tables as Apache Iceberg tables, so
// that any engine reads them: at every replay checkpoint (c, durable) one
// snapshot of every table, all at Retina timestamp c, whose rows are
// exactly what Retina's SQL returns at c.
//
// # What a snapshot holds
//
// Data files are Retina's own regular Parquet files, as they are (their
// columns carry field ids: lake.FieldID), and pieces: Parquet files the
// publisher writes of the rows no regular file holds yet (virtual files,
// see pieces.go). The rows of a data file that are not visible at c (deleted
// at or before c, created after c, or a piece's rows whose file has become
// regular) are masked by positional delete files (format version 2) or by
// deletion vectors in Puffin files (version 3, one per data file).
//
// # Commit protocol
//
// A publication writes, for every table, its new data and delete files,
// manifests, manifest list and metadata file, each under a name no
// earlier publication used; then it replaces the publication record, which
// is the commit: the REST catalog serves what the record names. A crash
// before the record is replaced leaves the previous publication current
// and whole; what the unfinished one wrote is named by nothing and is
// deleted at the next start (Publisher.Sweep). Files the retained
// snapshots no longer name are deleted after the commit; Retina's own
// files among them only once Retina's catalog no longer has them (until
// then Retina's storage GC asks Keeps before deleting an object).
//
// A publication covers a durable checkpoint's state, so everything it
// names is on disk and a restart restores a state at or after it: no
// published file is one the restore drops. At a start the publisher reads
// the record and the retained snapshots' manifests back (load.go); the
// pieces it finds are of files that are regular after the restore, and the
// next publication drops them and writes the delete information anew.
//
// # Layout in the lake
//
//	iceberg/catalog.json                          the publication record (below)
//	iceberg/<ns>/<table>/metadata/v<N>.metadata.json
//	                                              table metadata, version N
//	iceberg/<ns>/<table>/metadata/version-hint.text
//	                                              N, for readers that open the
//	                                              table by its location (it
//	                                              may lag by hintEvery)
//	iceberg/<ns>/<table>/metadata/snap-<id>.avro  manifest list of snapshot id
//	iceberg/<ns>/<table>/metadata/m-<id>-data.avro, m-<id>-deletes.avro
//	                                              manifests snapshot id wrote
//	iceberg/<ns>/<table>/data/p-<id>.parquet      a piece
//	iceberg/<ns>/<table>/data/d-<id>.parquet      positional deletes (v2)
//	iceberg/<ns>/<table>/data/dv-<id>.puffin      deletion vectors (v3)
//
// <ns> is the Retina table's schema (public for plain names); a name that
// is not plain (letters, digits, '.', '_', '-') lives at iceberg/t<table id>.
// Every table's snapshot of one publication has the same id, the
// publication's number, which goes on across restarts; its summary holds
// retina.snapshot-ts (c) and retina.sources (each source's position).
//
// # Publication record
//
// iceberg/catalog.json is JSON: format (1), publication (the number),
// snapshot_ts (c), published (UTC time), format_version (2 or 3), and
// tables, each with namespace, name, table_id (Retina's), metadata (the
// lake key of its current metadata file) and version. It is replaced
// whole (Put); a record that does not parse refuses the start.
package iceberg
