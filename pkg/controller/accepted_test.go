package controller_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/joishi/limiter/api/v1alpha1"
)

// limitsOf is a check that every replica's table holds plan with limit
// want.
func limitsOf(plan string, want int, replicas ...*started) func() string {
	return func() string {
		for _, r := range replicas {
			if got := r.limitOf(plan); got != want {
				return fmt.Sprintf("%s: limit of %s = %d, want %d", r.Identity(), plan, got, want)
			}
		}
		return ""
	}
}

// The sequence of the trial that found it. With paid in force (max 5) and
// a younger paid-dup claiming the same plan (max 9), an edit that made paid
// invalid handed the plan to paid-dup, and once paid-dup was deleted no
// replica had a paid plan at all. An invalid edit must leave the last
// accepted generation in force instead, on every replica, across restarts,
// and the older object keeps its plan.
func TestAnInvalidEditKeepsTheAcceptedSpecInForce(t *testing.T) {
	env := kube.Get(t)
	ns := env.Namespace(t)
	ctx := t.Context()
	replicas := []*started{startController(t, env.Config, ns), startController(t, env.Config, ns)}

	paid := newLimitTier(ns, "paid", "", 5)
	if err := env.Client.Create(ctx, paid); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, env.Client, ns, "paid", v1alpha1.ReasonAccepted, `plan "paid" is in force: 5 concurrent streams per user`)
	eventually(t, time.Second, limitsOf("paid", 5, replicas...))
	time.Sleep(1100 * time.Millisecond) // creationTimestamp has a one-second resolution
	dup := newLimitTier(ns, "paid-dup", "paid", 9)
	if err := env.Client.Create(ctx, dup); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, env.Client, ns, "paid-dup", v1alpha1.ReasonConflict, `already defined by the older LimitTier "paid"`)

	// kubectl edit: heartbeatInterval 60s, above slotTTL/3 (40s).
	patchSpec(t, env.Client, paid, func(lt *v1alpha1.LimitTier) {
		lt.Spec.HeartbeatInterval = &metav1.Duration{Duration: time.Minute}
	})
	got := wantStatus(t, env.Client, ns, "paid", v1alpha1.ReasonInvalid,
		`generation 2 is invalid: spec.heartbeatInterval must be <= slotTTL/3 (40s), got 1m0s; generation 1 stays in force: plan "paid", 5 concurrent streams per user`)
	if s := got.Status; s.AcceptedGeneration != 1 || s.AcceptedSpec == nil || s.AcceptedSpec.MaxConcurrentStreams != 5 || s.AcceptedSpec.HeartbeatInterval != nil {
		t.Errorf("status.acceptedGeneration = %d, acceptedSpec = %+v; want generation 1, its spec (max 5, no heartbeatInterval)", s.AcceptedGeneration, s.AcceptedSpec)
	}
	consistently(t, time.Second, limitsOf("paid", 5, replicas...))
	wantStatus(t, env.Client, ns, "paid-dup", v1alpha1.ReasonConflict, `already defined by the older LimitTier "paid"`)

	if err := env.Client.Delete(ctx, dup); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, func() string {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(dup), &v1alpha1.LimitTier{}); !apierrors.IsNotFound(err) {
			return fmt.Sprintf("get paid-dup after its deletion = %v, want NotFound", err)
		}
		return ""
	})
	consistently(t, 1500*time.Millisecond, limitsOf("paid", 5, replicas...))

	// Every replica restarts: the one that starts after the edit knows it
	// from the object alone.
	fresh := restartAll(t, env.Config, ns, replicas)
	if msg := limitsOf("paid", 5, fresh)(); msg != "" {
		t.Fatalf("as soon as it synced: %s", msg)
	}
	consistently(t, time.Second, limitsOf("paid", 5, fresh))
	wantStatus(t, env.Client, ns, "paid", v1alpha1.ReasonInvalid, "generation 1 stays in force")

	// Reverting the edit puts the current spec back in force.
	patchSpec(t, env.Client, paid, func(lt *v1alpha1.LimitTier) { lt.Spec.HeartbeatInterval = nil })
	got = wantStatus(t, env.Client, ns, "paid", v1alpha1.ReasonAccepted, `plan "paid" is in force: 5 concurrent streams per user`)
	if got.Status.AcceptedGeneration != 3 {
		t.Errorf("status.acceptedGeneration after the revert = %d, want 3", got.Status.AcceptedGeneration)
	}
	eventually(t, time.Second, limitsOf("paid", 5, fresh))
}

// An invalid spec with no accepted generation before it enforces nothing,
// and says so.
func TestAnInvalidFirstSpecEnforcesNothing(t *testing.T) {
	env := kube.Get(t)
	ns := env.Namespace(t)
	c := startController(t, env.Config, ns)
	short := newLimitTier(ns, "short", "", 2)
	short.Spec.SlotTTL = &metav1.Duration{Duration: 30 * time.Second}
	short.Spec.HeartbeatInterval = &metav1.Duration{Duration: 15 * time.Second}
	if err := env.Client.Create(t.Context(), short); err != nil {
		t.Fatal(err)
	}
	got := wantStatus(t, env.Client, ns, "short", v1alpha1.ReasonInvalid, "no generation of this LimitTier was accepted, so it enforces nothing")
	if got.Status.AcceptedSpec != nil || got.Status.AcceptedGeneration != 0 {
		t.Errorf("status.acceptedSpec, acceptedGeneration = %+v, %d, want none", got.Status.AcceptedSpec, got.Status.AcceptedGeneration)
	}
	consistently(t, 500*time.Millisecond, limitsOf("short", -1, c))
}

// kubectl's TTL, Heartbeat and Wait columns show the durations in one format,
// however the spec writes them.
func TestPrinterColumnsFormatDurationsAlike(t *testing.T) {
	env := kube.Get(t)
	ns := env.Namespace(t)
	startController(t, env.Config, ns)
	// Untyped, so the strings reach the server as kubectl would send them.
	lt := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(),
		"kind":       "LimitTier",
		"metadata":   map[string]any{"name": "team", "namespace": ns},
		"spec":       map[string]any{"maxConcurrentStreams": int64(1), "slotTTL": "3m", "heartbeatInterval": "1m", "maxWait": "1m"},
	}}
	if err := env.Client.Create(t.Context(), lt); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, env.Client, ns, "team", v1alpha1.ReasonAccepted, "")
	got := printedColumns(t, env.Config, ns, "limittiers", "team")
	if got["TTL"] != "180s" || got["Heartbeat"] != "60s" || got["Wait"] != "60s" {
		t.Errorf("TTL, Heartbeat, Wait columns = %q, %q, %q, want 180s, 60s, 60s", got["TTL"], got["Heartbeat"], got["Wait"])
	}
	if got["Plan"] != "team" || got["Max"] != "1" || got["Ready"] != "True" || got["Enforce"] != "true" {
		t.Errorf("columns = %v, want plan team, max 1, ready True, enforce true (the default)", got)
	}
}

// printedColumns returns the cells of the row `kubectl get` prints for the
// object name of resource (server-side printing), by column name; "" for
// an empty cell.
func printedColumns(t *testing.T, cfg *rest.Config, ns, resource, name string) map[string]string {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := cs.CoreV1().RESTClient().Get().
		AbsPath("/apis", v1alpha1.GroupVersion.Group, v1alpha1.GroupVersion.Version, "namespaces", ns, resource, name).
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").
		DoRaw(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var table metav1.Table
	if err := json.Unmarshal(raw, &table); err != nil {
		t.Fatal(err)
	}
	if len(table.Rows) != 1 {
		t.Fatalf("table has %d rows, want 1: %s", len(table.Rows), raw)
	}
	out := map[string]string{}
	for i, col := range table.ColumnDefinitions {
		if i < len(table.Rows[0].Cells) && table.Rows[0].Cells[i] != nil {
			out[col.Name] = strings.TrimSpace(fmt.Sprint(table.Rows[0].Cells[i]))
		}
	}
	return out
}

// busyNamespace fills ns with 30 LimitPools of 1,000 keys each, as large as
// production's, so that each pass of the table and status loops takes a
// while, and returns them once the controller accepted every one.
func busyNamespace(t *testing.T, c client.Client, ns string) []*v1alpha1.LimitPool {
	t.Helper()
	var pools []*v1alpha1.LimitPool
	for i := range 30 {
		keys := make(map[string]int32, 1000)
		for j := range 1000 {
			keys[fmt.Sprintf("meta-llama/Llama-3.1-70B-Instruct-%04d-%s", j, strings.Repeat("x", 60))] = int32(j)
		}
		lp := newLimitPool(ns, fmt.Sprintf("noise-%02d", i), "", 10, keys)
		if err := c.Create(t.Context(), lp); err != nil {
			t.Fatal(err)
		}
		pools = append(pools, lp)
	}
	// Status of objects this large takes a while to write, one by one.
	eventually(t, time.Minute, func() string {
		for _, lp := range pools {
			var got v1alpha1.LimitPool
			if err := c.Get(t.Context(), client.ObjectKeyFromObject(lp), &got); err != nil {
				return err.Error()
			}
			if got.Status.ObservedGeneration != got.Generation {
				return fmt.Sprintf("status of %s not yet written", lp.Name)
			}
		}
		return ""
	})
	for _, lp := range pools {
		wantPoolStatus(t, c, ns, lp.Name, v1alpha1.ReasonAccepted, "")
	}
	return pools
}

// judged waits until the elected replica wrote the status of lt's current
// generation, and returns it.
func judged(t *testing.T, c client.Client, lt *v1alpha1.LimitTier) v1alpha1.LimitTier {
	t.Helper()
	var got v1alpha1.LimitTier
	eventually(t, 20*time.Second, func() string {
		if err := c.Get(t.Context(), client.ObjectKeyFromObject(lt), &got); err != nil {
			return err.Error()
		}
		if got.Status.ObservedGeneration != got.Generation {
			return fmt.Sprintf("status of %s not yet written for generation %d", lt.Name, got.Generation)
		}
		return ""
	})
	return got
}

// An invalid edit right after a valid one (kubectl apply twice, a CI
// pipeline) keeps the valid one in force, and status records it, even
// in a namespace whose passes are slow and while a pass runs (another
// object changed just before): the passes coalesce, and only ever saw the
// invalid generation, so the one before the valid edit came back. The
// same for an object created and made invalid at once: it enforced
// nothing.
func TestBackToBackEditsInABusyNamespaceKeepTheValidOne(t *testing.T) {
	env := kube.Get(t)
	ns := env.Namespace(t)
	ctx := t.Context()
	c := startController(t, env.Config, ns)
	noise := busyNamespace(t, env.Client, ns)
	// A pass starts: another object changes.
	busy := func(n int) {
		t.Helper()
		if err := patchPool(t, env.Client, noise[n%len(noise)], func(lp *v1alpha1.LimitPool) {
			m := int32(n)
			lp.Spec.MaxConcurrentStreams = &m
		}); err != nil {
			t.Fatal(err)
		}
	}
	// heartbeatInterval 60s, above slotTTL/3 (40s).
	invalid := func(lt *v1alpha1.LimitTier) { lt.Spec.HeartbeatInterval = &metav1.Duration{Duration: time.Minute} }

	t.Run("a valid edit, then an invalid one", func(t *testing.T) {
		paid := newLimitTier(ns, "paid", "", 1)
		if err := env.Client.Create(ctx, paid); err != nil {
			t.Fatal(err)
		}
		wantStatus(t, env.Client, ns, "paid", v1alpha1.ReasonAccepted, "")
		for n := 2; n < 7; n++ {
			busy(n)
			patchSpec(t, env.Client, paid, func(lt *v1alpha1.LimitTier) {
				lt.Spec.MaxConcurrentStreams = int32(n)
				lt.Spec.HeartbeatInterval = nil
			})
			valid := paid.Generation
			patchSpec(t, env.Client, paid, invalid)
			got := judged(t, env.Client, paid)
			if s := got.Status; s.AcceptedGeneration != valid || s.AcceptedSpec == nil || s.AcceptedSpec.MaxConcurrentStreams != int32(n) ||
				!strings.Contains(s.Conditions[0].Message, fmt.Sprintf("generation %d stays in force", valid)) {
				t.Errorf("limit %d: status.acceptedGeneration %d, acceptedSpec %+v, %q; want generation %d, the valid edit, in force",
					n, s.AcceptedGeneration, s.AcceptedSpec, s.Conditions[0].Message, valid)
			}
			eventually(t, 2*time.Second, limitsOf("paid", n, c))
		}
	})

	t.Run("a create, then an invalid edit", func(t *testing.T) {
		for n := 2; n < 7; n++ {
			busy(n)
			lt := newLimitTier(ns, fmt.Sprintf("team-%d", n), "", int32(n))
			if err := env.Client.Create(ctx, lt); err != nil {
				t.Fatal(err)
			}
			patchSpec(t, env.Client, lt, invalid)
			got := judged(t, env.Client, lt)
			if s := got.Status; s.AcceptedGeneration != 1 || s.AcceptedSpec == nil ||
				!strings.Contains(s.Conditions[0].Message, "generation 1 stays in force") {
				t.Errorf("%s: status.acceptedGeneration %d, acceptedSpec %+v, %q; want generation 1, as created, in force",
					lt.Name, s.AcceptedGeneration, s.AcceptedSpec, s.Conditions[0].Message)
			}
			eventually(t, 2*time.Second, limitsOf(lt.Name, n, c))
		}
	})
}
