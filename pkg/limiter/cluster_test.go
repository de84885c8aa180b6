package limiter_test

import (
	"testing"

	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/cluster"
)

func clusterOptions(t *testing.T) cluster.Options {
	return cluster.Options{Addrs: testenv.Cluster(t)}
}
