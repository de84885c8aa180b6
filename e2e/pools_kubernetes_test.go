package e2e

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/joishi/limiter/api/v1alpha1"
	"github.com/joishi/limiter/internal/kubetest"
	"github.com/joishi/limiter/internal/testenv"
)

// TestKubernetesPools runs `limiter serve` with tiers.source kubernetes
// against a real API server (envtest): a LimitPool created there caps the
// streams of every user joining its keys, and its edits and deletion reach
// serve too.
func TestKubernetesPools(t *testing.T) {
	t.Parallel()
	k := &kubeTiers{kube: kubetest.Start(t), redis: testenv.Redis(t)}
	ns := k.kube.Namespace(t)
	ctx := t.Context()
	p := k.serve(t, ns, k.kube.Kubeconfig, false)

	free := &v1alpha1.LimitTier{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "free"}, Spec: v1alpha1.LimitTierSpec{MaxConcurrentStreams: 5}}
	if err := k.kube.Client.Create(ctx, free); err != nil {
		t.Fatal(err)
	}
	waitReady(t, k.kube.Client, ns, "free", 1, "")
	// The control: before the LimitPool, the pool is unknown.
	if status, code := acquireStatus(t, p, "u0-"+ns, map[string]string{"model": "x"}); status != http.StatusUnprocessableEntity || code != "unknown_pool" {
		t.Fatalf("acquire joining a pool no LimitPool defines = %d %s, want 422 unknown_pool", status, code)
	}

	one := int32(1)
	model := &v1alpha1.LimitPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "model"},
		Spec:       v1alpha1.LimitPoolSpec{MaxConcurrentStreams: &one},
	}
	if err := k.kube.Client.Create(ctx, model); err != nil {
		t.Fatal(err)
	}
	withinASecond(t, "create", func() string {
		if status, code := acquireStatus(t, p, "u1-"+ns, map[string]string{"model": "x"}); status != http.StatusOK {
			return fmt.Sprintf("first acquire joining model=x = %d %s, want 200", status, code)
		}
		return ""
	}, func() {
		// Another user: the pool's cap, not the user's, refuses.
		if status, code := acquireStatus(t, p, "u2-"+ns, map[string]string{"model": "x"}); status != http.StatusTooManyRequests || code != "pool_limit_reached" {
			t.Errorf("second acquire joining model=x = %d %s, want 429 pool_limit_reached", status, code)
		}
		// Another key of the pool has a cap of its own.
		if status, code := acquireStatus(t, p, "u2-"+ns, map[string]string{"model": "y"}); status != http.StatusOK {
			t.Errorf("acquire joining model=y = %d %s, want 200", status, code)
		}
	})
	waitPoolReady(t, k.kube.Client, ns, "model", 1)

	// x gets a cap of its own.
	base := model.DeepCopy()
	model.Spec.Keys = map[string]int32{"x": 2}
	if err := k.kube.Client.Patch(ctx, model, client.MergeFrom(base)); err != nil {
		t.Fatal(err)
	}
	withinASecond(t, "update", func() string {
		if status, code := acquireStatus(t, p, "u3-"+ns, map[string]string{"model": "x"}); status != http.StatusOK {
			return fmt.Sprintf("acquire joining model=x with x capped at 2 = %d %s, want 200", status, code)
		}
		return ""
	}, func() {
		if status, code := acquireStatus(t, p, "u4-"+ns, map[string]string{"model": "x"}); status != http.StatusTooManyRequests || code != "pool_limit_reached" {
			t.Errorf("third acquire joining model=x = %d %s, want 429 pool_limit_reached", status, code)
		}
	})
	waitPoolReady(t, k.kube.Client, ns, "model", 2)

	if err := k.kube.Client.Delete(ctx, model); err != nil {
		t.Fatal(err)
	}
	withinASecond(t, "delete", func() string {
		if status, code := acquireStatus(t, p, "u5-"+ns, map[string]string{"model": "x"}); status != http.StatusUnprocessableEntity || code != "unknown_pool" {
			return fmt.Sprintf("acquire joining a deleted pool = %d %s, want 422 unknown_pool", status, code)
		}
		return ""
	}, nil)
}

// waitPoolReady waits until the LimitPool name is Ready=True for
// generation, as the leader writes it.
func waitPoolReady(t *testing.T, c client.Client, ns, name string, generation int64) {
	t.Helper()
	deadline := time.Now().Add(testLease + 15*time.Second)
	var last string
	for time.Now().Before(deadline) {
		var lp v1alpha1.LimitPool
		if err := c.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, &lp); err != nil {
			t.Fatal(err)
		}
		cond := meta.FindStatusCondition(lp.Status.Conditions, v1alpha1.ConditionReady)
		if cond != nil && cond.Status == metav1.ConditionTrue && cond.ObservedGeneration == generation && lp.Status.ObservedGeneration == generation {
			return
		}
		last = fmt.Sprintf("generation %d, status %+v", lp.Generation, lp.Status)
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s: not Ready=True for generation %d; last seen: %s", name, generation, last)
}
