package lua_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/lua"
	"github.com/redis/rueidis"
)

// Shadow mode grants what the limit would refuse, says so, and counts
// it: used goes above the limit, and the slots expire and prune as any.
func TestShadowGrantsWhatTheLimitWouldRefuse(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		key := "shadow:" + keys.NewStreamID()[:12] + ":{user}"
		acquire := func(id string, ttl time.Duration, shadow bool) lua.Acquired {
			t.Helper()
			got, err := lua.Acquire(ctx, c, key, id, 1, ttl, lua.Record{}, shadow)
			if err != nil {
				t.Fatalf("acquire %s: %v", id, err)
			}
			return got
		}
		if got := acquire("a", time.Minute, true); !got.Granted || got.WouldRefuse || got.Used != 1 {
			t.Fatalf("the first, under the limit of 1: %+v; want granted, not would-refuse, used 1", got)
		}
		if got := acquire("b", 300*time.Millisecond, true); !got.Granted || !got.WouldRefuse || got.Used != 2 || got.ExpiresAtMs == 0 {
			t.Fatalf("the second, over the limit, in shadow: %+v; want granted, would-refuse, used 2", got)
		}
		if got := acquire("b", 300*time.Millisecond, true); !got.Granted || !got.Extended || got.WouldRefuse || got.Used != 2 {
			t.Errorf("b again (an extension of a record naming no request, which keeps no verdict): %+v; want extended, not would-refuse, used 2", got)
		}
		if got := acquire("c", time.Minute, false); got.Granted || got.WouldRefuse || got.Used != 2 || got.RetryAfterMs <= 0 {
			t.Errorf("an enforced acquire over the limit: %+v; want refused with a retry, used 2", got)
		}
		// b expires unreleased and is pruned by the next call, as any slot.
		time.Sleep(400 * time.Millisecond)
		if got := acquire("d", time.Minute, true); !got.Granted || !got.WouldRefuse || got.Pruned != 1 || got.Used != 2 {
			t.Errorf("after b expired: %+v; want b pruned, d granted over the limit (a still held), used 2", got)
		}
	})
}

// An extension is never refused, and answers the verdict on the acquire
// that took the slot, as its record keeps it: would-refuse for a slot
// shadow mode let in over the limit, whoever extends it (a retry whose
// first answer was lost is a request of its own) and whatever the limit
// says now; not for one taken within it. The verdict stays after the
// request that took the slot has given its share up, and after more
// extensions than the record names requests.
func TestAnExtensionAnswersTheVerdictOnTheAcquireThatTookTheSlot(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		key := newKey(t)
		acquire := func(id, token string, limit int) lua.Acquired {
			t.Helper()
			got, err := lua.Acquire(ctx, c, key, id, limit, time.Minute, lua.Record{Plan: "p", Token: token}, true)
			if err != nil || !got.Granted {
				t.Fatalf("acquire %s by %s: %+v, %v; want granted", id, token, got, err)
			}
			return got
		}
		if got := acquire("a", "tokA", 1); got.WouldRefuse {
			t.Fatalf("a, within the limit of 1: %+v; want not would-refuse", got)
		}
		over := acquire("b", "tokB", 1)
		if !over.WouldRefuse {
			t.Fatalf("b, over the limit of 1: %+v; want would-refuse", over)
		}
		for _, tc := range []struct {
			name, id, token string
			limit           int
			want            bool
		}{
			{"a retried (within the limit when taken)", "a", "tokA2", 1, false},
			{"b retried (over the limit when taken)", "b", "tokB2", 1, true},
			{"b retried under a limit raised since", "b", "tokB3", 5, true},
		} {
			if got := acquire(tc.id, tc.token, tc.limit); !got.Extended || got.WouldRefuse != tc.want || got.Used != 2 {
				t.Errorf("%s: Extended %v WouldRefuse %v Used %d; want extended, would-refuse %v, used 2", tc.name, got.Extended, got.WouldRefuse, got.Used, tc.want)
			}
		}
		rel, err := lua.ReleaseMember(ctx, c, "", lua.Member{Key: key, ID: "b", Owned: true, Share: over.Share()})
		if err != nil || rel.Released {
			t.Fatalf("b's first request gives its share up: %+v, %v; want the slot kept for the others", rel, err)
		}
		for i := range 10 {
			if got := acquire("b", fmt.Sprintf("tokC%d", i), 1); !got.Extended || !got.WouldRefuse {
				t.Fatalf("b's extension %d after its first request left: Extended %v WouldRefuse %v; want extended, would-refuse", i+1, got.Extended, got.WouldRefuse)
			}
		}
	})
}

// TestAWaitGrantPastTheShadowLimitIsMarkedOverIt: in shadow mode the wait
// script grants every ticket, and judges each new slot by the limit the
// scope would enforce (the override in force replaces it), as acquire
// does: one granted past it is answered OverLimit and its record marked
// so, which its call asked again and the stream's extensions answer.
// Without the limit (a caller that sends none, as the previous release),
// none is judged.
func TestAWaitGrantPastTheShadowLimitIsMarkedOverIt(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		key := newKey(t)
		mustAcquire(t, c, key, "held", 2)
		ticket := func(id, token string) lua.TicketArgs {
			return lua.TicketArgs{StreamID: id, Record: lua.Record{Plan: "p", Token: token}}
		}
		shadow := func(limit int, tickets ...lua.TicketArgs) lua.WaitArgs {
			a := waitArgs(limit, nil)
			a.Shadow, a.Tickets = true, tickets
			return a
		}
		marked := func(id string) bool {
			t.Helper()
			rec, err := c.Do(ctx, c.B().Hget().Key(keys.SlotRecords(key)).Field(id).Build()).ToString()
			if err != nil {
				t.Fatalf("the record of %s: %v", id, err)
			}
			return lua.ParseRecord(rec).OverLimit
		}
		got := mustWait(t, c, key, shadow(2, ticket("w1", "tok1"), ticket("w2", "tok2")))
		for i, want := range []struct {
			used int
			over bool
		}{{2, false}, {3, true}} {
			g, id := got.Tickets[i], fmt.Sprintf("w%d", i+1)
			if g.State != lua.TicketGranted || g.Extended || g.Used != want.used || g.OverLimit != want.over || marked(id) != want.over {
				t.Errorf("%s, granted together with a limit of 2 (1 held): %+v, record marked %v; want a new slot, used %d, over the limit %v",
					id, g, marked(id), want.used, want.over)
			}
		}
		if g := mustWait(t, c, key, shadow(2, ticket("w2", "tok2"))).Tickets[0]; g.State != lua.TicketGranted || g.Extended || !g.OverLimit {
			t.Errorf("w2's call asked again (its answer lost): %+v; want its grant as it was, over the limit", g)
		}
		if g := mustWait(t, c, key, shadow(5, ticket("w2", "tok3"))).Tickets[0]; !g.Extended || !g.OverLimit {
			t.Errorf("w2 extended by another request, under a limit raised since: %+v; want extended, the verdict of its grant", g)
		}
		if got, err := lua.Acquire(ctx, c, key, "w2", 2, 10*time.Second, lua.Record{Plan: "p", Token: "tok4"}, true); err != nil || !got.Extended || !got.WouldRefuse {
			t.Errorf("w2 extended by an acquire: %+v, %v; want extended, would-refuse", got, err)
		}
		if got, err := lua.Acquire(ctx, c, key, "w1", 2, 10*time.Second, lua.Record{Plan: "p", Token: "tok5"}, true); err != nil || !got.Extended || got.WouldRefuse {
			t.Errorf("w1 extended by an acquire: %+v, %v; want extended, not would-refuse (granted within the limit)", got, err)
		}

		if _, err := lua.SetOverride(ctx, c, key, 10, time.Minute, "opal", "test"); err != nil {
			t.Fatal(err)
		}
		if g := mustWait(t, c, key, shadow(2, ticket("w3", "tok6"))).Tickets[0]; g.State != lua.TicketGranted || g.Used != 4 || g.OverLimit || marked("w3") {
			t.Errorf("w3, 4 held under an override of 10 (the plan's 2): %+v, record marked %v; want granted within the override", g, marked("w3"))
		}
		if _, err := lua.SetOverride(ctx, c, key, 1, time.Minute, "opal", "test"); err != nil {
			t.Fatal(err)
		}
		if g := mustWait(t, c, key, shadow(10, ticket("w4", "tok7"))).Tickets[0]; g.State != lua.TicketGranted || g.Used != 5 || !g.OverLimit || !marked("w4") {
			t.Errorf("w4, 5 held under an override of 1 (the plan's 10): %+v, record marked %v; want granted over the override", g, marked("w4"))
		}
		a := waitArgs(lua.Unbounded, nil)
		a.Tickets = []lua.TicketArgs{ticket("w5", "tok8")}
		if g := mustWait(t, c, key, a).Tickets[0]; g.State != lua.TicketGranted || g.Used != 6 || g.OverLimit || marked("w5") {
			t.Errorf("w5, unbounded with no limit to judge by: %+v, record marked %v; want granted, judged by none", g, marked("w5"))
		}
	})
}
