package server_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/server"
)

// TestAPoolFailingClosedIsNamedInItsOutage: an acquire that a pool
// failing closed refused in an outage answers 503 limiter_unavailable
// naming the pool, not "this plan fails closed" (its plan may fail
// open); the plan's own outage keeps its message.
func TestAPoolFailingClosedIsNamedInItsOutage(t *testing.T) {
	err := fmt.Errorf("acquire: %w", &limiter.PoolUnavailableError{Pool: "acct", Key: "a1", Err: fmt.Errorf("the user's slot: %w", limiter.ErrUnavailable)})
	status, e := server.APIError(err)
	if status != http.StatusServiceUnavailable || e.Code != httpapi.CodeUnavailable || !strings.Contains(e.Message, `pool "acct" fails closed`) || strings.Contains(e.Message, "plan") {
		t.Errorf("a pool's outage: %d %+v; want 503 %s naming pool acct, not the plan", status, e, httpapi.CodeUnavailable)
	}
	status, e = server.APIError(limiter.ErrUnavailable)
	if status != http.StatusServiceUnavailable || !strings.Contains(e.Message, "this plan fails closed") {
		t.Errorf("a plan's outage: %d %+v; want 503 saying the plan fails closed", status, e)
	}
}
