package proxy_test

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/cluster"
)

// TestARedisRefusingTheScriptsDoesNotFloodTheLog: with a Redis that
// refuses the limiter's scripts (an ACL without EVALSHA: a
// misconfiguration, every request answered alike), the proxy logs its
// "acquire failed" line once per 10 s, as serve logs its 500s
// (docs/observability.md), not once per request.
func TestARedisRefusingTheScriptsDoesNotFloodTheLog(t *testing.T) {
	user, password := testenv.RedisUserWithoutScripts(t)
	ctx := context.Background()
	logs := &testenv.Buffer{}
	e := newEnvLogged(t, logs, limitertest.Options{Redis: cluster.Options{Username: user, Password: password}})
	const n = 50
	for range n {
		resp := e.do(t, e.request(t, ctx, "POST", "/v1/chat/completions", newUser(), "one", nil))
		resp.Body.Close()
		if resp.StatusCode != http.StatusInternalServerError {
			t.Fatalf("status %d, want 500 (Redis refuses the scripts)", resp.StatusCode)
		}
	}
	errorLines := 0
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "level=ERROR") {
			errorLines++
		}
	}
	if errorLines != 1 || !strings.Contains(logs.String(), "NOPERM") {
		t.Errorf("%d ERROR log lines for %d identical refused requests; want one naming NOPERM, as serve logs its 500s; log:\n%.600s", errorLines, n, logs.String())
	}
}

func newEnvLogged(t *testing.T, w *testenv.Buffer, stack limitertest.Options) *env {
	t.Helper()
	o := envOptions{stack: stack}
	o.proxy.Logger = slog.New(slog.NewTextHandler(w, nil))
	return newEnv(t, http.NotFoundHandler(), o)
}
