package chart

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/joishi/limiter/internal/testenv"
)

// kubeScoreKubernetes is the Kubernetes version kube-score judges against:
// the oldest the chart supports (Chart.yaml kubeVersion).
const kubeScoreKubernetes = "v1.30"

// justifiedCriticals are the kube-score checks the chart fails on purpose
// with its defaults; README.md's "Static analysers" section gives the
// reason of each (TestKubeScore checks that it names them).
var justifiedCriticals = []string{"container-image-pull-policy"}

// kubeScoreResult is one object of `kube-score score --output-format json`.
type kubeScoreResult struct {
	ObjectName string `json:"object_name"`
	Checks     []struct {
		Check struct {
			ID string `json:"id"`
		} `json:"check"`
		Grade    int  `json:"grade"` // 1 critical, 5 warning, 7 almost OK, 10 OK
		Skipped  bool `json:"skipped"`
		Comments []struct {
			Path    string `json:"path"`
			Summary string `json:"summary"`
		} `json:"comments"`
	} `json:"checks"`
}

const kubeScoreCritical = 1

// kube-score, the analyser platform teams run on manifests, finds no
// CRITICAL in the rendered chart but those justified in README.md, and none
// at all once image.pullPolicy is Always.
func TestKubeScore(t *testing.T) {
	kubeScore := testenv.KubeScore(t)
	readme, err := os.ReadFile(filepath.Join(chartDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range justifiedCriticals {
		if !strings.Contains(string(readme), "`"+id+"`") {
			t.Errorf("README.md does not justify kube-score's CRITICAL %s", id)
		}
	}

	tests := []struct {
		name      string
		files     []string
		flags     []string
		justified []string
	}{
		{"default values", []string{redisValues}, nil, justifiedCriticals},
		{"cluster mode (ci/cluster-values.yaml)", []string{clusterValues}, nil, justifiedCriticals},
		{"one replica on the embedded store", nil, []string{"--set", "replicaCount=1"}, justifiedCriticals},
		{"restricted egress and custom peers", []string{redisValues, networkPolicyValues}, nil, justifiedCriticals},
		{"LimitPools (testdata/pools-values.yaml)", []string{redisValues, poolsValues}, nil, justifiedCriticals},
		{"image.pullPolicy Always", []string{clusterValues}, []string{"--set", "image.pullPolicy=Always"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			manifests, stderr, err := runHelm(t, templateArgs(tt.files, tt.flags...)...)
			if err != nil {
				t.Fatalf("helm template: %v\n%s", err, stderr)
			}
			path := filepath.Join(t.TempDir(), "manifests.yaml")
			if err := os.WriteFile(path, []byte(manifests), 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(kubeScore, "score", "--output-format", "json", "--kubernetes-version", kubeScoreKubernetes, path)
			var out, errOut bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &errOut
			runErr := cmd.Run() // exits 1 when it finds a CRITICAL: judged below
			var results []kubeScoreResult
			if err := json.Unmarshal(out.Bytes(), &results); err != nil {
				t.Fatalf("kube-score (%v) printed no JSON report: %v\n%s%s", runErr, err, out.String(), errOut.String())
			}
			if len(results) == 0 {
				t.Fatal("kube-score scored no object")
			}
			for _, r := range results {
				for _, c := range r.Checks {
					if c.Skipped || c.Grade > kubeScoreCritical || slices.Contains(tt.justified, c.Check.ID) {
						continue
					}
					var why []string
					for _, cm := range c.Comments {
						why = append(why, strings.TrimSpace(cm.Path+" "+cm.Summary))
					}
					t.Errorf("kube-score: CRITICAL %s on %s: %s", c.Check.ID, r.ObjectName, strings.Join(why, "; "))
				}
			}
		})
	}
}
