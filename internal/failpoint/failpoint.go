// Package failpoint stops a process at chosen points of its work, for
// crash tests: `retina bench crash` sets RETINA_FAILPOINTS on the servers it
// starts so that some of its kills land inside a flush, a combination or a
// checkpoint instead of only between them. Production code calls Hit at
// those points; with no failpoints configured Hit does nothing.
//
// A spec is a comma list of NAME=ACTION, where ACTION is "kill" (SIGKILL
// the process at once, as a power cut would stop it) optionally followed by
// "@P", the probability each time the point is reached (default 1).
package failpoint

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// EnvVar names the variable a server reads its failpoints from.
const EnvVar = "RETINA_FAILPOINTS"

// The points production code reaches.
const (
	FlushBeforeUpload       = "flush-before-upload"
	FlushAfterUpload        = "flush-after-upload"
	CombineBeforeCatalog    = "combine-before-catalog"
	CombineAfterCatalog     = "combine-after-catalog"
	CheckpointBeforeVis     = "checkpoint-before-visibility"
	CheckpointBeforeRename  = "checkpoint-before-manifest"
	CheckpointAfterManifest = "checkpoint-after-manifest"
	RestoreMidway           = "restore-midway"
	GCRewritten             = "gc-rewritten"   // storage GC wrote the new file, nothing switched
	GCSwapped               = "gc-swapped"     // the catalog swapped, the index not yet remapped
	GCBeforeDrop            = "gc-before-drop" // the old file is about to be deleted
)

// The points of an Iceberg publication, in the order it reaches them; only
// a server that publishes reaches them.
const (
	IcebergAfterData      = "iceberg-after-data"      // data and delete files written
	IcebergAfterManifests = "iceberg-after-manifests" // manifests and manifest lists written
	IcebergAfterMetadata  = "iceberg-after-metadata"  // every table's metadata file written, not yet current
	IcebergAfterCommit    = "iceberg-after-commit"    // the publication record replaced: the snapshot is current
	IcebergBeforeExpire   = "iceberg-before-expire"   // files no retained snapshot needs are about to be deleted
)

// Iceberg lists the Iceberg publication's points.
func Iceberg() []string {
	return []string{IcebergAfterData, IcebergAfterManifests, IcebergAfterMetadata, IcebergAfterCommit, IcebergBeforeExpire}
}

// All lists every point, for tools that pick some at random.
func All() []string {
	return []string{FlushBeforeUpload, FlushAfterUpload, CombineBeforeCatalog, CombineAfterCatalog,
		CheckpointBeforeVis, CheckpointBeforeRename, CheckpointAfterManifest, RestoreMidway,
		GCRewritten, GCSwapped, GCBeforeDrop}
}

// Set is a set of armed failpoints. The nil Set has none.
type Set struct {
	mu     sync.Mutex
	points map[string]float64 // name → probability of a kill
	rng    *rand.Rand
	kill   func()
}

// Parse reads a spec; "" is no failpoints (nil).
func Parse(spec string) (*Set, error) {
	if strings.TrimSpace(spec) == "" {
		return nil, nil
	}
	s := &Set{points: map[string]float64{}, rng: rand.New(rand.NewPCG(uint64(os.Getpid()), 7)),
		kill: func() { syscall.Kill(os.Getpid(), syscall.SIGKILL) }}
	for _, item := range strings.Split(spec, ",") {
		name, action, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok || !known(name) {
			return nil, fmt.Errorf("failpoint %q: want NAME=kill[@P] with NAME one of %s", item, strings.Join(append(All(), Iceberg()...), ", "))
		}
		act, prob, hasProb := strings.Cut(action, "@")
		if act != "kill" {
			return nil, fmt.Errorf("failpoint %q: the only action is kill", item)
		}
		p := 1.0
		if hasProb {
			var err error
			if p, err = strconv.ParseFloat(prob, 64); err != nil || p < 0 || p > 1 {
				return nil, fmt.Errorf("failpoint %q: probability %q is not in [0, 1]", item, prob)
			}
		}
		s.points[name] = p
	}
	return s, nil
}

func known(name string) bool { return slices.Contains(All(), name) || slices.Contains(Iceberg(), name) }

// Hit is called when the point is reached: an armed point kills the
// process (with its probability).
func (s *Set) Hit(name string) {
	if s == nil {
		return
	}
	s.mu.Lock()
	p, ok := s.points[name]
	fire := ok && s.rng.Float64() < p
	s.mu.Unlock()
	if fire {
		s.kill()
	}
}
