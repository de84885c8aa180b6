package client_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/client"
	"github.com/joishi/limiter/pkg/httpapi"
)

func TestHeartbeatsAreBatched(t *testing.T) {
	f := newFake(t)
	c := newClient(t, f.URL())
	const n = 1200 // two requests per tick: 1000 + 200
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := w; i < n; i += 4 {
				if _, err := c.Acquire(context.Background(), fmt.Sprintf("u%d", i), "bulk"); err != nil {
					t.Errorf("Acquire %d: %v", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	done := len(f.batches())
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := f.batches()[done:]
		first := -1
		for i := 0; i+2 <= len(got); i++ {
			if wholeTick(got[i:i+2], n) {
				first = i
				break
			}
		}
		if first >= 0 && first+4 <= len(got) {
			for _, b := range got[first:] {
				if len(b.streams) > httpapi.MaxBatch {
					t.Errorf("got a batch of %d slots, want at most %d", len(b.streams), httpapi.MaxBatch)
				}
			}
			if !wholeTick(got[first+2:first+4], n) {
				t.Errorf("the tick after a whole one: got batches of %v slots, want each of %d slots once in 2 requests", sizes(got[first+2:first+4]), n)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no two whole ticks within 20s; batch sizes after the acquires: %v", sizes(got))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// wholeTick reports whether batches heartbeat n distinct slots, each once.

func wholeTick(batches []fakeBatch, n int) bool {
	seen := map[string]bool{}
	for _, b := range batches {
		for _, s := range b.streams {
			if seen[s] {
				return false
			}
			seen[s] = true
		}
	}
	return len(seen) == n
}

func sizes(batches []fakeBatch) []int {
	out := make([]int, len(batches))
	for i, b := range batches {
		out[i] = len(b.streams)
	}
	return out
}

func TestHeartbeatIntervalFollowsHeldLeases(t *testing.T) {
	f := newFake(t)
	f.tiers["slow"] = fakeTier{limit: 3, intervalMs: 400}
	f.tiers["fast"] = fakeTier{limit: 3, intervalMs: 40}
	c := newClient(t, f.URL())
	ctx := context.Background()
	if _, err := c.Acquire(ctx, "u1", "slow"); err != nil {
		t.Fatal(err)
	}
	fast, err := c.Acquire(ctx, "u1", "fast")
	if err != nil {
		t.Fatal(err)
	}
	start := len(f.batches())
	time.Sleep(300 * time.Millisecond)
	if ticks := len(f.batches()) - start; ticks < 3 {
		t.Errorf("with a 40ms lease held: got %d heartbeat requests in 300ms, want at least 3", ticks)
	}
	if err := fast.Release(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(450 * time.Millisecond) // the tick already due may still run
	start = len(f.batches())
	time.Sleep(700 * time.Millisecond)
	if ticks := len(f.batches()) - start; ticks < 1 || ticks > 2 {
		t.Errorf("with only a 400ms lease held: got %d heartbeat requests in 700ms, want 1 or 2", ticks)
	}
}

func TestFixedHeartbeatInterval(t *testing.T) {
	f := newFake(t)
	c := newClient(t, f.URL(), client.WithHeartbeatInterval(time.Hour))
	if _, err := c.Acquire(context.Background(), "u1", "paid"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // four of the tier's 50ms intervals
	if got := len(f.batches()); got != 0 {
		t.Errorf("got %d heartbeat requests with a 1h interval, want 0", got)
	}
}

func TestTransientFailuresKeepLeases(t *testing.T) {
	tests := []struct {
		name      string
		heartbeat func(w http.ResponseWriter, r *http.Request) bool
		slotError *httpapi.Error
	}{
		{name: "503 for the batch", heartbeat: func(w http.ResponseWriter, r *http.Request) bool {
			writeError(w, 503, httpapi.Error{Code: httpapi.CodeUnavailable, Message: "down"})
			return true
		}},
		{name: "500 page", heartbeat: func(w http.ResponseWriter, r *http.Request) bool {
			w.WriteHeader(500)
			return true
		}},
		{name: "network error", heartbeat: func(w http.ResponseWriter, r *http.Request) bool { hangUp(w); return true }},
		{name: "per-slot limiter_unavailable", slotError: &httpapi.Error{Code: httpapi.CodeUnavailable, Message: "closed tier, redis down"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t)
			c := newClient(t, f.URL())
			lease, err := c.Acquire(context.Background(), "u1", "paid")
			if err != nil {
				t.Fatal(err)
			}
			f.set(func(f *fakeLimiter) {
				f.onHeartbeats = tt.heartbeat
				if tt.slotError != nil {
					f.slotError = func(string) *httpapi.Error { return tt.slotError }
				}
			})
			before := len(f.batches())
			f.waitBatches(before+3, 2*time.Second)
			select {
			case <-lease.Lost():
				t.Fatalf("Lost closed after a transient failure (Err %v), want open", lease.Err())
			default:
			}
			expires := lease.ExpiresAt()
			f.set(func(f *fakeLimiter) { f.onHeartbeats, f.slotError = nil, nil })
			deadline := time.Now().Add(2 * time.Second)
			for !lease.ExpiresAt().After(expires) {
				if time.Now().After(deadline) {
					t.Fatal("ExpiresAt did not move after the limiter recovered")
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

func TestLeaseLost(t *testing.T) {
	tests := []struct {
		name      string
		slotError *httpapi.Error // nil: the slot is dropped (alive false)
		wantIs    error
	}{
		{"alive false", nil, client.ErrSlotLost},
		{"per-slot slot_lost", &httpapi.Error{Code: httpapi.CodeSlotLost, Message: "gone"}, client.ErrSlotLost},
		{"per-slot unknown_plan", &httpapi.Error{Code: httpapi.CodeUnknownPlan, Message: "plan removed"}, client.ErrUnknownPlan},
		{"per-slot invalid_stream_id", &httpapi.Error{Code: httpapi.CodeInvalidStreamID, Message: "bad"}, client.ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t)
			c := newClient(t, f.URL())
			ctx := context.Background()
			keep, err := c.Acquire(ctx, "u1", "paid", client.WithStreamID("keep"))
			if err != nil {
				t.Fatal(err)
			}
			lease, err := c.Acquire(ctx, "u1", "paid", client.WithStreamID("doomed"))
			if err != nil {
				t.Fatal(err)
			}
			if tt.slotError == nil {
				f.drop("u1", "doomed")
			} else {
				f.set(func(f *fakeLimiter) {
					f.slotError = func(id string) *httpapi.Error {
						if id == "doomed" {
							return tt.slotError
						}
						return nil
					}
				})
			}
			select {
			case <-lease.Lost():
			case <-time.After(2 * time.Second):
				t.Fatal("Lost did not close")
			}
			if !errors.Is(lease.Err(), tt.wantIs) {
				t.Errorf("got Err %v, want %v", lease.Err(), tt.wantIs)
			}
			// The lost lease is no longer heartbeated; the other one is.
			n := len(f.batches())
			for _, b := range f.waitBatches(n+2, 2*time.Second)[n:] {
				if strings.Join(b.streams, ",") != "keep" {
					t.Errorf("got heartbeat for %v after the loss, want [keep]", b.streams)
				}
			}
			select {
			case <-keep.Lost():
				t.Error("the other lease was lost too")
			default:
			}
		})
	}
}

func TestDegradedLease(t *testing.T) {
	t.Run("re-acquired once the limiter counts again", func(t *testing.T) {
		f := newFake(t)
		f.degraded = true
		c := newClient(t, f.URL())
		lease, err := c.Acquire(context.Background(), "u1", "paid", client.WithStreamID("s"))
		if err != nil {
			t.Fatal(err)
		}
		if !lease.Degraded() || lease.Used() != 0 {
			t.Fatalf("got Degraded %t, Used %d for a degraded grant; want true, 0 (not counted)", lease.Degraded(), lease.Used())
		}
		f.set(func(f *fakeLimiter) { f.degraded = false }) // Redis is back; it never held "s"
		deadline := time.Now().Add(2 * time.Second)
		for f.used("u1") != 1 || lease.Degraded() {
			if time.Now().After(deadline) {
				t.Fatalf("got used %d, Degraded %t; want the slot re-acquired", f.used("u1"), lease.Degraded())
			}
			time.Sleep(10 * time.Millisecond)
		}
		// The re-acquire's answer counted it: the lease says so.
		if used, limit := lease.Used(), lease.Limit(); used != 1 || limit != 3 {
			t.Errorf("after the re-acquire the lease says used %d of %d; want 1 of 3, as the re-acquire answered", used, limit)
		}
		select {
		case <-lease.Lost():
			t.Fatalf("Lost closed (Err %v), want open", lease.Err())
		default:
		}
	})
	t.Run("the re-acquire joins the acquire's pools and keeps its label", func(t *testing.T) {
		f := newFake(t)
		f.degraded = true
		var sent atomic.Pointer[httpapi.AcquireRequest]
		f.onAcquire = func(w http.ResponseWriter, r *http.Request) bool {
			var req httpapi.AcquireRequest
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(body))
			if json.Unmarshal(body, &req) == nil {
				sent.Store(&req)
			}
			return false
		}
		c := newClient(t, f.URL())
		if _, err := c.Acquire(context.Background(), "u1", "paid", client.WithStreamID("s"), client.WithLabel("pod-7"),
			client.WithPools(map[string]string{"model": "gpt-4o"})); err != nil {
			t.Fatal(err)
		}
		f.set(func(f *fakeLimiter) { f.degraded = false })
		deadline := time.Now().Add(2 * time.Second)
		for f.used("u1") != 1 {
			if time.Now().After(deadline) {
				t.Fatal("the degraded lease was not re-acquired")
			}
			time.Sleep(10 * time.Millisecond)
		}
		if req := sent.Load(); req == nil || req.Pools["model"] != "gpt-4o" || req.Label != "pod-7" {
			t.Errorf("the re-acquire sent %+v; want the pools and label of the acquire", req)
		}
	})
	t.Run("released while its re-acquire is in flight, the slot it took again is given back", func(t *testing.T) {
		f := newFake(t)
		f.degraded = true
		c := newClient(t, f.URL())
		lease, err := c.Acquire(context.Background(), "u1", "free", client.WithStreamID("s"))
		if err != nil {
			t.Fatal(err)
		}
		var once sync.Once
		f.onAcquire = func(w http.ResponseWriter, r *http.Request) bool {
			// The re-acquire: the caller's release lands before it.
			once.Do(func() {
				if err := lease.Release(context.Background()); err != nil {
					t.Errorf("Release: %v", err)
				}
			})
			return false
		}
		f.set(func(f *fakeLimiter) { f.degraded = false })
		deadline := time.Now().Add(2 * time.Second)
		for {
			f.mu.Lock()
			releases := f.releases
			f.mu.Unlock()
			if releases >= 2 && f.used("u1") == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("after the re-acquire: %d releases, used %d; want the re-taken slot given back (used 0)", releases, f.used("u1"))
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
	t.Run("lost when the re-acquire is refused", func(t *testing.T) {
		f := newFake(t)
		f.degraded = true
		c := newClient(t, f.URL())
		lease, err := c.Acquire(context.Background(), "u1", "free", client.WithStreamID("s"))
		if err != nil {
			t.Fatal(err)
		}
		f.set(func(f *fakeLimiter) {
			f.degraded = false
			f.slots["u1"] = map[string]bool{"other": true} // the user's one slot is taken
		})
		select {
		case <-lease.Lost():
		case <-time.After(2 * time.Second):
			t.Fatal("Lost did not close")
		}
		if !client.IsLimited(lease.Err()) {
			t.Errorf("got Err %v, want ErrLimitReached", lease.Err())
		}
	})
}

// TestAHungHeartbeatDoesNotDelayTheNext: a heartbeat request that never
// answers is abandoned after one interval, not after the 5s request
// timeout, so the next round still comes before the slots' TTLs run out.
func TestAHungHeartbeatDoesNotDelayTheNext(t *testing.T) {
	f := newFake(t)
	var calls atomic.Int32
	f.onHeartbeats = func(w http.ResponseWriter, r *http.Request) bool {
		if calls.Add(1) == 1 {
			hang(r)
			return true
		}
		return false
	}
	c, err := client.New(f.URL(), client.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	if _, err := c.Acquire(context.Background(), "u1", "paid"); err != nil { // 50ms interval
		t.Fatal(err)
	}
	f.waitBatches(3, time.Second) // the first hangs; two more follow well within 1s
}

// TestARefusedBatchIsLoggedAsAnError: a batch the limiter refuses as a
// request (a 4xx: here 400, as a body past its bound) is sent again the
// same at every tick while its slots' TTLs run out: the client says so
// at ERROR, where an outage (503) is a WARN that the slots keep their TTL.
func TestARefusedBatchIsLoggedAsAnError(t *testing.T) {
	for _, c := range []struct {
		status int
		level  string
		says   string
	}{
		{http.StatusBadRequest, "ERROR", "heartbeat batch refused"},
		{http.StatusServiceUnavailable, "WARN", "retrying next tick"},
	} {
		t.Run(strconv.Itoa(c.status), func(t *testing.T) {
			f := newFake(t)
			logs := &testenv.Buffer{}
			cl := newClient(t, f.URL(), client.WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
			if _, err := cl.Acquire(context.Background(), "u1", "paid"); err != nil {
				t.Fatal(err)
			}
			f.set(func(f *fakeLimiter) {
				f.onHeartbeats = func(w http.ResponseWriter, r *http.Request) bool {
					writeError(w, c.status, httpapi.Error{Code: httpapi.CodeInvalidRequest, Message: "no"})
					return true
				}
			})
			f.waitBatches(len(f.batches())+2, 2*time.Second)
			if got := logs.String(); !strings.Contains(got, "level="+c.level) || !strings.Contains(got, c.says) {
				t.Errorf("a batch answered %d logged:\n%s\nwant %s saying %q", c.status, got, c.level, c.says)
			}
		})
	}
}
