package controller

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/joishi/limiter/api/v1alpha1"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/tiers"
)

// limitPool is a LimitPool as the API server would hand it out: defaults
// applied, created createdAt seconds after epoch, with default cap def
// (-1: none) and keys.
func limitPool(name, pool string, def int32, keys map[string]int32, createdAt int) v1alpha1.LimitPool {
	lp := v1alpha1.LimitPool{
		ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(epoch.Add(time.Duration(createdAt) * time.Second))},
		Spec: v1alpha1.LimitPoolSpec{
			Pool:        pool,
			Keys:        keys,
			MaxWait:     &metav1.Duration{},
			FailureMode: v1alpha1.FailOpen,
		},
	}
	if def >= 0 {
		lp.Spec.MaxConcurrentStreams = &def
	}
	return lp
}

// poolEditedInvalid is lp at generation 2, a key with a space added to
// its spec, generation 1 (lp as given) recorded as accepted.
func poolEditedInvalid(lp v1alpha1.LimitPool) v1alpha1.LimitPool {
	accepted := lp.Spec.DeepCopy()
	lp.Generation = 2
	lp.Spec.Keys = map[string]int32{"gpt 4o": 1}
	lp.Status.AcceptedSpec, lp.Status.AcceptedGeneration = accepted, 1
	return lp
}

// resolvePools is resolve of the LimitPools items.
func resolvePools(items []v1alpha1.LimitPool) resolution[pools.Pool] {
	return resolve(poolKind{}, addrs(items), nil)
}

// poolCaps is "model=100 org=-": each pool of list with its default cap
// (- when none) and its keys' caps, in key order.
func poolCaps(list []pools.Pool) string {
	parts := make([]string, len(list))
	for i, p := range list {
		def := "-"
		if p.MaxConcurrentStreams != nil {
			def = fmt.Sprint(*p.MaxConcurrentStreams)
		}
		keys := make([]string, 0, len(p.Keys))
		for k, v := range p.Keys {
			keys = append(keys, fmt.Sprintf(",%s:%d", k, v))
		}
		slices.Sort(keys)
		parts[i] = p.Pool + "=" + def + strings.Join(keys, "")
	}
	return strings.Join(parts, " ")
}

func TestResolvePools(t *testing.T) {
	model := map[string]int32{"gpt-4o": 500, "llama-70b": 64}
	cases := []resolveCase[v1alpha1.LimitPool]{
		{
			name:        "a valid pool is accepted",
			items:       []v1alpha1.LimitPool{limitPool("model", "", 100, model, 0)},
			want:        []string{"model:Accepted"},
			wantEntries: "model=100,gpt-4o:500,llama-70b:64",
			wantMsg:     map[string]string{"model": `pool "model" is in force: 100 concurrent streams per key, 2 keys with a cap of their own`},
		},
		{
			name:        "without a default cap, keys not listed are not capped",
			items:       []v1alpha1.LimitPool{limitPool("model", "", -1, map[string]int32{"gpt-4o": 1}, 0)},
			want:        []string{"model:Accepted"},
			wantEntries: "model=-,gpt-4o:1",
			wantMsg:     map[string]string{"model": `pool "model" is in force: keys not listed are not capped, 1 key with a cap of its own`},
		},
		{
			name:        "spec.pool overrides metadata.name",
			items:       []v1alpha1.LimitPool{limitPool("models-2026", "model", 1, nil, 0)},
			want:        []string{"models-2026:Accepted"},
			wantEntries: "model=1",
			wantMsg:     map[string]string{"models-2026": `pool "model" is in force: 1 concurrent stream per key`},
		},
		{
			name:        "a metadata.name unfit as a pool is invalid",
			items:       []v1alpha1.LimitPool{limitPool(strings.Repeat("p", 64), "", 1, nil, 0)},
			want:        []string{strings.Repeat("p", 64) + ":Invalid"},
			wantEntries: "",
			wantMsg:     map[string]string{strings.Repeat("p", 64): "metadata.name must be 1-63 characters of [a-z0-9._-]"},
		},
		{
			// The schema refuses these, but an object stored before the
			// bound (or kept by validation ratcheting) still holds them.
			name: "every field at fault is named",
			items: []v1alpha1.LimitPool{with(limitPool("model", "", 100001, map[string]int32{"gpt 4o": 1, "ok": -1}, 0), func(lp *v1alpha1.LimitPool) {
				lp.Spec.FailureMode = "Sometimes"
				lp.Spec.MaxWait.Duration = time.Minute + time.Second
			})},
			want: []string{"model:Invalid"},
			wantMsg: map[string]string{"model": `spec.maxConcurrentStreams must be between 0 and 100000, got 100001; ` +
				`spec.keys each key must be 1-128 bytes of [A-Za-z0-9._:/@-], got "gpt 4o"; spec.keys.ok must be between 0 and 100000, got -1; ` +
				`spec.failureMode must be Open or Closed, got "Sometimes"; spec.maxWait must be between 0s (no waiting) and 1m0s, got 1m1s`},
		},
		{
			name:        "fields the API server did not default take the pool defaults",
			items:       []v1alpha1.LimitPool{{ObjectMeta: metav1.ObjectMeta{Name: "org"}}},
			want:        []string{"org:Accepted"},
			wantEntries: "org=-",
		},
		{
			name:        "the older of two claims on a pool wins",
			items:       []v1alpha1.LimitPool{limitPool("model-new", "model", 5, nil, 10), limitPool("model-old", "model", 3, nil, 0)},
			want:        []string{"model-new:Conflict", "model-old:Accepted"},
			wantEntries: "model=3",
			wantMsg:     map[string]string{"model-new": `pool "model" is already defined by the older LimitPool "model-old", which is in force`},
		},
		{
			name:        "an invalid edit leaves the accepted generation in force",
			items:       []v1alpha1.LimitPool{poolEditedInvalid(limitPool("model", "", 100, model, 0))},
			want:        []string{"model:Invalid"},
			wantEntries: "model=100,gpt-4o:500,llama-70b:64",
			wantMsg: map[string]string{"model": `generation 2 is invalid: spec.keys each key must be 1-128 bytes of [A-Za-z0-9._:/@-], got "gpt 4o"; ` +
				`generation 1 stays in force: pool "model", 100 concurrent streams per key, 2 keys with a cap of their own`},
		},
		{
			name:        "the accepted generation of an older object keeps its pool against a younger claim",
			items:       []v1alpha1.LimitPool{limitPool("model-dup", "model", 9, nil, 10), poolEditedInvalid(limitPool("model", "", 5, nil, 0))},
			want:        []string{"model-dup:Conflict", "model:Invalid"},
			wantEntries: "model=5",
			wantMsg:     map[string]string{"model-dup": `already defined by the older LimitPool "model"`},
		},
		{
			name:        "the accepted generation of a younger claim is not in force either",
			items:       []v1alpha1.LimitPool{limitPool("model", "", 5, nil, 0), poolEditedInvalid(limitPool("model-dup", "model", 9, nil, 10))},
			want:        []string{"model-dup:Invalid", "model:Accepted"},
			wantEntries: "model=5",
			wantMsg:     map[string]string{"model-dup": `generation 1 is not in force either: pool "model" is already defined by the older LimitPool "model"`},
		},
		{
			name:        "an invalid spec with nothing accepted enforces nothing",
			items:       []v1alpha1.LimitPool{limitPool("model", "", 5, map[string]int32{"a{b}": 1}, 0)},
			want:        []string{"model:Invalid"},
			wantEntries: "",
			wantMsg:     map[string]string{"model": "no generation of this LimitPool was accepted, so it enforces nothing"},
		},
	}
	runResolveCases(t, cases, resolvePools, poolCaps)
}

// A LimitPool and the same pool in pools.static are one pool: the table
// holds what the config file's list would.
func TestAPoolIsReadAsInPoolsStatic(t *testing.T) {
	lp := limitPool("model", "", 100, map[string]int32{"gpt-4o": 500}, 0)
	lp.Spec.MaxWait.Duration = 10 * time.Second
	lp.Spec.FailureMode = v1alpha1.FailClosed
	got := resolvePools([]v1alpha1.LimitPool{lp}).entries
	hundred := 100
	static := pools.Pool{Pool: "model", MaxConcurrentStreams: &hundred, Keys: map[string]int{"gpt-4o": 500}, MaxWait: 10 * time.Second, FailureMode: tiers.FailClosed}.WithDefaults()
	if len(got) != 1 || !reflect.DeepEqual(got[0], static) {
		t.Fatalf("pools = %+v, want %+v", got, static)
	}
	// The entry shares no memory with the object, which the next event
	// replaces.
	lp.Spec.Keys["gpt-4o"] = 1
	*lp.Spec.MaxConcurrentStreams = 1
	if got[0].Keys["gpt-4o"] != 500 || *got[0].MaxConcurrentStreams != 100 {
		t.Errorf("after the object changed, the entry reads %+v, want it unchanged", got[0])
	}
}

func TestSetStatusOfAPool(t *testing.T) {
	lp := limitPool("model", "", 100, map[string]int32{"gpt-4o": 500, "llama-70b": 64}, 0)
	lp.Generation = 1
	lp.Spec.MaxWait.Duration = 1500 * time.Millisecond
	if !setStatus(poolKind{}, &lp, resolvePools([]v1alpha1.LimitPool{lp}).verdicts["model"]) {
		t.Fatal("setStatus reported no change to an empty status")
	}
	s := lp.Status
	if s.Pool != "model" || s.KeyCount != 2 || s.MaxWait != "1500ms" || s.ObservedGeneration != 1 {
		t.Errorf("status pool, keyCount, maxWait, observedGeneration = %q, %d, %q, %d; want model, 2, 1500ms, 1", s.Pool, s.KeyCount, s.MaxWait, s.ObservedGeneration)
	}
	if s.AcceptedGeneration != 1 || s.AcceptedSpec == nil || !reflect.DeepEqual(*s.AcceptedSpec, lp.Spec) {
		t.Fatalf("acceptedGeneration %d, acceptedSpec %+v; want 1 and the spec", s.AcceptedGeneration, s.AcceptedSpec)
	}
	if setStatus(poolKind{}, &lp, resolvePools([]v1alpha1.LimitPool{lp}).verdicts["model"]) {
		t.Error("setStatus reported a change when writing the same verdict again")
	}

	lp = poolEditedInvalid(lp)
	lp.Status.AcceptedSpec = s.AcceptedSpec
	setStatus(poolKind{}, &lp, resolvePools([]v1alpha1.LimitPool{lp}).verdicts["model"])
	s = lp.Status
	if s.AcceptedGeneration != 1 || len(s.AcceptedSpec.Keys) != 2 || s.ObservedGeneration != 2 || s.KeyCount != 1 {
		t.Errorf("after an invalid generation 2: accepted generation %d (%d keys), observed %d, keyCount %d; want generation 1 (2 keys) kept, 2 observed, 1 key (the spec's)",
			s.AcceptedGeneration, len(s.AcceptedSpec.Keys), s.ObservedGeneration, s.KeyCount)
	}
}
