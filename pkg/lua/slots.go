package lua

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/joishi/limiter/pkg/keys"
	"github.com/redis/rueidis"
)

// Slot is one live slot as stored.
type Slot struct {
	StreamID    string
	ExpiresAtMs int64 // Redis ms
	Record      StoredRecord
}

// Override is a support override of a user's limit, or of a pool key's
// cap, as stored.
type Override struct {
	Limit       int
	ExpiresAtMs int64 // Redis ms
	SetAtMs     int64 // Redis ms
	Actor       string
	Reason      string
	// Call is the id of the call that set it (SetOverrideAs), "" for
	// none; read back by ReadOverride only.
	Call string
}

// RecordedLimit is t's limit as its record holds it: its plan's as the
// latest call of its plan found it (see wait.lua); any (math.MaxInt) for a
// ticket queued by a version that recorded none (a plan of 0 queues none).
func RecordedLimit(t Ticket) int {
	if t.Record.TTL > 0 { // a ticket's record holds its limit there
		return int(t.Record.TTL / time.Millisecond)
	}
	return math.MaxInt
}

// Ticket is one waiting acquire as stored.
type Ticket struct {
	StreamID    string
	ArrivalUs   int64 // Redis µs when it was queued
	ExpiresAtMs int64 // Redis ms; its server refreshes it while it waits
	// Record is the ticket's: its plan, priority, caller, label and, in a
	// pool key's queue, its user (the TTL field holds the ticket's limit).
	Record StoredRecord
}

// Listing is the result of the slots script.
type Listing struct {
	NowMs int64 // Redis ms when read
	// Used counts the key's live slots; Slots lists the first of them to
	// expire, as many as asked, and so all of them when Used is no more.
	Used  int
	Slots []Slot
	// Override is the override in force, nil when none.
	Override *Override
	// Queue holds the live tickets of the key's queue in the order the
	// wait script serves them (see ServeOrder).
	Queue []Ticket
}

// Slots runs the slots script: how many live slots key (a
// keys.Schema.UserKey, or a PoolKey, whose slots are its memberships,
// each member "<stream id> <user id>") holds, and the first most (> 0)
// of them to expire with their records, in expiry order; the key's
// override; and its live tickets, in queue order. Its work is bounded by
// most, but for a pool key whose queue holds tickets, where it reads the
// members' names to count the waiting users' (as the wait script does).
func Slots(ctx context.Context, c rueidis.Client, key string, most int) (Listing, error) {
	ks := append(userKeys(key), keys.Override(key), keys.Queue(key), keys.QueueExpiry(key), keys.QueueRecords(key))
	arr, err := slotsScript.Exec(ctx, c, ks, []string{strconv.Itoa(most)}).ToArray()
	if err != nil {
		return Listing{}, err
	}
	if len(arr) != 7 {
		return Listing{}, fmt.Errorf("slots script returned %d values, want 7", len(arr))
	}
	now, err := arr[0].AsInt64()
	if err != nil {
		return Listing{}, err
	}
	flat, err := arr[1].AsStrSlice()
	if err != nil {
		return Listing{}, err
	}
	records, err := arr[2].AsStrSlice()
	if err != nil {
		return Listing{}, err
	}
	if len(flat)%2 != 0 || len(records) != len(flat)/2 {
		return Listing{}, fmt.Errorf("slots script returned %d members and scores and %d records, want pairs and one record each", len(flat), len(records))
	}
	out := Listing{NowMs: now, Slots: make([]Slot, 0, len(flat)/2)}
	for i := 0; i < len(flat); i += 2 {
		score, err := strconv.ParseFloat(flat[i+1], 64)
		if err != nil {
			return Listing{}, fmt.Errorf("slot %q has score %q: %w", flat[i], flat[i+1], err)
		}
		out.Slots = append(out.Slots, Slot{StreamID: flat[i], ExpiresAtMs: int64(score), Record: ParseRecord(records[i/2])})
	}
	o, err := arr[3].AsStrSlice()
	if err != nil {
		return Listing{}, err
	}
	switch len(o) {
	case 0:
	case 5:
		out.Override, err = parseOverride(o)
		if err != nil {
			return Listing{}, err
		}
	default:
		return Listing{}, fmt.Errorf("slots script returned an override of %d fields, want 5 or none", len(o))
	}
	tickets, err := arr[4].AsStrSlice()
	if err != nil {
		return Listing{}, err
	}
	if len(tickets)%4 != 0 {
		return Listing{}, fmt.Errorf("slots script returned %d ticket fields, want four each", len(tickets))
	}
	out.Queue = make([]Ticket, 0, len(tickets)/4)
	for i := 0; i < len(tickets); i += 4 {
		arrival, err1 := strconv.ParseFloat(tickets[i+1], 64)
		expires, err2 := strconv.ParseFloat(tickets[i+2], 64)
		if err := cmp.Or(err1, err2); err != nil {
			return Listing{}, fmt.Errorf("ticket %q: %w", tickets[i], err)
		}
		out.Queue = append(out.Queue, Ticket{StreamID: tickets[i], ArrivalUs: int64(arrival), ExpiresAtMs: int64(expires), Record: ParseRecord(tickets[i+3])})
	}
	used, err := arr[5].AsInt64()
	if err != nil {
		return Listing{}, err
	}
	out.Used = int(used)
	heldBy, err := arr[6].AsStrSlice()
	if err != nil || len(heldBy)%2 != 0 {
		return Listing{}, fmt.Errorf("slots script returned the users' members as %q (%v), want pairs", heldBy, err)
	}
	held := make(map[string]int, len(heldBy)/2)
	for i := 0; i < len(heldBy); i += 2 {
		n, err := strconv.Atoi(heldBy[i+1])
		if err != nil {
			return Listing{}, fmt.Errorf("user %q holds %q members: %w", heldBy[i], heldBy[i+1], err)
		}
		held[heldBy[i]] = n
	}
	out.Queue = ServeOrder(out.Queue, held, queueOrderOf(out.Queue, held))
	return out, nil
}

// AsSlotsFree returns a user's queue, its tickets in the order the wait
// script ranks them (ServeOrder), in the order they are granted as the
// user's slots free one at a time, used being taken now: each slot goes
// to the first ticket owed it, one whose own limit (limit(t): its plan's
// as it is now, or the override in force, as the wait script holds it) is
// not reached (lib_tickets.lua's owed). A ticket of a smaller plan than
// the slots taken is passed over until enough of them free, so the
// acquires of a larger plan ranked after it go first. When no slot can go
// to any (an override of 0), they are returned as ranked. A pool key's
// tickets, which all wait for its one cap, are returned as they are.
func AsSlotsFree(queue []Ticket, used int, limit func(Ticket) int) []Ticket {
	if slices.ContainsFunc(queue, func(t Ticket) bool { return t.Record.User != "" }) {
		return queue
	}
	rest := slices.Clone(queue)
	out := make([]Ticket, 0, len(queue))
	for taken := used; len(rest) > 0; {
		i := slices.IndexFunc(rest, func(t Ticket) bool { return taken < limit(t) })
		switch {
		case i >= 0:
			out = append(out, rest[i])
			rest = slices.Delete(rest, i, i+1)
			taken++
		case taken > 0:
			taken-- // a slot frees that none of rest could take
		default:
			return append(out, rest...)
		}
	}
	return out
}

// queueOrder is the order the wait script serves a queue in while every
// ticket names it (lib_tickets.lua's queueOrder).
const queueOrder = 2

// queueOrderOf is what the wait script's order of queue weighs
// (lib_tickets.lua's orderOf), held being what the slots script named of
// its users' holdings: it names them only when the order weighs them (a
// pool key of at most 1,000 members, or any while a ticket is the
// previous release's); a user's own queue, whose tickets name no user,
// weighs none alike. While a ticket is the previous release's (its
// Record.Order is older), the order is that release's: the waiting is
// not weighed.
func queueOrderOf(queue []Ticket, held map[string]int) QueueOrder {
	order := QueueOrder{WeighHeld: len(held) > 0, WeighWaiting: true}
	for _, t := range queue {
		order.WeighWaiting = order.WeighWaiting && t.Record.Order >= queueOrder
	}
	return order
}

// QueueOrder is what the order of a key's queue weighs besides priority
// and arrival (see ServeOrder and lib_tickets.lua's ticketRank).
type QueueOrder struct {
	// WeighHeld weighs the users' holdings of the key: on a pool key of
	// at most 1,000 members (above it reading them costs every call too
	// much).
	WeighHeld bool
	// WeighWaiting weighs how many tickets each user waits for.
	WeighWaiting bool
}

// ServeOrder returns queue (tickets in arrival order) in the order the
// wait script serves them (lib_tickets.lua, owed): the highest priority
// first; within one, the ticket whose user holds the fewest of the key's
// members (held, by user; it is not changed), counting those served
// before it, when order weighs holdings; then whose user waits for the
// fewest, counting those served before it as no longer waited for; then
// arrival. A user's own queue names no user: there it is priority, then
// arrival. (Whether a ticket's own limit lets it be served at all is the
// script's to decide, when a slot frees.) As the script does, it sorts
// the tickets by their places (ticketRank), which owed's comment shows
// to be that order.
func ServeOrder(queue []Ticket, held map[string]int, order QueueOrder) []Ticket {
	count, waiting := map[string]map[int]int{}, map[string]int{}
	for _, t := range queue {
		u := t.Record.User
		if count[u] == nil {
			count[u] = map[int]int{}
		}
		count[u][t.Record.Priority]++
		waiting[u]++
	}
	type key struct {
		user string
		prio int
	}
	seen, first := map[key]int{}, map[key]int{}
	places := make([]rank, len(queue))
	for i, t := range queue {
		u, p := t.Record.User, t.Record.Priority
		above := 0
		for q, n := range count[u] {
			if q > p {
				above += n
			}
		}
		k := key{u, p}
		if seen[k] == 0 {
			first[k] = i
		}
		places[i] = ticketRank(order, p, i, held[u], waiting[u], above+seen[k], above, first[k])
		seen[k]++
	}
	byPlace := make([]int, len(queue))
	for i := range byPlace {
		byPlace[i] = i
	}
	slices.SortFunc(byPlace, func(a, b int) int {
		switch {
		case servedFirst(places[a], places[b]):
			return -1
		case servedFirst(places[b], places[a]):
			return 1
		}
		return 0
	})
	out := make([]Ticket, len(queue))
	for i, at := range byPlace {
		out[i] = queue[at]
	}
	return out
}

// rank is a ticket's place in a queue's order, as lib_tickets.lua's
// ticketRank gives it: its priority, then what its user holds and waits
// for as order weighs them, then the arrival of the first of its user's
// tickets served with it (lead), then its own.
type rank struct{ prio, held, waiting, lead, at int }

// ticketRank is lib_tickets.lua's: the place of a ticket of priority prio
// that arrived at, whose user holds held members and waits for waiting
// tickets, before of them served before it, above of a higher priority,
// the first of its priority arrived at first.
func ticketRank(order QueueOrder, prio, at, held, waiting, before, above, first int) rank {
	r := rank{prio: prio, lead: at, at: at}
	switch {
	case order.WeighHeld:
		r.held = held + before
		if order.WeighWaiting {
			r.waiting = waiting - before
		}
	case order.WeighWaiting:
		r.waiting, r.lead = waiting-above, first
	}
	return r
}

// servedFirst reports whether the ticket of place a is served before the
// one of place b (lib_tickets.lua's servedFirst).
func servedFirst(a, b rank) bool {
	switch {
	case a.prio != b.prio:
		return a.prio > b.prio
	case a.held != b.held:
		return a.held < b.held
	case a.waiting != b.waiting:
		return a.waiting < b.waiting
	case a.lead != b.lead:
		return a.lead < b.lead
	}
	return a.at < b.at
}

// parseOverride reads {limit, expires_at, set_at, actor, reason}.
func parseOverride(o []string) (*Override, error) {
	var nums [3]int64
	for i := range nums {
		n, err := strconv.ParseInt(o[i], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("override field %d is %q: %w", i+1, o[i], err)
		}
		nums[i] = n
	}
	return &Override{Limit: int(nums[0]), ExpiresAtMs: nums[1], SetAtMs: nums[2], Actor: o[3], Reason: o[4]}, nil
}
