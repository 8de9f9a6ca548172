package mysql

import (
	"context"
	"fmt"
	"math"
	"regexp"
	"strings"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"

	"github.com/retinadb/retina/internal/cdc"
)

// filePosRE is a binlog file position as SHOW MASTER STATUS gives it.
var filePosRE = regexp.MustCompile(`^([^:\s]+\.[0-9]+):([0-9]+)$`)

// WaitTargets turns a source position a client read after its commit (a
// GTID set such as @@last_gtid or @@gtid_binlog_pos on MariaDB,
// @@gtid_executed on MySQL, or FILE:OFFSET from SHOW MASTER STATUS) into
// the stream offsets whose application makes every transaction up to it
// visible: the initial copy, and the streams the position names beyond
// the copy's snapshot.
// It waits for the initial copy to start, when it has not.
func (s *Source) WaitTargets(ctx context.Context, pos string) ([]cdc.Position, error) {
	select {
	case <-s.copyStarted:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-s.done:
		return nil, fmt.Errorf("mysql source %s: stopped before its initial copy started: %v", s.opts.Display, s.err)
	}
	copyStream, _ := s.copyStream.Load().(string)
	start, err := parsePosition(s.flavor, strings.TrimPrefix(copyStream, prefix(s.opts)+"/copy@"))
	if err != nil {
		return nil, err
	}
	out := []cdc.Position{{Stream: copyStream, Offset: math.MaxInt64}}
	pos = strings.TrimSpace(pos)
	if m := filePosRE.FindStringSubmatch(pos); m != nil {
		if s.gtid {
			return nil, fmt.Errorf("mysql source %s: %q is a file position, and this source keeps GTIDs: wait for a GTID set (@@last_gtid, @@gtid_binlog_pos)", s.opts.Display, pos)
		}
		var off uint64
		fmt.Sscan(m[2], &off)
		base, packed, ok := fileOffset(m[1], uint32(off))
		if !ok || off >= 1<<32 {
			return nil, fmt.Errorf("mysql source %s: binlog position %q: want FILE.NNNNNN:OFFSET", s.opts.Display, pos)
		}
		if _, startPacked, _ := fileOffset(start.file, start.offset); packed > startPacked {
			out = append(out, cdc.Position{Stream: prefix(s.opts) + "/binlog/" + base, Offset: packed})
		}
		return out, nil
	}
	if !s.gtid {
		return nil, fmt.Errorf("mysql source %s: %q: this source keeps file positions (GTIDs are off or positions=file): wait for FILE:OFFSET from SHOW MASTER STATUS", s.opts.Display, pos)
	}
	if pos == "" {
		return out, nil
	}
	set, err := gomysql.ParseGTIDSet(s.flavor, pos)
	if err != nil {
		return nil, fmt.Errorf("mysql source %s: GTID set %q: %w", s.opts.Display, pos, err)
	}
	switch g := set.(type) {
	case *gomysql.MariadbGTIDSet:
		for _, per := range g.Sets {
			for _, x := range per {
				if start.gtid.(*gomysql.MariadbGTIDSet).Contain(&gomysql.MariadbGTIDSet{Sets: map[uint32]map[uint32]*gomysql.MariadbGTID{x.DomainID: {x.ServerID: x}}}) {
					continue
				}
				out = append(out, cdc.Position{Stream: fmt.Sprintf("%s/gtid/%d-%d", prefix(s.opts), x.DomainID, x.ServerID), Offset: int64(x.SequenceNumber) + 1})
			}
		}
	case *gomysql.MysqlGTIDSet:
		for sid, us := range g.Sets {
			if len(us.Intervals) == 0 || start.gtid.Contain(&gomysql.MysqlGTIDSet{Sets: map[string]*gomysql.UUIDSet{sid: us}}) {
				continue
			}
			out = append(out, cdc.Position{Stream: prefix(s.opts) + "/gtid/" + us.SID.String(), Offset: us.Intervals[len(us.Intervals)-1].Stop})
		}
	}
	return out, nil
}
