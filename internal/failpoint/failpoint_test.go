package failpoint

import "testing"

func TestParseAndHit(t *testing.T) {
	if s, err := Parse(""); s != nil || err != nil {
		t.Fatalf("empty spec: %v %v", s, err)
	}
	var nilSet *Set
	nilSet.Hit(FlushAfterUpload) // no failpoints: nothing happens
	s, err := Parse("flush-after-upload=kill, checkpoint-before-manifest=kill@0")
	if err != nil {
		t.Fatal(err)
	}
	kills := 0
	s.kill = func() { kills++ }
	s.Hit(CheckpointBeforeRename) // probability 0
	s.Hit(CombineAfterCatalog)    // not armed
	s.Hit(FlushAfterUpload)
	if kills != 1 {
		t.Fatalf("%d kills, want 1", kills)
	}
	for _, bad := range []string{"nope=kill", "flush-after-upload=crash", "flush-after-upload=kill@2", "flush-after-upload"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
