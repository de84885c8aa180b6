package lua_test

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/pkg/lua"
	"github.com/redis/rueidis"
)

// previousWaitOne runs the previous release's wait script (rolling_test.go)
// for one ticket of member ("<stream> <user>", a pool key's) on key, of
// cap limit, in a queue of at most maxQueue, waiting on ('w') or leaving
// ('l'); it returns the ticket's state and the tickets the call wakes.
func previousWaitOne(t *testing.T, c rueidis.Client, key, member string, limit, maxQueue int, action string) (lua.TicketState, []string) {
	t.Helper()
	_, user, _ := strings.Cut(member, " ")
	rec := ";user=" + strconv.Itoa(len(user)) + ":" + user
	arr, err := previousWait.Exec(context.Background(), c, lua.AcquireKeys(key),
		[]string{strconv.Itoa(limit), "10000", "10000", strconv.Itoa(maxQueue), "1", member, action, rec}).ToArray()
	if err != nil || len(arr) != 11 {
		t.Fatalf("the previous wait script, %s: %v, %v", member, arr, err)
	}
	wake, err := arr[5].AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	state, err := arr[6].AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	return lua.TicketState(state), wake
}

// waitOne runs this release's wait script for one ticket of member, as
// previousWaitOne does.
func waitOne(t *testing.T, c rueidis.Client, key, member string, limit, maxQueue int) (lua.TicketState, []string) {
	t.Helper()
	_, user, _ := strings.Cut(member, " ")
	a := waitArgs(limit, nil)
	a.MaxQueue = maxQueue
	a.Tickets = []lua.TicketArgs{{StreamID: member, Record: lua.Record{User: user}}}
	got := mustWait(t, c, key, a)
	return got.Tickets[0].State, got.Wake
}

// queueOrder is key's queue as the admin listing orders it.
func queueOrder(t *testing.T, c rueidis.Client, key string) []string {
	t.Helper()
	l, err := lua.Slots(context.Background(), c, key, 10)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, q := range l.Queue {
		ids = append(ids, q.StreamID)
	}
	return ids
}

// TestARollingUpdateServesAQueueInOneOrder: while a rolling update runs,
// replicas of the previous release and of this one serve one pool key's
// queue, whose orders differ: this one's serves the user waiting for the
// fewest first, the previous one's goes by arrival. m's three tickets
// come first (this release's), then s's one (the previous release's).
// While s's is queued, every call of this release serves the previous
// order, so both find m's first owed the free place: the release names it,
// the previous release's call wakes it and this release's grants it. (Each
// serving its own, each would wake the other's ticket and neither be
// granted, the place unused while both wait.) Once s's ticket is gone the
// queue is served in this release's order again.
func TestARollingUpdateServesAQueueInOneOrder(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		key := newKey(t)
		if got, err := lua.Acquire(ctx, c, key, "h o", 1, 10*time.Second, lua.Record{User: "o"}, false); err != nil || !got.Granted {
			t.Fatalf("acquire h of o: %+v, %v", got, err)
		}
		for _, m := range []string{"m1 m", "m2 m", "m3 m"} {
			if st, _ := waitOne(t, c, key, m, 1, 100); st != lua.TicketQueued {
				t.Fatalf("%s: state %d; want queued", m, st)
			}
		}
		if st, _ := previousWaitOne(t, c, key, "s1 s", 1, 100, "w"); st != lua.TicketQueued {
			t.Fatalf("s1, the previous release's: state %d; want queued", st)
		}
		if got, want := queueOrder(t, c, key), []string{"m1 m", "s1 s", "m2 m", "m3 m"}; !slices.Equal(got, want) {
			t.Errorf("the listing's order beside the previous release's ticket: %q; want %q, the previous release's", got, want)
		}

		if rel := mustRelease(t, c, key, "h o"); rel.Head != "m1 m" {
			t.Errorf("the release of the held place names %q; want m1, first in the previous release's order", rel.Head)
		}
		st, wake := previousWaitOne(t, c, key, "s1 s", 1, 100, "w")
		if st != lua.TicketQueued || !slices.Equal(wake, []string{"m1 m"}) {
			t.Errorf("the previous release's call for s1: state %d, wakes %q; want queued, waking m1", st, wake)
		}
		st, wake = waitOne(t, c, key, "m1 m", 1, 100)
		if st != lua.TicketGranted || len(wake) != 0 {
			t.Fatalf("this release's call for m1: state %d, wakes %q; want granted, waking none", st, wake)
		}

		// s1 leaves; s's next ticket is this release's: served first.
		previousWaitOne(t, c, key, "s1 s", 1, 100, "l")
		if st, _ := waitOne(t, c, key, "s2 s", 1, 100); st != lua.TicketQueued {
			t.Fatalf("s2: state %d; want queued", st)
		}
		if got, want := queueOrder(t, c, key), []string{"s2 s", "m2 m", "m3 m"}; !slices.Equal(got, want) {
			t.Errorf("the listing's order once every ticket is this release's: %q; want %q", got, want)
		}
		if rel := mustRelease(t, c, key, "m1 m"); rel.Head != "s2 s" {
			t.Errorf("with every ticket this release's, the release names %q; want s2, whose user waits for the fewest", rel.Head)
		}
	})
}

// TestARollingUpdateDisplacesAsThePreviousReleaseOnALargeKey: a pool key
// of more than 1,000 members, all big's, at its cap, whose queue holds
// two: big's ticket (the previous release's), then x's. y's ticket
// arrives at the full queue. The previous release weighs holdings on any
// key: big's ticket is served last, and y's takes its place. This
// release's call for y, beside the previous release's ticket, does the
// same, so the two releases keep the same tickets whichever serves y.
func TestARollingUpdateDisplacesAsThePreviousReleaseOnALargeKey(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		const members = 1001
		queues := map[string][]string{}
		for _, release := range []string{"previous", "this"} {
			key := newKey(t)
			add := c.B().Zadd().Key(key).ScoreMember()
			expires := time.Now().Add(time.Minute).UnixMilli()
			for i := range members {
				add = add.ScoreMember(float64(expires), "b"+strconv.Itoa(i)+" big")
			}
			if err := c.Do(ctx, add.Build()).Error(); err != nil {
				t.Fatal(err)
			}
			if st, _ := previousWaitOne(t, c, key, "big1 big", members, 2, "w"); st != lua.TicketQueued {
				t.Fatalf("%s: big1: state %d; want queued", release, st)
			}
			if st, _ := waitOne(t, c, key, "x1 x", members, 2); st != lua.TicketQueued {
				t.Fatalf("%s: x1: state %d; want queued", release, st)
			}
			var st lua.TicketState
			if release == "previous" {
				st, _ = previousWaitOne(t, c, key, "y1 y", members, 2, "w")
			} else {
				st, _ = waitOne(t, c, key, "y1 y", members, 2)
			}
			if st != lua.TicketQueued {
				t.Errorf("%s release's call for y1 at the full queue: state %d; want queued, in big1's place", release, st)
			}
			queues[release] = queueOrder(t, c, key)
		}
		if want := []string{"x1 x", "y1 y"}; !slices.Equal(queues["this"], want) || !slices.Equal(queues["previous"], want) {
			t.Errorf("the queue after y1's call by this release: %q, by the previous one: %q; want %q for both", queues["this"], queues["previous"], want)
		}
	})
}

// A full queue's call in which the previous release's last ticket leaves
// weighs the tickets after it in this release's order, as the next call
// would (docs/pools.md: once its waiters are gone, the order holds). On
// a key of 1,001 members, where a holds 2 and b 1, the queue of 3 holds
// q0 (a's, priority 0, the previous release's), q1 (a's, priority 1) and
// q2 (b's, priority 0). The call's n0 (a, priority 2) takes q0's place,
// and the previous order goes with it; n1 (b, priority 1) takes q2's.
// Then n2 (c, priority 2): of q1 and n1, this release's order, which
// weighs no holdings on such a key, serves q1 first (a and b each wait
// for one of priority 1, and q1 came first), so n1 is refused; the
// previous order, weighing a's 2 held against b's 1, would refuse q1.
func TestAFullQueueTakesThisReleasesOrderOnceThePreviousReleasesLastTicketLeaves(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		key := newKey(t)
		for _, m := range []string{"h1 a", "h2 a", "h3 b"} {
			holdMember(t, c, key, m)
		}
		args := []string{}
		for i := range 998 {
			args = append(args, strconv.FormatInt(int64(9e12)+1+int64(i), 10), "b"+strconv.Itoa(i)+" big")
		}
		if err := c.Do(context.Background(), c.B().Arbitrary("ZADD").Keys(key).Args(args...).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		if st, _ := previousWaitOne(t, c, key, "q0 a", 1001, 3, "w"); st != lua.TicketQueued {
			t.Fatalf("q0: %d, want queued", st)
		}
		for _, tk := range []poolTicket{{"q1 a", "a", 1}, {"q2 b", "b", 0}} {
			if got := waitFor(t, c, key, tk, 1001, 3); got.State != lua.TicketQueued {
				t.Fatalf("%s: %+v, want queued", tk.member, got)
			}
		}
		a := waitArgs(1001, nil)
		a.MaxQueue = 3
		for _, tk := range []poolTicket{{"n0 a", "a", 2}, {"n1 b", "b", 1}, {"n2 c", "c", 2}} {
			a.Tickets = append(a.Tickets, lua.TicketArgs{StreamID: tk.member, Record: lua.Record{User: tk.user, Priority: tk.prio}})
		}
		got := mustWait(t, c, key, a)
		states := []lua.TicketState{got.Tickets[0].State, got.Tickets[1].State, got.Tickets[2].State}
		if q, want := queuedSorted(t, c, key), []string{"n0 a", "n2 c", "q1 a"}; !slices.Equal(q, want) || states[1] != lua.TicketFull {
			t.Errorf("states %v, queue %q; want n1 refused (-2) and the queue %q", states, q, want)
		}
	})
}

// TestARetryLeavesAPreviousReleasesTicketItsSlot: s waits on a replica of
// the previous release, whose wait shares a held stream's slot only in
// the ticket's turn, while a slot is free. A retry of s through this
// release is refused the one slot s's ticket is owed, as that release
// refused it, rather than taking it from under a request its replica
// would then keep waiting to its timeout; the previous release's call
// grants s.
func TestARetryLeavesAPreviousReleasesTicketItsSlot(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		key := newKey(t)
		chat := func(tok string) lua.Record { return lua.Record{Caller: "chat", Plan: "one", Token: tok} }
		if got, err := lua.Acquire(ctx, c, key, "x", 1, 10*time.Second, chat("tokX"), false); err != nil || !got.Granted {
			t.Fatalf("x: %+v, %v", got, err)
		}
		previous := func() int64 {
			t.Helper()
			arr, err := previousWait.Exec(ctx, c, lua.AcquireKeys(key),
				[]string{"1", "10000", "10000", "10", "1", "s", "w", ";caller=chat;by=0@tokS;plan=one"}).ToArray()
			if err != nil || len(arr) < 7 {
				t.Fatalf("the previous wait script: %v, %v", arr, err)
			}
			state, err := arr[6].AsInt64()
			if err != nil {
				t.Fatal(err)
			}
			return state
		}
		if state := previous(); state != 0 {
			t.Fatalf("s on the previous release: state %d, want queued", state)
		}
		mustRelease(t, c, key, "x")
		if retry, err := lua.Acquire(ctx, c, key, "s", 1, 10*time.Second, chat("tokS2"), false); err != nil || retry.Granted || retry.Owed != 1 {
			t.Fatalf("a retry of s through this release: %+v, %v; want refused, the slot owed to s's ticket", retry, err)
		}
		if state := previous(); state != 1 {
			t.Errorf("s's replica of the previous release: state %d; want 1, granted the slot", state)
		}
	})
}
