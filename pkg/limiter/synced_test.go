package limiter_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/limiter"
)

// TestSyncReplicas: with redis.syncReplicas a grant stands when enough
// replicas confirm it; when fewer do (each cluster master has one replica,
// standalone none) it is marked Unsynced and kept on an Open plan, and on
// a Closed plan refused with ErrUnavailable and its slot released.
func TestSyncReplicas(t *testing.T) {
	tests := []struct {
		name         string
		backend      limitertest.Backend
		replicas     int
		plan         string
		wantUnsynced bool
		wantErr      error
	}{
		{"one replica confirms on the cluster", limitertest.RedisCluster, 1, "closed", false, nil},
		{"two replicas wanted on the cluster, Open keeps the grant", limitertest.RedisCluster, 2, "three", true, nil},
		{"two replicas wanted on the cluster, Closed refuses", limitertest.RedisCluster, 2, "closed", true, limiter.ErrUnavailable},
		{"a standalone server has no replica, Closed refuses", limitertest.Standalone, 1, "closed", true, limiter.ErrUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, limitertest.Options{Backend: tt.backend, Redis: cluster.Options{Timeout: time.Second}})
			lim := limiter.New(e.redis, e.table, limiter.Options{Keys: e.keys, SyncReplicas: tt.replicas})
			user := newUser(t)
			res, err := lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: tt.plan, StreamID: "s"})
			if !errors.Is(err, tt.wantErr) || (err == nil) != (tt.wantErr == nil) {
				t.Fatalf("Acquire err = %v, want %v", err, tt.wantErr)
			}
			if err != nil && !errors.Is(err, limiter.ErrUnconfirmed) {
				t.Errorf("Acquire err = %v; want it to say the replicas did not confirm the slot (ErrUnconfirmed), not only that Redis is unavailable", err)
			}
			if res.Unsynced != tt.wantUnsynced {
				t.Errorf("Unsynced = %v, want %v", res.Unsynced, tt.wantUnsynced)
			}
			if res.Granted != (tt.wantErr == nil) {
				t.Errorf("Granted = %v, want %v", res.Granted, tt.wantErr == nil)
			}
			slots, err := e.lim.Slots(context.Background(), user)
			if err != nil {
				t.Fatal(err)
			}
			if held := len(slots.Slots) == 1; held != (tt.wantErr == nil) {
				t.Errorf("slots held after the acquire: %+v; want the slot kept only when granted", slots.Slots)
			}
		})
	}
}

// TestARetryWhoseReplicasDoNotConfirmKeepsTheRunningStream: a stream runs
// (its slot granted on one replica); a retry of it on another replica
// whose WAIT is not confirmed (a Closed plan wanting 2 replicas, the
// cluster's masters having one each) is refused, and leaves only its own
// share of the slot: the running stream keeps it.
func TestARetryWhoseReplicasDoNotConfirmKeepsTheRunningStream(t *testing.T) {
	t.Parallel()
	prefix := keys.Schema{Prefix: "limitertest:" + keys.NewStreamID()[:12] + ":"}
	a := limitertest.New(t, limitertest.Options{Backend: limitertest.RedisCluster, Redis: cluster.Options{Timeout: time.Second},
		Limiter: limiter.Options{Keys: prefix}})
	b := limitertest.New(t, limitertest.Options{Backend: limitertest.RedisCluster, Redis: cluster.Options{Addrs: a.Redis.Addrs(), Timeout: time.Second},
		Limiter: limiter.Options{Keys: prefix, SyncReplicas: 2}})
	ctx := context.Background()
	user := newUser(t)
	if res, err := a.Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "closed", StreamID: "s"}); err != nil || !res.Granted {
		t.Fatalf("the running stream: %+v, %v", res, err)
	}
	if res, err := b.Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "closed", StreamID: "s"}); !errors.Is(err, limiter.ErrUnavailable) {
		t.Fatalf("the retry, unconfirmed: %+v, %v; want ErrUnavailable", res, err)
	}
	if beat, err := a.Limiter.Heartbeat(ctx, limiter.HeartbeatRequest{UserID: user, Plan: "closed", StreamID: "s"}); err != nil || !beat.Alive {
		t.Fatalf("the running stream's heartbeat after its retry was refused: %+v, %v; want alive", beat, err)
	}
}
