package extproc_test

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/joishi/limiter/internal/envoytest"
	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/cluster"
)

// TestARedisRefusingTheScriptsDoesNotFloodTheLog: with a Redis that
// refuses the limiter's scripts (an ACL without EVALSHA: a
// misconfiguration, every request answered alike), ext_proc logs its
// "acquire failed" line once per 10 s, as serve logs its 500s
// (docs/observability.md), not once per request.
func TestARedisRefusingTheScriptsDoesNotFloodTheLog(t *testing.T) {
	user, password := testenv.RedisUserWithoutScripts(t)
	logs := &testenv.Buffer{}
	o := envOptions{stack: limitertest.Options{Redis: cluster.Options{Username: user, Password: password}}}
	o.extproc.Logger = slog.New(slog.NewTextHandler(logs, nil))
	e := newEnv(t, o)
	const n = 30
	for range n {
		st := e.open(t)
		resp, err := st.RequestHeaders(envoytest.RequestHeaders("/v1/chat/completions", "x-user-id", newUser(), "x-plan", "three"), false)
		if err != nil {
			t.Fatalf("request_headers: %v", err)
		}
		if ir, _ := immediate(t, resp); ir.GetStatus().GetCode() != 500 {
			t.Fatalf("answered %d, want 500 (Redis refuses the scripts)", ir.GetStatus().GetCode())
		}
		st.Close()
	}
	if lines := strings.Count(logs.String(), "level=ERROR"); lines != 1 || !strings.Contains(logs.String(), "NOPERM") {
		t.Errorf("%d ERROR lines for %d acquires Redis refused alike; want one naming NOPERM, as serve logs its 500s; log:\n%.600s", lines, n, logs.String())
	}
}
