package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/testenv"
	"github.com/redis/rueidis"
)

const (
	incidentUsers   = 50
	incidentStreams = 100 // 25 free users × 1 + 25 paid users × 3
	incidentTTL     = 2 * time.Second
)

// TestIncidentReplay replays the incident this project exists for: a deploy
// SIGKILLs every server and application process mid-stream. With slots that
// carry their own expiry, every user can stream again one TTL later, and the
// crashed streams are counted as pruned. The INCR/DECR counter it replaced
// stays leaked.
func TestIncidentReplay(t *testing.T) {
	// Alone, not beside the tests that mostly wait: it times how soon every
	// user has their limit back after the crash (within TTL + 1s).
	redis := testenv.Cluster(t)
	run := randomID()
	userPrefix := "incident-" + run + "-"
	config := serveConfig(redis, "e2e-"+run+":", incidentTiers)

	servers := startServers(t, 3, config)
	app, streams := startChild(t, "leases",
		"E2E_SERVERS="+strings.Join(urls(servers), ","),
		fmt.Sprintf("E2E_USERS=%d", incidentUsers),
		"E2E_USER_PREFIX="+userPrefix)
	if streams != incidentStreams {
		t.Fatalf("the application opened %d streams, want %d", streams, incidentStreams)
	}

	// Heartbeats keep every user at their limit past a whole TTL.
	time.Sleep(incidentTTL + 500*time.Millisecond)
	for i := range incidentUsers {
		plan, _ := planOf(i)
		if status, _ := acquire(t, servers[i%3].API, fmt.Sprintf("%s%d", userPrefix, i), plan); status != http.StatusTooManyRequests {
			t.Fatalf("user %d at their limit (heartbeating) got %d on one more acquire, want 429", i, status)
		}
	}

	// The deploy: everything is SIGKILLed mid-stream.
	for _, s := range servers {
		s.Kill()
	}
	app.kill()
	killed := time.Now()

	fresh := startServers(t, 3, config)
	if time.Since(killed) < time.Second {
		if status, _ := acquire(t, fresh[0].API, userPrefix+"1", "paid"); status != http.StatusTooManyRequests {
			t.Errorf("right after the crash a paid user got %d, want 429 (slots live until their TTL)", status)
		}
	}

	// One TTL after the last heartbeat every slot has expired by itself.
	time.Sleep(time.Until(killed.Add(incidentTTL)))
	pruned := 0
	for i := range incidentUsers {
		plan, limit := planOf(i)
		user := fmt.Sprintf("%s%d", userPrefix, i)
		for k := range limit {
			status, res := acquire(t, fresh[(i+k)%3].API, user, plan)
			for status == http.StatusTooManyRequests && time.Since(killed) < incidentTTL+time.Second {
				time.Sleep(20 * time.Millisecond)
				status, res = acquire(t, fresh[(i+k)%3].API, user, plan)
			}
			if status != http.StatusOK || !res.Granted || res.Degraded {
				t.Fatalf("user %d stream %d after the crash: status %d %+v; want granted within TTL+1s", i, k, status, res)
			}
			pruned += res.Pruned
		}
	}
	if took := time.Since(killed); took > incidentTTL+time.Second {
		t.Errorf("every user had their full limit back %v after the crash, want within TTL+1s (%v)", took, incidentTTL+time.Second)
	}
	if pruned != incidentStreams {
		t.Errorf("pruned total = %d, want %d (one per killed stream)", pruned, incidentStreams)
	}

	t.Run("the INCR/DECR counter stays leaked", func(t *testing.T) {
		counterUsers := "counter-" + run + "-"
		app, streams := startChild(t, "counter",
			"E2E_REDIS="+strings.Join(redis, ","),
			fmt.Sprintf("E2E_USERS=%d", incidentUsers),
			"E2E_USER_PREFIX="+counterUsers)
		if streams != incidentStreams {
			t.Fatalf("the counter application opened %d streams, want %d", streams, incidentStreams)
		}
		app.kill()
		time.Sleep(incidentTTL + time.Second)

		rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: redis, DisableCache: true})
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		ctx := context.Background()
		locked := 0
		for i := range incidentUsers {
			_, limit := planOf(i)
			user := fmt.Sprintf("%s%d", counterUsers, i)
			ok, err := counterAcquire(ctx, rc, user, limit)
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				locked++
			}
			rc.Do(ctx, rc.B().Del().Key(counterKey(user)).Build())
		}
		if locked != incidentUsers {
			t.Errorf("counter baseline: %d of %d users locked out after the crash, want all (the leak)", locked, incidentUsers)
		}
	})
}
