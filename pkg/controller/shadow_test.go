package controller_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	"github.com/joishi/limiter/api/v1alpha1"
)

// showEnforce is *b, or "unset".
func showEnforce(b *bool) string {
	if b == nil {
		return "unset"
	}
	return fmt.Sprint(*b)
}

// boolOf is a fresh pointer to "true" or "false", nil for anything else.
func boolOf(s string) *bool {
	if s != "true" && s != "false" {
		return nil
	}
	v := s == "true"
	return &v
}

// tierEnforceIs is a check that the tier table holds plan with Enforce want
// ("false", "unset"; "none": no such plan), and that Enforced agrees.
func (s *started) tierEnforceIs(plan, want string) func() string {
	return func() string {
		got := "none"
		if tier, ok := s.Table.Lookup(plan); ok {
			got = showEnforce(tier.Enforce)
			if tier.Enforced() != (got != "false") {
				return fmt.Sprintf("tier %s: Enforce %s but Enforced() = %v", plan, got, tier.Enforced())
			}
		}
		if got != want {
			return fmt.Sprintf("tier %s: Enforce = %s, want %s", plan, got, want)
		}
		return ""
	}
}

// poolEnforceIs is tierEnforceIs for the pool table.
func (s *started) poolEnforceIs(pool, want string) func() string {
	return func() string {
		got := "none"
		if p, ok := s.Pools.Lookup(pool); ok {
			got = showEnforce(p.Enforce)
			if p.Enforced() != (got != "false") {
				return fmt.Sprintf("pool %s: Enforce %s but Enforced() = %v", pool, got, p.Enforced())
			}
		}
		if got != want {
			return fmt.Sprintf("pool %s: Enforce = %s, want %s", pool, got, want)
		}
		return ""
	}
}

// spec.enforce of LimitTiers and LimitPools reaches the tables: false puts
// the plan or pool in shadow mode (DESIGN §18), true and absent (which the
// API server defaults to true) enforce; an edit either way, and removing
// the field, follow without a restart. kubectl's Enforce column shows it,
// and the Ready message says shadow mode.
func TestEnforceReachesTheTables(t *testing.T) {
	env := kube.Get(t)
	ns := env.Namespace(t)
	ctx := t.Context()
	c := startController(t, env.Config, ns)
	<-c.Table.Synced()

	lts := map[string]*v1alpha1.LimitTier{}
	lps := map[string]*v1alpha1.LimitPool{}
	for name, enforce := range map[string]string{"shadow": "false", "strict": "true", "plain": "unset"} {
		lt := newLimitTier(ns, name, "", 1)
		lt.Spec.Enforce = boolOf(enforce)
		lp := newLimitPool(ns, name, "", 1, nil)
		lp.Spec.Enforce = boolOf(enforce)
		if err := env.Client.Create(ctx, lt); err != nil {
			t.Fatal(err)
		}
		if err := env.Client.Create(ctx, lp); err != nil {
			t.Fatal(err)
		}
		lts[name], lps[name] = lt, lp
	}
	// true, and absent (which the API server stores as the default, true),
	// are the config file's default: Enforce nil, enforced.
	for name, want := range map[string]string{"shadow": "false", "strict": "unset", "plain": "unset"} {
		eventually(t, time.Second, c.tierEnforceIs(name, want))
		eventually(t, time.Second, c.poolEnforceIs(name, want))
	}
	wantStatus(t, env.Client, ns, "shadow", v1alpha1.ReasonAccepted,
		`plan "shadow" is in force: 1 concurrent stream per user, in shadow mode (enforce: false)`)
	wantPoolStatus(t, env.Client, ns, "shadow", v1alpha1.ReasonAccepted,
		`pool "shadow" is in force: 1 concurrent stream per key, in shadow mode (enforce: false)`)
	for _, name := range []string{"strict", "plain"} {
		got := wantStatus(t, env.Client, ns, name, v1alpha1.ReasonAccepted, "is in force: 1 concurrent stream per user")
		if msg := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionReady).Message; strings.Contains(msg, "shadow") {
			t.Errorf("LimitTier %s: Ready message %q mentions shadow mode, want not", name, msg)
		}
		gotPool := wantPoolStatus(t, env.Client, ns, name, v1alpha1.ReasonAccepted, "is in force: 1 concurrent stream per key")
		if msg := meta.FindStatusCondition(gotPool.Status.Conditions, v1alpha1.ConditionReady).Message; strings.Contains(msg, "shadow") {
			t.Errorf("LimitPool %s: Ready message %q mentions shadow mode, want not", name, msg)
		}
	}

	// kubectl get lt / lp: the Enforce column.
	for name, want := range map[string]string{"shadow": "false", "strict": "true", "plain": "true"} {
		for _, resource := range []string{"limittiers", "limitpools"} {
			if got := printedColumns(t, env.Config, ns, resource, name)["Enforce"]; got != want {
				t.Errorf("kubectl get %s %s: Enforce column = %q, want %q", resource, name, got, want)
			}
		}
	}

	// Switched on, and off, without a restart.
	for name, enforce := range map[string]string{"shadow": "true", "strict": "false"} {
		patchSpec(t, env.Client, lts[name], func(lt *v1alpha1.LimitTier) { lt.Spec.Enforce = boolOf(enforce) })
		if err := patchPool(t, env.Client, lps[name], func(lp *v1alpha1.LimitPool) { lp.Spec.Enforce = boolOf(enforce) }); err != nil {
			t.Fatal(err)
		}
	}
	for name, want := range map[string]string{"shadow": "unset", "strict": "false"} {
		eventually(t, time.Second, c.tierEnforceIs(name, want))
		eventually(t, time.Second, c.poolEnforceIs(name, want))
	}

	// The field removed (a merge patch with enforce: null): the default,
	// true, applies again.
	patchSpec(t, env.Client, lts["strict"], func(lt *v1alpha1.LimitTier) { lt.Spec.Enforce = nil })
	if err := patchPool(t, env.Client, lps["strict"], func(lp *v1alpha1.LimitPool) { lp.Spec.Enforce = nil }); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Second, c.tierEnforceIs("strict", "unset"))
	eventually(t, time.Second, c.poolEnforceIs("strict", "unset"))
	if got := printedColumns(t, env.Config, ns, "limittiers", "strict")["Enforce"]; got != "true" {
		t.Errorf("kubectl get limittiers strict after enforce was removed: Enforce column = %q, want true", got)
	}
}
