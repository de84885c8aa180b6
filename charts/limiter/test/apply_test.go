package chart

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/testenv"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// Everything the chart renders, with the default values and in cluster mode,
// is accepted by a real kube-apiserver: CRDs first (as helm installs crds/),
// then every object by server-side apply, in a namespace that enforces the
// "restricted" Pod Security Standard. The pod the Deployment would create
// passes the API server's PodSecurity admission, and the LimitTier and
// LimitPool objects pass their CRDs' validation.
func TestAppliedObjectsAreAccepted(t *testing.T) {
	api := sharedAPIServer(t)

	// The Prometheus Operator kinds the optional objects use: minimal CRDs
	// that store anything, enough for the API server to accept them.
	for _, crd := range []*unstructured.Unstructured{
		openCRD("monitoring.coreos.com", "ServiceMonitor", "servicemonitors"),
		openCRD("monitoring.coreos.com", "PrometheusRule", "prometheusrules"),
	} {
		api.apply(t, crd, false)
		api.waitEstablished(t, crd.GetName())
	}

	for _, vs := range []struct {
		name      string
		namespace string
		files     []string
	}{
		{"default values", "limiter", []string{redisValues}},
		{"cluster mode (ci/cluster-values.yaml)", "limiter-cluster", []string{clusterValues}},
		{"restricted egress and custom peers", "limiter-netpol", []string{redisValues, networkPolicyValues}},
		{"proxy mode (testdata/proxy-values.yaml)", "limiter-proxy", []string{redisValues, proxyValues}},
		{"the ext_proc server on", "limiter-extproc", []string{redisValues, extprocValues}},
		{"LimitPools (testdata/pools-values.yaml)", "limiter-pools", []string{redisValues, poolsValues}},
	} {
		t.Run(vs.name, func(t *testing.T) {
			// The optional objects too, where the chart carries their files.
			flags := append([]string{"--namespace", vs.namespace}, observabilityFlags(t)...)
			objs := render(t, vs.files, flags...)
			api.apply(t, restrictedNamespace(vs.namespace), false)

			var crds, rest []*unstructured.Unstructured
			for _, o := range objs {
				if o.GetKind() == "CustomResourceDefinition" {
					crds = append(crds, o)
				} else {
					rest = append(rest, o)
				}
			}
			if len(crds) == 0 {
				t.Fatal("the chart rendered no CRD (crds/ is empty: run hack/sync-chart.sh)")
			}
			for _, crd := range crds {
				api.apply(t, crd, false)
				api.waitEstablished(t, crd.GetName())
			}
			for _, o := range rest {
				api.apply(t, o, false)
			}
			// The NetworkPolicy was among them, so the API server's
			// validation accepted it.
			if n := len(ofKind(rest, "NetworkPolicy")); n != 1 {
				t.Errorf("applied %d NetworkPolicies, want 1", n)
			}

			// The pod the ReplicaSet would create, judged by PodSecurity
			// admission (dry run: nothing is stored).
			dep := find(t, objs, "Deployment", "")
			api.apply(t, podFromTemplate(t, dep), true)
			// The control: the same pod allowed to escalate is refused, so
			// PodSecurity admission is really judging.
			bad := podFromTemplate(t, dep)
			c := container(t, bad.Object["spec"].(map[string]any))
			c["securityContext"].(map[string]any)["allowPrivilegeEscalation"] = true
			if err := api.tryApply(t, bad, true); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "allowPrivilegeEscalation") {
				t.Errorf("a pod allowing privilege escalation: got %v, want Forbidden by PodSecurity", err)
			}
			api.takeWarnings()

			// The LimitTiers were stored with the CRD's defaults applied. None
			// for heartbeatInterval: the limiter defaults it to min(20s,
			// slotTTL/3), as for a static tier.
			for _, lt := range ofKind(objs, "LimitTier") {
				got := api.get(t, lt)
				for field, want := range map[string]any{"failureMode": "Open", "slotTTL": "120s", "heartbeatInterval": nil, "enforce": true} {
					if _, set := lt.Object["spec"].(map[string]any)[field]; set {
						continue
					}
					if v, _, _ := unstructured.NestedFieldNoCopy(got.Object, "spec", field); v != want {
						t.Errorf("LimitTier %s spec.%s: got %v, want the CRD's default %v (<nil>: none)", lt.GetName(), field, v, want)
					}
				}
			}
			// The LimitPools likewise. None for maxConcurrentStreams: absent,
			// keys not listed are not capped.
			for _, lp := range ofKind(objs, "LimitPool") {
				got := api.get(t, lp)
				for field, want := range map[string]any{"failureMode": "Open", "maxWait": "0s", "maxConcurrentStreams": nil, "enforce": true} {
					if _, set := lp.Object["spec"].(map[string]any)[field]; set {
						continue
					}
					if v, _, _ := unstructured.NestedFieldNoCopy(got.Object, "spec", field); v != want {
						t.Errorf("LimitPool %s spec.%s: got %v, want the CRD's default %v (<nil>: none)", lp.GetName(), field, v, want)
					}
				}
			}
		})
	}

	// NetworkPolicy validation is in force too: one the API server
	// forbids is refused (so the rendered ones above passed it).
	t.Run("invalid NetworkPolicy refused", func(t *testing.T) {
		np := find(t, render(t, []string{redisValues}), "NetworkPolicy", "")
		ingress, _, _ := unstructured.NestedSlice(np.Object, "spec", "ingress")
		from := ingress[0].(map[string]any)["from"].([]any)
		ingress[0].(map[string]any)["from"] = append(from, map[string]any{"ipBlock": map[string]any{"cidr": "not-a-cidr"}})
		if err := unstructured.SetNestedSlice(np.Object, ingress, "spec", "ingress"); err != nil {
			t.Fatal(err)
		}
		if err := api.tryApply(t, np, true); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "cidr") {
			t.Errorf("a NetworkPolicy with a bad CIDR: got %v, want an Invalid error naming the cidr", err)
		}
	})

	// The CRD's validation is in force: a LimitTier the schema forbids is
	// refused (so the accepted ones above passed it).
	t.Run("invalid LimitTier refused", func(t *testing.T) {
		for _, tt := range []struct {
			name string
			spec map[string]any
			want string
		}{
			{"negative limit", map[string]any{"maxConcurrentStreams": int64(-1)}, "spec.maxConcurrentStreams"},
			{"limit above 1000", map[string]any{"maxConcurrentStreams": int64(1001)}, "spec.maxConcurrentStreams"},
			{"unknown failure mode", map[string]any{"maxConcurrentStreams": int64(1), "failureMode": "Sometimes"}, "spec.failureMode"},
			{"ttl out of range", map[string]any{"maxConcurrentStreams": int64(1), "slotTTL": "48h"}, "spec.slotTTL"},
		} {
			lt := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "limiter.joishi.dev/v1alpha1",
				"kind":       "LimitTier",
				"metadata":   map[string]any{"name": "bad", "namespace": "limiter"},
				"spec":       tt.spec,
			}}
			err := api.tryApply(t, lt, true)
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("%s: got %v, want an Invalid error naming %s", tt.name, err, tt.want)
			}
		}
	})

	// And a LimitPool the schema forbids is refused too.
	t.Run("invalid LimitPool refused", func(t *testing.T) {
		for _, tt := range []struct {
			name string
			spec map[string]any
			want string
		}{
			{"negative default cap", map[string]any{"maxConcurrentStreams": int64(-1)}, "spec.maxConcurrentStreams"},
			{"a key with a space", map[string]any{"keys": map[string]any{"gpt 4o": int64(1)}}, "spec.keys"},
			{"a cap above 100000", map[string]any{"keys": map[string]any{"gpt-4o": int64(100001)}}, "spec.keys"},
			{"maxWait out of range", map[string]any{"maxWait": "61s"}, "spec.maxWait"},
		} {
			lp := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "limiter.joishi.dev/v1alpha1",
				"kind":       "LimitPool",
				"metadata":   map[string]any{"name": "bad", "namespace": "limiter"},
				"spec":       tt.spec,
			}}
			err := api.tryApply(t, lp, true)
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("%s: got %v, want an Invalid error naming %s", tt.name, err, tt.want)
			}
		}
	})
}

// apiServer is a running envtest kube-apiserver, a dynamic client, and a
// kubeconfig file for helm.
type apiServer struct {
	dyn        dynamic.Interface
	mapper     *restmapper.DeferredDiscoveryRESTMapper
	kubeconfig string

	mu       sync.Mutex
	warnings []string
}

// shared is the one API server of the package's tests, started by the
// first test that needs it and stopped by TestMain.
var shared struct {
	once sync.Once
	env  *envtest.Environment
	dir  string
	api  *apiServer
	err  error
}

// sharedAPIServer returns the package's API server, starting it on first
// use. It fails or skips (as helm and the envtest binaries are missing)
// before starting anything.
func sharedAPIServer(t *testing.T) *apiServer {
	t.Helper()
	assets := testenv.KubebuilderAssets(t)
	helmPath(t)
	shared.once.Do(func() { shared.api, shared.err = startAPIServer(assets) })
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.api
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.env != nil {
		if err := shared.env.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stopping envtest: %v\n", err)
			code = 1
		}
	}
	if shared.dir != "" {
		os.RemoveAll(shared.dir)
	}
	os.Exit(code)
}

func startAPIServer(assets string) (*apiServer, error) {
	env := &envtest.Environment{
		BinaryAssetsDirectory:    assets,
		ControlPlaneStartTimeout: 2 * time.Minute, // two cores, maybe busy
		ControlPlaneStopTimeout:  30 * time.Second,
	}
	cfg, err := env.Start()
	if err != nil {
		_ = env.Stop()
		return nil, fmt.Errorf("starting envtest (KUBEBUILDER_ASSETS=%s): %w", assets, err)
	}
	shared.env = env
	if shared.dir, err = os.MkdirTemp("", "chart-test-"); err != nil {
		return nil, err
	}
	api := &apiServer{kubeconfig: filepath.Join(shared.dir, "kubeconfig")}
	if err := os.WriteFile(api.kubeconfig, env.KubeConfig, 0o600); err != nil {
		return nil, err
	}
	cfg = rest.CopyConfig(cfg)
	// Warnings (PodSecurity "would violate", deprecated APIs) fail the test.
	cfg.WarningHandler = api
	if api.dyn, err = dynamic.NewForConfig(cfg); err != nil {
		return nil, err
	}
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	api.mapper = restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disco))
	return api, nil
}

// HandleWarningHeader records the API server's warnings.
func (a *apiServer) HandleWarningHeader(code int, agent, text string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.warnings = append(a.warnings, text)
}

func (a *apiServer) takeWarnings() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	w := a.warnings
	a.warnings = nil
	return w
}

// apply server-side applies obj and fails the test if the API server
// refuses it or warns.
func (a *apiServer) apply(t *testing.T, obj *unstructured.Unstructured, dryRun bool) {
	t.Helper()
	if err := a.tryApply(t, obj, dryRun); err != nil {
		t.Fatalf("applying %s %s/%s: %v", obj.GetKind(), obj.GetNamespace(), obj.GetName(), err)
	}
	if w := a.takeWarnings(); len(w) > 0 {
		t.Errorf("applying %s %s/%s: the API server warned: %s", obj.GetKind(), obj.GetNamespace(), obj.GetName(), strings.Join(w, "; "))
	}
}

func (a *apiServer) tryApply(t *testing.T, obj *unstructured.Unstructured, dryRun bool) error {
	t.Helper()
	res, err := a.resource(obj)
	if err != nil {
		return err
	}
	opts := metav1.ApplyOptions{FieldManager: "chart-test", Force: true}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = res.Apply(ctx, obj.GetName(), obj, opts)
	return err
}

func (a *apiServer) get(t *testing.T, obj *unstructured.Unstructured) *unstructured.Unstructured {
	t.Helper()
	res, err := a.resource(obj)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, err := res.Get(ctx, obj.GetName(), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("getting %s %s/%s: %v", obj.GetKind(), obj.GetNamespace(), obj.GetName(), err)
	}
	return got
}

// resource returns the dynamic client of obj's kind (in its namespace).
func (a *apiServer) resource(obj *unstructured.Unstructured) (dynamic.ResourceInterface, error) {
	gvk := obj.GroupVersionKind()
	mapping, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if meta.IsNoMatchError(err) {
		a.mapper.Reset() // a CRD applied since the last discovery
		mapping, err = a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	}
	if err != nil {
		return nil, fmt.Errorf("mapping %s: %w", gvk, err)
	}
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		return a.dyn.Resource(mapping.Resource).Namespace(obj.GetNamespace()), nil
	}
	return a.dyn.Resource(mapping.Resource), nil
}

// waitEstablished waits until the CRD named name serves its kind.
func (a *apiServer) waitEstablished(t *testing.T, name string) {
	t.Helper()
	crds := a.dyn.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		crd, err := crds.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
		for _, c := range conds {
			m := c.(map[string]any)
			if m["type"] == "Established" && m["status"] == "True" {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("CRD %s not established: %v", name, err)
	}
	a.mapper.Reset()
}

// restrictedNamespace is a namespace whose pods must meet the "restricted"
// Pod Security Standard (and whose workloads are warned about otherwise).
func restrictedNamespace(name string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1",
		"kind":       "Namespace",
		"metadata": map[string]any{
			"name": name,
			"labels": map[string]any{
				"pod-security.kubernetes.io/enforce": "restricted",
				"pod-security.kubernetes.io/warn":    "restricted",
				"pod-security.kubernetes.io/audit":   "restricted",
			},
		},
	}}
}

// podFromTemplate is the Pod a ReplicaSet of dep would create.
func podFromTemplate(t *testing.T, dep *unstructured.Unstructured) *unstructured.Unstructured {
	t.Helper()
	tmpl, _, _ := unstructured.NestedMap(dep.Object, "spec", "template")
	meta, _ := tmpl["metadata"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
	}
	meta["name"] = dep.GetName() + "-pod"
	meta["namespace"] = dep.GetNamespace()
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1",
		"kind":       "Pod",
		"metadata":   meta,
		"spec":       tmpl["spec"],
	}}
}

// openCRD is a CRD of a namespaced kind that accepts any spec.
func openCRD(group, kind, plural string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1",
		"kind":       "CustomResourceDefinition",
		"metadata":   map[string]any{"name": plural + "." + group},
		"spec": map[string]any{
			"group": group,
			"scope": "Namespaced",
			"names": map[string]any{"kind": kind, "plural": plural, "listKind": kind + "List", "singular": strings.ToLower(kind)},
			"versions": []any{map[string]any{
				"name": "v1", "served": true, "storage": true,
				"schema": map[string]any{"openAPIV3Schema": map[string]any{
					"type":                                 "object",
					"x-kubernetes-preserve-unknown-fields": true,
				}},
			}},
		},
	}}
}
