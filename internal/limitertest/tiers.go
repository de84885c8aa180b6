package limitertest

import (
	"time"

	"github.com/joishi/limiter/pkg/tiers"
)

// Tiers returns the plans of the default test table, a new slice each call.
// The short plans let a test watch slots expire; the others keep a slot
// for 10s, longer than any test needs it.
func Tiers() []tiers.Tier {
	return []tiers.Tier{
		{Plan: "three", MaxConcurrentStreams: 3, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailOpen},
		{Plan: "one", MaxConcurrentStreams: 1, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailOpen},
		{Plan: "short", MaxConcurrentStreams: 3, SlotTTL: 300 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond, FailureMode: tiers.FailOpen},
		{Plan: "short-one", MaxConcurrentStreams: 1, SlotTTL: 300 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond, FailureMode: tiers.FailOpen},
		{Plan: "closed", MaxConcurrentStreams: 3, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailClosed},
		{Plan: "none", MaxConcurrentStreams: 0, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailOpen},
	}
}
