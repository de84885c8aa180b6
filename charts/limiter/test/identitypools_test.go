package chart

import (
	"maps"
	"reflect"
	"strings"
	"testing"

	"github.com/joishi/limiter/pkg/config"
)

// identity.pools and proxy.maxBodyBytes reach the config file the pods
// read, which the limiter accepts: identity.pools with the rest of
// identity.*, in mode proxy and for the ext_proc server of mode serve
// (TestExtProcIdentity has the rest).
func TestIdentityPoolsRender(t *testing.T) {
	t.Run("mode proxy with a body source", func(t *testing.T) {
		values := writeValues(t, "identity:\n  pools:\n    model: body:model\n    org: header:X-Org\nproxy:\n  maxBodyBytes: 1048576\n")
		objs := render(t, []string{redisValues, proxyValues, values})
		file := configFile(t, objs)
		if got := file["proxy"].(map[string]any)["maxBodyBytes"]; got != int64(1048576) {
			t.Errorf("config proxy.maxBodyBytes %v (%T), want 1048576", got, got)
		}
		if got, _ := file["identity"].(map[string]any)["pools"].(map[string]any); len(got) != 2 || got["model"] != "body:model" || got["org"] != "header:X-Org" {
			t.Errorf("config identity.pools %v, want model: body:model, org: header:X-Org", got)
		}
		cfg := loadRendered(t, objs, config.CommandProxy)
		want := map[string]string{"model": "body:model", "org": "header:X-Org"}
		if cfg.Proxy.MaxBodyBytes != 1048576 || !maps.Equal(cfg.Identity.Pools, want) {
			t.Errorf("limiter proxy reads maxBodyBytes %d, pools %v; want 1048576, %v", cfg.Proxy.MaxBodyBytes, cfg.Identity.Pools, want)
		}
	})
	t.Run("mode proxy with the defaults", func(t *testing.T) {
		objs := render(t, []string{redisValues, proxyValues})
		cfg := loadRendered(t, objs, config.CommandProxy)
		if cfg.Proxy.MaxBodyBytes != 8388608 || len(cfg.Identity.Pools) != 0 {
			t.Errorf("limiter proxy reads maxBodyBytes %d, pools %v; want 8388608 and none", cfg.Proxy.MaxBodyBytes, cfg.Identity.Pools)
		}
	})
	t.Run("the ext_proc server with Envoy AI Gateway's model header", func(t *testing.T) {
		values := writeValues(t, "identity:\n  pools:\n    model: header:x-ai-eg-model\nproxy:\n  maxBodyBytes: 1048576\n")
		objs := render(t, []string{redisValues, extprocValues, values})
		// The ext_proc server reads a body: source's body up to
		// proxy.maxBodyBytes; nothing else of proxy.* is mode serve's.
		if got := configFile(t, objs)["proxy"]; !reflect.DeepEqual(got, map[string]any{"maxBodyBytes": int64(1048576)}) {
			t.Errorf("config proxy %v, want maxBodyBytes 1048576 alone", got)
		}
		cfg := loadRendered(t, objs, config.CommandServe)
		if want := map[string]string{"model": "header:x-ai-eg-model"}; !maps.Equal(cfg.Identity.Pools, want) {
			t.Errorf("limiter serve reads identity.pools %v, want %v", cfg.Identity.Pools, want)
		}
		if cfg.Proxy.MaxBodyBytes != 1048576 {
			t.Errorf("limiter serve reads proxy.maxBodyBytes %d, want 1048576", cfg.Proxy.MaxBodyBytes)
		}
	})
	t.Run("the ext_proc server without pools", func(t *testing.T) {
		identity, _ := configFile(t, render(t, []string{redisValues, extprocValues}))["identity"].(map[string]any)
		if pools, ok := identity["pools"].(map[string]any); !ok || len(pools) != 0 {
			t.Errorf("config identity.pools %v, want {}", identity["pools"])
		}
	})
	t.Run("mode serve without the ext_proc server", func(t *testing.T) {
		file := configFile(t, render(t, []string{redisValues}))
		for _, key := range []string{"identity", "proxy"} {
			if v, ok := file[key]; ok {
				t.Errorf("mode serve without extproc.enabled renders %s %v, which nothing reads", key, v)
			}
		}
	})
}

// Values the limiter would refuse (subtest names hold no comma: helm
// splits --values on commas, and the values file is in t.TempDir), or that would refuse every request,
// fail `helm template` naming the value.
func TestIdentityPoolsRefusals(t *testing.T) {
	const proxyMode = "mode: proxy\nproxy:\n  upstream: http://v:8000\n"
	for _, tc := range []struct {
		name   string
		values string
		want   []string
	}{
		{"a body limit below 1 KiB", proxyMode + "  maxBodyBytes: 10\n",
			[]string{"at '/proxy/maxBodyBytes': minimum: got 10, want 1,024"}},
		{"a body limit above 256 MiB", proxyMode + "  maxBodyBytes: 268435457\n",
			[]string{"at '/proxy/maxBodyBytes': maximum"}},
		{"a body limit that is no number", proxyMode + "  maxBodyBytes: 8MiB\n",
			[]string{"at '/proxy/maxBodyBytes': got string, want integer"}},
		{"an unknown source kind", proxyMode + "identity:\n  pools: {model: \"json:model\"}\n",
			[]string{"at '/identity/pools/model'", "does not match pattern"}},
		{"a source without a name", proxyMode + "identity:\n  pools: {model: \"body:\"}\n",
			[]string{"at '/identity/pools/model'", "does not match pattern"}},
		{"a constant key outside the key charset", proxyMode + "identity:\n  pools: {region: \"value:eu west\"}\n",
			[]string{"at '/identity/pools/region'", "does not match pattern"}},
		{"a pool name in capitals", proxyMode + "identity:\n  pools: {Model: \"body:model\"}\n",
			[]string{"invalid propertyName 'Model'"}},
		{"more pools than an acquire may join", proxyMode + "identity:\n  pools: {a: \"value:a\", b: \"value:b\", c: \"value:c\", d: \"value:d\", e: \"value:e\"}\n",
			[]string{"at '/identity/pools': maxProperties"}},
		{"pools where nothing reads them", "identity:\n  pools: {model: \"body:model\"}\n",
			[]string{"identity.pools is read by mode proxy and by the ext_proc server (extproc.enabled) only"}},
		{"pools with the static tier source", proxyMode + "tiers:\n  source: static\nidentity:\n  pools: {model: \"body:model\"}\n",
			[]string{"identity.pools (model) needs tiers.source kubernetes"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, err := runHelm(t, templateArgs([]string{redisValues, writeValues(t, tc.values)})...)
			if err == nil {
				t.Fatalf("helm template accepted %q", tc.values)
			}
			for _, want := range tc.want {
				if !strings.Contains(stderr, want) {
					t.Errorf("helm's error does not say %q:\n%s", want, stderr)
				}
			}
		})
	}
}
