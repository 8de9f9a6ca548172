package writebuffer

import "context"

// Sealed is a buffer at a checkpoint: every row appended so far is in a
// sealed block, and Files says how many rows each virtual file the buffer
// holds had then. Once Wait returns, all of those rows are durable in block
// objects (or already in the file's combined regular object).
type Sealed struct {
	// Files maps the id of every virtual file the buffer holds to its rows.
	Files map[uint64]int
	// Capacity is the rows a virtual file's visibility covers.
	Capacity int
	buf      *Buffer
	blocks   []*block // not durable when sealed
}

// Seal seals the active block and records the virtual files' rows. The
// caller keeps appends away while it runs (the sink is quiesced), so the
// rows it records are exactly those of committed transactions.
func (b *Buffer) Seal() *Sealed {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := &Sealed{Files: map[uint64]int{}, Capacity: b.cfg.BlockRows * b.cfg.FileBlocks, buf: b}
	if b.cur != nil {
		b.sealActive()
	}
	for id, f := range b.files {
		s.Files[id] = f.rows
		for _, blk := range f.blocks {
			if blk.key == "" {
				s.blocks = append(s.blocks, blk)
			}
		}
	}
	return s
}

// Wait returns once every block that was not durable when Seal ran is
// flushed, or when ctx ends. Blocks sealed later are not waited for.
func (s *Sealed) Wait(ctx context.Context) error {
	b := s.buf
	for {
		b.mu.Lock()
		pending := 0
		for _, blk := range s.blocks {
			if blk.key == "" {
				pending++
			}
		}
		closed, changed := b.closed, b.changed
		b.mu.Unlock()
		switch {
		case pending == 0:
			return nil
		case closed:
			return ErrClosed
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
	}
}
