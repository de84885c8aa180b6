package e2e

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/testenv"
)

// TestEmbeddedStoreIsReachableByServeOnly: `limiter serve` with no
// redis.addrs keeps its slots where only it reaches them. A process beside
// it (a sidecar in the pod's network) that finds a listening port of serve
// and speaks RESP to it, as `redis-cli -p PORT del 'joishi:streams:{eu}'`
// would, neither reads nor deletes a slot key: the user's slot stays held,
// and the next acquire at the limit is still refused.
func TestEmbeddedStoreIsReachableByServeOnly(t *testing.T) {
	t.Parallel()
	testenv.Proc(t) // the listening sockets are read from /proc
	p := launch(t, "tiers:\n  source: static\n  static:\n"+readyTiers)
	p.awaitReady(t, "/readyz", 20*time.Second)
	user := "eu-" + randomID()
	if status, res := acquire(t, p.api, user, "free"); status != http.StatusOK || !res.Granted || res.Degraded {
		t.Fatalf("acquire: %d %+v, want 200 granted, not degraded", status, res)
	}

	key := "joishi:streams:{" + user + "}" // the default keyPrefix
	addrs := testenv.Listening(t, strconv.Itoa(p.cmd.Process.Pid))
	if len(addrs) < 2 {
		t.Fatalf("found %d listening sockets of serve (%v), want its API and ops listeners at least", len(addrs), addrs)
	}
	for _, addr := range addrs {
		if reply, ok := testenv.RawRESP(addr, "ZCARD", key); ok && reply == ":1" {
			t.Errorf("%s (a raw RESP connection) read the slot key %s: ZCARD = %s", addr, key, reply)
		}
		if reply, ok := testenv.RawRESP(addr, "DEL", key); ok && reply == ":1" {
			t.Errorf("%s (a raw RESP connection) deleted the slot key %s", addr, key)
		}
	}
	if status, _ := acquire(t, p.api, user, "free"); status != http.StatusTooManyRequests {
		t.Errorf("an acquire at the limit after the raw connections: %d, want %d (the slot still held)", status, http.StatusTooManyRequests)
	}
	t.Logf("tried serve's listening sockets %v", addrs)
}
