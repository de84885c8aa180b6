package v1alpha1_test

import (
	"fmt"
	"strings"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/joishi/limiter/api/v1alpha1"
)

// manyKeys is n keys k0, k1, ... each capped at 1.
func manyKeys(n int) map[string]any {
	out := make(map[string]any, n)
	for i := range n {
		out[fmt.Sprintf("k%d", i)] = 1
	}
	return out
}

func TestTheAPIServerRefusesInvalidLimitPools(t *testing.T) {
	wantRefused(t, "LimitPool", []refusal{
		{"a negative default cap", map[string]any{"maxConcurrentStreams": -1}, "spec.maxConcurrentStreams: Invalid value: -1: spec.maxConcurrentStreams in body should be greater than or equal to 0"},
		{"a default cap above 100000", map[string]any{"maxConcurrentStreams": 100001}, "spec.maxConcurrentStreams in body should be less than or equal to 100000"},
		{"an unknown failure mode", map[string]any{"failureMode": "Sometimes"}, `spec.failureMode: Unsupported value: "Sometimes": supported values: "Open", "Closed"`},
		{"a maxWait above 60s", map[string]any{"maxWait": "61s"}, `spec.maxWait: Invalid value: "61s": must be between 0s and 60s`},
		{"a malformed maxWait", map[string]any{"maxWait": "forever"}, `spec.maxWait: Invalid value: "forever"`},
		{"a pool name in capitals", map[string]any{"pool": "Model"}, `spec.pool: Invalid value: "Model"`},
		{"a pool name starting with a dot", map[string]any{"pool": ".model"}, `spec.pool: Invalid value: ".model"`},
		{"a pool name of 64 characters", map[string]any{"pool": strings.Repeat("p", 64)}, "spec.pool: Too long"},
		{"a key with a space", map[string]any{"keys": map[string]any{"gpt 4o": 1}}, "spec.keys: Invalid value: each key must be 1-128 bytes of [A-Za-z0-9._:/@-]"},
		{"a key with a brace", map[string]any{"keys": map[string]any{"a{b}": 1, "ok": 1}}, "each key must be 1-128 bytes"},
		{"an empty key", map[string]any{"keys": map[string]any{"": 1}}, "each key must be 1-128 bytes"},
		{"a key of 129 bytes", map[string]any{"keys": map[string]any{strings.Repeat("k", 129): 1}}, "each key must be 1-128 bytes"},
		{"a negative cap", map[string]any{"keys": map[string]any{"gpt-4o": -1}}, "spec.keys: Invalid value: each cap must be between 0 and 100000"},
		{"a cap above 100000", map[string]any{"keys": map[string]any{"gpt-4o": 100001, "llama-70b": 64}}, "each cap must be between 0 and 100000"},
		{"1001 keys", map[string]any{"keys": manyKeys(1001)}, "spec.keys: Too many: 1001: must have at most 1000 items"},
		{"enforce as a string", map[string]any{"enforce": "false"}, "spec.enforce in body must be of type boolean"},
	})
}

func TestTheAPIServerTakesValidLimitPools(t *testing.T) {
	env := kube.Get(t)
	ns := env.Namespace(t)
	if err := create(t, env.Client, "LimitPool", ns, "model", map[string]any{"keys": map[string]any{"gpt-4o": 500}}); err != nil {
		t.Fatal(err)
	}
	var got v1alpha1.LimitPool
	if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "model"}, &got); err != nil {
		t.Fatal(err)
	}
	s := got.Spec
	if s.FailureMode != v1alpha1.FailOpen {
		t.Errorf("failureMode = %q, want the default Open", s.FailureMode)
	}
	if s.MaxWait == nil || s.MaxWait.Duration != 0 {
		t.Errorf("maxWait = %v, want the default 0s (no waiting)", s.MaxWait)
	}
	if s.Enforce == nil || !*s.Enforce {
		t.Errorf("enforce = %s, want the default true (the caps refuse)", ptrBool(s.Enforce))
	}
	// Absent means "keys not listed are not capped": the server must not
	// default it to a number.
	if s.MaxConcurrentStreams != nil {
		t.Errorf("maxConcurrentStreams = %d, want it left unset", *s.MaxConcurrentStreams)
	}
	if s.Pool != "" || s.Keys["gpt-4o"] != 500 {
		t.Errorf("pool, keys = %q, %v, want them as sent: empty (metadata.name applies) and gpt-4o: 500", s.Pool, s.Keys)
	}

	// The bounds themselves, and keys as model and organisation names are
	// written.
	for i, spec := range []map[string]any{
		{},
		{"maxConcurrentStreams": 0, "maxWait": "60s", "failureMode": "Closed", "pool": "org.v2_x-1"},
		{"maxConcurrentStreams": 100000, "keys": map[string]any{"meta-llama/Llama-3.1-70B-Instruct": 100000, "org:acme@eu.1": 0}},
		{"keys": map[string]any{strings.Repeat("k", 128): 1}},
		{"keys": manyKeys(1000)},
	} {
		if err := create(t, env.Client, "LimitPool", ns, "ok-"+string(rune('a'+i)), spec); err != nil {
			t.Errorf("spec %.200v: %v, want it accepted", spec, err)
		}
	}
}
