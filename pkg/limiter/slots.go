package limiter

import (
	"context"
	"time"

	"github.com/joishi/limiter/pkg/lua"
	"github.com/redis/rueidis"
)

// Slot is one live slot of a user.
type Slot struct {
	StreamID  string
	ExpiresAt time.Time
	// TTL is the time left before the slot expires, as seen by Redis.
	TTL time.Duration
}

// UserSlots is a user's live slots, earliest expiry first.
type UserSlots struct {
	UserID string
	Used   int
	Slots  []Slot
}

// Slots lists userID's live slots. Errors: ErrInvalidUserID, ErrUnavailable.
func (l *Limiter) Slots(ctx context.Context, userID string) (UserSlots, error) {
	ctx, span := l.startSpan(ctx, "limiter.slots")
	out, err := l.slots(ctx, userID)
	span.SetAttributes(attrUsed.Int(out.Used))
	endSpan(span, err)
	return out, err
}

func (l *Limiter) slots(ctx context.Context, userID string) (UserSlots, error) {
	key, err := l.keys.UserKey(userID)
	if err != nil {
		return UserSlots{}, err
	}
	var listing lua.Listing
	err = l.do(ctx, "slots", func(ctx context.Context, c rueidis.Client) (err error) {
		listing, err = lua.Slots(ctx, c, key)
		return err
	})
	if err != nil {
		return UserSlots{}, err
	}
	out := UserSlots{UserID: userID, Used: len(listing.Slots), Slots: make([]Slot, len(listing.Slots))}
	for i, s := range listing.Slots {
		out.Slots[i] = Slot{
			StreamID:  s.StreamID,
			ExpiresAt: msTime(s.ExpiresAtMs),
			TTL:       time.Duration(s.ExpiresAtMs-listing.NowMs) * time.Millisecond,
		}
	}
	return out, nil
}
