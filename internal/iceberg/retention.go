package iceberg

import "time"

// Retention. A table publishes a snapshot every interval, and its metadata
// file lists the snapshots it retains, so what each publication writes
// would grow with the retention if every snapshot were kept. The policy
// keeps every snapshot of the last keepAllFor, then one a minute (the
// first of each minute) up to the retention, and none older: the metadata
// lists at most keepAllFor/interval + retention/minute snapshots, whatever
// the cadence. The current snapshot is always kept. Files a removed
// snapshot alone named are deleted once the publication that removed it is
// current.

// keepAllFor is how long every snapshot stays listed.
const keepAllFor = 10 * time.Second

// thinTo is the spacing of the snapshots kept beyond keepAllFor.
const thinTo = time.Minute

// snapTime is a retained snapshot: its id and when it was published.
type snapTime struct {
	ID int64
	At time.Time
}

// expired lists the snapshots (oldest first in snaps) the policy removes
// at now: the current one (the last) stays.
func expired(snaps []snapTime, now time.Time, retention time.Duration) []int64 {
	var out []int64
	lastMinute := time.Time{}
	for i, s := range snaps {
		age := now.Sub(s.At)
		switch {
		case i == len(snaps)-1:
		case age > retention:
			out = append(out, s.ID)
		case age <= keepAllFor:
		case !lastMinute.IsZero() && s.At.Truncate(thinTo).Equal(lastMinute):
			out = append(out, s.ID) // another of a minute already kept
		default:
			lastMinute = s.At.Truncate(thinTo)
		}
	}
	return out
}
