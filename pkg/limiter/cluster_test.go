package limiter_test

import (
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/cluster"
)

func clusterOptions(t *testing.T) limitertest.Options {
	// A generous deadline: these tests are about correctness, and a loaded
	// machine must not turn their calls degraded.
	return limitertest.Options{Backend: limitertest.RedisCluster, Redis: cluster.Options{Timeout: 5 * time.Second}}
}
