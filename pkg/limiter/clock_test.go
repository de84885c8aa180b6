package limiter_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/tiers"
)

// skewedRedis starts a store that runs the limiter's scripts (miniredis,
// the embedded store) with a clock skew off this host's, set again every
// millisecond, and returns its address.
func skewedRedis(t *testing.T, skew time.Duration) string {
	t.Helper()
	m := miniredis.RunT(t)
	m.SetTime(time.Now().Add(skew))
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
				m.SetTime(time.Now().Add(skew))
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
	return m.Addr()
}

// TestAWaitedPoolGrantStandsWhateverThisHostsClock (DESIGN §2: time is
// Redis's): an acquire waits for a place in a full pool key and is
// granted it. Its check that the stream still holds its user's slot reads
// the slot's score, a Redis time: with this host's clock 2s ahead of
// Redis's and a slot of 1.5s TTL, comparing the two judged the live slot
// released, answered slot_lost, and left the slot held for its TTL.
func TestAWaitedPoolGrantStandsWhateverThisHostsClock(t *testing.T) {
	for _, skew := range []time.Duration{-2 * time.Second, 2 * time.Second} {
		t.Run("redis "+skew.String()+" off this host", func(t *testing.T) {
			t.Parallel()
			table := pools.NewTable()
			if err := table.Replace([]pools.Pool{pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(1), MaxWait: 10 * time.Second}.WithDefaults()}); err != nil {
				t.Fatal(err)
			}
			s := limitertest.New(t, limitertest.Options{Redis: cluster.Options{Addrs: []string{skewedRedis(t, skew)}, Timeout: 5 * time.Second},
				Tiers: []tiers.Tier{tiers.Tier{Plan: "fast", MaxConcurrentStreams: 3, MaxWait: 10 * time.Second,
					SlotTTL: 1500 * time.Millisecond, HeartbeatInterval: 500 * time.Millisecond}.WithDefaults()},
				Limiter: limiter.Options{Pools: table}})
			ctx := context.Background()
			holder := newUser(t)
			held := mustAcquire(t, s.Limiter, holder, "fast", "m1")
			user := newUser(t)
			res, err := s.Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "fast", Pools: map[string]string{"model": "m1"}, Wait: 5 * time.Second,
				OnWait: func(time.Duration) {
					go func() {
						time.Sleep(200 * time.Millisecond)
						if _, err := s.Limiter.Release(ctx, holder, held.StreamID); err != nil {
							t.Error(err)
						}
					}()
				}})
			if err != nil || !res.Granted || res.Waited == 0 {
				slots, _ := s.Limiter.Slots(ctx, user)
				t.Fatalf("the acquire granted model=m1's place after a wait: %+v, %v (slot_lost: %v); want granted, its user's slot live (held: %d)",
					res, err, errors.Is(err, limiter.ErrSlotLost), slots.Used)
			}
		})
	}
}
