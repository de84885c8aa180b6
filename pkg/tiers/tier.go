// Package tiers holds the limit tiers (plans) the limiter enforces and the
// atomic table the request path reads them from.
package tiers

import (
	"errors"
	"fmt"
	"regexp"
	"time"
)

// FailureMode decides what a tier does when Redis cannot answer in time.
type FailureMode string

const (
	// FailOpen grants the request and marks it degraded. The default: an
	// outage of the limiter must not become an outage of the product.
	FailOpen FailureMode = "Open"
	// FailClosed refuses the request with ErrUnavailable.
	FailClosed FailureMode = "Closed"
)

// Defaults and bounds of a tier's fields.
const (
	DefaultSlotTTL           = 120 * time.Second
	DefaultHeartbeatInterval = 20 * time.Second
	DefaultFailureMode       = FailOpen

	// MinSlotTTL is the shortest slot TTL accepted: below it, one slow
	// heartbeat round trip would lose a healthy slot.
	MinSlotTTL = 100 * time.Millisecond
	// MaxSlotTTL is the longest slot TTL accepted: a crashed holder's slot
	// stays counted this long, so a day is already generous.
	MaxSlotTTL = 24 * time.Hour
	// MaxConcurrentStreams is the largest per-user limit accepted. Each slot
	// is a sorted-set member, so the bound keeps one user's key small.
	MaxConcurrentStreams = 100_000
	// MaxPlanLength is the longest plan name accepted.
	MaxPlanLength = 63
)

var planPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// Tier is one plan's limit: how many streams a user of the plan may hold at
// once, and how slots of the plan expire.
type Tier struct {
	// Plan names the tier; requests carry it. Required.
	Plan string
	// MaxConcurrentStreams is the number of slots one user may hold at once.
	// 0 means users of the plan may not stream at all.
	MaxConcurrentStreams int
	// SlotTTL is how long a slot stays believable without a heartbeat.
	// Default 120s.
	SlotTTL time.Duration
	// HeartbeatInterval is how often holders should heartbeat; at most
	// SlotTTL/3 so that two lost heartbeats do not lose the slot. Default 20s.
	HeartbeatInterval time.Duration
	// FailureMode applies when Redis is unreachable or slow. Default Open.
	FailureMode FailureMode
}

// WithDefaults returns t with its zero-valued optional fields set to their
// defaults.
func (t Tier) WithDefaults() Tier {
	if t.SlotTTL == 0 {
		t.SlotTTL = DefaultSlotTTL
	}
	if t.HeartbeatInterval == 0 {
		t.HeartbeatInterval = DefaultHeartbeatInterval
		if t.HeartbeatInterval > t.SlotTTL/3 {
			t.HeartbeatInterval = t.SlotTTL / 3
		}
	}
	if t.FailureMode == "" {
		t.FailureMode = DefaultFailureMode
	}
	return t
}

// Validate reports every field of t that is out of bounds, naming the field,
// the value and what is allowed.
func (t Tier) Validate() error {
	var errs []error
	switch {
	case t.Plan == "":
		errs = append(errs, errors.New("plan is required"))
	case len(t.Plan) > MaxPlanLength || !planPattern.MatchString(t.Plan):
		errs = append(errs, fmt.Errorf("plan %q must be 1-%d characters of [A-Za-z0-9._-], starting with a letter or digit", t.Plan, MaxPlanLength))
	}
	if t.MaxConcurrentStreams < 0 || t.MaxConcurrentStreams > MaxConcurrentStreams {
		errs = append(errs, fmt.Errorf("maxConcurrentStreams must be between 0 and %d, got %d", MaxConcurrentStreams, t.MaxConcurrentStreams))
	}
	if t.SlotTTL < MinSlotTTL || t.SlotTTL > MaxSlotTTL {
		errs = append(errs, fmt.Errorf("slotTTL must be between %s and %s, got %s", MinSlotTTL, MaxSlotTTL, t.SlotTTL))
	}
	if t.HeartbeatInterval <= 0 {
		errs = append(errs, fmt.Errorf("heartbeatInterval must be > 0, got %s", t.HeartbeatInterval))
	} else if t.HeartbeatInterval > t.SlotTTL/3 {
		errs = append(errs, fmt.Errorf("heartbeatInterval must be <= slotTTL/3 (%s), got %s", t.SlotTTL/3, t.HeartbeatInterval))
	}
	if t.FailureMode != FailOpen && t.FailureMode != FailClosed {
		errs = append(errs, fmt.Errorf("failureMode must be Open or Closed, got %q", t.FailureMode))
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("tier %q: %w", t.Plan, errors.Join(errs...))
}

// Defaults returns the tiers used when none are configured: free=1, paid=3.
func Defaults() []Tier {
	return []Tier{
		Tier{Plan: "free", MaxConcurrentStreams: 1}.WithDefaults(),
		Tier{Plan: "paid", MaxConcurrentStreams: 3}.WithDefaults(),
	}
}
