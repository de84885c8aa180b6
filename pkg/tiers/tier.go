// Package tiers holds the limit tiers (plans) the limiter enforces and the
// atomic table the request path reads them from.
package tiers

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
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
	// MinHeartbeatInterval is the shortest heartbeat interval accepted:
	// answers carry it as heartbeat_interval_ms, whole milliseconds of at
	// least 1, which a shorter one would read as 0.
	MinHeartbeatInterval = time.Millisecond
	// MaxSlotTTL is the longest slot TTL accepted: a crashed holder's slot
	// stays counted this long, so a day is already generous.
	MaxSlotTTL = 24 * time.Hour
	// MaxConcurrentStreams is the largest per-user limit accepted. It
	// bounds the cost of one script: the slots listing and release_all
	// read every member of a user's sorted set, and Redis runs nothing
	// else on that shard meanwhile. Listing 100,000 live slots took 536 ms
	// of Redis time, past every other user's deadline on the shard; 1000
	// take under a millisecond (BenchmarkSlots, BenchmarkReleaseAll in
	// pkg/lua).
	MaxConcurrentStreams = 1000
	// MaxPlanLength is the longest plan name accepted.
	MaxPlanLength = 63
	// MaxMaxWait is the longest maxWait accepted. A waiting acquire holds
	// its HTTP request (and a connection of every hop in front) open for
	// up to that long; past a minute a caller is better told 429 and
	// Retry-After.
	MaxMaxWait = 60 * time.Second
	// MaxPriority is the highest priority a tier may have (0 is the
	// lowest and the default).
	MaxPriority = 9
)

var planPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// ValidPlan reports whether plan is a plan name a tier may have: 1 to
// MaxPlanLength characters of [A-Za-z0-9._-], starting with a letter or
// digit.
func ValidPlan(plan string) bool {
	return len(plan) <= MaxPlanLength && planPattern.MatchString(plan)
}

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
	// MaxWait is how long an acquire of the plan may wait for one of the
	// user's slots to free up, first come first served, instead of being
	// refused at once: the request's wait (wait_ms) is capped by it.
	// Default 0: no waiting, a full user is refused at once. At most
	// MaxMaxWait.
	MaxWait time.Duration
	// Priority orders the plan's acquires waiting for a full pool key
	// (DESIGN §17): a higher priority is served first. 0 (the default)
	// to MaxPriority.
	Priority int
	// Enforce, false, puts the plan in shadow mode (DESIGN §18): its limit
	// decides and counts every acquire as usual but never refuses one; a
	// stream it would refuse is granted, takes its slot and is said to
	// be (would_refuse). Nil (the default) or true: the limit refuses.
	Enforce *bool
}

// Enforced reports whether the plan's limit refuses (Enforce unset or
// true), rather than only saying what it would refuse.
func (t Tier) Enforced() bool { return t.Enforce == nil || *t.Enforce }

// OutageMode is the failure mode that answers when Redis does not: the
// plan's FailureMode, or Open in shadow mode, whose limit refuses no one
// (a Closed shadow plan would refuse every stream in an outage, and
// none when Redis answers).
func (t Tier) OutageMode() FailureMode {
	if !t.Enforced() {
		return FailOpen
	}
	return t.FailureMode
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

// FieldError is one field of a tier out of bounds.
type FieldError struct {
	// Field is the field's name, the same in both tier sources:
	// "maxConcurrentStreams".
	Field string
	// Problem says what is allowed: "must be <= 1000".
	Problem string
	// Got is the offending value, formatted; empty when the field is
	// missing.
	Got string
}

// Error is "maxConcurrentStreams must be <= 1000, got 5000".
func (e *FieldError) Error() string {
	if e.Got == "" {
		return e.Field + " " + e.Problem
	}
	return e.Field + " " + e.Problem + ", got " + e.Got
}

// Problems returns every field of t that is out of bounds, in the order of
// the fields; none when t is valid.
func (t Tier) Problems() []*FieldError {
	var out []*FieldError
	add := func(field, problem, got string) {
		out = append(out, &FieldError{Field: field, Problem: problem, Got: got})
	}
	switch {
	case t.Plan == "":
		add("plan", "is required", "")
	case !ValidPlan(t.Plan):
		add("plan", fmt.Sprintf("must be 1-%d characters of [A-Za-z0-9._-], starting with a letter or digit", MaxPlanLength), strconv.Quote(t.Plan))
	}
	switch {
	case t.MaxConcurrentStreams < 0:
		add("maxConcurrentStreams", "must be >= 0", strconv.Itoa(t.MaxConcurrentStreams))
	case t.MaxConcurrentStreams > MaxConcurrentStreams:
		add("maxConcurrentStreams", fmt.Sprintf("must be <= %d", MaxConcurrentStreams), strconv.Itoa(t.MaxConcurrentStreams))
	}
	if t.SlotTTL < MinSlotTTL || t.SlotTTL > MaxSlotTTL {
		add("slotTTL", fmt.Sprintf("must be between %s and %s", MinSlotTTL, MaxSlotTTL), t.SlotTTL.String())
	}
	if t.HeartbeatInterval < MinHeartbeatInterval {
		add("heartbeatInterval", fmt.Sprintf("must be at least %s (heartbeat_interval_ms is whole milliseconds)", MinHeartbeatInterval), t.HeartbeatInterval.String())
	} else if t.HeartbeatInterval > t.SlotTTL/3 {
		add("heartbeatInterval", fmt.Sprintf("must be <= slotTTL/3 (%s)", t.SlotTTL/3), t.HeartbeatInterval.String())
	}
	if t.FailureMode != FailOpen && t.FailureMode != FailClosed {
		add("failureMode", "must be Open or Closed", strconv.Quote(string(t.FailureMode)))
	}
	if t.MaxWait < 0 || t.MaxWait > MaxMaxWait {
		add("maxWait", "must be between 0s (no waiting) and 60s", t.MaxWait.String())
	}
	if t.Priority < 0 || t.Priority > MaxPriority {
		add("priority", fmt.Sprintf("must be 0 to %d (higher is served first)", MaxPriority), strconv.Itoa(t.Priority))
	}
	return out
}

// Validate reports every field of t that is out of bounds (Problems),
// naming the field, the value and what is allowed.
func (t Tier) Validate() error {
	problems := t.Problems()
	if len(problems) == 0 {
		return nil
	}
	errs := make([]error, len(problems))
	for i, p := range problems {
		errs[i] = p
	}
	return fmt.Errorf("tier %q: %w", t.Plan, errors.Join(errs...))
}

// Defaults returns the tiers used when none are configured: free=1, and
// paid=3 whose acquires may wait up to 10s for a slot (wait_ms).
func Defaults() []Tier {
	return []Tier{
		Tier{Plan: "free", MaxConcurrentStreams: 1}.WithDefaults(),
		Tier{Plan: "paid", MaxConcurrentStreams: 3, MaxWait: 10 * time.Second}.WithDefaults(),
	}
}
