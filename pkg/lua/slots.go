package lua

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"strconv"

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
	out.Queue = ServeOrder(out.Queue, held)
	return out, nil
}

// queueOrder is the order the wait script serves a queue in while every
// ticket names it (lib_tickets.lua's queueOrder).
const queueOrder = 2

// ServeOrder returns queue (tickets in arrival order) in the order the
// wait script serves them (lib_tickets.lua, owed): the highest priority
// first; within one, the ticket whose user holds the fewest of the key's
// members (held, by user; it is not changed), counting those served
// before it; then whose user waits for the fewest; then arrival. A
// user's own queue names no user: there it is priority, then arrival.
// While a ticket is the previous release's (its Record.Order is older),
// the order is that release's, as the script's: the waiting is not
// weighed. (Whether a ticket's own limit lets it be served at all is the
// script's to decide, when a slot frees.)
func ServeOrder(queue []Ticket, held map[string]int) []Ticket {
	held, waiting := maps.Clone(held), map[string]int{}
	if held == nil {
		held = map[string]int{}
	}
	previous := false
	for _, t := range queue {
		waiting[t.Record.User]++
		previous = previous || t.Record.Order < queueOrder
	}
	if previous {
		waiting = nil // all alike
	}
	out := make([]Ticket, 0, len(queue))
	served := make([]bool, len(queue))
	for range queue {
		best := -1
		for i, t := range queue {
			if served[i] {
				continue
			}
			if best < 0 || servedBefore(t.Record, queue[best].Record, held, waiting) {
				best = i
			}
		}
		served[best] = true
		user := queue[best].Record.User
		held[user]++
		if waiting != nil {
			waiting[user]--
		}
		out = append(out, queue[best])
	}
	return out
}

// servedBefore reports whether a ticket of record a is served before one
// of record b, leaving arrival aside, their users holding and waiting for
// as many as held and waiting say (nil waiting: all alike).
func servedBefore(a, b StoredRecord, held, waiting map[string]int) bool {
	if a.Priority != b.Priority {
		return a.Priority > b.Priority
	}
	if held[a.User] != held[b.User] {
		return held[a.User] < held[b.User]
	}
	return waiting[a.User] < waiting[b.User]
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
