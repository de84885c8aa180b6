package lua_test

import (
	"context"
	"testing"
	"time"

	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/lua"
	"github.com/redis/rueidis"
)

// TestAnExtensionMovesTheSlotByItsOwnTTL (DESIGN §15): a slot taken with
// a 300ms TTL, extended by an acquire, then by a waiter's grant, of its
// plan whose TTL was raised to 30s since, moves by the 300ms its record
// keeps, as its heartbeats do: each extension answers and sets an expiry
// within 300ms, and the slot's keys outlive it by two TTLs of its own at
// most. A holder that stops heartbeating loses it after 300ms, not 30s.
func TestAnExtensionMovesTheSlotByItsOwnTTL(t *testing.T) {
	const own, raised = 300 * time.Millisecond, 30 * time.Second
	eachServer(t, func(t *testing.T, c rueidis.Client, embedded bool) {
		ctx := context.Background()
		key := newKey(t)
		took := time.Now() // before the first write of the keys' expiry
		first, err := lua.Acquire(ctx, c, key, "s", 1, own, lua.Record{Plan: "p", Token: "tokA"}, false)
		if err != nil || !first.Granted {
			t.Fatalf("acquire: %+v, %v", first, err)
		}
		check := func(what string, expiresAtMs int64) {
			t.Helper()
			if score := scoreOf(t, c, key, "s"); score != expiresAtMs {
				t.Errorf("%s: answered expiry %d, the slot's is %d; want them equal", what, expiresAtMs, score)
			}
			if ahead := expiresAtMs - first.StartedAtMs; ahead > (own + 200*time.Millisecond).Milliseconds() {
				t.Errorf("%s: the slot expires %dms after it started; want within its own TTL, %v (the plan's is %v now)", what, ahead, own, raised)
			}
			for _, k := range []string{key, keys.SlotRecords(key)} {
				at := expiretime(t, c, k)
				// The embedded store keeps a key's TTL as a duration, and its
				// PEXPIRETIME moves on with the clock from the write: at most
				// as much later as the time since the first.
				var drift int64
				if embedded {
					drift = time.Since(took).Milliseconds() + 1
				}
				if past := at - expiresAtMs; past > (2*own).Milliseconds()+drift {
					t.Errorf("%s: %s expires %dms after the slot; want at most two of its own TTLs, %v", what, k, past, 2*own)
				}
			}
		}
		ext, err := lua.Acquire(ctx, c, key, "s", 1, raised, lua.Record{Plan: "p", Token: "tokB"}, false)
		if err != nil || !ext.Extended {
			t.Fatalf("the acquire extending the slot: %+v, %v; want it extended", ext, err)
		}
		check("the acquire's extension", ext.ExpiresAtMs)
		w, err := lua.Wait(ctx, c, key, lua.WaitArgs{Limit: 1, SlotTTL: raised, TicketTTL: 5 * time.Second, MaxQueue: 10,
			Tickets: []lua.TicketArgs{{StreamID: "s", Record: lua.Record{Plan: "p", Token: "tokW"}}}})
		if err != nil || w.Tickets[0].State != lua.TicketGranted || !w.Tickets[0].Extended {
			t.Fatalf("the waiter's grant of the held stream: %+v, %v; want it granted, extended", w, err)
		}
		check("the waiter's extension", w.Tickets[0].ExpiresAtMs)
		time.Sleep(own + 200*time.Millisecond)
		if listed, err := lua.Slots(ctx, c, key, 1000); err != nil || len(listed.Slots) != 0 {
			t.Errorf("%v after the last extension, with no heartbeat: %+v, %v; want the slot expired", own+200*time.Millisecond, listed.Slots, err)
		}
	})
}

// TestAWaitedExtensionKeepsTheKeysALiveSlotsTTL: a user key holds a
// slot "short" of a 300ms TTL (taken before its plan's TTL was raised) and
// a slot "long" of 60s (taken after). A waiter's grant of the held "short"
// (extendHeld, call TTL 60s) must leave both keys outliving the latest
// slot ("long") by at least one of its TTLs (acquire.lua: "Both keys
// expire together, at least one TTL and at most two after the latest
// slot"), never pulled in to the short slot's TTL past it.
func TestAWaitedExtensionKeepsTheKeysALiveSlotsTTL(t *testing.T) {
	const own, raised = 300 * time.Millisecond, 60 * time.Second
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		key := newKey(t)
		short, err := lua.Acquire(ctx, c, key, "short", 5, own, lua.Record{Plan: "p", Token: "tokA"}, false)
		if err != nil || !short.Granted {
			t.Fatalf("acquire short: %+v, %v", short, err)
		}
		long, err := lua.Acquire(ctx, c, key, "long", 5, raised, lua.Record{Plan: "p", Token: "tokB"}, false)
		if err != nil || !long.Granted {
			t.Fatalf("acquire long: %+v, %v", long, err)
		}
		before := expiretime(t, c, key)
		w, err := lua.Wait(ctx, c, key, lua.WaitArgs{Limit: 5, SlotTTL: raised, TicketTTL: 5 * time.Second, MaxQueue: 10,
			Tickets: []lua.TicketArgs{{StreamID: "short", Record: lua.Record{Plan: "p", Token: "tokW"}}}})
		if err != nil || w.Tickets[0].State != lua.TicketGranted || !w.Tickets[0].Extended {
			t.Fatalf("the waiter's grant of the held stream: %+v, %v", w, err)
		}
		for _, k := range []string{key, keys.SlotRecords(key)} {
			at := expiretime(t, c, k)
			if past := at - long.ExpiresAtMs; past < raised.Milliseconds()-1000 {
				t.Errorf("%s expires %dms after the live 60s slot %q (it was %dms before the wait); want at least its TTL, %v",
					k, past, "long", before-long.ExpiresAtMs, raised)
			}
		}
	})
}
