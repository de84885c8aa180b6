package proxy_test

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync/atomic"
	"testing"

	"github.com/joishi/limiter/pkg/proxy"
)

// TestReadyWaitsForTheRedisClientToWarmUp: /readyz answers 503 while the
// Redis client warms up, then 200; with no Warmed hook, 200 at once.
func TestReadyWaitsForTheRedisClientToWarmUp(t *testing.T) {
	var warmed atomic.Bool
	e := newEnv(t, http.NotFoundHandler(), envOptions{})
	upstream, err := url.Parse(e.upstream.URL)
	if err != nil {
		t.Fatal(err)
	}
	ready := func(p *proxy.Proxy) int {
		rec := httptest.NewRecorder()
		p.OpsHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		return rec.Code
	}
	p, err := proxy.New(e.Holder, nil, proxy.Options{Upstream: upstream, Tiers: e.Stack.Table, Warmed: warmed.Load})
	if err != nil {
		t.Fatal(err)
	}
	if got := ready(p); got != http.StatusServiceUnavailable {
		t.Errorf("/readyz while warming up = %d, want 503", got)
	}
	warmed.Store(true)
	if got := ready(p); got != http.StatusOK {
		t.Errorf("/readyz once warmed = %d, want 200", got)
	}
	unhooked, err := proxy.New(e.Holder, nil, proxy.Options{Upstream: upstream, Tiers: e.Stack.Table})
	if err != nil {
		t.Fatal(err)
	}
	if got := ready(unhooked); got != http.StatusOK {
		t.Errorf("/readyz with no Warmed hook = %d, want 200", got)
	}
}
