package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/linearize"
	"github.com/joishi/limiter/pkg/httpapi"
)

// faultTiers renders the fault tests' plans with one TTL and heartbeat
// interval: solo (1 stream, Open), duo (2, Closed), trio (3, Open).
func faultTiers(ttl, interval time.Duration) string {
	var b bytes.Buffer
	for _, p := range faultPlans {
		mode := "Open"
		if p.closed {
			mode = "Closed"
		}
		fmt.Fprintf(&b, "    - plan: %s\n      maxConcurrentStreams: %d\n      slotTTL: %s\n      heartbeatInterval: %s\n      failureMode: %s\n",
			p.name, p.limit, ttl, interval, mode)
	}
	return b.String()
}

var faultPlans = []struct {
	name   string
	limit  int
	closed bool
}{
	{"solo", 1, false},
	{"duo", 2, true},
	{"trio", 3, false},
}

// loadUser is one user of a load run.
type loadUser struct {
	id     string
	plan   string
	limit  int
	closed bool // the plan fails closed
}

// loadUsers returns n users cycling through faultPlans.
func loadUsers(prefix string, n int) []loadUser {
	users := make([]loadUser, n)
	for i := range users {
		p := faultPlans[i%len(faultPlans)]
		users[i] = loadUser{id: fmt.Sprintf("%s%d", prefix, i), plan: p.name, limit: p.limit, closed: p.closed}
	}
	return users
}

type opKind int

const (
	opAcquire opKind = iota
	opHeartbeat
	opRelease
)

func (k opKind) String() string {
	return [...]string{"acquire", "heartbeat", "release"}[k]
}

// opRecord is one HTTP call of a load run, as its caller saw it.
type opRecord struct {
	user      int // index in loadRun.users
	worker    int
	kind      opKind
	stream    string
	call, ret time.Time
	status    int  // 0: no answer (transport error or client timeout)
	ok        bool // granted, alive, released
	degraded  bool
	expiresAt time.Time // of a 200 acquire or heartbeat
	err       string    // why status is 0
	// cut: the call was cancelled because the run ended; it says nothing
	// about Redis.
	cut bool
}

// answered reports whether the call got a definite answer from Redis: a
// 200 that is not degraded, a 429 or a 410 (or was cut by the run's end).
func (o opRecord) answered() bool {
	if o.cut {
		return true
	}
	switch o.status {
	case http.StatusOK:
		return !o.degraded
	case http.StatusTooManyRequests, http.StatusGone:
		return true
	}
	return false
}

// hold is one stream a worker believed it held: from the grant's answer
// until it called release, was told slot_lost, or the run ended.
type hold struct {
	user       int
	stream     string
	start, end time.Time
	degraded   bool // granted degraded (uncounted)
	// lost: a heartbeat answered 410. early: the 410 came before the
	// expiry the last acknowledged answer gave (minus slack), so Redis
	// lost a slot it had acknowledged, rather than the slot expiring.
	lost, early bool
}

// loadRun drives steady acquire/heartbeat/release traffic from many users
// through several serve processes, over raw HTTP, and records every call.
type loadRun struct {
	servers  []string // API base URLs
	users    []loadUser
	ttl      time.Duration // slot TTL of every plan
	interval time.Duration // heartbeat interval
	// workers per user; 0: limit+1.
	workers int
	// holdMin and holdMax bound how long a worker streams. Default
	// 0.5s-2.5s.
	holdMin, holdMax time.Duration
	hc               *http.Client
	base             time.Time // the origin of linearize timestamps

	mu    sync.Mutex
	ops   []opRecord
	holds []hold
}

func newLoadRun(servers []string, users []loadUser, ttl, interval time.Duration) *loadRun {
	return &loadRun{
		servers: servers, users: users, ttl: ttl, interval: interval,
		holdMin: 500 * time.Millisecond, holdMax: 2500 * time.Millisecond,
		hc:   &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}},
		base: time.Now(),
	}
}

// run starts the workers (by default limit+1 per user, so users contend
// for their slots) and returns once ctx ends and every worker has released
// what it held.
func (r *loadRun) run(ctx context.Context) {
	var wg sync.WaitGroup
	worker := 0
	for u, user := range r.users {
		n := r.workers
		if n == 0 {
			n = user.limit + 1
		}
		for range n {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				r.work(ctx, u, w)
			}(worker)
			worker++
		}
	}
	wg.Wait()
	r.hc.CloseIdleConnections()
}

// work is one worker: acquire a fresh stream id; on a grant, stream for
// holdMin-holdMax heartbeating every interval, then release (unless told
// slot_lost); on anything else, back off briefly and try again.
func (r *loadRun) work(ctx context.Context, u, w int) {
	for seq := 0; ctx.Err() == nil; seq++ {
		stream := fmt.Sprintf("w%d-%d", w, seq)
		got := r.call(ctx, u, w, opAcquire, stream)
		if got.status != http.StatusOK || !got.ok {
			sleepCtx(ctx, 50*time.Millisecond+rand.N(100*time.Millisecond))
			continue
		}
		h := hold{user: u, stream: stream, start: got.ret, degraded: got.degraded}
		expires := got.expiresAt
		end := time.Now().Add(r.holdMin + rand.N(r.holdMax-r.holdMin))
		for !h.lost {
			next := time.Now().Add(r.interval)
			if next.After(end) {
				sleepCtx(ctx, time.Until(end))
				break
			}
			if !sleepCtx(ctx, r.interval) {
				break
			}
			beat := r.call(ctx, u, w, opHeartbeat, stream)
			switch {
			case beat.status == http.StatusGone:
				h.lost, h.end = true, beat.ret
				h.early = beat.call.Before(expires.Add(-200 * time.Millisecond))
			case beat.status == http.StatusOK && !beat.degraded:
				expires = beat.expiresAt
			}
		}
		if !h.lost {
			// The stream ends when its holder decides to release.
			h.end = time.Now()
			relCtx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			r.call(relCtx, u, w, opRelease, stream)
			cancel()
		}
		r.mu.Lock()
		r.holds = append(r.holds, h)
		r.mu.Unlock()
	}
}

// call makes one API call for user u's stream through a random server and
// records it.
func (r *loadRun) call(ctx context.Context, u, w int, kind opKind, stream string) opRecord {
	user := r.users[u]
	rec := opRecord{user: u, worker: w, kind: kind, stream: stream}
	var path string
	var body any
	switch kind {
	case opAcquire:
		path, body = httpapi.PathAcquire, httpapi.AcquireRequest{UserID: user.id, Plan: user.plan, StreamID: stream}
	case opHeartbeat:
		path, body = httpapi.PathHeartbeat, httpapi.HeartbeatRequest{UserID: user.id, Plan: user.plan, StreamID: stream}
	case opRelease:
		path, body = httpapi.PathRelease, httpapi.ReleaseRequest{UserID: user.id, StreamID: stream}
	}
	data, _ := json.Marshal(body)
	server := r.servers[rand.IntN(len(r.servers))]
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, server+path, bytes.NewReader(data))
	req.Header.Set("Content-Type", "application/json")
	rec.call = time.Now()
	resp, err := r.hc.Do(req)
	if err != nil {
		rec.err, rec.cut = err.Error(), ctx.Err() != nil
	} else {
		rec.status = resp.StatusCode
		answer, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			var out struct {
				Granted   bool      `json:"granted"`
				Alive     bool      `json:"alive"`
				Released  bool      `json:"released"`
				Degraded  bool      `json:"degraded"`
				ExpiresAt time.Time `json:"expires_at"`
			}
			if err := json.Unmarshal(answer, &out); err != nil {
				rec.status, rec.err = 0, fmt.Sprintf("200 %q: %v", answer, err)
			}
			rec.ok = out.Granted || out.Alive || out.Released
			rec.degraded, rec.expiresAt = out.Degraded, out.ExpiresAt
		}
	}
	rec.ret = time.Now()
	r.mu.Lock()
	r.ops = append(r.ops, rec)
	r.mu.Unlock()
	return rec
}

// sleepCtx sleeps d or until ctx ends; it reports whether it slept d.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// overAdmission is what a run's holds say about P2.
type overAdmission struct {
	maxExcess int // most streams held above a user's limit at one instant
	// excessSeconds integrates the streams held above the limit over time.
	excessSeconds float64
	// unexplained counts instants where the excess was larger than the
	// held streams that were granted degraded or later found lost: over-
	// admission outside any named window.
	unexplained int
	example     string
	// explainedBy are the degraded or lost holds that overlapped an
	// instant of excess; their grants must lie in a fault window.
	explainedBy []hold
}

// overAdmitted sweeps every user's holds in time order.
func (r *loadRun) overAdmitted() overAdmission {
	r.mu.Lock()
	defer r.mu.Unlock()
	var oa overAdmission
	byUser := map[int][]hold{}
	for _, h := range r.holds {
		byUser[h.user] = append(byUser[h.user], h)
	}
	for u, holds := range byUser {
		limit := r.users[u].limit
		type event struct {
			at    time.Time
			start bool
			h     int
		}
		var events []event
		for i, h := range holds {
			events = append(events, event{h.start, true, i}, event{h.end, false, i})
		}
		// Ends before starts at the same instant: a hold that ends when
		// another begins does not overlap it.
		sort.Slice(events, func(i, j int) bool {
			if !events[i].at.Equal(events[j].at) {
				return events[i].at.Before(events[j].at)
			}
			return !events[i].start && events[j].start
		})
		active := map[int]bool{}
		var last time.Time
		explained := map[int]bool{}
		for _, e := range events {
			if excess := len(active) - limit; excess > 0 {
				oa.excessSeconds += float64(excess) * e.at.Sub(last).Seconds()
			}
			last = e.at
			if !e.start {
				delete(active, e.h)
				continue
			}
			active[e.h] = true
			excess := len(active) - limit
			if excess <= 0 {
				continue
			}
			oa.maxExcess = max(oa.maxExcess, excess)
			windowed := 0
			for i := range active {
				if holds[i].degraded || holds[i].lost {
					windowed++
					if !explained[i] {
						explained[i] = true
						oa.explainedBy = append(oa.explainedBy, holds[i])
					}
				}
			}
			if excess > windowed {
				oa.unexplained++
				if oa.example == "" {
					oa.example = fmt.Sprintf("user %s (limit %d) held %d streams at %s, only %d of them degraded or lost",
						r.users[u].id, limit, len(active), e.at.Format(time.StampMilli), windowed)
				}
			}
		}
	}
	return oa
}

// degradedAcquires counts the acquires answered 200 degraded.
func (r *loadRun) degradedAcquires() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, o := range r.ops {
		if o.kind == opAcquire && o.status == http.StatusOK && o.degraded {
			n++
		}
	}
	return n
}

// callStats are counts of a run's calls by outcome.
type callStats struct {
	total, granted, denied, degraded, unavailable, lost, transport, cut, other int
}

func (r *loadRun) stats() callStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	var s callStats
	for _, o := range r.ops {
		s.total++
		switch {
		case o.cut:
			s.cut++
		case o.status == 0:
			s.transport++
		case o.status == http.StatusOK && o.degraded:
			s.degraded++
		case o.status == http.StatusOK && o.kind == opAcquire:
			s.granted++
		case o.status == http.StatusOK:
		case o.status == http.StatusTooManyRequests:
			s.denied++
		case o.status == http.StatusGone:
			s.lost++
		case o.status == http.StatusServiceUnavailable:
			s.unavailable++
		default:
			s.other++
		}
	}
	return s
}

// lastUnanswered returns the return time of the latest call of a user
// whose plan fails closed (or not) without a definite answer from Redis
// (degraded, 503, transport error), or the zero time.
func (r *loadRun) lastUnanswered(closed bool) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	var last time.Time
	for _, o := range r.ops {
		if r.users[o.user].closed == closed && !o.answered() && o.ret.After(last) {
			last = o.ret
		}
	}
	return last
}

// records returns a copy of the calls made so far.
func (r *loadRun) records() []opRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]opRecord(nil), r.ops...)
}

// history returns the run's calls for linearize.Check; fragile marks the
// calls that ran before the end of a fault window that may lose writes.
func (r *loadRun) history(fragile func(opRecord) bool) []linearize.Op {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]linearize.Op, len(r.ops))
	for i, o := range r.ops {
		user := r.users[o.user]
		op := linearize.Op{
			User: user.id, Limit: user.limit, TTL: r.ttl.Nanoseconds(), Stream: o.stream,
			Call: o.call.Sub(r.base).Nanoseconds(), Return: o.ret.Sub(r.base).Nanoseconds(),
			Result: linearize.Unknown,
		}
		switch o.kind {
		case opAcquire:
			op.Kind = linearize.Acquire
		case opHeartbeat:
			op.Kind = linearize.Heartbeat
		case opRelease:
			op.Kind = linearize.Release
		}
		switch {
		case o.status == http.StatusOK && !o.degraded:
			op.Result = linearize.No
			if o.ok {
				op.Result = linearize.Yes
			}
		case o.status == http.StatusTooManyRequests, o.status == http.StatusGone:
			op.Result = linearize.No
		}
		if fragile != nil {
			op.Fragile = fragile(o)
		}
		out[i] = op
	}
	return out
}

// metricSum adds the samples of series over the servers' /metrics.
func metricSum(t *testing.T, samples []map[string]float64, series func(string) bool) float64 {
	t.Helper()
	var sum float64
	for _, s := range samples {
		for name, v := range s {
			if series(name) {
				sum += v
			}
		}
	}
	return sum
}

// logUserHistory logs every call of user, in call order, times relative to
// at: what to read when a check fails.
func logUserHistory(t *testing.T, r *loadRun, user string, at time.Time) {
	t.Helper()
	var lines []string
	for _, o := range r.records() {
		if r.users[o.user].id != user {
			continue
		}
		lines = append(lines, fmt.Sprintf("%+8dms %+8dms w%-3d %-9s %-8s status %d ok %v degraded %v",
			o.call.Sub(at).Milliseconds(), o.ret.Sub(at).Milliseconds(), o.worker, o.kind, o.stream, o.status, o.ok, o.degraded))
	}
	sort.Strings(lines)
	t.Logf("calls of %s (ms from the fault):\n%s", user, strings.Join(lines, "\n"))
}
