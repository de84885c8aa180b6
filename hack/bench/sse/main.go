// SSE is the upstream and the references of hack/bench.sh's proxy run in
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
// With -plain URL -scripts ADDR it is that proxy, which also runs, around
// each request, the limiter's own scripts on the Redis at ADDR as the
// limiter's proxy sends them, and nothing else of the limiter's: before
// the request, the acquire script on the user's key (X-User-Id) in one
// round trip; after the answer, the release script, in another. With
// -pool, each round trip also runs the same script on one pool key
// (model=gpt-4o, the model hack/bench/load sends), as a proxy whose pool
// is keyed by the body's model does, without reading the body. What it
// costs beyond the plain proxy is the physical part of the limiter's:
// Redis's work and its round trips, on the same machine.
//
//	go run ./hack/bench/sse -upstream
//	go run ./hack/bench/sse -plain http://127.0.0.1:PORT
//	go run ./hack/bench/sse -plain http://127.0.0.1:PORT -scripts 127.0.0.1:6379 -pool
//
// It prints "listening http://ADDR" on stdout once it accepts connections,
// and serves until SIGINT or SIGTERM.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"strconv"

	"github.com/joishi/limiter/hack/bench/internal/listen"
	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/lua"
	"github.com/redis/rueidis"
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
	scripts := flag.String("scripts", "", "with -plain: run the limiter's acquire and release scripts around each request on the Redis at host:port")
	pool := flag.Bool("pool", false, "with -scripts: run them on a pool key too")
	flag.Parse()
	var h http.Handler
	switch {
	case *upstream && *plain == "" && *scripts == "":
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
		if *scripts != "" {
			s, err := newScripted(*scripts, *pool, h)
			if err != nil {
				return err
			}
			defer s.c.Close()
			h = s
		}
	default:
		return errors.New("give -upstream, or -plain URL (and -scripts ADDR), not both")
	}
	if *pool && *scripts == "" {
		return errors.New("-pool needs -scripts")
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

// The limiter's arguments for the scripts, as its proxy sends them for
// plan paid: the plan's TTL, a cap no stream reaches, the records it
// writes.
const (
	scriptedPool  = "model=gpt-4o"
	scriptedTTL   = "60000"
	scriptedLimit = "100000"
)

// scripted runs the limiter's acquire and release scripts around each
// request that next proxies, on a Redis of its own client (rueidis's
// defaults, as a user writes them), by EVALSHA.
type scripted struct {
	c                rueidis.Client
	acquire, release string // the scripts' SHA1s
	pool             bool
	next             http.Handler
}

func newScripted(addr string, pool bool, next http.Handler) (*scripted, error) {
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		return nil, fmt.Errorf("-scripts %s: %w", addr, err)
	}
	s := &scripted{c: c, pool: pool, next: next}
	if err := s.load(context.Background()); err != nil {
		c.Close()
		return nil, fmt.Errorf("-scripts %s: %w", addr, err)
	}
	return s, nil
}

// load loads the scripts (SCRIPT LOAD answers the SHA1 they are called
// by).
func (s *scripted) load(ctx context.Context) error {
	for _, x := range []struct {
		sha  *string
		name string
	}{{&s.acquire, "acquire"}, {&s.release, "release"}} {
		sha, err := s.c.Do(ctx, s.c.B().ScriptLoad().Script(lua.Sources()[x.name]).Build()).ToString()
		if err != nil {
			return fmt.Errorf("loading the %s script: %w", x.name, err)
		}
		*x.sha = sha
	}
	return nil
}

// do sends the commands build makes in one round trip, and once more
// after loading the scripts when Redis lost them (SCRIPT FLUSH, a
// restart). (A command is the client's again once sent: build makes new
// ones.)
func (s *scripted) do(ctx context.Context, build func() rueidis.Commands) error {
	err := granted(s.c.DoMulti(ctx, build()...))
	if rerr, ok := rueidis.IsRedisErr(err); ok && rerr.IsNoScript() {
		if err := s.load(ctx); err != nil {
			return err
		}
		err = granted(s.c.DoMulti(ctx, build()...))
	}
	return err
}

func (s *scripted) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	user := r.Header.Get("X-User-Id")
	if user == "" {
		http.Error(w, "no X-User-Id", http.StatusBadRequest)
		return
	}
	key, pool := "bench:scripted:{"+user+"}", "bench:scripted:pool:{"+scriptedPool+"}"
	stream := keys.NewStreamID()
	member := stream + " " + user
	acquire := func() rueidis.Commands {
		cmds := rueidis.Commands{s.eval(s.acquire, lua.AcquireKeys(key), stream, scriptedLimit, scriptedTTL, ";plan=paid;pools="+scriptedPool, "1")}
		if s.pool {
			cmds = append(cmds, s.eval(s.acquire, lua.AcquireKeys(pool), member, scriptedLimit, scriptedTTL,
				";plan=paid;user="+strconv.Itoa(len(user))+":"+user, "1"))
		}
		return cmds
	}
	release := func() rueidis.Commands {
		cmds := rueidis.Commands{s.eval(s.release, lua.ReleaseKeys(key), stream, "")}
		if s.pool {
			cmds = append(cmds, s.eval(s.release, lua.ReleaseKeys(pool), member, ""))
		}
		return cmds
	}
	if err := s.do(ctx, acquire); err != nil {
		http.Error(w, "acquire: "+err.Error(), http.StatusBadGateway)
		return
	}
	defer func() {
		if err := s.do(context.WithoutCancel(ctx), release); err != nil {
			fmt.Fprintln(os.Stderr, "sse: release:", err)
		}
	}()
	s.next.ServeHTTP(w, r)
}

func (s *scripted) eval(sha string, ks []string, args ...string) rueidis.Completed {
	return s.c.B().Evalsha().Sha1(sha).Numkeys(int64(len(ks))).Key(ks...).Arg(args...).Build()
}

// granted returns an error unless each script answered 1 first: a new
// slot or membership granted, or one released.
func granted(resps []rueidis.RedisResult) error {
	for _, resp := range resps {
		arr, err := resp.ToArray()
		if err != nil {
			return err
		}
		if n, err := arr[0].AsInt64(); err != nil || n != 1 {
			return fmt.Errorf("the script answered %v first, want 1", arr[0])
		}
	}
	return nil
}
