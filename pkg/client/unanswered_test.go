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
	"sync/atomic"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/client"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/server"
	"github.com/joishi/limiter/pkg/tiers"
)

// slowLimiter is pkg/server over a limiter that reaches a test Redis
// through a proxy, whose latency pushes Redis's answers past the
// limiter's 250ms per-call deadline while the commands still run. When an
// acquire is answered 503, the server waits for that late acquire to land
// in Redis and for the link to recover before the client hears the 503:
// the answer was lost, the slot was taken, and what the client does next
// travels a healthy link.
type slowLimiter struct {
	url    string
	lim    *limiter.Limiter // through the proxy
	direct *limiter.Limiter // same keys, straight to Redis
	proxy  *testenv.Proxy
}

// lateTTL is long enough that a slot leaked by a late answer would
// visibly lock the user out for the rest of the test.
const lateTTL = 10 * time.Second

func newSlowReal(t *testing.T) *slowLimiter {
	t.Helper()
	// A Redis of its own: a test flushing the shared one's scripts would
	// make the late EVALSHA fail instead of run.
	addr := testenv.StartRedis(t).Addr()
	proxy := testenv.StartProxy(t, addr)
	prefix := keys.Schema{Prefix: "limiter-clienttest:"}
	s := &slowLimiter{proxy: proxy, lim: connectedLimiter(t, proxy.Addr(), prefix), direct: connectedLimiter(t, addr, prefix)}
	api := server.New(s.lim, server.Options{Logger: quiet}).Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var user httpapi.AcquireRequest
		if r.URL.Path == httpapi.PathAcquire {
			raw, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(raw))
			_ = json.Unmarshal(raw, &user)
		}
		rec := httptest.NewRecorder()
		api.ServeHTTP(rec, r)
		if r.URL.Path == httpapi.PathAcquire && rec.Code == http.StatusServiceUnavailable {
			s.awaitLanded(t, user.UserID)
			proxy.SetLatency(0)
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	}))
	t.Cleanup(srv.Close)
	s.url = srv.URL
	// Load the scripts and open the connection while the link is fast.
	ctx := context.Background()
	if _, err := s.lim.Acquire(ctx, limiter.AcquireRequest{UserID: "warm-up", Plan: "free"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.lim.ReleaseAll(ctx, "warm-up", "warm-up"); err != nil {
		t.Fatal(err)
	}
	return s
}

func connectedLimiter(t *testing.T, addr string, prefix keys.Schema) *limiter.Limiter {
	t.Helper()
	redis, err := cluster.New(cluster.Options{Addrs: []string{addr}, Logger: quiet})
	if err != nil {
		t.Fatalf("cluster.New: %v", err)
	}
	t.Cleanup(redis.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := redis.WaitConnected(ctx); err != nil {
		t.Fatal(err)
	}
	table := tiers.NewTable()
	if err := table.Replace([]tiers.Tier{{Plan: "free", MaxConcurrentStreams: 1, SlotTTL: lateTTL, HeartbeatInterval: time.Second, FailureMode: tiers.FailClosed}}); err != nil {
		t.Fatal(err)
	}
	return limiter.New(redis, table, limiter.Options{Keys: prefix, Logger: quiet})
}

// awaitLanded waits until userID holds a slot in Redis.
func (s *slowLimiter) awaitLanded(t *testing.T, userID string) {
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if got, err := s.direct.Slots(context.Background(), userID); err == nil && got.Used > 0 {
			return
		}
	}
	// Under a loaded machine the limiter may give up before its command
	// is even written, and then nothing lands: the client's next step
	// still runs on the healthy link, and the test's own checks hold.
	t.Logf("the late acquire of %s did not land in Redis within 3s", userID)
}

func (s *slowLimiter) slots(t *testing.T, userID string) limiter.UserSlots {
	t.Helper()
	got, err := s.direct.Slots(context.Background(), userID)
	if err != nil {
		t.Fatalf("Slots(%s): %v", userID, err)
	}
	return got
}

// TestAcquireWhoseAnswerWasLostIsRetriedUnderItsStreamID: the first
// attempt runs in Redis but its answer is late (503); the retry under the
// same stream id is granted the slot that attempt took, so the user is not
// refused for a whole TTL.
func TestAcquireWhoseAnswerWasLostIsRetriedUnderItsStreamID(t *testing.T) {
	s := newSlowReal(t)
	c := newClient(t, s.url)
	user := "late-" + newStreamID(t)

	s.proxy.SetLatency(400 * time.Millisecond) // > the limiter's 250ms deadline
	lease, err := c.Acquire(context.Background(), user, "free")
	if err != nil {
		t.Fatalf("Acquire whose first answer was late: got %v, want a lease granted on a retry", err)
	}
	got := s.slots(t, user)
	if got.Used != 1 || got.Slots[0].StreamID != lease.StreamID() {
		t.Errorf("slots of the user: got %+v, want one, the lease's %s", got.Slots, lease.StreamID())
	}
}

// TestAcquireGivenUpReleasesItsStreamID: when no attempt is answered, the
// client releases the stream id it sent, so the slot a late attempt took
// is freed instead of counting against the user for a whole TTL.
func TestAcquireGivenUpReleasesItsStreamID(t *testing.T) {
	s := newSlowReal(t)
	c := newClient(t, s.url, client.WithAcquireRetries(0))
	user := "late-" + newStreamID(t)

	s.proxy.SetLatency(400 * time.Millisecond)
	_, err := c.Acquire(context.Background(), user, "free")
	if !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("Acquire with its answer late: got %v, want ErrUnavailable", err)
	}
	// The client releases the id at once and, since it made the id, once
	// more a second later, for an attempt that reached Redis after the
	// first release (the limiter's Redis client sends an acquire again
	// after a broken connection): free within 2s, not a TTL (10s).
	deadline := time.Now().Add(2 * time.Second)
	for got := s.slots(t, user); got.Used != 0; got = s.slots(t, user) {
		if time.Now().After(deadline) {
			t.Fatalf("slots of the user 2s after the acquire gave up: got %+v, want none (released)", got.Slots)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Not locked out: the next acquire is granted. It may meet the
	// limiter's connection still recovering from the slow hop (a 503, an
	// outage's answer), so it retries as a client does by default; a
	// leaked slot would answer 429 stream_limit_reached, which no retry
	// turns into a grant.
	if _, err := newClient(t, s.url).Acquire(context.Background(), user, "free"); err != nil {
		t.Errorf("next Acquire of the limit-1 user: got %v, want granted", err)
	}
}

func newStreamID(t *testing.T) string {
	t.Helper()
	return keys.NewStreamID()[:12]
}

// TestAcquireRetriesUnderOneStreamID: every attempt of one Acquire carries
// the same client-made stream id; unanswered attempts are retried within
// WithAcquireRetries, and an Acquire that ends without a grant after an
// unanswered attempt releases that id.
func TestAcquireRetriesUnderOneStreamID(t *testing.T) {
	for _, tc := range []struct {
		name         string
		unanswered   int // attempts answered 503 before the fake answers
		retries      int
		userHolds    bool // the user already holds the plan's only slot
		wantErr      error
		wantAttempts int
		wantReleases int
	}{
		{name: "a 503 then a grant is one lease", unanswered: 1, retries: 2, wantAttempts: 2},
		{name: "503s past the retries are given up and released", unanswered: 5, retries: 2, wantErr: client.ErrUnavailable, wantAttempts: 3, wantReleases: 1},
		{name: "without retries a 503 is released at once", unanswered: 5, retries: 0, wantErr: client.ErrUnavailable, wantAttempts: 1, wantReleases: 1},
		{name: "a refusal after a 503 is released too", unanswered: 1, retries: 2, userHolds: true, wantErr: client.ErrLimitReached, wantAttempts: 2, wantReleases: 1},
		{name: "a refusal alone is not released", retries: 2, userHolds: true, wantErr: client.ErrLimitReached, wantAttempts: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t)
			var mu sync.Mutex
			var ids []string
			f.set(func(f *fakeLimiter) {
				if tc.userHolds {
					f.slots["u"] = map[string]bool{"other": true}
				}
				f.onAcquire = func(w http.ResponseWriter, r *http.Request) bool {
					raw, _ := io.ReadAll(r.Body)
					r.Body = io.NopCloser(bytes.NewReader(raw))
					var req httpapi.AcquireRequest
					_ = json.Unmarshal(raw, &req)
					mu.Lock()
					defer mu.Unlock()
					ids = append(ids, req.StreamID)
					if len(ids) <= tc.unanswered {
						writeError(w, http.StatusServiceUnavailable, httpapi.Error{Code: httpapi.CodeUnavailable, Message: "late"})
						return true
					}
					return false
				}
			})
			c := newClient(t, f.URL(), client.WithAcquireRetries(tc.retries))
			lease, err := c.Acquire(context.Background(), "u", "free")
			if !errors.Is(err, tc.wantErr) || (err == nil) != (tc.wantErr == nil) {
				t.Fatalf("Acquire: got %v, want %v", err, tc.wantErr)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(ids) != tc.wantAttempts {
				t.Errorf("attempts: got %d (%v), want %d", len(ids), ids, tc.wantAttempts)
			}
			for _, id := range ids {
				if len(id) != 32 || id != ids[0] {
					t.Errorf("stream ids sent: got %v, want one 32-character id in every attempt", ids)
					break
				}
			}
			if lease != nil && lease.StreamID() != ids[0] {
				t.Errorf("lease stream id: got %s, want %s, the one sent", lease.StreamID(), ids[0])
			}
			f.set(func(f *fakeLimiter) {
				if f.releases != tc.wantReleases {
					t.Errorf("releases: got %d, want %d", f.releases, tc.wantReleases)
				}
			})
		})
	}
}

// TestRetryWaitStaysWithinItsBounds: the wait before each retry of an
// unanswered acquire doubles from 200ms up to 2s (drawn from the upper
// half), however many retries WithAcquireRetries allows: at the 37th the
// doubling would pass int64, and a wait below zero made Acquire panic. An
// answer's Retry-After is waited in full, with up to half as much again,
// up to 2s; one above is not waited: no retry.
func TestRetryWaitStaysWithinItsBounds(t *testing.T) {
	err := fmt.Errorf("limiter: POST %s: %w: connection refused", httpapi.PathAcquire, client.ErrUnavailable)
	for attempt := range 100 {
		want := min(200*time.Millisecond<<min(attempt, 8), 2*time.Second)
		if w, ok := client.RetryWait(err, attempt); !ok || w < want/2 || w > want {
			t.Errorf("the wait before retry %d: %s (retried %t); want %s-%s", attempt+1, w, ok, want/2, want)
		}
	}
	for _, retryAfter := range []time.Duration{time.Millisecond, time.Second, 2 * time.Second} {
		answered := &client.Error{Status: http.StatusServiceUnavailable, Code: httpapi.CodeUnavailable, RetryAfter: retryAfter}
		for attempt := range 20 {
			if w, ok := client.RetryWait(answered, attempt); !ok || w < retryAfter || w > retryAfter*3/2 {
				t.Errorf("the wait before retry %d after a Retry-After of %s: %s (retried %t); want %s-%s", attempt+1, retryAfter, w, ok, retryAfter, retryAfter*3/2)
				break
			}
		}
	}
	for _, retryAfter := range []time.Duration{2*time.Second + time.Millisecond, 5 * time.Second, time.Hour} {
		answered := &client.Error{Status: http.StatusServiceUnavailable, Code: httpapi.CodeUnavailable, RetryAfter: retryAfter}
		if w, ok := client.RetryWait(answered, 0); ok {
			t.Errorf("the retry after a Retry-After of %s: got one after %s, want none (above the 2s cap)", retryAfter, w)
		}
	}
}

// TestAcquireRetryWaitsTheAnswersRetryAfter: an acquire answered 503 with
// Retry-After: 1 is sent again no sooner than a second later.
func TestAcquireRetryWaitsTheAnswersRetryAfter(t *testing.T) {
	f := newFake(t)
	var mu sync.Mutex
	var sent []time.Time
	f.set(func(f *fakeLimiter) {
		f.onAcquire = func(w http.ResponseWriter, r *http.Request) bool {
			mu.Lock()
			defer mu.Unlock()
			sent = append(sent, time.Now())
			if len(sent) == 1 {
				w.Header().Set("Retry-After", "1")
				writeError(w, http.StatusServiceUnavailable, httpapi.Error{Code: httpapi.CodeUnavailable, Message: "redis did not answer in time"})
				return true
			}
			return false
		}
	})
	c := newClient(t, f.URL())
	if _, err := c.Acquire(context.Background(), "u", "free"); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(sent) != 2 {
		t.Fatalf("attempts: got %d, want 2", len(sent))
	}
	if gap := sent[1].Sub(sent[0]); gap < time.Second {
		t.Errorf("the retry came %s after the attempt answered Retry-After: 1; want at least 1s", gap)
	}
}

// TestAcquireGivesUpOnARetryAfterPastTheCap: a 503 whose Retry-After
// asks for more than the client waits between retries (2s; something in
// front of the limiter, such as a maintenance page, asking for an hour)
// ends Acquire at once with that error, instead of holding it that long
// per retry; the acquire's stream id is released, as whenever Acquire
// gives up on an unanswered attempt.
func TestAcquireGivesUpOnARetryAfterPastTheCap(t *testing.T) {
	for _, tc := range []struct {
		name       string
		retryAfter string
		attempts   int
	}{
		{name: "10s: given up at once", retryAfter: "10", attempts: 1},
		{name: "3s, just past the cap: given up at once", retryAfter: "3", attempts: 1},
		{name: "2s, the cap: waited out and retried", retryAfter: "2", attempts: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t)
			var sent atomic.Int32
			f.set(func(f *fakeLimiter) {
				f.onAcquire = func(w http.ResponseWriter, r *http.Request) bool {
					if sent.Add(1) > 1 {
						return false
					}
					w.Header().Set("Retry-After", tc.retryAfter)
					writeError(w, http.StatusServiceUnavailable, httpapi.Error{Code: httpapi.CodeUnavailable, Message: "down for maintenance"})
					return true
				}
			})
			c := newClient(t, f.URL())
			start := time.Now()
			_, err := c.Acquire(context.Background(), "u", "free")
			took := time.Since(start)
			if got := int(sent.Load()); got != tc.attempts {
				t.Errorf("attempts: got %d, want %d", got, tc.attempts)
			}
			if tc.attempts > 1 {
				if err != nil {
					t.Errorf("Acquire: got %v, want the retry's grant", err)
				}
				return
			}
			if !errors.Is(err, client.ErrUnavailable) || took > time.Second {
				t.Errorf("Acquire: got %v after %s, want ErrUnavailable at once", err, took)
			}
			f.mu.Lock()
			released := f.releases
			f.mu.Unlock()
			if released == 0 {
				t.Errorf("releases of the unanswered acquire's stream id before Acquire returned: got 0, want 1")
			}
		})
	}
}

// TestAStreamsPoolsAreFixedWhenItIsTaken: WithPools keeps the pools it is
// given, not the caller's map: a degraded lease's re-acquire, once the
// limiter answers, joins the pool key its acquire named, though the
// caller has since reused its map for another request.
func TestAStreamsPoolsAreFixedWhenItIsTaken(t *testing.T) {
	f := newFake(t)
	f.degraded = true
	var mu sync.Mutex
	var sent []map[string]string
	f.onAcquire = func(w http.ResponseWriter, r *http.Request) bool {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		var req httpapi.AcquireRequest
		if json.Unmarshal(body, &req) == nil {
			mu.Lock()
			sent = append(sent, req.Pools)
			mu.Unlock()
		}
		return false
	}
	c := newClient(t, f.URL())
	pools := map[string]string{"model": "gpt-4o"}
	if _, err := c.Acquire(context.Background(), "u1", "paid", client.WithStreamID("s"), client.WithPools(pools)); err != nil {
		t.Fatal(err)
	}
	pools["model"] = "llama-70b" // the caller's next request
	f.set(func(f *fakeLimiter) { f.degraded = false })
	for deadline := time.Now().Add(5 * time.Second); f.used("u1") != 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the degraded lease was not re-acquired")
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if got := sent[len(sent)-1]["model"]; got != "gpt-4o" {
		t.Errorf("the degraded lease's re-acquire joined model=%s; want gpt-4o, as its acquire named (acquires sent: %v)", got, sent)
	}
}

// TestARetryIsNotFreedByTheGiveBackOfTheAttemptBefore: an Acquire given
// up (its ctx cancelled) while its attempt is unanswered gives its stream
// id back in the background. The application's retry under that id, sent
// at once as docs/api.md asks, waits for that give-back (a slow one here)
// before it is sent, so that it does not free the slot the retry is
// granted: the lease holds the user's one slot, and a second stream of
// the user is refused.
func TestARetryIsNotFreedByTheGiveBackOfTheAttemptBefore(t *testing.T) {
	f := newFake(t)
	var attempts atomic.Int32
	landed := make(chan struct{})
	f.onAcquire = func(w http.ResponseWriter, r *http.Request) bool {
		if attempts.Add(1) > 1 {
			return false
		}
		// The first attempt takes the slot; its answer is lost.
		f.set(func(f *fakeLimiter) { f.slots["u1"] = map[string]bool{"req-42": true} })
		close(landed)
		hang(r)
		return true
	}
	f.onRelease = func() { time.Sleep(300 * time.Millisecond) } // slower than an acquire
	c := newClient(t, f.URL(), client.WithAcquireRetries(0))
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-landed; cancel() }()
	if _, err := c.Acquire(ctx, "u1", "free", client.WithStreamID("req-42")); !errors.Is(err, context.Canceled) {
		t.Fatalf("the Acquire given up: %v; want context.Canceled", err)
	}
	lease, err := c.Acquire(context.Background(), "u1", "free", client.WithStreamID("req-42"))
	if err != nil {
		t.Fatalf("the retry: %v; want a lease", err)
	}
	time.Sleep(400 * time.Millisecond) // past any release still on its way
	if n := f.used("u1"); n != 1 {
		t.Errorf("with the retry's lease held, the limiter holds %d slots of the user; want 1", n)
	}
	if other, err := c.Acquire(context.Background(), "u1", "free"); err == nil {
		t.Errorf("a second stream of the limit-1 user was granted (%s) while the retry's lease is held", other.StreamID())
	}
	select {
	case <-lease.Lost():
		t.Errorf("the retry's lease was lost: %v", lease.Err())
	default:
	}
}
