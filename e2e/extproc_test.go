package e2e

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/joishi/limiter/internal/envoytest"
	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/internal/servetest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/limiter"
)

// The ext_proc tests drive real `limiter serve` processes (extproc.addr
// set) on the shared Redis Cluster with the message sequences Envoy's
// ext_proc filter sends (internal/envoytest): Envoy itself cannot be
// installed here, so these hold the server to the documented protocol,
// not to a running Envoy.

// extprocMessageTimeout stands in for the filter's message_timeout
// (default 200ms) on a loaded two-core machine.
const extprocMessageTimeout = 5 * time.Second

// extprocStack is serve processes with their ext_proc servers, an Envoy
// connected to each, and a limiter on the same keys to look at Redis.
type extprocStack struct {
	procs  []*servetest.Process
	envoys []*envoytest.Envoy
	slots  *limiter.Limiter
}

func startExtProcStack(t *testing.T, n int) *extprocStack {
	t.Helper()
	return startExtProcStackWith(t, n, incidentTiers)
}

// startExtProcStackWith is startExtProcStack with tiers, and args added
// to serve's. Its Envoys take override_message_timeout up to a minute.
func startExtProcStackWith(t *testing.T, n int, tiers string, args ...string) *extprocStack {
	t.Helper()
	redis := testenv.Cluster(t)
	prefix := "e2e-extproc:" + randomID() + ":"
	cfg := serveConfig(redis, prefix, tiers)
	s := &extprocStack{slots: limitertest.New(t, limitertest.Options{Backend: limitertest.RedisCluster,
		Limiter: limiter.Options{Keys: keys.Schema{Prefix: prefix}}}).Limiter}
	for range n {
		p := servetest.Start(t, servetest.Options{Config: cfg, AwaitRedis: true, ExtProc: true, Args: args})
		e, err := envoytest.Dial(p.ExtProc, envoytest.Options{MessageTimeout: extprocMessageTimeout, MaxMessageTimeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Close() })
		s.procs, s.envoys = append(s.procs, p), append(s.envoys, e)
	}
	return s
}

// used returns how many live slots Redis holds for user.
func (s *extprocStack) used(t *testing.T, user string) int {
	t.Helper()
	res, err := s.slots.Slots(context.Background(), user)
	if err != nil {
		t.Fatalf("Slots(%s): %v", user, err)
	}
	return res.Used
}

func (s *extprocStack) awaitUsed(t *testing.T, user string, want int, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		got := s.used(t, user)
		if got == want {
			return time.Since(start)
		}
		if time.Since(start) > within {
			t.Fatalf("user %s holds %d slots after %s, want %d", user, got, within, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// request sends request_headers for user and plan on a new stream of e.
func request(t *testing.T, e *envoytest.Envoy, user, plan string) (*envoytest.Stream, *extprocv3.ProcessingResponse) {
	t.Helper()
	st, err := e.Open(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	resp, err := st.RequestHeaders(envoytest.RequestHeaders("/v1/chat/completions", "x-user-id", user, "x-plan", plan), false)
	if err != nil {
		t.Fatalf("request_headers for %s: %v", user, err)
	}
	return st, resp
}

func granted(resp *extprocv3.ProcessingResponse) bool {
	return resp.GetRequestHeaders().GetResponse().GetStatus() == extprocv3.CommonResponse_CONTINUE
}

func statusOf(resp *extprocv3.ProcessingResponse) int {
	return int(resp.GetImmediateResponse().GetStatus().GetCode())
}

// The limit holds across three processes: a user's streams through
// different limiter replicas (as Envoy's load balancing spreads them)
// share one count.
func TestExtProcLimitAcrossProcesses(t *testing.T) {
	s := startExtProcStack(t, 3)
	for _, tc := range []struct {
		plan  string
		limit int
	}{{"free", 1}, {"paid", 3}} {
		t.Run(tc.plan, func(t *testing.T) {
			user := "u-" + randomID()
			var held []*envoytest.Stream
			for i := range tc.limit {
				st, resp := request(t, s.envoys[i%3], user, tc.plan)
				if !granted(resp) {
					t.Fatalf("stream %d of %d through process %d: %v, want CONTINUE", i+1, tc.limit, i%3, resp)
				}
				held = append(held, st)
			}
			for i := range 3 {
				_, resp := request(t, s.envoys[i], user, tc.plan)
				if statusOf(resp) != 429 {
					t.Errorf("stream over the limit through process %d: %v, want a 429 ImmediateResponse", i, resp)
				}
			}
			if got := s.used(t, user); got != tc.limit {
				t.Errorf("Redis holds %d slots for the user, want %d", got, tc.limit)
			}
			// One ends on its process; the next is granted on another.
			mustAnswer(t)(held[0].ResponseHeaders(envoytest.Headers(":status", "204"), true))
			held[0].Close()
			if _, resp := request(t, s.envoys[2], user, tc.plan); !granted(resp) {
				t.Errorf("after one stream ended: %v, want CONTINUE", resp)
			}
		})
	}
}

func mustAnswer(t *testing.T) func(*extprocv3.ProcessingResponse, error) {
	return func(resp *extprocv3.ProcessingResponse, err error) {
		t.Helper()
		if err != nil || resp.GetImmediateResponse() != nil {
			t.Fatalf("answer %v, %v; want CONTINUE", resp, err)
		}
	}
}

// Every kind of end releases the slot on a real process: the response's
// end seen on the stream, or the gRPC stream ending first however it ends.
func TestExtProcReleasedOnEachEnd(t *testing.T) {
	s := startExtProcStack(t, 1)
	e := s.envoys[0]
	for _, tc := range []struct {
		name string
		play func(t *testing.T, st *envoytest.Stream)
	}{
		{"headers only, then Envoy closes", func(t *testing.T, st *envoytest.Stream) {
			mustAnswer(t)(st.ResponseHeaders(envoytest.Headers(":status", "200"), false))
			st.Close()
		}},
		{"streamed body to its end", func(t *testing.T, st *envoytest.Stream) {
			mustAnswer(t)(st.ResponseHeaders(envoytest.Headers(":status", "200"), false))
			mustAnswer(t)(st.ResponseBody([]byte("data: {}\n\n"), false))
			mustAnswer(t)(st.ResponseBody([]byte("data: [DONE]\n\n"), true))
		}},
		{"trailers", func(t *testing.T, st *envoytest.Stream) {
			mustAnswer(t)(st.ResponseHeaders(envoytest.Headers(":status", "200"), false))
			mustAnswer(t)(st.ResponseBody([]byte("x"), false))
			mustAnswer(t)(st.ResponseTrailers(envoytest.Headers("grpc-status", "0")))
		}},
		{"client cancel: the stream is reset", func(t *testing.T, st *envoytest.Stream) {
			mustAnswer(t)(st.ResponseHeaders(envoytest.Headers(":status", "200"), false))
			st.Reset()
		}},
		{"Envoy closes the stream without an end of stream", func(t *testing.T, st *envoytest.Stream) {
			st.Close()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			user := "u-" + randomID()
			st, resp := request(t, e, user, "free")
			if !granted(resp) {
				t.Fatalf("request_headers: %v, want CONTINUE", resp)
			}
			tc.play(t, st)
			s.awaitUsed(t, user, 0, 2*time.Second)
		})
	}
	t.Run("Envoy restarts: its connection drops", func(t *testing.T) {
		restarting, err := envoytest.Dial(s.procs[0].ExtProc, envoytest.Options{MessageTimeout: extprocMessageTimeout})
		if err != nil {
			t.Fatal(err)
		}
		user := "u-" + randomID()
		if _, resp := request(t, restarting, user, "paid"); !granted(resp) {
			t.Fatalf("request_headers: %v", resp)
		}
		_ = restarting.Close()
		s.awaitUsed(t, user, 0, 2*time.Second)
	})
	t.Run("ImmediateResponse after a limit holds nothing", func(t *testing.T) {
		user := "u-" + randomID()
		if _, resp := request(t, e, user, "free"); !granted(resp) {
			t.Fatalf("first stream: %v", resp)
		}
		st, resp := request(t, e, user, "free")
		if statusOf(resp) != 429 {
			t.Fatalf("second stream: %v, want 429", resp)
		}
		st.Close()
		if got := s.used(t, user); got != 1 {
			t.Errorf("after the refused stream closed the user holds %d slots, want 1", got)
		}
	})
}

// A limiter SIGKILLed mid-stream releases nothing itself; its slots expire
// with their TTL (2s here), within a second of it.
func TestExtProcSIGKILLSlotExpires(t *testing.T) {
	s := startExtProcStack(t, 2)
	user := "u-" + randomID()
	st, resp := request(t, s.envoys[0], user, "free")
	if !granted(resp) {
		t.Fatalf("request_headers: %v", resp)
	}
	mustAnswer(t)(st.ResponseHeaders(envoytest.Headers(":status", "200"), false))
	time.Sleep(time.Second) // heartbeats have run
	if got := s.used(t, user); got != 1 {
		t.Fatalf("the user holds %d slots mid-stream, want 1", got)
	}
	s.procs[0].Kill()
	gone := s.awaitUsed(t, user, 0, 2*time.Second+time.Second) // TTL + 1s
	t.Logf("slot gone %s after SIGKILL (TTL 2s)", gone.Round(10*time.Millisecond))
	// The user streams again through the surviving replica.
	if _, resp := request(t, s.envoys[1], user, "free"); !granted(resp) {
		t.Errorf("after the slot expired: %v, want CONTINUE", resp)
	}
}

// 1,000 Envoy streams held at once, over a few connections as Envoy's
// workers multiplex them, are all granted, kept past their TTL by the
// batched heartbeat, and all released when they end: no slot leaks, and
// the process holds no stream afterwards.
func TestExtProcThousandStreams(t *testing.T) {
	const streams, conns = 1000, 4
	s := startExtProcStack(t, 1)
	deadline := time.Now().Add(90 * time.Second)
	envoys := []*envoytest.Envoy{s.envoys[0]}
	for len(envoys) < conns {
		e, err := envoytest.Dial(s.procs[0].ExtProc, envoytest.Options{MessageTimeout: 20 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Close() })
		envoys = append(envoys, e)
	}
	prefix := "u-" + randomID() + "-"
	open := make([]*envoytest.Stream, streams)
	var failures atomic.Int32
	var firstErr atomic.Value
	run := func(f func(i int) error) {
		var wg sync.WaitGroup
		sem := make(chan struct{}, 64)
		for i := range streams {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				if err := f(i); err != nil {
					failures.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
			})
		}
		wg.Wait()
		if n := failures.Load(); n > 0 {
			t.Fatalf("%d of %d streams failed, first: %v", n, streams, firstErr.Load())
		}
	}
	run(func(i int) error {
		st, err := envoys[i%conns].Open(context.Background())
		if err != nil {
			return err
		}
		open[i] = st
		resp, err := st.RequestHeaders(envoytest.RequestHeaders("/v1/chat/completions", "x-user-id", fmt.Sprint(prefix, i), "x-plan", "free"), false)
		if err != nil {
			return err
		}
		if !granted(resp) {
			return fmt.Errorf("stream %d: %v, want CONTINUE", i, resp)
		}
		if resp, err = st.ResponseHeaders(envoytest.Headers(":status", "200"), false); err != nil || resp.GetImmediateResponse() != nil {
			return fmt.Errorf("stream %d response_headers: %v, %v", i, resp, err)
		}
		return nil
	})
	t.Cleanup(func() {
		for _, st := range open {
			if st != nil {
				st.Close()
			}
		}
	})
	// Past the TTL (2s): the heartbeat keeps every slot.
	time.Sleep(2500 * time.Millisecond)
	run(func(i int) error {
		if n := s.used(t, fmt.Sprint(prefix, i)); n != 1 {
			return fmt.Errorf("user %d holds %d slots while streaming, want 1", i, n)
		}
		return nil
	})
	if active := activeStreams(t, s.procs[0]); active != "1000" {
		t.Errorf("limiter_streams_active{mode=extproc} = %s while streaming, want 1000", active)
	}
	run(func(i int) error {
		if i%2 == 0 {
			_, err := open[i].ResponseBody([]byte("data: [DONE]\n\n"), true)
			open[i].Close()
			return err
		}
		open[i].Close()
		return nil
	})
	for i := range streams {
		if time.Now().After(deadline) {
			t.Fatal("1,000 streams did not complete within 90s")
		}
		s.awaitUsed(t, fmt.Sprint(prefix, i), 0, 5*time.Second)
	}
	waitFor(t, 5*time.Second, func() bool { return activeStreams(t, s.procs[0]) == "0" }, "limiter_streams_active{mode=extproc} back to 0")
}

// activeStreams is the process's limiter_streams_active{mode="extproc"}.
func activeStreams(t *testing.T, p *servetest.Process) string {
	t.Helper()
	_, body := servetest.Get(p.Ops + "/metrics")
	for line := range strings.SplitSeq(body, "\n") {
		if rest, ok := strings.CutPrefix(line, `limiter_streams_active{mode="extproc"`); ok {
			if i := strings.LastIndexByte(rest, ' '); i >= 0 {
				return rest[i+1:]
			}
		}
	}
	return ""
}

func waitFor(t *testing.T, within time.Duration, ok func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", within, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestAnOpenExtProcServerOnTheEmbeddedStoreListensOnLoopback: README's
// `limiter serve --extproc-addr :9091`, on the embedded store with no
// api.tokensFile, takes any user's slots for whoever reaches the port,
// as the open API does; like it, it listens on the loopback interface
// only, and says so.
func TestAnOpenExtProcServerOnTheEmbeddedStoreListensOnLoopback(t *testing.T) {
	_, port, _ := net.SplitHostPort(testenv.FreeAddr(t))
	p := servetest.Start(t, servetest.Options{Config: "tiers:\n  source: static\n", Args: []string{"--extproc-addr", ":" + port}})
	p.AwaitLog(`"msg":"ext_proc listening"`, 10*time.Second)
	for _, want := range []string{`"addr":"grpc://127.0.0.1:` + port + `"`, `give extproc.addr a host (0.0.0.0:` + port + `)`} {
		if !strings.Contains(p.Output(), want) {
			t.Errorf("serve's log does not say %s:\n%s", want, p.Output())
		}
	}
}
