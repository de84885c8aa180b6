package e2e

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/joishi/limiter/internal/testenv"
)

// TestShadowGrantsAreGrantsToTheAlerts: a plan in
// shadow mode (enforce: false) grants every acquire; those over its limit
// are counted as outcome="shadow_refused", not "granted" (observability.md:
// "A shadow grant is not a granted one"). The shipped alerts that mean "the
// plan granted streams" must count them too:
//
//   - LimiterSlotsUsedFloor says "the plan granted no new stream meanwhile";
//     a shadow plan of maxConcurrentStreams 0 (the rollout of "this plan may
//     not stream") grants a new stream every minute, each shadow_refused,
//     while some user always holds one: it must not fire.
//   - LimiterSlotsReclaimedRising divides reclaimed slots by the grants: a
//     shadow plan granting 10 streams a minute (all shadow_refused) of which
//     1 a minute expires unreleased (10%, over the 5% threshold) fires; one
//     where 1 in 100 expires (1%) must not.
func TestShadowGrantsAreGrantsToTheAlerts(t *testing.T) {
	promtool := testenv.Promtool(t)
	rules, err := filepath.Abs(filepath.Join("..", "config", "observability", "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	reclaimed := shippedAlert(t, rules, "LimiterSlotsReclaimedRising")
	fill := strings.NewReplacer("{{ $labels.plan }}", "gamma", "{{ $value | humanizePercentage }}", "10%")
	gamma := promAlert{
		Labels:      map[string]string{"job": "limiter", "plan": "gamma", "severity": reclaimed.Labels["severity"]},
		Annotations: map[string]string{"summary": fill.Replace(reclaimed.Annotations["summary"]), "description": fill.Replace(reclaimed.Annotations["description"])},
	}
	var test promTest
	test.Input = []promSeries{
		// Plan trial: shadow mode, maxConcurrentStreams 0. A new stream a
		// minute, every one shadow_refused; users hold 1-2 all along.
		{`limiter_acquire_total{instance="a",job="limiter",outcome="shadow_refused",plan="trial"}`, `0+1x60`},
		{`limiter_acquire_total{instance="a",job="limiter",outcome="granted",plan="trial"}`, `0x60`},
		{`limiter_slots_used_max{instance="a",job="limiter",plan="trial"}`, `1x60`},
		// Plan beta: shadow mode, limit 1, users hold 2-3 streams: of 100
		// grants a minute, 10 are a user's first (granted) and 90 over the
		// limit (shadow_refused); 1 a minute expires unreleased: 1% of the
		// grants.
		{`limiter_acquire_total{instance="a",job="limiter",outcome="shadow_refused",plan="beta"}`, `0+90x60`},
		{`limiter_acquire_total{instance="a",job="limiter",outcome="granted",plan="beta"}`, `0+10x60`},
		{`limiter_slots_reclaimed_total{instance="a",job="limiter",plan="beta"}`, `0+1x60`},
		{`limiter_slots_used_max{instance="a",job="limiter",plan="beta"}`, `0 3x59`},
		// Plan gamma: shadow mode, all 10 grants a minute shadow_refused, 1 a
		// minute expiring unreleased: 10% of its grants.
		{`limiter_acquire_total{instance="a",job="limiter",outcome="shadow_refused",plan="gamma"}`, `0+10x60`},
		{`limiter_acquire_total{instance="a",job="limiter",outcome="granted",plan="gamma"}`, `0x60`},
		{`limiter_slots_reclaimed_total{instance="a",job="limiter",plan="gamma"}`, `0+1x60`},
	}
	for _, at := range []string{"40m", "55m"} {
		test.Checks = append(test.Checks,
			promCheck{EvalTime: at, AlertName: "LimiterSlotsUsedFloor", Alerts: []promAlert{}},
			promCheck{EvalTime: at, AlertName: "LimiterSlotsReclaimedRising", Alerts: []promAlert{gamma}},
		)
	}
	promtoolRules(t, promtool, rules, test)
}
