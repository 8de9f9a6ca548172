// Package streamorder merges the commits of Skeena's two engines into one
// global commit order, the order the store's commit stream delivers them in.
//
// Each engine orders its own commits by commit timestamp. A cross-engine
// transaction has a timestamp in both, and Skeena's commit check makes the
// two orders agree on such transactions. So the global order is a merge of
// the two sequences that keeps every cross-engine commit after everything
// below its timestamp in either engine and before everything above; between
// two cross-engine commits, single-engine commits of the two engines may
// interleave freely, because every such interleaving is a state a Skeena
// snapshot could read (the registry allows any storage snapshot between the
// two cross-engine commits for an anchor snapshot between them).
//
// A single-engine commit that read the other engine is the exception: it
// read that engine at a snapshot, and every state a snapshot can read that
// holds the commit also holds what it read. So it comes out only after
// every commit of the other engine at or below that snapshot.
//
// The Merger is deterministic (no goroutines, clock or I/O): the store adds
// each committing transaction before its timestamps can pass either
// engine's mark, advances the marks as commits become visible and durable,
// and takes what is Ready.
package streamorder

import (
	"errors"
	"fmt"
)

// Commit is one committed transaction.
type Commit struct {
	// Mem and Storage are its commit timestamps in the memory and the
	// storage engine; 0 where it did not commit.
	Mem, Storage uint64
	// ReadMem is the memory snapshot a storage-only commit read (0: it
	// read no memory table); ReadStorage the storage snapshot a
	// memory-only commit read.
	ReadMem, ReadStorage uint64
	// Payload is what the committer attached (the change set).
	Payload any
}

func (c Commit) String() string { return fmt.Sprintf("m%d/s%d", c.Mem, c.Storage) }

// ErrOrder is wrapped when the engines' orders cannot be merged: two
// cross-engine commits are ordered differently in the two engines (the
// commit check was off), or a commit was added after its timestamp passed
// a mark.
var ErrOrder = errors.New("streamorder: the engines' commit orders cannot be merged")

// Merger holds commits until they can be released in global order.
type Merger struct {
	mem, disk []*Commit // pending, ascending by that engine's timestamp
	memMark   uint64    // every memory commit ≤ memMark has been added
	diskMark  uint64
	ready     []Commit
	err       error
}

// Add takes a committing transaction. It must come before either mark
// passes its timestamps.
func (m *Merger) Add(c Commit) error {
	if c.Mem == 0 && c.Storage == 0 {
		return fmt.Errorf("%w: commit %s has no timestamp", ErrOrder, c)
	}
	if c.Mem != 0 && c.Mem <= m.memMark || c.Storage != 0 && c.Storage <= m.diskMark {
		return fmt.Errorf("%w: commit %s added after the marks m%d/s%d passed it", ErrOrder, c, m.memMark, m.diskMark)
	}
	p := &c
	if c.Mem != 0 {
		m.mem = insert(m.mem, p, memTS)
	}
	if c.Storage != 0 {
		m.disk = insert(m.disk, p, storageTS)
	}
	return nil
}

// insert puts c into q in ascending order of ts; commits mostly arrive in
// order, so the search starts at the end.
func insert(q []*Commit, c *Commit, ts func(*Commit) uint64) []*Commit {
	i := len(q)
	for i > 0 && ts(q[i-1]) > ts(c) {
		i--
	}
	q = append(q, nil)
	copy(q[i+1:], q[i:])
	q[i] = c
	return q
}

// Advance moves the marks: every commit at or below mem in the memory
// engine and at or below storage in the storage engine has been added (it
// is visible and durable, or it aborted). Marks never move back.
func (m *Merger) Advance(mem, storage uint64) {
	m.memMark = max(m.memMark, mem)
	m.diskMark = max(m.diskMark, storage)
	m.release()
}

func (m *Merger) release() {
	for m.err == nil {
		var mh, dh *Commit
		if len(m.mem) > 0 && m.mem[0].Mem <= m.memMark {
			mh = m.mem[0]
		}
		if len(m.disk) > 0 && m.disk[0].Storage <= m.diskMark {
			dh = m.disk[0]
		}
		switch {
		case mh != nil && mh.Storage == 0 && released(mh.ReadStorage, m.disk, m.diskMark, storageTS):
			m.ready = append(m.ready, *mh)
			m.mem = pop(m.mem)
		case dh != nil && dh.Mem == 0 && released(dh.ReadMem, m.mem, m.memMark, memTS):
			m.ready = append(m.ready, *dh)
			m.disk = pop(m.disk)
		case mh != nil && mh == dh:
			m.ready = append(m.ready, *mh)
			m.mem, m.disk = pop(m.mem), pop(m.disk)
		case mh != nil && dh != nil && mh.Storage != 0 && dh.Mem != 0:
			// Two different cross-engine commits each head their engine:
			// each waits for the other, so the orders disagree.
			m.err = fmt.Errorf("%w: %s precedes %s in memory but follows it in storage", ErrOrder, mh, dh)
		default:
			return
		}
	}
}

func memTS(c *Commit) uint64     { return c.Mem }
func storageTS(c *Commit) uint64 { return c.Storage }

// released reports whether every commit of an engine at or below the
// snapshot read has come out: its mark has passed read and its queue holds
// nothing at or below it. A read of 0 (none) is always released.
func released(read uint64, q []*Commit, mark uint64, ts func(*Commit) uint64) bool {
	return read == 0 || mark >= read && (len(q) == 0 || ts(q[0]) > read)
}

func pop(q []*Commit) []*Commit {
	q[0] = nil
	if len(q) == 1 {
		return q[:0]
	}
	return q[1:]
}

// Ready returns the commits released since the last call, in global
// order, or the error that stopped the merge.
func (m *Merger) Ready() ([]Commit, error) {
	out := m.ready
	m.ready = nil
	return out, m.err
}

// Pending is the number of commits held back.
func (m *Merger) Pending() int {
	n := len(m.mem)
	for _, c := range m.disk {
		if c.Mem == 0 {
			n++
		}
	}
	return n
}
