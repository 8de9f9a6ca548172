package writebuffer

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/visibility"
)

// Virtual files: the file receiving rows, and the sealed ones until their
// combination is done and no view holds their blocks.

// VirtualFile is a file still receiving rows or awaiting combination.
type VirtualFile struct {
	id       uint64
	capacity int
	vis      *visibility.RowGroup

	// Guarded by the buffer's mutex.
	blocks       []*block
	rows         int
	sealed       bool
	combining    bool // a combination runs or waits for its retry
	combineFails int
	combined     bool
	readers      int
	cleaned      bool
}

// ID is the file id.
func (f *VirtualFile) ID() uint64 { return f.id }

// Capacity is the most rows the file holds.
func (f *VirtualFile) Capacity() int { return f.capacity }

// Visibility is the file's row-group visibility.
func (f *VirtualFile) Visibility() *visibility.RowGroup { return f.vis }

// nextFile makes a new virtual file current once the current one is full
// (or gone). Registering a file writes the catalog and the index, so it
// runs without mu, and views, flushes and combinations go on meanwhile;
// alloc keeps concurrent appenders from registering a file each. Called
// with mu held; returns with mu held, the state possibly changed.
func (b *Buffer) nextFile(ctx context.Context) error {
	cur := b.cur
	b.mu.Unlock()
	b.alloc.Lock()
	defer b.alloc.Unlock()
	b.mu.Lock()
	switch {
	case b.closed:
		return ErrClosed
	case b.cur != cur:
		return nil // another appender made one meanwhile
	}
	b.mu.Unlock()
	f, err := b.registerFile(ctx)
	b.mu.Lock()
	if err != nil {
		return err
	}
	if b.cur != nil { // full: its last block is sealed already
		b.cur.sealed = true
		b.maybeCombine(b.cur)
	}
	b.cur = f
	b.build.startFile()
	return nil
}

// registerFile registers the next virtual file in the catalog and hands it
// to OnNewFile, before its first row. The buffer knows the file before the
// catalog names it: a scan planned in between finds it empty, not missing.
func (b *Buffer) registerFile(ctx context.Context) (*VirtualFile, error) {
	id, err := b.cfg.Catalog.AllocateFileIDs(ctx, 1)
	if err != nil {
		return nil, fmt.Errorf("writebuffer: allocate file id: %w", err)
	}
	capacity := b.cfg.BlockRows * b.cfg.FileBlocks
	vis, err := visibility.NewRowGroup(capacity, visibility.WithTileSize(b.cfg.TileSize))
	if err != nil {
		return nil, err
	}
	f := &VirtualFile{id: id, capacity: capacity, vis: vis}
	b.mu.Lock()
	b.files[id] = f
	b.mu.Unlock()
	forget := func() {
		b.mu.Lock()
		delete(b.files, id)
		b.mu.Unlock()
	}
	_, err = b.cfg.Catalog.RegisterFile(ctx, catalog.File{
		ID: id, TableID: b.cfg.TableID, Key: RegularKey(b.cfg.TableID, id),
		State: catalog.Virtual, Replayer: b.cfg.Replayer,
	})
	if err != nil {
		forget()
		return nil, fmt.Errorf("writebuffer: register virtual file %d: %w", id, err)
	}
	if b.cfg.OnNewFile != nil {
		if err := b.cfg.OnNewFile(f); err != nil {
			forget()
			return nil, fmt.Errorf("writebuffer: new file %d: %w", id, err)
		}
	}
	return f, nil
}

// sealCurrent ends the file receiving rows where it is: it is combined once
// its blocks are durable, and the next append starts a new file. Called
// with mu held and cur set.
func (b *Buffer) sealCurrent() {
	f := b.cur
	b.sealActive()
	f.sealed = true
	b.cur = nil
	b.maybeCombine(f)
}

// Filling names the virtual file receiving rows and how many it has.
func (b *Buffer) Filling() (id uint64, rows int, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cur == nil {
		return 0, 0, false
	}
	return b.cur.id, b.cur.rows, true
}

// SealFile ends the virtual file id before it is full, if it still receives
// rows: storage GC does this to a file whose rows went stale while it
// filled, so it becomes a regular file GC can rewrite. Its rows keep their
// locations; the next append starts a new file. It reports whether it
// sealed the file.
func (b *Buffer) SealFile(id uint64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cur == nil || b.cur.id != id || b.cur.rows == 0 {
		return false
	}
	b.sealCurrent()
	return true
}

// VirtualFiles lists the ids of files the buffer holds (not yet cleaned).
func (b *Buffer) VirtualFiles() []uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Collect(maps.Keys(b.files))
}

// Finish seals the file receiving rows even if it is not full, and waits
// until every block is durable and every file combined into a regular file:
// nothing of the table is left virtual (a clean shutdown calls it, so a
// restart finds only regular files). Later appends start a new file.
func (b *Buffer) Finish(ctx context.Context) error {
	b.mu.Lock()
	if b.cur != nil {
		b.sealCurrent()
	}
	b.mu.Unlock()
	if err := b.Flush(ctx); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, f := range b.files {
		if !f.combined {
			return fmt.Errorf("writebuffer: table %d file %d could not be combined (last error: %s)", b.cfg.TableID, f.id, b.stats.LastFlushError)
		}
	}
	return nil
}
