package server_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/telemetry"
	"github.com/joishi/limiter/pkg/tiers"
	"go.opentelemetry.io/otel/metric/noop"
)

// asyncAs is as, from a goroutine of its own (which must not fail the
// test): where its answer arrives.
func (e *authEnv) asyncAs(t *testing.T, token, path string, body any) <-chan asyncReply {
	data := mustJSON(t, body)
	out := make(chan asyncReply, 1)
	go func() {
		req, err := http.NewRequest("POST", e.url+path, bytes.NewReader(data))
		if err != nil {
			out <- asyncReply{err: err}
			return
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := e.client.Do(req)
		if err != nil {
			out <- asyncReply{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		out <- asyncReply{reply: reply{status: resp.StatusCode, header: resp.Header, body: b}, err: err}
	}()
	return out
}

// A reload of the API tokens file that revokes a caller, its token or
// the plan while its acquire waits ends that wait: the acquire is refused
// (401, or 403 for the plan), holds no slot and no place in the queue,
// and a caller still in force waiting behind it is granted the next slot.
func TestAWaitingAcquireOfARevokedCallerIsNotGranted(t *testing.T) {
	const (
		before  = "chat " + chatToken + " *\nbatch " + batchToken + " *\n"
		rotated = "chat-rotated-0123456789abcdef"
	)
	cases := []struct {
		name    string
		rewrite string // the tokens file rewritten while chat's acquire waits
		status  int
		code    string
		message string
	}{
		{"the caller is removed", "batch " + batchToken + " *\n", http.StatusUnauthorized, httpapi.CodeUnauthenticated, `caller "chat" was revoked`},
		{"the caller's token is rotated", "chat " + rotated + " *\nbatch " + batchToken + " *\n", http.StatusUnauthorized, httpapi.CodeUnauthenticated, `caller "chat" was revoked`},
		{"the caller's plan is withdrawn", "chat " + chatToken + " no-wait\nbatch " + batchToken + " *\n", http.StatusForbidden, httpapi.CodePlanNotAllowed, `caller "chat" may no longer use plan "wait"`},
	}
	for _, backend := range []limitertest.Backend{limitertest.Standalone, limitertest.RedisCluster} {
		for _, tc := range cases {
			t.Run(backend.String()+"/"+tc.name, func(t *testing.T) {
				path := writeCallers(t, before)
				e, callers := newAuthEnvOf(t, path, 10*time.Millisecond, limitertest.Options{Backend: backend, Tiers: waitTiers()})
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan struct{})
				go func() { defer close(done); callers.Watch(ctx) }()
				t.Cleanup(func() { cancel(); <-done })

				user := newUser(t)
				acquire := func(stream string) httpapi.AcquireRequest {
					return httpapi.AcquireRequest{UserID: user, Plan: "wait", StreamID: stream, WaitMs: 5000}
				}
				decode[httpapi.AcquireResponse](t, e.as(t, batchToken, "POST", httpapi.PathAcquire, httpapi.AcquireRequest{UserID: user, Plan: "wait", StreamID: "first"}), http.StatusOK)
				revoked := e.asyncAs(t, chatToken, httpapi.PathAcquire, acquire("revoked"))
				queued(t, e, user, 1)
				beside := e.asyncAs(t, batchToken, httpapi.PathAcquire, acquire("beside"))
				queued(t, e, user, 2)

				rewriteCallers(t, path, tc.rewrite)
				// The wait ends at the reload, not at its 5s end, and with
				// the slot still held: nothing was granted to it.
				var r reply
				select {
				case got := <-revoked:
					r = got.get(t)
				case <-time.After(3 * time.Second):
					t.Fatal("the revoked caller's acquire still waits 3s after the rewrite, want its wait ended at the reload")
				}
				got := wantError(t, r, tc.status, tc.code)
				if !strings.Contains(got.Message, tc.message) {
					t.Errorf("message %q, want it to say %q", got.Message, tc.message)
				}
				if challenge := r.header.Get("WWW-Authenticate"); (tc.status == http.StatusUnauthorized) != (challenge != "") {
					t.Errorf("WWW-Authenticate %q on a %d", challenge, tc.status)
				}
				queued(t, e, user, 1) // beside's ticket alone
				decode[httpapi.ReleaseResponse](t, e.as(t, batchToken, "POST", httpapi.PathRelease, httpapi.ReleaseRequest{UserID: user, StreamID: "first"}), http.StatusOK)
				granted := decode[httpapi.AcquireResponse](t, (<-beside).get(t), http.StatusOK)
				if !granted.Granted || granted.StreamID != "beside" {
					t.Errorf("the caller in force waiting beside: got %+v, want granted", granted)
				}
				slots, err := e.lim.Slots(context.Background(), user)
				if err != nil {
					t.Fatal(err)
				}
				if slots.Used != 1 || len(slots.Slots) != 1 || slots.Slots[0].StreamID != "beside" || len(slots.Queue) != 0 {
					t.Errorf("user's slots %+v, queue %+v: want beside's slot alone, nothing queued", slots.Slots, slots.Queue)
				}
			})
		}
	}
}

// queued waits until user's queue holds n tickets.
func queued(t *testing.T, e *authEnv, user string, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		got, err := e.lim.Slots(context.Background(), user)
		if err == nil && len(got.Queue) == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue %+v, %v: want %d tickets", got.Queue, err, n)
		}
	}
}

// rewriteCallers replaces the tokens file at path with content, as a
// Secret update does: a new file renamed over it, with an mtime of its own.
func rewriteCallers(t *testing.T, path, content string) {
	t.Helper()
	if err := replaceCallers(path, content); err != nil {
		t.Fatal(err)
	}
}

// replaceCallers is rewriteCallers, for a goroutine other than the test's.
func replaceCallers(path, content string) error {
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		return err
	}
	stamp := time.Now().Add(time.Hour)
	if err := os.Chtimes(tmp, stamp, stamp); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// TestARevokedWaitersExtensionLeavesTheHeldStreamsSlot: a waiting
// acquire of a stream its caller holds already (taken by another request
// of it under a larger plan while the ticket waited, which wakes it) is
// granted as an extension of that stream's slot. When a reload of the
// API tokens file revokes the caller as that grant comes, before its wait
// could be ended, the acquire is refused 401, but the slot it extended is
// the running stream's, not this request's alone: it stays held, to its
// TTL, as the revoked caller's other slots do.
func TestARevokedWaitersExtensionLeavesTheHeldStreamsSlot(t *testing.T) {
	const (
		before = "chat " + chatToken + " *\nbatch " + batchToken + " *\n"
		after  = "batch " + batchToken + " *\n" // chat removed
	)
	tiersOf := []tiers.Tier{
		{Plan: "pair", MaxConcurrentStreams: 2, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailOpen, MaxWait: 5 * time.Second},
		{Plan: "wide", MaxConcurrentStreams: 3, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailOpen},
	}
	for _, backend := range []limitertest.Backend{limitertest.Standalone, limitertest.RedisCluster} {
		t.Run(backend.String(), func(t *testing.T) {
			path := writeCallers(t, before)
			observer := &revokeAtExtension{revoke: make(chan func() error, 1), done: make(chan error, 1)}
			e, callers := newAuthEnvOf(t, path, 10*time.Millisecond, limitertest.Options{Backend: backend, Tiers: tiersOf,
				NewObserver: func(table *tiers.Table) (limiter.Observer, error) {
					base, err := telemetry.NewObserver(noop.NewMeterProvider(), table, telemetry.ObserverOptions{})
					observer.Observer = base
					return observer, err
				}})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); callers.Watch(ctx) }()
			t.Cleanup(func() { cancel(); <-done })

			user := newUser(t)
			for _, held := range []string{"first", "second"} {
				decode[httpapi.AcquireResponse](t, e.as(t, batchToken, "POST", httpapi.PathAcquire, httpapi.AcquireRequest{UserID: user, Plan: "pair", StreamID: held}), http.StatusOK)
			}
			waiting := e.asyncAs(t, chatToken, httpapi.PathAcquire, httpapi.AcquireRequest{UserID: user, Plan: "pair", StreamID: "running", WaitMs: 5000})
			queued(t, e, user, 1)

			// The next extension granted after a wait revokes chat first:
			// the grant came as the reload did.
			observer.revoke <- func() error {
				if err := replaceCallers(path, after); err != nil {
					return err
				}
				for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
					if _, err := callers.Authenticate(nil, "Bearer "+chatToken); err != nil {
						return nil
					}
				}
				return errors.New("chat's token still in force 3s after the rewrite")
			}
			// Another request of the stream takes its slot under the larger
			// plan, past the waiting ticket (whose own limit is reached),
			// and wakes it: the waiting request shares the held slot, an
			// extension granted after its wait.
			running := decode[httpapi.AcquireResponse](t, e.as(t, chatToken, "POST", httpapi.PathAcquire, httpapi.AcquireRequest{UserID: user, Plan: "wide", StreamID: "running"}), http.StatusOK)
			if !running.Granted || running.Used != 3 {
				t.Fatalf("the running stream's acquire: got %+v, want granted, 3 used", running)
			}
			var r reply
			select {
			case got := <-waiting:
				r = got.get(t)
			case <-time.After(5 * time.Second):
				t.Fatal("the waiting acquire not answered 5s after the releases")
			}
			select {
			case err := <-observer.done:
				if err != nil {
					t.Fatal(err)
				}
			default:
				t.Fatalf("the waiting acquire answered %d %s without being granted an extension", r.status, r.body)
			}
			got := wantError(t, r, http.StatusUnauthorized, httpapi.CodeUnauthenticated)
			if !strings.Contains(got.Message, `caller "chat" was revoked`) {
				t.Errorf("message %q, want it to say the caller was revoked", got.Message)
			}
			slots, err := e.lim.Slots(context.Background(), user)
			if err != nil {
				t.Fatal(err)
			}
			held := map[string]time.Duration{}
			for _, s := range slots.Slots {
				held[s.StreamID] = s.TTL
			}
			if left, ok := held["running"]; slots.Used != 3 || !ok || len(slots.Queue) != 0 {
				t.Fatalf("user's slots %+v, queue %+v: want first, second and the running stream's, nothing queued", slots.Slots, slots.Queue)
			} else if left < 5*time.Second {
				t.Errorf("the running stream's slot expires in %s, want its TTL (10s) from the extension", left)
			}
		})
	}
}

// revokeAtExtension is an Observer that, at the first grant of an
// extension after a wait once armed (revoke), runs revoke before the
// handler sees the grant, and sends its error on done. (An Observer must
// not block; this one does, once, to order the grant before the reload's
// check of it.)
type revokeAtExtension struct {
	limiter.Observer
	revoke chan func() error
	done   chan error
}

func (o *revokeAtExtension) Acquired(ctx context.Context, tier tiers.Tier, res limiter.AcquireResult, err error) {
	o.Observer.Acquired(ctx, tier, res, err)
	if err != nil || !res.Granted || !res.Extended || res.Waited == 0 {
		return
	}
	select {
	case revoke := <-o.revoke:
		o.done <- revoke()
	default:
	}
}

// waitLog is an Observer that records how waits ended, in users' queues
// and pool keys' queues, and counts the acquires waiting now; the rest
// goes to the Observer it wraps.
type waitLog struct {
	limiter.Observer
	waiting atomic.Int64
	mu      sync.Mutex
	ended   []string // "user <outcome>" or "pool <outcome>", in order
}

func (l *waitLog) Waiting(ctx context.Context, tier tiers.Tier, delta int) {
	l.Observer.Waiting(ctx, tier, delta)
	l.waiting.Add(int64(delta))
}

func (l *waitLog) PoolWaiting(ctx context.Context, pool string, priority, delta int) {
	l.Observer.PoolWaiting(ctx, pool, priority, delta)
	l.waiting.Add(int64(delta))
}

func (l *waitLog) Waited(ctx context.Context, tier tiers.Tier, outcome limiter.WaitOutcome, took time.Duration) {
	l.Observer.Waited(ctx, tier, outcome, took)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ended = append(l.ended, "user "+string(outcome))
}

func (l *waitLog) PoolWaited(ctx context.Context, pool string, priority int, outcome limiter.WaitOutcome, took time.Duration) {
	l.Observer.PoolWaited(ctx, pool, priority, outcome, took)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ended = append(l.ended, "pool "+string(outcome))
}

func (l *waitLog) endedSoFar() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.ended)
}

// A wait that a reload of the API tokens file ends, its caller revoked,
// is counted revoked, in the user's queue and in a pool key's: not
// cancelled, which says the client went away.
func TestAWaitOfARevokedCallerIsCountedRevoked(t *testing.T) {
	const before = "chat " + chatToken + " *\nbatch " + batchToken + " *\n"
	cases := []struct {
		name  string
		pools map[string]string // of the acquires: the held one, and the waiting one
		want  string
	}{
		{"in the user's queue", nil, "user revoked"},
		{"in a pool key's queue", map[string]string{"model": "gpt-4o"}, "pool revoked"},
	}
	for _, backend := range []limitertest.Backend{limitertest.Standalone, limitertest.RedisCluster} {
		for _, tc := range cases {
			t.Run(backend.String()+"/"+tc.name, func(t *testing.T) {
				table := pools.NewTable()
				if err := table.Replace([]pools.Pool{pools.Pool{Pool: "model", Keys: map[string]int{"gpt-4o": 1}, MaxWait: 5 * time.Second}.WithDefaults()}); err != nil {
					t.Fatal(err)
				}
				log := &waitLog{}
				path := writeCallers(t, before)
				e, callers := newAuthEnvOf(t, path, 10*time.Millisecond, limitertest.Options{Backend: backend, Tiers: waitTiers(), Limiter: limiter.Options{Pools: table},
					NewObserver: func(table *tiers.Table) (limiter.Observer, error) {
						base, err := telemetry.NewObserver(noop.NewMeterProvider(), table, telemetry.ObserverOptions{})
						log.Observer = base
						return log, err
					}})
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan struct{})
				go func() { defer close(done); callers.Watch(ctx) }()
				t.Cleanup(func() { cancel(); <-done })

				holder, waiter := newUser(t), newUser(t)
				if tc.pools == nil {
					waiter = holder // the user's one slot is held: the wait is in the user's queue
				}
				decode[httpapi.AcquireResponse](t, e.as(t, batchToken, "POST", httpapi.PathAcquire, httpapi.AcquireRequest{UserID: holder, Plan: "wait", Pools: tc.pools}), http.StatusOK)
				revoked := e.asyncAs(t, chatToken, httpapi.PathAcquire, httpapi.AcquireRequest{UserID: waiter, Plan: "wait", Pools: tc.pools, WaitMs: 5000})
				for deadline := time.Now().Add(5 * time.Second); log.waiting.Load() != 1; time.Sleep(5 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatalf("%d acquires waiting 5s on, want 1", log.waiting.Load())
					}
				}

				rewriteCallers(t, path, "batch "+batchToken+" *\n")
				select {
				case got := <-revoked:
					wantError(t, got.get(t), http.StatusUnauthorized, httpapi.CodeUnauthenticated)
				case <-time.After(3 * time.Second):
					t.Fatal("the revoked caller's acquire still waits 3s after the rewrite, want its wait ended at the reload")
				}
				if got := log.endedSoFar(); !slices.Equal(got, []string{tc.want}) {
					t.Errorf("waits ended %q, want %q", got, tc.want)
				}
			})
		}
	}
}
