package proxy_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/identity"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/proxy"
)

// A header the client names in Connection is hop-by-hop: the upstream
// never receives it, so the limiter does not read it either. The user
// header so named is no user (401, no slot), a pool's header joins no key,
// the label header labels nothing; the headers not named still count.
func TestHeadersNamedInConnectionAreNotRead(t *testing.T) {
	up := newSSE()
	table := pools.NewTable()
	one := 1
	if err := table.Replace([]pools.Pool{pools.Pool{Pool: "org", MaxConcurrentStreams: &one}.WithDefaults()}); err != nil {
		t.Fatal(err)
	}
	sources, err := identity.ParsePoolSources(map[string]string{"org": "header:X-Org"})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, up, envOptions{
		proxy:    proxy.Options{LabelHeader: "X-Model"},
		stack:    limitertest.Options{Limiter: limiter.Options{Pools: table}},
		identity: identity.Options{Pools: sources},
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	user := newUser()
	chat := func(connection string, header http.Header) *http.Response {
		req := e.request(t, ctx, http.MethodPost, "/v1/chat/completions", user, "three", strings.NewReader(`{"stream":true}`))
		for k, v := range header {
			req.Header[k] = v
		}
		if connection != "" {
			req.Header.Set("Connection", connection)
		}
		return e.do(t, req)
	}

	for _, connection := range []string{"keep-alive, X-User-Id", "x-user-id", "close,  X-USER-ID "} {
		resp := chat(connection, nil)
		if resp.StatusCode != http.StatusUnauthorized {
			resp.Body.Close()
			t.Fatalf("Connection: %s: status %d, want 401", connection, resp.StatusCode)
		}
		if body := decodeError(t, resp); body.Error.Code != "unauthenticated" || !strings.Contains(body.Error.Message, "X-User-Id is missing") {
			t.Errorf("Connection: %s: body %+v, want unauthenticated saying X-User-Id is missing", connection, body.Error)
		}
	}
	e.checkRefused(t, up, user, 0, "identity", 3)

	// The key acme is full; a request naming X-Org in Connection joins no
	// key of org (the upstream reads none), so it streams.
	first := chat("keep-alive", http.Header{"X-Org": {"acme"}})
	defer first.Body.Close()
	if first.StatusCode != http.StatusOK {
		t.Fatalf("a first stream of org acme with Connection: keep-alive: status %d, want 200", first.StatusCode)
	}
	if r := <-up.started; r.Header.Get("X-Org") != "acme" || r.Header.Get("X-User-Id") != user {
		t.Errorf("upstream X-Org %q, X-User-Id %q; want acme, %s", r.Header.Get("X-Org"), r.Header.Get("X-User-Id"), user)
	}
	second := chat("keep-alive, X-Org", http.Header{"X-Org": {"acme"}})
	defer second.Body.Close()
	if second.StatusCode != http.StatusOK {
		t.Fatalf("a stream naming X-Org in Connection beside a full org acme: status %d, want 200 (no key joined)", second.StatusCode)
	}
	if r := <-up.started; r.Header.Get("X-Org") != "" {
		t.Errorf("upstream X-Org %q, want none", r.Header.Get("X-Org"))
	}
	if key, err := e.Stack.Limiter.PoolSlots(ctx, "org", "acme"); err != nil || key.Used != 1 {
		t.Errorf("org=acme holds %d (%v); want 1, the first stream's", key.Used, err)
	}

	// The label header so named labels nothing.
	third := chat("X-Model", http.Header{"X-Model": {"big"}})
	defer third.Body.Close()
	if third.StatusCode != http.StatusOK {
		t.Fatalf("a stream naming X-Model in Connection: status %d, want 200", third.StatusCode)
	}
	if r := <-up.started; r.Header.Get("X-Model") != "" {
		t.Errorf("upstream X-Model %q, want none", r.Header.Get("X-Model"))
	}
	slots, err := e.Stack.Limiter.Slots(ctx, user)
	if err != nil || len(slots.Slots) != 3 {
		t.Fatalf("slots: %+v, %v; want 3", slots, err)
	}
	for _, s := range slots.Slots {
		if s.Label != "" {
			t.Errorf("a slot labelled %q, want none", s.Label)
		}
	}
}
