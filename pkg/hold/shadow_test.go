package hold_test

import (
	"testing"

	"github.com/joishi/limiter/pkg/hold"
	"github.com/joishi/limiter/pkg/limiter"
)

// The header's value: none on a plain grant, the code for the plan's
// limit, the code and pool=key for a pool key's cap.
func TestWouldRefuseValue(t *testing.T) {
	pool := &limiter.PoolRefusal{Pool: "model", Key: "meta-llama/Llama-3.1-70B-Instruct", Used: 2, Limit: 1}
	for _, tc := range []struct {
		name string
		res  limiter.AcquireResult
		want string
	}{
		{"a plain grant", limiter.AcquireResult{Granted: true, Used: 1, Limit: 1}, ""},
		{"the plan's limit", limiter.AcquireResult{Granted: true, Used: 2, Limit: 1, WouldRefuse: limiter.CodeStreamLimitReached}, "stream_limit_reached"},
		{"a pool key's cap", limiter.AcquireResult{Granted: true, Used: 1, Limit: 3, WouldRefuse: limiter.CodePoolLimitReached, WouldRefuseBy: pool},
			"pool_limit_reached model=meta-llama/Llama-3.1-70B-Instruct"},
		{"both: the plan's, as the result names it", limiter.AcquireResult{Granted: true, Used: 2, Limit: 1, WouldRefuse: limiter.CodeStreamLimitReached, WouldRefuseBy: pool},
			"stream_limit_reached"},
		{"a pool's code without its key", limiter.AcquireResult{Granted: true, WouldRefuse: limiter.CodePoolLimitReached}, "pool_limit_reached"},
	} {
		if got := hold.WouldRefuse(tc.res); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
	if hold.CodeLimitReached != limiter.CodeStreamLimitReached || hold.CodePoolLimitReached != limiter.CodePoolLimitReached {
		t.Errorf("the shadow codes %q, %q differ from the refusals' %q, %q", limiter.CodeStreamLimitReached, limiter.CodePoolLimitReached,
			hold.CodeLimitReached, hold.CodePoolLimitReached)
	}
}
