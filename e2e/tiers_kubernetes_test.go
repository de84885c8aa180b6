package e2e

import (
	"fmt"
	"net/http"
	"net/url"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/joishi/limiter/api/v1alpha1"
	"github.com/joishi/limiter/internal/kubetest"
	"github.com/joishi/limiter/internal/servetest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/httpapi"
)

// testLease is the tiers.leaseDuration of these tests: a killed leader is
// replaced within about this long.
const testLease = 2 * time.Second

// TestKubernetesTiers runs `limiter serve` processes with tiers.source
// kubernetes against a real API server (envtest), one for all subtests.
func TestKubernetesTiers(t *testing.T) {
	t.Parallel()
	redis := testenv.Redis(t)
	kube := kubetest.Start(t)
	k := &kubeTiers{kube: kube, redis: redis}

	t.Run("create, update and delete reach serve within a second", k.testCreateUpdateDelete)
	t.Run("two replicas enforce alike, one writes status, and a killed leader is replaced", k.testTwoReplicas)
	t.Run("readyz is false until the first sync", k.testReadyAfterFirstSync)
	t.Run("kubectl get lt and lp show the printer columns", k.testKubectlColumns)
}

type kubeTiers struct {
	kube  *kubetest.Env
	redis string
}

// serve starts `limiter serve` on the LimitTiers of ns, using kubeconfig.
func (k *kubeTiers) serve(t *testing.T, ns, kubeconfig string, noWaitReady bool) *servetest.Process {
	t.Helper()
	cfg := fmt.Sprintf(`redis:
  addrs: [%q]
  keyPrefix: "e2e-lt-%s:"
tiers:
  source: kubernetes
  namespace: %q
  leaseDuration: %s
`, k.redis, ns, ns, testLease)
	return servetest.Start(t, servetest.Options{Config: cfg, Env: []string{"KUBECONFIG=" + kubeconfig}, NoWaitReady: noWaitReady, AwaitRedis: true})
}

func (k *kubeTiers) testCreateUpdateDelete(t *testing.T) {
	ns := k.kube.Namespace(t)
	ctx := t.Context()
	p := k.serve(t, ns, k.kube.Kubeconfig, false)
	if got := servedTiers(t, p); len(got) != 0 {
		t.Fatalf("tiers of an empty namespace = %v, want none", got)
	}
	if status, _ := acquire(t, p.API, "u0-"+ns, "pro"); status != http.StatusUnprocessableEntity {
		t.Fatalf("acquire on a plan no LimitTier defines = %d, want 422", status)
	}

	pro := &v1alpha1.LimitTier{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pro"}, Spec: v1alpha1.LimitTierSpec{MaxConcurrentStreams: 3}}
	if err := k.kube.Client.Create(ctx, pro); err != nil {
		t.Fatal(err)
	}
	withinASecond(t, "create", func() string {
		if got := servedTiers(t, p)["pro"]; got != 3 {
			return fmt.Sprintf("GET /v1/tiers: pro = %d, want 3", got)
		}
		return ""
	}, func() { wantLimit(t, p.API, "u1-"+ns, "pro", 3) })

	patchLimit(t, k.kube.Client, pro, 1)
	withinASecond(t, "update 3 -> 1", func() string {
		if got := servedTiers(t, p)["pro"]; got != 1 {
			return fmt.Sprintf("GET /v1/tiers: pro = %d, want 1", got)
		}
		return ""
	}, func() { wantLimit(t, p.API, "u2-"+ns, "pro", 1) })
	// Slots already held are kept, but count against the new limit.
	if status, _, body := call(t, httpClient, "POST", p.API+httpapi.PathAcquire, httpapi.AcquireRequest{UserID: "u1-" + ns, Plan: "pro"}, nil); status != http.StatusTooManyRequests || !strings.Contains(string(body), `"used":3,"limit":1`) {
		t.Errorf("acquire of a user holding 3 after 3 -> 1 = %d %s, want 429 with used 3, limit 1", status, body)
	}

	if err := k.kube.Client.Delete(ctx, pro); err != nil {
		t.Fatal(err)
	}
	withinASecond(t, "delete", func() string {
		if got, ok := servedTiers(t, p)["pro"]; ok {
			return fmt.Sprintf("GET /v1/tiers: pro = %d, want no tier", got)
		}
		return ""
	}, func() {
		if status, _ := acquire(t, p.API, "u3-"+ns, "pro"); status != http.StatusUnprocessableEntity {
			t.Errorf("acquire on a deleted tier = %d, want 422 unknown_plan", status)
		}
	})
}

func (k *kubeTiers) testTwoReplicas(t *testing.T) {
	ns := k.kube.Namespace(t)
	ctx := t.Context()
	a := k.serve(t, ns, k.kube.Kubeconfig, false)
	b := k.serve(t, ns, k.kube.Kubeconfig, false)

	team := &v1alpha1.LimitTier{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "team"}, Spec: v1alpha1.LimitTierSpec{MaxConcurrentStreams: 2}}
	if err := k.kube.Client.Create(ctx, team); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*servetest.Process{a, b} {
		withinASecond(t, "create on "+p.API, func() string {
			if got := servedTiers(t, p)["team"]; got != 2 {
				return fmt.Sprintf("%s: team = %d, want 2", p.API, got)
			}
			return ""
		}, nil)
	}
	// One user's streams through both replicas share the one limit.
	user := "shared-" + ns
	for i, p := range []*servetest.Process{a, b} {
		if status, _ := acquire(t, p.API, user, "team"); status != http.StatusOK {
			t.Fatalf("acquire %d of 2 = %d, want 200", i+1, status)
		}
	}
	for _, p := range []*servetest.Process{a, b} {
		if status, _ := acquire(t, p.API, user, "team"); status != http.StatusTooManyRequests {
			t.Errorf("third acquire through %s = %d, want 429", p.API, status)
		}
	}

	waitReady(t, k.kube.Client, ns, "team", 1, "2 concurrent streams")
	holder := leaseHolder(t, k.kube.Client, ns)
	leader, follower := a, b
	if holder == identityOf(t, b) {
		leader, follower = b, a
	}
	if holder != identityOf(t, leader) {
		t.Fatalf("Lease holder %q is neither replica (%q, %q)", holder, identityOf(t, a), identityOf(t, b))
	}
	// The leader logs its write after the API server has it: the status
	// seen, the line follows.
	const written = `"msg":"LimitTier status written"`
	withinASecond(t, "the leader's log of its status write", func() string {
		if !strings.Contains(leader.Output(), written) {
			return "the leader logged no status write"
		}
		return ""
	}, nil)
	if n := strings.Count(follower.Output(), written); n != 0 {
		t.Errorf("the follower wrote status %d times; only the leader may", n)
	}

	leader.Kill() // SIGKILL: the Lease is not given up, it must expire
	killed := time.Now()
	patchLimit(t, k.kube.Client, team, 1)
	withinASecond(t, "update on the survivor, before any election", func() string {
		if got := servedTiers(t, follower)["team"]; got != 1 {
			return fmt.Sprintf("survivor: team = %d, want 1", got)
		}
		return ""
	}, nil)
	waitReady(t, k.kube.Client, ns, "team", 2, "1 concurrent stream per user")
	if got, want := leaseHolder(t, k.kube.Client, ns), identityOf(t, follower); got != want {
		t.Errorf("Lease holder after the leader's death = %q, want the survivor %q", got, want)
	}
	withinASecond(t, "the survivor's log of its status write", func() string {
		if !strings.Contains(follower.Output(), written) {
			return "the survivor logged no status write after taking over"
		}
		return ""
	}, nil)
	t.Logf("status written by the new leader %v after the old one was killed (lease %v)", time.Since(killed).Round(time.Millisecond), testLease)
}

func (k *kubeTiers) testReadyAfterFirstSync(t *testing.T) {
	ns := k.kube.Namespace(t)
	free := &v1alpha1.LimitTier{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "free"}, Spec: v1alpha1.LimitTierSpec{MaxConcurrentStreams: 1}}
	if err := k.kube.Client.Create(t.Context(), free); err != nil {
		t.Fatal(err)
	}
	// The API server is reachable only through a proxy that, for now,
	// answers nothing.
	server, err := url.Parse(k.kube.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	proxy := testenv.StartProxy(t, server.Host)
	proxy.BlackHole()
	kubeconfig := kubeconfigVia(t, k.kube.Kubeconfig, "https://"+proxy.Addr())

	p := k.serve(t, ns, kubeconfig, true)
	for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if status, body := servetest.Get(p.Ops + "/readyz"); status != http.StatusServiceUnavailable || !strings.Contains(body, "tiers not synced") {
			t.Fatalf("/readyz before the first sync = %d %q, want 503 naming the unsynced tiers", status, body)
		}
	}
	proxy.Restore()
	deadline := time.Now().Add(20 * time.Second)
	for {
		status, _ := servetest.Get(p.Ops + "/readyz")
		if status == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz = %d 20s after the API server became reachable, want 200", status)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := servedTiers(t, p)["free"]; got != 1 {
		t.Errorf("once ready, free = %d, want 1", got)
	}
}

func (k *kubeTiers) testKubectlColumns(t *testing.T) {
	ns := k.kube.Namespace(t)
	k.serve(t, ns, k.kube.Kubeconfig, false)
	kubectl := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(kubectlPath(t), append([]string{"--kubeconfig", k.kube.Kubeconfig, "-n", ns}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	kubectl("apply", "-k", filepath.Join("..", "config", "samples"))
	waitReady(t, k.kube.Client, ns, "free", 1, "")
	waitReady(t, k.kube.Client, ns, "paid", 1, "")
	waitPoolReady(t, k.kube.Client, ns, "model", 1)

	cases := []struct {
		name string
		args []string
		want []string // lines, fields separated by single spaces; AGE left out
	}{
		{"the default columns", []string{"get", "lt"}, []string{
			"NAME PLAN MAX TTL HEARTBEAT FAILURE WAIT PRIORITY ENFORCE READY AGE",
			"free free 1 120s 20s Open 0s 0 true True",
			"paid paid 3 120s 20s Open 10s 5 true True",
		}},
		{"-o wide adds the reason", []string{"get", "limittiers", "-o", "wide"}, []string{
			"NAME PLAN MAX TTL HEARTBEAT FAILURE WAIT PRIORITY ENFORCE READY REASON AGE",
			"free free 1 120s 20s Open 0s 0 true True Accepted",
			"paid paid 3 120s 20s Open 10s 5 true True Accepted",
		}},
		{"the sample pool", []string{"get", "lp"}, []string{
			"NAME POOL DEFAULT KEYS ENFORCE READY AGE",
			"model model 100 2 true True",
		}},
		{"the sample pool, -o wide", []string{"get", "limitpools", "-o", "wide"}, []string{
			"NAME POOL DEFAULT KEYS ENFORCE FAILURE WAIT READY REASON AGE",
			"model model 100 2 true Open 0s True Accepted",
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := kubectl(tc.args...)
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if len(lines) != len(tc.want) {
				t.Fatalf("kubectl %s printed %d lines, want %d:\n%s", strings.Join(tc.args, " "), len(lines), len(tc.want), out)
			}
			for i, line := range lines {
				got := strings.Join(strings.Fields(line), " ")
				if i > 0 { // drop the age
					got = got[:strings.LastIndex(got, " ")]
				}
				if got != tc.want[i] {
					t.Errorf("line %d = %q, want %q\n%s", i, got, tc.want[i], out)
				}
			}
		})
	}
}
