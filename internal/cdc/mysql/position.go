package mysql

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/google/uuid"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"

	"github.com/retinadb/retina/internal/cdc"
)

// Positions. Every stream of a source is named under "mysql/NAME/TAG"
// (NAME and TAG from the URI's name and copy parameters):
//
//	…/copy@START        the initial copy: offset 0 holds the truncate that
//	                    precedes a copy made again, 1, 2, … one per row, and
//	                    copyDone once every table is copied. START is the
//	                    binlog position of the copy's snapshot, where
//	                    streaming starts: "gtid:SET" or "file:NAME:OFFSET".
//	…/gtid/D-S          MariaDB GTIDs of domain D written by server S: a
//	                    transaction sits at its sequence number, its changes
//	                    and its end alike.
//	…/gtid/UUID         MySQL GTIDs of the server UUID: at the GNO.
//	…/binlog/BASE       file positions when GTIDs are off: a transaction's
//	                    changes sit at the binlog offset of its first event,
//	                    its end one before the end of its commit event; the
//	                    offset packs the file's number and the offset in it
//	                    (number<<32 | offset).
//
// A replay checkpoint's resume offsets then say exactly where streaming
// starts again: after the copy's START, every GTID below a GTID stream's
// resume offset is applied (GTIDs of one stream are applied in order, since
// the binlog is read in order); a file stream resumes at its offset. GTID
// sets with gaps (MySQL transactions applied out of order on a replica
// Retina reads) are not followed: Retina resumes after the highest GTID.
const copyDone = math.MaxInt64 - 1

func prefix(o Options) string { return "mysql/" + o.Name + "/" + o.Copy }

// position is a binlog position: a GTID set or a file and offset.
type position struct {
	gtid   gomysql.GTIDSet // nil in file mode
	flavor string
	file   string
	offset uint32
}

func (p position) String() string {
	if p.gtid != nil {
		return "gtid:" + p.gtid.String()
	}
	return fmt.Sprintf("file:%s:%d", p.file, p.offset)
}

func parsePosition(flavor, s string) (position, error) {
	if set, ok := strings.CutPrefix(s, "gtid:"); ok {
		g, err := gomysql.ParseGTIDSet(flavor, set)
		if err != nil {
			return position{}, fmt.Errorf("GTID set %q: %w", set, err)
		}
		return position{gtid: g, flavor: flavor}, nil
	}
	if rest, ok := strings.CutPrefix(s, "file:"); ok {
		i := strings.LastIndexByte(rest, ':')
		if i > 0 {
			if off, err := strconv.ParseUint(rest[i+1:], 10, 32); err == nil {
				return position{file: rest[:i], offset: uint32(off)}, nil
			}
		}
	}
	return position{}, fmt.Errorf("binlog position %q: want gtid:SET or file:NAME:OFFSET", s)
}

// fileOffset packs a binlog file name and offset into a stream offset; ok
// is false for a name without a numeric extension.
func fileOffset(file string, off uint32) (base string, packed int64, ok bool) {
	dot := strings.LastIndexByte(file, '.')
	if dot < 0 {
		return "", 0, false
	}
	n, err := strconv.ParseUint(file[dot+1:], 10, 31)
	if err != nil {
		return "", 0, false
	}
	return file[:dot], int64(n)<<32 | int64(off), true
}

// fileAt unpacks a stream offset into the binlog file of that number.
func fileAt(base string, packed int64) (string, uint32) {
	return fmt.Sprintf("%s.%06d", base, packed>>32), uint32(packed)
}

// resumeState is what a replay checkpoint says about this source.
type resumeState struct {
	copied    bool     // the initial copy of this tag is applied in full
	delivered bool     // something of this source was delivered before
	start     position // where streaming resumes, valid when copied
	// copyStream names the complete copy's stream, when copied.
	copyStream string
}

// readResume reads the resume offsets of this source's streams.
func readResume(o Options, flavor string, resume map[string]int64) (resumeState, error) {
	var st resumeState
	pre := prefix(o) + "/"
	var startText string
	for name, off := range resume {
		// A copy under a new tag replaces what any tag delivered.
		if strings.HasPrefix(name, "mysql/"+o.Name+"/") {
			st.delivered = true
		}
		if !strings.HasPrefix(name, pre) {
			continue
		}
		if s, ok := strings.CutPrefix(name, pre+"copy@"); ok && off == math.MaxInt64 {
			st.copied, startText, st.copyStream = true, s, name
		}
	}
	if !st.copied {
		return st, nil
	}
	start, err := parsePosition(flavor, startText)
	if err != nil {
		return st, fmt.Errorf("the checkpoint's copy stream %s%s: %w", pre+"copy@", startText, err)
	}
	switch {
	case start.gtid != nil && flavor == gomysql.MariaDBFlavor:
		// Per domain, the highest GTID applied.
		last := map[uint32]*gomysql.MariadbGTID{}
		for _, g := range start.gtid.(*gomysql.MariadbGTIDSet).Sets {
			for _, x := range g {
				if cur := last[x.DomainID]; cur == nil || x.SequenceNumber > cur.SequenceNumber {
					last[x.DomainID] = x.Clone()
				}
			}
		}
		for name, off := range resume {
			ds, ok := strings.CutPrefix(name, pre+"gtid/")
			if !ok || off <= 0 {
				continue
			}
			d, s, ok := strings.Cut(ds, "-")
			dom, err1 := strconv.ParseUint(d, 10, 32)
			srv, err2 := strconv.ParseUint(s, 10, 32)
			if !ok || err1 != nil || err2 != nil {
				continue
			}
			if cur := last[uint32(dom)]; cur == nil || uint64(off-1) > cur.SequenceNumber {
				last[uint32(dom)] = &gomysql.MariadbGTID{DomainID: uint32(dom), ServerID: uint32(srv), SequenceNumber: uint64(off - 1)}
			}
		}
		doms := make([]uint32, 0, len(last))
		for d := range last {
			doms = append(doms, d)
		}
		sort.Slice(doms, func(i, j int) bool { return doms[i] < doms[j] })
		parts := make([]string, len(doms))
		for i, d := range doms {
			parts[i] = last[d].String()
		}
		g, err := gomysql.ParseMariadbGTIDSet(strings.Join(parts, ","))
		if err != nil {
			return st, err
		}
		st.start = position{gtid: g, flavor: flavor}
	case start.gtid != nil:
		set := start.gtid.(*gomysql.MysqlGTIDSet)
		for name, off := range resume {
			id, ok := strings.CutPrefix(name, pre+"gtid/")
			if !ok || off <= 1 {
				continue
			}
			sid, err := uuid.Parse(id)
			if err != nil {
				continue
			}
			set.AddSet(gomysql.NewUUIDSet(sid, gomysql.Interval{Start: 1, Stop: off}))
		}
		st.start = position{gtid: set, flavor: flavor}
	default:
		base, packed, ok := fileOffset(start.file, start.offset)
		if !ok {
			return st, fmt.Errorf("the checkpoint's copy stream names binlog file %q, which has no numbered extension", start.file)
		}
		if off, ok := resume[pre+"binlog/"+base]; ok && off > packed {
			packed = off
		}
		st.start.file, st.start.offset = fileAt(base, packed)
	}
	return st, nil
}

func record(pos cdc.Position, r cdc.Record) cdc.Message {
	r.Pos = pos
	return cdc.Message{Pos: pos, Record: &r}
}
