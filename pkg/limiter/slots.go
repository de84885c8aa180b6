package limiter

import (
	"context"
	"time"

	"github.com/joishi/limiter/pkg/lua"
	"github.com/redis/rueidis"
)

// Slot is one live slot of a user, with its record: who took it, when,
// under which plan, for what.
type Slot struct {
	StreamID  string
	ExpiresAt time.Time
	// TTL is the time left before the slot expires, as seen by Redis.
	TTL time.Duration
	// StartedAt is when the slot was taken, by Redis time; zero when its
	// record holds none (a slot taken by a version that recorded none).
	StartedAt time.Time
	// Age is how long the slot has been held, as seen by Redis; 0 when
	// StartedAt is unknown.
	Age time.Duration
	// Caller, Plan and Label are those of the acquire that took the slot;
	// empty when not recorded.
	Caller string
	Plan   string
	Label  string
}

// Ticket is one acquire waiting in a user's queue (or a pool key's).
type Ticket struct {
	StreamID string
	// Plan and Priority are its plan's, which order the queue (DESIGN
	// §17); Caller and Label who asked, and for what.
	Plan, Caller, Label string
	Priority            int
	// Place is its place in the queue: 1 is served next.
	Place int
	// Since is when it was queued (Redis time).
	Since time.Time
	// Waited is how long it had waited when Redis was read.
	Waited time.Duration
	// ExpiresAt is when its place lapses unless its server, still waiting
	// for it, refreshes it.
	ExpiresAt time.Time
}

// UserSlots is a user's live slots, earliest expiry first, the override
// of the user's limit in force, and the acquires waiting for the slots,
// first served first.
type UserSlots struct {
	UserID string
	// Used counts the user's live slots; Slots are the first MaxListed of
	// them to expire (all of them but in shadow mode, where a user may
	// hold more than a plan's limit of at most 1,000).
	Used  int
	Slots []Slot
	// Override is the user's support override in force; nil when none.
	Override *Override
	Queue    []Ticket
}

// Slots lists userID's live slots, override and waiting acquires. Errors:
// ErrInvalidUserID, ErrUnavailable.
func (l *Limiter) Slots(ctx context.Context, userID string) (UserSlots, error) {
	ctx, span := l.startSpan(ctx, "limiter.slots")
	out, err := l.slots(ctx, userID)
	span.SetAttributes(attrUsed.Int(out.Used))
	endSpan(span, err)
	return out, err
}

func (l *Limiter) slots(ctx context.Context, userID string) (UserSlots, error) {
	key, err := l.keys.HeldUserKey(userID)
	if err != nil {
		return UserSlots{}, err
	}
	listing, err := l.listing(ctx, key)
	if err != nil {
		return UserSlots{}, err
	}
	out := UserSlots{UserID: userID, Used: listing.Used, Slots: make([]Slot, len(listing.Slots))}
	for i, s := range listing.Slots {
		out.Slots[i] = slotOf(s, listing.NowMs)
	}
	if o := listing.Override; o != nil {
		out.Override = overrideOf(*o, listing.NowMs)
	}
	// In the order its slots go to the waiters as they free, each judged
	// by the limit the wait script holds for it (see wait.lua).
	queue := lua.AsSlotsFree(listing.Queue, listing.Used, func(t lua.Ticket) int {
		tier, known := l.tiers.Lookup(t.Record.Plan)
		switch {
		case known && !tier.Enforced():
			return unbounded // shadow mode refuses none, its override included
		case listing.Override != nil:
			return listing.Override.Limit
		case known:
			return tier.MaxConcurrentStreams
		}
		return lua.RecordedLimit(t)
	})
	out.Queue = make([]Ticket, len(queue))
	for i, t := range queue {
		out.Queue[i] = ticketOf(t, i+1, listing.NowMs)
	}
	return out, nil
}

// ticketOf is t, the place-th of its queue, as read at nowMs.
func ticketOf(t lua.Ticket, place int, nowMs int64) Ticket {
	return Ticket{StreamID: t.StreamID, Plan: t.Record.Plan, Caller: t.Record.Caller, Label: t.Record.Label, Priority: t.Record.Priority,
		Place: place, Since: time.UnixMicro(t.ArrivalUs).UTC(),
		Waited: time.Duration(nowMs*1000-t.ArrivalUs) * time.Microsecond, ExpiresAt: msTime(t.ExpiresAtMs)}
}

// MaxListed is the most slots a listing names (Slots, PoolSlots): the
// first of them to expire. Its Used counts them all. A pool key may hold
// 100,000 streams, whose records Redis would read and answer for a
// second or more, serving nothing else meanwhile.
const MaxListed = 1000

// listing runs the slots script on key, a user's or a pool key's slots
// (the two are one kind of scope, DESIGN §16).
func (l *Limiter) listing(ctx context.Context, key string) (lua.Listing, error) {
	var listing lua.Listing
	err := l.do(ctx, "slots", func(ctx context.Context, c rueidis.Client) (err error) {
		listing, err = lua.Slots(ctx, c, key, MaxListed)
		return err
	})
	return listing, err
}

// slotOf is s, a slot as the slots script listed it, read at nowMs (Redis
// ms).
func slotOf(s lua.Slot, nowMs int64) Slot {
	rec := s.Record
	slot := Slot{
		StreamID:  s.StreamID,
		ExpiresAt: msTime(s.ExpiresAtMs),
		TTL:       msDuration(s.ExpiresAtMs - nowMs),
		Caller:    rec.Caller,
		Plan:      rec.Plan,
		Label:     rec.Label,
	}
	if rec.StartedAtMs > 0 {
		slot.StartedAt, slot.Age = msTime(rec.StartedAtMs), msDuration(max(0, nowMs-rec.StartedAtMs))
	}
	return slot
}

func msDuration(ms int64) time.Duration { return time.Duration(ms) * time.Millisecond }
