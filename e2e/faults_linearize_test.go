package e2e

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/linearize"
	"github.com/joishi/limiter/internal/testenv"
)

const (
	contentionUsers   = 4 // solo, duo, trio, solo
	contentionWorkers = 8 // per user
	contentionRun     = 8 * time.Second
)

// TestFaultCapIsLinearizable proves P2 outside fault windows: with no fault,
// many callers racing for a few users' slots through three serve processes
// on the Redis Cluster produce histories that are linearizable against "at
// most limit live slots per user" (internal/linearize, porcupine). Holds
// last at most 1.5s and are heartbeated every 1s on a 3s TTL: the model
// allows a slot to expire, but no slot needs to. It also shows the checker
// is not vacuous: the same history with one denial turned into a grant is
// refused.
func TestFaultCapIsLinearizable(t *testing.T) {
	run := randomID()
	servers := startServers(t, 3, serveConfig(testenv.Cluster(t), "e2e-"+run+":", faultTiers(pauseTTL, pauseInterval)))
	load := newLoadRun(urls(servers), loadUsers("lin-"+run+"-", contentionUsers), pauseTTL, pauseInterval)
	load.workers = contentionWorkers
	load.holdMin, load.holdMax = 50*time.Millisecond, 1500*time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), contentionRun)
	defer cancel()
	load.run(ctx)

	history := load.history(nil)
	stats := load.stats()
	start := time.Now()
	v := linearize.Check(history, linearize.Options{})
	took := time.Since(start)
	t.Logf("contention: %d users x %d workers, %v: %d calls (grants %d, denials %d, without an answer %d); linearizable: %v (%d users widened) in %v",
		contentionUsers, contentionWorkers, contentionRun, stats.total, stats.granted, stats.denied,
		stats.degraded+stats.unavailable+stats.transport+stats.other, v.OK(), v.Widened, took.Round(time.Millisecond))
	if !v.OK() {
		t.Errorf("not linearizable: illegal for %v, undecided for %v", v.Illegal, v.Undecided)
	}
	if stats.granted < 20 || stats.denied < 20 {
		t.Errorf("%d grants and %d denials: too little contention to check anything", stats.granted, stats.denied)
	}

	t.Run("an injected over-admission is caught", func(t *testing.T) {
		injected, user := injectGrant(history)
		if user == "" {
			t.Fatal("no denial to turn into a grant")
		}
		v := linearize.Check(injected, linearize.Options{})
		if !slices.Contains(v.Illegal, user) {
			t.Errorf("with one denial of %s turned into a grant: illegal %v, undecided %v; want %s illegal", user, v.Illegal, v.Undecided, user)
		}
		t.Logf("one extra grant for %s: refused (illegal users %v)", user, v.Illegal)
	})
}

// injectGrant returns history with one over-admission: the first denial
// in its second half, of a user denied again later, answered as a grant.
func injectGrant(history []linearize.Op) ([]linearize.Op, string) {
	out := slices.Clone(history)
	mid := out[len(out)/2].Call
	for i, op := range out {
		if op.Kind != linearize.Acquire || op.Result != linearize.No || op.Call < mid {
			continue
		}
		for _, later := range out[i+1:] {
			if later.User == op.User && later.Kind == linearize.Acquire && later.Result == linearize.Yes && later.Call > op.Return {
				out[i].Result = linearize.Yes
				return out, op.User
			}
		}
	}
	return out, ""
}
