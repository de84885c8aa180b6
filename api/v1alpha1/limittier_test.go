package v1alpha1_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/joishi/limiter/api/v1alpha1"
)

func TestTheAPIServerRefusesInvalidLimitTiers(t *testing.T) {
	wantRefused(t, "LimitTier", []refusal{
		{"a negative limit", map[string]any{"maxConcurrentStreams": -1}, "spec.maxConcurrentStreams: Invalid value: -1: spec.maxConcurrentStreams in body should be greater than or equal to 0"},
		{"a limit above 1000", map[string]any{"maxConcurrentStreams": 1001}, "spec.maxConcurrentStreams: Invalid value: 1001: spec.maxConcurrentStreams in body should be less than or equal to 1000"},
		{"no limit", map[string]any{"slotTTL": "60s"}, "spec.maxConcurrentStreams: Required value"},
		{"an unknown failure mode", map[string]any{"maxConcurrentStreams": 1, "failureMode": "Sometimes"}, `spec.failureMode: Unsupported value: "Sometimes": supported values: "Open", "Closed"`},
		{"a malformed slotTTL", map[string]any{"maxConcurrentStreams": 1, "slotTTL": "2 minutes"}, `spec.slotTTL: Invalid value: "2 minutes"`},
		{"a slotTTL in days", map[string]any{"maxConcurrentStreams": 1, "slotTTL": "1d"}, `spec.slotTTL: Invalid value: "1d"`},
		{"a slotTTL without a unit", map[string]any{"maxConcurrentStreams": 1, "slotTTL": "120"}, `spec.slotTTL: Invalid value: "120"`},
		{"a slotTTL below 100ms", map[string]any{"maxConcurrentStreams": 1, "slotTTL": "50ms"}, `spec.slotTTL: Invalid value: "50ms": must be between 100ms and 24h`},
		{"a slotTTL above 24h", map[string]any{"maxConcurrentStreams": 1, "slotTTL": "25h"}, "must be between 100ms and 24h"},
		{"a zero heartbeat", map[string]any{"maxConcurrentStreams": 1, "heartbeatInterval": "0s"}, `spec.heartbeatInterval: Invalid value: "0s": must be between 1ms and 8h`},
		{"a heartbeat under 1ms", map[string]any{"maxConcurrentStreams": 1, "heartbeatInterval": "999us"}, `spec.heartbeatInterval: Invalid value: "999us": must be between 1ms and 8h`},
		{"a malformed heartbeat", map[string]any{"maxConcurrentStreams": 1, "heartbeatInterval": "soon"}, `spec.heartbeatInterval: Invalid value: "soon"`},
		{"a maxWait above 60s", map[string]any{"maxConcurrentStreams": 1, "maxWait": "61s"}, `spec.maxWait: Invalid value: "61s": must be between 0s and 60s`},
		{"a malformed maxWait", map[string]any{"maxConcurrentStreams": 1, "maxWait": "forever"}, `spec.maxWait: Invalid value: "forever"`},
		{"a priority of 10", map[string]any{"maxConcurrentStreams": 1, "priority": 10}, `spec.priority: Invalid value: 10: spec.priority in body should be less than or equal to 9`},
		{"a priority of -1", map[string]any{"maxConcurrentStreams": 1, "priority": -1}, `spec.priority: Invalid value: -1: spec.priority in body should be greater than or equal to 0`},
		{"a plan with a space", map[string]any{"maxConcurrentStreams": 1, "plan": "pro plan"}, `spec.plan: Invalid value: "pro plan"`},
		{"a plan of 64 characters", map[string]any{"maxConcurrentStreams": 1, "plan": strings.Repeat("p", 64)}, "spec.plan: Too long"},
		{"enforce as a string", map[string]any{"maxConcurrentStreams": 1, "enforce": "no"}, "spec.enforce in body must be of type boolean"},
	})
}

func TestTheAPIServerAppliesDefaults(t *testing.T) {
	env := kube.Get(t)
	ns := env.Namespace(t)
	if err := create(t, env.Client, "LimitTier", ns, "free", map[string]any{"maxConcurrentStreams": 0}); err != nil {
		t.Fatal(err)
	}
	var got v1alpha1.LimitTier
	if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "free"}, &got); err != nil {
		t.Fatal(err)
	}
	s := got.Spec
	if s.SlotTTL == nil || s.SlotTTL.Duration != 120*time.Second {
		t.Errorf("slotTTL = %v, want the default 120s", s.SlotTTL)
	}
	// No server default for heartbeatInterval: the limiter defaults it to
	// min(20s, slotTTL/3), as for a static tier, which the API server
	// cannot express (a fixed 20s would make a 30s slotTTL invalid).
	if s.HeartbeatInterval != nil {
		t.Errorf("heartbeatInterval = %v, want it left unset", s.HeartbeatInterval)
	}
	if s.FailureMode != v1alpha1.FailOpen {
		t.Errorf("failureMode = %q, want the default Open", s.FailureMode)
	}
	if s.MaxWait == nil || s.MaxWait.Duration != 0 {
		t.Errorf("maxWait = %v, want the default 0s (no waiting)", s.MaxWait)
	}
	if s.Enforce == nil || !*s.Enforce {
		t.Errorf("enforce = %v, want the default true (the limit refuses)", ptrBool(s.Enforce))
	}
	if s.Plan != "" || s.MaxConcurrentStreams != 0 {
		t.Errorf("plan, maxConcurrentStreams = %q, %d, want them as sent: empty (metadata.name applies) and 0", s.Plan, s.MaxConcurrentStreams)
	}

	// What the defaults leave valid, the server takes: fractions, and
	// every unit Go's time.ParseDuration reads back.
	for i, ttl := range []string{"1.5s", "2m30s", "100ms", "24h"} {
		if err := create(t, env.Client, "LimitTier", ns, "ok-"+string(rune('a'+i)), map[string]any{"maxConcurrentStreams": 1, "slotTTL": ttl, "heartbeatInterval": "10ms"}); err != nil {
			t.Errorf("slotTTL %s: %v, want it accepted", ttl, err)
		}
	}
}

// ptrBool is *b, or "unset".
func ptrBool(b *bool) string {
	if b == nil {
		return "unset"
	}
	return fmt.Sprint(*b)
}

// enforce: false (shadow mode) is stored as sent: a default must not turn
// it back on.
func TestTheAPIServerKeepsEnforceFalse(t *testing.T) {
	env := kube.Get(t)
	ns := env.Namespace(t)
	for _, kind := range []string{"LimitTier", "LimitPool"} {
		name := strings.ToLower(kind)
		if err := create(t, env.Client, kind, ns, name, map[string]any{"maxConcurrentStreams": 1, "enforce": false}); err != nil {
			t.Fatalf("%s with enforce false: %v, want it accepted", kind, err)
		}
		var got *bool
		if kind == "LimitTier" {
			var lt v1alpha1.LimitTier
			if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, &lt); err != nil {
				t.Fatal(err)
			}
			got = lt.Spec.Enforce
		} else {
			var lp v1alpha1.LimitPool
			if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, &lp); err != nil {
				t.Fatal(err)
			}
			got = lp.Spec.Enforce
		}
		if got == nil || *got {
			t.Errorf("%s spec.enforce = %s, want false as sent", kind, ptrBool(got))
		}
	}
}
