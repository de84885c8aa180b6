package client_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/client"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/server"
	"github.com/joishi/limiter/pkg/tiers"
)

// Short intervals keep the tests quick: a slot outlives three heartbeats.
// The bulk plan's slots live longer: acquiring 1,000 of them saturates two
// cores under -race, and a 1,000-slot heartbeat round then takes longer
// than a 900ms TTL allows (a starved process, not the client, loses them).
const (
	realTTL      = 900 * time.Millisecond
	realInterval = 300 * time.Millisecond
	bulkTTL      = 3 * time.Second
)

// realLimiter is pkg/server over a limiter on the shared test Redis, with
// a middleware that records every heartbeat request.
type realLimiter struct {
	url string
	lim *limiter.Limiter

	mu     sync.Mutex
	beats  []fakeBatch // POST /v1/slots/heartbeats, in arrival order
	single int         // POST /v1/slots/heartbeat
}

func newReal(t *testing.T) *realLimiter {
	t.Helper()
	lim := limitertest.New(t, limitertest.Options{
		Redis: cluster.Options{Logger: quiet},
		Tiers: []tiers.Tier{
			{Plan: "bulk", MaxConcurrentStreams: 1000, SlotTTL: bulkTTL, HeartbeatInterval: realInterval, FailureMode: tiers.FailClosed},
			{Plan: "free", MaxConcurrentStreams: 1, SlotTTL: realTTL, HeartbeatInterval: realInterval, FailureMode: tiers.FailClosed},
		},
		Limiter: limiter.Options{Logger: quiet, Pools: realPools(t)},
	}).Limiter
	r := &realLimiter{lim: lim}
	api := server.New(r.lim, server.Options{Logger: quiet}).Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		switch req.URL.Path {
		case httpapi.PathHeartbeats:
			raw, _ := io.ReadAll(req.Body)
			req.Body = io.NopCloser(bytes.NewReader(raw)) // the server reads it again
			var body httpapi.HeartbeatsRequest
			_ = json.Unmarshal(raw, &body)
			batch := fakeBatch{at: time.Now()}
			for _, s := range body.Slots {
				batch.streams = append(batch.streams, s.StreamID)
			}
			r.mu.Lock()
			r.beats = append(r.beats, batch)
			r.mu.Unlock()
		case httpapi.PathHeartbeat:
			r.mu.Lock()
			r.single++
			r.mu.Unlock()
		}
		api.ServeHTTP(w, req)
	}))
	t.Cleanup(srv.Close)
	r.url = srv.URL
	return r
}

// realPools caps the pool key model=gpt-4o at one stream.
func realPools(t *testing.T) *pools.Table {
	t.Helper()
	table := pools.NewTable()
	if err := table.Replace([]pools.Pool{pools.Pool{Pool: "model", Keys: map[string]int{"gpt-4o": 1}}.WithDefaults()}); err != nil {
		t.Fatal(err)
	}
	return table
}

func (r *realLimiter) batches() []fakeBatch {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]fakeBatch(nil), r.beats...)
}

func (r *realLimiter) used(t *testing.T, userID string) int {
	t.Helper()
	slots, err := r.lim.Slots(context.Background(), userID)
	if err != nil {
		t.Fatalf("Slots(%s): %v", userID, err)
	}
	return slots.Used
}

func TestRealThousandLeasesOneHeartbeatRequestPerInterval(t *testing.T) {
	r := newReal(t)
	c := newClient(t, r.url)
	const users, perUser = 10, 100
	leases := make([]*client.Lease, 0, users*perUser)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for u := range users {
		wg.Go(func() {
			for range perUser {
				l, err := c.Acquire(context.Background(), fmt.Sprintf("user-%d", u), "bulk")
				if err != nil {
					t.Errorf("Acquire: %v", err)
					return
				}
				mu.Lock()
				leases = append(leases, l)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}

	// Let the tick that may have begun mid-acquire pass, then watch.
	time.Sleep(realInterval + realInterval/2)
	from := len(r.batches())
	const window = 10 * realInterval
	time.Sleep(window)
	got := r.batches()[from:]
	for i, b := range got {
		if len(b.streams) != users*perUser {
			t.Errorf("heartbeat request %d: got %d slots, want all %d in one request", i, len(b.streams), users*perUser)
		}
	}
	// Ten intervals: ten requests. Fewer only when the machine is too
	// loaded to keep the pace; more would mean requests per lease.
	if n := len(got); n < 7 || n > 11 {
		t.Errorf("got %d heartbeat requests in %s, want 10 (one per %s interval)", n, window, realInterval)
	}
	r.mu.Lock()
	single := r.single
	r.mu.Unlock()
	if single != 0 {
		t.Errorf("got %d single-slot heartbeat requests, want 0", single)
	}
	// Over a TTL has passed since the last acquire: only heartbeats kept
	// the slots.
	for u := range users {
		if got := r.used(t, fmt.Sprintf("user-%d", u)); got != perUser {
			t.Errorf("user-%d: got used %d, want %d", u, got, perUser)
		}
	}
	for _, l := range leases {
		select {
		case <-l.Lost():
			t.Fatalf("lease %s lost: %v", l.StreamID(), l.Err())
		default:
		}
	}
}

func TestRealLostAfterReleaseByAnotherParty(t *testing.T) {
	r := newReal(t)
	c := newClient(t, r.url)
	ctx := context.Background()
	lease, err := c.Acquire(ctx, "alice", "free")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire(ctx, "alice", "free"); !client.IsLimited(err) {
		t.Fatalf("second Acquire on a 1-stream plan: got %v, want stream_limit_reached", err)
	}

	// Support (or another process) frees the slot with a raw release.
	body, _ := json.Marshal(httpapi.ReleaseRequest{UserID: "alice", StreamID: lease.StreamID()})
	resp, err := http.Post(r.url+httpapi.PathRelease, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var released httpapi.ReleaseResponse
	err = json.NewDecoder(resp.Body).Decode(&released)
	resp.Body.Close()
	if err != nil || !released.Released {
		t.Fatalf("raw release: got %+v, %v; want released", released, err)
	}

	select {
	case <-lease.Lost():
	case <-time.After(3 * realInterval):
		t.Fatalf("Lost did not close within %s of the release", 3*realInterval)
	}
	if !errors.Is(lease.Err(), client.ErrSlotLost) {
		t.Errorf("got Err %v, want ErrSlotLost", lease.Err())
	}
	// The lost slot is not heartbeated back to life.
	time.Sleep(2 * realInterval)
	if got := r.used(t, "alice"); got != 0 {
		t.Errorf("got used %d after the loss, want 0", got)
	}
	if err := lease.Release(ctx); err != nil {
		t.Errorf("Release of a lost lease: got %v, want nil", err)
	}
}

func TestRealCloseReleasesEveryLease(t *testing.T) {
	r := newReal(t)
	c, err := client.New(r.url, client.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const users, perUser = 5, 10
	for u := range users {
		for range perUser {
			if _, err := c.Acquire(ctx, fmt.Sprintf("user-%d", u), "bulk"); err != nil {
				t.Fatal(err)
			}
		}
	}
	for u := range users {
		if got := r.used(t, fmt.Sprintf("user-%d", u)); got != perUser {
			t.Fatalf("user-%d: got used %d before Close, want %d", u, got, perUser)
		}
	}
	closeCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	start := time.Now()
	if err := c.Close(closeCtx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	t.Logf("Close released %d leases in %s", users*perUser, time.Since(start))
	// Immediately, not after a TTL: Close released them.
	for u := range users {
		if got := r.used(t, fmt.Sprintf("user-%d", u)); got != 0 {
			t.Errorf("user-%d: got used %d after Close, want 0", u, got)
		}
	}
}
