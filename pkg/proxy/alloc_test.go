package proxy_test

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"runtime"
	"strings"
	"testing"

	"github.com/joishi/limiter/pkg/proxy"
)

// A stream through the proxy, its slot held and released, allocates less
// than the same stream through a plain httputil.ReverseProxy: the proxy
// copies responses through lent buffers, where each of the plain one's
// responses allocates (and zeroes) a 32 KiB buffer of its own, more than
// holding the slot costs.
func TestAStreamAllocatesLessThanAPlainReverseProxys(t *testing.T) {
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Read the request first, as a model server does.
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 4 {
			fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"tok%d\"}}]}\n\n", i)
			w.(http.Flusher).Flush()
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
	e := newEnv(t, upstream, envOptions{})
	target, _ := url.Parse(e.upstream.URL)
	transport, err := proxy.NewTransport(proxy.TransportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rp := &httputil.ReverseProxy{
		Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(target) },
		Transport:     transport,
		FlushInterval: -1,
	}
	// Full duplex, as the proxy forwards: otherwise net/http closes the
	// request body once the answer's headers are out, and the transport,
	// whose last read of it (for its end) may come after that, closes
	// the upstream connection under the answer.
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = http.NewResponseController(w).EnableFullDuplex()
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(plain.Close)

	user := newUser()
	stream := func(base string) {
		req := e.request(t, context.Background(), "POST", "/v1/chat/completions", user, "one", strings.NewReader(`{"stream":true}`))
		req.URL, _ = url.Parse(base + "/v1/chat/completions")
		resp := e.do(t, req)
		defer resp.Body.Close()
		if _, err := io.Copy(io.Discard, resp.Body); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d, %v", base, resp.StatusCode, err)
		}
	}
	// Bytes allocated per stream, by the whole process: the client, the
	// way's server and the upstream are the same both ways. The least of
	// five rounds, the ways taken in turn: what else the process does (GC,
	// the race detector, Redis's client) only ever adds.
	const streams, rounds = 100, 5
	for range 10 { // connections dialled, pools filled
		stream(e.proxy.URL)
		stream(plain.URL)
	}
	perStream := func(base string) uint64 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range streams {
			stream(base)
		}
		runtime.ReadMemStats(&after)
		return (after.TotalAlloc - before.TotalAlloc) / streams
	}
	limited, reference := uint64(math.MaxUint64), uint64(math.MaxUint64)
	for range rounds {
		limited, reference = min(limited, perStream(e.proxy.URL)), min(reference, perStream(plain.URL))
	}
	t.Logf("bytes allocated per stream: %d through the proxy, %d through a plain reverse proxy", limited, reference)
	if limited >= reference {
		t.Errorf("a stream through the proxy allocates %d bytes, a plain reverse proxy's %d: want fewer", limited, reference)
	}
	if n := e.Used(t, user); n != 0 {
		t.Errorf("%d slots held after the streams ended, want 0", n)
	}
}
