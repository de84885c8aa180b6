package lua_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/lua"
	"github.com/redis/rueidis"
)

// TestAWaiterBlocksNoAcquireItCouldNotBeGranted: user v9 holds 1 of 3
// paid slots; three acquires of plan closed (limit 1) wait for v9. They
// can be granted nothing while v9 holds a slot, so a paid acquire, and a
// paid waiter, take the free slots past them; once v9 holds none, the
// closed waiters are served first, in order, ahead of a later paid one.
func TestAWaiterBlocksNoAcquireItCouldNotBeGranted(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		key := newKey(t)
		if !mustAcquire(t, c, key, "paid-1", 3).Granted {
			t.Fatal("paid-1 was not granted")
		}
		got := mustWait(t, c, key, waitArgs(1, []string{"closed-1", "closed-2", "closed-3"}))
		for i, tk := range got.Tickets {
			wantTicket(t, "closed ticket", tk, lua.TicketQueued, i+1)
		}
		if a := mustAcquire(t, c, key, "paid-2", 3); !a.Granted || a.Used != 2 {
			t.Fatalf("paid acquire behind three closed waiters = %+v, want granted with used 2", a)
		}
		// A paid waiter queued behind them is granted the third slot.
		got = mustWait(t, c, key, waitArgs(3, []string{"paid-3"}))
		wantTicket(t, "paid-3 past the closed waiters", got.Tickets[0], lua.TicketGranted, 0)
		if a := mustAcquire(t, c, key, "paid-4", 3); a.Granted {
			t.Fatalf("paid acquire with 3 of 3 held = %+v, want denied", a)
		}
		// The bound: with a limit one below what is held, still not owed.
		if a := mustAcquire(t, c, key, "closed-now", 1); a.Granted {
			t.Fatalf("closed acquire with 3 held = %+v, want denied", a)
		}
		for _, id := range []string{"paid-1", "paid-2", "paid-3"} {
			mustRelease(t, c, key, id)
		}
		// v9 holds none: closed-1 is owed the one slot its plan allows. A
		// paid stream taken first would leave it no room under its limit
		// of 1, so the paid acquire waits its turn.
		if a := mustAcquire(t, c, key, "paid-5", 3); a.Granted {
			t.Fatalf("paid acquire ahead of closed-1, owed the one slot its plan allows = %+v, want denied", a)
		}
		got = mustWait(t, c, key, waitArgs(1, []string{"closed-1", "closed-2", "closed-3"}))
		wantTicket(t, "closed-1 first", got.Tickets[0], lua.TicketGranted, 0)
		wantTicket(t, "closed-2 after it", got.Tickets[1], lua.TicketQueued, 1)
		// closed-2 and closed-3 can be granted nothing beside closed-1.
		if a := mustAcquire(t, c, key, "paid-5", 3); !a.Granted || a.Used != 2 {
			t.Fatalf("paid acquire past closed waiters at their limit = %+v, want granted with used 2", a)
		}
	})
}

// TestAStreamBelongsToTheCallerThatTookIt: another caller's acquire of a
// held stream id, heartbeat and release change nothing and say so; the
// holder's own calls, and calls that name no caller, go on as before.
func TestAStreamBelongsToTheCallerThatTookIt(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		key := newKey(t)
		owner := lua.Record{Caller: "chat-backend", Plan: "paid"}
		first, err := lua.Acquire(ctx, c, key, "secret-1", 3, time.Minute, owner, false)
		if err != nil || !first.Granted {
			t.Fatalf("owner's acquire: %+v, %v", first, err)
		}
		for _, other := range []string{"batch-jobs", "chat-backend2", "chat-backen", "Chat-backend"} {
			got, err := lua.Acquire(ctx, c, key, "secret-1", 1, 2*time.Hour, lua.Record{Caller: other, Plan: "free"}, false)
			if err != nil || got.Granted || !got.NotHolder {
				t.Errorf("%s's acquire of the held stream = %+v, %v; want NotHolder", other, got, err)
			}
			beat, err := lua.Heartbeat(ctx, c, other, key, "secret-1", time.Minute)
			if err != nil || beat.Alive || !beat.NotHolder {
				t.Errorf("%s's heartbeat = %+v, %v; want NotHolder", other, beat, err)
			}
			rel, err := lua.Release(ctx, c, other, key, "secret-1")
			if err != nil || rel.Released || !rel.NotHolder {
				t.Errorf("%s's release = %+v, %v; want NotHolder", other, rel, err)
			}
		}
		score, err := c.Do(ctx, c.B().Zscore().Key(key).Member("secret-1").Build()).AsInt64()
		if err != nil || score != first.ExpiresAtMs {
			t.Fatalf("the slot's expiry after the others' calls = %d, %v; want %d, unchanged", score, err, first.ExpiresAtMs)
		}
		slots, err := lua.Slots(ctx, c, key, 1000)
		if err != nil || len(slots.Slots) != 1 || slots.Slots[0].Record.Record != owner {
			t.Fatalf("the slot's record after the others' calls: %+v, %v; want the owner's", slots.Slots, err)
		}
		// A waiting acquire of another caller neither takes the slot nor
		// queues under its id.
		got := mustWait(t, c, key, lua.WaitArgs{Limit: 3, SlotTTL: time.Minute, TicketTTL: 10 * time.Second, MaxQueue: 10,
			Tickets: []lua.TicketArgs{{StreamID: "secret-1", Record: lua.Record{Caller: "batch-jobs"}}}})
		if got.Tickets[0].State != lua.TicketNotHolder {
			t.Errorf("another caller's wait on the held stream: state %d, want %d", got.Tickets[0].State, lua.TicketNotHolder)
		}
		// The owner's own calls, and calls that name no caller.
		if beat, err := lua.Heartbeat(ctx, c, "chat-backend", key, "secret-1", time.Minute); err != nil || !beat.Alive {
			t.Errorf("owner's heartbeat = %+v, %v; want alive", beat, err)
		}
		if got, err := lua.Acquire(ctx, c, key, "secret-1", 3, time.Minute, owner, false); err != nil || !got.Granted {
			t.Errorf("owner's re-acquire = %+v, %v; want granted", got, err)
		}
		if beat, err := lua.Heartbeat(ctx, c, "", key, "secret-1", time.Minute); err != nil || !beat.Alive {
			t.Errorf("heartbeat naming no caller = %+v, %v; want alive", beat, err)
		}
		if rel, err := lua.Release(ctx, c, "chat-backend", key, "secret-1"); err != nil || !rel.Released {
			t.Errorf("owner's release = %+v, %v; want released", rel, err)
		}
	})
}

// TestAnAcquireAsksWhoseAStreamIsOnlyWhenItIsHeld: another caller's
// acquire of a held stream changes nothing, whether the limit has room
// for one more or none; a stream whose slot expired unreleased is held by
// nobody, and goes to the next caller that asks for it; and only an
// acquire of a held stream reads its record (one command, counted on a
// server of the test's own), not a new stream's.
func TestAnAcquireAsksWhoseAStreamIsOnlyWhenItIsHeld(t *testing.T) {
	alice, mallory := lua.Record{Caller: "alice", Plan: "paid"}, lua.Record{Caller: "mallory", Plan: "paid"}
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		key := newKey(t)
		held, err := lua.Acquire(ctx, c, key, "held", 3, time.Minute, alice, false)
		if err != nil || !held.Granted {
			t.Fatalf("alice's acquire: %+v, %v", held, err)
		}
		if got, err := lua.Acquire(ctx, c, key, "brief", 3, 50*time.Millisecond, alice, false); err != nil || !got.Granted {
			t.Fatalf("alice's brief acquire: %+v, %v", got, err)
		}
		time.Sleep(150 * time.Millisecond) // brief expires, unreleased
		// Room for one more (limit 2, one live), and none (limit 1).
		for _, limit := range []int{2, 1} {
			got, err := lua.Acquire(ctx, c, key, "held", limit, 2*time.Hour, mallory, false)
			if err != nil || got.Granted || !got.NotHolder {
				t.Errorf("mallory's acquire of alice's held stream, limit %d = %+v, %v; want NotHolder", limit, got, err)
			}
		}
		if score, err := c.Do(ctx, c.B().Zscore().Key(key).Member("held").Build()).AsInt64(); err != nil || score != held.ExpiresAtMs {
			t.Errorf("alice's slot's expiry after mallory's acquires = %d, %v; want %d, unchanged", score, err, held.ExpiresAtMs)
		}
		got, err := lua.Acquire(ctx, c, key, "brief", 2, time.Minute, mallory, false)
		if err != nil || !got.Granted || got.Extended || got.NotHolder || got.Used != 2 {
			t.Fatalf("mallory's acquire of the stream alice's slot of expired = %+v, %v; want a new slot, 2 used", got, err)
		}
		slots, err := lua.Slots(ctx, c, key, 1000)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range slots.Slots {
			if want := map[string]string{"held": "alice", "brief": "mallory"}[s.StreamID]; s.Record.Caller != want {
				t.Errorf("slot %s is recorded as %q's, want %q's", s.StreamID, s.Record.Caller, want)
			}
		}
	})

	t.Run("commands", func(t *testing.T) {
		t.Parallel()
		c := privateServer(t)
		ctx := context.Background()
		key := newKey(t)
		for _, tc := range []struct {
			what   string
			stream string
			rec    lua.Record
			hgets  int
		}{
			{"a new stream's acquire", "s1", alice, 0},
			{"another new stream's", "s2", alice, 0},
			{"alice's acquire of her held stream", "s1", alice, 1},
			{"mallory's acquire of alice's held stream", "s1", mallory, 1},
			{"a new stream's acquire naming no caller", "s3", lua.Record{Plan: "paid"}, 0},
		} {
			from := commandCalls(t, c, "hget")
			if _, err := lua.Acquire(ctx, c, key, tc.stream, 5, time.Minute, tc.rec, false); err != nil {
				t.Fatal(err)
			}
			if got := commandCalls(t, c, "hget") - from; got != tc.hgets {
				t.Errorf("%s: %d HGETs, want %d", tc.what, got, tc.hgets)
			}
		}
	})
}

// TestAWaitingTicketBelongsToItsCaller: another caller cannot refresh,
// withdraw or be granted a ticket queued under a stream id it does not
// own.
func TestAWaitingTicketBelongsToItsCaller(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		key := newKey(t)
		mustAcquire(t, c, key, "holder", 1)
		mine := lua.WaitArgs{Limit: 1, SlotTTL: time.Minute, TicketTTL: 10 * time.Second, MaxQueue: 10,
			Tickets: []lua.TicketArgs{{StreamID: "w", Record: lua.Record{Caller: "alice"}}}}
		wantTicket(t, "alice's ticket", mustWait(t, c, key, mine).Tickets[0], lua.TicketQueued, 1)
		theirs := mine
		theirs.Tickets = []lua.TicketArgs{{StreamID: "w", Leave: true, Record: lua.Record{Caller: "mallory"}}}
		if got := mustWait(t, c, key, theirs).Tickets[0]; got.State != lua.TicketNotHolder {
			t.Errorf("mallory withdrawing alice's ticket: state %d, want %d", got.State, lua.TicketNotHolder)
		}
		mustRelease(t, c, key, "holder")
		theirs.Tickets[0].Leave = false
		if got := mustWait(t, c, key, theirs).Tickets[0]; got.State != lua.TicketNotHolder {
			t.Errorf("mallory taking alice's ticket's slot: state %d, want %d", got.State, lua.TicketNotHolder)
		}
		wantTicket(t, "alice's ticket, granted to alice", mustWait(t, c, key, mine).Tickets[0], lua.TicketGranted, 0)
	})
}

// TestAWaitingStreamIDIsNotAnotherCallersToAcquire: alice waits (plan
// paid, limit 2) for stream w of a user holding 2 slots, on the user's key
// and, as a pool key's member ("<stream> <user>"), on a pool key. mallory,
// allowed plan pro (limit 5), acquires w without waiting: her limit has
// room, and alice's ticket is owed nothing under its own, but the id is
// alice's while it waits, so mallory takes no slot under it. Once the
// other slots free, alice's ticket is granted (not refused as another
// caller's). An acquire naming no caller is nobody's, and alice's own
// acquire of her waiting id is hers: both are granted, as for a held slot.
func TestAWaitingStreamIDIsNotAnotherCallersToAcquire(t *testing.T) {
	alice, mallory := lua.Record{Caller: "alice", Plan: "paid"}, lua.Record{Caller: "mallory", Plan: "pro"}
	for _, scope := range []struct{ name, w string }{{"user key", "w"}, {"pool key", "w u1"}} {
		t.Run(scope.name, func(t *testing.T) {
			eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
				ctx := context.Background()
				key := newKey(t)
				for _, id := range []string{"a", "b"} {
					if got, err := lua.Acquire(ctx, c, key, id, 2, time.Minute, alice, false); err != nil || !got.Granted {
						t.Fatalf("alice's acquire of %s: %+v, %v", id, got, err)
					}
				}
				mine := lua.WaitArgs{Limit: 2, SlotTTL: time.Minute, TicketTTL: 10 * time.Second, MaxQueue: 10,
					Tickets: []lua.TicketArgs{{StreamID: scope.w, Record: alice}}}
				wantTicket(t, "alice's ticket", mustWait(t, c, key, mine).Tickets[0], lua.TicketQueued, 1)

				for _, limit := range []int{5, 2} { // room for one more, and none
					got, err := lua.Acquire(ctx, c, key, scope.w, limit, time.Minute, mallory, false)
					if err != nil || got.Granted || !got.NotHolder || !got.Waiting || got.Used != 2 {
						t.Errorf("mallory's acquire of alice's waiting id, limit %d = %+v, %v; want NotHolder and Waiting, 2 used", limit, got, err)
					}
				}
				if got, err := lua.Acquire(ctx, c, key, scope.w, 5, time.Minute, mallory, true); err != nil || got.Granted || !got.Waiting || got.WouldRefuse {
					t.Errorf("mallory's acquire of alice's waiting id in shadow mode = %+v, %v; want NotHolder and Waiting, not a shadow grant", got, err)
				}
				if n := zcard(t, c, key); n != 2 {
					t.Errorf("slots after mallory's acquires: %d, want 2", n)
				}
				for _, id := range []string{"a", "b"} {
					if _, err := lua.Release(ctx, c, "alice", key, id); err != nil {
						t.Fatal(err)
					}
				}
				wantTicket(t, "alice's ticket once slots are free", mustWait(t, c, key, mine).Tickets[0], lua.TicketGranted, 0)
			})
		})
	}

	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		key := newKey(t)
		mustAcquire(t, c, key, "holder", 1)
		mine := lua.WaitArgs{Limit: 1, SlotTTL: time.Minute, TicketTTL: 10 * time.Second, MaxQueue: 10,
			Tickets: []lua.TicketArgs{{StreamID: "w", Record: alice}, {StreamID: "v", Record: alice}}}
		got := mustWait(t, c, key, mine)
		wantTicket(t, "alice's ticket w", got.Tickets[0], lua.TicketQueued, 1)
		wantTicket(t, "alice's ticket v", got.Tickets[1], lua.TicketQueued, 2)
		for _, tc := range []struct {
			what, id string
			rec      lua.Record
		}{
			{"alice's own acquire of her waiting id", "w", lua.Record{Caller: "alice", Plan: "pro"}},
			{"an acquire naming no caller", "v", lua.Record{Plan: "pro"}},
		} {
			if a, err := lua.Acquire(ctx, c, key, tc.id, 5, time.Minute, tc.rec, false); err != nil || !a.Granted || a.NotHolder {
				t.Errorf("%s = %+v, %v; want granted", tc.what, a, err)
			}
		}
	})
}

// TestAReacquireRestoresALostRecordWithItsExpiry: a held slot whose
// records hash was lost gets its record back on a re-acquire, and the
// hash expires with the slots' key (no record outlives its slot).
func TestAReacquireRestoresALostRecordWithItsExpiry(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, embedded bool) {
		ctx := context.Background()
		key := newKey(t)
		if got, err := lua.Acquire(ctx, c, key, "s", 3, time.Minute, lua.Record{Plan: "paid"}, false); err != nil || !got.Granted {
			t.Fatalf("acquire: %+v, %v", got, err)
		}
		if err := c.Do(ctx, c.B().Del().Key(keys.SlotRecords(key)).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		// Soon after: the key's expiry is far enough out not to move.
		if got, err := lua.Acquire(ctx, c, key, "s", 3, time.Minute, lua.Record{Plan: "paid"}, false); err != nil || !got.Granted {
			t.Fatalf("re-acquire: %+v, %v", got, err)
		}
		rec, err := c.Do(ctx, c.B().Hget().Key(keys.SlotRecords(key)).Field("s").Build()).ToString()
		if err != nil || rec == "" {
			t.Fatalf("record after the re-acquire: %q, %v; want one", rec, err)
		}
		ttl, err := c.Do(ctx, c.B().Pttl().Key(keys.SlotRecords(key)).Build()).AsInt64()
		if err != nil || ttl <= 0 {
			t.Errorf("records hash PTTL = %d, %v; want an expiry (a record must not outlive its slot)", ttl, err)
		}
		keyTTL, _ := c.Do(ctx, c.B().Pttl().Key(key).Build()).AsInt64()
		if !embedded && ttl < keyTTL-1000 {
			t.Errorf("records hash PTTL %d, slots key %d: want them to expire together", ttl, keyTTL)
		}
	})
}

// TestAnAcquireLeavesAWaiterOwedASlotRoomUnderItsLimit: the user holds 2
// under a plan of 2 and a waiter of that plan queues; one slot frees, so
// the waiter is owed it. An acquire under a plan of 3 that does not wait
// would fit (2 < 3) but leave the waiter none under its own limit: it is
// denied until the waiter is served, then granted.
func TestAnAcquireLeavesAWaiterOwedASlotRoomUnderItsLimit(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		key := newKey(t)
		mustAcquire(t, c, key, "a", 2)
		mustAcquire(t, c, key, "b", 2)
		wantTicket(t, "w queued", mustWait(t, c, key, waitArgs(2, []string{"w"})).Tickets[0], lua.TicketQueued, 1)
		if rel := mustRelease(t, c, key, "a"); rel.Head != "w" {
			t.Fatalf("release = %+v, want w to wake, owed the freed slot", rel)
		}
		if a := mustAcquire(t, c, key, "x", 3); a.Granted {
			t.Fatalf("acquire under 3 ahead of w, owed the slot its limit of 2 allows = %+v, want denied", a)
		}
		wantTicket(t, "w granted", mustWait(t, c, key, waitArgs(2, []string{"w"})).Tickets[0], lua.TicketGranted, 0)
		if a := mustAcquire(t, c, key, "x", 3); !a.Granted || a.Used != 3 {
			t.Fatalf("acquire under 3 once w is served = %+v, want granted with used 3", a)
		}
	})
}

// TestTheCallerIsReadOnlyWhereItIsRecorded: a label or a user id that
// spells ';caller=' names no holder: a slot taken with no caller stays
// anyone's, and one taken by chat stays chat's.
func TestTheCallerIsReadOnlyWhereItIsRecorded(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		key := newKey(t)
		if got, err := lua.Acquire(ctx, c, key, "open", 3, time.Minute, lua.Record{Label: "x;caller=mallory"}, false); err != nil || !got.Granted {
			t.Fatalf("acquire: %+v, %v", got, err)
		}
		if beat, err := lua.Heartbeat(ctx, c, "chat", key, "open", time.Minute); err != nil || !beat.Alive {
			t.Errorf("heartbeat of a slot with no caller whose label spells one: %+v, %v; want alive", beat, err)
		}
		if got, err := lua.Acquire(ctx, c, key, "chats", 3, time.Minute, lua.Record{Caller: "chat", Label: ";caller=mallory"}, false); err != nil || !got.Granted {
			t.Fatalf("acquire: %+v, %v", got, err)
		}
		if beat, err := lua.Heartbeat(ctx, c, "mallory", key, "chats", time.Minute); err != nil || !beat.NotHolder {
			t.Errorf("mallory's heartbeat of chat's slot labelled ';caller=mallory': %+v, %v; want NotHolder", beat, err)
		}
	})
}

// TestEachRequestOfAStreamLeavesItsShareOfTheSlot: each acquire of a
// held stream counts one more extension in its record (after the caller,
// where a label spelling ';again=' or ';left=' is not read), and holds
// that share of the slot: a request that gives up leaves its share, asked
// once or again, and the slot goes with the last share, in any order.
// A share of a later slot of the stream (another start), or one past the
// count, changes nothing; a release not owned releases the slot whatever
// its shares. The record's caller still holds the slot after its
// extensions and leaves.
func TestEachRequestOfAStreamLeavesItsShareOfTheSlot(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		key := newKey(t)
		held := func() bool {
			t.Helper()
			_, err := c.Do(ctx, c.B().Zscore().Key(key).Member("s").Build()).AsInt64()
			if err != nil && !rueidis.IsRedisNil(err) {
				t.Fatal(err)
			}
			return err == nil
		}
		for _, order := range [][]int{{0, 1, 2}, {2, 1, 0}, {1, 2, 0}} {
			for _, rec := range []lua.Record{{Caller: "chat", Plan: "paid", Label: ";again=7;left=0.1.2"}, {Plan: "paid", Label: "x;left=9"}} {
				first, err := lua.Acquire(ctx, c, key, "s", 3, time.Minute, rec, false)
				if err != nil || !first.Granted || first.Extended || first.Share().Index != 0 || first.StartedAtMs == 0 {
					t.Fatalf("the first acquire (%+v): %+v, %v; want a new slot, share 0, its start", rec, first, err)
				}
				shares := []lua.Share{first.Share()}
				for n := 1; n <= 2; n++ {
					got, err := lua.Acquire(ctx, c, key, "s", 3, time.Minute, rec, false)
					if err != nil || !got.Extended || got.Share() != (lua.Share{Index: n, StartedAtMs: first.StartedAtMs}) {
						t.Fatalf("acquire %d of the held stream: %+v (share %+v), %v; want extended, share %d of the first's start", n+1, got, got.Share(), err, n)
					}
					if r := lua.ParseRecord(got.Record); r.Caller != rec.Caller || r.Label != rec.Label || r.Plan != rec.Plan {
						t.Fatalf("the extended record reads %+v; want the caller, plan and label of %+v", r, rec)
					}
					shares = append(shares, got.Share())
				}
				for _, stale := range []lua.Share{{Index: 3, StartedAtMs: first.StartedAtMs}, {Index: 0, StartedAtMs: first.StartedAtMs - 1}, {Index: 0, StartedAtMs: first.StartedAtMs + 1}} {
					rel, err := lua.ReleaseMember(ctx, c, "", lua.Member{Key: key, ID: "s", Owned: true, Share: stale})
					if err != nil || rel.Released || !rel.Superseded || !held() {
						t.Fatalf("leaving share %+v of a slot started at %d with 3 shares: %+v, %v; want kept", stale, first.StartedAtMs, rel, err)
					}
				}
				for k, i := range order {
					for range 2 { // a leave asked again changes nothing more
						rel, err := lua.ReleaseMember(ctx, c, "", lua.Member{Key: key, ID: "s", Owned: true, Share: shares[i]})
						last := k == len(order)-1
						if err != nil || rel.Released != last || held() == last {
							t.Fatalf("order %v, leaving share %d (%d of 3 left): %+v, %v, held %v; want released only by the last", order, i, k+1, rel, err, held())
						}
						if last {
							break
						}
						if rec.Caller != "" {
							if beat, err := lua.Heartbeat(ctx, c, "mallory", key, "s", time.Minute); err != nil || !beat.NotHolder {
								t.Fatalf("another caller's heartbeat of the slot shares left: %+v, %v; want NotHolder", beat, err)
							}
						}
						if beat, err := lua.Heartbeat(ctx, c, rec.Caller, key, "s", time.Minute); err != nil || !beat.Alive {
							t.Fatalf("the holder's heartbeat of the slot shares left: %+v, %v; want alive", beat, err)
						}
					}
				}
			}
		}
		if got, err := lua.Acquire(ctx, c, key, "u", 3, time.Minute, lua.Record{}, false); err != nil || !got.Granted {
			t.Fatalf("acquire: %+v, %v", got, err)
		}
		if got, err := lua.Acquire(ctx, c, key, "u", 3, time.Minute, lua.Record{}, false); err != nil || got.Again() != 1 {
			t.Fatalf("re-acquire: %+v, %v; want counting 1", got, err)
		}
		if rel, err := lua.Release(ctx, c, "", key, "u"); err != nil || !rel.Released {
			t.Fatalf("a release not owned of an extended slot: %+v, %v; want released", rel, err)
		}
	})
}

// TestAnAcquireAskedAgainIsAnsweredTheShareItTook: a request's acquire
// whose reply was lost is sent again (rueidis does, on a fresh
// connection); the record keeps the tokens of the requests that took
// the shares held, so the call asked again is answered the share its first
// try took, with nothing counted twice: a new slot as a new slot (share
// 0, its start), an extension as that extension. Another token, one that
// differs by one character, or a label spelling the token's field, is
// another request: one more extension.
func TestAnAcquireAskedAgainIsAnsweredTheShareItTook(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		acquire := func(key string, rec lua.Record) lua.Acquired {
			t.Helper()
			got, err := lua.Acquire(ctx, c, key, "s", 3, time.Minute, rec, false)
			if err != nil || !got.Granted {
				t.Fatalf("acquire %+v: %+v, %v", rec, got, err)
			}
			return got
		}
		key := newKey(t)
		first := acquire(key, lua.Record{Caller: "chat", Plan: "paid", Token: "tokA"})
		again := acquire(key, lua.Record{Caller: "chat", Plan: "paid", Token: "tokA"})
		if first.Extended || again.Extended || again.Share() != first.Share() || again.Share().Index != 0 || again.Used != 1 {
			t.Fatalf("a new slot's acquire asked again: %+v after %+v; want a new slot, share 0 of its start, as the first try", again, first)
		}
		b1 := acquire(key, lua.Record{Caller: "chat", Plan: "paid", Token: "tokB"})
		b2 := acquire(key, lua.Record{Caller: "chat", Plan: "paid", Token: "tokB"})
		if !b1.Extended || !b2.Extended || b1.Share() != (lua.Share{Index: 1, StartedAtMs: first.StartedAtMs}) || b2.Share() != b1.Share() {
			t.Fatalf("another request's extension, asked again: %+v, then %+v; want share 1 of the first's start both times", b1.Share(), b2.Share())
		}
		// Share 0 leaves; the record keeps B's token: B asked again is
		// still share 1.
		if rel, err := lua.ReleaseMember(ctx, c, "", lua.Member{Key: key, ID: "s", Owned: true, Share: first.Share()}); err != nil || !rel.Superseded {
			t.Fatalf("leaving share 0 while share 1 is held: %+v, %v; want kept", rel, err)
		}
		if b3 := acquire(key, lua.Record{Caller: "chat", Plan: "paid", Token: "tokB"}); b3.Share() != b1.Share() {
			t.Fatalf("B asked again after share 0 left: share %+v; want %+v", b3.Share(), b1.Share())
		}
		for i, other := range []lua.Record{{Caller: "chat", Plan: "paid", Token: "tokC"}, {Caller: "chat", Plan: "paid", Token: "tokB0"}, {Caller: "chat", Plan: "paid", Token: "tok"}} {
			if got := acquire(key, other); got.Share().Index != 2+i {
				t.Fatalf("request %+v: share %d; want %d, one more extension", other, got.Share().Index, 2+i)
			}
		}
		// The slot goes with the last share: B's (1) and the three others'.
		for i := 1; i <= 4; i++ {
			rel, err := lua.ReleaseMember(ctx, c, "", lua.Member{Key: key, ID: "s", Owned: true, Share: lua.Share{Index: i, StartedAtMs: first.StartedAtMs}})
			if err != nil || rel.Released != (i == 4) {
				t.Fatalf("leaving share %d of 4: %+v, %v; want released by the last only", i, rel, err)
			}
		}

		// A label spelling the token's field is not read as one.
		key = newKey(t)
		acquire(key, lua.Record{Plan: "paid", Label: ";by=0@tokL;again=0@tokL"})
		if got := acquire(key, lua.Record{Plan: "paid", Token: "tokL"}); !got.Extended || got.Share().Index != 1 {
			t.Fatalf("a request whose token a label spells: %+v; want an extension, share 1", got)
		}
	})
}

// TestARequestThatGivesUpGivesBackTheTimeItAdded: a request's acquire
// that extended a held slot to a later expiry says by how much
// (Extension); the request, giving up, leaves its share and gives the
// time back, so that a slot a crashed try left expires by its own score
// however often a retry, refused, extends it. Time a heartbeat added
// since is not given back, nor is any by a share that is not the
// slot's; an extension that added none gives none back.
func TestARequestThatGivesUpGivesBackTheTimeItAdded(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		key := newKey(t)
		acquire := func(tok string, ttl time.Duration) lua.Acquired {
			t.Helper()
			got, err := lua.Acquire(ctx, c, key, "s", 3, ttl, lua.Record{Plan: "paid", Token: tok}, false)
			if err != nil || !got.Granted {
				t.Fatalf("acquire %s: %+v, %v", tok, got, err)
			}
			return got
		}
		score := func() int64 { t.Helper(); return scoreOf(t, c, key, "s") }
		leave := func(a lua.Acquired) lua.Released {
			t.Helper()
			rel, err := lua.ReleaseMember(ctx, c, "", lua.Member{Key: key, ID: "s", Owned: true, Share: a.Share(), Back: a.Extension()})
			if err != nil {
				t.Fatal(err)
			}
			return rel
		}
		first := acquire("tokA", time.Minute)
		if first.Extension() != (lua.Extension{}) {
			t.Fatalf("a new slot's acquire: extension %+v; want none", first.Extension())
		}
		for i, tok := range []string{"tokB", "tokC"} {
			time.Sleep(3 * time.Millisecond) // a later expiry
			retry := acquire(tok, time.Minute)
			if ext := retry.Extension(); !retry.Extended || ext.FromMs != first.ExpiresAtMs || ext.ToMs != retry.ExpiresAtMs || ext.ToMs <= ext.FromMs || score() != ext.ToMs {
				t.Fatalf("extension %d: %+v (extension %+v), score %d; want from %d to its expiry", i+1, retry, ext, score(), first.ExpiresAtMs)
			}
			if rel := leave(retry); !rel.Superseded || score() != first.ExpiresAtMs {
				t.Fatalf("extension %d, given up: %+v, score %d; want the slot kept for share 0, at its expiry %d", i+1, rel, score(), first.ExpiresAtMs)
			}
		}

		// A heartbeat since: its time stays.
		time.Sleep(3 * time.Millisecond)
		d := acquire("tokD", time.Minute)
		time.Sleep(3 * time.Millisecond)
		beat, err := lua.Heartbeat(ctx, c, "", key, "s", time.Minute)
		if err != nil || !beat.Alive || beat.ExpiresAtMs <= d.Extension().ToMs {
			t.Fatalf("heartbeat: %+v, %v; want alive, later than %d", beat, err, d.Extension().ToMs)
		}
		if rel := leave(d); !rel.Superseded || score() != beat.ExpiresAtMs {
			t.Fatalf("an extension given up after a heartbeat: %+v, score %d; want the heartbeat's %d", rel, score(), beat.ExpiresAtMs)
		}

		// A share that is not the slot's gives nothing back.
		time.Sleep(3 * time.Millisecond)
		e := acquire("tokE", time.Minute)
		stale := lua.Member{Key: key, ID: "s", Owned: true, Share: lua.Share{Index: e.Share().Index, StartedAtMs: first.StartedAtMs + 1}, Back: e.Extension()}
		if rel, err := lua.ReleaseMember(ctx, c, "", stale); err != nil || !rel.Superseded || score() != e.ExpiresAtMs {
			t.Fatalf("a share of another start, given up: %+v, %v, score %d; want kept at %d", rel, err, score(), e.ExpiresAtMs)
		}

		// An extension to an earlier expiry than the slot's, which another
		// request's extension set (one of the previous release, during a
		// rolling update, which extends by its plan's TTL, longer than the
		// slot's own): answered that expiry, made its own by a ms, so
		// that the other, giving up, takes nothing from under it; giving
		// up itself, it gives back the ms.
		arr, err := previousAcquire.Exec(ctx, c, lua.AcquireKeys(key), []string{"s", "3", "600000", ";by=0@tokG;plan=paid", "1"}).ToArray()
		if err != nil || len(arr) != 9 {
			t.Fatalf("the previous release's longer extension: %v, %v", arr, err)
		}
		longer, _ := arr[2].AsInt64()
		if granted, _ := arr[0].AsInt64(); granted != 2 || longer != score() || longer <= e.ExpiresAtMs {
			t.Fatalf("the previous release's longer extension: granted %d expiring at %d; want 2, the slot's %d, later than %d", granted, longer, score(), e.ExpiresAtMs)
		}
		short := acquire("tokF", time.Second)
		if want := (lua.Extension{FromMs: longer, ToMs: longer + 1}); !short.Extended || short.Extension() != want || short.ExpiresAtMs != want.ToMs || score() != want.ToMs {
			t.Fatalf("an extension by the slot's own, shorter, TTL: %+v (extension %+v), score %d; want extended by a ms, %+v", short, short.Extension(), score(), want)
		}
		longerShare := lua.Member{Key: key, ID: "s", Owned: true, Share: lua.Share{Index: short.Share().Index - 1, StartedAtMs: first.StartedAtMs},
			Back: lua.Extension{FromMs: e.ExpiresAtMs, ToMs: longer}}
		if rel, err := lua.ReleaseMember(ctx, c, "", longerShare); err != nil || rel.Released || score() != short.ExpiresAtMs {
			t.Fatalf("the longer extension given up under the shorter one's: %+v, %v, score %d; want kept at the expiry the shorter one was answered, %d", rel, err, score(), short.ExpiresAtMs)
		}
		if rel := leave(short); !rel.Superseded || score() != longer {
			t.Fatalf("the shorter extension given up: %+v, score %d; want its ms given back, %d", rel, score(), longer)
		}
	})
}

// TestAShadowGrantAskedAgainSaysItWouldRefuse: a new slot shadow mode
// let in over the limit (WouldRefuse), whose reply is lost, is asked
// again: it is answered as the first try was, WouldRefuse too, so that
// the grant is counted as a shadow refusal.
func TestAShadowGrantAskedAgainSaysItWouldRefuse(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		key := newKey(t)
		if got, err := lua.Acquire(ctx, c, key, "other", 1, time.Minute, lua.Record{Plan: "p"}, true); err != nil || !got.Granted {
			t.Fatalf("other: %+v, %v", got, err)
		}
		rec := lua.Record{Plan: "p", Token: "tokA"}
		first, err := lua.Acquire(ctx, c, key, "s", 1, time.Minute, rec, true)
		if err != nil || !first.Granted || !first.WouldRefuse {
			t.Fatalf("first try: %+v, %v", first, err)
		}
		again, err := lua.Acquire(ctx, c, key, "s", 1, time.Minute, rec, true)
		if err != nil {
			t.Fatal(err)
		}
		if again.Extended || again.WouldRefuse != first.WouldRefuse || again.Used != first.Used {
			t.Errorf("asked again: Extended %v WouldRefuse %v Used %d; want as the first try: Extended false WouldRefuse %v Used %d",
				again.Extended, again.WouldRefuse, again.Used, first.WouldRefuse, first.Used)
		}
	})
}

// grantedTicket queues stream "s" of a request (token tokW) behind
// another stream on a plan of 1, releases that one, and returns the wait
// call and its first answer, which granted the ticket a new slot.
func grantedTicket(t *testing.T, c rueidis.Client, key string) (lua.WaitArgs, lua.Waited) {
	t.Helper()
	ctx := context.Background()
	if got, err := lua.Acquire(ctx, c, key, "x", 1, time.Minute, lua.Record{Plan: "one"}, false); err != nil || !got.Granted {
		t.Fatalf("x: %+v, %v", got, err)
	}
	args := lua.WaitArgs{Limit: 1, SlotTTL: time.Minute, TicketTTL: 10 * time.Second, MaxQueue: 10,
		Tickets: []lua.TicketArgs{{StreamID: "s", Record: lua.Record{Plan: "one", Token: "tokW"}}}}
	if w, err := lua.Wait(ctx, c, key, args); err != nil || w.Tickets[0].State != lua.TicketQueued {
		t.Fatalf("queue: %+v, %v", w, err)
	}
	if _, err := lua.Release(ctx, c, "", key, "x"); err != nil {
		t.Fatal(err)
	}
	first, err := lua.Wait(ctx, c, key, args)
	if err != nil || first.Tickets[0].State != lua.TicketGranted || first.Tickets[0].Extended {
		t.Fatalf("grant: %+v, %v", first, err)
	}
	return args, first
}

// TestAWaitGrantAskedAgainIsAnsweredAsItWas: the wait script is sent
// again after a lost reply too. A call that granted its ticket a new
// slot (share 0), asked again, finds the ticket gone and the stream
// held: it is the same request (its ticket's token), answered the new
// slot and share 0 as the first try was, so that leaving that share
// releases the slot. Another request's ticket (another token) is an
// extension.
func TestAWaitGrantAskedAgainIsAnsweredAsItWas(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		key := newKey(t)
		args, first := grantedTicket(t, c, key)
		again, err := lua.Wait(ctx, c, key, args) // the same call, sent again
		if err != nil {
			t.Fatal(err)
		}
		g := again.Tickets[0]
		if g.Extended || g.Share != first.Tickets[0].Share {
			t.Errorf("the grant asked again: Extended %v share %+v; want the first try's answer: a new slot, share %+v", g.Extended, g.Share, first.Tickets[0].Share)
		}
		rel, err := lua.ReleaseMember(ctx, c, "", lua.Member{Key: key, ID: "s", Owned: true, Share: g.Share})
		if err != nil || !rel.Released {
			t.Errorf("the request gives up, leaving the share it was answered: %+v, %v; want the slot released (no other request holds it)", rel, err)
		}
	})
}

// streamS acquires and leaves shares of stream "s" of key, on a plan
// of 3, for requests named by their tokens.
type streamS struct {
	t   *testing.T
	c   rueidis.Client
	key string
}

func (s *streamS) acquire(tok string) lua.Acquired {
	s.t.Helper()
	got, err := lua.Acquire(context.Background(), s.c, s.key, "s", 3, time.Minute, lua.Record{Plan: "paid", Token: tok}, false)
	if err != nil || !got.Granted {
		s.t.Fatalf("acquire %s: %+v, %v", tok, got, err)
	}
	return got
}

func (s *streamS) leave(share lua.Share) lua.Released {
	s.t.Helper()
	rel, err := lua.ReleaseMember(context.Background(), s.c, "", lua.Member{Key: s.key, ID: "s", Owned: true, Share: share})
	if err != nil {
		s.t.Fatal(err)
	}
	return rel
}

// TestARequestThatLeftItsShareAndAcquiresAgainTakesAnother: a request
// that left its share (a pooled acquire leaves the later keys its tries
// took before it waits in a full key's queue, then joins them again in
// turn, with the same token) and acquires again while another request of
// the stream holds its share is not answered the share it left: it
// extends the slot, so that the other request's leaving does not release
// the slot under it.
func TestARequestThatLeftItsShareAndAcquiresAgainTakesAnother(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		st := &streamS{t: t, c: c, key: newKey(t)}
		acq, leave := st.acquire, st.leave
		r1 := acq("tok1")
		r := acq("tokR")
		if rel := leave(r.Share()); !rel.Superseded {
			t.Fatalf("R leaves share 1: %+v", rel)
		}
		again := acq("tokR") // R joins the key again, after its wait
		if !again.Extended || again.Share().Index != 2 {
			t.Errorf("R's acquire after it left share %d: %+v; want an extension, share 2", r.Share().Index, again)
		}
		if rel := leave(r1.Share()); rel.Released {
			t.Errorf("R1 left share 0 while R holds the grant it acquired again (answered share %d, already left): the slot was released under R",
				again.Share().Index)
		}
	})
}

// TestAShadowGrantBehindAWaiterAskedAgainSaysItWouldRefuse: a
// shadow-mode acquire whose slot is owed to a waiting ticket (of an
// enforced plan of the same user) is granted over the limit
// (WouldRefuse) with used == limit; the same call sent again (its reply
// lost) says so too: the record keeps what its first try answered.
func TestAShadowGrantBehindAWaiterAskedAgainSaysItWouldRefuse(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		key := newKey(t)
		if got, err := lua.Acquire(ctx, c, key, "x", 1, time.Minute, lua.Record{Plan: "one"}, false); err != nil || !got.Granted {
			t.Fatalf("x: %+v, %v", got, err)
		}
		args := lua.WaitArgs{Limit: 1, SlotTTL: time.Minute, TicketTTL: 30 * time.Second, MaxQueue: 10,
			Tickets: []lua.TicketArgs{{StreamID: "q", Record: lua.Record{Plan: "one", Token: "tokQ"}}}}
		if w, err := lua.Wait(ctx, c, key, args); err != nil || w.Tickets[0].State != lua.TicketQueued {
			t.Fatalf("queue q: %+v, %v", w, err)
		}
		if _, err := lua.Release(ctx, c, "", key, "x"); err != nil { // the free slot is owed to q
			t.Fatal(err)
		}
		rec := lua.Record{Plan: "shadowplan", Token: "tokS"}
		first, err := lua.Acquire(ctx, c, key, "s", 1, time.Minute, rec, true)
		if err != nil || !first.Granted || !first.WouldRefuse {
			t.Fatalf("first try: %+v, %v; want granted with WouldRefuse (the slot is owed to q)", first, err)
		}
		again, err := lua.Acquire(ctx, c, key, "s", 1, time.Minute, rec, true)
		if err != nil {
			t.Fatal(err)
		}
		if again.Extended || again.WouldRefuse != first.WouldRefuse || again.Used != first.Used {
			t.Errorf("asked again: Extended %v WouldRefuse %v Used %d; first try: WouldRefuse %v Used %d",
				again.Extended, again.WouldRefuse, again.Used, first.WouldRefuse, first.Used)
		}
	})
}

// TestAShadowGrantAskedAgainAfterAnotherStreamSaysWhatItSaid: a shadow
// acquire under the limit (WouldRefuse false) is sent again after
// another stream was let in over the limit between the two runs: the
// re-run says what the first try said, not that it would be refused.
func TestAShadowGrantAskedAgainAfterAnotherStreamSaysWhatItSaid(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		key := newKey(t)
		rec := lua.Record{Plan: "p", Token: "tokS"}
		first, err := lua.Acquire(ctx, c, key, "s", 1, time.Minute, rec, true)
		if err != nil || !first.Granted || first.WouldRefuse {
			t.Fatalf("first: %+v, %v", first, err)
		}
		if got, err := lua.Acquire(ctx, c, key, "other", 1, time.Minute, lua.Record{Plan: "p"}, true); err != nil || !got.Granted || !got.WouldRefuse {
			t.Fatalf("other: %+v, %v", got, err)
		}
		again, err := lua.Acquire(ctx, c, key, "s", 1, time.Minute, rec, true)
		if err != nil {
			t.Fatal(err)
		}
		if again.Extended || again.WouldRefuse != first.WouldRefuse {
			t.Errorf("asked again: Extended %v WouldRefuse %v; first try: WouldRefuse %v", again.Extended, again.WouldRefuse, first.WouldRefuse)
		}
	})
}

// TestAnAcquireAskedAgainAfterOthersExtendedIsAnsweredItsShare: a
// request's call, asked again after its reply was lost, is answered the
// share its first try took even when other requests of the stream (a
// client's retries, another replica's waiters of a ticket) extended the
// slot in between: up to seven of them; past that it counts one more
// share, as the record names the latest eight requests. Leaving each
// share answered then releases the slot with the last, and not before.
func TestAnAcquireAskedAgainAfterOthersExtendedIsAnsweredItsShare(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		st := &streamS{t: t, c: c}
		acq, leave := st.acquire, st.leave

		// A new slot's acquire, asked again after B extended it.
		st.key = newKey(t)
		a := acq("tokA")
		b := acq("tokB")
		a2 := acq("tokA")
		if a2.Extended || a2.Share() != a.Share() {
			t.Fatalf("A asked again after B extended: Extended %v share %+v; want the first try's answer: a new slot, share %+v", a2.Extended, a2.Share(), a.Share())
		}
		// An extension asked again after C extended the slot too.
		c3 := acq("tokC")
		b2 := acq("tokB")
		if !b2.Extended || b2.Share() != b.Share() {
			t.Fatalf("B asked again after C extended: share %+v; want %+v", b2.Share(), b.Share())
		}
		for _, s := range []lua.Share{a.Share(), b.Share()} {
			if rel := leave(s); rel.Released {
				t.Fatalf("leaving share %d of three: released; want kept for C's", s.Index)
			}
		}
		if rel := leave(c3.Share()); !rel.Released {
			t.Fatalf("leaving C's share, the last: %+v; want released", rel)
		}

		// The bound: seven other requests in between keep A's share named,
		// eight do not.
		for others, named := range map[int]bool{7: true, 8: false} {
			st.key = newKey(t)
			a := acq("tokA")
			for i := range others {
				acq("tokX" + strconv.Itoa(i))
			}
			a2 := acq("tokA")
			if named && (a2.Extended || a2.Share() != a.Share()) {
				t.Errorf("A asked again after %d others extended: share %+v; want its first try's, %+v", others, a2.Share(), a.Share())
			}
			if !named && (!a2.Extended || a2.Share().Index != others+1) {
				t.Errorf("A asked again after %d others extended: %+v; want one more share, %d (the record names eight requests)", others, a2.Share(), others+1)
			}
		}
	})
}

// TestAWaitGrantAskedAgainAfterAnotherRequestExtendedIsAnsweredAsItWas:
// the waiters of one stream on two replicas share a ticket and are woken
// together, so another request's call can land between a wait grant
// whose reply was lost and the same call sent again. That call is
// answered as its first try was, and the request's share is the slot's
// first: leaving it and the other request's releases the slot.
func TestAWaitGrantAskedAgainAfterAnotherRequestExtendedIsAnsweredAsItWas(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		key := newKey(t)
		args, first := grantedTicket(t, c, key)
		other, err := lua.Acquire(ctx, c, key, "s", 1, time.Minute, lua.Record{Plan: "one", Token: "tokO"}, false)
		if err != nil || !other.Extended {
			t.Fatalf("the other request: %+v, %v; want an extension", other, err)
		}
		again, err := lua.Wait(ctx, c, key, args) // the first call, sent again
		if err != nil {
			t.Fatal(err)
		}
		if g := again.Tickets[0]; g.Extended || g.Share != first.Tickets[0].Share {
			t.Fatalf("the grant asked again: Extended %v share %+v; want the first try's answer: a new slot, share %+v", g.Extended, g.Share, first.Tickets[0].Share)
		}
		for i, s := range []lua.Share{again.Tickets[0].Share, other.Share()} {
			rel, err := lua.ReleaseMember(ctx, c, "", lua.Member{Key: key, ID: "s", Owned: true, Share: s})
			if err != nil || rel.Released != (i == 1) {
				t.Fatalf("leaving share %d: %+v, %v; want the slot released with the second of two", s.Index, rel, err)
			}
		}
	})
}

// TestTokensThatSpellSharesOrPrefixesAreEachTheirOwn: tokens are
// base64url, so one may be all digits, spell a share's number, or be a
// prefix of another; and a label may spell the list of requests. Eight
// requests so named take the slot and extend it, each is asked again
// after all of them, and each is answered its own share; leaving them
// releases the slot with the last, and not before.
func TestTokensThatSpellSharesOrPrefixesAreEachTheirOwn(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		key := newKey(t)
		acquire := func(rec lua.Record) lua.Acquired {
			t.Helper()
			got, err := lua.Acquire(ctx, c, key, "s", 3, time.Minute, rec, false)
			if err != nil || !got.Granted {
				t.Fatalf("acquire %+v: %+v, %v", rec, got, err)
			}
			return got
		}
		tokens := []string{"1", "10", "0", "1-", "01", "A", "A_", "a"}
		shares := make([]lua.Share, len(tokens))
		for i, tok := range tokens {
			shares[i] = acquire(lua.Record{Plan: "p", Token: tok, Label: ";by=0@1.1@10"}).Share()
		}
		for i, tok := range tokens {
			if got := acquire(lua.Record{Plan: "p", Token: tok}); got.Share() != shares[i] || got.Extended != (i > 0) {
				t.Errorf("token %q asked again: share %d, Extended %v; want share %d, as its first try", tok, got.Share().Index, got.Extended, shares[i].Index)
			}
		}
		st := &streamS{t: t, c: c, key: key}
		for i, s := range shares {
			if rel := st.leave(s); rel.Released != (i == len(shares)-1) {
				t.Errorf("leaving share %d of %d: %+v; want the slot released by the last only", s.Index, len(shares), rel)
			}
		}
	})
}

// TestAShadowGrantAskedAgainAfterOthersExtendedSaysItWouldRefuse: a new
// slot shadow mode let in over its limit, asked again after two other
// requests extended it, is answered as its first try was (a new slot,
// WouldRefuse); another request's extension asked again is its own share,
// an extension, which answers the verdict on A's acquire (WouldRefuse).
func TestAShadowGrantAskedAgainAfterOthersExtendedSaysItWouldRefuse(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		key := newKey(t)
		acquire := func(stream, tok string) lua.Acquired {
			t.Helper()
			got, err := lua.Acquire(ctx, c, key, stream, 1, time.Minute, lua.Record{Plan: "p", Token: tok}, true)
			if err != nil || !got.Granted {
				t.Fatalf("acquire %s by %q: %+v, %v", stream, tok, got, err)
			}
			return got
		}
		acquire("x", "")
		a := acquire("s", "tokA")
		if !a.WouldRefuse {
			t.Fatalf("A over the limit of 1: %+v; want WouldRefuse", a)
		}
		b := acquire("s", "tokB")
		acquire("s", "tokC")
		if again := acquire("s", "tokA"); again.Extended || !again.WouldRefuse || again.Share() != a.Share() {
			t.Errorf("A asked again after B and C: Extended %v WouldRefuse %v share %+v; want a new slot, WouldRefuse, share %+v",
				again.Extended, again.WouldRefuse, again.Share(), a.Share())
		}
		if again := acquire("s", "tokB"); !again.Extended || !again.WouldRefuse || again.Share() != b.Share() {
			t.Errorf("B asked again after C: Extended %v WouldRefuse %v share %+v; want an extension, WouldRefuse (A's verdict), share %+v",
				again.Extended, again.WouldRefuse, again.Share(), b.Share())
		}
	})
}

// TestARequestLeavingItsShareOfAnotherCallersExpiredSlotFindsItNotHeld:
// a slot that expired unreleased is nobody's, whoever asks (see
// release.lua): a request of another caller that gives up, leaving a
// share of the stream id, is answered not held, as its plain release is,
// and the slot goes; while it lives, that release is refused NotHolder.
func TestARequestLeavingItsShareOfAnotherCallersExpiredSlotFindsItNotHeld(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		for _, share := range []int{0, 1, 2} {
			key := newKey(t)
			got, err := lua.Acquire(ctx, c, key, "s", 3, 200*time.Millisecond, lua.Record{Caller: "ops", Plan: "paid", Token: "tokA"}, false)
			if err != nil || !got.Granted {
				t.Fatalf("ops's acquire: %+v, %v", got, err)
			}
			leave := lua.Member{Key: key, ID: "s", Owned: true, Share: lua.Share{Index: share, StartedAtMs: got.StartedAtMs}}
			if rel, err := lua.ReleaseMember(ctx, c, "chat", leave); err != nil || !rel.NotHolder {
				t.Fatalf("share %d: chat leaving ops's live slot: %+v, %v; want NotHolder", share, rel, err)
			}
			time.Sleep(300 * time.Millisecond) // > the slot's 200ms TTL
			rel, err := lua.ReleaseMember(ctx, c, "chat", leave)
			if err != nil || rel.Released || rel.Superseded || rel.NotHolder {
				t.Fatalf("share %d: chat leaving ops's expired slot: %+v, %v; want not held (neither released, kept, nor another's)", share, rel, err)
			}
			if n, err := c.Do(ctx, c.B().Zcard().Key(key).Build()).AsInt64(); err != nil || n != 0 {
				t.Fatalf("share %d: slots after: %d, %v; want the expired one removed", share, n, err)
			}
		}
	})
}
