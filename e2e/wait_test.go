package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/servetest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
)

// wakeBound is how soon after a release the head of the queue must be
// granted: the release's wake-up goes through the user's shard to the
// head's server, which calls the wait script at once, in a few
// milliseconds (p50 3ms on 2 cores); the fallback poll, every 250ms, is
// far slower. The bound leaves room for a scheduling stall of the
// machine running every test at once (one grant took 56ms in a run), and
// still fails a queue served by polls: ten of them all within it would
// be a chance of 0.6%.
const wakeBound = 150 * time.Millisecond

// waitEnv is three `limiter serve` processes on the shared Redis Cluster,
// on a key prefix of their own, and a reader of their queues.
type waitEnv struct {
	servers []*servetest.Process
	queues  *queueReader
}

func startWaitEnv(t *testing.T) *waitEnv {
	t.Helper()
	prefix := "e2e-wait-" + randomID() + ":"
	addrs := testenv.Cluster(t)
	return &waitEnv{
		servers: startServers(t, 3, serveConfig(addrs, prefix, waitTiers)),
		queues:  newQueueReader(t, addrs, prefix),
	}
}

func (e *waitEnv) hold(t *testing.T, server int, user, plan, stream string) {
	t.Helper()
	var out httpapi.AcquireResponse
	status, _, body := call(t, httpClient, http.MethodPost, e.servers[server].API+httpapi.PathAcquire,
		httpapi.AcquireRequest{UserID: user, Plan: plan, StreamID: stream}, nil)
	if status != http.StatusOK {
		t.Fatalf("acquire %s: %d %s, want 200", stream, status, body)
	}
	_ = json.Unmarshal(body, &out)
	if out.Degraded {
		t.Fatalf("acquire %s: degraded, want counted", stream)
	}
}

func (e *waitEnv) release(t *testing.T, server int, user, stream string) {
	t.Helper()
	var out httpapi.ReleaseResponse
	status, _, body := call(t, httpClient, http.MethodPost, e.servers[server].API+httpapi.PathRelease,
		httpapi.ReleaseRequest{UserID: user, StreamID: stream}, &out)
	if status != http.StatusOK || !out.Released {
		t.Fatalf("release %s: %d %s, want released", stream, status, body)
	}
}

// TestWaitersAreServedFirstComeFirstServedAcrossReplicas: ten waiting
// acquires of one limit-1 user, sent in turn to three serve processes on
// the Redis Cluster, get the slot in the order they came, each as the one
// before it releases, and each within wakeBound of that release
// (measured from the release's request to the grant's answer).
func TestWaitersAreServedFirstComeFirstServedAcrossReplicas(t *testing.T) {
	e := startWaitEnv(t)
	user := "fifo-" + randomID()
	e.hold(t, 0, user, "solo", "holder")
	var answers []<-chan answer
	for i := range 10 {
		stream := fmt.Sprintf("w%d", i)
		answers = append(answers, waitingAcquire(context.Background(), e.servers[i%3].API, user, "solo", stream, 30_000))
		e.queues.await(t, user, 5*time.Second, stream+" at place "+fmt.Sprint(i+1), func(q []string) bool { return len(q) == i+1 && q[i] == stream })
	}

	holder, on := "holder", 0
	var latencies []time.Duration
	for i, ch := range answers {
		released := time.Now()
		e.release(t, on, user, holder)
		var a answer
		select {
		case a = <-ch:
		case <-time.After(5 * time.Second):
			t.Fatalf("w%d: not granted within 5s of %s's release", i, holder)
		}
		got := a.granted(t)
		if want := fmt.Sprintf("w%d", i); got.StreamID != want || got.Used != 1 || got.WaitedMs <= 0 {
			t.Fatalf("grant after %s's release: %+v, want %s, counted, after a wait", holder, got, want)
		}
		latency := a.at.Sub(released)
		latencies = append(latencies, latency)
		if latency > wakeBound {
			t.Errorf("w%d granted %v after %s's release, want within %v", i, latency.Round(time.Microsecond), holder, wakeBound)
		}
		for j, later := range answers[i+1:] {
			select {
			case a := <-later:
				t.Fatalf("w%d answered before its turn: %d %s", i+1+j, a.status, a.body)
			default:
			}
		}
		holder, on = got.StreamID, i%3
	}
	t.Logf("wake-up to grant after a release, 10 waiters on 3 replicas: p50 %v, max %v",
		percentile(latencies, 50).Round(time.Microsecond), percentile(latencies, 100).Round(time.Microsecond))
}

// TestTheWaitersOfAKilledReplicaAreSkipped: two acquires wait through a
// replica that is then SIGKILLed, a third waits behind them through
// another. The slot freed after the kill goes to the third once the dead
// replica's tickets expire: within their TTL of the kill.
func TestTheWaitersOfAKilledReplicaAreSkipped(t *testing.T) {
	e := startWaitEnv(t)
	user := "killed-" + randomID()
	e.hold(t, 0, user, "solo", "holder")
	for i, stream := range []string{"doomed-1", "doomed-2"} {
		waitingAcquire(context.Background(), e.servers[1].API, user, "solo", stream, 30_000)
		e.queues.await(t, user, 5*time.Second, stream+" queued", func(q []string) bool { return len(q) == i+1 })
	}
	survivor := waitingAcquire(context.Background(), e.servers[2].API, user, "solo", "survivor", 30_000)
	e.queues.await(t, user, 5*time.Second, "survivor third", func(q []string) bool { return len(q) == 3 && q[2] == "survivor" })

	e.servers[1].Kill()
	killed := time.Now()
	e.release(t, 0, user, "holder")
	var a answer
	select {
	case a = <-survivor:
	case <-time.After(2 * limiter.DefaultTicketTTL):
		t.Fatalf("survivor not granted within %v of the kill", 2*limiter.DefaultTicketTTL)
	}
	if got := a.granted(t); got.StreamID != "survivor" {
		t.Fatalf("granted %+v, want survivor", got)
	}
	// The dead tickets were refreshed at most a third of their TTL
	// before the kill, so they lapse within their TTL after it; the
	// survivor's server calls the script the moment they do (plus the
	// call's own round trip).
	took := a.at.Sub(killed)
	if took > limiter.DefaultTicketTTL+wakeBound {
		t.Errorf("survivor granted %v after the kill, want within the ticket TTL %v (+%v)", took.Round(time.Millisecond), limiter.DefaultTicketTTL, wakeBound)
	}
	t.Logf("waiters of the killed replica skipped: survivor granted %v after the kill (ticket TTL %v)", took.Round(time.Millisecond), limiter.DefaultTicketTTL)
}

// TestARetryOfAKilledReplicasWaiterIsGrantedAtOnce: an acquire waits
// through a replica that is then SIGKILLed; its client retries the same
// stream through another replica, without waiting, as the slot frees.
// The free slot is owed to the stream's own ticket, which has not lapsed
// yet: the retry takes it at once, not a ticket TTL later.
func TestARetryOfAKilledReplicasWaiterIsGrantedAtOnce(t *testing.T) {
	e := startWaitEnv(t)
	user := "retried-" + randomID()
	e.hold(t, 0, user, "solo", "holder")
	waitingAcquire(context.Background(), e.servers[1].API, user, "solo", "s", 30_000)
	e.queues.await(t, user, 5*time.Second, "s queued", func(q []string) bool { return len(q) == 1 && q[0] == "s" })

	e.servers[1].Kill()
	e.release(t, 0, user, "holder")
	e.hold(t, 2, user, "solo", "s")
	status, _, body := call(t, httpClient, http.MethodPost, e.servers[0].API+httpapi.PathAcquire,
		httpapi.AcquireRequest{UserID: user, Plan: "solo", StreamID: "other"}, nil)
	if status != http.StatusTooManyRequests {
		t.Fatalf("another stream beside the retried one: %d %s, want 429 (the one slot is s's)", status, body)
	}
}

// TestAClientThatDisconnectsLeavesTheQueueAtOnce: a waiting acquire whose
// client goes away leaves the queue at once, not when its ticket would
// expire, and the next one moves up.
func TestAClientThatDisconnectsLeavesTheQueueAtOnce(t *testing.T) {
	e := startWaitEnv(t)
	user := "gone-" + randomID()
	e.hold(t, 0, user, "solo", "holder")
	ctx, hangUp := context.WithCancel(context.Background())
	gone := waitingAcquire(ctx, e.servers[1].API, user, "solo", "goes-away", 30_000)
	e.queues.await(t, user, 5*time.Second, "goes-away queued", func(q []string) bool { return len(q) == 1 })
	next := waitingAcquire(context.Background(), e.servers[2].API, user, "solo", "next", 30_000)
	e.queues.await(t, user, 5*time.Second, "next queued", func(q []string) bool { return len(q) == 2 })

	hungUp := time.Now()
	hangUp()
	<-gone
	e.queues.await(t, user, limiter.DefaultTicketTTL/2, "goes-away gone, next first", func(q []string) bool { return len(q) == 1 && q[0] == "next" })
	t.Logf("a client that hung up left the queue %v later", time.Since(hungUp).Round(time.Millisecond))
	e.release(t, 0, user, "holder")
	select {
	case a := <-next:
		if got := a.granted(t); got.StreamID != "next" {
			t.Fatalf("granted %+v, want next", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("next not granted within 5s of the release")
	}
}

// TestWaitMsIsCappedByMaxWait: a wait_ms above the plan's maxWait waits
// maxWait, then answers the usual 429 with Retry-After and waited_ms; on a
// plan without maxWait a wait_ms changes nothing.
func TestWaitMsIsCappedByMaxWait(t *testing.T) {
	e := startWaitEnv(t)
	user := "capped-" + randomID()
	e.hold(t, 0, user, "capped", "holder")
	start := time.Now()
	a := post(context.Background(), e.servers[1].API+httpapi.PathAcquire, httpapi.AcquireRequest{UserID: user, Plan: "capped", WaitMs: 60_000})
	took := time.Since(start)
	var e429 httpapi.ErrorResponse
	_ = json.Unmarshal(a.body, &e429)
	if a.status != http.StatusTooManyRequests || e429.Error.Code != httpapi.CodeStreamLimitReached || e429.Error.WaitedMs == nil {
		t.Fatalf("acquire with wait_ms 60000 on capped: %d %s, want 429 stream_limit_reached with waited_ms", a.status, a.body)
	}
	if *e429.Error.WaitedMs < 1000 || took > 5*time.Second {
		t.Errorf("waited %dms, answered after %v: want the plan's 1s, not the 60s asked", *e429.Error.WaitedMs, took)
	}

	other := "nowait-" + randomID()
	e.hold(t, 0, other, "nowait", "holder")
	start = time.Now()
	a = post(context.Background(), e.servers[2].API+httpapi.PathAcquire, httpapi.AcquireRequest{UserID: other, Plan: "nowait", WaitMs: 30_000})
	e429 = httpapi.ErrorResponse{}
	_ = json.Unmarshal(a.body, &e429)
	if a.status != http.StatusTooManyRequests || e429.Error.WaitedMs != nil || time.Since(start) > time.Second {
		t.Errorf("acquire with wait_ms on a plan without maxWait: %d %s after %v, want the 429 at once, as without it", a.status, a.body, time.Since(start))
	}
	if q, err := e.queues.queue(context.Background(), other); err != nil || len(q) != 0 {
		t.Errorf("queue of a plan without maxWait: %v, %v; want none", q, err)
	}
}
