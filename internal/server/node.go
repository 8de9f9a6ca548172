// Package server wires Retina's components into one process (embedded
// mode): catalog, index, lake, transaction service, replayers, scanner and
// the SQL engine, plus the sink, the SQL endpoint and the metrics endpoint
// when it serves.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/checkpoint"
	"github.com/retinadb/retina/internal/failpoint"
	"github.com/retinadb/retina/internal/iceberg"
	"github.com/retinadb/retina/internal/index"
	"github.com/retinadb/retina/internal/lake"
	"github.com/retinadb/retina/internal/query"
	"github.com/retinadb/retina/internal/replay"
	"github.com/retinadb/retina/internal/scan"
	"github.com/retinadb/retina/internal/sink"
	"github.com/retinadb/retina/internal/txn"
	"github.com/retinadb/retina/internal/visibility"
	"github.com/retinadb/retina/internal/writebuffer"
)

// NodeConfig chooses where state lives and how components are tuned.
type NodeConfig struct {
	DataDir      string // catalog, index, transaction state (default ./retina-data)
	Lake         string // bucket URL (default file://<DataDir>/lake)
	IndexBackend string // "memory" (default) or "pebble"
	Replayers    int    // replayers in this process (default 2)
	Buckets      int    // buckets the sink shards keys into (default 16)
	BlockRows    int    // write-buffer block size (default 8192)
	FileBlocks   int    // blocks per virtual file (default 128)
	QueryThreads int    // DuckDB threads (default GOMAXPROCS)
	// Waiter answers the SQL function retina_wait_lsn (nil: no source can).
	Waiter query.SourceWaiter
	// BlockCacheBytes bounds the flushed write-buffer blocks kept decoded
	// for scans (0: no cache).
	BlockCacheBytes int64
	// IdleInTransactionTimeout is the SQL sessions' default
	// idle_in_transaction_session_timeout (0: no limit).
	IdleInTransactionTimeout time.Duration
	// VisibilityCheckpointAfter is the age at which a reader's snapshot is
	// checkpointed so it stops holding LWM (0: never).
	VisibilityCheckpointAfter time.Duration
	// QueryHistory is how far back SQL sessions can read with
	// retina.as_of; GC keeps what that needs (0: no time travel).
	QueryHistory time.Duration
	// StorageGC tunes the rewriting of stale and small files.
	StorageGC StorageGCConfig
	// Iceberg turns publication of the tables as Iceberg tables on.
	Iceberg IcebergConfig
	// FS holds the checkpoint's files (default: the local disk); tests put
	// a file system there that fails chosen operations.
	FS vfs.FS
	// Failpoints can stop the process at chosen points (crash tests).
	Failpoints *failpoint.Set
	Logger     *slog.Logger
}

// Node is every component of an embedded Retina, opened and wired.
type Node struct {
	Config    NodeConfig
	Catalog   *catalog.Catalog
	Index     *index.Store
	Lake      *lake.Store
	TxnStore  *txn.FileStore
	Txn       *txn.Local
	Replayers []*replay.Replayer
	Scanner   *scan.Scanner
	Engine    *query.Engine
	// BlockCache keeps flushed write-buffer blocks decoded (nil: off).
	BlockCache *writebuffer.BlockCache
	// Combines bounds the write buffers' combinations to half the cores.
	Combines *writebuffer.CombineLimit
	// Iceberg publishes the tables as Iceberg tables (nil: off).
	Iceberg *iceberg.Publisher
	// Recovery says what the start restored.
	Recovery Recovery
	log      *slog.Logger

	ckpts    *checkpoint.Store
	ckptMu   sync.Mutex // one checkpoint write at a time
	restored *checkpoint.Manifest
	gcPin    atomic.Uint64 // ts+1 of a checkpoint taking deleted sets, 0 when none
	purges   PurgeStats
	gc       storageGC
	readers  ReaderStats
}

// PurgeStats count index purges.
type PurgeStats struct {
	Runs, Versions, Errors atomic.Uint64
	Nanos                  atomic.Int64 // time spent purging
}

// Defaults of NodeConfig (and of Config, which carries them) that no
// lower package owns.
const (
	defaultIndexBackend = "memory"
	defaultReplayers    = 2
)

// OpenNode opens every component on the data directory.
func OpenNode(ctx context.Context, cfg NodeConfig) (_ *Node, err error) {
	if cfg.DataDir == "" {
		cfg.DataDir = "retina-data"
	}
	if cfg.DataDir, err = filepath.Abs(cfg.DataDir); err != nil {
		return nil, err
	}
	if cfg.Lake == "" {
		cfg.Lake = "file://" + filepath.Join(cfg.DataDir, "lake")
	}
	if cfg.IndexBackend == "" {
		cfg.IndexBackend = defaultIndexBackend
	}
	if cfg.Replayers <= 0 {
		cfg.Replayers = defaultReplayers
	}
	if cfg.Buckets <= 0 {
		cfg.Buckets = sink.DefaultBuckets
	}
	if cfg.BlockRows <= 0 {
		cfg.BlockRows = writebuffer.DefaultBlockRows
	}
	if cfg.FileBlocks <= 0 {
		cfg.FileBlocks = writebuffer.DefaultFileBlocks
	}
	cfg.StorageGC.defaults()
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.FS == nil {
		cfg.FS = vfs.Default
	}
	if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
		return nil, fmt.Errorf("server: data directory %s: %w", cfg.DataDir, err)
	}
	recordShards, err := checkSharding(cfg)
	if err != nil {
		return nil, err
	}
	n := &Node{Config: cfg, log: cfg.Logger, ckpts: checkpoint.Open(cfg.FS, cfg.DataDir)}
	n.ckpts.Failpoints = cfg.Failpoints
	defer func() {
		if err != nil { // close what was opened
			n.Close(context.Background())
		}
	}()
	if n.Catalog, err = catalog.Open(filepath.Join(cfg.DataDir, "catalog")); err != nil {
		return nil, err
	}
	m, err := n.loadCheckpoint()
	if err != nil {
		return nil, err
	}
	// The index on disk is the index at the checkpoint only after a clean
	// stop; otherwise it is rebuilt from the files.
	keepIndex := cfg.IndexBackend == "pebble" && m != nil && m.Clean
	indexDir := filepath.Join(cfg.DataDir, "index")
	if cfg.IndexBackend == "pebble" && !keepIndex {
		if err := os.RemoveAll(indexDir); err != nil {
			return nil, fmt.Errorf("server: clear the index %s to rebuild it: %w", indexDir, err)
		}
	}
	idxCfg := index.Config{Backend: cfg.IndexBackend, Dir: indexDir, NoWAL: true, Logger: cfg.Logger}
	n.Index, err = index.Open(idxCfg)
	if err == nil && keepIndex {
		if ts, ok, serr := n.Index.Stamped(); serr != nil || !ok || ts != m.TS {
			// It opened at another state than the clean stop left (a torn
			// manifest reopens at an earlier one).
			err = fmt.Errorf("its stamp (%d, found %v, %v) is not the checkpoint's snapshot %d", ts, ok, serr, m.TS)
			n.Index.Close()
		}
	}
	if err != nil && keepIndex {
		// The index is derived from the files: a damaged one is rebuilt,
		// never served.
		n.log.Warn("the index kept at the clean stop does not open as it was; rebuilding it from the files", "dir", indexDir, "err", err)
		keepIndex = false
		if rmErr := os.RemoveAll(indexDir); rmErr != nil {
			return nil, fmt.Errorf("server: clear the damaged index %s to rebuild it: %w (it failed with: %v)", indexDir, rmErr, err)
		}
		n.Index, err = index.Open(idxCfg)
	}
	if err != nil {
		return nil, err
	}
	if n.Lake, err = lake.Open(ctx, cfg.Lake, lake.Options{Logger: cfg.Logger}); err != nil {
		return nil, err
	}
	if n.TxnStore, err = txn.OpenFileStore(filepath.Join(cfg.DataDir, "txn")); err != nil {
		return nil, err
	}
	if n.Txn, err = txn.NewLocal(ctx, n.TxnStore, txn.Options{Logger: cfg.Logger}); err != nil {
		return nil, err
	}
	if cfg.BlockCacheBytes > 0 {
		n.BlockCache = writebuffer.NewBlockCache(cfg.BlockCacheBytes)
	}
	// Combinations share half the cores, so replay keeps the rest while
	// several tables fill files at once.
	n.Combines = writebuffer.NewCombineLimit(runtime.GOMAXPROCS(0) / 2)
	// Undo records a process spilled are of transactions recovery drops.
	undoDir := filepath.Join(cfg.DataDir, "undo")
	if err := replay.RemoveUndoFiles(undoDir); err != nil {
		return nil, fmt.Errorf("server: remove old undo files in %s: %w", undoDir, err)
	}
	if err := os.MkdirAll(undoDir, 0o755); err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	n.Scanner = scan.New(n.Lake, n.owner, nil)
	for id := range cfg.Replayers {
		rp, err := replay.New(replay.Config{ID: uint32(id), Catalog: n.Catalog, Index: n.Index, Lake: n.Lake,
			BlockRows: cfg.BlockRows, FileBlocks: cfg.FileBlocks, BlockCache: n.BlockCache, Combines: n.Combines, Failpoints: cfg.Failpoints,
			Rows: n.Scanner, UndoDir: undoDir, Keeps: n.keeps, Logger: cfg.Logger})
		if err != nil {
			return nil, err
		}
		n.Replayers = append(n.Replayers, rp)
	}
	if err := n.openIceberg(ctx); err != nil {
		return nil, err
	}
	if err := n.restore(ctx, m, !keepIndex); err != nil {
		return nil, err
	}
	if err := n.startIceberg(ctx); err != nil {
		return nil, err
	}
	if r := n.Recovery; r.Checkpoint != 0 || r.Dropped > 0 {
		n.log.Info("restored the replay state from its checkpoint", "checkpoint_ts", r.Checkpoint, "taken", r.Written,
			"clean_stop", r.Clean, "files_dropped", r.Dropped, "files_combined", r.Combined, "took", r.Duration.Round(time.Millisecond))
	}
	lakeDir, _ := n.Lake.LocalDir()
	if n.Engine, err = query.Open(ctx, query.Config{Catalog: n.Catalog, Txn: n.Txn, Scanner: n.Scanner, Index: n.Index, Threads: cfg.QueryThreads,
		IdleInTransactionTimeout: cfg.IdleInTransactionTimeout, History: cfg.QueryHistory, Waiter: cfg.Waiter, LakeDir: lakeDir,
		ScratchDir: filepath.Join(cfg.DataDir, "query"), Logger: cfg.Logger}); err != nil {
		return nil, err
	}
	if recordShards {
		if err := recordSharding(cfg); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// Collect is memory GC: every file's visibility folds its deletes below
// lwm, so memory tracks the deletes running queries can still see, not
// every delete ever made. The sink decides when (on its ticks).
func (n *Node) Collect(lwm uint64) {
	lwm = n.gcBound(lwm)
	n.Index.SetHorizon(lwm)
	for _, rp := range n.Replayers {
		rp.Collect(lwm)
	}
}

// PurgeIndex drops the index versions no snapshot at or above lwm can
// see, so the index holds what running queries and replay need, not every
// version ever written. The sink decides when.
func (n *Node) PurgeIndex(lwm uint64) {
	lwm = n.gcBound(lwm)
	start := time.Now()
	removed, err := n.Index.Purge(context.Background(), lwm)
	n.purges.Runs.Add(1)
	n.purges.Versions.Add(uint64(removed))
	n.purges.Nanos.Add(int64(time.Since(start)))
	if err != nil {
		n.purges.Errors.Add(1)
		n.log.Warn("index purge failed; the next one retries", "below_ts", lwm, "removed", removed, "err", err)
		return
	}
	n.log.Debug("index purged", "below_ts", lwm, "removed", removed, "took", time.Since(start).Round(time.Millisecond))
}

// Purges counts the index purges so far.
func (n *Node) Purges() *PurgeStats { return &n.purges }

// CollectVisibility runs one visibility GC pass at the current LWM now.
func (n *Node) CollectVisibility(ctx context.Context) visibility.CollectStats {
	var total visibility.CollectStats
	w, err := n.Txn.Watermarks(ctx)
	if err != nil {
		return total
	}
	for _, rp := range n.Replayers {
		st := rp.Collect(n.gcBound(w.LWM))
		total.Folded += st.Folded
		total.FreedBlocks += st.FreedBlocks
	}
	return total
}

func (n *Node) owner(id uint32) (scan.Owner, bool) {
	if int(id) < len(n.Replayers) {
		return n.Replayers[id], true
	}
	return nil, false
}

// Persist is a clean stop's last checkpoint: with intake stopped and
// nothing in flight, every buffered row becomes part of a regular file,
// the index is synced, and a checkpoint marked clean records the state at
// HWM − 1 with the sources' positions. A node reopened on the directory
// answers exactly as this one did and keeps its Pebble index.
func (n *Node) Persist(ctx context.Context, sources []checkpoint.Source) error {
	var errs []error
	for _, rp := range n.Replayers {
		errs = append(errs, rp.Finish(ctx))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("server: finish write buffers: %w", err)
	}
	w, err := n.Txn.Watermarks(ctx)
	if err != nil {
		return err
	}
	// The stamp is synced with the rest: a start keeps the index only
	// when it finds the checkpoint's snapshot there.
	if err := n.Index.Stamp(w.HWM - 1); err != nil {
		return fmt.Errorf("server: stamp the index: %w", err)
	}
	if err := n.Index.Sync(); err != nil {
		return fmt.Errorf("server: sync the index: %w", err)
	}
	st, err := n.Seal(w.HWM - 1)
	if err != nil {
		return err
	}
	st.clean, st.publishNow = true, true
	return st.Write(ctx, sources)
}

// Close stops every component, flushing the replayers' buffers.
func (n *Node) Close(ctx context.Context) error {
	var errs []error
	if n.Engine != nil {
		errs = append(errs, n.Engine.Close())
	}
	if n.Iceberg != nil {
		n.Iceberg.Close()
	}
	for _, rp := range n.Replayers {
		errs = append(errs, rp.Close(ctx))
	}
	if n.Txn != nil {
		errs = append(errs, n.Txn.Close())
	}
	if n.TxnStore != nil {
		errs = append(errs, n.TxnStore.Close())
	}
	if n.Index != nil {
		errs = append(errs, n.Index.Close())
	}
	if n.Lake != nil {
		errs = append(errs, n.Lake.Close())
	}
	if n.Catalog != nil {
		errs = append(errs, n.Catalog.Close())
	}
	return errors.Join(errs...)
}

// Memory is what the node's replay state holds in memory.
type Memory struct {
	VisibilityBytes  int64
	WriteBufferBytes int64
	// Tuples counts the row versions replayed since the node opened
	// (inserts and updates): the denominator of bits per tuple.
	Tuples uint64
}

// Memory sums the replayers' visibility and write-buffer memory.
func (n *Node) Memory() Memory {
	var m Memory
	for _, rp := range n.Replayers {
		m.VisibilityBytes += rp.VisibilityBytes()
		m.WriteBufferBytes += rp.BufferStats().MemoryBytes
		st := rp.Stats()
		m.Tuples += st.Inserts + st.Updates
	}
	return m
}
