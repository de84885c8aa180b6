package e2e

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/client"
)

// TestKilledClientFreesSlotsAfterTTL: an application killed without
// releasing frees its user's slots one TTL later, on its own.
func TestKilledClientFreesSlotsAfterTTL(t *testing.T) {
	for _, backend := range redisBackends {
		t.Run(backend.name, func(t *testing.T) {
			t.Parallel()
			run := randomID()
			server := startServers(t, 1, serveConfig(backend.redis(t), "e2e-"+run+":", incidentTiers))[0]
			users := "vanish-" + run + "-"
			app, streams := startChild(t, "leases", "E2E_SERVERS="+server.API, "E2E_USERS=2", "E2E_USER_PREFIX="+users)
			if streams != 4 {
				t.Fatalf("opened %d streams, want 4", streams)
			}
			app.kill()
			killed := time.Now()
			if status, _ := acquire(t, server.API, users+"1", "paid"); status != http.StatusTooManyRequests && time.Since(killed) < time.Second {
				t.Errorf("paid user right after the kill: %d, want 429", status)
			}
			time.Sleep(time.Until(killed.Add(incidentTTL)))
			for k := range 3 {
				if status, res := acquire(t, server.API, users+"1", "paid"); status != http.StatusOK {
					t.Fatalf("paid user stream %d one TTL after the kill: %d %+v, want 200", k, status, res)
				}
			}
			if status, _ := acquire(t, server.API, users+"0", "free"); status != http.StatusOK {
				t.Fatalf("free user one TTL after the kill: %d, want 200", status)
			}
		})
	}
}

// TestClientThatLosesItsConnectionKeepsItsSlots: a network blip shorter than
// the TTL costs nothing; the client's heartbeats resume and the slots stay.
func TestClientThatLosesItsConnectionKeepsItsSlots(t *testing.T) {
	run := randomID()
	server := startServers(t, 1, serveConfig([]string{testenv.Redis(t)}, "e2e-"+run+":", incidentTiers))[0]
	path := testenv.StartProxy(t, server.API[len("http://"):])
	c, err := client.New("http://" + path.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())

	user := "blip-" + run
	var leases []*client.Lease
	for range 3 {
		l, err := c.Acquire(context.Background(), user, "paid")
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	path.BlackHole()
	time.Sleep(1200 * time.Millisecond) // > 2 heartbeat intervals, < TTL
	path.Restore()
	time.Sleep(incidentTTL + 500*time.Millisecond) // the slots would have expired without heartbeats

	for i, l := range leases {
		select {
		case <-l.Lost():
			t.Errorf("lease %d lost after a %v blip: %v", i, 1200*time.Millisecond, l.Err())
		default:
		}
	}
	if status, _ := acquire(t, server.API, user, "paid"); status != http.StatusTooManyRequests {
		t.Errorf("a 4th acquire after the blip got %d, want 429 (the 3 slots are still held)", status)
	}
}
