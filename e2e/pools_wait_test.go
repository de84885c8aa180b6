package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/linearize"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
)

// The waits for a full pool key (DESIGN §17) through three `limiter
// serve` processes on the Redis Cluster: priority first, then the user
// holding the fewest members, then the user waiting for the fewest, then
// arrival; the waiters of a killed
// process skipped within the ticket TTL, a client that hangs up gone at
// once.

// TestPoolWaitServesTheHigherPriorityFirst: model=one (cap 1) is held; a
// priority-0 acquire waits for it through one serve process, a
// priority-5 one 300ms later through another. The holder's release,
// through a third, goes to the priority-5 waiter within wakeBound; the
// priority-0 one still waits, and is granted at the next release.
func TestPoolWaitServesTheHigherPriorityFirst(t *testing.T) {
	e := startPoolWaitEnv(t)
	id := randomID()
	holder, low, high := "holder-"+id, "low-"+id, "high-"+id
	e.hold(t, 2, holder, "low", "held", "one")
	lowAnswer := e.waitFor(context.Background(), 0, low, "low", "w-low", "one")
	e.keys.awaitQueue(t, "one", 5*time.Second, member(low, "w-low"))
	time.Sleep(300 * time.Millisecond)
	highAnswer := e.waitFor(context.Background(), 1, high, "high", "w-high", "one")
	e.keys.awaitQueue(t, "one", 5*time.Second, member(low, "w-low"), member(high, "w-high"))

	released := time.Now()
	e.release(t, 2, holder, "held")
	first := grantedWithin(t, "the priority-5 waiter", "w-high", highAnswer, 5*time.Second).Sub(released)
	if first > wakeBound {
		t.Errorf("the priority-5 waiter granted %v after the release, want within %v", first.Round(time.Microsecond), wakeBound)
	}
	time.Sleep(300 * time.Millisecond)
	noAnswer(t, "the priority-0 waiter", lowAnswer)
	e.keys.await(t, "one", time.Second, "the priority-0 waiter queued, the priority-5 one holding", func(q, held []string) bool {
		return slices.Equal(q, []string{member(low, "w-low")}) && slices.Equal(held, []string{member(high, "w-high")})
	})

	released = time.Now()
	e.release(t, 1, high, "w-high")
	second := grantedWithin(t, "the priority-0 waiter", "w-low", lowAnswer, 5*time.Second).Sub(released)
	if second > wakeBound {
		t.Errorf("the priority-0 waiter granted %v after the next release, want within %v", second.Round(time.Microsecond), wakeBound)
	}
	t.Logf("model=one: priority 5 granted %v after the release, ahead of priority 0 (granted %v after the next)",
		first.Round(time.Microsecond), second.Round(time.Microsecond))
}

// TestPoolWaitServesTheUserHoldingFewerFirst: user X holds both members
// of model=two and waits for a third; user Y then waits for one. X's
// release of one goes to Y (X still holds one, Y none), though X's waiter
// came first; X's waiter is granted at Y's release.
func TestPoolWaitServesTheUserHoldingFewerFirst(t *testing.T) {
	e := startPoolWaitEnv(t)
	id := randomID()
	x, y := "x-"+id, "y-"+id
	e.hold(t, 0, x, "low", "x1", "two")
	e.hold(t, 1, x, "low", "x2", "two")
	xAnswer := e.waitFor(context.Background(), 2, x, "low", "x3", "two")
	e.keys.awaitQueue(t, "two", 5*time.Second, member(x, "x3"))
	yAnswer := e.waitFor(context.Background(), 0, y, "low", "y1", "two")
	e.keys.awaitQueue(t, "two", 5*time.Second, member(x, "x3"), member(y, "y1"))

	released := time.Now()
	e.release(t, 1, x, "x1")
	first := grantedWithin(t, "Y's waiter", "y1", yAnswer, 5*time.Second).Sub(released)
	if first > wakeBound {
		t.Errorf("Y's waiter granted %v after X's release, want within %v", first.Round(time.Microsecond), wakeBound)
	}
	time.Sleep(300 * time.Millisecond)
	noAnswer(t, "X's waiter", xAnswer)
	e.keys.await(t, "two", time.Second, "X's waiter queued, X and Y holding one each", func(q, held []string) bool {
		slices.Sort(held)
		return slices.Equal(q, []string{member(x, "x3")}) && slices.Equal(held, []string{member(x, "x2"), member(y, "y1")})
	})

	e.release(t, 2, y, "y1")
	grantedWithin(t, "X's waiter", "x3", xAnswer, 5*time.Second)
	t.Logf("model=two: Y, holding none, granted %v after X's release, ahead of X's earlier waiter", first.Round(time.Microsecond))
}

// TestPoolWaitersOfAKilledServerAreSkipped: the two head waiters of
// model=one (priority 5) wait through a serve process that is then
// SIGKILLed, two others (priority 0) through the other processes. The
// member freed after the kill goes to the first of those within the
// ticket TTL of the kill (the dead tickets lapse; no one is granted to
// the dead); the next release goes to the second at once.
func TestPoolWaitersOfAKilledServerAreSkipped(t *testing.T) {
	e := startPoolWaitEnv(t)
	id := randomID()
	holder, d1, d2, s1, s2 := "holder-"+id, "doomed1-"+id, "doomed2-"+id, "survivor1-"+id, "survivor2-"+id
	e.hold(t, 2, holder, "low", "held", "one")
	var queue []string
	for _, user := range []string{d1, d2} {
		e.waitFor(context.Background(), 0, user, "high", "w", "one") // its answer: the kill
		queue = append(queue, member(user, "w"))
		e.keys.awaitQueue(t, "one", 5*time.Second, queue...)
	}
	first := e.waitFor(context.Background(), 1, s1, "low", "w", "one")
	queue = append(queue, member(s1, "w"))
	e.keys.awaitQueue(t, "one", 5*time.Second, queue...)
	second := e.waitFor(context.Background(), 2, s2, "low", "w", "one")
	queue = append(queue, member(s2, "w"))
	e.keys.awaitQueue(t, "one", 5*time.Second, queue...)

	e.servers[0].Kill()
	killed := time.Now()
	e.release(t, 2, holder, "held")
	// The dead tickets were refreshed at most a third of their TTL before
	// the kill, so they lapse within the TTL after it; the survivor's
	// server calls the wait script when the first of them does.
	took := grantedWithin(t, "the first survivor", "w", first, 2*limiter.DefaultTicketTTL).Sub(killed)
	if took > limiter.DefaultTicketTTL+wakeBound {
		t.Errorf("the first survivor granted %v after the kill, want within the ticket TTL %v (+%v)", took.Round(time.Millisecond), limiter.DefaultTicketTTL, wakeBound)
	}
	noAnswer(t, "the second survivor", second)
	e.keys.await(t, "one", time.Second, "the dead tickets gone, the first survivor holding", func(q, held []string) bool {
		return slices.Equal(q, []string{member(s2, "w")}) && slices.Equal(held, []string{member(s1, "w")})
	})

	released := time.Now()
	e.release(t, 1, s1, "w")
	next := grantedWithin(t, "the second survivor", "w", second, 5*time.Second).Sub(released)
	if next > wakeBound {
		t.Errorf("the second survivor granted %v after the release, want within %v", next.Round(time.Microsecond), wakeBound)
	}
	t.Logf("model=one: the head waiters' server killed; the first survivor granted %v after the kill (ticket TTL %v), the second %v after the next release",
		took.Round(time.Millisecond), limiter.DefaultTicketTTL, next.Round(time.Microsecond))
}

// TestPoolWaiterThatDisconnectsLeavesAtOnce: the head waiter of model=one
// (priority 5) hangs up, and the holder releases at once: the member goes
// to the waiter behind it within wakeBound of the release, not when the
// gone one's ticket would lapse (its server withdraws it as its client
// leaves), and the gone waiter holds nothing.
func TestPoolWaiterThatDisconnectsLeavesAtOnce(t *testing.T) {
	e := startPoolWaitEnv(t)
	id := randomID()
	holder, gone, next := "holder-"+id, "gone-"+id, "next-"+id
	e.hold(t, 0, holder, "low", "held", "one")
	ctx, hangUp := context.WithCancel(context.Background())
	defer hangUp()
	goneAnswer := e.waitFor(ctx, 1, gone, "high", "w", "one")
	e.keys.awaitQueue(t, "one", 5*time.Second, member(gone, "w"))
	nextAnswer := e.waitFor(context.Background(), 2, next, "low", "w", "one")
	e.keys.awaitQueue(t, "one", 5*time.Second, member(gone, "w"), member(next, "w"))

	hungUp := time.Now()
	hangUp()
	if a := <-goneAnswer; a.err == nil {
		t.Fatalf("the waiter that hung up was answered: %d %s", a.status, a.body)
	}
	released := time.Now()
	e.release(t, 0, holder, "held")
	// A ticket left to lapse would hold the member back for up to its TTL
	// after its last refresh (every third of it): 2s at least.
	at := grantedWithin(t, "the waiter behind", "w", nextAnswer, limiter.DefaultTicketTTL)
	if took := at.Sub(released); took > wakeBound {
		t.Errorf("the waiter behind granted %v after the release, want within %v", took.Round(time.Microsecond), wakeBound)
	}
	took := at.Sub(hungUp)
	e.keys.await(t, "one", time.Second, "no queue, the waiter behind holding", func(q, held []string) bool {
		return len(q) == 0 && slices.Equal(held, []string{member(next, "w")})
	})
	t.Logf("model=one: the head waiter hung up and the holder released at once; the waiter behind granted %v after the hang-up", took.Round(time.Millisecond))
}

// TestPoolWaitOrderIsLinearizable: 200 waiting acquires of 20 users on
// three plans (priorities 0, 3, 5) join model=three (cap 3) one after
// another, through the three serve processes; each, once granted, holds
// its member 5-25ms and releases it through any of them. A reader
// records the key (its live tickets in order and its members) back to
// back. The history is checked against the pool queue model
// (internal/linearize, porcupine): no waiter is served while a live one
// ranks ahead of it, by priority, then the fewest members held by its
// user, then the fewest tickets of its user, then arrival. The check is shown not to be vacuous: grants passed
// earlier arrivals for priority and for fair share, and the same history
// with one long waiter's priority raised to 9 is refused.
func TestPoolWaitOrderIsLinearizable(t *testing.T) {
	const (
		waiters = 200
		users   = 20
		poolCap = 3
		seeds   = 30 // joins before the first member frees up
		// wait is each acquire's wait_ms: the last served waits about as
		// long as the run (1-3s), and a run whose waits run out ends here.
		wait = 10 * time.Second
	)
	e := startPoolWaitEnv(t)
	id := randomID()
	plans := []struct {
		name     string
		priority int
	}{{"low", 0}, {"mid", 3}, {"high", 5}}
	rec := newPoolRecorder("three", poolCap)
	servers := urls(e.servers)
	ctx, stopObserving := context.WithCancel(context.Background())
	observed := rec.observe(ctx, e.keys, "three")
	defer func() { stopObserving(); <-observed }()

	// releaseOf releases user's stream through a random server.
	releaseOf := func(user, stream string) {
		call := time.Now()
		r := post(context.Background(), servers[rand.N(len(servers))]+httpapi.PathRelease, httpapi.ReleaseRequest{UserID: user, StreamID: stream})
		var out httpapi.ReleaseResponse
		if r.err != nil || r.status != http.StatusOK || json.Unmarshal(r.body, &out) != nil || !out.Released {
			rec.odd("release %s: %d %s %v", stream, r.status, r.body, r.err)
			return
		}
		rec.add(rec.op(linearize.Free, member(user, stream), call, r.at))
	}
	seedUser := "seed-" + id
	for i := range poolCap {
		call := time.Now()
		e.hold(t, i, seedUser, "low", fmt.Sprint("seed-", i), "three")
		take := rec.op(linearize.Take, member(seedUser, fmt.Sprint("seed-", i)), call, time.Now())
		take.User = seedUser
		rec.add(take)
	}

	var answered sync.WaitGroup
	var timedOut atomic.Int64
	start := time.Now()
	for i := range waiters {
		u := rand.N(users)
		user, plan, stream := fmt.Sprintf("u%02d-%s", u, id), plans[u%len(plans)], fmt.Sprintf("w%03d", i)
		m := member(user, stream)
		done := make(chan struct{})
		answered.Go(func() {
			defer close(done)
			call := time.Now()
			a := post(context.Background(), servers[i%len(servers)]+httpapi.PathAcquire, poolAcquire(user, plan.name, stream, "three", wait.Milliseconds()))
			join := rec.op(linearize.Join, m, call, a.at)
			join.User, join.Priority = user, plan.priority
			var got httpapi.AcquireResponse
			var refused httpapi.ErrorResponse
			switch {
			case a.err == nil && a.status == http.StatusOK && json.Unmarshal(a.body, &got) == nil && !got.Degraded:
				if got.WaitedMs == 0 { // granted at once, by the acquire script
					take := rec.op(linearize.Take, m, call, a.at)
					take.User = user
					rec.add(take)
				} else {
					rec.add(join, rec.op(linearize.Grant, m, call, a.at))
				}
			case a.err == nil && a.status == http.StatusTooManyRequests && json.Unmarshal(a.body, &refused) == nil &&
				refused.Error.Code == httpapi.CodePoolLimitReached && refused.Error.WaitedMs != nil:
				rec.add(join, rec.op(linearize.Leave, m, call, a.at)) // its wait ran out
				timedOut.Add(1)
				return
			default:
				rec.odd("acquire %s: %d %s %v", stream, a.status, a.body, a.err)
				return
			}
			time.Sleep(time.Duration(5+rand.N(21)) * time.Millisecond)
			releaseOf(user, stream)
		})
		// One at a time: each joins once the one before is in the queue,
		// so arrival order is the order they were sent in.
		if !rec.awaitSeen(m, done, 5*time.Second) {
			t.Fatalf("waiter %s not queued within 5s", m)
		}
		if i == seeds {
			for j := range poolCap {
				answered.Go(func() { releaseOf(seedUser, fmt.Sprint("seed-", j)) })
			}
		}
	}
	waited := make(chan struct{})
	go func() { answered.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(45 * time.Second):
		t.Fatal("the waiters not all served and released within 45s")
	}
	ran := time.Since(start)
	stopObserving()
	<-observed
	if len(rec.unexpected) > 0 {
		t.Fatalf("answers a healthy cluster does not give:\n%v", rec.unexpected)
	}

	history := rec.history()
	checked := time.Now()
	v := linearize.CheckPools(history, linearize.Options{Timeout: 20 * time.Second})
	took := time.Since(checked)
	var byPriority, byShare, other, observes int
	for _, g := range v.Grants {
		p, s, o := g.Passed()
		byPriority, byShare, other = byPriority+min(p, 1), byShare+min(s, 1), other+min(o, 1)
	}
	for _, op := range history {
		if op.Kind == linearize.Observe {
			observes++
		}
	}
	t.Logf("%d waiters of %d users on 3 priorities, cap %d, in %v: %d operations (%d reads of the key); %d grants from the queue, of which %d passed an earlier arrival for priority, %d for fair share, %d while members were free for both; %d waits ran out; checked in %v: ok %v",
		waiters, users, poolCap, ran.Round(time.Millisecond), len(history), observes, len(v.Grants), byPriority, byShare, other, timedOut.Load(), took.Round(time.Millisecond), v.OK())
	shown := map[string]bool{}
	for _, g := range v.Grants {
		p, s, _ := g.Passed()
		for reason, n := range map[string]int{"priority": p, "fair share": s} {
			if n > 0 && !shown[reason] {
				shown[reason] = true
				t.Logf("for %s: %q (priority %d, its user holding %d) granted ahead of %d earlier arrivals, of %d waiting; members held per user then: %v",
					reason, g.Member, g.Priority, g.Held[g.User], n, len(g.Waiting), g.Held)
			}
		}
	}
	if !v.OK() {
		t.Fatalf("the grant order breaks the queue's order: illegal %v, undecided %v\n%v", v.Illegal, v.Undecided, v.Why)
	}
	if n := timedOut.Load(); n > 0 {
		t.Errorf("%d of %d waiters ran out of their %v wait, with members freed every few ms: the key serves too slowly", n, waiters, wait)
	} else if len(v.Grants) < waiters/2 || byPriority == 0 || byShare == 0 {
		t.Errorf("%d grants from the queue, %d passing for priority, %d for fair share: too little contention to check the order", len(v.Grants), byPriority, byShare)
	}

	t.Run("a waiter's priority raised is caught", func(t *testing.T) {
		raised, who := raisePriority(history, v.Grants)
		if who == "" {
			t.Fatal("no priority-0 waiter passed over by more than the cap: nothing to raise")
		}
		v := linearize.CheckPools(raised, linearize.Options{Timeout: 20 * time.Second})
		if !slices.Contains(v.Illegal, rec.key) {
			t.Errorf("with %s at priority 9: illegal %v, undecided %v; want %s illegal", who, v.Illegal, v.Undecided, rec.key)
		}
		t.Logf("with %s at priority 9: %v", who, v.Why[rec.key])
	})
}

// raisePriority returns history with the priority of one waiter raised to
// 9, above every plan's: the priority-0 waiter that saw the most others
// served while it waited (more than the cap, so that it must have been
// served before some of them), and its member; "" when there is none.
func raisePriority(history []linearize.PoolOp, grants []linearize.PoolGrant) ([]linearize.PoolOp, string) {
	passed := map[string]int{}
	for _, g := range grants {
		for _, w := range g.Waiting {
			if w.Member != g.Member && w.Priority == 0 {
				passed[w.Member]++
			}
		}
	}
	who, most := "", 0
	for m, n := range passed {
		if n > most || (n == most && m < who) {
			who, most = m, n
		}
	}
	if who == "" || most <= 3 {
		return history, ""
	}
	out := slices.Clone(history)
	for i, op := range out {
		if op.Kind == linearize.Join && op.Member == who {
			out[i].Priority = 9
		}
	}
	return out, who
}
