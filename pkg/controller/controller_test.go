package controller_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/joishi/limiter/api/v1alpha1"
	"github.com/joishi/limiter/pkg/controller"
	"github.com/joishi/limiter/pkg/tiers"
)

func newLimitTier(ns, name, plan string, limit int32) *v1alpha1.LimitTier {
	return &v1alpha1.LimitTier{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       v1alpha1.LimitTierSpec{Plan: plan, MaxConcurrentStreams: limit},
	}
}

// patchSpec applies mutate to lt with a merge patch: the controller writes
// status meanwhile, so an update of a copy this old would conflict.
func patchSpec(t *testing.T, c client.Client, lt *v1alpha1.LimitTier, mutate func(*v1alpha1.LimitTier)) {
	t.Helper()
	base := lt.DeepCopy()
	mutate(lt)
	if err := c.Patch(t.Context(), lt, client.MergeFrom(base)); err != nil {
		t.Fatal(err)
	}
}

// limitOf returns the limit of plan in the table, or -1 when it has none.
func (s *started) limitOf(plan string) int {
	tier, ok := s.Table.Lookup(plan)
	if !ok {
		return -1
	}
	return tier.MaxConcurrentStreams
}

func TestTableSyncsAnEmptyNamespace(t *testing.T) {
	env := kube.Get(t)
	ns := env.Namespace(t)
	c := startController(t, env.Config, ns)
	select {
	case <-c.Table.Synced():
	case <-time.After(10 * time.Second):
		t.Fatal("the table of a namespace without LimitTiers did not turn synced within 10s")
	}
	if n := c.Table.Len(); n != 0 {
		t.Errorf("table holds %d tiers, want 0", n)
	}
	// /readyz reads the tier table only: by the time it turns synced, so
	// has the pool table.
	if !c.Pools.IsSynced() {
		t.Error("the tier table turned synced before the pool table")
	}
	if n := c.Pools.Len(); n != 0 {
		t.Errorf("table holds %d pools, want 0", n)
	}
}

func TestTableFollowsCreateUpdateDelete(t *testing.T) {
	env := kube.Get(t)
	ns := env.Namespace(t)
	ctx := t.Context()
	c := startController(t, env.Config, ns)
	<-c.Table.Synced()

	pro := newLimitTier(ns, "pro", "", 3)
	if err := env.Client.Create(ctx, pro); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Second, func() string {
		if got := c.limitOf("pro"); got != 3 {
			return fmt.Sprintf("limit of pro = %d after create, want 3", got)
		}
		return ""
	})
	tier, _ := c.Table.Lookup("pro")
	if tier.SlotTTL != 120*time.Second || tier.HeartbeatInterval != 20*time.Second || tier.FailureMode != "Open" {
		t.Errorf("tier = %+v, want the CRD defaults 120s, 20s, Open", tier)
	}

	patchSpec(t, env.Client, pro, func(lt *v1alpha1.LimitTier) { lt.Spec.MaxConcurrentStreams = 1 })
	eventually(t, time.Second, func() string {
		if got := c.limitOf("pro"); got != 1 {
			return fmt.Sprintf("limit of pro = %d after the update, want 1", got)
		}
		return ""
	})

	if err := env.Client.Delete(ctx, pro); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Second, func() string {
		if got := c.limitOf("pro"); got != -1 {
			return fmt.Sprintf("limit of pro = %d after delete, want no tier", got)
		}
		return ""
	})
}

// wantStatus waits until the LimitTier name's status says reason (with a
// message containing msg) for its current generation.
func wantStatus(t *testing.T, c client.Client, ns, name, reason, msg string) v1alpha1.LimitTier {
	t.Helper()
	return *waitStatus(t, c, ns, name, reason, msg, func(lt *v1alpha1.LimitTier) (int64, []metav1.Condition) {
		return lt.Status.ObservedGeneration, lt.Status.Conditions
	})
}

// waitStatus waits until the object name of O's kind has reason (with a
// message containing msg) in its Ready condition for its current
// generation, and returns it. status reads its observedGeneration and
// conditions.
func waitStatus[T any, O interface {
	*T
	client.Object
}](t *testing.T, c client.Client, ns, name, reason, msg string, status func(O) (int64, []metav1.Condition)) O {
	t.Helper()
	var got O
	eventually(t, 5*time.Second, func() string {
		obj := O(new(T))
		err := c.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, obj)
		got = obj
		observed, conditions := status(obj)
		cond := meta.FindStatusCondition(conditions, v1alpha1.ConditionReady)
		switch {
		case err != nil:
			return err.Error()
		case cond == nil:
			return name + " has no Ready condition"
		case cond.Reason != reason || !strings.Contains(cond.Message, msg):
			return fmt.Sprintf("%s Ready = %s/%s %q, want reason %s with a message containing %q", name, cond.Status, cond.Reason, cond.Message, reason, msg)
		case observed != obj.GetGeneration() || cond.ObservedGeneration != obj.GetGeneration():
			return fmt.Sprintf("%s observedGeneration = %d (condition %d), want %d", name, observed, cond.ObservedGeneration, obj.GetGeneration())
		}
		wantReady := metav1.ConditionFalse
		if reason == v1alpha1.ReasonAccepted {
			wantReady = metav1.ConditionTrue
		}
		if cond.Status != wantReady {
			return fmt.Sprintf("%s Ready = %s with reason %s, want %s", name, cond.Status, reason, wantReady)
		}
		return ""
	})
	return got
}

func TestStatusConditions(t *testing.T) {
	env := kube.Get(t)
	ns := env.Namespace(t)
	ctx := t.Context()
	c := startController(t, env.Config, ns)

	older := newLimitTier(ns, "paid", "", 3)
	if err := env.Client.Create(ctx, older); err != nil {
		t.Fatal(err)
	}
	// creationTimestamp has a one-second resolution: make the age plain.
	time.Sleep(1100 * time.Millisecond)
	invalid := newLimitTier(ns, "short", "", 1)
	invalid.Spec.SlotTTL = &metav1.Duration{Duration: 30 * time.Second}
	invalid.Spec.HeartbeatInterval = &metav1.Duration{Duration: 15 * time.Second} // > 30s/3
	newer := newLimitTier(ns, "paid-v2", "paid", 5)
	for _, lt := range []*v1alpha1.LimitTier{invalid, newer} {
		if err := env.Client.Create(ctx, lt); err != nil {
			t.Fatal(err)
		}
	}

	got := wantStatus(t, env.Client, ns, "paid", v1alpha1.ReasonAccepted, `plan "paid" is in force`)
	if got.Status.Plan != "paid" {
		t.Errorf("status.plan of paid = %q, want paid", got.Status.Plan)
	}
	wantStatus(t, env.Client, ns, "short", v1alpha1.ReasonInvalid, "heartbeatInterval must be <= slotTTL/3 (10s), got 15s")
	wantStatus(t, env.Client, ns, "paid-v2", v1alpha1.ReasonConflict, `plan "paid" is already defined by the older LimitTier "paid"`)
	if got := c.limitOf("paid"); got != 3 {
		t.Errorf("limit of paid = %d, want 3 (the older object's)", got)
	}
	if got := c.limitOf("short"); got != -1 {
		t.Errorf("the invalid tier is in the table with limit %d", got)
	}

	t.Run("observedGeneration follows a fix", func(t *testing.T) {
		patchSpec(t, env.Client, invalid, func(lt *v1alpha1.LimitTier) {
			lt.Spec.HeartbeatInterval = &metav1.Duration{Duration: 10 * time.Second}
		})
		got := wantStatus(t, env.Client, ns, "short", v1alpha1.ReasonAccepted, `plan "short" is in force`)
		if got.Generation != 2 {
			t.Errorf("generation = %d after one spec update, want 2", got.Generation)
		}
	})

	t.Run("deleting the object in force hands its plan to the conflicting one", func(t *testing.T) {
		if err := env.Client.Delete(ctx, older); err != nil {
			t.Fatal(err)
		}
		wantStatus(t, env.Client, ns, "paid-v2", v1alpha1.ReasonAccepted, `plan "paid" is in force`)
		eventually(t, time.Second, func() string {
			if got := c.limitOf("paid"); got != 5 {
				return fmt.Sprintf("limit of paid = %d, want 5", got)
			}
			return ""
		})
	})

	t.Run("the replica holding the Lease wrote it", func(t *testing.T) {
		var lease coordinationv1.Lease
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: controller.DefaultLeaseName}, &lease); err != nil {
			t.Fatal(err)
		}
		if holder := ptrString(lease.Spec.HolderIdentity); holder != c.Identity() {
			t.Errorf("Lease holder = %q, want this controller, %q", holder, c.Identity())
		}
	})
}

// A LimitTier without heartbeatInterval takes the static list's default,
// min(20s, slotTTL/3): with slotTTL 30s it is valid, at 10s, as the same
// tier in tiers.static is. (The API server must not default the field to a
// fixed 20s, which a short slotTTL would make invalid.)
func TestHeartbeatDefaultFollowsSlotTTL(t *testing.T) {
	env := kube.Get(t)
	ns := env.Namespace(t)
	c := startController(t, env.Config, ns)

	short := newLimitTier(ns, "short", "", 2)
	short.Spec.SlotTTL = &metav1.Duration{Duration: 30 * time.Second}
	if err := env.Client.Create(t.Context(), short); err != nil {
		t.Fatal(err)
	}
	got := wantStatus(t, env.Client, ns, "short", v1alpha1.ReasonAccepted, `plan "short" is in force`)
	if got.Spec.HeartbeatInterval != nil {
		t.Errorf("stored spec.heartbeatInterval = %v, want it left unset", got.Spec.HeartbeatInterval)
	}
	// What kubectl's Heartbeat column shows: the interval in force.
	if hb := got.Status.HeartbeatInterval; hb != "10s" {
		t.Errorf("status.heartbeatInterval = %q, want 10s", hb)
	}
	eventually(t, time.Second, func() string {
		tier, ok := c.Table.Lookup("short")
		if !ok {
			return "plan short is not in the table"
		}
		static := tiers.Tier{Plan: "short", MaxConcurrentStreams: 2, SlotTTL: 30 * time.Second}.WithDefaults()
		if tier != static || tier.HeartbeatInterval != 10*time.Second {
			return fmt.Sprintf("tier = %+v, want %+v (heartbeat 10s, as in tiers.static)", tier, static)
		}
		return ""
	})
}

func TestOneReplicaWritesStatus(t *testing.T) {
	env := kube.Get(t)
	ns := env.Namespace(t)
	ctx := t.Context()
	a := startController(t, env.Config, ns)
	b := startController(t, env.Config, ns)

	if err := env.Client.Create(ctx, newLimitTier(ns, "free", "", 1)); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, env.Client, ns, "free", v1alpha1.ReasonAccepted, "")
	for _, c := range []*started{a, b} {
		eventually(t, time.Second, func() string {
			if got := c.limitOf("free"); got != 1 {
				return fmt.Sprintf("%s: limit of free = %d, want 1", c.Identity(), got)
			}
			return ""
		})
	}
	var lease coordinationv1.Lease
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: controller.DefaultLeaseName}, &lease); err != nil {
		t.Fatal(err)
	}
	leader, follower := a, b
	if ptrString(lease.Spec.HolderIdentity) == b.Identity() {
		leader, follower = b, a
	}
	if got := ptrString(lease.Spec.HolderIdentity); got != leader.Identity() {
		t.Fatalf("Lease holder = %q, want one of %q, %q", got, a.Identity(), b.Identity())
	}
	// The leader logs its write after the API server has stored it, so the
	// status above can be read before the line is in the leader's log.
	const written = "LimitTier status written"
	eventually(t, time.Second, func() string {
		if !strings.Contains(leader.logs.String(), written) {
			return fmt.Sprintf("the leader %s logged no status write", leader.Identity())
		}
		return ""
	})
	if strings.Contains(follower.logs.String(), written) {
		t.Errorf("the follower %s wrote status:\n%s", follower.Identity(), follower.logs.String())
	}
}

func ptrString(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
