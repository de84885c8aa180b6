package cluster

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/testenv"
	"github.com/redis/rueidis"
)

// TestClusterCallsRunDirectlyOnlyWhileEverySlotIsServed: on a cluster
// serving every slot the limiter's calls may skip their deadline goroutine
// (rueidis bounds them by their context), and not once a slot has no
// master, since rueidis would then refresh the topology inside the call,
// past its deadline; when the slot is served again, they may again.
func TestClusterCallsRunDirectlyOnlyWhileEverySlotIsServed(t *testing.T) {
	private := testenv.StartPrivateCluster(t)
	var logs testenv.Buffer
	opts := healthOptions(&logs, private.Addrs...)
	opts.Timeout = 250 * time.Millisecond
	// Longer than the 2s for which a failed probe (cluster_state:fail)
	// keeps every call off the direct path as an outage: between the
	// probes of a cluster missing a slot, only the slot map says so.
	opts.ProbeInterval = 2500 * time.Millisecond
	c, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	redis := connected(t, c)
	ctx := context.Background()
	direct := func() bool { return c.HonorsDeadlines(redis, time.Now()) }
	// Two dial timeouts after the latest dial, with the probe's map read.
	if !eventually(5*time.Second, direct) {
		t.Fatal("a cluster serving every slot: HonorsDeadlines stayed false, want true two dial timeouts after the last dial")
	}

	const slot = 4242 // served by the first master (slots 0-5460)
	owner := private.MasterOf("{" + slotTag(t, slot) + "}")
	nodes := make([]rueidis.Client, len(private.Addrs))
	for i, addr := range private.Addrs {
		nodes[i] = rawClient(t, addr)
	}
	for i, n := range nodes {
		if err := n.Do(ctx, n.B().ClusterDelslots().Slot(slot).Build()).Error(); err != nil {
			t.Fatalf("CLUSTER DELSLOTS %d on %s: %v", slot, private.Addrs[i], err)
		}
	}
	if !eventually(5*time.Second, func() bool { return !direct() }) {
		t.Fatalf("slot %d has no master: HonorsDeadlines stayed true, want false", slot)
	}
	for until := time.Now().Add(4 * time.Second); time.Now().Before(until); time.Sleep(10 * time.Millisecond) {
		if direct() {
			t.Fatalf("slot %d has no master: HonorsDeadlines true again %v after the probes' interval began, want false until it is served", slot, opts.ProbeInterval)
		}
	}

	for i, addr := range private.Addrs {
		if addr == owner {
			if err := nodes[i].Do(ctx, nodes[i].B().ClusterAddslots().Slot(slot).Build()).Error(); err != nil {
				t.Fatalf("CLUSTER ADDSLOTS %d on %s: %v", slot, addr, err)
			}
		}
	}
	private.AwaitServed(10 * time.Second)
	if !eventually(10*time.Second, direct) {
		t.Fatalf("slot %d served again: HonorsDeadlines stayed false, want true", slot)
	}
}

// slotTag returns a hash tag whose key hashes to slot.
func slotTag(t *testing.T, slot int) string {
	t.Helper()
	for i := range 1 << 20 {
		if tag := strconv.Itoa(i); testenv.KeySlot("{"+tag+"}") == slot {
			return tag
		}
	}
	t.Fatalf("no tag of slot %d", slot)
	return ""
}
