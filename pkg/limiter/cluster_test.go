package limiter_test

import (
	"testing"
	"time"

	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/cluster"
)

func clusterOptions(t *testing.T) cluster.Options {
	// A generous deadline: these tests are about correctness, and a loaded
	// machine must not turn their calls degraded.
	return cluster.Options{Addrs: testenv.Cluster(t), Timeout: 5 * time.Second}
}
