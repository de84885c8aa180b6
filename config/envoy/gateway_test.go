package envoy_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/kubetest"
	"github.com/joishi/limiter/internal/testenv"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The CRDs the manifests are checked against, from the Go modules that
// ship them: the Gateway API's standard channel, and Envoy Gateway's own
// kinds (its module carries the CRDs of its Helm chart).
const (
	gatewayAPIModule    = "sigs.k8s.io/gateway-api"
	gatewayAPIVersion   = "v1.6.3"
	envoyGatewayModule  = "github.com/envoyproxy/gateway"
	envoyGatewayVersion = "v1.9.1"
	envoyGatewayCRDs    = "charts/gateway-helm/charts/crds/crds/generated"
)

// envoyGatewayKinds are the Envoy Gateway CRDs the manifests use.
var envoyGatewayKinds = []string{
	"gateway.envoyproxy.io_envoyextensionpolicies.yaml",
	"gateway.envoyproxy.io_backends.yaml",
	"gateway.envoyproxy.io_envoyproxies.yaml",
	"gateway.envoyproxy.io_clienttrafficpolicies.yaml",
}

// Every object of config/envoy/gateway is accepted by a real
// kube-apiserver with the real CRDs installed (their OpenAPI schemas and
// CEL rules, server-side dry run), and the same objects broken in ways
// the schemas forbid are refused, so the acceptance is a real check.
func TestGatewayManifestsAreAccepted(t *testing.T) {
	gwapi := testenv.ModuleDir(t, gatewayAPIModule, gatewayAPIVersion)
	eg := testenv.ModuleDir(t, envoyGatewayModule, envoyGatewayVersion)
	env := kubetest.Start(t)
	c := env.Client

	var crds []*unstructured.Unstructured
	standard, err := filepath.Glob(filepath.Join(gwapi, "config", "crd", "standard", "*.yaml"))
	if err != nil || len(standard) == 0 {
		t.Fatalf("no Gateway API CRDs in %s (%v)", gwapi, err)
	}
	for _, f := range standard {
		crds = append(crds, ofKind(decodeFile(t, f), "CustomResourceDefinition")...)
	}
	for _, f := range envoyGatewayKinds {
		crds = append(crds, ofKind(decodeFile(t, filepath.Join(eg, envoyGatewayCRDs, f)), "CustomResourceDefinition")...)
	}
	for _, crd := range crds {
		create(t, c, crd, false)
	}
	for _, crd := range crds {
		waitEstablished(t, c, crd.GetName())
	}

	files, err := filepath.Glob(filepath.Join("gateway", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in config/envoy/gateway (%v)", err)
	}
	var objs []*unstructured.Unstructured
	for _, f := range files {
		objs = append(objs, decodeFile(t, f)...)
	}
	kinds := map[string]bool{}
	for _, o := range objs {
		kinds[o.GetKind()] = true
	}
	for _, want := range []string{"EnvoyExtensionPolicy", "HTTPRoute", "Backend", "ReferenceGrant", "Gateway", "EnvoyProxy", "BackendTLSPolicy", "ClientTrafficPolicy"} {
		if !kinds[want] {
			t.Errorf("config/envoy/gateway has no %s", want)
		}
	}
	namespaces := map[string]bool{}
	for _, o := range objs {
		namespaces[o.GetNamespace()] = true
	}
	for ns := range namespaces {
		if err := c.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	for _, o := range objs {
		create(t, c, o, true)
	}

	// What the manifests say, beyond the schemas: the policy targets the
	// chat completions route, sends request and response headers, and
	// waits longer than the limiter takes to decide.
	policy := find(t, objs, "EnvoyExtensionPolicy")
	target, _, _ := unstructured.NestedSlice(policy.Object, "spec", "targetRefs")
	if len(target) != 1 || target[0].(map[string]any)["name"] != "chat-completions" {
		t.Errorf("the EnvoyExtensionPolicy targets %v, want the HTTPRoute chat-completions", target)
	}
	// The chat route holds the route and every spelling of it that Envoy
	// does not normalize (chatroute_test.go).
	chat := find(t, objs, "HTTPRoute")
	rules, _, _ := unstructured.NestedSlice(chat.Object, "spec", "rules")
	var exprs []string
	for _, m := range rules[0].(map[string]any)["matches"].([]any) {
		path := m.(map[string]any)["path"].(map[string]any)
		if chat.GetName() != "chat-completions" || path["type"] != "RegularExpression" {
			t.Fatalf("the first HTTPRoute %s matches %v, want chat-completions matching RegularExpressions", chat.GetName(), path)
		}
		exprs = append(exprs, path["value"].(string))
	}
	checkChatRoute(t, "httproute.yaml", exprs)

	// No rule lets a header name the upstream another path than the one
	// it matched.
	for _, o := range objs {
		if o.GetKind() != "HTTPRoute" {
			continue
		}
		rules, _, _ := unstructured.NestedSlice(o.Object, "spec", "rules")
		for i, r := range rules {
			var removed []string
			filters, _, _ := unstructured.NestedSlice(r.(map[string]any), "filters")
			for _, f := range filters {
				names, _, _ := unstructured.NestedStringSlice(f.(map[string]any), "requestHeaderModifier", "remove")
				removed = append(removed, names...)
			}
			for _, h := range []string{"X-Original-URL", "X-Rewrite-URL", "X-Original-URI"} {
				if !slices.ContainsFunc(removed, func(n string) bool { return strings.EqualFold(n, h) }) {
					t.Errorf("HTTPRoute %s rule %d removes %v: want %s, which names another path to servers that honour it", o.GetName(), i, removed, h)
				}
			}
			if o.GetName() == "chat-completions" {
				continue // the limiter's own headers: its answers set or remove them
			}
			// Where the limiter says nothing, an upstream's copy of its
			// headers does not pass for its word.
			var dropped []string
			for _, f := range filters {
				names, _, _ := unstructured.NestedStringSlice(f.(map[string]any), "responseHeaderModifier", "remove")
				dropped = append(dropped, names...)
			}
			for _, h := range []string{"X-Limiter-Stream-Id", "X-Limiter-Would-Refuse"} {
				if !slices.ContainsFunc(dropped, func(n string) bool { return strings.EqualFold(n, h) }) {
					t.Errorf("HTTPRoute %s rule %d removes %v from responses: want %s, the limiter's word alone", o.GetName(), i, dropped, h)
				}
			}
		}
	}
	proc, _, _ := unstructured.NestedSlice(policy.Object, "spec", "extProc")
	ext := proc[0].(map[string]any)
	if _, ok, _ := unstructured.NestedMap(ext, "processingMode", "request"); !ok {
		t.Error("processingMode.request is absent: Envoy Gateway then sends no request headers, and nothing is limited")
	}
	// A body: pool source reads the whole request body, sent in one
	// message: Buffered, and a client buffer that holds a chat request.
	if body, _, _ := unstructured.NestedString(ext, "processingMode", "request", "body"); body != "Buffered" {
		t.Errorf("processingMode.request.body %q, want Buffered: a body: pool source decides on the whole body", body)
	}
	if lim, _, _ := unstructured.NestedFieldNoCopy(find(t, objs, "ClientTrafficPolicy").Object, "spec", "connection", "bufferLimit"); fmt.Sprint(lim) != "8Mi" {
		t.Errorf("the ClientTrafficPolicy's connection.bufferLimit is %v, want 8Mi (extproc's MaxBodyBytes): Envoy Gateway's 32Ki default refuses a long conversation with 413", lim)
	}
	if d, _ := time.ParseDuration(ext["messageTimeout"].(string)); d < 350*time.Millisecond {
		t.Errorf("messageTimeout %v, want at least redis.timeout + 100ms", ext["messageTimeout"])
	}
	ref := ext["backendRefs"].([]any)[0].(map[string]any)
	if ref["name"] != "limiter-extproc" || fmt.Sprint(ref["port"]) != "9091" {
		t.Errorf("the policy's backendRef %v, want the chart's Service limiter-extproc, port 9091 (extprocService.port)", ref)
	}

	// Broken copies are refused: the schemas are in force.
	for _, tc := range []struct {
		name   string
		kind   string
		mutate func(o *unstructured.Unstructured)
		want   string
	}{
		{"an ext_proc backend of a kind Envoy Gateway refuses", "EnvoyExtensionPolicy", func(o *unstructured.Unstructured) {
			proc, _, _ := unstructured.NestedSlice(o.Object, "spec", "extProc")
			proc[0].(map[string]any)["backendRefs"].([]any)[0].(map[string]any)["kind"] = "Deployment"
			_ = unstructured.SetNestedSlice(o.Object, proc, "spec", "extProc")
		}, "BackendRefs only supports"},
		{"an unknown request body processing mode", "EnvoyExtensionPolicy", func(o *unstructured.Unstructured) {
			proc, _, _ := unstructured.NestedSlice(o.Object, "spec", "extProc")
			proc[0].(map[string]any)["processingMode"].(map[string]any)["request"] = map[string]any{"body": "Buffer"}
			_ = unstructured.SetNestedSlice(o.Object, proc, "spec", "extProc")
		}, "body"},
		{"a client buffer limit that is no quantity", "ClientTrafficPolicy", func(o *unstructured.Unstructured) {
			_ = unstructured.SetNestedField(o.Object, "8 MiB", "spec", "connection", "bufferLimit")
		}, "bufferLimit"},
		{"an unknown body processing mode", "EnvoyExtensionPolicy", func(o *unstructured.Unstructured) {
			proc, _, _ := unstructured.NestedSlice(o.Object, "spec", "extProc")
			proc[0].(map[string]any)["processingMode"].(map[string]any)["response"] = map[string]any{"body": "Sometimes"}
			_ = unstructured.SetNestedSlice(o.Object, proc, "spec", "extProc")
		}, "body"},
		{"an HTTPRoute path match of no known type", "HTTPRoute", func(o *unstructured.Unstructured) {
			rules, _, _ := unstructured.NestedSlice(o.Object, "spec", "rules")
			rules[0].(map[string]any)["matches"].([]any)[0].(map[string]any)["path"].(map[string]any)["type"] = "Glob"
			_ = unstructured.SetNestedSlice(o.Object, rules, "spec", "rules")
		}, "type"},
		{"a Backend hostname that is no DNS name", "Backend", func(o *unstructured.Unstructured) {
			eps, _, _ := unstructured.NestedSlice(o.Object, "spec", "endpoints")
			eps[0].(map[string]any)["fqdn"].(map[string]any)["hostname"] = "vLLM_upstream"
			_ = unstructured.SetNestedSlice(o.Object, eps, "spec", "endpoints")
		}, "hostname"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := find(t, objs, tc.kind).DeepCopy()
			tc.mutate(o)
			err := c.Create(context.Background(), o, client.DryRunAll)
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an Invalid error mentioning %q", err, tc.want)
			}
		})
	}
}

func decodeFile(t *testing.T, path string) []*unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return out
			}
			t.Fatalf("%s: %v", path, err)
		}
		if len(m) == 0 {
			continue
		}
		out = append(out, &unstructured.Unstructured{Object: m})
	}
}

func ofKind(objs []*unstructured.Unstructured, kind string) []*unstructured.Unstructured {
	return slices.DeleteFunc(slices.Clone(objs), func(o *unstructured.Unstructured) bool { return o.GetKind() != kind })
}

func find(t *testing.T, objs []*unstructured.Unstructured, kind string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind {
			return o
		}
	}
	t.Fatalf("no %s", kind)
	return nil
}

func create(t *testing.T, c client.Client, obj *unstructured.Unstructured, dryRun bool) {
	t.Helper()
	var opts []client.CreateOption
	if dryRun {
		opts = append(opts, client.DryRunAll)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Create(ctx, obj.DeepCopy(), opts...); err != nil {
		t.Fatalf("creating %s %s/%s: %v", obj.GetKind(), obj.GetNamespace(), obj.GetName(), err)
	}
}

func waitEstablished(t *testing.T, c client.Client, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		crd := &unstructured.Unstructured{}
		crd.SetAPIVersion("apiextensions.k8s.io/v1")
		crd.SetKind("CustomResourceDefinition")
		if err := c.Get(ctx, client.ObjectKey{Name: name}, crd); err != nil {
			return false, nil
		}
		conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
		for _, cond := range conds {
			if m := cond.(map[string]any); m["type"] == "Established" && m["status"] == "True" {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("CRD %s not established: %v", name, err)
	}
}
