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

// queueKeys are the keys of key's queue: its tickets, their expiries and
// their records.
func queueKeys(key string) []string {
	return []string{keys.Queue(key), keys.QueueExpiry(key), keys.QueueRecords(key)}
}

// TestEmbeddedSweepDropsAbandonedQueues: a ticket whose server stopped
// refreshing it leaves its queue's keys, which on Redis expire two ticket
// TTLs past it; the embedded store expires none, so its sweep drops a
// queue, a user's or a pool key's, whose tickets all expired more than
// sweepAfter ago, and keeps one with a live ticket.
func TestEmbeddedSweepDropsAbandonedQueues(t *testing.T) {
	c, ctx := onEmbedded(t)
	redis := connected(t, c)
	store := c.embedded
	pool, err := keys.Schema{Prefix: "p:"}.PoolKey("model", "m1")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name      string
		key       string
		ticketTTL time.Duration
		kept      bool // after the sweep sweepAfter on
	}{
		{"a user's abandoned ticket", "p:{gone}", 100 * time.Millisecond, false},
		{"a pool key's abandoned ticket", pool, 100 * time.Millisecond, false},
		{"a live ticket", "p:{here}", time.Hour, true},
	}
	for _, tc := range cases {
		// The limit (0) is reached, so the ticket queues.
		w, err := lua.Wait(ctx, redis, tc.key, lua.WaitArgs{Limit: 0, SlotTTL: time.Second, TicketTTL: tc.ticketTTL, MaxQueue: 10,
			Tickets: []lua.TicketArgs{{StreamID: "s1"}}})
		if err != nil || w.Tickets[0].State != lua.TicketQueued {
			t.Fatalf("%s: wait = %+v, %v; want queued", tc.name, w, err)
		}
	}
	time.Sleep(300 * time.Millisecond) // the abandoned tickets expired
	check := func(when string, sweptAt time.Time, keptAll bool) {
		t.Helper()
		store.sweep(sweptAt)
		for _, tc := range cases {
			for _, k := range queueKeys(tc.key) {
				if got, want := store.server.Exists(k), keptAll || tc.kept; got != want {
					t.Errorf("%s, %s: %s exists = %v, want %v", when, tc.name, k, got, want)
				}
			}
		}
	}
	check("the sweep now", time.Now(), true)
	check("the sweep sweepAfter on", time.Now().Add(sweepAfter), false)
}

// TestEmbeddedSweepKeepsATicketQueuedMeanwhile: a ticket queued while the
// sweep drops the queue's long-expired tickets keeps its place, its
// expiry and its record.
func TestEmbeddedSweepKeepsATicketQueuedMeanwhile(t *testing.T) {
	c, ctx := onEmbedded(t)
	redis := connected(t, c)
	store := c.embedded
	user := "p:{w}"
	passes, stop := sweeping(store)
	defer stop()
	const tries = 1000
	lost := 0
	for i := range tries {
		for _, k := range queueKeys(user) {
			store.server.Del(k)
		}
		// A ticket abandoned 25 hours ago, as wait writes one.
		gone := time.Now().Add(-25 * time.Hour)
		_, _ = store.server.ZAdd(keys.Queue(user), float64(gone.UnixMicro()), "s0")
		_, _ = store.server.ZAdd(keys.QueueExpiry(user), float64(gone.UnixMilli()), "s0")
		store.server.HSet(keys.QueueRecords(user), "s0", "0;order=2")
		w, err := lua.Wait(ctx, redis, user, lua.WaitArgs{Limit: 0, SlotTTL: time.Second, TicketTTL: time.Minute, MaxQueue: 10,
			Tickets: []lua.TicketArgs{{StreamID: "s1"}}})
		if err != nil || w.Tickets[0].State != lua.TicketQueued {
			t.Fatalf("wait = %+v, %v; want queued", w, err)
		}
		afterPasses(passes)
		var left []string
		for _, k := range queueKeys(user) {
			if !store.server.Exists(k) {
				left = append(left, k)
			}
		}
		if len(left) > 0 {
			if lost++; lost == 1 {
				t.Logf("try %d: the ticket queued is gone after the sweep: %v missing", i, left)
			}
		}
	}
	if lost > 0 {
		t.Errorf("of %d tickets queued while the sweep ran, %d were dropped; want none", tries, lost)
	}
}
