package chart

import (
	"path/filepath"
	"regexp"
	"testing"
)

// The image the chart runs is built by the Dockerfile with exactly the Go
// of go.mod's go line: an older builder refuses the module (or fetches a
// toolchain mid-build), a floating tag builds differently from day to day.
func TestDockerfileBuilderMatchesGoMod(t *testing.T) {
	goMod := readFile(t, filepath.Join(repoRoot, "go.mod"))
	m := regexp.MustCompile(`(?m)^go ([0-9][^\s]*)\s*$`).FindSubmatch(goMod)
	if m == nil {
		t.Fatal("go.mod has no go line")
	}
	want := string(m[1])

	dockerfile := readFile(t, filepath.Join(repoRoot, "Dockerfile"))
	froms := regexp.MustCompile(`(?m)^FROM\s+(?:--platform=\S+\s+)?golang:(\S+)(?:\s+AS\s+\S+)?\s*$`).FindAllSubmatch(dockerfile, -1)
	if len(froms) == 0 {
		t.Fatal("the Dockerfile has no golang builder stage")
	}
	for _, f := range froms {
		if got := string(f[1]); got != want {
			t.Errorf("Dockerfile builder golang:%s, want golang:%s (go.mod's go line)", got, want)
		}
	}
}
