package limiter_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/redis/rueidis"
)

// node is a direct connection to one cluster node.
type node struct {
	addr   string
	client rueidis.Client
}

func dialNodes(t *testing.T, addrs []string) []node {
	t.Helper()
	var nodes []node
	for _, addr := range addrs {
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, ForceSingleClient: true, DisableCache: true})
		if err != nil {
			t.Fatalf("dial %s: %v", addr, err)
		}
		t.Cleanup(c.Close)
		nodes = append(nodes, node{addr, c})
	}
	return nodes
}

func (n node) role(t *testing.T) string {
	t.Helper()
	info, err := n.client.Do(context.Background(), n.client.B().Info().Section("replication").Build()).ToString()
	if err != nil {
		t.Fatalf("INFO replication on %s: %v", n.addr, err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "role:"); ok {
			return v
		}
	}
	return ""
}

func (n node) dbsize(t *testing.T) int64 {
	t.Helper()
	size, err := n.client.Do(context.Background(), n.client.B().Dbsize().Build()).AsInt64()
	if err != nil {
		t.Fatalf("DBSIZE on %s: %v", n.addr, err)
	}
	return size
}

func TestClusterFailoverMidRun(t *testing.T) {
	t.Parallel()
	addrs := testenv.StartCluster(t)
	e := newEnv(t, limitertest.Options{Redis: cluster.Options{Addrs: addrs, ShardsRefreshInterval: time.Second}})
	ctx := context.Background()

	reqs := make([]limiter.HeartbeatRequest, 1000)
	for i := range reqs {
		user := fmt.Sprintf("failover-user-%d", i)
		res := e.acquire(t, user, "closed", "s")
		if !res.Granted || res.Degraded {
			t.Fatalf("acquire for %s = %+v", user, res)
		}
		reqs[i] = limiter.HeartbeatRequest{UserID: user, Plan: "closed", StreamID: "s"}
	}

	nodes := dialNodes(t, addrs)
	var masters, replicas []node
	for _, n := range nodes {
		switch n.role(t) {
		case "master":
			masters = append(masters, n)
		case "slave":
			replicas = append(replicas, n)
		}
	}
	if len(masters) != 3 || len(replicas) != 3 {
		t.Fatalf("cluster has %d masters and %d replicas, want 3 and 3", len(masters), len(replicas))
	}
	for _, m := range masters {
		if size := m.dbsize(t); size < 200 {
			t.Errorf("master %s holds %d of 1000 users' keys; want them spread over all three", m.addr, size)
		}
	}

	// Keep the load running through the failover.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			e.lim.HeartbeatBatch(ctx, reqs)
			time.Sleep(20 * time.Millisecond)
		}
	}()

	promoted := replicas[0]
	if err := promoted.client.Do(ctx, promoted.client.B().ClusterFailover().Build()).Error(); err != nil {
		t.Fatalf("CLUSTER FAILOVER on %s: %v", promoted.addr, err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for promoted.role(t) != "master" {
		if time.Now().After(deadline) {
			t.Fatalf("replica %s was not promoted within 15s", promoted.addr)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// Without restarting the client, every slot heartbeats again.
	var lastBad string
	for {
		results, errs := e.lim.HeartbeatBatch(ctx, reqs)
		bad := 0
		lastBad = ""
		for i := range results {
			if errs[i] != nil || !results[i].Alive {
				bad++
				lastBad = fmt.Sprintf("%s: %+v, %v", reqs[i].UserID, results[i], errs[i])
			}
		}
		if bad == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of 1000 slots still failing 15s after the failover; e.g. %s", bad, lastBad)
		}
		time.Sleep(100 * time.Millisecond)
	}
	close(stop)
	wg.Wait()

	res := e.acquire(t, "failover-user-0", "closed", "second")
	if !res.Granted || res.Used != 2 {
		t.Errorf("acquire after the failover = %+v, want granted with used 2 (the first slot survived)", res)
	}
}
