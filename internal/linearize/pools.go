package linearize

import (
	"fmt"
	"slices"
	"strings"
)

// The pool queue model: the order in which a full pool key serves its
// waiting acquires (DESIGN §17). The state is the key's queue (its live
// tickets, in the order they arrived) and its members (with their
// users). A free member goes to one of the tickets owed one: the first
// (limit - held) of the queue ranked by higher priority, then the user
// holding the fewest members of the key (counting those ranked before),
// then the user waiting for the fewest, then arrival. (The model's keys
// hold far fewer than the 1,000 members above which the scripts weigh no
// holdings.) So a waiter served while a live one ranks ahead of it,
// with no member to spare for both, is a violation; as is an acquire
// granted at once (Take) while the waiters take every free member.
//
// A waiting acquire is two operations over its HTTP request, as in the
// user's queue model (queue.go): it joins (at the tail), then it is
// granted, or leaves. What pins where each took effect are observations
// of the key itself, read from Redis in one atomic call while the history
// runs: the live tickets in order and the members, which must be exactly
// the model's at some point of the observation's interval.

// PoolOp is one operation of a pool key's history.
type PoolOp struct {
	// Key names the pool key ("model=gpt-4o"); each is checked alone.
	Key string
	// Limit is the key's cap.
	Limit int
	// Kind is Join, Grant, Leave, Take, Free or Observe.
	Kind QueueKind
	// Member is the stream's member of the key, which is also its
	// ticket's id (all kinds but Observe).
	Member string
	// User and Priority are the acquire's (Join and Take; Take's priority
	// is not read): the user whose held members rank the ticket, and its
	// plan's priority.
	User     string
	Priority int
	// Queue and Held are what an Observe read at one moment: the live
	// tickets, first arrived first, and the members, in any order.
	Queue, Held []string
	// Call and Return bound the operation, in nanoseconds on one clock.
	Call, Return int64
}

func (o PoolOp) String() string {
	switch o.Kind {
	case Observe:
		return fmt.Sprintf("observe queue [%s] held [%s] [%d, %d]", clip(o.Queue), clip(o.Held), o.Call, o.Return)
	case Join, Take:
		return fmt.Sprintf("%s %q (user %s, priority %d) [%d, %d]", o.Kind, o.Member, o.User, o.Priority, o.Call, o.Return)
	}
	return fmt.Sprintf("%s %q [%d, %d]", o.Kind, o.Member, o.Call, o.Return)
}

// PoolTicket is a waiting acquire of the model, or (priority unused) a
// member.
type PoolTicket struct {
	Member, User string
	Priority     int
}

// poolState is the model's state. It is never changed once built: steps
// return new states. key encodes it, for Equal and Hash.
type poolState struct {
	queue []PoolTicket // live tickets, in arrival order
	held  []PoolTicket // members, sorted by Member
	key   string
}

func newPoolState(queue, held []PoolTicket) *poolState {
	var b strings.Builder
	for _, t := range queue {
		b.WriteString(t.Member)
		b.WriteByte(0)
	}
	b.WriteByte(1)
	for _, h := range held {
		b.WriteString(h.Member)
		b.WriteByte(0)
	}
	return &poolState{queue: queue, held: held, key: b.String()}
}

func (s *poolState) queued(member string) int {
	return slices.IndexFunc(s.queue, func(t PoolTicket) bool { return t.Member == member })
}

func (s *poolState) holds(member string) int {
	i, ok := slices.BinarySearchFunc(s.held, member, func(h PoolTicket, m string) int { return strings.Compare(h.Member, m) })
	if !ok {
		return -1
	}
	return i
}

// heldBy counts the members of each user.
func (s *poolState) heldBy() map[string]int {
	out := map[string]int{}
	for _, h := range s.held {
		out[h.User]++
	}
	return out
}

// owed returns the indexes in s.queue of the first n tickets served, in
// the order they are: the highest priority; within it the ticket whose
// user holds the fewest members, counting those of the tickets ranked
// before it; then whose user has the fewest tickets left; then arrival.
// It chooses one place at a time, as the order is said; the scripts (and
// lua.ServeOrder) sort the tickets by their places instead, which gives
// the same order (see lib_tickets.lua's owed; TestTheModelOrdersAsServeOrder).
func (s *poolState) owed(n int) []int {
	held, waiting := s.heldBy(), map[string]int{}
	for _, t := range s.queue {
		waiting[t.User]++
	}
	picked := make([]bool, len(s.queue))
	var out []int
	for len(out) < n {
		best := -1
		for i, t := range s.queue {
			if picked[i] {
				continue
			}
			if best < 0 {
				best = i
				continue
			}
			if b := s.queue[best]; ranksAhead(t, held[t.User], waiting[t.User], b, held[b.User], waiting[b.User]) {
				best = i
			}
		}
		if best < 0 {
			break
		}
		picked[best] = true
		held[s.queue[best].User]++
		waiting[s.queue[best].User]--
		out = append(out, best)
	}
	return out
}

// ranksAhead reports whether ticket a, whose user holds ha members and
// has wa tickets, is served before b, whose user holds hb and has wb,
// leaving arrival aside.
func ranksAhead(a PoolTicket, ha, wa int, b PoolTicket, hb, wb int) bool {
	if a.Priority != b.Priority {
		return a.Priority > b.Priority
	}
	if ha != hb {
		return ha < hb
	}
	return wa < wb
}

func (s *poolState) withHeld(t PoolTicket) []PoolTicket {
	i, _ := slices.BinarySearchFunc(s.held, t.Member, func(h PoolTicket, m string) int { return strings.Compare(h.Member, m) })
	return slices.Insert(slices.Clone(s.held), i, PoolTicket{Member: t.Member, User: t.User})
}

// step returns the state after op, and whether op could happen in s.
func (s *poolState) step(op PoolOp) (*poolState, bool) {
	at := s.queued(op.Member)
	switch op.Kind {
	case Join:
		if at >= 0 || s.holds(op.Member) >= 0 {
			return s, false
		}
		return newPoolState(append(slices.Clone(s.queue), PoolTicket{op.Member, op.User, op.Priority}), s.held), true
	case Grant:
		if at < 0 || !slices.Contains(s.owed(op.Limit-len(s.held)), at) {
			return s, false
		}
		return newPoolState(slices.Delete(slices.Clone(s.queue), at, at+1), s.withHeld(s.queue[at])), true
	case Take:
		// Granted at once: only with a member left over once every
		// waiter is owed one.
		if at >= 0 || s.holds(op.Member) >= 0 || len(s.held)+len(s.queue) >= op.Limit {
			return s, false
		}
		return newPoolState(s.queue, s.withHeld(PoolTicket{Member: op.Member, User: op.User})), true
	case Leave:
		if at < 0 {
			return s, false
		}
		return newPoolState(slices.Delete(slices.Clone(s.queue), at, at+1), s.held), true
	case Free:
		i := s.holds(op.Member)
		if i < 0 {
			return s, false
		}
		return newPoolState(s.queue, slices.Delete(slices.Clone(s.held), i, i+1)), true
	case Observe:
		if len(op.Queue) != len(s.queue) || len(op.Held) != len(s.held) {
			return s, false
		}
		for i, t := range s.queue {
			if op.Queue[i] != t.Member {
				return s, false
			}
		}
		for _, m := range op.Held {
			if s.holds(m) < 0 {
				return s, false
			}
		}
		return s, true
	}
	return s, false
}

// String lists the tickets the first free members go to, in that order,
// then the members.
func (s *poolState) String() string {
	owed := s.owed(len(s.queue))
	q := make([]string, len(owed))
	for i, at := range owed {
		t := s.queue[at]
		q[i] = fmt.Sprintf("%s (priority %d, arrived %d)", t.Member, t.Priority, at+1)
	}
	h := make([]string, len(s.held))
	for i, t := range s.held {
		h[i] = t.Member
	}
	return fmt.Sprintf("%d waiting, by rank [%s], held [%s]", len(s.queue), clip(q), clip(h))
}

// clip joins the first few of list, saying how many more there are.
func clip(list []string) string {
	const most = 8
	if len(list) <= most {
		return strings.Join(list, ", ")
	}
	return fmt.Sprintf("%s, ... (%d more)", strings.Join(list[:most], ", "), len(list)-most)
}
