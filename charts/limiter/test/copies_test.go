package chart

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The chart carries copies of files whose one source is config/ (generated
// by hack/codegen.sh, or the observability files). hack/sync-chart.sh makes
// them; this is make test's drift check.
func TestCopiesMatchConfig(t *testing.T) {
	tests := []struct {
		name     string
		src, dst string
		patterns []string
		required bool
	}{
		{"LimitTier CRD", "config/crd/bases", "charts/limiter/crds", []string{"*.yaml"}, true},
		{"Role", "config/rbac", "charts/limiter/files/rbac", []string{"role.yaml"}, true},
		{"dashboard and alert rules", "config/observability", "charts/limiter/files/observability", []string{"*.json", "*.yaml", "*.yml"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := listFiles(t, filepath.Join(repoRoot, tt.src), tt.patterns)
			dst := listFiles(t, filepath.Join(repoRoot, tt.dst), tt.patterns)
			if tt.required && len(src) == 0 {
				t.Fatalf("%s holds no %v: run `make generate`", tt.src, tt.patterns)
			}
			if !slices.Equal(src, dst) {
				t.Fatalf("%s holds %v, %s holds %v: run hack/sync-chart.sh", tt.src, src, tt.dst, dst)
			}
			for _, name := range src {
				want := readFile(t, filepath.Join(repoRoot, tt.src, name))
				got := readFile(t, filepath.Join(repoRoot, tt.dst, name))
				if !bytes.Equal(got, want) {
					t.Errorf("%s/%s differs from %s/%s: run hack/sync-chart.sh", tt.dst, name, tt.src, name)
				}
			}
		})
	}
}

// The rendered Role grants exactly config/rbac/role.yaml's rules, and the
// rendered CRD is config/crd/bases' CRD.
func TestRenderedRBACAndCRDMatchConfig(t *testing.T) {
	objs := render(t, nil)

	var role map[string]any
	readYAML(t, filepath.Join(repoRoot, "config/rbac/role.yaml"), &role)
	got, _, _ := unstructured.NestedSlice(find(t, objs, "Role", "").Object, "rules")
	if want := toInt64(role["rules"]); !reflect.DeepEqual(got, want) {
		t.Errorf("Role rules:\n got %v\nwant %v (config/rbac/role.yaml)", got, want)
	}

	crds := ofKind(objs, "CustomResourceDefinition")
	files := listFiles(t, filepath.Join(repoRoot, "config/crd/bases"), []string{"*.yaml"})
	if len(crds) != len(files) {
		t.Fatalf("rendered %d CRDs, config/crd/bases holds %d", len(crds), len(files))
	}
	for _, name := range files {
		var want map[string]any
		readYAML(t, filepath.Join(repoRoot, "config/crd/bases", name), &want)
		want = toInt64(want).(map[string]any)
		found := false
		for _, crd := range crds {
			if crd.GetName() == (&unstructured.Unstructured{Object: want}).GetName() {
				found = true
				if !reflect.DeepEqual(crd.Object, want) {
					t.Errorf("rendered CRD %s differs from config/crd/bases/%s", crd.GetName(), name)
				}
			}
		}
		if !found {
			t.Errorf("config/crd/bases/%s is not rendered", name)
		}
	}
}

// listFiles returns the sorted base names of dir's files matching any of
// patterns; none if dir does not exist.
func listFiles(t testing.TB, dir string, patterns []string) []string {
	t.Helper()
	var out []string
	for _, p := range patterns {
		matches, err := filepath.Glob(filepath.Join(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range matches {
			if fi, err := os.Stat(m); err == nil && fi.Mode().IsRegular() {
				out = append(out, filepath.Base(m))
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func readFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
