package controller

import (
	"testing"
	"time"

	"github.com/joishi/limiter/api/v1alpha1"
)

func TestSetStatusRecordsTheAcceptedSpec(t *testing.T) {
	lt := limitTier("paid", "", 5, 0)
	lt.Generation = 1
	if !setStatus(tierKind{}, &lt, resolveTiers([]v1alpha1.LimitTier{lt}).verdicts["paid"]) {
		t.Fatal("setStatus reported no change to an empty status")
	}
	if s := lt.Status; s.AcceptedGeneration != 1 || s.AcceptedSpec == nil || s.AcceptedSpec.MaxConcurrentStreams != 5 {
		t.Fatalf("after a valid generation 1: acceptedGeneration %d, acceptedSpec %+v; want 1 and its spec", s.AcceptedGeneration, s.AcceptedSpec)
	}
	if setStatus(tierKind{}, &lt, resolveTiers([]v1alpha1.LimitTier{lt}).verdicts["paid"]) {
		t.Error("setStatus reported a change when writing the same verdict again")
	}

	lt.Generation = 2
	lt.Spec.MaxConcurrentStreams = 7
	lt.Spec.SlotTTL.Duration = 30 * time.Second // heartbeat 20s > 10s: invalid
	v := resolveTiers([]v1alpha1.LimitTier{lt}).verdicts["paid"]
	setStatus(tierKind{}, &lt, v)
	if s := lt.Status; s.AcceptedGeneration != 1 || s.AcceptedSpec.MaxConcurrentStreams != 5 || s.ObservedGeneration != 2 {
		t.Errorf("after an invalid generation 2: accepted generation %d (max %d), observed %d; want generation 1 (max 5) kept, 2 observed",
			s.AcceptedGeneration, s.AcceptedSpec.MaxConcurrentStreams, s.ObservedGeneration)
	}
	if s := lt.Status; s.SlotTTL != "30s" || s.HeartbeatInterval != "20s" || s.Plan != "paid" {
		t.Errorf("status slotTTL, heartbeatInterval, plan = %q, %q, %q; want the spec's 30s, 20s and plan paid", s.SlotTTL, s.HeartbeatInterval, s.Plan)
	}
}

func TestFormatDuration(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{120 * time.Second, "120s"},
		{time.Minute, "60s"},
		{24 * time.Hour, "86400s"},
		{1500 * time.Millisecond, "1500ms"},
		{100 * time.Millisecond, "100ms"},
		{100 * time.Millisecond / 3, "33.333333ms"},
		{0, ""},
	} {
		if got := formatDuration(tc.d); got != tc.want {
			t.Errorf("formatDuration(%s) = %q, want %q", tc.d, got, tc.want)
		}
	}
}
