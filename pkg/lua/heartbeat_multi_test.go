package lua_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/lua"
	"github.com/redis/rueidis"
)

// callTimeout is the limiter's default per-call deadline.
const callTimeout = 250 * time.Millisecond

// TestHeartbeatMultiRefreshesHealthyNodesWhileOneHangs: the nodes lack the
// heartbeat script (SCRIPT FLUSH, as after a failover, a restart or a
// deploy) and one master is hung. Every slot on the healthy masters must
// still be refreshed, in every round; only the hung master's slots fail.
// Rounds alternate between calls grouped by node (a slot map read before
// the fault) and by hash slot (no map).
func TestHeartbeatMultiRefreshesHealthyNodesWhileOneHangs(t *testing.T) {
	t.Parallel()
	addrs := testenv.StartCluster(t)
	ctx := context.Background()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: addrs, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)

	slots := make([]lua.HeartbeatArgs, 300)
	for i := range slots {
		slots[i] = lua.HeartbeatArgs{Key: fmt.Sprintf("heartbeat-multi:{user-%d}", i), StreamID: "s", TTL: 10 * time.Second}
		if got, err := lua.Acquire(ctx, c, slots[i].Key, "s", 1, slots[i].TTL, lua.Record{}, false); err != nil || !got.Granted {
			t.Fatalf("acquire %s = %+v, %v", slots[i].Key, got, err)
		}
	}
	// One healthy round loads the script everywhere; the flush drops it.
	slotMap, err := cluster.ReadSlotMap(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	for i, err := range heartbeatRound(t, c, slots, slotMap.NodeOf, "before the fault") {
		if err != nil {
			t.Fatalf("heartbeat %s before the fault: %v", slots[i].Key, err)
		}
	}

	masters, replicas := roles(t, addrs)
	owner := make([]string, len(slots)) // slot i lives on master owner[i]
	for _, m := range masters {
		keys := make(rueidis.Commands, len(slots))
		for i, s := range slots {
			keys[i] = m.B().Exists().Key(s.Key).Build()
		}
		for i, resp := range m.DoMulti(ctx, keys...) {
			if n, err := resp.AsInt64(); err == nil && n == 1 {
				owner[i] = m.addr
			}
		}
	}
	hung := masters[0].addr
	var onHung int
	for i, addr := range owner {
		if addr == "" {
			t.Fatalf("no master holds %s", slots[i].Key)
		}
		if addr == hung {
			onHung++
		}
	}
	if onHung == 0 || onHung == len(slots) {
		t.Fatalf("%d of %d slots on the hung master; want them spread over all masters", onHung, len(slots))
	}

	// Hold the fault window open: no replica takes over the hung master,
	// and the healthy masters keep serving their slots meanwhile.
	for _, n := range append(masters, replicas...) {
		cmds := rueidis.Commands{
			n.B().ConfigSet().ParameterValue().ParameterValue("cluster-require-full-coverage", "no").Build(),
			n.B().ScriptFlush().Build(),
		}
		if n.replica {
			cmds = append(cmds, n.B().ConfigSet().ParameterValue().ParameterValue("cluster-replica-no-failover", "yes").Build())
		}
		for _, resp := range n.DoMulti(ctx, cmds...) {
			if err := resp.Error(); err != nil {
				t.Fatalf("%s: %v", n.addr, err)
			}
		}
	}
	testenv.Pause(t, hung)

	for round := 1; round <= 4; round++ {
		start := time.Now()
		nodeOf, grouped := lua.NodeOf(slotMap.NodeOf), "by node"
		if round%2 == 0 {
			nodeOf, grouped = nil, "by hash slot"
		}
		errs := heartbeatRound(t, c, slots, nodeOf, grouped)
		took := time.Since(start)
		var refreshed, failed int
		var firstErr error
		for i, err := range errs {
			switch {
			case owner[i] != hung && err == nil:
				refreshed++
			case owner[i] != hung && firstErr == nil:
				firstErr = fmt.Errorf("slot %s on healthy master %s: %w", slots[i].Key, owner[i], err)
			case owner[i] == hung && err != nil:
				failed++
			}
		}
		t.Logf("round %d (%s, %v): healthy-node slots refreshed: %d of %d; hung-node slots failed: %d of %d",
			round, grouped, took.Round(time.Millisecond), refreshed, len(slots)-onHung, failed, onHung)
		if refreshed != len(slots)-onHung {
			t.Errorf("round %d: %d of %d slots on healthy masters refreshed, want all; first failure: %v",
				round, refreshed, len(slots)-onHung, firstErr)
		}
		if failed != onHung {
			t.Errorf("round %d: %d of %d slots on the hung master failed, want all (it never answers)", round, failed, onHung)
		}
	}
}

// heartbeatRound heartbeats slots under the per-call deadline and returns
// the per-slot errors (nil: the slot was refreshed). It fails the test if
// HeartbeatMulti overruns the deadline by far.
func heartbeatRound(t *testing.T, c rueidis.Client, slots []lua.HeartbeatArgs, nodeOf lua.NodeOf, what string) []error {
	t.Helper()
	done := make(chan []error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		beats, errs := lua.HeartbeatMulti(ctx, c, slots, nodeOf)
		for i, beat := range beats {
			if errs[i] == nil && !beat.Alive {
				errs[i] = fmt.Errorf("slot lost")
			}
		}
		done <- errs
	}()
	select {
	case errs := <-done:
		return errs
	case <-time.After(10 * callTimeout):
		t.Fatalf("HeartbeatMulti (%s) did not return within %v of a %v deadline", what, 10*callTimeout, callTimeout)
		return nil
	}
}

// clusterNode is a direct connection to one node.
type clusterNode struct {
	rueidis.Client
	addr    string
	replica bool
}

// roles dials every node and sorts them into masters and replicas.
func roles(t *testing.T, addrs []string) (masters, replicas []clusterNode) {
	t.Helper()
	for _, addr := range addrs {
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, ForceSingleClient: true, DisableCache: true})
		if err != nil {
			t.Fatalf("dial %s: %v", addr, err)
		}
		t.Cleanup(c.Close)
		role, err := c.Do(context.Background(), c.B().Role().Build()).ToArray()
		if err != nil || len(role) == 0 {
			t.Fatalf("ROLE on %s: %v", addr, err)
		}
		switch kind, _ := role[0].ToString(); kind {
		case "master":
			masters = append(masters, clusterNode{c, addr, false})
		case "slave":
			replicas = append(replicas, clusterNode{c, addr, true})
		}
	}
	if len(masters) != 3 {
		t.Fatalf("cluster has %d masters, want 3", len(masters))
	}
	return masters, replicas
}
