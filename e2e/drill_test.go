package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/servetest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/httpapi"
)

// The drill runs on a compressed clock: one scrape a second stands for
// one scrape a minute, so the shipped rules' windows (15m, 30m) and
// for-durations (5m) pass in seconds; a slot TTL of 5s stands for one of
// 5 minutes. Ratios and increases, which the rules compare, do not change
// with the scale.
const (
	drillUsers     = 100 // 50 free users (1 stream), 50 paid (3 streams)
	drillStreams   = 50*1 + 50*3
	drillTTL       = 5 * time.Second
	drillScrape    = time.Second
	drillSteady    = 5  // scrapes before the deploy
	drillStreamFor = 6  // seconds the second generation's streams last
	drillFloorFor  = 30 // the floor alert's window, in scrapes (30m)
	// drillReclaimedRuleMin is the least increase of reclaimed slots
	// LimiterSlotsReclaimedRising fires on (alerts.yaml: "> 5").
	drillReclaimedRuleMin = 5
)

const drillTiers = `    - plan: free
      maxConcurrentStreams: 1
      slotTTL: 5s
      heartbeatInterval: 1s
    - plan: paid
      maxConcurrentStreams: 3
      slotTTL: 5s
      heartbeatInterval: 1s
`

// TestIncidentDrill is the incident of DESIGN §1 as an on-call person
// meets it, found with what they have: /metrics (sampled as Prometheus
// would), the shipped alert rules (evaluated by Prometheus's own promtool)
// and the admin API. 3 serve processes and 100 streaming users (200
// streams, pkg/client); a bad deploy SIGKILLs the servers and the
// application mid-stream; new servers come up and the users come back,
// refused at their limit until the killed streams' slots expire. One
// worker of the new application hangs, its slots still heartbeated. The
// drill finds:
//   - the lockout: users refused at their limit while nobody is granted
//     (limiter_slots_used_max at the limit), for one slot TTL;
//   - LimiterSlotsReclaimedRising firing for both plans 5 scrapes
//     ("minutes") after the reclaims (the scrape whose counters hold
//     more than the rule's least increase), not before, and nothing else
//     firing;
//   - the floor: limiter_slots_used_max of the healthy plan back to 0 once
//     its streams end, that of the hung worker's plan staying up, and
//     LimiterSlotsUsedFloor firing for it (30 "minutes" without a grant);
//   - the admin API naming the hung worker's slots (age, caller, label),
//     whose release returns the floor to 0.
func TestIncidentDrill(t *testing.T) {
	t.Parallel()
	promtool := testenv.Promtool(t)
	redis := testenv.Cluster(t)
	run := randomID()
	prefix := "drill-" + run + "-"
	dir := t.TempDir()
	apiTokens, adminTokens := filepath.Join(dir, "api-tokens"), filepath.Join(dir, "admin-tokens")
	if err := os.WriteFile(apiTokens, []byte("chat-api "+e2eAppToken+" *\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(adminTokens, []byte("opal operator "+e2eOperatorToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	config := serveConfig(redis, "e2e-drill-"+run+":", drillTiers) +
		"api:\n  tokensFile: " + apiTokens + "\nadmin:\n  tokensFile: " + adminTokens + "\n" +
		// Two scrapes: a maximum is never missed between two of them.
		"telemetry:\n  slotsUsedMaxWindow: 2s\n"
	samples := startSampler(drillScrape)
	defer samples.close()
	awaitTick := func(tick int) {
		t.Helper()
		for samples.now() <= tick {
			time.Sleep(50 * time.Millisecond)
		}
	}

	servers := startServers(t, 3, config)
	samples.setTargets(opsURLs(servers))
	awaitTick(samples.now()) // scraped before the first stream, as Prometheus would
	gen1, streams := startChild(t, "drill", "E2E_SERVERS="+strings.Join(urls(servers), ","), "E2E_TOKEN="+e2eAppToken,
		fmt.Sprintf("E2E_USERS=%d", drillUsers), "E2E_USER_PREFIX="+prefix, "E2E_GEN=gen1")
	if streams != drillStreams {
		t.Fatalf("the application opened %d streams, want %d", streams, drillStreams)
	}
	awaitTick(samples.now() + drillSteady)

	// The bad deploy: servers and application SIGKILLed mid-stream, new
	// servers up at once, the users back as soon as they are.
	for _, s := range servers {
		s.Kill()
	}
	gen1.kill()
	crash := samples.now()
	fresh := startServersAtOnce(t, 3, config)
	samples.setTargets(opsURLs(fresh))
	stuckUser := 7 // paid: 3 slots
	gen2, streams := startChild(t, "drill", "E2E_SERVERS="+strings.Join(urls(fresh), ","), "E2E_TOKEN="+e2eAppToken,
		fmt.Sprintf("E2E_USERS=%d", drillUsers), "E2E_USER_PREFIX="+prefix, "E2E_GEN=gen2",
		fmt.Sprintf("E2E_STREAM_FOR=%ds", drillStreamFor), fmt.Sprintf("E2E_STUCK_USER=%d", stuckUser))
	if streams != drillStreams {
		t.Fatalf("the new application holds %d streams, want %d", streams, drillStreams)
	}
	back := samples.now()
	select {
	case line := <-gen2.lines:
		if want := fmt.Sprintf("ENDED %d", drillStreams-3); line != want {
			t.Fatalf("the new application said %q, want %q", line, want)
		}
	case <-time.After(time.Minute):
		t.Fatal("the new application's streams did not end")
	}
	ended := samples.now()

	// The reclaims, by plan: the first scrape whose counters hold them,
	// and the first whose counters hold more than the rule's least
	// increase (5: the killed streams' slots may expire across two
	// scrapes, the first seeing a few); and the last scrape that saw a
	// new grant.
	awaitTick(back + 1)
	first, alertable := map[string]int{}, map[string]int{}
	lastGrant := crash
	for i := crash; i <= back+1; i++ {
		for _, plan := range []string{"free", "paid"} {
			n := samples.sum(i, "limiter_slots_reclaimed_total", `plan="`+plan+`"`)
			if _, seen := first[plan]; !seen && n > 0 {
				first[plan] = i
			}
			if _, seen := alertable[plan]; !seen && n > drillReclaimedRuleMin {
				alertable[plan] = i
			}
		}
		if i > crash && samples.sum(i, "limiter_acquire_total", `outcome="granted"`) > samples.sum(i-1, "limiter_acquire_total", `outcome="granted"`) {
			lastGrant = i
		}
	}
	if len(first) != 2 || len(alertable) != 2 {
		t.Fatalf("slots reclaimed by plan by the scrape after the users were back (%d): first seen at %v, more than %d at %v; want both plans",
			back+1, first, drillReclaimedRuleMin, alertable)
	}
	reclaimed, reclaimedAll := min(first["free"], first["paid"]), max(alertable["free"], alertable["paid"])
	total := samples.sum(back+1, "limiter_slots_reclaimed_total")
	if total != drillStreams {
		t.Errorf("slots reclaimed after the deploy: %v, want %d (one per killed stream)", total, drillStreams)
	}

	// The lockout: between the deploy and the reclaims, users are refused
	// at their limit while nothing is granted.
	lockout := 0
	for i := crash + 1; i < reclaimed; i++ {
		if samples.max(i, "limiter_slots_used_max", `plan="paid"`) == 3 && samples.max(i, "limiter_slots_used_max", `plan="free"`) == 1 &&
			samples.sum(i, "limiter_acquire_total", `outcome="granted"`) == 0 && samples.sum(i, "limiter_acquire_total", `outcome="limited"`) > 0 {
			lockout++
		}
	}
	if lockout == 0 {
		t.Errorf("no scrape between the deploy (%d) and the reclaims (%d) shows users refused at their limit with none granted", crash, reclaimed)
	}
	t.Logf("drill: deploy at scrape %d, reclaims at %d-%d (%d killed streams), %d scrapes of lockout, last grant at %d; streams ended at %d",
		crash, reclaimed, reclaimedAll, int(total), lockout, lastGrant, ended)

	// The floor: 30 scrapes after the last grant.
	floorTick := lastGrant + drillFloorFor + 1
	awaitTick(floorTick)
	if got := samples.max(floorTick, "limiter_slots_used_max", `plan="free"`); got != 0 {
		t.Errorf("limiter_slots_used_max{plan=free} after its streams ended: %v, want 0 (the floor returns)", got)
	}
	if got := samples.max(floorTick, "limiter_slots_used_max", `plan="paid"`); got != 3 {
		t.Errorf("limiter_slots_used_max{plan=paid} with the hung worker: %v, want 3 (the floor stays up)", got)
	}

	// The admin API names the hung worker's slots, and frees them.
	user := fmt.Sprintf("%s%d", prefix, stuckUser)
	admin := &adminServer{Process: fresh[0]}
	var slots httpapi.AdminSlotsResponse
	if status, body := admin.admin(t, "GET", httpapi.AdminUserSlotsPath(user), e2eOperatorToken, nil, &slots); status != http.StatusOK || slots.Used != 3 {
		t.Fatalf("slots of the hung worker's user: %d %s, want 3", status, body)
	}
	for _, s := range slots.Slots {
		age := time.Duration(0)
		if s.AgeMs != nil {
			age = time.Duration(*s.AgeMs) * time.Millisecond
		}
		if s.Caller != "chat-api" || s.Plan != "paid" || s.Label != fmt.Sprintf("gen2/worker-%d", stuckUser%8) || age < time.Duration(drillFloorFor)*drillScrape {
			t.Errorf("hung slot: got %+v (age %v), want caller chat-api, plan paid, label gen2/worker-%d, held for the floor's 30 scrapes", s, age, stuckUser%8)
		}
	}
	var released httpapi.AdminReleaseResponse
	if status, body := admin.admin(t, "POST", httpapi.AdminUserReleasePath(user), e2eOperatorToken,
		httpapi.AdminReleaseRequest{Reason: "drill: hung worker gen2/worker-7 holds 3 slots"}, &released); status != http.StatusOK || len(released.Released) != 3 {
		t.Fatalf("release of the hung worker's slots: %d %s, want 3 released", status, body)
	}
	freed := samples.now()
	awaitTick(freed + 3)
	if got := samples.max(freed+3, "limiter_slots_used_max", `plan="paid"`); got != 0 {
		t.Errorf("limiter_slots_used_max{plan=paid} 3 scrapes after the release: %v, want 0", got)
	}
	samples.close()

	// The rules, on the samples, by Prometheus's own tester.
	checks := []promtoolCheck{
		{at: crash - 1},     // steady: nothing fires
		{at: reclaimed + 4}, // "for: 5m" has not passed yet
		{at: reclaimedAll + 5, want: firing{"LimiterSlotsReclaimedRising": {"free", "paid"}}},
		{at: floorTick, want: firing{"LimiterSlotsUsedFloor": {"paid"}}},
		{at: freed + 3}, // released: the floor is back to 0
	}
	out, ok := runPromtool(t, promtool, samples, checks)
	if !ok {
		t.Errorf("promtool test rules on the drill's samples (checks %+v):\n%s", checks, out)
	}
	t.Logf("drill: LimiterSlotsReclaimedRising fired by scrape %d (%d \"minutes\" after the deploy); LimiterSlotsUsedFloor by %d; the floor back to 0 by %d",
		reclaimedAll+5, reclaimedAll+5-crash, floorTick, freed+3)
}

func opsURLs(procs []*servetest.Process) []string {
	out := make([]string, len(procs))
	for i, p := range procs {
		out[i] = p.Ops
	}
	return out
}

// startServersAtOnce starts n serve processes in parallel, as a rollout
// brings up a deployment's new pods.
func startServersAtOnce(t *testing.T, n int, config string) []*servetest.Process {
	t.Helper()
	procs := make([]*servetest.Process, n)
	var wg sync.WaitGroup
	for i := range procs {
		wg.Go(func() { procs[i] = servetest.Start(t, servetest.Options{Config: config, AwaitRedis: true}) })
	}
	wg.Wait()
	for _, p := range procs {
		if p == nil {
			t.FailNow()
		}
	}
	return procs
}
