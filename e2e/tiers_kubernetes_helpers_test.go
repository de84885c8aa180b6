package e2e

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/joishi/limiter/api/v1alpha1"
	"github.com/joishi/limiter/internal/servetest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/controller"
	"github.com/joishi/limiter/pkg/httpapi"
)

// withinASecond polls cond until it returns "", then runs then (which may
// fail t); both must be done within a second.
func withinASecond(t *testing.T, what string, cond func() string, then func()) {
	t.Helper()
	start := time.Now()
	for {
		msg := cond()
		if msg == "" {
			break
		}
		if time.Since(start) > time.Second {
			t.Fatalf("%s: not reflected within 1s: %s", what, msg)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if then != nil {
		then()
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("%s: took %v, want within 1s", what, took)
	}
}

// servedTiers is GET /v1/tiers as plan → maxConcurrentStreams.
func servedTiers(t *testing.T, p *servetest.Process) map[string]int {
	t.Helper()
	var resp httpapi.TiersResponse
	if status, _, body := call(t, httpClient, "GET", p.API+httpapi.PathTiers, nil, &resp); status != http.StatusOK {
		t.Fatalf("GET /v1/tiers = %d %s", status, body)
	}
	out := map[string]int{}
	for _, tier := range resp.Tiers {
		out[tier.Plan] = tier.MaxConcurrentStreams
	}
	return out
}

// wantLimit acquires for a fresh user until refused and checks the refusal
// comes at limit.
func wantLimit(t *testing.T, api, user, plan string, limit int) {
	t.Helper()
	for i := range limit {
		if status, _ := acquire(t, api, user, plan); status != http.StatusOK {
			t.Fatalf("acquire %d of %d on %s = %d, want 200", i+1, limit, plan, status)
		}
	}
	status, _, body := call(t, httpClient, "POST", api+httpapi.PathAcquire, httpapi.AcquireRequest{UserID: user, Plan: plan}, nil)
	if want := fmt.Sprintf(`"limit":%d`, limit); status != http.StatusTooManyRequests || !strings.Contains(string(body), want) {
		t.Errorf("acquire %d on %s = %d %s, want 429 with %s", limit+1, plan, status, body, want)
	}
}

func patchLimit(t *testing.T, c client.Client, lt *v1alpha1.LimitTier, limit int32) {
	t.Helper()
	base := lt.DeepCopy()
	lt.Spec.MaxConcurrentStreams = limit
	if err := c.Patch(t.Context(), lt, client.MergeFrom(base)); err != nil {
		t.Fatal(err)
	}
}

// waitReady waits until name's status is Ready=True for generation, with a
// message containing msg.
func waitReady(t *testing.T, c client.Client, ns, name string, generation int64, msg string) {
	t.Helper()
	deadline := time.Now().Add(testLease + 15*time.Second)
	var last string
	for time.Now().Before(deadline) {
		var lt v1alpha1.LimitTier
		if err := c.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, &lt); err != nil {
			t.Fatal(err)
		}
		cond := meta.FindStatusCondition(lt.Status.Conditions, v1alpha1.ConditionReady)
		if cond != nil && cond.Status == metav1.ConditionTrue && lt.Status.ObservedGeneration == generation &&
			cond.ObservedGeneration == generation && strings.Contains(cond.Message, msg) {
			return
		}
		last = fmt.Sprintf("generation %d, status %+v", lt.Generation, lt.Status)
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s: not Ready=True for generation %d with a message containing %q; last seen: %s", name, generation, msg, last)
}

func leaseHolder(t *testing.T, c client.Client, ns string) string {
	t.Helper()
	var lease coordinationv1.Lease
	if err := c.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: controller.DefaultLeaseName}, &lease); err != nil {
		t.Fatal(err)
	}
	if lease.Spec.HolderIdentity == nil {
		return ""
	}
	return *lease.Spec.HolderIdentity
}

var identityLine = regexp.MustCompile(`"msg":"watching LimitTiers".*"identity":"([^"]+)"`)

// identityOf is the Lease identity a serve process logged at start.
func identityOf(t *testing.T, p *servetest.Process) string {
	t.Helper()
	m := identityLine.FindStringSubmatch(p.Output())
	if m == nil {
		t.Fatalf("%s logged no identity:\n%s", p.API, p.Output())
	}
	return m[1]
}

// kubeconfigVia writes a copy of kubeconfig whose clusters are reached at
// server.
func kubeconfigVia(t *testing.T, kubeconfig, server string) string {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, cluster := range cfg.Clusters {
		cluster.Server = server
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// kubectlPath is the kubectl hack/envtest-assets.sh links beside the
// envtest binaries, else the one on PATH.
func kubectlPath(t *testing.T) string {
	t.Helper()
	if path := filepath.Join(testenv.KubebuilderAssets(t), "kubectl"); fileExists(path) {
		return path
	}
	path, err := exec.LookPath("kubectl")
	if err != nil {
		t.Fatal("kubectl is neither in KUBEBUILDER_ASSETS nor on PATH")
	}
	return path
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
