package chart

import (
	"strings"
	"testing"

	"github.com/joishi/limiter/pkg/config"
)

// shadowValues put one tier and one pool in shadow mode (enforce: false),
// one of each enforced explicitly, and leave it out of the others.
const shadowValues = `tiers:
  items:
    - name: free
      maxConcurrentStreams: 1
      enforce: false
    - name: paid
      maxConcurrentStreams: 3
      enforce: true
    - name: team
      maxConcurrentStreams: 5
limitPools:
  - name: model
    keys: {gpt-4o: 1}
    enforce: false
  - name: org
    maxConcurrentStreams: 40
    enforce: true
  - name: region
`

// renderedEnforce is the enforce of a rendered spec (or tiers.static
// entry): "false", "true", or "unset" when the chart left it to the
// default.
func renderedEnforce(spec map[string]any) string {
	v, ok := spec["enforce"]
	switch {
	case !ok:
		return "unset"
	case v == false:
		return "false"
	case v == true:
		return "true"
	}
	return "not a boolean"
}

// enforce (DESIGN §18, shadow mode) reaches the LimitTier and LimitPool
// objects as given, false included, and stays out of them when not set
// (the CRD defaults it to true).
func TestEnforceReachesTheObjects(t *testing.T) {
	objs := render(t, []string{redisValues, writeValues(t, shadowValues)})
	for kind, want := range map[string]map[string]string{
		"LimitTier": {"free": "false", "paid": "true", "team": "unset"},
		"LimitPool": {"model": "false", "org": "true", "region": "unset"},
	} {
		got := map[string]string{}
		for _, o := range ofKind(objs, kind) {
			spec, _ := o.Object["spec"].(map[string]any)
			got[o.GetName()] = renderedEnforce(spec)
		}
		for name, w := range want {
			if got[name] != w {
				t.Errorf("%s %s: spec.enforce %s, want %s (all: %v)", kind, name, got[name], w, got)
			}
		}
	}
}

// With tiers.source static, enforce goes into tiers.static, and the
// limiter reads it from there.
func TestEnforceReachesTiersStatic(t *testing.T) {
	values := shadowValues[:strings.Index(shadowValues, "limitPools:")] // no LimitPools with the static source
	objs := render(t, []string{redisValues, writeValues(t, values)}, "--set", "tiers.source=static")
	static, _ := configFile(t, objs)["tiers"].(map[string]any)["static"].([]any)
	got := map[string]string{}
	for _, entry := range static {
		e := entry.(map[string]any)
		got[e["plan"].(string)] = renderedEnforce(e)
	}
	if want := map[string]string{"free": "false", "paid": "true", "team": "unset"}; len(got) != len(want) || got["free"] != want["free"] || got["paid"] != want["paid"] || got["team"] != want["team"] {
		t.Errorf("tiers.static enforce: got %v, want %v", got, want)
	}
	cfg := loadRendered(t, objs, config.CommandServe)
	enforced := map[string]bool{}
	for _, tier := range cfg.StaticTiers() {
		enforced[tier.Plan] = tier.Enforced()
	}
	if enforced["free"] || !enforced["paid"] || !enforced["team"] {
		t.Errorf("the limiter reads the rendered tiers.static as enforced = %v, want free false (shadow mode), paid and team true", enforced)
	}
}

// enforce is a boolean: a string is refused before anything reaches the
// cluster, for a tier and for a pool.
func TestEnforceMustBeABoolean(t *testing.T) {
	for _, tc := range []struct{ values, want string }{
		{"tiers:\n  items:\n    - name: free\n      maxConcurrentStreams: 1\n      enforce: \"no\"\n", "at '/tiers/items/0/enforce': got string, want boolean"},
		{"limitPools:\n  - name: model\n    enforce: \"false\"\n", "at '/limitPools/0/enforce': got string, want boolean"},
	} {
		_, stderr, err := runHelm(t, templateArgs([]string{redisValues, writeValues(t, tc.values)})...)
		if err == nil {
			t.Errorf("helm template accepted %q", tc.values)
			continue
		}
		if !strings.Contains(stderr, tc.want) {
			t.Errorf("helm's error for %q does not say %q:\n%s", tc.values, tc.want, stderr)
		}
	}
}
