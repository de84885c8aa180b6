package tiers_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/joishi/limiter/pkg/tiers"
)

// TestLookupHeldNeverMissesAPlanPutBack: once plan "p" was in the table,
// LookupHeld finds it, in force or retired, whatever Replace does
// meanwhile: here, remove it and put it back, again and again. A reader
// that saw the entries in force before a Replace and the retired ones
// after it would find a plan put back in neither, and a stream held
// under it would be cut as of an unknown plan.
func TestLookupHeldNeverMissesAPlanPutBack(t *testing.T) {
	table := tiers.NewTable()
	p := tiers.Tier{Plan: "p", MaxConcurrentStreams: 1}.WithDefaults()
	q := tiers.Tier{Plan: "q", MaxConcurrentStreams: 1}.WithDefaults()
	if err := table.Replace([]tiers.Tier{p, q}); err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; !stop.Load(); i++ {
			if i%2 == 0 {
				_ = table.Replace([]tiers.Tier{q})
			} else {
				_ = table.Replace([]tiers.Tier{p, q})
			}
		}
	}()
	misses, reads := 0, 0
	for end := time.Now().Add(500 * time.Millisecond); time.Now().Before(end); reads++ {
		if _, ok := table.LookupHeld("p"); !ok {
			misses++
		}
	}
	stop.Store(true)
	<-done
	if misses > 0 {
		t.Errorf("LookupHeld(%q) missed %d times in %d reads while the plan was removed and put back", "p", misses, reads)
	}
}
