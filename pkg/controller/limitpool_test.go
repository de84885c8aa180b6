package controller_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/joishi/limiter/api/v1alpha1"
	"github.com/joishi/limiter/pkg/controller"
)

func newLimitPool(ns, name, pool string, def int32, keys map[string]int32) *v1alpha1.LimitPool {
	return &v1alpha1.LimitPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       v1alpha1.LimitPoolSpec{Pool: pool, MaxConcurrentStreams: &def, Keys: keys},
	}
}

// patchPool applies mutate to lp with a merge patch, as patchSpec does.
func patchPool(t *testing.T, c client.Client, lp *v1alpha1.LimitPool, mutate func(*v1alpha1.LimitPool)) error {
	t.Helper()
	base := lp.DeepCopy()
	mutate(lp)
	return c.Patch(t.Context(), lp, client.MergeFrom(base))
}

// wantPoolStatus waits until the LimitPool name's status says reason (with
// a message containing msg) for its current generation.
func wantPoolStatus(t *testing.T, c client.Client, ns, name, reason, msg string) v1alpha1.LimitPool {
	t.Helper()
	return *waitStatus(t, c, ns, name, reason, msg, func(lp *v1alpha1.LimitPool) (int64, []metav1.Condition) {
		return lp.Status.ObservedGeneration, lp.Status.Conditions
	})
}

// capsOf is a check that every replica's pool table caps key of pool at
// want (-1: the key is not capped; -2: the table has no such pool).
func capsOf(pool, key string, want int, replicas ...*started) func() string {
	return func() string {
		for _, r := range replicas {
			got := -2
			if p, ok := r.Pools.Lookup(pool); ok {
				got = -1
				if limit, capped := p.Limit(key); capped {
					got = limit
				}
			}
			if got != want {
				return fmt.Sprintf("%s: cap of %s=%s = %d, want %d (-1: not capped, -2: no pool)", r.Identity(), pool, key, got, want)
			}
		}
		return ""
	}
}

func TestPoolTableFollowsCreateUpdateDelete(t *testing.T) {
	env := kube.Get(t)
	ns := env.Namespace(t)
	ctx := t.Context()
	c := startController(t, env.Config, ns)
	<-c.Table.Synced()

	model := newLimitPool(ns, "model", "", 100, map[string]int32{"gpt-4o": 500, "llama-70b": 64})
	if err := env.Client.Create(ctx, model); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Second, capsOf("model", "gpt-4o", 500, c))
	for key, want := range map[string]int{"llama-70b": 64, "mistral-7b": 100} {
		if msg := capsOf("model", key, want, c)(); msg != "" {
			t.Error(msg)
		}
	}
	pool, _ := c.Pools.Lookup("model")
	if pool.FailureMode != "Open" || pool.MaxWait != 0 {
		t.Errorf("pool = %+v, want the CRD defaults Open, 0s", pool)
	}
	got := wantPoolStatus(t, env.Client, ns, "model", v1alpha1.ReasonAccepted,
		`pool "model" is in force: 100 concurrent streams per key, 2 keys with a cap of their own`)
	if s := got.Status; s.Pool != "model" || s.KeyCount != 2 || s.AcceptedGeneration != 1 || s.AcceptedSpec == nil {
		t.Errorf("status = %+v, want pool model, 2 keys, generation 1 accepted", s)
	}

	// No default cap: keys not listed are not capped.
	if err := patchPool(t, env.Client, model, func(lp *v1alpha1.LimitPool) {
		lp.Spec.MaxConcurrentStreams = nil
		lp.Spec.Keys = map[string]int32{"gpt-4o": 1}
	}); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Second, capsOf("model", "gpt-4o", 1, c))
	eventually(t, time.Second, capsOf("model", "mistral-7b", -1, c))
	eventually(t, time.Second, capsOf("model", "llama-70b", -1, c))
	wantPoolStatus(t, env.Client, ns, "model", v1alpha1.ReasonAccepted, `keys not listed are not capped, 1 key with a cap of its own`)

	if err := env.Client.Delete(ctx, model); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Second, capsOf("model", "gpt-4o", -2, c))
}

func TestPoolConflicts(t *testing.T) {
	env := kube.Get(t)
	ns := env.Namespace(t)
	ctx := t.Context()
	c := startController(t, env.Config, ns)

	older := newLimitPool(ns, "model", "", 3, nil)
	if err := env.Client.Create(ctx, older); err != nil {
		t.Fatal(err)
	}
	// creationTimestamp has a one-second resolution: make the age plain.
	time.Sleep(1100 * time.Millisecond)
	newer := newLimitPool(ns, "model-v2", "model", 5, nil)
	if err := env.Client.Create(ctx, newer); err != nil {
		t.Fatal(err)
	}
	wantPoolStatus(t, env.Client, ns, "model", v1alpha1.ReasonAccepted, `pool "model" is in force`)
	got := wantPoolStatus(t, env.Client, ns, "model-v2", v1alpha1.ReasonConflict, `pool "model" is already defined by the older LimitPool "model"`)
	if got.Status.Pool != "model" {
		t.Errorf("status.pool of model-v2 = %q, want model", got.Status.Pool)
	}
	consistently(t, 500*time.Millisecond, capsOf("model", "any", 3, c))

	// A LimitTier may have the same name: plans and pools are apart.
	if err := env.Client.Create(ctx, newLimitTier(ns, "model", "", 1)); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, env.Client, ns, "model", v1alpha1.ReasonAccepted, `plan "model" is in force`)

	if err := env.Client.Delete(ctx, older); err != nil {
		t.Fatal(err)
	}
	wantPoolStatus(t, env.Client, ns, "model-v2", v1alpha1.ReasonAccepted, `pool "model" is in force: 5 concurrent streams per key`)
	eventually(t, time.Second, capsOf("model", "any", 5, c))
}

// A LimitPool being deleted (a finalizer of another tool holds it) is out
// of force at once, and a younger LimitPool of the same pool takes the
// pool over. Its Ready condition said True "is in force" until it was
// gone: two objects of one pool both Accepted.
func TestAPoolBeingDeletedSaysItIsOutOfForce(t *testing.T) {
	env := kube.Get(t)
	ns := env.Namespace(t)
	ctx := t.Context()
	c := startController(t, env.Config, ns)

	older := newLimitPool(ns, "model", "", 3, nil)
	older.Finalizers = []string{"example.com/hold"}
	if err := env.Client.Create(ctx, older); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // lets the API server delete it
		patch := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`))
		if err := env.Client.Patch(context.Background(), older, patch); err != nil && !apierrors.IsNotFound(err) {
			t.Error(err)
		}
	})
	time.Sleep(1100 * time.Millisecond) // creationTimestamp has a one-second resolution
	newer := newLimitPool(ns, "model-v2", "model", 5, nil)
	if err := env.Client.Create(ctx, newer); err != nil {
		t.Fatal(err)
	}
	wantPoolStatus(t, env.Client, ns, "model", v1alpha1.ReasonAccepted, `pool "model" is in force`)
	wantPoolStatus(t, env.Client, ns, "model-v2", v1alpha1.ReasonConflict, "")

	if err := env.Client.Delete(ctx, older); err != nil {
		t.Fatal(err)
	}
	wantPoolStatus(t, env.Client, ns, "model-v2", v1alpha1.ReasonAccepted, `pool "model" is in force: 5 concurrent streams per key`)
	eventually(t, time.Second, capsOf("model", "any", 5, c))
	got := wantPoolStatus(t, env.Client, ns, "model", v1alpha1.ReasonDeleting,
		`being deleted: this LimitPool is out of force, and pool "model" is left to any other LimitPool that defines it`)
	if got.DeletionTimestamp == nil {
		t.Fatal("model has no deletionTimestamp")
	}
	if s := got.Status; s.AcceptedGeneration != 1 || s.AcceptedSpec == nil || *s.AcceptedSpec.MaxConcurrentStreams != 3 {
		t.Errorf("status.acceptedGeneration %d, acceptedSpec %+v; want generation 1 as recorded, max 3", s.AcceptedGeneration, s.AcceptedSpec)
	}
	columns := printedColumns(t, env.Config, ns, "limitpools", "model")
	if columns["Ready"] != "False" || columns["Reason"] != v1alpha1.ReasonDeleting || columns["Pool"] != "model" {
		t.Errorf("columns = %v, want pool model, ready False, reason Deleting", columns)
	}
}

// An edit the API server refuses changes nothing; one it takes but the
// limiter finds invalid (here: spec.pool removed, so the pool would be a
// metadata.name too long for a pool) leaves the last accepted generation
// in force, on every replica and across restarts, and the object keeps its
// pool against a younger claim, as for LimitTiers.
func TestAnInvalidPoolEditKeepsTheAcceptedSpecInForce(t *testing.T) {
	env := kube.Get(t)
	ns := env.Namespace(t)
	ctx := t.Context()
	replicas := []*started{startController(t, env.Config, ns), startController(t, env.Config, ns)}

	long := strings.Repeat("m", 64) // a valid object name, too long for a pool
	model := newLimitPool(ns, long, "model", 100, map[string]int32{"gpt-4o": 5})
	if err := env.Client.Create(ctx, model); err != nil {
		t.Fatal(err)
	}
	wantPoolStatus(t, env.Client, ns, long, v1alpha1.ReasonAccepted, `pool "model" is in force`)
	eventually(t, time.Second, capsOf("model", "gpt-4o", 5, replicas...))
	time.Sleep(1100 * time.Millisecond) // creationTimestamp has a one-second resolution
	dup := newLimitPool(ns, "model-dup", "model", 9, nil)
	if err := env.Client.Create(ctx, dup); err != nil {
		t.Fatal(err)
	}
	wantPoolStatus(t, env.Client, ns, "model-dup", v1alpha1.ReasonConflict, fmt.Sprintf(`already defined by the older LimitPool %q`, long))

	t.Run("the API server refuses a key with a space", func(t *testing.T) {
		err := patchPool(t, env.Client, model.DeepCopy(), func(lp *v1alpha1.LimitPool) { lp.Spec.Keys["gpt 4o"] = 1 })
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "each key must be 1-128 bytes") {
			t.Fatalf("patch with the key \"gpt 4o\" = %v, want Invalid naming the keys' rule", err)
		}
		var stored v1alpha1.LimitPool
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(model), &stored); err != nil {
			t.Fatal(err)
		}
		if stored.Generation != 1 {
			t.Errorf("generation = %d after a refused patch, want 1", stored.Generation)
		}
	})

	// kubectl edit: spec.pool removed. The schema takes it; the pool would
	// be metadata.name, 64 characters.
	if err := patchPool(t, env.Client, model, func(lp *v1alpha1.LimitPool) { lp.Spec.Pool = "" }); err != nil {
		t.Fatal(err)
	}
	got := wantPoolStatus(t, env.Client, ns, long, v1alpha1.ReasonInvalid,
		`generation 2 is invalid: metadata.name must be 1-63 characters of [a-z0-9._-], starting with a letter or digit, got "`+long+`"; `+
			`generation 1 stays in force: pool "model", 100 concurrent streams per key, 1 key with a cap of its own`)
	if s := got.Status; s.AcceptedGeneration != 1 || s.AcceptedSpec == nil || s.AcceptedSpec.Pool != "model" || s.AcceptedSpec.Keys["gpt-4o"] != 5 || s.Pool != "model" {
		t.Errorf("status.acceptedGeneration = %d, acceptedSpec = %+v, pool %q; want generation 1, its spec (pool model, gpt-4o: 5), pool model", s.AcceptedGeneration, s.AcceptedSpec, s.Pool)
	}
	consistently(t, time.Second, capsOf("model", "gpt-4o", 5, replicas...))
	wantPoolStatus(t, env.Client, ns, "model-dup", v1alpha1.ReasonConflict, fmt.Sprintf(`already defined by the older LimitPool %q`, long))

	// Every replica restarts: the one that starts after the edit knows it
	// from the object alone.
	fresh := restartAll(t, env.Config, ns, replicas)
	if msg := capsOf("model", "gpt-4o", 5, fresh)(); msg != "" {
		t.Fatalf("as soon as it synced: %s", msg)
	}
	consistently(t, time.Second, capsOf("model", "gpt-4o", 5, fresh))

	// Putting spec.pool back puts the current spec in force.
	if err := patchPool(t, env.Client, model, func(lp *v1alpha1.LimitPool) { lp.Spec.Pool = "model" }); err != nil {
		t.Fatal(err)
	}
	got = wantPoolStatus(t, env.Client, ns, long, v1alpha1.ReasonAccepted, `pool "model" is in force`)
	if got.Status.AcceptedGeneration != 3 {
		t.Errorf("status.acceptedGeneration after the revert = %d, want 3", got.Status.AcceptedGeneration)
	}
}

// kubectl get lp shows the pool, its default cap and how many keys have a
// cap of their own.
func TestPoolPrinterColumns(t *testing.T) {
	env := kube.Get(t)
	ns := env.Namespace(t)
	startController(t, env.Config, ns)
	model := newLimitPool(ns, "models", "model", 100, map[string]int32{"gpt-4o": 500, "llama-70b": 64})
	model.Spec.MaxWait = &metav1.Duration{Duration: time.Minute}
	org := &v1alpha1.LimitPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "org"}}
	for _, lp := range []*v1alpha1.LimitPool{model, org} {
		if err := env.Client.Create(t.Context(), lp); err != nil {
			t.Fatal(err)
		}
		wantPoolStatus(t, env.Client, ns, lp.Name, v1alpha1.ReasonAccepted, "")
	}
	cases := []struct {
		name string
		want map[string]string
	}{
		{"models", map[string]string{"Pool": "model", "Default": "100", "Keys": "2", "Ready": "True", "Failure": "Open", "Wait": "60s", "Reason": "Accepted", "Enforce": "true"}},
		// No default cap: the column is empty.
		{"org", map[string]string{"Pool": "org", "Default": "", "Keys": "0", "Ready": "True", "Wait": "0s"}},
	}
	for _, tc := range cases {
		got := printedColumns(t, env.Config, ns, "limitpools", tc.name)
		for column, want := range tc.want {
			if got[column] != want {
				t.Errorf("%s: column %s = %q, want %q (all: %v)", tc.name, column, got[column], want, got)
			}
		}
	}
}

// Without a pool table (Options.Pools nil) the controller serves
// LimitTiers alone: a LimitPool gets no status from it.
func TestPoolsAreNotWatchedWithoutAPoolTable(t *testing.T) {
	env := kube.Get(t)
	ns := env.Namespace(t)
	ctx := t.Context()
	c := startWithPools(t, env.Config, ns, nil)
	if err := env.Client.Create(ctx, newLimitPool(ns, "model", "", 1, nil)); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(ctx, newLimitTier(ns, "free", "", 1)); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, env.Client, ns, "free", v1alpha1.ReasonAccepted, "")
	if got := c.limitOf("free"); got != 1 {
		t.Errorf("limit of free = %d, want 1", got)
	}
	consistently(t, 500*time.Millisecond, func() string {
		var lp v1alpha1.LimitPool
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "model"}, &lp); err != nil {
			return err.Error()
		}
		if len(lp.Status.Conditions) != 0 || lp.Status.ObservedGeneration != 0 {
			return fmt.Sprintf("the LimitPool got a status: %+v", lp.Status)
		}
		return ""
	})
}

// TestAnInvalidEditAfterAValidOneKeepsTheValidOne: the last valid spec is
// the one in force while the current one is invalid, even when no status
// recorded it yet: here no replica holds the Lease (another holder keeps
// it, as a crashed one does for its term), so no status is written
// between a valid edit and an invalid one. Generation 1 must not come
// back; when a replica is elected, it records generation 2 as accepted.
func TestAnInvalidEditAfterAValidOneKeepsTheValidOne(t *testing.T) {
	env := kube.Get(t)
	ns := env.Namespace(t)
	ctx := t.Context()

	first := startController(t, env.Config, ns)
	name := strings.Repeat("m", 64) // a name, too long for a pool's
	lp := newLimitPool(ns, name, "model", 100, map[string]int32{"gpt-4o": 5})
	if err := env.Client.Create(ctx, lp); err != nil {
		t.Fatal(err)
	}
	wantPoolStatus(t, env.Client, ns, name, v1alpha1.ReasonAccepted, `pool "model" is in force`)
	first.Stop() // gives the Lease up

	kc := kubernetes.NewForConfigOrDie(env.Config)
	lease, err := kc.CoordinationV1().Leases(ns).Get(ctx, controller.DefaultLeaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	now, holder, term := metav1.NewMicroTime(time.Now()), "elsewhere", int32(3600)
	lease.Spec = coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &term, AcquireTime: &now, RenewTime: &now}
	if _, err := kc.CoordinationV1().Leases(ns).Update(ctx, lease, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	r := startController(t, env.Config, ns)
	eventually(t, 5*time.Second, capsOf("model", "gpt-4o", 5, r))
	if err := patchPool(t, env.Client, lp, func(lp *v1alpha1.LimitPool) { lp.Spec.Keys["gpt-4o"] = 7 }); err != nil { // generation 2
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, capsOf("model", "gpt-4o", 7, r))
	if err := patchPool(t, env.Client, lp, func(lp *v1alpha1.LimitPool) { lp.Spec.Pool = "" }); err != nil { // 3: the name is no pool's
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // for the watch to deliver it, and the table to follow
	if msg := capsOf("model", "gpt-4o", 7, r)(); msg != "" {
		t.Errorf("after the invalid generation 3: %s (generation 2, the last valid, caps it at 7)", msg)
	}

	if err := kc.CoordinationV1().Leases(ns).Delete(ctx, controller.DefaultLeaseName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var got v1alpha1.LimitPool
	eventually(t, 15*time.Second, func() string {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(lp), &got); err != nil {
			return err.Error()
		}
		if got.Status.ObservedGeneration != 3 {
			return "no status written for generation 3 yet"
		}
		return ""
	})
	if got.Status.AcceptedGeneration != 2 || got.Status.AcceptedSpec == nil || got.Status.AcceptedSpec.Keys["gpt-4o"] != 7 ||
		!strings.Contains(got.Status.Conditions[0].Message, "generation 2 stays in force") {
		t.Errorf("status: acceptedGeneration %d, acceptedSpec %+v, %q; want generation 2, gpt-4o: 7, in force", got.Status.AcceptedGeneration, got.Status.AcceptedSpec, got.Status.Conditions[0].Message)
	}
	if msg := capsOf("model", "gpt-4o", 7, r)(); msg != "" {
		t.Errorf("once status is written: %s", msg)
	}
}
