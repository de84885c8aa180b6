package lua_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/lua"
	"github.com/redis/rueidis"
)

// waitArgs are one server's tickets for a limit-1 user with a 10s slot TTL
// and a 10s ticket TTL; leave names the tickets that leave.
func waitArgs(limit int, ids []string, leave ...string) lua.WaitArgs {
	a := lua.WaitArgs{Limit: limit, SlotTTL: 10 * time.Second, TicketTTL: 10 * time.Second, MaxQueue: 100}
	for _, id := range ids {
		a.Tickets = append(a.Tickets, lua.TicketArgs{StreamID: id, Leave: slices.Contains(leave, id)})
	}
	return a
}

func mustWait(t *testing.T, c rueidis.Client, key string, a lua.WaitArgs) lua.Waited {
	t.Helper()
	got, err := lua.Wait(context.Background(), c, key, a)
	if err != nil {
		t.Fatalf("Wait(%+v): %v", a.Tickets, err)
	}
	return got
}

// mustAcquire acquires as for a plan whose acquires may wait.
func mustAcquire(t *testing.T, c rueidis.Client, key, id string, limit int) lua.Acquired {
	t.Helper()
	got, err := lua.Acquire(context.Background(), c, key, id, limit, 10*time.Second, lua.Record{}, false)
	if err != nil {
		t.Fatalf("Acquire %s: %v", id, err)
	}
	return got
}

func mustRelease(t *testing.T, c rueidis.Client, key, id string) lua.Released {
	t.Helper()
	got, err := lua.Release(context.Background(), c, "", key, id)
	if err != nil {
		t.Fatalf("Release %s: %v", id, err)
	}
	return got
}

func wantTicket(t *testing.T, what string, got lua.TicketResult, state lua.TicketState, place int) {
	t.Helper()
	if got.State != state || (state == lua.TicketQueued && got.Place != place) {
		t.Errorf("%s: got state %d place %d, want state %d place %d", what, got.State, got.Place, state, place)
	}
}

// TestWaitServesTheQueueInArrivalOrder: tickets of two servers for one
// user are served in the order they came, whichever server calls first;
// a server whose ticket is not at the head gets the head's id to wake.
func TestWaitServesTheQueueInArrivalOrder(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		key := newKey(t)
		if !mustAcquire(t, c, key, "holder", 1).Granted {
			t.Fatal("the holder was not granted")
		}
		// Server A queues a1, server B b1, server A a2.
		wantTicket(t, "a1 queued", mustWait(t, c, key, waitArgs(1, []string{"a1"})).Tickets[0], lua.TicketQueued, 1)
		wantTicket(t, "b1 queued", mustWait(t, c, key, waitArgs(1, []string{"b1"})).Tickets[0], lua.TicketQueued, 2)
		got := mustWait(t, c, key, waitArgs(1, []string{"a1", "a2"}))
		wantTicket(t, "a1 refreshed", got.Tickets[0], lua.TicketQueued, 1)
		wantTicket(t, "a2 queued", got.Tickets[1], lua.TicketQueued, 3)
		if got.Next <= 0 || got.Next > 10*time.Second {
			t.Errorf("Next = %v, want the earliest expiry, within the 10s TTLs", got.Next)
		}

		// A non-waiting acquire does not jump the queue.
		if a := mustAcquire(t, c, key, "barger", 1); a.Granted {
			t.Fatal("a non-waiting acquire was granted past three waiting ones")
		}
		rel := mustRelease(t, c, key, "holder")
		if !rel.Released || rel.Head != "a1" {
			t.Fatalf("release = %+v, want released with head a1 to wake", rel)
		}
		if a := mustAcquire(t, c, key, "barger", 1); a.Granted || a.Used != 0 {
			t.Fatalf("acquire with the free slot owed to a1 = %+v, want denied with used 0", a)
		}
		// Nor does one of a plan whose own acquires never wait, nor one of
		// a plan with a larger limit: the slot is a1's.
		if a, err := lua.Acquire(context.Background(), c, key, "no-wait-plan", 1, 10*time.Second, lua.Record{}, false); err != nil || a.Granted {
			t.Fatalf("acquire of a plan that never waits = %+v, %v; want denied, the slot owed to a1", a, err)
		}

		// B calls first: b1 is not the head, a1 is owed the slot.
		got = mustWait(t, c, key, waitArgs(1, []string{"b1"}))
		wantTicket(t, "b1 behind a1", got.Tickets[0], lua.TicketQueued, 2)
		if !slices.Equal(got.Wake, []string{"a1"}) {
			t.Errorf("wake = %v, want [a1], owed the free slot", got.Wake)
		}
		got = mustWait(t, c, key, waitArgs(1, []string{"a1", "a2"}))
		wantTicket(t, "a1 granted", got.Tickets[0], lua.TicketGranted, 0)
		wantTicket(t, "a2 second", got.Tickets[1], lua.TicketQueued, 2)
		if got.Used != 1 || got.Tickets[0].ExpiresAtMs == 0 || len(got.Wake) != 0 {
			t.Errorf("after a1's grant: used %d, expiry %d, wake %v; want 1, set, none", got.Used, got.Tickets[0].ExpiresAtMs, got.Wake)
		}

		mustRelease(t, c, key, "a1")
		wantTicket(t, "b1 granted", mustWait(t, c, key, waitArgs(1, []string{"b1"})).Tickets[0], lua.TicketGranted, 0)
		mustRelease(t, c, key, "b1")
		got = mustWait(t, c, key, waitArgs(1, []string{"a2"}))
		wantTicket(t, "a2 granted", got.Tickets[0], lua.TicketGranted, 0)
		if got.Next != -1 {
			t.Errorf("Next = %v with no ticket waiting, want -1", got.Next)
		}
		if n := zcard(t, c, keys.Queue(key)) + zcard(t, c, keys.QueueExpiry(key)); n != 0 {
			t.Errorf("%d entries left in the queue keys, want none", n)
		}
	})
}

// TestWaitIsIdempotent: a ticket queued again keeps its place, one
// granted is granted again with the same slot, and a leave is final.
func TestWaitIsIdempotent(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		key := newKey(t)
		mustAcquire(t, c, key, "holder", 1)
		mustWait(t, c, key, waitArgs(1, []string{"first"}))
		mustWait(t, c, key, waitArgs(1, []string{"second"}))
		for range 3 {
			wantTicket(t, "first again", mustWait(t, c, key, waitArgs(1, []string{"first"})).Tickets[0], lua.TicketQueued, 1)
		}
		mustRelease(t, c, key, "holder")
		a := mustWait(t, c, key, waitArgs(1, []string{"first"})).Tickets[0]
		b := mustWait(t, c, key, waitArgs(1, []string{"first"})).Tickets[0]
		wantTicket(t, "first granted", a, lua.TicketGranted, 0)
		wantTicket(t, "first granted again", b, lua.TicketGranted, 0)
		if b.ExpiresAtMs < a.ExpiresAtMs || zcard(t, c, key) != 1 {
			t.Errorf("granted again: expiry %d after %d, %d slots; want no earlier, one slot", b.ExpiresAtMs, a.ExpiresAtMs, zcard(t, c, key))
		}
		got := mustWait(t, c, key, waitArgs(1, []string{"second"}, "second"))
		wantTicket(t, "second left", got.Tickets[0], lua.TicketLeft, 0)
		if n := zcard(t, c, keys.Queue(key)); n != 0 {
			t.Errorf("queue holds %d after second left, want 0", n)
		}
	})
}

// TestWaitSkipsExpiredTickets: a ticket whose server stopped refreshing
// it stops counting at its expiry; the one behind it is served, and Next
// pointed at that expiry.
func TestWaitSkipsExpiredTickets(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		key := newKey(t)
		mustAcquire(t, c, key, "holder", 1)
		dead := waitArgs(1, []string{"dead"})
		dead.TicketTTL = 200 * time.Millisecond
		mustWait(t, c, key, dead)
		got := mustWait(t, c, key, waitArgs(1, []string{"alive"}))
		wantTicket(t, "alive behind dead", got.Tickets[0], lua.TicketQueued, 2)
		if got.Next > 200*time.Millisecond {
			t.Errorf("Next = %v, want at most the dead ticket's 200ms", got.Next)
		}
		mustRelease(t, c, key, "holder")
		wantTicket(t, "alive while dead lives", mustWait(t, c, key, waitArgs(1, []string{"alive"})).Tickets[0], lua.TicketQueued, 2)
		time.Sleep(250 * time.Millisecond)
		wantTicket(t, "alive once dead expired", mustWait(t, c, key, waitArgs(1, []string{"alive"})).Tickets[0], lua.TicketGranted, 0)
	})
}

// TestWaitLeavingHeadWakesTheNext: a head that leaves while a slot is free
// names the next ticket to wake; several free slots go to as many
// tickets, in order.
func TestWaitLeavingHeadWakesTheNext(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		key := newKey(t)
		for _, id := range []string{"h1", "h2", "h3"} {
			mustAcquire(t, c, key, id, 3)
		}
		for _, id := range []string{"w1", "w2", "w3", "w4"} {
			mustWait(t, c, key, waitArgs(3, []string{id}))
		}
		mustRelease(t, c, key, "h1")
		mustRelease(t, c, key, "h2")
		got := mustWait(t, c, key, waitArgs(3, []string{"w1"}, "w1"))
		if !slices.Equal(got.Wake, []string{"w2", "w3"}) || got.RetryAfter <= 0 {
			t.Errorf("w1 left with 2 free slots: wake %v, retry after %v; want [w2 w3], and what a denial answers", got.Wake, got.RetryAfter)
		}
		got = mustWait(t, c, key, waitArgs(3, []string{"w4", "w3", "w2"}))
		wantTicket(t, "w4", got.Tickets[0], lua.TicketQueued, 1)
		wantTicket(t, "w3", got.Tickets[1], lua.TicketGranted, 0)
		wantTicket(t, "w2", got.Tickets[2], lua.TicketGranted, 0)
		if got.Used != 3 || got.RetryAfter != 0 {
			t.Errorf("used %d, retry after %v; want 3, and none (no ticket left)", got.Used, got.RetryAfter)
		}
	})
}

// TestWaitBoundsTheQueue: past MaxQueue tickets a new one is not queued;
// one already queued is kept.
func TestWaitBoundsTheQueue(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		key := newKey(t)
		mustAcquire(t, c, key, "holder", 1)
		a := waitArgs(1, []string{"q1", "q2", "q3"})
		a.MaxQueue = 2
		got := mustWait(t, c, key, a)
		wantTicket(t, "q1", got.Tickets[0], lua.TicketQueued, 1)
		wantTicket(t, "q2", got.Tickets[1], lua.TicketQueued, 2)
		wantTicket(t, "q3", got.Tickets[2], lua.TicketFull, 0)
		wantTicket(t, "q2 again", mustWait(t, c, key, lua.WaitArgs{Limit: 1, SlotTTL: time.Second, TicketTTL: time.Second, MaxQueue: 2,
			Tickets: []lua.TicketArgs{{StreamID: "q2"}}}).Tickets[0], lua.TicketQueued, 2)
	})
}

// TestReleaseNamesTheHeadOnlyWhenItFreesASlot, and release_all and a
// pruning acquire name whom to wake; the listing shows the queue in order.
func TestReleaseNamesTheHeadOnlyWhenItFreesASlot(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		key := newKey(t)
		if rel := mustRelease(t, c, key, "nothing"); rel.Head != "" {
			t.Errorf("release of nothing, no queue: head %q, want none", rel.Head)
		}
		mustAcquire(t, c, key, "holder", 1)
		mustWait(t, c, key, waitArgs(1, []string{"w1"}))
		mustWait(t, c, key, waitArgs(1, []string{"w2"}))
		if rel := mustRelease(t, c, key, "not-held"); rel.Released || rel.Head != "" {
			t.Errorf("release of a slot not held = %+v, want nothing released and no one woken", rel)
		}
		listing, err := lua.Slots(context.Background(), c, key, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if len(listing.Queue) != 2 || listing.Queue[0].StreamID != "w1" || listing.Queue[1].StreamID != "w2" ||
			listing.Queue[0].ArrivalUs >= listing.Queue[1].ArrivalUs || listing.Queue[0].ExpiresAtMs <= listing.NowMs {
			t.Errorf("queue listed %+v, want w1 then w2, in arrival order, live", listing.Queue)
		}
		all, err := lua.ReleaseAll(context.Background(), c, key, key+":released:c1", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(all.IDs, []string{"holder"}) || all.Head != "w1" {
			t.Errorf("release_all = %+v, want holder released and w1 to wake", all)
		}

		// An acquire that prunes an expired slot wakes those owed it.
		other := newKey(t)
		if _, err := lua.Acquire(context.Background(), c, other, "short", 1, 100*time.Millisecond, lua.Record{}, false); err != nil {
			t.Fatal(err)
		}
		mustWait(t, c, other, waitArgs(1, []string{"w"}))
		time.Sleep(150 * time.Millisecond)
		got := mustAcquire(t, c, other, "late", 1)
		if got.Granted || got.Pruned != 1 || !slices.Equal(got.Wake, []string{"w"}) {
			t.Errorf("acquire after the slot expired = %+v, want denied, 1 pruned, w woken", got)
		}
	})
}

func zcard(t *testing.T, c rueidis.Client, key string) int64 {
	t.Helper()
	n, err := c.Do(context.Background(), c.B().Zcard().Key(key).Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// newKey returns a user key of the test's own.
// scoreOf is member's score (expiry) in the sorted set key.
func scoreOf(t *testing.T, c rueidis.Client, key, member string) int64 {
	t.Helper()
	n, err := c.Do(context.Background(), c.B().Zscore().Key(key).Member(member).Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func newKey(t *testing.T) string {
	key, err := keys.Schema{Prefix: "lua-wait:" + keys.NewStreamID()[:12] + ":"}.UserKey("user")
	if err != nil {
		t.Fatal(err)
	}
	return key
}

// TestWaitServesByPriorityThenTheUserHoldingFewest (DESIGN §17): on a
// pool key (members "<stream> <user>"), a free place goes to the ticket
// of the highest priority, then to the one whose user holds the fewest
// members, then to the first; a label that spells ";prio=9" or ";user="
// changes nothing.
func TestWaitServesByPriorityThenTheUserHoldingFewest(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		key := newKey(t)
		ticket := func(id, user string, prio int, label string) lua.WaitArgs {
			a := waitArgs(2, nil)
			a.Tickets = []lua.TicketArgs{{StreamID: id + " " + user, Record: lua.Record{Priority: prio, User: user, Label: label}}}
			return a
		}
		hold := func(id, user string) {
			t.Helper()
			got, err := lua.Acquire(context.Background(), c, key, id+" "+user, 2, 10*time.Second, lua.Record{User: user}, false)
			if err != nil || !got.Granted {
				t.Fatalf("acquire %s of %s: %+v, %v", id, user, got, err)
			}
		}
		hold("h1", "x")
		hold("h2", "x")
		// In order of arrival: x's low ticket, a spoofing label, y's low
		// ticket, then z's priority-1 ticket.
		for i, a := range []lua.WaitArgs{
			ticket("w1", "x", 0, ""),
			ticket("w2", "x", 0, "a;prio=9;user=1:q"),
			ticket("w3", "y", 0, ""),
			ticket("w4", "z", 1, ""),
		} {
			wantTicket(t, a.Tickets[0].StreamID+" queued", mustWait(t, c, key, a).Tickets[0], lua.TicketQueued, i+1)
		}
		// A place frees, each time the last one granted leaves: z's
		// priority 1 is owed it first; then y's (x holds 1, y none);
		// then x's first, not the one whose label spells a priority.
		leaving := "h1 x"
		for _, want := range []struct {
			member string
			prio   int
		}{{"w4 z", 1}, {"w3 y", 0}, {"w1 x", 0}} {
			if head := mustRelease(t, c, key, leaving).Head; head != want.member {
				t.Fatalf("after %s left, the head named is %q, want %q", leaving, head, want.member)
			}
			id, user, _ := strings.Cut(want.member, " ")
			if got := mustWait(t, c, key, ticket(id, user, want.prio, "")).Tickets[0]; got.State != lua.TicketGranted {
				t.Fatalf("%s after the release: %+v, want granted", want.member, got)
			}
			leaving = want.member
		}
	})
}

// TestAUserWaitingForManyIsServedAfterUsersWaitingForOne (DESIGN §17:
// one user with ten waiting requests does not shut out ten users with
// one): on a key of cap 1 whose streams end before the next place frees,
// m's three tickets came first, then s's and t's one each. Each time a
// place frees m holds none, as s and t do, so holding alone would serve
// m's three first; the user waiting for fewer goes first: s, t, then m's
// in their order.
func TestAUserWaitingForManyIsServedAfterUsersWaitingForOne(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		key := newKey(t)
		ticket := func(member string) lua.WaitArgs {
			_, user, _ := strings.Cut(member, " ")
			a := waitArgs(1, nil)
			a.Tickets = []lua.TicketArgs{{StreamID: member, Record: lua.Record{User: user}}}
			return a
		}
		if got, err := lua.Acquire(context.Background(), c, key, "h o", 1, 10*time.Second, lua.Record{User: "o"}, false); err != nil || !got.Granted {
			t.Fatalf("acquire h of o: %+v, %v", got, err)
		}
		arrivals := []string{"m1 m", "m2 m", "m3 m", "s1 s", "t1 t"}
		for i, member := range arrivals {
			wantTicket(t, member+" queued", mustWait(t, c, key, ticket(member)).Tickets[0], lua.TicketQueued, i+1)
		}
		served := []string{"s1 s", "t1 t", "m1 m", "m2 m", "m3 m"}
		// Who holds what lists the waiters in the order they are served.
		listing, err := lua.Slots(context.Background(), c, key, 1000)
		if err != nil {
			t.Fatalf("Slots: %v", err)
		}
		var listed []string
		for _, w := range listing.Queue {
			listed = append(listed, w.StreamID)
		}
		if !slices.Equal(listed, served) {
			t.Errorf("the waiters listed in the order %q, want %q", listed, served)
		}
		leaving := "h o"
		for _, want := range served {
			if head := mustRelease(t, c, key, leaving).Head; head != want {
				t.Fatalf("after %s left, the head named is %q, want %q", leaving, head, want)
			}
			if got := mustWait(t, c, key, ticket(want)).Tickets[0]; got.State != lua.TicketGranted {
				t.Fatalf("%s after the release: %+v, want granted", want, got)
			}
			leaving = want
		}
	})
}

// TestAListingNamesTheFirstToExpireAndCountsAll: the slots script lists
// at most the slots asked for, the first to expire, and counts them all;
// the waiters' order counts every member their users hold, listed or
// not. Bounds: as many slots as asked are all listed, one more is not.
func TestAListingNamesTheFirstToExpireAndCountsAll(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		key := newKey(t)
		hold := func(member string, ttl time.Duration) {
			t.Helper()
			_, user, _ := strings.Cut(member, " ")
			if got, err := lua.Acquire(ctx, c, key, member, 100, ttl, lua.Record{User: user}, false); err != nil || !got.Granted {
				t.Fatalf("acquire %s: %+v, %v", member, got, err)
			}
		}
		// s's member expires first; then big's, each later than the one
		// before.
		hold("s1 s", 10*time.Second)
		for i := range 9 {
			hold(fmt.Sprintf("b%d big", i), time.Minute+time.Duration(i)*time.Second)
		}
		listed := func(most, wantUsed int) lua.Listing {
			t.Helper()
			got, err := lua.Slots(ctx, c, key, most)
			if err != nil {
				t.Fatalf("Slots(%d): %v", most, err)
			}
			if got.Used != wantUsed || len(got.Slots) != min(most, wantUsed) {
				t.Fatalf("Slots(%d): used %d, %d listed; want used %d, %d listed", most, got.Used, len(got.Slots), wantUsed, min(most, wantUsed))
			}
			for i := 1; i < len(got.Slots); i++ {
				if got.Slots[i].ExpiresAtMs < got.Slots[i-1].ExpiresAtMs {
					t.Fatalf("Slots(%d): %s listed after %s, which expires later", most, got.Slots[i].StreamID, got.Slots[i-1].StreamID)
				}
			}
			if got.Slots[0].StreamID != "s1 s" {
				t.Fatalf("Slots(%d): %q listed first, want the first to expire, s1 s", most, got.Slots[0].StreamID)
			}
			return got
		}
		listed(10, 10)
		listed(11, 10)
		hold("b9 big", time.Minute+9*time.Second)
		if got := listed(10, 11); got.Slots[9].StreamID != "b8 big" {
			t.Fatalf("the tenth listed is %q, want b8 big (b9 big expires last)", got.Slots[9].StreamID)
		}
		// big's ticket came first; big holds 10 members, of which 1 is
		// listed below, s holds 1: s's ticket is served first.
		for _, member := range []string{"w1 big", "w2 s"} {
			_, user, _ := strings.Cut(member, " ")
			a := waitArgs(1, nil)
			a.Tickets = []lua.TicketArgs{{StreamID: member, Record: lua.Record{User: user}}}
			mustWait(t, c, key, a)
		}
		var order []string
		for _, w := range listed(2, 11).Queue {
			order = append(order, w.StreamID)
		}
		if want := []string{"w2 s", "w1 big"}; !slices.Equal(order, want) {
			t.Errorf("the waiters listed in the order %q, want %q: big holds 10 members, listed or not", order, want)
		}
	})
}

// TestAKeyOfMoreThanAThousandWeighsNoHoldings: the waiters' order counts
// each user's members only on a key of at most 1,000, whose members are
// read on every call while anyone waits; above it, holdings are not
// weighed. big holds all of a key's members but s's one; big's ticket
// came before t's, whose user holds none. s's member leaves: with 1,000
// left, t's ticket is served first; with 1,001, big's, as it came first.
// The listing orders the waiters alike.
func TestAKeyOfMoreThanAThousandWeighsNoHoldings(t *testing.T) {
	for _, tc := range []struct {
		left int    // members once s's leaves
		head string // the ticket then served
	}{{1000, "w2 t"}, {1001, "w1 big"}} {
		t.Run(fmt.Sprint(tc.left), func(t *testing.T) {
			eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
				ctx := context.Background()
				key := newKey(t)
				cap := tc.left + 1
				// big's members, expiring long after the test, as the
				// scripts keep them: '<stream id> <user id>' by expiry
				// (in Redis ms of all their digits: the embedded store
				// answers a round 9e12 as '9e+12', which its scripts'
				// tonumber does not read).
				args := make([]string, 0, 2*tc.left)
				for i := range tc.left {
					args = append(args, fmt.Sprint(int64(9e12)+1+int64(i)), fmt.Sprintf("b%04d big", i))
				}
				if err := c.Do(ctx, c.B().Arbitrary("ZADD").Keys(key).Args(args...).Build()).Error(); err != nil {
					t.Fatalf("ZADD big's members: %v", err)
				}
				if got, err := lua.Acquire(ctx, c, key, "s1 s", cap, time.Minute, lua.Record{User: "s"}, false); err != nil || !got.Granted {
					t.Fatalf("acquire s1 s: %+v, %v", got, err)
				}
				ticket := func(member string) lua.WaitArgs {
					_, user, _ := strings.Cut(member, " ")
					a := waitArgs(cap, nil)
					a.Tickets = []lua.TicketArgs{{StreamID: member, Record: lua.Record{User: user}}}
					return a
				}
				for i, member := range []string{"w1 big", "w2 t"} {
					wantTicket(t, member+" queued", mustWait(t, c, key, ticket(member)).Tickets[0], lua.TicketQueued, i+1)
				}
				if head := mustRelease(t, c, key, "s1 s").Head; head != tc.head {
					t.Fatalf("after s1 s left, %d members held: the head named is %q, want %q", tc.left, head, tc.head)
				}
				listing, err := lua.Slots(ctx, c, key, 1)
				if err != nil || len(listing.Queue) != 2 || listing.Queue[0].StreamID != tc.head {
					t.Fatalf("the listing: %+v, %v; want %s first of two waiters", listing.Queue, err, tc.head)
				}
				if got := mustWait(t, c, key, ticket(tc.head)).Tickets[0]; got.State != lua.TicketGranted {
					t.Fatalf("%s after the release: %+v, want granted", tc.head, got)
				}
			})
		})
	}
}

// TestWaitRefreshesManyTicketsInOneCall: one server's call for more
// tickets than one command of the script takes (1,000) queues them all in
// order, and a second call refreshes every one's expiry, each still in
// its place; a stream id queued and withdrawn in the same call is left
// with neither a ticket nor an expiry.
func TestWaitRefreshesManyTicketsInOneCall(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		key := newKey(t)
		// The holder's slot outlasts the test, however slowly the store
		// runs: the embedded one takes seconds on 1,500 tickets under
		// -race, and were the slot to expire, the first ticket would be
		// granted its place.
		if _, err := lua.Acquire(ctx, c, key, "holder", 1, time.Hour, lua.Record{}, false); err != nil {
			t.Fatalf("Acquire holder: %v", err)
		}
		ids := make([]string, 1500)
		for i := range ids {
			ids[i] = fmt.Sprintf("t%04d", i)
		}
		a := waitArgs(1, ids)
		a.MaxQueue, a.TicketTTL = 2000, time.Minute
		first := mustWait(t, c, key, a)
		for i, got := range first.Tickets {
			wantTicket(t, ids[i], got, lua.TicketQueued, i+1)
		}
		expiries := func() []float64 {
			t.Helper()
			got, err := c.Do(ctx, c.B().Zmscore().Key(keys.QueueExpiry(key)).Member(ids...).Build()).AsFloatSlice()
			if err != nil {
				t.Fatalf("ZMSCORE expiry: %v", err)
			}
			return got
		}
		before := expiries()
		time.Sleep(5 * time.Millisecond)
		second := mustWait(t, c, key, a)
		after := expiries()
		for i, got := range second.Tickets {
			wantTicket(t, ids[i]+" again", got, lua.TicketQueued, i+1)
			if after[i] <= before[i] {
				t.Fatalf("%s's expiry %v after the second call, %v before: want it refreshed", ids[i], after[i], before[i])
			}
		}

		both := lua.WaitArgs{Limit: 1, SlotTTL: time.Minute, TicketTTL: time.Minute, MaxQueue: 2000,
			Tickets: []lua.TicketArgs{{StreamID: "both"}, {StreamID: "both", Leave: true}}}
		got := mustWait(t, c, key, both)
		wantTicket(t, "both, queued", got.Tickets[0], lua.TicketLeft, 0)
		wantTicket(t, "both, withdrawn", got.Tickets[1], lua.TicketLeft, 0)
		for _, k := range []string{keys.Queue(key), keys.QueueExpiry(key)} {
			if err := c.Do(ctx, c.B().Zscore().Key(k).Member("both").Build()).Error(); !rueidis.IsRedisNil(err) {
				t.Errorf("%s holds the withdrawn stream id (%v); want it gone", k, err)
			}
		}
	})
}

// TestAPlansLimitNowHoldsForItsTicketsAlone: a call of a plan holds the
// plan's limit as it is now for the tickets of that plan, not the limit
// they queued under, and for no other plan's: a user's ticket of plan a
// (queued under a's limit of 1) is not granted nor woken by a call of
// plan b with a limit of 3; raised to 2 with 2 held, a's ticket still
// waits; raised to 3, it is granted.
func TestAPlansLimitNowHoldsForItsTicketsAlone(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		key := newKey(t)
		ticket := func(limit int, plan, id string) lua.TicketResult {
			t.Helper()
			a := lua.WaitArgs{Limit: limit, SlotTTL: 10 * time.Second, TicketTTL: 10 * time.Second, MaxQueue: 100,
				Tickets: []lua.TicketArgs{{StreamID: id, Record: lua.Record{Plan: plan}}}}
			got := mustWait(t, c, key, a)
			for _, w := range got.Wake {
				if w == "wa" && plan != "a" {
					t.Errorf("a call of plan %s under %d woke plan a's ticket, owed none under a's limit of 1", plan, limit)
				}
			}
			return got.Tickets[0]
		}
		if got, err := lua.Acquire(ctx, c, key, "holder", 1, 10*time.Second, lua.Record{Plan: "a"}, false); err != nil || !got.Granted {
			t.Fatalf("the holder: %+v, %v", got, err)
		}
		wantTicket(t, "wa queued under a's limit of 1", ticket(1, "a", "wa"), lua.TicketQueued, 1)
		wantTicket(t, "wb granted under b's limit of 3, past wa", ticket(3, "b", "wb"), lua.TicketGranted, 0)
		wantTicket(t, "wa with a's limit raised to 2, 2 held", ticket(2, "a", "wa"), lua.TicketQueued, 1)
		wantTicket(t, "wa with a's limit raised to 3", ticket(3, "a", "wa"), lua.TicketGranted, 0)
	})
}

// wantQueued fails t unless key's queue holds the tickets want, in
// arrival order.
func wantQueued(t *testing.T, c rueidis.Client, key string, want ...string) {
	t.Helper()
	got, err := c.Do(context.Background(), c.B().Zrange().Key(keys.Queue(key)).Min("0").Max("-1").Build()).AsStrSlice()
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("the queue: %q, %v; want %q", got, err, want)
	}
}

// TestAFullQueueKeepsTheTicketsServedFirst (DESIGN §17): a full queue of
// a pool key takes a new ticket that would be served before its last one
// (of the lowest priority, the user holding the most members, then
// waiting for the most, the latest), in that one's place; one that would
// not be is refused, as is the displaced ticket when it comes back to a
// full queue.
func TestAFullQueueKeepsTheTicketsServedFirst(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		key := newKey(t)
		ticket := func(id, user string, prio int) lua.WaitArgs {
			a := waitArgs(1, nil)
			a.MaxQueue = 2
			a.Tickets = []lua.TicketArgs{{StreamID: id + " " + user, Record: lua.Record{Priority: prio, User: user}}}
			return a
		}
		hold := func(id, user string) {
			t.Helper()
			got, err := lua.Acquire(context.Background(), c, key, id+" "+user, 2, 10*time.Second, lua.Record{User: user}, false)
			if err != nil || !got.Granted {
				t.Fatalf("acquire %s of %s: %+v, %v", id, user, got, err)
			}
		}
		wait := func(what, id, user string, prio int, state lua.TicketState) {
			t.Helper()
			if got := mustWait(t, c, key, ticket(id, user, prio)).Tickets[0]; got.State != state {
				t.Fatalf("%s: %+v, want state %d", what, got, state)
			}
		}
		queued := func(want ...string) { t.Helper(); wantQueued(t, c, key, want...) }
		hold("h1", "x")
		hold("h2", "z")
		wait("x's first", "w1", "x", 0, lua.TicketQueued)
		wait("x's second", "w2", "x", 0, lua.TicketQueued)
		// x holds 1 and waits for 2: y, holding nothing, goes before x's
		// second, which leaves.
		wait("y's, in a queue x fills", "w3", "y", 0, lua.TicketQueued)
		queued("w1 x", "w3 y")
		wait("x's second, back", "w2", "x", 0, lua.TicketFull)
		wait("x's third", "w4", "x", 0, lua.TicketFull)
		// x holds 1 and waits for 1, y holds none: z holds as many as x
		// and waits for none, not fewer than x less the ticket that would
		// leave.
		wait("z's, holding 1", "w5", "z", 0, lua.TicketFull)
		queued("w1 x", "w3 y")
		// v holds nothing: it goes before x's first.
		wait("v's, holding nothing", "w6", "v", 0, lua.TicketQueued)
		queued("w3 y", "w6 v")
		// A higher priority goes before the last of a lower one, of any
		// user: v's, the later of two alike (y and v hold none, each waits
		// for one).
		wait("x's at priority 1", "w7", "x", 1, lua.TicketQueued)
		queued("w3 y", "w7 x")
		wait("v's, back", "w6", "v", 0, lua.TicketFull)
	})
}

// TestAFullQueueDropsTheTicketOwedWouldServeLast (DESIGN §17): a full
// queue's last ticket is the one the wait script would serve last, which
// counts each user's tickets served before as held and no longer waited
// for: x holding 1 and waiting for 3 is served once, then y holding 2
// goes before x's second (as many held, fewer waiting). A new ticket is
// weighed with the others, arriving last, and the one then served last
// leaves. Bounds: a new ticket that ties the last (its user then holding
// as many and waiting for as many) is the last, arriving later, and is
// refused; one whose user then holds fewer is taken.
func TestAFullQueueDropsTheTicketOwedWouldServeLast(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		key := newKey(t)
		hold := func(member string) {
			t.Helper()
			_, user, _ := strings.Cut(member, " ")
			got, err := lua.Acquire(context.Background(), c, key, member, 10, 10*time.Second, lua.Record{User: user}, false)
			if err != nil || !got.Granted {
				t.Fatalf("acquire %s: %+v, %v", member, got, err)
			}
		}
		wait := func(what, member string, state lua.TicketState) {
			t.Helper()
			_, user, _ := strings.Cut(member, " ")
			a := waitArgs(1, nil)
			a.MaxQueue = 3
			a.Tickets = []lua.TicketArgs{{StreamID: member, Record: lua.Record{User: user}}}
			if got := mustWait(t, c, key, a).Tickets[0]; got.State != state {
				t.Fatalf("%s: %+v, want state %d", what, got, state)
			}
		}
		queued := func(want ...string) { t.Helper(); wantQueued(t, c, key, want...) }
		for _, m := range []string{"h1 x", "h2 y", "h3 y", "h4 u", "h5 v"} {
			hold(m)
		}
		for _, m := range []string{"w1 x", "w2 x", "w3 x"} {
			wait(m, m, lua.TicketQueued)
		}
		// Served: w1 x (x holds 1), then y's (x holds 2 then, as y does,
		// and waits for 2), then w2 x, w3 x.
		wait("y's, holding 2", "w4 y", lua.TicketQueued)
		queued("w1 x", "w2 x", "w4 y")
		// u holds 1 and waits for none: served after w1 x, before w2 x
		// and w4 y, which ties w2 x and came later.
		wait("u's first, holding 1", "w5 u", lua.TicketQueued)
		queued("w1 x", "w2 x", "w5 u")
		// x holds 1 and waits for 2, u holds 1 and waits for 1: u's second
		// would be served with u holding 2 and waiting for 1, as w2 x.
		wait("u's second", "w6 u", lua.TicketFull)
		// v holds 1 and waits for none: before w2 x.
		wait("v's, holding 1, waiting for none", "w7 v", lua.TicketQueued)
		queued("w1 x", "w5 u", "w7 v")
	})
}

// TestAFullQueueKeepsAUserHoldingMoreAheadOfAnothersLaterTickets: a
// holds none and waits for 3, b holds 1 and waits for 1; the script
// serves a1, then b1 (a holds 1 then, as b does, and waits for 2), then
// a2 and a3. c's ticket, new to the full queue, takes a3's place, not
// b1's.
func TestAFullQueueKeepsAUserHoldingMoreAheadOfAnothersLaterTickets(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		key := newKey(t)
		if got, err := lua.Acquire(context.Background(), c, key, "h1 b", 1, 10*time.Second, lua.Record{User: "b"}, false); err != nil || !got.Granted {
			t.Fatalf("acquire h1 b: %+v, %v", got, err)
		}
		for _, m := range []string{"a1 a", "a2 a", "a3 a", "b1 b", "c1 c"} {
			_, user, _ := strings.Cut(m, " ")
			a := waitArgs(1, nil)
			a.MaxQueue = 4
			a.Tickets = []lua.TicketArgs{{StreamID: m, Record: lua.Record{User: user}}}
			if got := mustWait(t, c, key, a).Tickets[0]; got.State != lua.TicketQueued {
				t.Fatalf("%s: %+v, want queued", m, got)
			}
		}
		wantQueued(t, c, key, "a1 a", "a2 a", "b1 b", "c1 c")
		// The listing's order is the script's: c1 (c holds none and waits
		// for 1), a1 (a holds none), then a2 (a holds 1 then, as b does,
		// and waits for 1, as b does) before b1, which came later.
		listing, err := lua.Slots(context.Background(), c, key, 10)
		if err != nil {
			t.Fatalf("Slots: %v", err)
		}
		var order []string
		for _, w := range listing.Queue {
			order = append(order, w.StreamID)
		}
		if want := []string{"c1 c", "a1 a", "a2 a", "b1 b"}; !slices.Equal(order, want) {
			t.Errorf("the waiters listed in the order %q, want %q", order, want)
		}
	})
}

// TestAWaitGrantSaysItsShareOfTheSlot: a ticket granted a new slot holds
// share 0 of it, started at the grant; the same stream's ticket granted
// again (a retry, served by another call) extends it and holds share 1
// of the same start. The slot goes with the last of the two to leave.
func TestAWaitGrantSaysItsShareOfTheSlot(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		key := newKey(t)
		mustAcquire(t, c, key, "holder", 1)
		mustWait(t, c, key, waitArgs(1, []string{"s"}))
		mustRelease(t, c, key, "holder")
		a := mustWait(t, c, key, waitArgs(1, []string{"s"})).Tickets[0]
		if a.State != lua.TicketGranted || a.Extended || a.Share != (lua.Share{Index: 0, StartedAtMs: a.ExpiresAtMs - 10_000}) {
			t.Fatalf("the ticket's grant: %+v; want a new slot, share 0 started 10s before its expiry", a)
		}
		b := mustWait(t, c, key, waitArgs(1, []string{"s"})).Tickets[0]
		if b.State != lua.TicketGranted || !b.Extended || b.Share != (lua.Share{Index: 1, StartedAtMs: a.Share.StartedAtMs}) {
			t.Fatalf("the stream's ticket granted again: %+v; want extended, share 1 of %+v's start", b, a)
		}
		for i, share := range []lua.Share{b.Share, a.Share} {
			rel, err := lua.ReleaseMember(ctx, c, "", lua.Member{Key: key, ID: "s", Owned: true, Share: share})
			if err != nil || rel.Released != (i == 1) || zcard(t, c, key) != int64(1-i) {
				t.Fatalf("leaving share %d: %+v, %v, %d slots; want the slot released by the last share only", share.Index, rel, err, zcard(t, c, key))
			}
		}
	})
}

// TestAWaitGrantOfAHeldStreamExtendsIt: a stream's ticket waits under
// plan free (limit 2, reached); another request of the stream under plan
// paid (limit 3; the free ticket, at its own limit, is owed nothing)
// takes the slot and runs. When slots free, the wait grants the ticket by
// extending that slot (share 1 of its start), not by writing a new
// record over it: the waiter's leave of its share keeps the running
// stream's slot.
func TestAWaitGrantOfAHeldStreamExtendsIt(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		key := newKey(t)
		free, paid := lua.Record{Plan: "free"}, lua.Record{Plan: "paid"}
		for _, id := range []string{"x", "y"} {
			if got, err := lua.Acquire(ctx, c, key, id, 2, 10*time.Second, free, false); err != nil || !got.Granted {
				t.Fatalf("acquire %s: %+v, %v", id, got, err)
			}
		}
		ticket := func() lua.TicketResult {
			a := waitArgs(2, nil)
			a.Tickets = []lua.TicketArgs{{StreamID: "s", Record: free}}
			return mustWait(t, c, key, a).Tickets[0]
		}
		if got := ticket(); got.State != lua.TicketQueued {
			t.Fatalf("the free ticket: %+v; want queued", got)
		}
		live, err := lua.Acquire(ctx, c, key, "s", 3, 10*time.Second, paid, false)
		if err != nil || !live.Granted || live.Extended || !slices.Equal(live.Wake, []string{"s"}) {
			t.Fatalf("the paid request of the stream: %+v, %v; want a new slot, the stream's ticket woken to share it", live, err)
		}
		mustRelease(t, c, key, "x")
		mustRelease(t, c, key, "y")
		got := ticket()
		if got.State != lua.TicketGranted || !got.Extended || got.Share != (lua.Share{Index: 1, StartedAtMs: live.StartedAtMs}) {
			t.Fatalf("the ticket's grant of the held stream: %+v; want it extended, share 1 of %+v's start", got, live.Share())
		}
		if rel, err := lua.ReleaseMember(ctx, c, "", lua.Member{Key: key, ID: "s", Owned: true, Share: got.Share}); err != nil || rel.Released {
			t.Fatalf("the waiter leaving its share: %+v, %v; want the slot kept", rel, err)
		}
		if n := zcard(t, c, key); n != 1 {
			t.Fatalf("the user holds %d slots after the waiter left its share; want 1, the running stream's", n)
		}
		if beat, err := lua.Heartbeat(ctx, c, "", key, "s", 10*time.Second); err != nil || !beat.Alive {
			t.Fatalf("the running stream's heartbeat: %+v, %v; want alive", beat, err)
		}
	})
}

// TestAShareWithoutAStartLeavesNothing: a leave naming a share but not
// the slot's start (a grant whose answer was lost) changes nothing: the
// slot may be another request's.
func TestAShareWithoutAStartLeavesNothing(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		key := newKey(t)
		mustAcquire(t, c, key, "s", 1)
		if rel, err := lua.ReleaseMember(ctx, c, "", lua.Member{Key: key, ID: "s", Owned: true}); err != nil || rel.Released || !rel.Superseded || zcard(t, c, key) != 1 {
			t.Fatalf("leaving share 0 with no start: %+v, %v, %d slots; want the slot kept", rel, err, zcard(t, c, key))
		}
	})
}

// TestAWaitGrantLeavesAnotherCallersSlotOfTheStream: caller chat's ticket
// for stream s waits (limit 2, reached); caller mallory holds a slot for
// s, taken under a larger limit by an acquire that read no ticket (a
// previous release's, during a rolling update: this one's refuses it, see
// TestAWaitingStreamIDIsNotAnotherCallersToAcquire). When slots free,
// chat's ticket is answered not the holder: mallory's slot and record are
// left as they are, neither extended for chat nor written over.
func TestAWaitGrantLeavesAnotherCallersSlotOfTheStream(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		key := newKey(t)
		for _, id := range []string{"x", "y"} {
			if got, err := lua.Acquire(ctx, c, key, id, 2, 10*time.Second, lua.Record{}, false); err != nil || !got.Granted {
				t.Fatalf("acquire %s: %+v, %v", id, got, err)
			}
		}
		ticket := func() lua.TicketResult {
			a := waitArgs(2, nil)
			a.Tickets = []lua.TicketArgs{{StreamID: "s", Record: lua.Record{Caller: "chat", Plan: "free"}}}
			return mustWait(t, c, key, a).Tickets[0]
		}
		if got := ticket(); got.State != lua.TicketQueued {
			t.Fatalf("chat's ticket: %+v; want queued", got)
		}
		if got, err := lua.Acquire(ctx, c, key, "s", 3, 10*time.Second, lua.Record{Caller: "mallory", Plan: "paid"}, false); err != nil || !got.NotHolder {
			t.Fatalf("mallory's acquire of s: %+v, %v; want NotHolder (chat's waiting id)", got, err)
		}
		// The slot as that acquire wrote it.
		now := time.Now().UnixMilli()
		before := fmt.Sprintf("10000;started=%d;caller=mallory;plan=paid", now)
		for _, cmd := range []rueidis.Completed{
			c.B().Zadd().Key(key).ScoreMember().ScoreMember(float64(now+10000), "s").Build(),
			c.B().Hset().Key(keys.SlotRecords(key)).FieldValue().FieldValue("s", before).Build(),
		} {
			if err := c.Do(ctx, cmd).Error(); err != nil {
				t.Fatal(err)
			}
		}
		mustRelease(t, c, key, "x")
		mustRelease(t, c, key, "y")
		if got := ticket(); got.State != lua.TicketNotHolder {
			t.Fatalf("chat's ticket once slots freed: %+v; want not the holder of mallory's slot", got)
		}
		after, err := c.Do(ctx, c.B().Hget().Key(keys.SlotRecords(key)).Field("s").Build()).ToString()
		if err != nil || after != before {
			t.Fatalf("mallory's record after chat's ticket was served: %q, %v; want %q, as it was", after, err, before)
		}
	})
}

// TestAWaitedExtensionKeepsTheExpiryItAnswers: a ticket granted on a held
// stream (extendHeld) whose own TTL would not move its expiry, which
// another request of the stream set later (one of the previous release,
// during a rolling update, which extends by its plan's TTL, longer), is
// answered that expiry, made its own by a ms, as acquire's extension
// does: the other request giving up takes nothing from under it.
func TestAWaitedExtensionKeepsTheExpiryItAnswers(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		key := newKey(t)
		score := func() int64 { t.Helper(); return scoreOf(t, c, key, "s") }
		first, err := lua.Acquire(ctx, c, key, "s", 3, time.Minute, lua.Record{Plan: "paid", Token: "tokA"}, false)
		if err != nil || !first.Granted {
			t.Fatalf("acquire: %+v, %v", first, err)
		}
		arr, err := previousAcquire.Exec(ctx, c, lua.AcquireKeys(key),
			[]string{"s", "3", "600000", ";by=0@tokB;plan=paid", "1"}).ToArray()
		if err != nil || len(arr) != 9 {
			t.Fatalf("the previous release's longer extension: %v, %v", arr, err)
		}
		longer, _ := arr[2].AsInt64()
		if granted, _ := arr[0].AsInt64(); granted != 2 || longer != score() {
			t.Fatalf("the previous release's longer extension: granted %d expiring at %d; want 2, the slot's %d", granted, longer, score())
		}
		w, err := lua.Wait(ctx, c, key, lua.WaitArgs{Limit: 3, SlotTTL: time.Minute, TicketTTL: 5 * time.Second, MaxQueue: 10,
			Tickets: []lua.TicketArgs{{StreamID: "s", Record: lua.Record{Plan: "paid", Token: "tokW"}}}})
		if err != nil || w.Tickets[0].State != lua.TicketGranted || !w.Tickets[0].Extended {
			t.Fatalf("wait: %+v, %v; want granted, extended", w, err)
		}
		answered := w.Tickets[0].ExpiresAtMs
		if answered != longer+1 || score() != answered {
			t.Fatalf("the waited extension: answered %d, score %d; want the longer one's expiry and a ms, %d", answered, score(), longer+1)
		}
		// Given up by this release's script, giving back the time it added
		// (from the first expiry to longer), which the waited request's
		// ms past it keeps.
		rel, err := lua.ReleaseMember(ctx, c, "", lua.Member{Key: key, ID: "s", Owned: true,
			Share: lua.Share{Index: 1, StartedAtMs: first.StartedAtMs}, Back: lua.Extension{FromMs: first.ExpiresAtMs, ToMs: longer}})
		if err != nil || rel.Released {
			t.Fatalf("the longer extension given up: %+v, %v; want its share left, the slot kept", rel, err)
		}
		if got := score(); got != answered {
			t.Errorf("the waited request was answered expiry %d; after the longer extension was given up the slot expires at %d; want it kept", answered, got)
		}
	})
}

// TestARefusalOfSlotsOwedToWaitersCountsThem: an acquire refused while
// free slots are owed to waiting acquires answers how many they are owed
// to (Owed), which the 429's message names; one refused at the limit
// answers none.
func TestARefusalOfSlotsOwedToWaitersCountsThem(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		key := newKey(t)
		for _, id := range []string{"x", "y", "z"} {
			if got, err := lua.Acquire(ctx, c, key, id, 3, time.Minute, lua.Record{Plan: "three"}, false); err != nil || !got.Granted {
				t.Fatalf("%s: %+v, %v", id, got, err)
			}
		}
		args := lua.WaitArgs{Limit: 3, SlotTTL: time.Minute, TicketTTL: 30 * time.Second, MaxQueue: 10,
			Tickets: []lua.TicketArgs{{StreamID: "q1", Record: lua.Record{Plan: "three", Token: "tokQ1"}}, {StreamID: "q2", Record: lua.Record{Plan: "three", Token: "tokQ2"}}}}
		if w, err := lua.Wait(ctx, c, key, args); err != nil || w.Tickets[0].State != lua.TicketQueued || w.Tickets[1].State != lua.TicketQueued {
			t.Fatalf("queue q1, q2: %+v, %v", w, err)
		}
		if got, err := lua.Acquire(ctx, c, key, "at-limit", 3, time.Minute, lua.Record{Plan: "three"}, false); err != nil || got.Granted || got.Owed != 0 {
			t.Errorf("refused at the limit: %+v, %v; want refused, Owed 0", got, err)
		}
		for _, id := range []string{"x", "y"} { // both free slots are owed to q1 and q2
			if _, err := lua.Release(ctx, c, "", key, id); err != nil {
				t.Fatal(err)
			}
		}
		if got, err := lua.Acquire(ctx, c, key, "s", 3, time.Minute, lua.Record{Plan: "three"}, false); err != nil || got.Granted || got.Used != 1 || got.Owed != 2 {
			t.Errorf("refused with 2 slots free, owed to q1 and q2: %+v, %v; want refused, used 1, Owed 2", got, err)
		}
	})
}

// TestARefusalAfterAPruneCountsOnlyThoseTheFreeSlotsAreOwedTo: an acquire
// that prunes expired slots wakes every waiting acquire owed them, but its
// refusal counts only those its own limit's free slots are owed to. Three
// tickets of plan big (limit 3) wait; the three slots expire; an acquire
// of plan small (limit 2) prunes them, wakes all three, and is refused for
// its 2 free slots, owed to 2 of them.
func TestARefusalAfterAPruneCountsOnlyThoseTheFreeSlotsAreOwedTo(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		key := newKey(t)
		const slotTTL = 200 * time.Millisecond
		for _, id := range []string{"x", "y", "z"} {
			if got, err := lua.Acquire(ctx, c, key, id, 3, slotTTL, lua.Record{Plan: "big"}, false); err != nil || !got.Granted {
				t.Fatalf("%s: %+v, %v", id, got, err)
			}
		}
		args := lua.WaitArgs{Limit: 3, SlotTTL: time.Minute, TicketTTL: 30 * time.Second, MaxQueue: 10}
		for _, id := range []string{"q1", "q2", "q3"} {
			args.Tickets = append(args.Tickets, lua.TicketArgs{StreamID: id, Record: lua.Record{Plan: "big", Token: "tok" + id}})
		}
		w, err := lua.Wait(ctx, c, key, args)
		if err != nil {
			t.Fatal(err)
		}
		for i, tk := range w.Tickets {
			wantTicket(t, fmt.Sprintf("ticket %d", i+1), tk, lua.TicketQueued, i+1)
		}
		time.Sleep(slotTTL + 50*time.Millisecond)
		got, err := lua.Acquire(ctx, c, key, "s", 2, time.Minute, lua.Record{Plan: "small"}, false)
		if err != nil {
			t.Fatal(err)
		}
		if got.Granted || got.Pruned != 3 || got.Used != 0 || !slices.Equal(got.Wake, []string{"q1", "q2", "q3"}) {
			t.Errorf("acquire after the slots expired: %+v; want refused, 3 pruned, used 0, q1, q2 and q3 woken", got)
		}
		if got.Owed != 2 {
			t.Errorf("refused with 2 slots free under its limit of 2: Owed %d, want 2", got.Owed)
		}
	})
}

// TestARetryOfAWaitingStreamTakesTheSlotItsTicketIsOwed: stream s waits
// in the queue (its server gone, its ticket not yet lapsed) and is owed
// the slot x frees. A retry of s that does not wait takes that slot,
// where it was refused for its own ticket; its ticket keeps its place and
// is woken, and its server's next call shares the held slot. Another
// caller's retry of s takes nothing, and a ticket not yet owed a slot
// (t, behind s) gives its stream's retry none.
func TestARetryOfAWaitingStreamTakesTheSlotItsTicketIsOwed(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		key := newKey(t)
		chat := func(token string) lua.Record { return lua.Record{Caller: "chat", Plan: "one", Token: token} }
		if got, err := lua.Acquire(ctx, c, key, "x", 1, 10*time.Second, chat("tokX"), false); err != nil || !got.Granted {
			t.Fatalf("x: %+v, %v", got, err)
		}
		a := lua.WaitArgs{Limit: 1, SlotTTL: 10 * time.Second, TicketTTL: 10 * time.Second, MaxQueue: 10,
			Tickets: []lua.TicketArgs{{StreamID: "s", Record: chat("tokS")}, {StreamID: "t", Record: chat("tokT")}}}
		w := mustWait(t, c, key, a)
		wantTicket(t, "s", w.Tickets[0], lua.TicketQueued, 1)
		wantTicket(t, "t", w.Tickets[1], lua.TicketQueued, 2)
		mustRelease(t, c, key, "x")

		if got, err := lua.Acquire(ctx, c, key, "t", 1, 10*time.Second, chat("tokT2"), false); err != nil || got.Granted {
			t.Errorf("a retry of t, behind s: %+v, %v; want refused (the free slot is s's)", got, err)
		}
		if got, err := lua.Acquire(ctx, c, key, "s", 1, 10*time.Second, lua.Record{Caller: "mallory", Plan: "one", Token: "tokM"}, false); err != nil || got.Granted || !got.NotHolder {
			t.Errorf("another caller's take of s: %+v, %v; want refused, not the holder", got, err)
		}
		retry, err := lua.Acquire(ctx, c, key, "s", 1, 10*time.Second, chat("tokS2"), false)
		if err != nil || !retry.Granted || retry.Extended || !slices.Equal(retry.Wake, []string{"s"}) {
			t.Fatalf("a retry of s, its ticket owed the free slot: %+v, %v; want a new slot, s's ticket woken", retry, err)
		}
		wantQueued(t, c, key, "s", "t")

		a.Tickets = a.Tickets[:1]
		got := mustWait(t, c, key, a).Tickets[0]
		if got.State != lua.TicketGranted || !got.Extended || got.Share != (lua.Share{Index: 1, StartedAtMs: retry.StartedAtMs}) {
			t.Fatalf("s's waiting request, its stream held: %+v; want it to share the retry's slot (share 1)", got)
		}
		wantQueued(t, c, key, "t")
		if n := zcard(t, c, key); n != 1 {
			t.Fatalf("%d slots held; want 1, s's", n)
		}
	})
}

// TestARetryThatGivesItsSlotBackLeavesItsTicketsPlace: a retry of a
// waiting stream takes the slot its ticket is owed, then gives it back
// before the ticket's server calls: the ticket has kept its place ahead
// of t, and is granted the slot.
func TestARetryThatGivesItsSlotBackLeavesItsTicketsPlace(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		key := newKey(t)
		mustAcquire(t, c, key, "x", 1)
		w := mustWait(t, c, key, waitArgs(1, []string{"s", "t"}))
		wantTicket(t, "s", w.Tickets[0], lua.TicketQueued, 1)
		mustRelease(t, c, key, "x")
		if got := mustAcquire(t, c, key, "s", 1); !got.Granted {
			t.Fatalf("a retry of s, its ticket owed the free slot: %+v; want granted", got)
		}
		if rel := mustRelease(t, c, key, "s"); !rel.Released {
			t.Fatalf("the retry giving the slot back: %+v", rel)
		}
		later := mustWait(t, c, key, waitArgs(1, []string{"t"}))
		wantTicket(t, "t", later.Tickets[0], lua.TicketQueued, 2)
		first := mustWait(t, c, key, waitArgs(1, []string{"s"}))
		if first.Tickets[0].State != lua.TicketGranted || first.Tickets[0].Extended {
			t.Fatalf("s, first in the queue with a slot free: %+v; want a new slot", first.Tickets[0])
		}
	})
}

// TestARetryTakesNoSlotOwedToATicketAheadOfItsOwn: ticket a (plan one,
// limit 1) waits ahead of s (plan two, limit 2) while the user holds two
// slots. Both free: s's own server's call leaves s queued, since granting
// it would leave a no room under its limit of 1; a retry of s that does
// not wait is refused as well, and a is granted the slot it is owed.
func TestARetryTakesNoSlotOwedToATicketAheadOfItsOwn(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		key := newKey(t)
		rec := func(plan, tok string) lua.Record { return lua.Record{Caller: "chat", Plan: plan, Token: tok} }
		wait1 := func(limit int, plan, id, tok string) lua.TicketResult {
			t.Helper()
			a := lua.WaitArgs{Limit: limit, SlotTTL: 10 * time.Second, TicketTTL: 10 * time.Second, MaxQueue: 10,
				Tickets: []lua.TicketArgs{{StreamID: id, Record: rec(plan, tok)}}}
			return mustWait(t, c, key, a).Tickets[0]
		}
		for _, id := range []string{"x", "y"} {
			if got, err := lua.Acquire(ctx, c, key, id, 2, 10*time.Second, rec("two", "tok"+id), false); err != nil || !got.Granted {
				t.Fatalf("%s: %+v, %v", id, got, err)
			}
		}
		wantTicket(t, "a (plan one, limit 1)", wait1(1, "one", "a", "tokA"), lua.TicketQueued, 1)
		wantTicket(t, "s (plan two, limit 2)", wait1(2, "two", "s", "tokS"), lua.TicketQueued, 2)
		mustRelease(t, c, key, "x")
		mustRelease(t, c, key, "y")
		wantTicket(t, "s's own server, a ahead owed a slot", wait1(2, "two", "s", "tokS"), lua.TicketQueued, 2)
		if retry, err := lua.Acquire(ctx, c, key, "s", 2, 10*time.Second, rec("two", "tokS2"), false); err != nil || retry.Granted {
			t.Errorf("a retry of s: %+v, %v; want refused, as its waiting request is (a, ahead, would have no room)", retry, err)
		}
		if got := wait1(1, "one", "a", "tokA"); got.State != lua.TicketGranted {
			t.Errorf("a, first in the queue: %+v; want granted", got)
		}
	})
}

// TestATicketWhoseStreamIsHeldIsOwedNoSlot: s waits (its server then
// gone), then t; a retry of s takes the slot s's ticket is owed. When the
// next slot frees, t is owed it, not s's ticket, which needs none: t is
// granted, and a new stream is refused for the user's limit, not for a
// waiter.
func TestATicketWhoseStreamIsHeldIsOwedNoSlot(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		key := newKey(t)
		rec := func(tok string) lua.Record { return lua.Record{Caller: "chat", Plan: "p", Token: tok} }
		wait1 := func(id, tok string) lua.TicketResult {
			t.Helper()
			a := lua.WaitArgs{Limit: 2, SlotTTL: 10 * time.Second, TicketTTL: 10 * time.Second, MaxQueue: 10,
				Tickets: []lua.TicketArgs{{StreamID: id, Record: rec(tok)}}}
			return mustWait(t, c, key, a).Tickets[0]
		}
		for _, id := range []string{"x", "y"} {
			if got, err := lua.Acquire(ctx, c, key, id, 2, 10*time.Second, rec("tok"+id), false); err != nil || !got.Granted {
				t.Fatalf("%s: %+v, %v", id, got, err)
			}
		}
		wantTicket(t, "s", wait1("s", "tokS"), lua.TicketQueued, 1)
		wantTicket(t, "t", wait1("t", "tokT"), lua.TicketQueued, 2)
		mustRelease(t, c, key, "x")
		if retry, err := lua.Acquire(ctx, c, key, "s", 2, 10*time.Second, rec("tokS2"), false); err != nil || !retry.Granted {
			t.Fatalf("a retry of s: %+v, %v; want granted", retry, err)
		}
		if rel := mustRelease(t, c, key, "y"); rel.Head != "t" {
			t.Errorf("y's release names %q to wake; want t, owed the free slot", rel.Head)
		}
		if got := wait1("t", "tokT"); got.State != lua.TicketGranted {
			t.Errorf("t with a slot free, s holding its own: %+v; want granted", got)
		}
		if other, err := lua.Acquire(ctx, c, key, "n", 2, 10*time.Second, rec("tokN"), false); err != nil || other.Granted || other.Owed != 0 || other.Used != 2 {
			t.Errorf("a new stream: %+v, %v; want refused at the limit, 2 used, owed to no waiter", other, err)
		}
	})
}
