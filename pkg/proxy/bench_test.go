package proxy_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/hold"
	"github.com/joishi/limiter/pkg/identity"
	"github.com/joishi/limiter/pkg/proxy"
)

// BenchmarkProxySSE streams short chat completions (8 SSE chunks and
// [DONE]) from a local upstream, directly and through the proxy, side by
// side in the same goroutines of the same run, and reports the ratios:
// throughput_ratio, proxied streams per second over direct ones (the
// inverse ratio of their stream times at the same concurrency), and
// ttfb_ratio, the time to the first chunk through the proxy over the time
// directly (added_ttfb_us: the acquire and the extra hop). Run it on a
// Redis:
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
	// Quiet, so that no log line splits the benchmark's result line.
	stack := limitertest.New(b, limitertest.Options{Redis: cluster.Options{Logger: slog.New(slog.DiscardHandler)}})
	h, err := hold.New(stack.Limiter, hold.Options{Mode: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close(context.Background())
	ident, _ := identity.New(identity.Options{})
	target, _ := url.Parse(upstream.URL)
	// Its two log lines per stream are part of the cost, formatted as in
	// production but not written to the terminal.
	p, err := proxy.New(h, ident, proxy.Options{Upstream: target, Tiers: stack.Table, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	front := httptest.NewServer(p.Handler())
	defer front.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}

	var users atomic.Int64
	stream := func(base string) (ttfb, total time.Duration, err error) {
		start := time.Now()
		req, _ := http.NewRequest("POST", base+"/v1/chat/completions", strings.NewReader(`{"stream":true}`))
		req.Header.Set("X-User-Id", fmt.Sprintf("bench-%d", users.Add(1)))
		req.Header.Set("X-Plan", "three")
		resp, err := client.Do(req)
		if err != nil {
			return 0, 0, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return 0, 0, fmt.Errorf("status %d", resp.StatusCode)
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

	// Both sides run in the same goroutines, alternately, so machine load
	// weighs on them alike.
	var direct, proxied, directFirst, proxiedFirst atomic.Int64 // nanoseconds
	b.SetParallelism(4)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			for _, side := range []struct {
				base         string
				total, first *atomic.Int64
			}{{upstream.URL, &direct, &directFirst}, {front.URL, &proxied, &proxiedFirst}} {
				first, total, err := stream(side.base)
				if err != nil {
					b.Error(err)
					return
				}
				side.total.Add(int64(total))
				side.first.Add(int64(first))
			}
		}
	})
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(float64(direct.Load())/n/1e3, "direct_us/stream")
	b.ReportMetric(float64(proxied.Load())/n/1e3, "proxied_us/stream")
	// At the same concurrency, streams per second go as 1 / stream time:
	// this is proxied streams/s over direct streams/s.
	b.ReportMetric(float64(direct.Load())/float64(proxied.Load()), "throughput_ratio")
	b.ReportMetric(float64(proxiedFirst.Load())/float64(directFirst.Load()), "ttfb_ratio")
	b.ReportMetric(time.Duration(proxiedFirst.Load()-directFirst.Load()).Seconds()*1e6/n, "added_ttfb_us")
}
