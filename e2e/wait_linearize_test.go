package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/linearize"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/httpapi"
)

// fifoTiers: one slot (solo) or two (pair) per user, waited for up to
// 30s; slots outlive the run.
const fifoTiers = `    - plan: solo
      maxConcurrentStreams: 1
      slotTTL: 60s
      heartbeatInterval: 20s
      maxWait: 30s
    - plan: pair
      maxConcurrentStreams: 2
      slotTTL: 60s
      heartbeatInterval: 20s
      maxWait: 30s
`

const (
	fifoRun     = 6 * time.Second
	fifoWorkers = 5 // per user
)

// TestWaitGrantOrderIsLinearizable: workers of three users (two with one
// slot, one with two) wait for slots through three serve processes on the
// Redis Cluster, with waits short enough that some run out, holding each
// slot briefly; a reader records each user's queue in Redis as it goes.
// The history is checked against the queue model (internal/linearize,
// porcupine): the queue is always as read, and a slot only ever goes to
// the head of it. It also shows the check is not vacuous: the same
// history with two grants of one user swapped is refused.
func TestWaitGrantOrderIsLinearizable(t *testing.T) {
	prefix := "e2e-fifo-" + randomID() + ":"
	addrs := testenv.Cluster(t)
	servers := urls(startServers(t, 3, serveConfig(addrs, prefix, fifoTiers)))
	queues := newQueueReader(t, addrs, prefix)
	users := []struct {
		id, plan string
		limit    int
	}{
		{"fifo-a-" + randomID(), "solo", 1},
		{"fifo-b-" + randomID(), "solo", 1},
		{"fifo-c-" + randomID(), "pair", 2},
	}
	epoch := time.Now()
	ns := func(at time.Time) int64 { return at.Sub(epoch).Nanoseconds() }

	var mu sync.Mutex
	var history []linearize.QueueOp
	var unexpected []string
	record := func(ops ...linearize.QueueOp) {
		mu.Lock()
		history = append(history, ops...)
		mu.Unlock()
	}
	var grants, timeouts int
	ctx, stop := context.WithTimeout(context.Background(), fifoRun)
	defer stop()
	var workers sync.WaitGroup
	for _, u := range users {
		for w := range fifoWorkers {
			workers.Go(func() {
				for n := 0; ctx.Err() == nil; n++ {
					stream := fmt.Sprintf("w%d-%d", w, n)
					server := servers[rand.N(len(servers))]
					call := time.Now()
					a := post(context.Background(), server+httpapi.PathAcquire, httpapi.AcquireRequest{
						UserID: u.id, Plan: u.plan, StreamID: stream, WaitMs: 100 + rand.Int64N(1200)})
					op := linearize.QueueOp{User: u.id, Limit: u.limit, Stream: stream, Call: ns(call), Return: ns(a.at)}
					join := op
					join.Kind = linearize.Join
					switch {
					case a.err == nil && a.status == http.StatusOK:
						op.Kind = linearize.Grant
						record(join, op)
						mu.Lock()
						grants++
						mu.Unlock()
						time.Sleep(time.Duration(40+rand.N(160)) * time.Millisecond)
						call := time.Now()
						r := post(context.Background(), servers[rand.N(len(servers))]+httpapi.PathRelease, httpapi.ReleaseRequest{UserID: u.id, StreamID: stream})
						var rel httpapi.ReleaseResponse
						if r.err != nil || r.status != http.StatusOK || json.Unmarshal(r.body, &rel) != nil || !rel.Released {
							mu.Lock()
							unexpected = append(unexpected, fmt.Sprintf("release %s: %d %s %v", stream, r.status, r.body, r.err))
							mu.Unlock()
							return
						}
						record(linearize.QueueOp{User: u.id, Limit: u.limit, Kind: linearize.Free, Stream: stream, Call: ns(call), Return: ns(r.at)})
					case a.err == nil && a.status == http.StatusTooManyRequests:
						op.Kind = linearize.Leave
						record(join, op)
						mu.Lock()
						timeouts++
						mu.Unlock()
					default:
						mu.Lock()
						unexpected = append(unexpected, fmt.Sprintf("acquire %s: %d %s %v", stream, a.status, a.body, a.err))
						mu.Unlock()
						return
					}
				}
			})
		}
	}
	// The readers of the queues run until the last worker is done: a
	// wait still open at the end of the run finishes on its own.
	done := make(chan struct{})
	var readers sync.WaitGroup
	for _, u := range users {
		readers.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				call := time.Now()
				q, err := queues.queue(context.Background(), u.id)
				ret := time.Now()
				if err != nil {
					continue
				}
				record(linearize.QueueOp{User: u.id, Limit: u.limit, Kind: linearize.Observe, Queue: q, Call: ns(call), Return: ns(ret)})
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	workers.Wait()
	close(done)
	readers.Wait()
	if len(unexpected) > 0 {
		t.Fatalf("answers a healthy cluster does not give:\n%v", unexpected)
	}

	start := time.Now()
	v := linearize.CheckQueue(history, linearize.Options{})
	t.Logf("%d users x %d workers, %v: %d operations (%d grants, %d waits that ran out); grant order linearizable: %v, in %v",
		len(users), fifoWorkers, fifoRun, len(history), grants, timeouts, v.OK(), time.Since(start).Round(time.Millisecond))
	if !v.OK() {
		t.Errorf("grant order not linearizable: illegal for %v, undecided for %v", v.Illegal, v.Undecided)
	}
	if grants < 30 || timeouts < 5 {
		t.Errorf("%d grants and %d waits that ran out: too little contention to check anything", grants, timeouts)
	}

	t.Run("two grants swapped are caught", func(t *testing.T) {
		swapped, user := swapGrants(history, users[0].id)
		if user == "" {
			t.Fatal("no two grants to swap")
		}
		v := linearize.CheckQueue(swapped, linearize.Options{})
		if !slices.Contains(v.Illegal, user) {
			t.Errorf("with two grants of %s swapped: illegal %v, undecided %v; want %s illegal", user, v.Illegal, v.Undecided, user)
		}
	})
}

// swapGrants returns history with the grants (and the releases) of two
// of user's acquires swapped: the first two, in the middle of the run,
// that were both read in the queue at once, the one that was ahead served
// second.
func swapGrants(history []linearize.QueueOp, user string) ([]linearize.QueueOp, string) {
	out := slices.Clone(history)
	for _, o := range history {
		if o.User != user || o.Kind != linearize.Observe || len(o.Queue) < 2 || o.Call < history[len(history)/2].Call {
			continue
		}
		a, b := o.Queue[0], o.Queue[1]
		grantedA, grantedB := false, false
		for _, g := range history {
			if g.User == user && g.Kind == linearize.Grant {
				grantedA = grantedA || g.Stream == a
				grantedB = grantedB || g.Stream == b
			}
		}
		if !grantedA || !grantedB {
			continue
		}
		for i, g := range out {
			if g.User != user || (g.Kind != linearize.Grant && g.Kind != linearize.Free) {
				continue
			}
			switch g.Stream {
			case a:
				out[i].Stream = b
			case b:
				out[i].Stream = a
			}
		}
		return out, user
	}
	return out, ""
}
