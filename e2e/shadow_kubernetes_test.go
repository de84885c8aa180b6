package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/joishi/limiter/api/v1alpha1"
	"github.com/joishi/limiter/internal/kubetest"
	"github.com/joishi/limiter/internal/servetest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/httpapi"
)

// TestKubernetesShadowMode runs `limiter serve` with tiers.source
// kubernetes against a real API server (envtest) and rolls a cap out as
// DESIGN §18 has a team do it: a LimitTier (and a LimitPool) created with
// enforce: false grants the streams it would refuse, says so
// (would_refuse) and counts them (outcome shadow_refused); switching the
// object to enforce: true, without a restart, refuses the next one.
func TestKubernetesShadowMode(t *testing.T) {
	t.Parallel()
	k := &kubeTiers{kube: kubetest.Start(t), redis: testenv.Redis(t)}
	ns := k.kube.Namespace(t)
	p := k.serve(t, ns, k.kube.Kubeconfig, false)

	t.Run("a LimitTier in shadow mode, then enforced", func(t *testing.T) { testShadowTier(t, k, ns, p) })
	t.Run("a LimitPool in shadow mode, then enforced", func(t *testing.T) { testShadowPool(t, k, ns, p) })
}

// shadowAnswer is an acquire's answer: its status, the grant (200) or the
// error (otherwise), and the raw body.
type shadowAnswer struct {
	status int
	grant  httpapi.AcquireResponse
	err    httpapi.Error
	body   string
}

// shadowAcquire sends POST /v1/slots/acquire for user on plan, joining pools
// (none when nil).
func shadowAcquire(t *testing.T, p *servetest.Process, user, plan string, pools map[string]string) shadowAnswer {
	t.Helper()
	status, _, body := call(t, httpClient, http.MethodPost, p.API+httpapi.PathAcquire, httpapi.AcquireRequest{UserID: user, Plan: plan, Pools: pools}, nil)
	a := shadowAnswer{status: status, body: string(body)}
	var err error
	if status == http.StatusOK {
		err = json.Unmarshal(body, &a.grant)
	} else {
		var e httpapi.ErrorResponse
		err = json.Unmarshal(body, &e)
		a.err = e.Error
	}
	if err != nil {
		t.Fatalf("acquire = %d %s: %v", status, body, err)
	}
	return a
}

// shadowRelease releases user's stream.
func shadowRelease(t *testing.T, p *servetest.Process, user, stream string) {
	t.Helper()
	if status, _, body := call(t, httpClient, http.MethodPost, p.API+httpapi.PathRelease, httpapi.ReleaseRequest{UserID: user, StreamID: stream}, nil); status != http.StatusOK {
		t.Fatalf("release %s of %s = %d %s", stream, user, status, body)
	}
}

// servedEnforce is the enforce of plan in GET /v1/tiers: "true", "false",
// or "none" when the plan is not served.
func servedEnforce(t *testing.T, p *servetest.Process, plan string) string {
	t.Helper()
	var resp httpapi.TiersResponse
	if status, _, body := call(t, httpClient, http.MethodGet, p.API+httpapi.PathTiers, nil, &resp); status != http.StatusOK {
		t.Fatalf("GET /v1/tiers = %d %s", status, body)
	}
	for _, tier := range resp.Tiers {
		if tier.Plan == plan {
			return fmt.Sprint(tier.Enforce)
		}
	}
	return "none"
}

// kubectlColumn is the cell of column in the row `kubectl get resource
// name` prints.
func kubectlColumn(t *testing.T, k *kubeTiers, ns, resource, name, column string) string {
	t.Helper()
	args := []string{"--kubeconfig", k.kube.Kubeconfig, "-n", ns, "get", resource, name}
	out, err := exec.Command(kubectlPath(t), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 2 {
		t.Fatalf("kubectl %s printed %d lines, want a header and a row:\n%s", strings.Join(args, " "), len(lines), out)
	}
	header, row := strings.Fields(lines[0]), strings.Fields(lines[1])
	for i, h := range header {
		if h == column && i < len(row) {
			return row[i]
		}
	}
	t.Fatalf("kubectl %s printed no %s column:\n%s", strings.Join(args, " "), column, out)
	return ""
}

// shadowCounters reads series of p's ops /metrics (0 for a series not exposed).
func shadowCounters(t *testing.T, p *servetest.Process, series ...string) map[string]float64 {
	t.Helper()
	out := make(map[string]float64, len(series))
	for _, s := range series {
		out[s] = metricValue(t, p, s)
	}
	return out
}

// shadowMoved checks that each series moved from before to after by want's
// amount.
func shadowMoved(t *testing.T, when string, before, after map[string]float64, want map[string]float64) {
	t.Helper()
	for series, d := range want {
		if got := after[series] - before[series]; got != d {
			t.Errorf("%s: %s moved by %v (%v -> %v), want %v", when, series, got, before[series], after[series], d)
		}
	}
}

func testShadowTier(t *testing.T, k *kubeTiers, ns string, p *servetest.Process) {
	ctx := t.Context()
	off := false
	trial := &v1alpha1.LimitTier{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "trial"},
		Spec:       v1alpha1.LimitTierSpec{MaxConcurrentStreams: 1, Enforce: &off},
	}
	if err := k.kube.Client.Create(ctx, trial); err != nil {
		t.Fatal(err)
	}
	withinASecond(t, "create with enforce: false", func() string {
		if got := servedEnforce(t, p, "trial"); got != "false" {
			return fmt.Sprintf("GET /v1/tiers: trial enforce = %s, want false", got)
		}
		return ""
	}, nil)
	waitReady(t, k.kube.Client, ns, "trial", 1, "in shadow mode (enforce: false)")
	if got := kubectlColumn(t, k, ns, "lt", "trial", "ENFORCE"); got != "false" {
		t.Errorf("kubectl get lt trial: ENFORCE = %q, want false", got)
	}

	shadow := `limiter_acquire_total{outcome="shadow_refused",plan="trial"}`
	granted := `limiter_acquire_total{outcome="granted",plan="trial"}`
	limited := `limiter_acquire_total{outcome="limited",plan="trial"}`
	before := shadowCounters(t, p, shadow, granted, limited)

	// Within the limit: a plain grant, not counted as a would-be refusal.
	u1, u2 := "shadow-1-"+ns, "shadow-2-"+ns
	if a := shadowAcquire(t, p, u1, "trial", nil); a.status != http.StatusOK || a.grant.Used != 1 || a.grant.WouldRefuse != "" {
		t.Fatalf("first acquire = %d %s, want 200, used 1, no would_refuse", a.status, a.body)
	}
	// Beyond it, three times: each granted, holding its slot (used counts
	// the user's live streams, above the limit), and said to be a refusal
	// the limit would have answered.
	for i := 2; i <= 4; i++ {
		a := shadowAcquire(t, p, u1, "trial", nil)
		if a.status != http.StatusOK || !a.grant.Granted || a.grant.Used != i || a.grant.Limit != 1 ||
			a.grant.WouldRefuse != "stream_limit_reached" || a.grant.WouldRefuseBy != nil {
			t.Errorf("acquire %d of a user at limit 1 in shadow mode = %d %s, want 200 granted, used %d, limit 1, would_refuse stream_limit_reached", i, a.status, a.body, i)
		}
		if !strings.Contains(a.body, `"would_refuse":"stream_limit_reached"`) {
			t.Errorf("acquire %d: the answer %s does not carry \"would_refuse\":\"stream_limit_reached\"", i, a.body)
		}
	}
	// Another user within the limit: granted plainly.
	if a := shadowAcquire(t, p, u2, "trial", nil); a.status != http.StatusOK || a.grant.Used != 1 || a.grant.WouldRefuse != "" || strings.Contains(a.body, "would_refuse") {
		t.Errorf("another user's first acquire = %d %s, want 200, used 1, no would_refuse", a.status, a.body)
	}
	after := shadowCounters(t, p, shadow, granted, limited)
	shadowMoved(t, "after 2 acquires within the limit and 3 beyond it", before, after,
		map[string]float64{shadow: 3, granted: 2, limited: 0})

	// Switched on, without a restart: once the table has it, the next
	// acquire beyond the limit is refused.
	base := trial.DeepCopy()
	on := true
	trial.Spec.Enforce = &on
	if err := k.kube.Client.Patch(ctx, trial, client.MergeFrom(base)); err != nil {
		t.Fatal(err)
	}
	withinASecond(t, "update to enforce: true", func() string {
		if got := servedEnforce(t, p, "trial"); got != "true" {
			return fmt.Sprintf("GET /v1/tiers: trial enforce = %s, want true", got)
		}
		return ""
	}, func() {
		a := shadowAcquire(t, p, u1, "trial", nil)
		if a.status != http.StatusTooManyRequests || a.err.Code != "stream_limit_reached" ||
			a.err.Used == nil || *a.err.Used != 4 || a.err.Limit == nil || *a.err.Limit != 1 {
			t.Errorf("acquire of a user holding 4 after enforce: true = %d %s, want 429 stream_limit_reached, used 4, limit 1", a.status, a.body)
		}
	})
	shadowMoved(t, "after the refusal", after, shadowCounters(t, p, shadow, granted, limited),
		map[string]float64{shadow: 0, granted: 0, limited: 1})
	waitReady(t, k.kube.Client, ns, "trial", 2, `plan "trial" is in force: 1 concurrent stream per user`)
}

func testShadowPool(t *testing.T, k *kubeTiers, ns string, p *servetest.Process) {
	ctx := t.Context()
	team := &v1alpha1.LimitTier{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "team"}, Spec: v1alpha1.LimitTierSpec{MaxConcurrentStreams: 5}}
	if err := k.kube.Client.Create(ctx, team); err != nil {
		t.Fatal(err)
	}
	off, ten := false, int32(10)
	model := &v1alpha1.LimitPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "model"},
		// A default cap, so that kubectl prints no empty cell before ENFORCE.
		Spec: v1alpha1.LimitPoolSpec{MaxConcurrentStreams: &ten, Keys: map[string]int32{"gpt-4o": 1}, Enforce: &off},
	}
	if err := k.kube.Client.Create(ctx, model); err != nil {
		t.Fatal(err)
	}
	join := map[string]string{"model": "gpt-4o"}
	u1, u2, u3 := "pool-1-"+ns, "pool-2-"+ns, "pool-3-"+ns
	// The first membership of the key, once serve knows the pool and the
	// plan (until then: 422 unknown_pool or unknown_plan, which take
	// nothing).
	withinASecond(t, "create with enforce: false", func() string {
		a := shadowAcquire(t, p, u1, "team", join)
		if a.status != http.StatusOK {
			return fmt.Sprintf("first acquire joining model=gpt-4o = %d %s, want 200", a.status, a.body)
		}
		if a.grant.WouldRefuse != "" || len(a.grant.Pools) != 1 || a.grant.Pools[0].Used != 1 {
			t.Errorf("first acquire joining model=gpt-4o = %s, want used 1 in the key and no would_refuse", a.body)
		}
		return ""
	}, nil)
	waitPoolReady(t, k.kube.Client, ns, "model", 1)
	if got := kubectlColumn(t, k, ns, "lp", "model", "ENFORCE"); got != "false" {
		t.Errorf("kubectl get lp model: ENFORCE = %q, want false", got)
	}

	shadowPool := `limiter_pool_acquire_total{outcome="shadow_refused",pool="model"}`
	shadowPlan := `limiter_acquire_total{outcome="shadow_refused",plan="team"}`
	before := shadowCounters(t, p, shadowPool, shadowPlan)

	// The key is full: another user joins it all the same, told which key
	// would have refused.
	a := shadowAcquire(t, p, u2, "team", join)
	wantBy := httpapi.PoolGrant{Pool: "model", Key: "gpt-4o", Used: 2, Limit: 1}
	if a.status != http.StatusOK || !a.grant.Granted || a.grant.WouldRefuse != "pool_limit_reached" ||
		a.grant.WouldRefuseBy == nil || *a.grant.WouldRefuseBy != wantBy {
		t.Fatalf("acquire joining the full key model=gpt-4o in shadow mode = %d %s, want 200, would_refuse pool_limit_reached by %+v", a.status, a.body, wantBy)
	}
	if len(a.grant.Pools) != 1 || a.grant.Pools[0] != wantBy {
		t.Errorf("the grant's pools = %+v, want the key with its true count: %+v", a.grant.Pools, wantBy)
	}
	if !strings.Contains(a.body, `"would_refuse_by":{"pool":"model","key":"gpt-4o"`) {
		t.Errorf("the answer %s does not name the pool and key in would_refuse_by", a.body)
	}
	// The pool counts it, by pool; the plan, which did not refuse, does not.
	shadowMoved(t, "after one acquire joining a full key", before, shadowCounters(t, p, shadowPool, shadowPlan),
		map[string]float64{shadowPool: 1, shadowPlan: 0})

	// Switched on, without a restart. No endpoint lists pools: probe with
	// acquires, each shadow grant released at once, until one is refused.
	base := model.DeepCopy()
	on := true
	model.Spec.Enforce = &on
	if err := k.kube.Client.Patch(ctx, model, client.MergeFrom(base)); err != nil {
		t.Fatal(err)
	}
	withinASecond(t, "update to enforce: true", func() string {
		a := shadowAcquire(t, p, u3, "team", join)
		if a.status == http.StatusOK {
			shadowRelease(t, p, u3, a.grant.StreamID)
			return fmt.Sprintf("acquire joining the full key = %d %s, want 429", a.status, a.body)
		}
		if a.status != http.StatusTooManyRequests || a.err.Code != "pool_limit_reached" || a.err.Pool != "model" || a.err.Key != "gpt-4o" ||
			a.err.Used == nil || *a.err.Used != 2 || a.err.Limit == nil || *a.err.Limit != 1 {
			t.Errorf("acquire joining the full key after enforce: true = %d %s, want 429 pool_limit_reached, model=gpt-4o, used 2, limit 1", a.status, a.body)
		}
		return ""
	}, nil)
	waitPoolReady(t, k.kube.Client, ns, "model", 2)
}
