package cluster

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/lua"
)

// sweeping runs store.sweep over and over until stop, counting passes.
func sweeping(store *embeddedStore) (passes *atomic.Int64, stop func()) {
	passes = new(atomic.Int64)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			store.sweep(time.Now())
			passes.Add(1)
		}
	})
	return passes, func() { close(done); wg.Wait() }
}

// afterPasses waits until two more passes have ended, so that a pass
// which was mid-key when the caller wrote is over.
func afterPasses(passes *atomic.Int64) {
	from := passes.Load()
	for passes.Load() < from+2 {
		time.Sleep(10 * time.Microsecond)
	}
}

// onEmbedded returns a client on the embedded store, connected, and a
// context for its calls.
func onEmbedded(t *testing.T) (*Client, context.Context) {
	t.Helper()
	c := newClient(t, Options{})
	connected(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c, ctx
}

// TestEmbeddedSweepKeepsAnOverrideSetMeanwhile: an override set right
// after the user's previous one expired, before the sweep dropped that
// one, is in force for its whole duration. The sweep must not act on the
// expiry it read before the override was set.
func TestEmbeddedSweepKeepsAnOverrideSetMeanwhile(t *testing.T) {
	c, ctx := onEmbedded(t)
	redis := connected(t, c)
	store := c.embedded
	user := "p:{u}"
	override := keys.Override(user)
	passes, stop := sweeping(store)
	defer stop()
	const tries = 3000
	lost := 0
	for i := range tries {
		// The previous override, expired a second ago, not swept yet.
		store.server.HSet(override, "limit", "1", "expires_at", strconv.FormatInt(time.Now().Add(-time.Second).UnixMilli(), 10))
		set, err := lua.SetOverride(ctx, redis, user, 7, time.Hour, "support", "ticket 1")
		if err != nil {
			t.Fatal(err)
		}
		afterPasses(passes)
		if got, found, err := lua.ReadOverride(ctx, redis, user); err != nil || !found || got.ExpiresAtMs != set.ExpiresAtMs {
			if lost++; lost == 1 {
				t.Logf("try %d: override until %d, read after the sweep = %+v, found %v, %v", i, set.ExpiresAtMs, got, found, err)
			}
		}
	}
	if lost > 0 {
		t.Errorf("%d of %d overrides set while the sweep ran were deleted in force; want none", lost, tries)
	}
}

// TestEmbeddedSweepKeepsASlotTakenMeanwhile: an acquire while the sweep
// drops the user's long-expired slots keeps its slot and the slot's
// record, whether it takes a new stream id or the expired slot's own.
func TestEmbeddedSweepKeepsASlotTakenMeanwhile(t *testing.T) {
	c, ctx := onEmbedded(t)
	redis := connected(t, c)
	store := c.embedded
	user := "p:{v}"
	records := keys.SlotRecords(user)
	passes, stop := sweeping(store)
	defer stop()
	const tries = 3000
	lostSlot, lostRecord := 0, 0
	for i := range tries {
		store.server.Del(user)
		store.server.Del(records)
		_, _ = store.server.ZAdd(user, float64(time.Now().Add(-25*time.Hour).UnixMilli()), "s1")
		store.server.HSet(records, "s1", "60000;started=1;caller=alice")
		stream := []string{"s1", "s2"}[i%2] // s1: a client's conversation id again
		got, err := lua.Acquire(ctx, redis, user, stream, 3, time.Minute, lua.Record{Caller: "alice"}, false)
		if err != nil || !got.Granted {
			t.Fatalf("acquire %s = %+v, %v; want granted", stream, got, err)
		}
		afterPasses(passes)
		switch {
		case !slotHeld(store, user, stream):
			if lostSlot++; lostSlot == 1 {
				t.Logf("try %d: slot %s granted until %d is gone after the sweep", i, stream, got.ExpiresAtMs)
			}
		case store.server.HGet(records, stream) == "":
			if lostRecord++; lostRecord == 1 {
				t.Logf("try %d: slot %s is held, its record is gone after the sweep", i, stream)
			}
		}
	}
	if lostSlot+lostRecord > 0 {
		t.Errorf("of %d acquires while the sweep ran, %d live slots were removed and %d lost their record; want none", tries, lostSlot, lostRecord)
	}
}

func slotHeld(store *embeddedStore, key, stream string) bool {
	_, err := store.server.ZScore(key, stream)
	return err == nil
}
