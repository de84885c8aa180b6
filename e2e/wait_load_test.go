package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/httpapi"
)

const (
	loadUsersN     = 100
	loadPerUser    = 10 // 1,000 acquires wanting a slot
	loadWindow     = 5 * time.Second
	loadMaxRatio   = 3.0 // "a small multiple"
	loadPollPeriod = time.Second
	// loadRedisTimeout is the serve processes' redis.timeout.
	loadRedisTimeout = 10 * time.Second
)

// loadCost is what Redis did in one measured window.
type loadCost struct {
	commands, scripts float64 // per second, over the masters
}

func (c loadCost) String() string {
	return fmt.Sprintf("%.0f commands/s (%.0f script calls/s)", c.commands, c.scripts)
}

// TestAThousandWaitersCostLikeAThousandPollers: 1,000 acquires wanting a
// slot of 100 users (10 each, every user's one slot held), through three
// serve processes on a Redis Cluster of the test's own, cost Redis within
// a small multiple of what they cost without waiting, polling once a
// second (the shortest Retry-After a 429 gives) as a client that does not
// wait must; and 1,000 waiters cost within a small multiple of 100: the
// cost follows the users waited for, not the waiters. Commands are those
// of INFO commandstats on the masters, the scripts' own included.
func TestAThousandWaitersCostLikeAThousandPollers(t *testing.T) {
	cluster := testenv.StartCluster(t)
	prefix := "e2e-load-" + randomID() + ":"
	// What Redis does is measured, not what a late reply does: a call past
	// the default redis.timeout (250ms), which a machine starved by other
	// tests or a Redis paused for a moment makes, is answered degraded
	// (failureMode Open), and a poller or a waiter so answered would fail
	// the run. Such calls wait here instead.
	servers := urls(startServers(t, 3, serveConfigTimeout(cluster, prefix, waitTiers, loadRedisTimeout)))
	queues := newQueueReader(t, cluster, prefix)
	users := make([]string, loadUsersN)
	for i := range users {
		users[i] = fmt.Sprintf("load-%d-%s", i, randomID())
		var out httpapi.AcquireResponse
		if status, _, body := call(t, httpClient, http.MethodPost, servers[i%3]+httpapi.PathAcquire,
			httpapi.AcquireRequest{UserID: users[i], Plan: "solo", StreamID: "holder"}, &out); status != http.StatusOK || out.Degraded {
			t.Fatalf("holder of %s: %d %s", users[i], status, body)
		}
	}
	measure := func() loadCost {
		total0, scripts0 := commandCalls(t, cluster)
		start := time.Now()
		time.Sleep(loadWindow)
		total1, scripts1 := commandCalls(t, cluster)
		secs := time.Since(start).Seconds()
		return loadCost{commands: float64(total1-total0) / secs, scripts: float64(scripts1-scripts0) / secs}
	}

	// Without waiting: each polls, a second apart.
	ctx, stop := context.WithCancel(context.Background())
	var pollers sync.WaitGroup
	var mu sync.Mutex
	var refused, polls int
	for i := range loadUsersN * loadPerUser {
		pollers.Go(func() {
			user := users[i%loadUsersN]
			timer := time.NewTimer(time.Duration(rand.Int64N(int64(loadPollPeriod))))
			defer timer.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-timer.C:
				}
				a := post(ctx, servers[i%3]+httpapi.PathAcquire, httpapi.AcquireRequest{UserID: user, Plan: "solo", StreamID: fmt.Sprintf("p%d", i)})
				mu.Lock()
				polls++
				if a.err == nil && a.status != http.StatusTooManyRequests {
					refused++
				}
				mu.Unlock()
				timer.Reset(loadPollPeriod)
			}
		})
	}
	time.Sleep(loadPollPeriod) // every poller has started
	polling := measure()
	stop()
	pollers.Wait()
	if refused > 0 {
		t.Fatalf("%d of %d polls were not answered 429: every user's slot is held", refused, polls)
	}

	waiting := func(perUser int) loadCost {
		t.Helper()
		ctx, hangUp := context.WithCancel(context.Background())
		var answers []<-chan answer
		for i := range loadUsersN * perUser {
			answers = append(answers, waitingAcquire(ctx, servers[i%3], users[i%loadUsersN], "solo", fmt.Sprintf("w%d", i), 30_000))
		}
		for _, user := range users {
			queues.await(t, user, 20*time.Second, fmt.Sprintf("%d waiting", perUser), func(q []string) bool { return len(q) == perUser })
		}
		cost := measure()
		hangUp()
		for _, ch := range answers {
			if a := <-ch; a.err == nil {
				t.Errorf("a waiter was answered %d %s before the run ended: every user's slot is held", a.status, a.body)
			}
		}
		for _, user := range users {
			queues.await(t, user, 5*time.Second, "empty once the waiters hung up", func(q []string) bool { return len(q) == 0 })
		}
		return cost
	}
	hundred := waiting(1)
	thousand := waiting(loadPerUser)

	perWaiter := thousand.commands / float64(loadUsersN*loadPerUser)
	t.Logf("1,000 acquires for 100 users' held slots, 3 replicas, Redis Cluster (3 masters):\n"+
		"  polling once a second, no wait: %v\n"+
		"  100 waiting (1 per user):       %v\n"+
		"  1,000 waiting (10 per user):    %v = %.2f commands/s per waiter\n"+
		"  1,000 waiting / polling: %.2fx; 1,000 waiting / 100 waiting: %.2fx",
		polling, hundred, thousand, perWaiter, thousand.commands/polling.commands, thousand.commands/hundred.commands)
	if r := thousand.commands / polling.commands; r > loadMaxRatio {
		t.Errorf("1,000 waiters cost %.2fx what 1,000 pollers do, want at most %.1fx", r, loadMaxRatio)
	}
	if r := thousand.commands / hundred.commands; r > loadMaxRatio {
		t.Errorf("1,000 waiters cost %.2fx what 100 do, want at most %.1fx: the cost must follow the users, not the waiters", r, loadMaxRatio)
	}
}
