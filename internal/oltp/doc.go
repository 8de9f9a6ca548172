// Package oltp is the root of the Skeena track: a transactional store with
// a fast in-memory engine and a Pebble-backed storage engine, where one
// transaction may touch both and still gets snapshot isolation and an
// atomic, durable commit without two-phase commit.
//
// One package per concern:
//
//	engine      the narrow interface the cross-engine layer sees; typed errors
//	tsorder     commit timestamps, the visible watermark and the durable mark
//	memengine   in-memory multi-version rows, redo log with group commit, checkpoints
//	diskengine  multi-version rows on Pebble, Pebble's WAL as the redo log
//	csr         the cross-engine snapshot registry (deterministic, no goroutines)
//	skeena      cross-engine transactions: snapshot selection, commit check,
//	            pipelined commit, cross-engine crash recovery
//	histcheck   an Elle-style history checker (dependency-graph cycles)
package oltp
