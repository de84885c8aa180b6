package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/linearize"
	"github.com/joishi/limiter/internal/servetest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/keys"
	"github.com/redis/rueidis"
)

// poolWaitTiers are three plans that may wait 30s for a pool key, at
// priorities 0 (low), 3 (mid) and 5 (high), each with room for 50
// streams per user, so the user's own cap never makes anyone wait. Slots
// live 10s, longer than any hold of these tests, so no member frees up by
// expiring.
const poolWaitTiers = `    - plan: low
      maxConcurrentStreams: 50
      slotTTL: 10s
      heartbeatInterval: 3s
      maxWait: 30s
    - plan: mid
      priority: 3
      maxConcurrentStreams: 50
      slotTTL: 10s
      heartbeatInterval: 3s
      maxWait: 30s
    - plan: high
      priority: 5
      maxConcurrentStreams: 50
      slotTTL: 10s
      heartbeatInterval: 3s
      maxWait: 30s
`

// poolWaitPools is the pool model with keys one, two and three capped at
// their names, waited for up to 30s. (The ticket TTL is serve's default,
// limiter.DefaultTicketTTL: the config has no setting for it.)
const poolWaitPools = `pools:
  static:
    - pool: model
      keys: {one: 1, two: 2, three: 3}
      maxWait: 30s
`

// poolWaitEnv is three `limiter serve` processes on the shared Redis
// Cluster, on a key prefix of their own, and a reader of their pool keys.
type poolWaitEnv struct {
	servers []*servetest.Process
	keys    *poolKeyReader
}

func startPoolWaitEnv(t *testing.T) *poolWaitEnv {
	t.Helper()
	prefix := "e2e-pool-wait-" + randomID() + ":"
	addrs := testenv.Cluster(t)
	return &poolWaitEnv{
		servers: startServersAtOnce(t, 3, serveConfig(addrs, prefix, poolWaitTiers)+poolWaitPools),
		keys:    newPoolKeyReader(t, addrs, prefix),
	}
}

// poolAcquire is the acquire of stream for user under plan joining the
// model pool's key, waiting up to waitMs (0: not at all).
func poolAcquire(user, plan, stream, key string, waitMs int64) httpapi.AcquireRequest {
	return httpapi.AcquireRequest{UserID: user, Plan: plan, StreamID: stream, WaitMs: waitMs, Pools: map[string]string{"model": key}}
}

// waitFor sends a waiting acquire of the model pool's key to server and
// returns where its answer arrives.
func (e *poolWaitEnv) waitFor(ctx context.Context, server int, user, plan, stream, key string) <-chan answer {
	out := make(chan answer, 1)
	go func() {
		out <- post(ctx, e.servers[server].API+httpapi.PathAcquire, poolAcquire(user, plan, stream, key, 30_000))
	}()
	return out
}

// hold takes a member of the model pool's key at once, through server.
func (e *poolWaitEnv) hold(t *testing.T, server int, user, plan, stream, key string) {
	t.Helper()
	var out httpapi.AcquireResponse
	status, _, body := call(t, httpClient, http.MethodPost, e.servers[server].API+httpapi.PathAcquire, poolAcquire(user, plan, stream, key, 0), nil)
	if err := json.Unmarshal(body, &out); status != http.StatusOK || err != nil || out.Degraded || len(out.Pools) != 1 {
		t.Fatalf("acquire %s of model=%s: %d %s, want 200 with the key counted", stream, key, status, body)
	}
}

// release releases user's stream (its user's slot and its members)
// through server.
func (e *poolWaitEnv) release(t *testing.T, server int, user, stream string) {
	t.Helper()
	var out httpapi.ReleaseResponse
	status, _, body := call(t, httpClient, http.MethodPost, e.servers[server].API+httpapi.PathRelease,
		httpapi.ReleaseRequest{UserID: user, StreamID: stream}, &out)
	if status != http.StatusOK || !out.Released {
		t.Fatalf("release %s: %d %s, want released", stream, status, body)
	}
}

// member is a stream's member of a pool key, and its ticket's id, as the
// limiter writes them: the stream id, a space, the user id.
func member(user, stream string) string { return stream + " " + user }

// poolKeyReader reads pool keys from Redis itself, as the limiter keeps
// them.
type poolKeyReader struct {
	c      rueidis.Client
	schema keys.Schema
}

func newPoolKeyReader(t *testing.T, addrs []string, prefix string) *poolKeyReader {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: addrs, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return &poolKeyReader{c: c, schema: keys.Schema{Prefix: prefix}}
}

// snapshotScript reads a pool key's live members and live tickets (first
// arrived first) in one call: one moment of the key.
//
// KEYS[1] -> the key's members (sorted set, score = expiry, Redis ms)
// KEYS[2] -> its queue (sorted set, score = arrival)
// KEYS[3] -> its tickets' expiries (sorted set, score = expiry, Redis ms)
// returns {{members}, {tickets}}
var snapshotScript = rueidis.NewLuaScriptReadOnly(`
local t = redis.call('TIME')
local now = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
local held = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
local queue = redis.call('ZRANGE', KEYS[2], 0, -1)
local live = {}
if #queue > 0 then
  local expiry = redis.call('ZMSCORE', KEYS[3], unpack(queue))
  for i, id in ipairs(queue) do
    if expiry[i] and tonumber(expiry[i]) > tonumber(now) then
      live[#live + 1] = id
    end
  end
end
return {held, live}
`)

// snapshot returns the live tickets of the model pool's key (first
// arrived first) and its live members, read at one moment.
func (r *poolKeyReader) snapshot(ctx context.Context, key string) (queue, held []string, err error) {
	slots, err := r.schema.PoolKey("model", key)
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	got, err := snapshotScript.Exec(ctx, r.c, []string{slots, keys.Queue(slots), keys.QueueExpiry(slots)}, nil).ToArray()
	if err != nil {
		return nil, nil, err
	}
	if held, err = got[0].AsStrSlice(); err != nil {
		return nil, nil, err
	}
	queue, err = got[1].AsStrSlice()
	return queue, held, err
}

// await waits up to within until the key's live tickets and members
// satisfy ok.
func (r *poolKeyReader) await(t *testing.T, key string, within time.Duration, what string, ok func(queue, held []string) bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		q, h, err := r.snapshot(context.Background(), key)
		if err == nil && ok(q, h) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("model=%s: want %s within %v, got queue %q, held %q (%v)", key, what, within, q, h, err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// awaitQueue waits up to within until the key's live tickets are want, in
// that order.
func (r *poolKeyReader) awaitQueue(t *testing.T, key string, within time.Duration, want ...string) {
	t.Helper()
	r.await(t, key, within, "queue "+quoteAll(want), func(q, _ []string) bool { return slices.Equal(q, want) })
}

func quoteAll(s []string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// noAnswer fails the test if ch holds an answer: a waiter answered before
// its turn.
func noAnswer(t *testing.T, who string, ch <-chan answer) {
	t.Helper()
	select {
	case a := <-ch:
		t.Fatalf("%s answered before its turn: %d %s (%v)", who, a.status, a.body, a.err)
	default:
	}
}

// grantedWithin waits up to within for ch's answer, which must grant
// stream after a wait, and returns when it arrived.
func grantedWithin(t *testing.T, who, stream string, ch <-chan answer, within time.Duration) time.Time {
	t.Helper()
	select {
	case a := <-ch:
		got := a.granted(t)
		if got.StreamID != stream || got.WaitedMs <= 0 || len(got.Pools) != 1 {
			t.Fatalf("%s: granted %+v, want %s after a wait, with its pool key", who, got, stream)
		}
		return a.at
	case <-time.After(within):
		t.Fatalf("%s: not granted within %v", who, within)
	}
	return time.Time{}
}

// poolRecorder records one pool key's history for linearize.CheckPools,
// on one clock, from the goroutines that drive and observe the key.
type poolRecorder struct {
	key   string // the history's name of the key: model=<key>
	limit int
	epoch time.Time

	mu         sync.Mutex
	ops        []linearize.PoolOp
	seen       map[string]bool // members observed queued or held
	unexpected []string
}

func newPoolRecorder(key string, limit int) *poolRecorder {
	return &poolRecorder{key: "model=" + key, limit: limit, epoch: time.Now(), seen: map[string]bool{}}
}

func (r *poolRecorder) ns(at time.Time) int64 { return at.Sub(r.epoch).Nanoseconds() }

// op is an operation of the key over [call, ret].
func (r *poolRecorder) op(kind linearize.QueueKind, m string, call, ret time.Time) linearize.PoolOp {
	return linearize.PoolOp{Key: r.key, Limit: r.limit, Kind: kind, Member: m, Call: r.ns(call), Return: r.ns(ret)}
}

func (r *poolRecorder) add(ops ...linearize.PoolOp) {
	r.mu.Lock()
	r.ops = append(r.ops, ops...)
	r.mu.Unlock()
}

// odd records an answer a healthy cluster does not give.
func (r *poolRecorder) odd(format string, args ...any) {
	r.mu.Lock()
	r.unexpected = append(r.unexpected, fmt.Sprintf(format, args...))
	r.mu.Unlock()
}

func (r *poolRecorder) history() []linearize.PoolOp {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ops)
}

// observe reads key through reader back to back until ctx ends,
// recording each read; the returned channel closes when it has stopped.
func (r *poolRecorder) observe(ctx context.Context, reader *poolKeyReader, key string) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			call := time.Now()
			q, held, err := reader.snapshot(context.Background(), key)
			ret := time.Now()
			if err != nil {
				r.odd("reading model=%s: %v", key, err)
			} else {
				o := r.op(linearize.Observe, "", call, ret)
				o.Queue, o.Held = q, held
				r.mu.Lock()
				r.ops = append(r.ops, o)
				for _, m := range q {
					r.seen[m] = true
				}
				for _, m := range held {
					r.seen[m] = true
				}
				r.mu.Unlock()
			}
			time.Sleep(time.Millisecond)
		}
	}()
	return done
}

// awaitSeen waits up to within until member has been observed queued or
// held, or answered closes; false when neither happened in time.
func (r *poolRecorder) awaitSeen(m string, answered <-chan struct{}, within time.Duration) bool {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		r.mu.Lock()
		seen := r.seen[m]
		r.mu.Unlock()
		select {
		case <-answered:
			return true
		default:
		}
		if seen {
			return true
		}
		time.Sleep(200 * time.Microsecond)
	}
	return false
}
