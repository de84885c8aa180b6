package telemetry_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/admin"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/server"
	"github.com/joishi/limiter/pkg/telemetry"
)

// TestANonCanonicalAdminPathCarriesNoUserID: an admin path not in its
// canonical form (a doubled slash, a "." segment), answered 404 before the
// mux routes it, is recorded as the 404's route, not as its raw path,
// which names the user (docs/observability.md).
func TestANonCanonicalAdminPathCarriesNoUserID(t *testing.T) {
	ctx := context.Background()
	exported := newExporter()
	tel, err := telemetry.New(ctx, telemetry.Options{SpanExporter: exported})
	if err != nil {
		t.Fatal(err)
	}
	lim := limitertest.New(t, limitertest.Options{
		Redis:       cluster.Options{NewRedis: tel.NewRedisClient},
		Limiter:     limiter.Options{TracerProvider: tel.TracerProvider},
		NewObserver: observer(tel),
	}).Limiter
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("ola operator operator-token-0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := admin.New(lim, admin.Options{TokensFile: tokens})
	if err != nil {
		t.Fatal(err)
	}
	srv := server.New(lim, server.Options{Middleware: tel.Middleware, Admin: a})
	ts := httptest.NewServer(srv.AdminHandler())
	defer ts.Close()

	user := "secret-user-" + randomID()
	for _, path := range []string{
		"/v1/admin/users/" + user + "//slots",
		"/v1/admin/users/" + user + "/./slots",
	} {
		req, _ := http.NewRequest("GET", ts.URL+path, nil)
		req.Header.Set("Authorization", "Bearer operator-token-0123456789abcdef")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", path, resp.StatusCode)
		}
	}
	_ = tel.Shutdown(ctx)
	routed := 0
	for _, sp := range exported.GetSpans() {
		for _, kv := range sp.Attributes {
			if kv.Key == "url.path" && kv.Value.AsString() == "/" {
				routed++
			}
		}
	}
	if routed != 2 {
		t.Errorf("%d server spans with url.path \"/\" (the 404's route), want 2", routed)
	}
	for _, l := range userIDLeaks(exported.GetSpans(), user) {
		t.Error(l)
	}
}
