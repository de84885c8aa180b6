package proxy_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/identity"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/proxy"
	"github.com/joishi/limiter/pkg/tiers"
)

// waitOne is a plan of one stream whose requests may wait 10s for it.
var waitOne = tiers.Tier{Plan: "wait-one", MaxConcurrentStreams: 1, SlotTTL: time.Second, HeartbeatInterval: 300 * time.Millisecond,
	FailureMode: tiers.FailOpen, MaxWait: 10 * time.Second}

// rawRequest sends method to the proxy on a connection of its own, with
// body (none when empty) and the headers given as "Name: value" lines,
// and returns the connection, whose closing is the client leaving.
func rawRequest(t *testing.T, e *env, method, user, body string, headers ...string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", e.proxy.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-User-Id: %s\r\nX-Plan: wait-one\r\n", method, user)
	for _, h := range headers {
		b.WriteString(h + "\r\n")
	}
	if body != "" {
		fmt.Fprintf(&b, "Content-Type: application/json\r\nContent-Length: %d\r\n", len(body))
	}
	b.WriteString("\r\n" + body)
	if _, err := io.WriteString(conn, b.String()); err != nil {
		t.Fatal(err)
	}
	return conn
}

// orgWaitEnv is a proxy whose requests join org (the X-Org header), whose
// key acme caps 1 stream and may be waited for 10s, with ana's stream,
// of plan wait-one, holding org=acme until endAna.
func orgWaitEnv(t *testing.T) (e *env, up *sse, ana string, endAna context.CancelFunc) {
	t.Helper()
	table := pools.NewTable()
	if err := table.Replace([]pools.Pool{pools.Pool{Pool: "org", Keys: map[string]int{"acme": 1}, MaxWait: 10 * time.Second}.WithDefaults()}); err != nil {
		t.Fatal(err)
	}
	sources, err := identity.ParsePoolSources(map[string]string{"org": "header:X-Org"})
	if err != nil {
		t.Fatal(err)
	}
	up = newSSE()
	e = newEnv(t, up, envOptions{
		stack:    limitertest.Options{Tiers: append(limitertest.Tiers(), waitOne), Limiter: limiter.Options{Pools: table}},
		identity: identity.Options{Pools: sources},
		wait:     10 * time.Second,
	})
	ana = newUser()
	ctx, endAna := context.WithCancel(context.Background())
	t.Cleanup(endAna)
	req := e.request(t, ctx, "GET", "/v1/chat/completions", ana, "wait-one", nil)
	req.Header.Set("X-Org", "acme")
	first := e.do(t, req)
	t.Cleanup(func() { first.Body.Close() })
	<-up.started
	return e, up, ana, endAna
}

// A request waiting for the user's slot (proxy.wait) whose client leaves
// gives its place up at once, with a body as without: net/http notices a
// client leaving only once the request's body is read, so the proxy reads
// it before it waits. Left unread, the place was kept to the end of the
// wait, and the slot, once free, went to the request of nobody, forwarded
// upstream.
func TestAWaitingClientThatLeavesLeavesTheQueue(t *testing.T) {
	for _, tc := range []struct{ method, body string }{{"GET", ""}, {"POST", `{"stream":true}`}} {
		t.Run(tc.method, func(t *testing.T) {
			up := newSSE()
			e := newEnv(t, up, envOptions{stack: limitertest.Options{Tiers: append(limitertest.Tiers(), waitOne)}, wait: 10 * time.Second})
			user := newUser()
			ctx, endFirst := context.WithCancel(context.Background())
			defer endFirst()
			first := e.do(t, e.request(t, ctx, "GET", "/v1/chat/completions", user, "wait-one", nil))
			defer first.Body.Close()
			<-up.started

			conn := rawRequest(t, e, tc.method, user, tc.body)
			e.AwaitQueue(t, user, 1, 5*time.Second)
			conn.Close()
			e.AwaitQueue(t, user, 0, time.Second)
			endFirst()
			select {
			case r := <-up.started:
				t.Errorf("a %s whose client left while it waited reached the upstream", r.Method)
			case <-time.After(time.Second):
			}
			e.AwaitUsed(t, user, 0, 5*time.Second)
		})
	}
}

// The same for a request waiting for a pool key: its user's slot, taken
// before the wait, is not kept alive for a client that left.
func TestAClientWaitingForAPoolKeyThatLeavesLeavesIt(t *testing.T) {
	e, up, _, endAna := orgWaitEnv(t)
	bo := newUser()

	conn := rawRequest(t, e, "POST", bo, `{"stream":true}`, "X-Org: acme")
	waiters := func() int {
		got, err := e.Stack.Limiter.PoolSlots(context.Background(), "org", "acme")
		if err != nil {
			t.Fatal(err)
		}
		return len(got.Waiters)
	}
	for deadline := time.Now().Add(5 * time.Second); waiters() != 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("bo's request never waited for org=acme")
		}
	}
	conn.Close()
	e.AwaitUsed(t, bo, 0, time.Second)
	if n := waiters(); n != 0 {
		t.Errorf("after bo's client left, org=acme has %d waiters, want 0", n)
	}
	endAna()
	select {
	case r := <-up.started:
		t.Errorf("bo's %s, whose client left while it waited, reached the upstream", r.Method)
	case <-time.After(time.Second):
	}
}

// A body the proxy cannot hold (over proxy.maxBodyBytes) is not read
// ahead: such a request does not wait, and is refused at once when the
// user's slot is taken, or, granted, goes upstream byte for byte. One the
// proxy read ahead goes upstream whole too, once it is granted.
func TestWhatIsReadBeforeAWaitGoesUpstream(t *testing.T) {
	bodies := make(chan string, 4)
	up := newSSE()
	e := newEnv(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		bodies <- string(b)
		up.ServeHTTP(w, r)
	}), envOptions{
		stack: limitertest.Options{Tiers: append(limitertest.Tiers(), waitOne)},
		proxy: proxy.Options{MaxBodyBytes: 2048},
		wait:  10 * time.Second,
	})
	user := newUser()
	big := `{"messages":"` + strings.Repeat("x", 4096) + `"}`
	ctx, endFirst := context.WithCancel(context.Background())
	defer endFirst()
	first := e.do(t, e.request(t, ctx, "POST", "/v1/chat/completions", user, "wait-one", strings.NewReader(big)))
	defer first.Body.Close()
	<-up.started
	if got := <-bodies; got != big {
		t.Errorf("the upstream read %d bytes of a %d-byte body", len(got), len(big))
	}

	start := time.Now()
	refused := e.do(t, e.request(t, context.Background(), "POST", "/v1/chat/completions", user, "wait-one", strings.NewReader(big)))
	refused.Body.Close()
	if refused.StatusCode != http.StatusTooManyRequests || time.Since(start) > 2*time.Second {
		t.Errorf("a body over proxy.maxBodyBytes with the slot taken: %d after %v; want 429 at once, not a wait", refused.StatusCode, time.Since(start))
	}

	small := `{"messages":"hello"}`
	waited := make(chan *http.Response, 1)
	go func() {
		waited <- e.do(t, e.request(t, context.Background(), "POST", "/v1/chat/completions", user, "wait-one", strings.NewReader(small)))
	}()
	e.AwaitQueue(t, user, 1, 5*time.Second)
	endFirst()
	resp := <-waited
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the request that waited: %d, want 200", resp.StatusCode)
	}
	<-up.started
	if got := <-bodies; got != small {
		t.Errorf("the upstream read %q, want the waiting request's body %q", got, small)
	}
}

// A request waiting for a pool key whose user's slot support releases
// meanwhile (release all of the user's streams) is refused 503 slot_lost
// once the key frees, as ext_proc cuts a stream whose slot was released:
// it joins nothing and goes nowhere. It was a 500 internal_error, logged
// as a failure of the limiter's.
func TestAPoolWaitWhoseSlotSupportReleasedIsRefusedSlotLost(t *testing.T) {
	e, up, _, endAna := orgWaitEnv(t)
	bo := newUser()

	answered := make(chan *http.Response, 1)
	boCtx, endBo := context.WithCancel(context.Background())
	defer endBo() // a failed test leaves no request waiting
	go func() {
		req := e.request(t, boCtx, "GET", "/v1/chat/completions", bo, "wait-one", nil)
		req.Header.Set("X-Org", "acme")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			resp = nil
		}
		answered <- resp
	}()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		got, err := e.Stack.Limiter.PoolSlots(context.Background(), "org", "acme")
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Waiters) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("bo's request never waited for org=acme")
		}
	}
	if released, err := e.Stack.Limiter.ReleaseAll(context.Background(), bo, "support-1"); err != nil || len(released) != 1 {
		t.Fatalf("support's release of bo's streams: %v, %v; want the waiting request's slot", released, err)
	}
	endAna()
	resp := <-answered
	if resp == nil {
		return
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), `"code":"slot_lost"`) {
		t.Errorf("bo's request, its slot released while it waited: %d %s; want 503 slot_lost", resp.StatusCode, body)
	}
	if got := e.Metric(t, `limiter_streams_refused_total{mode="proxy",reason="lost"}`); got != "1" {
		t.Errorf(`limiter_streams_refused_total{reason="lost"} = %q, want 1`, got)
	}
	select {
	case r := <-up.started:
		t.Errorf("bo's %s, its slot released while it waited, reached the upstream", r.Method)
	default:
	}
}
