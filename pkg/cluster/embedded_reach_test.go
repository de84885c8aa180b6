package cluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/limiter"
)

// TestEmbeddedStoreServesItsOwnClient: the limiter on the embedded store,
// as serve runs it with no redis.addrs, takes, refuses at the limit,
// heartbeats and releases slots.
func TestEmbeddedStoreServesItsOwnClient(t *testing.T) {
	t.Parallel()
	s := limitertest.New(t, limitertest.Options{Backend: limitertest.Embedded})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if !s.Redis.Embedded() {
		t.Fatal("no redis.addrs: the client is not on the embedded store")
	}
	held, err := s.Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: "ana", Plan: "one", StreamID: "chat-1"})
	if err != nil || !held.Granted || held.Degraded || held.Used != 1 {
		t.Fatalf("acquire: %+v, %v; want granted, used 1, not degraded", held, err)
	}
	if res, err := s.Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: "ana", Plan: "one", StreamID: "chat-2"}); err != nil || res.Granted || res.Degraded {
		t.Errorf("a second acquire at the limit: %+v, %v; want refused, not degraded", res, err)
	}
	if res, err := s.Limiter.Heartbeat(ctx, limiter.HeartbeatRequest{UserID: "ana", Plan: "one", StreamID: "chat-1"}); err != nil || !res.Alive || res.Degraded {
		t.Errorf("heartbeat: %+v, %v; want alive, not degraded", res, err)
	}
	if res, err := s.Limiter.Release(ctx, "ana", "chat-1"); err != nil || !res.Released || res.Degraded {
		t.Errorf("release: %+v, %v; want released, not degraded", res, err)
	}
	if res, err := s.Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: "ana", Plan: "one", StreamID: "chat-2"}); err != nil || !res.Granted {
		t.Errorf("acquire after the release: %+v, %v; want granted", res, err)
	}
}

// TestEmbeddedStoreIsReachableByItsClientOnly: nothing but the limiter's
// own client reaches the embedded store. A process beside it (a sidecar in
// the pod's network) that finds a port of this process and speaks RESP to
// it must neither read a slot key nor delete it, which would let it take
// slots past api.tokensFile. Every listening TCP socket of this process
// is tried, and the address the client reports.
func TestEmbeddedStoreIsReachableByItsClientOnly(t *testing.T) {
	testenv.Proc(t) // the listening sockets are read from /proc
	s := limitertest.New(t, limitertest.Options{Backend: limitertest.Embedded})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if res, err := s.Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: "ana", Plan: "one", StreamID: "chat-1"}); err != nil || !res.Granted {
		t.Fatalf("acquire: %+v, %v; want granted", res, err)
	}
	key, err := s.Keys.UserKey("ana")
	if err != nil {
		t.Fatal(err)
	}

	addrs := append(testenv.Listening(t, "self"), s.Redis.Addrs()...)
	for _, addr := range addrs {
		if reply, ok := testenv.RawRESP(addr, "ZCARD", key); ok && reply == ":1" {
			t.Errorf("%s (a raw RESP connection) read the slot key %s: ZCARD = %s", addr, key, reply)
		}
		if reply, ok := testenv.RawRESP(addr, "DEL", key); ok && reply == ":1" {
			t.Errorf("%s (a raw RESP connection) deleted the slot key %s", addr, key)
		}
	}
	if res, err := s.Limiter.Heartbeat(ctx, limiter.HeartbeatRequest{UserID: "ana", Plan: "one", StreamID: "chat-1"}); err != nil || !res.Alive {
		t.Errorf("heartbeat after the raw connections: %+v, %v; want alive", res, err)
	}
	t.Logf("tried %d addresses: %v", len(addrs), addrs)
}
