package linearize

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/pkg/lua"
)

// poolHistory builds the operations of key "k" with cap limit; times in
// ms. Its methods append one operation each.
type poolHistory struct {
	limit int
	ops   []PoolOp
}

func (h *poolHistory) add(kind QueueKind, member, user string, priority int, call, ret int64) *poolHistory {
	ms := int64(time.Millisecond)
	h.ops = append(h.ops, PoolOp{Key: "k", Limit: h.limit, Kind: kind, Member: member, User: user, Priority: priority, Call: call * ms, Return: ret * ms})
	return h
}

// take: member of user granted at once over [call, ret].
func (h *poolHistory) take(member, user string, call, ret int64) *poolHistory {
	return h.add(Take, member, user, 0, call, ret)
}

// wait: a waiting acquire of member (user, priority) over [call, ret]
// that ended with end (Grant or Leave).
func (h *poolHistory) wait(member, user string, priority int, end QueueKind, call, ret int64) *poolHistory {
	h.add(Join, member, user, priority, call, ret)
	return h.add(end, member, "", 0, call, ret)
}

func (h *poolHistory) free(member string, call, ret int64) *poolHistory {
	return h.add(Free, member, "", 0, call, ret)
}

// observe: the key read over [call, ret]: its queue, then "|", then its
// members ("a b | h").
func (h *poolHistory) observe(state string, call, ret int64) *poolHistory {
	q, held, _ := strings.Cut(state, "|")
	h.add(Observe, "", "", 0, call, ret)
	h.ops[len(h.ops)-1].Queue, h.ops[len(h.ops)-1].Held = strings.Fields(q), strings.Fields(held)
	return h
}

func TestCheckPools(t *testing.T) {
	tests := []struct {
		name    string
		history *poolHistory
		want    bool
	}{
		{"the higher priority is served first", (&poolHistory{limit: 1}).
			take("h", "S", 0, 1).
			wait("low", "A", 0, Grant, 2, 60).observe("low | h", 3, 4).
			wait("high", "B", 5, Grant, 10, 40).observe("low high | h", 11, 12).
			free("h", 20, 21).observe("low | high", 41, 42).
			free("high", 50, 51), true},
		{"the lower priority served while a higher one waits", (&poolHistory{limit: 1}).
			take("h", "S", 0, 1).
			wait("low", "A", 0, Grant, 2, 40).observe("low | h", 3, 4).
			wait("high", "B", 5, Grant, 10, 60).observe("low high | h", 11, 12).
			free("h", 20, 21).observe("high | low", 41, 42).
			free("low", 50, 51), false},
		{"at one priority the user holding fewer is served first", (&poolHistory{limit: 2}).
			take("x1", "X", 0, 1).take("x2", "X", 2, 3).
			wait("x3", "X", 0, Grant, 4, 60).observe("x3 | x1 x2", 5, 6).
			wait("y1", "Y", 0, Grant, 10, 40).observe("x3 y1 | x1 x2", 11, 12).
			free("x1", 20, 21).observe("x3 | x2 y1", 41, 42).
			free("y1", 50, 51), true},
		{"the user holding more served first", (&poolHistory{limit: 2}).
			take("x1", "X", 0, 1).take("x2", "X", 2, 3).
			wait("x3", "X", 0, Grant, 4, 40).observe("x3 | x1 x2", 5, 6).
			wait("y1", "Y", 0, Grant, 10, 60).observe("x3 y1 | x1 x2", 11, 12).
			free("x1", 20, 21).observe("y1 | x2 x3", 41, 42).
			free("x3", 50, 51), false},
		{"holding as many, the user waiting for fewer is served first", (&poolHistory{limit: 1}).
			take("h", "S", 0, 1).
			wait("m1", "M", 0, Grant, 2, 80).observe("m1 | h", 3, 4).
			wait("m2", "M", 0, Leave, 5, 90).observe("m1 m2 | h", 6, 7).
			wait("t1", "T", 0, Grant, 10, 40).observe("m1 m2 t1 | h", 11, 12).
			free("h", 20, 21).observe("m1 m2 | t1", 41, 42).
			free("t1", 50, 51).observe("m2 | m1", 81, 82), true},
		{"holding none, one user's first of two waiters served before another's only one", (&poolHistory{limit: 1}).
			take("h", "S", 0, 1).
			wait("m1", "M", 0, Grant, 2, 40).observe("m1 | h", 3, 4).
			wait("m2", "M", 0, Leave, 5, 90).observe("m1 m2 | h", 6, 7).
			wait("t1", "T", 0, Grant, 10, 80).observe("m1 m2 t1 | h", 11, 12).
			free("h", 20, 21).observe("m2 t1 | m1", 41, 42).
			free("m1", 50, 51), false},
		{"a higher priority goes first even to a user holding more", (&poolHistory{limit: 2}).
			take("x1", "X", 0, 1).take("x2", "X", 2, 3).
			wait("y1", "Y", 0, Grant, 4, 60).observe("y1 | x1 x2", 5, 6).
			wait("x3", "X", 5, Grant, 10, 40).observe("y1 x3 | x1 x2", 11, 12).
			free("x1", 20, 21).observe("y1 | x2 x3", 41, 42).
			free("x2", 50, 51), true},
		{"two members free at once go to the two ranked first, counting the first's", (&poolHistory{limit: 2}).
			take("h1", "S", 0, 1).take("h2", "S", 2, 3).
			wait("x1", "X", 0, Grant, 4, 60).observe("x1 | h1 h2", 5, 6).
			wait("x2", "X", 0, Leave, 7, 90).observe("x1 x2 | h1 h2", 8, 9).
			wait("y1", "Y", 0, Grant, 10, 60).observe("x1 x2 y1 | h1 h2", 11, 12).
			free("h1", 20, 30).free("h2", 20, 30).observe("x2 | x1 y1", 61, 62), true},
		{"two members free at once, the second of one user served before another user's first", (&poolHistory{limit: 2}).
			take("h1", "S", 0, 1).take("h2", "S", 2, 3).
			wait("x1", "X", 0, Grant, 4, 60).observe("x1 | h1 h2", 5, 6).
			wait("x2", "X", 0, Grant, 7, 60).observe("x1 x2 | h1 h2", 8, 9).
			wait("y1", "Y", 0, Leave, 10, 90).observe("x1 x2 y1 | h1 h2", 11, 12).
			free("h1", 20, 30).free("h2", 20, 30).observe("y1 | x1 x2", 61, 62), false},
		{"at one rank, arrival order", (&poolHistory{limit: 1}).
			take("h", "S", 0, 1).
			wait("a", "A", 3, Grant, 2, 40).observe("a | h", 3, 4).
			wait("b", "B", 3, Grant, 10, 60).observe("a b | h", 11, 12).
			free("h", 20, 21).observe("b | a", 41, 42).free("a", 50, 51), true},
		{"at one rank, the later arrival first", (&poolHistory{limit: 1}).
			take("h", "S", 0, 1).
			wait("a", "A", 3, Grant, 2, 60).observe("a | h", 3, 4).
			wait("b", "B", 3, Grant, 10, 40).observe("a b | h", 11, 12).
			free("h", 20, 21).observe("a | b", 41, 42).free("b", 50, 51), false},
		{"two owed waiters may be answered in either order", (&poolHistory{limit: 2}).
			take("h1", "S", 0, 1).take("h2", "S", 2, 3).
			wait("a", "A", 0, Grant, 4, 50).observe("a | h1 h2", 5, 6).
			wait("b", "B", 0, Grant, 7, 40).observe("a b | h1 h2", 8, 9).
			free("h1", 20, 21).free("h2", 22, 23), true},
		{"a waiter that leaves lets the next one in", (&poolHistory{limit: 1}).
			take("h", "S", 0, 1).
			wait("a", "A", 5, Leave, 2, 20).observe("a | h", 3, 4).
			wait("b", "B", 0, Grant, 5, 40).observe("a b | h", 6, 7).observe("b | h", 21, 22).
			free("h", 30, 31), true},
		{"an acquire taking the member owed to a waiter", (&poolHistory{limit: 1}).
			take("h", "S", 0, 1).
			wait("a", "A", 0, Leave, 2, 40).observe("a | h", 3, 4).
			free("h", 5, 6).take("c", "C", 7, 8).observe("a | c", 9, 10), false},
		{"an acquire taking a member left over", (&poolHistory{limit: 2}).
			take("h", "S", 0, 1).
			wait("a", "A", 0, Grant, 2, 40).observe("a | h", 3, 4).
			free("h", 5, 6).take("c", "C", 7, 8).observe(" | a c", 41, 42), true},
		{"a member observed queued after it was held", (&poolHistory{limit: 1}).
			wait("a", "A", 0, Grant, 0, 40).observe(" | a", 10, 11).observe("a | ", 20, 21), false},
		{"the queue observed out of arrival order", (&poolHistory{limit: 1}).
			take("h", "S", 0, 1).
			wait("a", "A", 0, Leave, 2, 40).observe("a | h", 3, 4).
			wait("b", "B", 0, Leave, 5, 40).observe("b a | h", 6, 7), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := CheckPools(tc.history.ops, Options{Timeout: 10 * time.Second})
			if v.OK() != tc.want || len(v.Undecided) > 0 {
				t.Errorf("CheckPools: ok %v (illegal %v, undecided %v), want ok %v; why: %v", v.OK(), v.Illegal, v.Undecided, tc.want, v.Why)
			}
		})
	}
}

// TestCheckPoolsRecordsEachGrantsRivals: the grants come in the order
// served, each with the waiters it was ranked against and what each user
// held then, and Passed says why it went before those that came first.
func TestCheckPoolsRecordsEachGrantsRivals(t *testing.T) {
	h := (&poolHistory{limit: 2}).
		take("x1", "X", 0, 1).take("x2", "X", 2, 3).
		wait("x4", "X", 0, Grant, 4, 200).observe("x4 | x1 x2", 5, 6).
		wait("x3", "X", 5, Grant, 10, 40).observe("x4 x3 | x1 x2", 11, 12).
		wait("z1", "Z", 0, Grant, 13, 100).observe("x4 x3 z1 | x1 x2", 14, 15).
		free("x1", 20, 21).observe("x4 z1 | x2 x3", 41, 42).
		free("x2", 50, 51).observe("x4 | x3 z1", 101, 102).
		free("x3", 150, 151)
	v := CheckPools(h.ops, Options{Timeout: 10 * time.Second})
	if !v.OK() {
		t.Fatalf("CheckPools: illegal %v, undecided %v: %v", v.Illegal, v.Undecided, v.Why)
	}
	type passed struct{ priority, share, other, waiting, heldByX int }
	want := map[string]passed{
		"x3": {1, 0, 0, 3, 1}, // ahead of x4 by priority; X holds x2
		"z1": {0, 1, 0, 2, 1}, // ahead of x4, whose user holds x3
		"x4": {0, 0, 0, 1, 0},
	}
	var order []string
	for _, g := range v.Grants {
		order = append(order, g.Member)
		p, s, o := g.Passed()
		if got := (passed{p, s, o, len(g.Waiting), g.Held["X"]}); got != want[g.Member] {
			t.Errorf("grant of %s: passed (priority, share, other), waiting, held by X = %v, want %v", g.Member, got, want[g.Member])
		}
	}
	if got := strings.Join(order, " "); got != "x3 z1 x4" {
		t.Errorf("grants in the order %s, want x3 z1 x4", got)
	}
}

// TestTheModelOrdersAsServeOrder: on random queues of a key of few
// members, the model's order (owed: one place at a time) is
// lua.ServeOrder's, the listing's, which sorts the tickets by their
// places as the scripts do.
func TestTheModelOrdersAsServeOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	users := []string{"a", "b", "c", "d"}
	for round := range 5000 {
		var held, queue []PoolTicket
		heldBy := map[string]int{}
		for i := range r.IntN(6) {
			u := users[r.IntN(len(users))]
			held = append(held, PoolTicket{Member: fmt.Sprintf("h%d %s", i, u), User: u})
			heldBy[u]++
		}
		slices.SortFunc(held, func(a, b PoolTicket) int { return strings.Compare(a.Member, b.Member) })
		var tickets []lua.Ticket
		for i := range 1 + r.IntN(8) {
			u := users[r.IntN(len(users))]
			p := r.IntN(3)
			m := fmt.Sprintf("w%d %s", i, u)
			queue = append(queue, PoolTicket{Member: m, User: u, Priority: p})
			tickets = append(tickets, lua.Ticket{StreamID: m, Record: lua.StoredRecord{Record: lua.Record{User: u, Priority: p}}})
		}
		var model, listed []string
		for _, i := range newPoolState(queue, held).owed(len(queue)) {
			model = append(model, queue[i].Member)
		}
		for _, t := range lua.ServeOrder(tickets, heldBy, lua.QueueOrder{WeighHeld: true, WeighWaiting: true}) {
			listed = append(listed, t.StreamID)
		}
		if !slices.Equal(model, listed) {
			t.Fatalf("round %d: held %v, queue %v: the model serves %q, ServeOrder %q", round, heldBy, queue, model, listed)
		}
	}
}
