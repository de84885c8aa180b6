package proxy_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/hold"
	"github.com/joishi/limiter/pkg/identity"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/proxy"
)

// BenchmarkProxySSE streams short chat completions (8 SSE chunks and
// [DONE]) from a local upstream four ways: directly; through a plain
// httputil.ReverseProxy, the reference (what any reverse proxy costs);
// through the limiter's proxy; and through the limiter's proxy with a
// pool whose key it reads from the request body (body:model, every
// stream a member of one capped key).
//
// Throughput: each way alone, with benchSSEClients clients streaming as
// fast as they can, in turns of proxyTurn*b.N streams (proxySlices turns
// each, the order reversed every other one): streams per second of each way over
// another's (the *_ratio metrics).
//
// Latency: the four ways side by side in the same few goroutines, each
// stream in turn, and beside them one library Acquire, the round trip a
// stream's decision costs: the time to the first chunk each way adds
// over the plain reverse proxy (the added_ttfb metrics) and the
// acquire's (acquire_us). Run it on a Redis:
//
//	LIMITER_TEST_REDIS=127.0.0.1:6379 go test -run '^$' -bench BenchmarkProxySSE ./pkg/proxy
func BenchmarkProxySSE(b *testing.B) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 8 {
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok%d\"}}]}\n\n", i)
			w.(http.Flusher).Flush()
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	defer upstream.Close()
	target, _ := url.Parse(upstream.URL)
	plain := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(target) },
		FlushInterval: -1,
	})
	defer plain.Close()

	table := pools.NewTable()
	capped := 100000 // the most a key may have: every stream joins it
	if err := table.Replace([]pools.Pool{pools.Pool{Pool: "model", MaxConcurrentStreams: &capped}.WithDefaults()}); err != nil {
		b.Fatal(err)
	}
	// Quiet, so that no log line splits the benchmark's result line.
	stack := limitertest.New(b, limitertest.Options{Redis: cluster.Options{Logger: slog.New(slog.DiscardHandler)},
		Limiter: limiter.Options{Pools: table}})
	front := benchProxy(b, stack, target, nil)
	pooled := benchProxy(b, stack, target, map[string]string{"model": "body:model"})
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}

	// A chat request as an SDK sends it: the conversation, then the model.
	body := `{"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"` +
		strings.Repeat("Tell me about streams. ", 40) + `"}],"model":"gpt-4o","stream":true}`
	var users atomic.Int64
	stream := func(base string) (ttfb, total time.Duration, err error) {
		start := time.Now()
		req, _ := http.NewRequest("POST", base+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-User-Id", fmt.Sprintf("bench-%d", users.Add(1)))
		req.Header.Set("X-Plan", "three")
		resp, err := client.Do(req)
		if err != nil {
			return 0, 0, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return 0, 0, fmt.Errorf("%s: status %d", base, resp.StatusCode)
		}
		br := bufio.NewReader(resp.Body)
		if _, err := br.ReadString('\n'); err != nil {
			return 0, 0, err
		}
		ttfb = time.Since(start)
		if _, err := io.Copy(io.Discard, br); err != nil {
			return 0, 0, err
		}
		return ttfb, time.Since(start), nil
	}
	acquire := func() (time.Duration, error) {
		start := time.Now()
		user := fmt.Sprintf("bench-%d", users.Add(1))
		res, err := stack.Limiter.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "three"})
		took := time.Since(start)
		if err == nil {
			_, err = stack.Limiter.Release(context.Background(), user, res.StreamID)
		}
		return took, err
	}

	ways := []struct {
		base         string
		total, first atomic.Int64 // nanoseconds
		streams      int
		wall         time.Duration
	}{{base: upstream.URL}, {base: plain.URL}, {base: front.URL}, {base: pooled.URL}}
	const direct, reverse, proxied, pool = 0, 1, 2, 3

	b.ResetTimer()
	// Throughput: each way alone at full load, in turns.
	for slice := range proxySlices {
		for k := range ways {
			i := k
			if slice%2 == 1 {
				i = len(ways) - 1 - k
			}
			var next atomic.Int64
			var wg sync.WaitGroup
			start := time.Now()
			for range benchSSEClients {
				wg.Go(func() {
					for next.Add(1) <= int64(proxyTurn*b.N) {
						if _, _, err := stream(ways[i].base); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			ways[i].wall += time.Since(start)
			ways[i].streams += proxyTurn * b.N
		}
	}

	// Latency: every way in the same goroutines, in turn, so machine load
	// weighs on them alike.
	var acquired atomic.Int64
	b.SetParallelism(2)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			for i := range ways {
				first, total, err := stream(ways[i].base)
				if err != nil {
					b.Error(err)
					return
				}
				ways[i].total.Add(int64(total))
				ways[i].first.Add(int64(first))
			}
			took, err := acquire()
			if err != nil {
				b.Error(err)
				return
			}
			acquired.Add(int64(took))
		}
	})
	b.StopTimer()
	n := float64(b.N)
	us := func(ns int64) float64 { return float64(ns) / n / 1e3 }
	b.ReportMetric(us(ways[direct].total.Load()), "direct_us/stream")
	b.ReportMetric(us(ways[reverse].total.Load()), "plain_us/stream")
	b.ReportMetric(us(ways[proxied].total.Load()), "proxied_us/stream")
	b.ReportMetric(us(ways[pool].total.Load()), "pooled_us/stream")
	rate := func(i int) float64 { return float64(ways[i].streams) / ways[i].wall.Seconds() }
	b.ReportMetric(rate(direct), "direct_streams/s")
	b.ReportMetric(rate(reverse), "plain_streams/s")
	b.ReportMetric(rate(proxied), "proxied_streams/s")
	b.ReportMetric(rate(pool), "pooled_streams/s")
	perSecond := func(a, over int) float64 { return rate(a) / rate(over) }
	b.ReportMetric(perSecond(proxied, direct), "throughput_ratio")
	b.ReportMetric(perSecond(proxied, reverse), "vs_plain_ratio")
	b.ReportMetric(perSecond(pool, reverse), "pooled_vs_plain_ratio")
	b.ReportMetric(perSecond(pool, proxied), "pooled_vs_proxied_ratio")
	b.ReportMetric(float64(ways[proxied].first.Load())/float64(ways[direct].first.Load()), "ttfb_ratio")
	b.ReportMetric(us(ways[proxied].first.Load()-ways[direct].first.Load()), "added_ttfb_us")
	b.ReportMetric(us(ways[proxied].first.Load()-ways[reverse].first.Load()), "added_ttfb_vs_plain_us")
	b.ReportMetric(us(ways[pool].first.Load()-ways[reverse].first.Load()), "pooled_added_ttfb_vs_plain_us")
	b.ReportMetric(us(acquired.Load()), "acquire_us")
}

// benchSSEClients streams at once in the throughput turns: enough to
// keep both cores busy through every way's round trips.
const benchSSEClients = 32

// proxySlices is how many turns each way takes in the throughput part,
// of proxyTurn*b.N streams each.
const proxySlices, proxyTurn = 6, 2

// benchProxy is a limiter proxy on stack in front of target, its pools'
// keys read from the sources given (none: no pool).
func benchProxy(b *testing.B, stack *limitertest.Stack, target *url.URL, poolSources map[string]string) *httptest.Server {
	b.Helper()
	h, err := hold.New(stack.Limiter, hold.Options{Mode: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { h.Close(context.Background()) })
	sources, err := identity.ParsePoolSources(poolSources)
	if err != nil {
		b.Fatal(err)
	}
	ident, err := identity.New(identity.Options{Pools: sources})
	if err != nil {
		b.Fatal(err)
	}
	// Its two log lines per stream are part of the cost, formatted as in
	// production but not written to the terminal.
	p, err := proxy.New(h, ident, proxy.Options{Upstream: target, Tiers: stack.Table, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	front := httptest.NewServer(p.Handler())
	b.Cleanup(front.Close)
	return front
}
