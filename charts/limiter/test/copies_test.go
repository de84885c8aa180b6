package chart

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"github.com/joishi/limiter/internal/testenv"
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
	objs := render(t, []string{redisValues})

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

// `make generate` (hack/codegen.sh) refreshes the chart's copies itself:
// run on a scratch copy of the sources whose chart copies are stale, it
// leaves them equal to config/ again.
func TestGenerateRefreshesChartCopies(t *testing.T) {
	if testing.Short() && !testenv.Required() {
		t.Skip("runs controller-gen")
	}
	scratch := t.TempDir()
	for _, path := range []string{"go.mod", "go.sum", "api", "pkg", "hack", "config", "charts/limiter/crds", "charts/limiter/files"} {
		copyTree(t, filepath.Join(repoRoot, path), filepath.Join(scratch, path))
	}
	stale := []string{"charts/limiter/crds/limiter.joishi.dev_limittiers.yaml", "charts/limiter/files/rbac/role.yaml"}
	for _, path := range stale {
		if err := os.WriteFile(filepath.Join(scratch, path), []byte("# stale\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("bash", filepath.Join(scratch, "hack", "codegen.sh"), scratch)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("hack/codegen.sh: %v\n%s", err, out)
	}
	for _, path := range stale {
		got := readFile(t, filepath.Join(scratch, path))
		if bytes.Equal(got, []byte("# stale\n")) {
			t.Errorf("%s is still stale after hack/codegen.sh: it does not run hack/sync-chart.sh", path)
		}
	}
	out, err := exec.Command("bash", filepath.Join(scratch, "hack", "sync-chart.sh"), "--check").CombinedOutput()
	if err != nil {
		t.Errorf("after hack/codegen.sh, hack/sync-chart.sh --check: %v\n%s", err, out)
	}
}

// copyTree copies the file or directory src to dst.
func copyTree(t testing.TB, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		return os.WriteFile(target, data, 0o644)
	})
	if err != nil {
		t.Fatalf("copying %s: %v", src, err)
	}
}
