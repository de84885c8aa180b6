package lua_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/joishi/limiter/pkg/lua"
	"github.com/redis/rueidis"
)

// previousWaitPlan runs the previous release's wait script for one ticket
// of a user's own queue (record ";plan=<plan>"), at limit.
func previousWaitPlan(t *testing.T, c rueidis.Client, key, id, plan string, limit int) (lua.TicketState, []string) {
	t.Helper()
	arr, err := previousWait.Exec(context.Background(), c, lua.AcquireKeys(key),
		[]string{strconv.Itoa(limit), "10000", "10000", "100", "1", id, "w", ";plan=" + plan}).ToArray()
	if err != nil || len(arr) != 11 {
		t.Fatalf("the previous wait script, %s: %v, %v", id, arr, err)
	}
	wake, _ := arr[5].AsStrSlice()
	state, _ := arr[6].AsInt64()
	return lua.TicketState(state), wake
}

// TestAPlansLoweredLimitIsWrittenIntoThePreviousReleasesTickets: during a
// rolling update a replica of the previous release queues a waiter pw of
// plan p under p's limit of 3, and one of this release a waiter pn of p;
// the user holds 2 slots when p's limit is lowered to 1. pn's call, at
// p's limit, writes it into the records of every ticket of p, the
// previous release's too, so the call of a waiter lw of plan l (limit 5)
// finds the free slot its own, not owed to pw (which the previous
// release's calls, at their limit, never rewrite; with no waiter of p on
// this release, lw waits until they leave: see docs/api.md).
func TestAPlansLoweredLimitIsWrittenIntoThePreviousReleasesTickets(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, embedded bool) {
		ctx := context.Background()
		key := newKey(t)
		for _, s := range []string{"s1", "s2", "s3"} {
			if got, err := lua.Acquire(ctx, c, key, s, 3, 10*time.Second, lua.Record{Plan: "p"}, false); err != nil || !got.Granted {
				t.Fatalf("acquire %s: %+v %v", s, got, err)
			}
		}
		if st, _ := previousWaitPlan(t, c, key, "pw", "p", 3); st != lua.TicketQueued {
			t.Fatalf("pw: state %d; want queued", st)
		}
		a := waitArgs(3, nil)
		a.Tickets = []lua.TicketArgs{{StreamID: "pn", Record: lua.Record{Plan: "p"}}}
		if got := mustWait(t, c, key, a); got.Tickets[0].State != lua.TicketQueued {
			t.Fatalf("pn: %+v; want queued", got.Tickets[0])
		}
		if err := c.Do(ctx, c.B().Zrem().Key(key).Member("s3").Build()).Error(); err != nil {
			t.Fatal(err)
		}
		for round := 0; round < 3; round++ {
			st, wake := previousWaitPlan(t, c, key, "pw", "p", 1)
			if st != lua.TicketQueued {
				t.Fatalf("round %d: pw state %d; want queued", round, st)
			}
			a := waitArgs(1, nil)
			a.Tickets = []lua.TicketArgs{{StreamID: "pn", Record: lua.Record{Plan: "p"}}}
			pn := mustWait(t, c, key, a)
			a = waitArgs(5, nil)
			a.Tickets = []lua.TicketArgs{{StreamID: "lw", Record: lua.Record{Plan: "l"}}}
			got := mustWait(t, c, key, a)
			t.Logf("round %d: pw's call woke %q; pn's call (this release, p at 1) state %d woke %q; lw's call: state %d, used %d, woke %q",
				round, wake, pn.Tickets[0].State, pn.Wake, got.Tickets[0].State, got.Used, got.Wake)
			if got.Tickets[0].State == lua.TicketGranted {
				return
			}
		}
		t.Errorf("lw (plan l, limit 5) never granted while the user holds 2 slots and plan p now allows 1")
	})
}
