package controller_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/joishi/limiter/api/v1alpha1"
	"github.com/joishi/limiter/internal/kubetest"
	"github.com/joishi/limiter/pkg/controller"
)

// rbacDir holds the ServiceAccount, Role and RoleBinding replicas run with.
const rbacDir = "../../config/rbac"

// applyRBAC creates the objects config/rbac/kustomization.yaml lists, moved
// to namespace ns (as a kustomize overlay with `namespace: ns` would).
func applyRBAC(t *testing.T, c client.Client, ns string) {
	t.Helper()
	var kustomization struct {
		Resources []string `json:"resources"`
	}
	readYAML(t, filepath.Join(rbacDir, "kustomization.yaml"), &kustomization)
	if len(kustomization.Resources) == 0 {
		t.Fatal("config/rbac/kustomization.yaml lists no resources")
	}
	for _, file := range kustomization.Resources {
		data, err := os.ReadFile(filepath.Join(rbacDir, file))
		if err != nil {
			t.Fatal(err)
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			var obj unstructured.Unstructured
			if err := dec.Decode(&obj.Object); err != nil {
				break
			}
			if len(obj.Object) == 0 {
				continue
			}
			obj.SetNamespace(ns)
			if obj.GetKind() == "RoleBinding" {
				subjects, _, _ := unstructured.NestedSlice(obj.Object, "subjects")
				for _, s := range subjects {
					s.(map[string]any)["namespace"] = ns
				}
				_ = unstructured.SetNestedSlice(obj.Object, subjects, "subjects")
			}
			if err := c.Create(t.Context(), &obj); err != nil {
				t.Fatalf("applying %s %s from %s: %v", obj.GetKind(), obj.GetName(), file, err)
			}
		}
	}
}

func readYAML(t *testing.T, path string, into any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, into); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// asServiceAccount is cfg impersonating the ServiceAccount ns/name, with
// the groups the API server gives service accounts.
func asServiceAccount(cfg *rest.Config, ns, name string) *rest.Config {
	sa := rest.CopyConfig(cfg)
	sa.Impersonate = rest.ImpersonationConfig{
		UserName: fmt.Sprintf("system:serviceaccount:%s:%s", ns, name),
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
	}
	return sa
}

func TestTheRoleIsEnough(t *testing.T) {
	env := kube.Get(t)
	ns, elsewhere := env.Namespace(t), env.Namespace(t)
	ctx := t.Context()
	saConfig := asServiceAccount(env.Config, ns, "limiter")
	sa, err := client.New(saConfig, client.Options{Scheme: kubetest.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	// The control: without the Role, the account may not even list.
	if err := sa.List(ctx, &v1alpha1.LimitTierList{}, client.InNamespace(ns)); !apierrors.IsForbidden(err) {
		t.Fatalf("before config/rbac is applied, listing LimitTiers as the ServiceAccount = %v, want Forbidden (is RBAC enforced?)", err)
	}
	if err := sa.List(ctx, &v1alpha1.LimitPoolList{}, client.InNamespace(ns)); !apierrors.IsForbidden(err) {
		t.Fatalf("before config/rbac is applied, listing LimitPools as the ServiceAccount = %v, want Forbidden (is RBAC enforced?)", err)
	}

	applyRBAC(t, env.Client, ns)
	for _, obj := range []client.Object{
		newLimitTier(ns, "free", "", 1), newLimitTier(ns, "free-too", "free", 2), newLimitTier(elsewhere, "paid", "", 3),
		newLimitPool(ns, "model", "", 2, nil), newLimitPool(ns, "model-too", "model", 4, nil), newLimitPool(elsewhere, "org", "", 5, nil),
	} {
		if err := env.Client.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}

	c := startController(t, saConfig, ns)
	select {
	case <-c.Table.Synced():
	case <-time.After(10 * time.Second):
		t.Fatal("the table did not sync within 10s as the ServiceAccount")
	}
	if got := c.limitOf("free"); got != 1 {
		t.Errorf("limit of free = %d, want 1", got)
	}
	wantStatus(t, env.Client, ns, "free", v1alpha1.ReasonAccepted, "")
	wantStatus(t, env.Client, ns, "free-too", v1alpha1.ReasonConflict, "")
	// LimitPools alike: read, enforced, and their status written.
	if msg := capsOf("model", "any", 2, c)(); msg != "" {
		t.Error(msg)
	}
	wantPoolStatus(t, env.Client, ns, "model", v1alpha1.ReasonAccepted, "")
	wantPoolStatus(t, env.Client, ns, "model-too", v1alpha1.ReasonConflict, "")
	if msg := capsOf("org", "any", -2, c)(); msg != "" {
		t.Errorf("a LimitPool of another namespace: %s", msg)
	}
	var lease coordinationv1.Lease
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: controller.DefaultLeaseName}, &lease); err != nil {
		t.Fatalf("the Lease was not created: %v", err)
	}
	if holder := ptrString(lease.Spec.HolderIdentity); holder != c.Identity() {
		t.Errorf("Lease holder = %q, want %q", holder, c.Identity())
	}

	// And no more than that: nothing in other namespaces, no Secrets.
	denied := []struct {
		what string
		list client.ObjectList
		ns   string
	}{
		{"LimitTiers of another namespace", &v1alpha1.LimitTierList{}, elsewhere},
		{"LimitPools of another namespace", &v1alpha1.LimitPoolList{}, elsewhere},
		{"Secrets of its own namespace", &corev1.SecretList{}, ns},
		{"ConfigMaps of its own namespace", &corev1.ConfigMapList{}, ns},
	}
	for _, d := range denied {
		if err := sa.List(ctx, d.list, client.InNamespace(d.ns)); !apierrors.IsForbidden(err) {
			t.Errorf("listing %s as the ServiceAccount = %v, want Forbidden", d.what, err)
		}
	}

	// Leases: its own only (create cannot be limited by name; get and
	// update can). Another component's Lease in the namespace is out of
	// reach, so the limiter cannot take over or disturb its election.
	other := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "someone-else"}}
	if err := env.Client.Create(ctx, other); err != nil {
		t.Fatal(err)
	}
	if err := sa.Get(ctx, client.ObjectKeyFromObject(other), &coordinationv1.Lease{}); !apierrors.IsForbidden(err) {
		t.Errorf("getting another Lease as the ServiceAccount = %v, want Forbidden", err)
	}
	holder := "intruder"
	other.Spec.HolderIdentity = &holder
	if err := sa.Update(ctx, other); !apierrors.IsForbidden(err) {
		t.Errorf("updating another Lease as the ServiceAccount = %v, want Forbidden", err)
	}
	if err := sa.List(ctx, &coordinationv1.LeaseList{}, client.InNamespace(ns)); !apierrors.IsForbidden(err) {
		t.Errorf("listing Leases as the ServiceAccount = %v, want Forbidden", err)
	}
}
