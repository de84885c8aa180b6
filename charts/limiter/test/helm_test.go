// Package chart tests the Helm chart in charts/limiter: lint, rendering,
// the values schema, the pod's security profile, the Role's limits, the
// copies of config/ it carries, and every rendered object applied to a real
// kube-apiserver (envtest).
//
// helm comes from LIMITER_HELM (hack/test.sh sets it from hack/helm.sh),
// else the hack/helm.sh cache, else PATH. Missing, the tests that need it
// fail under LIMITER_TEST_REQUIRE=1 and skip otherwise.
package chart

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/joishi/limiter/internal/testenv"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

const (
	// chartDir is the chart, relative to this package.
	chartDir = ".."
	// repoRoot is the repository, relative to this package.
	repoRoot = "../../.."
	// clusterValues is the cluster-mode values file the chart's CI uses.
	clusterValues = "../ci/cluster-values.yaml"
	// redisValues sets redis.addrs, which the defaults leave empty (and so
	// refuse with the default 3 replicas): values.yaml plus this file are
	// what the tests call the default values.
	redisValues = "testdata/redis-values.yaml"
	// networkPolicyValues narrows every peer and egress, as README.md's
	// example does.
	networkPolicyValues = "testdata/networkpolicy-values.yaml"
	// proxyValues runs the pods in mode proxy, with a JWT.
	proxyValues = "testdata/proxy-values.yaml"
	// extprocValues turns the ext_proc server on.
	extprocValues = "testdata/extproc-values.yaml"
	// poolsValues renders two LimitPools.
	poolsValues = "testdata/pools-values.yaml"
	// helmVersion is the helm hack/helm.sh installs.
	helmVersion = "v3.22.0"
	// release and namespace of every rendering.
	release   = "limiter"
	namespace = "limiter"
)

// helmPath returns the helm binary, or fails (LIMITER_TEST_REQUIRE=1) or
// skips the test when there is none.
func helmPath(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("LIMITER_HELM"); p != "" {
		if _, err := exec.LookPath(p); err != nil {
			needHelm(t, "LIMITER_HELM="+p+" is not an executable")
		}
		return p
	}
	cache := os.Getenv("LIMITER_CACHE")
	if cache == "" {
		if home, err := os.UserHomeDir(); err == nil {
			cache = filepath.Join(home, ".cache", "limiter")
		}
	}
	if cache != "" {
		p := filepath.Join(cache, "bin", "helm-"+helmVersion, "helm")
		if _, err := exec.LookPath(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("helm"); err == nil {
		return p
	}
	needHelm(t, "helm is not installed")
	return ""
}

func needHelm(t testing.TB, what string) {
	t.Helper()
	msg := what + ": run `make test`, which installs it with hack/helm.sh (or export LIMITER_HELM=$(bash hack/helm.sh | tail -1))"
	if testenv.Required() {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// runHelm runs helm with args and returns its stdout, stderr and error.
func runHelm(t testing.TB, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	cmd := exec.Command(helmPath(t), args...)
	// A clean helm home: no repositories, plugins or caches of the user's.
	home := t.TempDir()
	cmd.Env = append(os.Environ(),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
	)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.String(), errOut.String(), err
}

// render runs `helm template` with the values files and extra flags, and
// fails the test if helm does.
func render(t testing.TB, valuesFiles []string, flags ...string) []*unstructured.Unstructured {
	t.Helper()
	out, stderr, err := runHelm(t, templateArgs(valuesFiles, flags...)...)
	if err != nil {
		t.Fatalf("helm template %v %v: %v\n%s", valuesFiles, flags, err, stderr)
	}
	return decode(t, out)
}

func templateArgs(valuesFiles []string, flags ...string) []string {
	args := []string{"template", release, chartDir, "--namespace", namespace, "--include-crds"}
	for _, f := range valuesFiles {
		args = append(args, "--values", f)
	}
	return append(args, flags...)
}

// decode splits a multi-document YAML stream into objects, dropping empty
// documents.
func decode(t testing.TB, manifests string) []*unstructured.Unstructured {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(manifests), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatalf("decoding the rendered manifests: %v\n%s", err, manifests)
		}
		if len(m) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: toInt64(m).(map[string]any)})
	}
}

// find returns the one object of kind (and name, unless ""), or fails.
func find(t testing.TB, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	var found []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind && (name == "" || o.GetName() == name) {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		t.Fatalf("rendered %d objects of kind %s named %q, want 1", len(found), kind, name)
	}
	return found[0]
}

// ofKind returns the objects of kind.
func ofKind(objs []*unstructured.Unstructured, kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

// writeValues writes a values file into a temporary directory.
func writeValues(t testing.TB, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}
