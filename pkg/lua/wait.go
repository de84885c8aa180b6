package lua

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"
)

// WaitArgs are the arguments of one run of the wait script: one server's
// tickets for one user, under one plan.
type WaitArgs struct {
	// Limit is the plan's; an override in force replaces it. Unbounded:
	// the scope refuses none (a pool key no longer capped).
	Limit int
	// Shadow: the scope is in shadow mode (enforce: false), which refuses
	// none: its tickets are granted in the queue's order whatever Limit
	// and the override in force, and one granted a new slot past them
	// (the override's limit when one is in force, else Limit) has the
	// slot's record marked over the limit, as Acquire marks one
	// (TicketResult.OverLimit).
	Shadow    bool
	SlotTTL   time.Duration
	TicketTTL time.Duration
	// MaxQueue is the most tickets the user's queue may hold; a new
	// ticket past it is not queued (TicketFull).
	MaxQueue int
	// Tickets are this call's tickets, in the order their acquires came
	// to the server. At least one.
	Tickets []TicketArgs
}

// TicketArgs is one ticket of a WaitArgs.
type TicketArgs struct {
	StreamID string
	// Leave takes the ticket out of the queue: its acquire gave up.
	Leave bool
	// Retry keeps the ticket, for another request of its stream that
	// waits on, while one of its requests gives up: Waited.RetryAfter is
	// then answered, for that one's 429.
	Retry bool
	// Record is written as the slot's record if the ticket is granted.
	Record Record
}

// TicketState is what the wait script did with a ticket.
type TicketState int

// States of a ticket.
const (
	// TicketGranted: the stream holds a slot now.
	TicketGranted TicketState = 1
	// ticketExtended is the script's TicketGranted of a stream that held
	// its slot already (TicketResult.Extended).
	ticketExtended TicketState = 2
	// TicketQueued: the ticket waits; Place says where.
	TicketQueued TicketState = 0
	// TicketLeft: the ticket is not in the queue (it left).
	TicketLeft TicketState = -1
	// TicketFull: not queued, the queue holds MaxQueue tickets, each
	// served before it would be (a new ticket that would be served before
	// the last takes its place: see lib_tickets.lua's displace); also a
	// ticket of the call, queued, whose place a later new one of the same
	// call took.
	TicketFull TicketState = -2
	// TicketNotHolder: the stream is another caller's (its ticket or its
	// slot records another caller than the ticket's Record); nothing
	// changed.
	TicketNotHolder TicketState = -3
)

// TicketResult is the wait script's answer for one ticket.
type TicketResult struct {
	State TicketState
	// ExpiresAtMs is the granted slot's expiry (Redis ms).
	ExpiresAtMs int64
	// Extended, of a granted ticket: the stream held its slot already
	// (another request of the stream took it), which the call extended,
	// counting it in the slot's record (see Acquired.Again).
	Extended bool
	// Share, of a granted ticket: its share of the slot, which a request
	// that gives up leaves (see Share).
	Share Share
	// Used, of a granted ticket: the scope's slots as the call granted
	// it, its own counted (of an Extended one, which adds none, those held
	// then). A call that grants several judges each by its own count:
	// only those granted past the limit were over it (OverLimit;
	// Waited.Used is the count after the last).
	Used int
	// Record, of an Extended ticket: the held slot's record, as kept (see
	// Acquired.Record).
	Record string
	// OverLimit, of a granted ticket: shadow mode (WaitArgs.Shadow) let
	// its new slot in over the limit, which the slot's record keeps; of
	// an Extended one (or the ticket's own grant asked again), the
	// verdict the held slot's record keeps (StoredRecord.OverLimit), as
	// an extension by Acquire answers (Acquired.WouldRefuse).
	OverLimit bool
	// Place is a queued ticket's place in the queue: 1 is next.
	Place int
}

// Waited is the result of the wait script.
type Waited struct {
	Used int // the user's live slots after the call
	// Override is the limit of the user's support override, which the
	// call applied instead of WaitArgs.Limit; -1 when none was in force.
	Override int
	Pruned   int // expired slots removed by the call
	// Next is how long until the answer may change by time alone (a slot
	// or a ticket expiring), when a ticket still waits; -1 otherwise.
	Next time.Duration
	// RetryAfter is what a denial answers (until enough slots expire for
	// one to be free), when a ticket of the call left or was not queued;
	// 0 otherwise.
	RetryAfter time.Duration
	// Wake are other servers' tickets owed a free slot: the caller wakes
	// them.
	Wake []string
	// Tickets answer WaitArgs.Tickets, in order.
	Tickets []TicketResult
}

// ticketValues is how many values the wait script answers per ticket:
// state, value, share, started, used, record and over.
const ticketValues = 7

// Wait runs the wait script on key (a keys.Schema.UserKey), its slot
// records and its queue.
func Wait(ctx context.Context, c rueidis.Client, key string, a WaitArgs) (Waited, error) {
	if len(a.Tickets) == 0 {
		return Waited{}, fmt.Errorf("wait script: no tickets")
	}
	args := make([]string, 0, 6+3*len(a.Tickets))
	limit := a.Limit
	if a.Shadow {
		limit = Unbounded // Limit goes last, for the script to judge by
	}
	args = append(args, strconv.Itoa(limit), ms(a.SlotTTL), ms(a.TicketTTL), strconv.Itoa(a.MaxQueue), strconv.Itoa(len(a.Tickets)))
	for _, t := range a.Tickets {
		action := "w"
		switch {
		case t.Leave:
			action = "l"
		case t.Retry:
			action = "r"
		}
		args = append(args, t.StreamID, action, t.Record.encode())
	}
	if a.Shadow {
		args = append(args, strconv.Itoa(a.Limit))
	}
	arr, err := waitScript.Exec(ctx, c, queueKeys(key), args).ToArray()
	if err != nil {
		return Waited{}, err
	}
	if len(arr) != 6+ticketValues*len(a.Tickets) {
		return Waited{}, fmt.Errorf("wait script returned %d values, want %d", len(arr), 6+ticketValues*len(a.Tickets))
	}
	head, err := int64s(arr[:5])
	if err != nil {
		return Waited{}, fmt.Errorf("wait script: %w", err)
	}
	wake, err := arr[5].AsStrSlice()
	if err != nil {
		return Waited{}, fmt.Errorf("wait script: wake ids: %w", err)
	}
	out := Waited{Used: int(head[0]), Override: int(head[1]), Pruned: int(head[2]), Next: -1, RetryAfter: time.Duration(head[4]) * time.Millisecond,
		Wake: wake, Tickets: make([]TicketResult, len(a.Tickets))}
	if head[3] >= 0 {
		out.Next = time.Duration(head[3]) * time.Millisecond
	}
	for i := range out.Tickets {
		at := 6 + ticketValues*i
		v, err := int64s(arr[at : at+5])
		if err != nil {
			return Waited{}, fmt.Errorf("wait script: ticket %d: %w", i+1, err)
		}
		r := TicketResult{State: TicketState(v[0])}
		if r.State == ticketExtended {
			r.State, r.Extended = TicketGranted, true
			if r.Record, err = arr[at+5].ToString(); err != nil {
				return Waited{}, fmt.Errorf("wait script: ticket %d: record: %w", i+1, err)
			}
		}
		switch r.State {
		case TicketGranted:
			over, err := arr[at+6].AsInt64()
			if err != nil {
				return Waited{}, fmt.Errorf("wait script: ticket %d: over: %w", i+1, err)
			}
			r.ExpiresAtMs, r.Share, r.Used, r.OverLimit = v[1], Share{Index: int(v[2]), StartedAtMs: v[3]}, int(v[4]), over == 1
		case TicketQueued:
			r.Place = int(v[1])
		}
		out.Tickets[i] = r
	}
	return out, nil
}
