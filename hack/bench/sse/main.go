// SSE is the upstream and the reference of hack/bench.sh's proxy run in
// processes (BENCHMARKS.md): `limiter proxy` as the README starts it,
// against a plain httputil.ReverseProxy, in front of the same upstream.
//
// With -upstream it is the upstream: every request's body is read, then
// answered with a short chat completion streamed as Server-Sent Events
// (8 chunks, each flushed, then [DONE]), as BenchmarkProxySSE's upstream.
// With -plain URL it is a plain reverse proxy to URL that flushes as the
// upstream writes: what any reverse proxy costs, the reference the
// limiter's proxy is compared with.
//
//	go run ./hack/bench/sse -upstream
//	go run ./hack/bench/sse -plain http://127.0.0.1:PORT
//
// It prints "listening http://ADDR" on stdout once it accepts connections,
// and serves until SIGINT or SIGTERM.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"

	"github.com/joishi/limiter/hack/bench/internal/listen"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "sse:", err)
		os.Exit(1)
	}
}

func run() error {
	addr := flag.String("addr", "127.0.0.1:0", "listen address, host:port")
	upstream := flag.Bool("upstream", false, "serve SSE chat completions")
	plain := flag.String("plain", "", "base URL to reverse-proxy to, http://host:port")
	flag.Parse()
	var h http.Handler
	switch {
	case *upstream && *plain == "":
		h = http.HandlerFunc(completion)
	case !*upstream && *plain != "":
		target, err := url.Parse(*plain)
		if err != nil || target.Scheme != "http" || target.Host == "" {
			return fmt.Errorf("-plain %q: want http://host:port", *plain)
		}
		h = &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			// The body ends where its length says, without one more read of
			// the client's connection: the transport's check for more
			// after the last byte may otherwise come after the handler
			// returned, fail on the closed body, and close the upstream
			// connection the next request is already reading (a stream cut
			// short, one in some hundreds here).
			if r.In.ContentLength > 0 {
				r.Out.Body = struct {
					io.Reader
					io.Closer
				}{io.LimitReader(r.In.Body, r.In.ContentLength), r.In.Body}
			}
		}, FlushInterval: -1}
	default:
		return errors.New("give -upstream, or -plain URL, not both")
	}
	return listen.Serve(*addr, h)
}

// completion streams a short chat completion: 8 chunks and [DONE].
func completion(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "text/event-stream")
	for i := range 8 {
		fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok%d\"}}]}\n\n", i)
		w.(http.Flusher).Flush()
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}
