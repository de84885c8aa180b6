package config

import (
	"strings"
	"testing"
)

// enforce: false reads from the file onto a tier and a pool; unset, both
// enforce; a value that is no boolean names its line.
func TestEnforceLoads(t *testing.T) {
	c, err := load(t, "tiers:\n  static:\n    - {plan: watch, maxConcurrentStreams: 1, enforce: false}\n    - {plan: paid, maxConcurrentStreams: 3}\n"+
		"pools:\n  static:\n    - {pool: model, keys: {big: 1}, enforce: false}\n    - {pool: org, keys: {acme: 1}}\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	enforced := map[string]bool{}
	for _, tier := range c.StaticTiers() {
		enforced["plan "+tier.Plan] = tier.Enforced()
	}
	for _, pool := range c.StaticPools() {
		enforced["pool "+pool.Pool] = pool.Enforced()
	}
	for scope, want := range map[string]bool{"plan watch": false, "plan paid": true, "pool model": false, "pool org": true} {
		if got, ok := enforced[scope]; !ok || got != want {
			t.Errorf("%s: enforced %v (listed %v); want %v", scope, got, ok, want)
		}
	}
	if _, err := load(t, "tiers:\n  static:\n    - {plan: watch, maxConcurrentStreams: 1, enforce: maybe}\n", nil); err == nil {
		t.Error("enforce: maybe was accepted; want an error")
	} else if want := "tiers.static[0].enforce"; !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "line 3") {
		t.Errorf("enforce: maybe: %v; want an error naming %s and line 3", err, want)
	}
}
