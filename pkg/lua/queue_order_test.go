package lua_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/lua"
	"github.com/redis/rueidis"
)

// poolTicket is a ticket of a pool key's queue: its member ("<stream id>
// <user id>"), user and priority.
type poolTicket struct {
	member, user string
	prio         int
}

// servedOrder is the order DESIGN §17 and docs/pools.md give to tickets
// (in arrival order) whose users hold held, computed as they say it, one
// place at a time: the highest priority; then, when order weighs them,
// the user holding the fewest, each ticket served counted as its user's;
// then, when order weighs it, the user waiting for the fewest, each
// ticket served no longer waited for; then arrival.
func servedOrder(tickets []poolTicket, held map[string]int, order lua.QueueOrder) []string {
	h, w := map[string]int{}, map[string]int{}
	for _, t := range tickets {
		w[t.user]++
	}
	ahead := func(a, b poolTicket) bool {
		switch {
		case a.prio != b.prio:
			return a.prio > b.prio
		case order.WeighHeld && held[a.user]+h[a.user] != held[b.user]+h[b.user]:
			return held[a.user]+h[a.user] < held[b.user]+h[b.user]
		case order.WeighWaiting:
			return w[a.user] < w[b.user]
		}
		return false
	}
	served := make([]bool, len(tickets))
	var out []string
	for range tickets {
		best := -1
		for i, t := range tickets {
			if !served[i] && (best < 0 || ahead(t, tickets[best])) {
				best = i
			}
		}
		served[best] = true
		h[tickets[best].user]++
		w[tickets[best].user]--
		out = append(out, tickets[best].member)
	}
	return out
}

// weighBoth is the order of a key of at most 1,000 members.
var weighBoth = lua.QueueOrder{WeighHeld: true, WeighWaiting: true}

// holdMember makes member a member of key, its user's.
func holdMember(t *testing.T, c rueidis.Client, key, member string) {
	t.Helper()
	_, user, _ := strings.Cut(member, " ")
	got, err := lua.Acquire(context.Background(), c, key, member, 100000, time.Minute, lua.Record{User: user}, false)
	if err != nil || !got.Granted {
		t.Fatalf("acquire %s: %+v, %v", member, got, err)
	}
}

// waitFor calls the wait script for ticket alone, on key of cap limit
// whose queue holds at most maxQueue.
func waitFor(t *testing.T, c rueidis.Client, key string, ticket poolTicket, limit, maxQueue int) lua.TicketResult {
	t.Helper()
	a := waitArgs(limit, nil)
	a.MaxQueue = maxQueue
	a.Tickets = []lua.TicketArgs{{StreamID: ticket.member, Record: lua.Record{Priority: ticket.prio, User: ticket.user}}}
	return mustWait(t, c, key, a).Tickets[0]
}

// owedOrder is the order the wait script serves key's queue in: a call
// whose one ticket leaves (and was never queued), of a cap that owes
// every ticket a place, wakes those owed, in owed's order.
func owedOrder(t *testing.T, c rueidis.Client, key string, limit int) []string {
	t.Helper()
	a := waitArgs(limit, nil)
	a.MaxQueue = 100000
	a.Tickets = []lua.TicketArgs{{StreamID: "nobody nobody", Leave: true, Record: lua.Record{User: "nobody"}}}
	return mustWait(t, c, key, a).Wake
}

// listedOrder is the order the listing (lua.Slots) gives key's waiters.
func listedOrder(t *testing.T, c rueidis.Client, key string) []string {
	t.Helper()
	listing, err := lua.Slots(context.Background(), c, key, 10)
	if err != nil {
		t.Fatalf("Slots: %v", err)
	}
	var out []string
	for _, w := range listing.Queue {
		out = append(out, w.StreamID)
	}
	return out
}

// queuedSorted is key's queue, sorted by member.
func queuedSorted(t *testing.T, c rueidis.Client, key string) []string {
	t.Helper()
	got, err := c.Do(context.Background(), c.B().Zrange().Key(keys.Queue(key)).Min("0").Max("-1").Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	return got
}

// sorted is a sorted copy of members.
func sorted(members []string) []string {
	out := slices.Clone(members)
	slices.Sort(out)
	return out
}

// TestAFullQueueWeighsTheNewTicketWithTheOthers (DESIGN §17): v holds 1
// member, u none; the full queue (3) holds u's x1, x2, then v's l, all
// priority 0: served x1 (u holds none), then x2 and l alike (each user
// holding 1 and waiting for 1), l the later. u's n at priority 5 goes
// first, and moves u's others back: u holds 1 before x1 and 2 before x2,
// served n, l, x1, x2. x2 is the one refused, not l, which keeps its
// place at its next call; x2 back is refused again.
func TestAFullQueueWeighsTheNewTicketWithTheOthers(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		key := newKey(t)
		holdMember(t, c, key, "h1 v")
		x1, x2, l, n := poolTicket{"x1 u", "u", 0}, poolTicket{"x2 u", "u", 0}, poolTicket{"l v", "v", 0}, poolTicket{"n u", "u", 5}
		for _, tk := range []poolTicket{x1, x2, l} {
			if got := waitFor(t, c, key, tk, 1, 3); got.State != lua.TicketQueued {
				t.Fatalf("%s: %+v, want queued", tk.member, got)
			}
		}
		want := []string{"n u", "l v", "x1 u", "x2 u"}
		if got := servedOrder([]poolTicket{x1, x2, l, n}, map[string]int{"v": 1}, weighBoth); !slices.Equal(got, want) {
			t.Fatalf("the documented order %q, want %q", got, want)
		}
		if got := waitFor(t, c, key, n, 1, 3); got.State != lua.TicketQueued {
			t.Fatalf("n: %+v, want queued", got)
		}
		if got, keep := queuedSorted(t, c, key), sorted(want[:3]); !slices.Equal(got, keep) {
			t.Errorf("the full queue holds %q, want the three served first %q", got, keep)
		}
		if got := waitFor(t, c, key, l, 1, 3); got.State != lua.TicketQueued {
			t.Errorf("l, served second, at its next call: %+v, want still queued", got)
		}
		if got := waitFor(t, c, key, x2, 1, 3); got.State != lua.TicketFull {
			t.Errorf("x2, served last, back: %+v, want refused (full)", got)
		}
	})
}

// TestTheQueueOrdersAgreeOnRandomQueues: on random queues of a key of
// few members, the wait script's order (owed), the listing's
// (ServeOrder) and the documented one (servedOrder) agree; and a new
// ticket to the full queue leaves it holding the tickets served first of
// the old and the new, refusing the new one when it is served last.
func TestTheQueueOrdersAgreeOnRandomQueues(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		seed := uint64(time.Now().UnixNano())
		t.Logf("seed %d", seed)
		r := rand.New(rand.NewPCG(seed, 7))
		users := []string{"a", "b", "c", "d"}
		for round := range 150 {
			key := newKey(t)
			held, holding := map[string]int{}, 0
			for _, u := range users {
				for i := range r.IntN(3) {
					holdMember(t, c, key, fmt.Sprintf("h%d%s %s", i, u, u))
					held[u]++
					holding++
				}
			}
			if holding == 0 {
				holdMember(t, c, key, "h0z z")
				held["z"], holding = 1, 1
			}
			size := 2 + r.IntN(5)
			var q []poolTicket
			for i := range size {
				u := users[r.IntN(len(users))]
				q = append(q, poolTicket{fmt.Sprintf("w%d %s", i, u), u, r.IntN(3)})
			}
			for _, tk := range q {
				if got := waitFor(t, c, key, tk, holding, 1000); got.State != lua.TicketQueued {
					t.Fatalf("round %d, %s: %+v, want queued", round, tk.member, got)
				}
			}
			want := servedOrder(q, held, weighBoth)
			owed, listed := owedOrder(t, c, key, holding+size), listedOrder(t, c, key)
			if !slices.Equal(owed, want) || !slices.Equal(listed, want) {
				t.Fatalf("round %d: held %v, queue %v: owed serves %q, the listing %q; want %q", round, held, q, owed, listed, want)
			}
			u := users[r.IntN(len(users))]
			n := poolTicket{"n " + u, u, r.IntN(3)}
			all := servedOrder(append(slices.Clone(q), n), held, weighBoth)
			wantState := lua.TicketQueued
			if all[size] == n.member {
				wantState = lua.TicketFull
			}
			got := waitFor(t, c, key, n, holding, size)
			if queued, keep := queuedSorted(t, c, key), sorted(all[:size]); got.State != wantState || !slices.Equal(queued, keep) {
				t.Fatalf("round %d: held %v, queue %v, new %v: state %d, queue %q; want state %d, the served first %q (of %q)",
					round, held, q, n, got.State, queued, wantState, keep, all)
			}
		}
	})
}

// TestAboveAThousandMembersTheOrderCountsNoHoldings (docs/pools.md):
// on a key of 1,001 members (none of a's or b's), a's a1, a2 and b's b1,
// b2 wait, in that order. Above 1,000 holdings are not weighed, nor
// counted: a1 first (a and b each wait for 2), then a2 (a waits for 1),
// then b1, b2. Served one place at a time, two freeing at once and the
// listing say the same.
func TestAboveAThousandMembersTheOrderCountsNoHoldings(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		const members = 1001
		q := []poolTicket{{"a1 a", "a", 0}, {"a2 a", "a", 0}, {"b1 b", "b", 0}, {"b2 b", "b", 0}}
		want := []string{"a1 a", "a2 a", "b1 b", "b2 b"}
		if got := servedOrder(q, nil, lua.QueueOrder{WeighWaiting: true}); !slices.Equal(got, want) {
			t.Fatalf("the documented order %q, want %q", got, want)
		}
		// A key of members of big's, expiring long after the test, and q
		// queued (see TestAKeyOfMoreThanAThousandWeighsNoHoldings).
		bigKey := func() string {
			t.Helper()
			key := newKey(t)
			args := make([]string, 0, 2*members)
			for i := range members {
				args = append(args, fmt.Sprint(int64(9e12)+1+int64(i)), fmt.Sprintf("b%04d big", i))
			}
			if err := c.Do(context.Background(), c.B().Arbitrary("ZADD").Keys(key).Args(args...).Build()).Error(); err != nil {
				t.Fatalf("ZADD big's members: %v", err)
			}
			for _, tk := range q {
				if got := waitFor(t, c, key, tk, members, 100); got.State != lua.TicketQueued {
					t.Fatalf("%s: %+v, want queued", tk.member, got)
				}
			}
			return key
		}
		key := bigKey()
		if listed := listedOrder(t, c, key); !slices.Equal(listed, want) {
			t.Errorf("the listing orders the waiters %q, want %q", listed, want)
		}
		if owed := owedOrder(t, c, key, members+2); !slices.Equal(owed, want[:2]) {
			t.Errorf("two places freeing at once go to %q, want %q", owed, want[:2])
		}
		// One place at a time: the first owed is granted, its stream
		// going on (the key then holds more: still none weighed).
		key = bigKey()
		var oneByOne []string
		for i := range q {
			limit := members + 1 + i
			owed := owedOrder(t, c, key, limit)
			if len(owed) != 1 {
				t.Fatalf("one place frees: owed %q", owed)
			}
			_, user, _ := strings.Cut(owed[0], " ")
			if got := waitFor(t, c, key, poolTicket{owed[0], user, 0}, limit, 100); got.State != lua.TicketGranted {
				t.Fatalf("%s: %+v, want granted", owed[0], got)
			}
			oneByOne = append(oneByOne, owed[0])
		}
		if !slices.Equal(oneByOne, want) {
			t.Errorf("one place at a time, served %q, want %q", oneByOne, want)
		}
	})
}

// TestOneCallKeepsTheQueueWithinItsBound (wait.lua ARGV[4], docs/pools.md:
// a key's queue holds at most its bound). The full queue (3) holds p's,
// b's and z's tickets, z holding the most members (3), then b (2), p
// (1). One server's call carries, in order: a's new ticket, which takes
// z's place (a holds none); b's, which leaves; c's new one, queued in the
// room b left; d's new one, to the full queue again, which takes p's
// place (d holds none, as a and c do). The queue holds 3: a's, c's and
// d's.
func TestOneCallKeepsTheQueueWithinItsBound(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		key := newKey(t)
		for _, m := range []string{"h1 z", "h2 z", "h3 z", "h4 b", "h5 b", "h6 p"} {
			holdMember(t, c, key, m)
		}
		for _, tk := range []poolTicket{{"p1 p", "p", 0}, {"b1 b", "b", 0}, {"z1 z", "z", 0}} {
			if got := waitFor(t, c, key, tk, 6, 3); got.State != lua.TicketQueued {
				t.Fatalf("%s: %+v, want queued", tk.member, got)
			}
		}
		a := waitArgs(6, nil)
		a.MaxQueue = 3
		for _, tk := range []struct {
			member string
			leave  bool
		}{{"a1 a", false}, {"b1 b", true}, {"c1 c", false}, {"d1 d", false}} {
			_, user, _ := strings.Cut(tk.member, " ")
			a.Tickets = append(a.Tickets, lua.TicketArgs{StreamID: tk.member, Leave: tk.leave, Record: lua.Record{User: user}})
		}
		got := mustWait(t, c, key, a)
		want := []lua.TicketState{lua.TicketQueued, lua.TicketLeft, lua.TicketQueued, lua.TicketQueued}
		for i, r := range got.Tickets {
			if r.State != want[i] {
				t.Errorf("%s: state %d, want %d", a.Tickets[i].StreamID, r.State, want[i])
			}
		}
		if q, keep := queuedSorted(t, c, key), []string{"a1 a", "c1 c", "d1 d"}; !slices.Equal(q, keep) {
			t.Errorf("the queue of at most 3 holds %q, want %q", q, keep)
		}
	})
}

// TestATicketDisplacedInItsOwnCallIsAnsweredFull: one server's call
// carries hog's queued second ticket (its refresh), then a new ticket of
// a user holding none, to the full queue, which takes its place. The
// call answers hog's refused as a full queue, as its next call would,
// not as one that left.
func TestATicketDisplacedInItsOwnCallIsAnsweredFull(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		key := newKey(t)
		holdMember(t, c, key, "h1 o")
		for _, tk := range []poolTicket{{"w1 hog", "hog", 0}, {"w2 hog", "hog", 0}} {
			if got := waitFor(t, c, key, tk, 1, 2); got.State != lua.TicketQueued {
				t.Fatalf("%s: %+v, want queued", tk.member, got)
			}
		}
		a := waitArgs(1, nil)
		a.MaxQueue = 2
		a.Tickets = []lua.TicketArgs{
			{StreamID: "w2 hog", Record: lua.Record{User: "hog"}},
			{StreamID: "n new", Record: lua.Record{User: "new"}},
		}
		got := mustWait(t, c, key, a)
		wantTicket(t, "hog's second, displaced in its own call", got.Tickets[0], lua.TicketFull, 0)
		wantTicket(t, "the new ticket", got.Tickets[1], lua.TicketQueued, 2)
		if q, keep := queuedSorted(t, c, key), []string{"n new", "w1 hog"}; !slices.Equal(q, keep) {
			t.Errorf("the queue holds %q, want %q", q, keep)
		}
	})
}

// slowestCall is the longest a command (a script's call included) held
// c's server since the slow log was last read, in µs; the log is emptied.
func slowestCall(t *testing.T, c rueidis.Client) int64 {
	t.Helper()
	ctx := context.Background()
	res, err := c.Do(ctx, c.B().Arbitrary("SLOWLOG", "GET", "128").Build()).ToArray()
	if err != nil {
		t.Fatal(err)
	}
	var most int64
	for _, e := range res {
		f, err := e.ToArray()
		if err != nil || len(f) < 3 {
			t.Fatalf("a slow log entry: %v, %v", f, err)
		}
		us, err := f[2].AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		most = max(most, us)
	}
	if err := c.Do(ctx, c.B().Arbitrary("SLOWLOG", "RESET").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	return most
}

// logEveryCall makes c's server log every command in its slow log.
func logEveryCall(t *testing.T, c rueidis.Client) {
	t.Helper()
	if err := c.Do(context.Background(), c.B().Arbitrary("CONFIG", "SET", "slowlog-log-slower-than", "0").Build()).Error(); err != nil {
		t.Fatal(err)
	}
}

// fullOf is one call's tickets: n new ones of priority prio, each of its
// own user, for a key of cap 1 whose queue holds at most most.
func fullOf(prefix string, prio, n, most int) lua.WaitArgs {
	a := waitArgs(1, nil)
	a.MaxQueue = most
	for i := range n {
		u := fmt.Sprintf("%s%04d", prefix, i)
		a.Tickets = append(a.Tickets, lua.TicketArgs{StreamID: "s " + u, Record: lua.Record{User: u, Priority: prio}})
	}
	return a
}

// TestOwedHandsOutAThousandPlacesInOneShortCall: a full queue (1,000
// waiters of 1,000 users, priorities 0-9) on a key whose cap is raised
// (or put in shadow mode, or overridden) so that every waiter is owed a
// place: one call of the wait script hands them all out holding Redis at
// most 6 times as long as a call on the same queue that hands out one
// (each its slow log's time, the least of five, the two taken in turns
// so that both see the machine alike). Reading and ranking the queue is
// the most of both; each place costs a heap's steps, about 3 µs: 2× here.
// A pass over the waiters for every place took 90-480 ms, 30-160× a call
// handing out one.
func TestOwedHandsOutAThousandPlacesInOneShortCall(t *testing.T) {
	c := privateServer(t)
	key := newKey(t)
	holdMember(t, c, key, "h0 h")
	a := fullOf("u", 0, 1000, 1000)
	for i := range a.Tickets {
		a.Tickets[i].Record.Priority = i % 10
	}
	mustWait(t, c, key, a)
	logEveryCall(t, c)
	// least is the least time a call of cap limit held Redis, owing n places.
	least := map[int]int64{}
	for range 5 {
		for _, limit := range []int{2, 1001} {
			slowestCall(t, c)
			if owed := owedOrder(t, c, key, limit); len(owed) != limit-1 {
				t.Fatalf("owed %d places, want %d", len(owed), limit-1)
			}
			took := slowestCall(t, c)
			if was, ok := least[limit]; !ok || took < was {
				least[limit] = took
			}
		}
	}
	one, all := least[2], least[1001]
	t.Logf("a call handing out 1,000 places held Redis %dµs, one handing out 1 %dµs", all, one)
	if ratio := float64(all) / float64(max(one, 1)); ratio > 6 {
		t.Errorf("one wait call handing out 1,000 places held Redis %dµs, %.1f× the %dµs of a call handing out 1: want at most 6×", all, ratio, one)
	}
}

// TestAThousandNewTicketsDisplaceInOneShortCall: a full queue of 1,000
// waiters of priority 0, then one server's call with 1,000 new ones of
// priority 9 (a burst that came to one replica between two of its
// calls), each taking a place: the call holds Redis at most 8 times as
// long as the one that queued the first 1,000 (each its slow log's time,
// the least of three rounds, both calls of a round seeing the machine
// alike). Queueing 1,000 tickets is the most of both (10-20 ms); a pass
// over the queue for each new one took 0.7-2.8 s, 50-200× it.
func TestAThousandNewTicketsDisplaceInOneShortCall(t *testing.T) {
	c := privateServer(t)
	logEveryCall(t, c)
	queued, displaced := int64(-1), int64(-1)
	for range 3 {
		key := newKey(t)
		holdMember(t, c, key, "h0 h")
		slowestCall(t, c)
		mustWait(t, c, key, fullOf("low", 0, 1000, 1000))
		first := slowestCall(t, c)
		got := mustWait(t, c, key, fullOf("high", 9, 1000, 1000))
		took := slowestCall(t, c)
		for i, r := range got.Tickets {
			if r.State != lua.TicketQueued {
				t.Fatalf("new ticket %d: %+v, want queued", i, r)
			}
		}
		if queued < 0 || first < queued {
			queued = first
		}
		if displaced < 0 || took < displaced {
			displaced = took
		}
	}
	t.Logf("the call displacing 1,000 held Redis %dµs, the one queueing the first 1,000 %dµs", displaced, queued)
	if ratio := float64(displaced) / float64(max(queued, 1)); ratio > 8 {
		t.Errorf("one wait call of 1,000 new tickets to a full queue held Redis %dµs, %.1f× the %dµs of the call that queued the first 1,000: want at most 8×", displaced, ratio, queued)
	}
}

// TestServeOrderServesOnePlaceAtATime: on random queues, ServeOrder,
// which sorts the tickets by their places, gives the order one place at a
// time does (servedOrder), whichever of holdings and waiting it weighs.
func TestServeOrderServesOnePlaceAtATime(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 5))
	users := []string{"a", "b", "c", "d"}
	for round := range 3000 {
		held := map[string]int{}
		for _, u := range users {
			held[u] = r.IntN(3)
		}
		var q []poolTicket
		var tickets []lua.Ticket
		for i := range 1 + r.IntN(9) {
			u := users[r.IntN(len(users))]
			tk := poolTicket{fmt.Sprintf("w%d %s", i, u), u, r.IntN(3)}
			q = append(q, tk)
			tickets = append(tickets, lua.Ticket{StreamID: tk.member, Record: lua.StoredRecord{Record: lua.Record{User: u, Priority: tk.prio}}})
		}
		for _, order := range []lua.QueueOrder{{}, {WeighHeld: true}, {WeighWaiting: true}, weighBoth} {
			var got []string
			for _, t := range lua.ServeOrder(tickets, held, order) {
				got = append(got, t.StreamID)
			}
			if want := servedOrder(q, held, order); !slices.Equal(got, want) {
				t.Fatalf("round %d, %+v: held %v, queue %v: ServeOrder %q, want %q", round, order, held, q, got, want)
			}
		}
	}
}

// A call that queues a ticket into a queue's last free place, then meets
// the queue full with a later ticket, weighs the first with the others:
// of the bound's 3, x1 and y1 (priority 5) queued before; the call's z1
// (priority 0) takes the last place, and its w1 (priority 5) finds the
// queue full. z1 is the one served last, so it is refused, not w1.
func TestAFullQueueWeighsTheTicketsItsCallQueuedBefore(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		key := newKey(t)
		holdMember(t, c, key, "h1 o")
		for _, tk := range []poolTicket{{"x1 x", "x", 5}, {"y1 y", "y", 5}} {
			if got := waitFor(t, c, key, tk, 1, 3); got.State != lua.TicketQueued {
				t.Fatalf("%s: %+v, want queued", tk.member, got)
			}
		}
		a := waitArgs(1, nil)
		a.MaxQueue = 3
		for _, tk := range []poolTicket{{"z1 z", "z", 0}, {"w1 w", "w", 5}} {
			a.Tickets = append(a.Tickets, lua.TicketArgs{StreamID: tk.member, Record: lua.Record{User: tk.user, Priority: tk.prio}})
		}
		got := mustWait(t, c, key, a)
		if got.Tickets[0].State != lua.TicketFull || got.Tickets[1].State != lua.TicketQueued {
			t.Errorf("z1 (priority 0) %d, w1 (priority 5) %d; want z1 refused full (-2), w1 queued (0)", got.Tickets[0].State, got.Tickets[1].State)
		}
		if q, want := queuedSorted(t, c, key), []string{"w1 w", "x1 x", "y1 y"}; !slices.Equal(q, want) {
			t.Errorf("the queue holds %q, want the three served first %q", q, want)
		}
	})
}

// TestAUsersQueueIsListedAsItsSlotsFree: lua.AsSlotsFree lists a user's
// queue in the order its tickets are granted as slots free one at a time:
// a ticket whose limit the slots taken reach is passed over until enough
// free (lib_tickets.lua's owed); here, as the limiter lists it, an
// override in force is every ticket's limit (of 0: no ticket is owed one); one queued without a limit by an
// earlier version takes any; a pool key's queue, whose
// tickets share its one cap, is left as it is.
func TestAUsersQueueIsListedAsItsSlotsFree(t *testing.T) {
	ticket := func(id string, limit int, user string) lua.Ticket {
		return lua.Ticket{StreamID: id, Record: lua.StoredRecord{TTL: time.Duration(limit) * time.Millisecond, Record: lua.Record{User: user}}}
	}
	ids := func(q []lua.Ticket) []string {
		var out []string
		for _, t := range q {
			out = append(out, t.StreamID)
		}
		return out
	}
	for _, c := range []struct {
		name           string
		queue          []lua.Ticket
		used, override int
		want           []string
	}{
		{"every limit above the slots taken: as ranked", []lua.Ticket{ticket("a", 3, ""), ticket("b", 3, "")}, 3, -1, []string{"a", "b"}},
		{"a plan of 1 behind the slots of a plan of 3", []lua.Ticket{ticket("one", 1, ""), ticket("three", 3, "")}, 3, -1, []string{"three", "one"}},
		{"a plan of 3 with room now, then the plan of 2 as one frees", []lua.Ticket{ticket("two", 2, ""), ticket("one", 1, ""), ticket("three", 3, "")}, 2, -1, []string{"three", "two", "one"}},
		{"plans of 2 and 1 behind 3 slots", []lua.Ticket{ticket("one", 1, ""), ticket("two", 2, ""), ticket("three", 3, "")}, 3, -1, []string{"three", "two", "one"}},
		{"room now: owed at once, in rank", []lua.Ticket{ticket("one", 1, ""), ticket("three", 3, "")}, 0, -1, []string{"one", "three"}},
		{"an override is every ticket's limit", []lua.Ticket{ticket("one", 1, ""), ticket("three", 3, "")}, 3, 5, []string{"one", "three"}},
		{"an override of 0: none is owed a slot, listed as ranked", []lua.Ticket{ticket("one", 1, ""), ticket("three", 3, "")}, 2, 0, []string{"one", "three"}},
		{"no limit recorded: any", []lua.Ticket{ticket("old", 0, ""), ticket("three", 3, "")}, 4, -1, []string{"old", "three"}},
		{"a pool key's queue as it is", []lua.Ticket{ticket("a", 1, "u1"), ticket("b", 3, "u2")}, 3, -1, []string{"a", "b"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			limit := func(t lua.Ticket) int {
				if c.override >= 0 {
					return c.override
				}
				return lua.RecordedLimit(t)
			}
			if got := ids(lua.AsSlotsFree(c.queue, c.used, limit)); !slices.Equal(got, c.want) {
				t.Errorf("AsSlotsFree(used %d, override %d) = %v; want %v", c.used, c.override, got, c.want)
			}
		})
	}
}

// TestAHeldStreamsTicketCountsNothingInItsUsersRank (DESIGN §17): on a
// pool key of cap 3, u1's s and t wait, then u2's v. A retry of s takes
// the place s's ticket is owed; the ticket stays queued until its server
// calls, owed nothing. u1 then holds 1 (s) and u2 1 (x), each waiting
// for one place (t, v): the next place goes to t, which came first, the
// ticket of s counting neither as one u1 waits for nor as one served.
func TestAHeldStreamsTicketCountsNothingInItsUsersRank(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		key := newKey(t)
		for _, m := range []string{"x u2", "w u3", "w2 u3"} {
			holdMember(t, c, key, m)
		}
		for i, tk := range []poolTicket{{"s u1", "u1", 0}, {"t u1", "u1", 0}, {"v u2", "u2", 0}} {
			wantTicket(t, tk.member, waitFor(t, c, key, tk, 3, 100), lua.TicketQueued, i+1)
		}
		if head := mustRelease(t, c, key, "w u3").Head; head != "s u1" {
			t.Fatalf("first free place: head %q, want s u1", head)
		}
		retry, err := lua.Acquire(ctx, c, key, "s u1", 3, 10*time.Second, lua.Record{User: "u1"}, false)
		if err != nil || !retry.Granted || !slices.Contains(retry.Wake, "s u1") {
			t.Fatalf("the retry of s: %+v, %v; want granted, s's ticket woken", retry, err)
		}
		wantQueued(t, c, key, "s u1", "t u1", "v u2")
		if head := mustRelease(t, c, key, "w2 u3").Head; head != "t u1" {
			t.Errorf("second free place: head %q, want t u1 (u1 and u2 each hold 1 and wait for 1; t came first)", head)
		}
		if got := waitFor(t, c, key, poolTicket{"v u2", "u2", 0}, 3, 100); got.State != lua.TicketQueued {
			t.Errorf("v's server: %+v; want queued (t is owed the place first)", got)
		}
		if got := waitFor(t, c, key, poolTicket{"t u1", "u1", 0}, 3, 100); got.State != lua.TicketGranted {
			t.Errorf("t's server: %+v; want granted", got)
		}
	})
}

// heldTicketQueue queues, on a pool key whose y is v's, h and u2 of u and
// v1 of v at cap 1 (a queue of at most 3); then h's stream takes its
// member (under a larger cap), its ticket queued still, waiting for
// none: owed serves u2 (u holding 1 and waiting for 1, first), then v1.
func heldTicketQueue(t *testing.T, c rueidis.Client, key string) {
	t.Helper()
	holdMember(t, c, key, "y v")
	for i, tk := range []poolTicket{{"h u", "u", 0}, {"u2 u", "u", 0}, {"v1 v", "v", 0}} {
		wantTicket(t, tk.member, waitFor(t, c, key, tk, 1, 3), lua.TicketQueued, i+1)
	}
	holdMember(t, c, key, "h u")
	wantQueued(t, c, key, "h u", "u2 u", "v1 v")
	if got := owedOrder(t, c, key, 100); !slices.Equal(got, []string{"u2 u", "v1 v"}) {
		t.Fatalf("owed's order: %q, want [u2 v1]", got)
	}
}

// TestAFullQueueWeighsNoTicketWhoseStreamIsHeld: the queue of
// heldTicketQueue holds 3, its bound. n, of a user holding none, takes
// the place of v1, served last as owed serves them; not of u2, which a
// full queue weighing h's ticket (as one u waits for, and served, on top
// of its slot) would count served after v1. h's ticket keeps its place.
func TestAFullQueueWeighsNoTicketWhoseStreamIsHeld(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		key := newKey(t)
		heldTicketQueue(t, c, key)
		if got := waitFor(t, c, key, poolTicket{"n w", "w", 0}, 1, 3); got.State != lua.TicketQueued {
			t.Fatalf("n: %+v; want queued, in the place of the one served last", got)
		}
		wantQueued(t, c, key, "h u", "u2 u", "n w")
	})
}

// TestAHeldStreamsTicketKeepsItsPlaceOfTheQueuesBound: a limit-1 user's
// queue of at most 2 holds s and t; a retry of s takes the slot s's
// ticket is owed, its server gone. The queue is still full: u is refused,
// so that when the retry gives the slot back, s's ticket waiting again,
// the queue holds no more than its bound.
func TestAHeldStreamsTicketKeepsItsPlaceOfTheQueuesBound(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		key := newKey(t)
		mustAcquire(t, c, key, "x", 1)
		a := waitArgs(1, []string{"s", "t"})
		a.MaxQueue = 2
		w := mustWait(t, c, key, a)
		wantTicket(t, "s", w.Tickets[0], lua.TicketQueued, 1)
		wantTicket(t, "t", w.Tickets[1], lua.TicketQueued, 2)
		mustRelease(t, c, key, "x")
		if got := mustAcquire(t, c, key, "s", 1); !got.Granted {
			t.Fatalf("a retry of s: %+v; want granted", got)
		}
		u := waitArgs(1, []string{"u"})
		u.MaxQueue = 2
		wantTicket(t, "u", mustWait(t, c, key, u).Tickets[0], lua.TicketFull, 0)
		if rel := mustRelease(t, c, key, "s"); !rel.Released {
			t.Fatalf("the retry giving the slot back: %+v", rel)
		}
		wantQueued(t, c, key, "s", "t")
	})
}

// TestTheListingLeavesOutATicketWhoseStreamIsHeld: the admin listing of
// heldTicketQueue's queue lists the waiters as owed serves them, u2 then
// v1, without h's ticket, which waits for none.
func TestTheListingLeavesOutATicketWhoseStreamIsHeld(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		key := newKey(t)
		heldTicketQueue(t, c, key)
		if got := listedOrder(t, c, key); !slices.Equal(got, []string{"u2 u", "v1 v"}) {
			t.Errorf("the listing: %q; want [u2 v1], as owed serves them", got)
		}
	})
}

// TestAHeldPreviousReleasesTicketLeavesTheQueueInThisReleasesOrder: on a
// key of more than 1,000 members, p, the previous release's only ticket,
// is held, so owed serves this release's order (no holdings weighed): b1,
// then a1. A full queue (of 3) weighs it so too: n, served after both,
// is refused, b1 keeping its place (the previous release's order would
// weigh b's 1,000 members and drop b1).
func TestAHeldPreviousReleasesTicketLeavesTheQueueInThisReleasesOrder(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		key := newKey(t)
		expires := strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10)
		var args []string
		for i := range 1000 {
			args = append(args, expires, "x"+strconv.Itoa(i)+" b")
		}
		if err := c.Do(ctx, c.B().Arbitrary("ZADD").Keys(key).Args(args...).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		if state, _ := previousWaitOne(t, c, key, "p z", 1, 3, "w"); state != lua.TicketQueued {
			t.Fatalf("p, on the previous release: state %d, want queued", state)
		}
		holdMember(t, c, key, "p z")
		wantTicket(t, "b1", waitFor(t, c, key, poolTicket{"b1 b", "b", 0}, 1, 3), lua.TicketQueued, 2)
		wantTicket(t, "a1", waitFor(t, c, key, poolTicket{"a1 a", "a", 0}, 1, 3), lua.TicketQueued, 3)
		if got := owedOrder(t, c, key, 100000); !slices.Equal(got, []string{"b1 b", "a1 a"}) {
			t.Fatalf("owed: %q, want [b1 a1] (this release's order, no holdings)", got)
		}
		if got := waitFor(t, c, key, poolTicket{"n c", "c", 0}, 1, 3); got.State != lua.TicketFull {
			t.Errorf("n: %+v; want refused, served after b1 and a1", got)
		}
		wantQueued(t, c, key, "p z", "b1 b", "a1 a")
	})
}

// TestAFullQueueWeighsHoldingsWhenNoTicketReadNamesAUser (DESIGN §17): A
// holds 3 members of a pool key, B none. One call brings a4 (A's) and b1
// (B's) to a queue of at most 2 that holds h's ticket, waiting or (its
// stream then held) weighed by none; or, of at most 1, to an empty
// queue. Either way the call's own tickets are weighed with their users'
// holdings: a4, served after b1, is refused, b1 queued.
func TestAFullQueueWeighsHoldingsWhenNoTicketReadNamesAUser(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		for _, tc := range []struct {
			name     string
			h, hHeld bool
			maxQueue int
			cap      int
		}{
			{"beside a waiting ticket", true, false, 2, 3},
			{"beside a ticket whose stream is held", true, true, 2, 4},
			{"to an empty queue", false, false, 1, 3},
		} {
			key := newKey(t)
			for _, m := range []string{"a1 A", "a2 A", "a3 A"} {
				holdMember(t, c, key, m)
			}
			if tc.h {
				wantTicket(t, "h", waitFor(t, c, key, poolTicket{"h u", "u", 0}, 3, tc.maxQueue), lua.TicketQueued, 1)
			}
			if tc.hHeld {
				holdMember(t, c, key, "h u")
			}
			a := waitArgs(tc.cap, nil)
			a.MaxQueue = tc.maxQueue
			a.Tickets = []lua.TicketArgs{
				{StreamID: "a4 A", Record: lua.Record{User: "A"}},
				{StreamID: "b1 B", Record: lua.Record{User: "B"}},
			}
			got := mustWait(t, c, key, a)
			if got.Tickets[0].State != lua.TicketFull || got.Tickets[1].State != lua.TicketQueued {
				t.Errorf("%s: a4 %+v, b1 %+v; want a4 refused (A holds 3), b1 queued (B holds none)", tc.name, got.Tickets[0], got.Tickets[1])
			}
		}
	})
}
