// Package histcheck checks recorded transaction histories for isolation
// anomalies by cycle detection over the dependency graph, in the style of
// Jepsen's Elle.
//
// Two kinds of objects make versions recoverable from what transactions
// observed:
//
//   - lists: transactions append unique values and read whole lists, so a
//     read shows every write before it in order (the version order is the
//     longest read; every other read must be a prefix of it);
//   - registers with version chains: each write names the version it
//     replaces (read-modify-write, e.g. a bank transfer), so the versions
//     form a chain; two writes replacing the same version are a lost update.
//
// From the version orders the checker builds Adya's dependency edges
// between committed transactions: ww (a version and the next), wr (a
// version and its readers) and rw (a reader and the writer of the next
// version). It reports:
//
//	G0         a cycle of ww edges
//	G1c        a cycle of ww and wr edges
//	G-single   a cycle with exactly one rw edge (forbidden by snapshot isolation)
//	G2         any cycle (forbidden by serializability)
//
// plus the non-cyclic anomalies: a read of an aborted or never-written
// value (G1a, garbage), reads that disagree on the version order
// (incompatible order), lost updates, and a transaction not seeing its own
// writes (internal).
package histcheck

import (
	"fmt"
	"slices"
	"strings"
)

// OpKind is the kind of a micro-operation.
type OpKind uint8

const (
	// Append adds Value to the list Key.
	Append OpKind = iota
	// ReadList observed List as the whole list Key.
	ReadList
	// Write sets register Key to version Value, replacing version Prev.
	Write
	// ReadReg observed version Value of register Key (0: the initial one).
	ReadReg
)

// Op is one micro-operation of a transaction.
type Op struct {
	Kind  OpKind
	Key   string
	Value int
	Prev  int
	List  []int
}

// Status is a transaction's outcome.
type Status uint8

const (
	Committed Status = iota
	Aborted
)

// Txn is one recorded transaction.
type Txn struct {
	ID     int
	Ops    []Op
	Status Status
}

// Level is the isolation level to check for.
type Level uint8

const (
	SnapshotIsolation Level = iota
	Serializable
)

// Anomaly is one violation found.
type Anomaly struct {
	Kind   string
	Txns   []int
	Detail string
}

func (a Anomaly) String() string {
	return fmt.Sprintf("%s %v: %s", a.Kind, a.Txns, a.Detail)
}

type edgeKind uint8

const (
	ww edgeKind = iota
	wr
	rw
)

var edgeNames = [...]string{"ww", "wr", "rw"}

type edge struct {
	to   int
	kind edgeKind
}

// checker holds the derived state of one Check.
type checker struct {
	txns    []Txn
	writer  map[string]map[int]int // key → value → index of the committed writer
	aborted map[string]map[int]bool
	order   map[string][]int // key → version order
	reads   []observation
	adj     [][]edge
	out     []Anomaly
}

// observation is a transaction's read of a key's external state: the
// first n versions of its order.
type observation struct {
	txn, n int
	key    string
}

// Check returns the anomalies of h that level forbids.
func Check(h []Txn, level Level) []Anomaly {
	c := &checker{txns: h, writer: map[string]map[int]int{}, aborted: map[string]map[int]bool{}, order: map[string][]int{}}
	c.indexWrites()
	c.versionOrders()
	c.observe()
	c.buildGraph()
	c.cycles(level)
	return c.out
}

func (c *checker) report(kind string, txns []int, format string, args ...any) {
	c.out = append(c.out, Anomaly{Kind: kind, Txns: txns, Detail: fmt.Sprintf(format, args...)})
}

func (c *checker) indexWrites() {
	for i, t := range c.txns {
		for _, op := range t.Ops {
			if op.Kind != Append && op.Kind != Write {
				continue
			}
			m := c.writer
			if t.Status == Aborted {
				if c.aborted[op.Key] == nil {
					c.aborted[op.Key] = map[int]bool{}
				}
				c.aborted[op.Key][op.Value] = true
				continue
			}
			if m[op.Key] == nil {
				m[op.Key] = map[int]int{}
			}
			if j, dup := m[op.Key][op.Value]; dup && j != i {
				c.report("duplicate-write", []int{c.txns[j].ID, t.ID}, "key %s value %d written twice; the history is malformed", op.Key, op.Value)
			}
			m[op.Key][op.Value] = i
		}
	}
}

// externalList strips the transaction's own earlier appends (which must
// be the read's suffix) from a list read.
func externalList(ops []Op, upto int) (ext []int, ok bool) {
	op := ops[upto]
	var own []int
	for _, o := range ops[:upto] {
		if o.Kind == Append && o.Key == op.Key {
			own = append(own, o.Value)
		}
	}
	if len(own) > len(op.List) || !slices.Equal(op.List[len(op.List)-len(own):], own) {
		return nil, false
	}
	return op.List[:len(op.List)-len(own)], true
}

func (c *checker) versionOrders() {
	// Lists: the longest external read; every other must be its prefix.
	longest := map[string][]int{}
	for _, t := range c.txns {
		if t.Status != Committed {
			continue
		}
		for i, op := range t.Ops {
			if op.Kind != ReadList {
				continue
			}
			ext, ok := externalList(t.Ops, i)
			if !ok {
				c.report("internal", []int{t.ID}, "read of %s = %v does not end with the transaction's own appends", op.Key, op.List)
				continue
			}
			l := longest[op.Key]
			short, long := ext, l
			if len(short) > len(long) {
				short, long = long, short
			}
			if !slices.Equal(long[:len(short)], short) {
				c.report("incompatible-order", []int{t.ID}, "reads of %s disagree: %v vs %v", op.Key, l, ext)
				continue
			}
			longest[op.Key] = long
		}
	}
	for k, l := range longest {
		c.order[k] = l
	}
	// Registers: follow the chain from the initial version 0.
	next := map[string]map[int]int{} // key → prev → value
	for _, t := range c.txns {
		if t.Status != Committed {
			continue
		}
		for _, op := range t.Ops {
			if op.Kind != Write {
				continue
			}
			if next[op.Key] == nil {
				next[op.Key] = map[int]int{}
			}
			if other, dup := next[op.Key][op.Prev]; dup {
				c.report("lost-update", []int{c.txns[c.writer[op.Key][other]].ID, t.ID},
					"register %s: versions %d and %d both replace version %d", op.Key, other, op.Value, op.Prev)
				continue
			}
			next[op.Key][op.Prev] = op.Value
		}
	}
	keys := make([]string, 0, len(next))
	for k := range next {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		m := next[k]
		var chain []int
		for v, ok := m[0]; ok; v, ok = m[v] {
			chain = append(chain, v)
			if len(chain) > len(m) {
				c.report("cyclic-versions", nil, "register %s: the version chain loops", k)
				break
			}
		}
		if len(chain) != len(m) {
			c.report("orphan-version", nil, "register %s: %d versions do not chain back to the initial one", k, len(m)-len(chain))
		}
		c.order[k] = chain
	}
}

func (c *checker) observe() {
	pos := map[string]map[int]int{}
	for k, l := range c.order {
		pos[k] = make(map[int]int, len(l))
		for i, v := range l {
			pos[k][v] = i + 1
		}
	}
	check := func(t Txn, key string, v int) bool {
		if _, ok := c.writer[key][v]; ok {
			return true
		}
		if c.aborted[key][v] {
			c.report("G1a", []int{t.ID}, "read %s = %d, written by an aborted transaction", key, v)
		} else {
			c.report("garbage-read", []int{t.ID}, "read %s = %d, which nobody wrote", key, v)
		}
		return false
	}
	for ti, t := range c.txns {
		if t.Status != Committed {
			continue
		}
		wrote := map[string]bool{}
		for i, op := range t.Ops {
			switch op.Kind {
			case Append, Write:
				wrote[op.Key] = true
			case ReadList:
				ext, ok := externalList(t.Ops, i)
				if !ok {
					continue
				}
				good := true
				seen := map[int]bool{}
				for _, v := range op.List {
					if seen[v] {
						c.report("duplicate-read", []int{t.ID}, "read %s = %v holds %d twice", op.Key, op.List, v)
					}
					seen[v] = true
					good = check(t, op.Key, v) && good
				}
				if good {
					c.reads = append(c.reads, observation{txn: ti, key: op.Key, n: len(ext)})
				}
			case ReadReg:
				if wrote[op.Key] {
					continue // its own write
				}
				if op.Value == 0 {
					c.reads = append(c.reads, observation{txn: ti, key: op.Key, n: 0})
				} else if check(t, op.Key, op.Value) {
					if p, ok := pos[op.Key][op.Value]; ok {
						c.reads = append(c.reads, observation{txn: ti, key: op.Key, n: p})
					}
				}
			}
		}
	}
}

func (c *checker) buildGraph() {
	c.adj = make([][]edge, len(c.txns))
	add := func(from, to int, k edgeKind) {
		if from != to {
			c.adj[from] = append(c.adj[from], edge{to: to, kind: k})
		}
	}
	// Sorted keys keep the graph, and so the reported cycles, deterministic.
	keys := make([]string, 0, len(c.order))
	for k := range c.order {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		l := c.order[k]
		for i := 1; i < len(l); i++ {
			add(c.writer[k][l[i-1]], c.writer[k][l[i]], ww)
		}
	}
	for _, o := range c.reads {
		l := c.order[o.key]
		if o.n > 0 {
			add(c.writer[o.key][l[o.n-1]], o.txn, wr)
		}
		if o.n < len(l) {
			add(o.txn, c.writer[o.key][l[o.n]], rw)
		}
	}
}

// cycles finds strongly connected components and classifies the cycles in
// them.
func (c *checker) cycles(level Level) {
	for _, comp := range c.scc(func(e edge) bool { return e.kind != rw }) {
		if p := c.findCycle(comp, func(e edge) bool { return e.kind == ww }); p != nil {
			c.report("G0", c.ids(p), "write cycle %s", c.describe(p))
			continue
		}
		c.report("G1c", c.ids(comp), "cycle %s", c.describe(c.findCycle(comp, func(e edge) bool { return e.kind != rw })))
	}
	for _, comp := range c.scc(func(edge) bool { return true }) {
		in := make(map[int]bool, len(comp))
		for _, n := range comp {
			in[n] = true
		}
		found := false
		for _, a := range comp {
			for _, e := range c.adj[a] {
				if e.kind != rw || !in[e.to] {
					continue
				}
				// One rw edge a→b closed by ww/wr edges b→…→a.
				if p := c.path(e.to, a, in, func(e edge) bool { return e.kind != rw }); p != nil {
					cyc := append([]int{a}, p[:len(p)-1]...)
					c.report("G-single", c.ids(cyc), "cycle %s with one anti-dependency", c.describe(cyc))
					found = true
					break
				}
			}
			if found {
				break
			}
		}
		if !found && level == Serializable {
			c.report("G2", c.ids(comp), "cycle %s", c.describe(c.findCycle(comp, func(edge) bool { return true })))
		}
	}
}

func (c *checker) ids(nodes []int) []int {
	out := make([]int, len(nodes))
	for i, n := range nodes {
		out[i] = c.txns[n].ID
	}
	return out
}

// describe renders a cycle's path with its edge kinds.
func (c *checker) describe(p []int) string {
	if len(p) == 0 {
		return "?"
	}
	var b strings.Builder
	for i, n := range p {
		next := p[(i+1)%len(p)]
		kind := "?"
		for _, e := range c.adj[n] {
			if e.to == next {
				kind = edgeNames[e.kind]
				break
			}
		}
		fmt.Fprintf(&b, "T%d -%s-> ", c.txns[n].ID, kind)
	}
	fmt.Fprintf(&b, "T%d", c.txns[p[0]].ID)
	return b.String()
}

// findCycle returns a cycle inside comp using only edges that ok admits
// (nil if none).
func (c *checker) findCycle(comp []int, ok func(edge) bool) []int {
	in := make(map[int]bool, len(comp))
	for _, n := range comp {
		in[n] = true
	}
	for _, start := range comp {
		for _, e := range c.adj[start] {
			if ok(e) && in[e.to] {
				if p := c.path(e.to, start, in, ok); p != nil {
					return append([]int{start}, p[:len(p)-1]...)
				}
			}
		}
	}
	return nil
}

// path is a shortest path from→…→to inside in using admitted edges,
// including both ends (nil if none).
func (c *checker) path(from, to int, in map[int]bool, ok func(edge) bool) []int {
	prev := map[int]int{from: -1}
	queue := []int{from}
	for len(queue) > 0 {
		n := queue[0]
		queue = queue[1:]
		if n == to {
			var p []int
			for ; n != -1; n = prev[n] {
				p = append(p, n)
			}
			slices.Reverse(p)
			return p
		}
		for _, e := range c.adj[n] {
			if !ok(e) || !in[e.to] {
				continue
			}
			if _, seen := prev[e.to]; !seen {
				prev[e.to] = n
				queue = append(queue, e.to)
			}
		}
	}
	return nil
}

// scc returns the strongly connected components with more than one node
// of the graph restricted to admitted edges (Tarjan, iterative).
func (c *checker) scc(ok func(edge) bool) [][]int {
	n := len(c.adj)
	index := make([]int, n)
	low := make([]int, n)
	onStack := make([]bool, n)
	for i := range index {
		index[i] = -1
	}
	var stack []int
	var out [][]int
	next := 0
	type frame struct{ node, edge int }
	for root := 0; root < n; root++ {
		if index[root] >= 0 {
			continue
		}
		call := []frame{{node: root}}
		index[root], low[root] = next, next
		next++
		stack = append(stack, root)
		onStack[root] = true
		for len(call) > 0 {
			f := &call[len(call)-1]
			v := f.node
			if f.edge < len(c.adj[v]) {
				e := c.adj[v][f.edge]
				f.edge++
				if !ok(e) {
					continue
				}
				w := e.to
				if index[w] < 0 {
					index[w], low[w] = next, next
					next++
					stack = append(stack, w)
					onStack[w] = true
					call = append(call, frame{node: w})
				} else if onStack[w] {
					low[v] = min(low[v], index[w])
				}
				continue
			}
			if low[v] == index[v] {
				var comp []int
				for {
					w := stack[len(stack)-1]
					stack = stack[:len(stack)-1]
					onStack[w] = false
					comp = append(comp, w)
					if w == v {
						break
					}
				}
				if len(comp) > 1 {
					out = append(out, comp)
				}
			}
			call = call[:len(call)-1]
			if len(call) > 0 {
				p := call[len(call)-1].node
				low[p] = min(low[p], low[v])
			}
		}
	}
	return out
}
