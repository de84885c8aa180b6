package pools_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/tiers"
)

func ptr(n int) *int { return &n }

func TestPoolLimit(t *testing.T) {
	p := pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(100), Keys: map[string]int{"gpt-4o": 500, "closed": 0}}
	for _, tc := range []struct {
		name, key string
		want      int
		capped    bool
	}{
		{"a listed key has its own cap", "gpt-4o", 500, true},
		{"a listed key may be closed", "closed", 0, true},
		{"another key has the pool's cap", "llama-70b", 100, true},
	} {
		if got, ok := p.Limit(tc.key); got != tc.want || ok != tc.capped {
			t.Errorf("%s: Limit(%q) = %d, %v; want %d, %v", tc.name, tc.key, got, ok, tc.want, tc.capped)
		}
	}
	open := pools.Pool{Pool: "org", Keys: map[string]int{"acme": 40}}
	if _, ok := open.Limit("other"); ok {
		t.Errorf("a key of a pool with no default cap is capped")
	}
}

func TestPoolProblems(t *testing.T) {
	valid := pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(100), Keys: map[string]int{"gpt-4o": 500}}.WithDefaults()
	manyKeys := map[string]int{}
	for i := range pools.MaxKeys + 1 {
		manyKeys["k"+strconv.Itoa(i)] = 1
	}
	for _, tc := range []struct {
		name string
		edit func(p *pools.Pool)
		want string // "" when valid
	}{
		{"the example is valid", func(*pools.Pool) {}, ""},
		{"a pool needs a name", func(p *pools.Pool) { p.Pool = "" }, "pool is required"},
		{"a name is lower case", func(p *pools.Pool) { p.Pool = "Model" }, `pool must be 1-63 characters of [a-z0-9._-], starting with a letter or digit, got "Model"`},
		{"the default cap is >= 0", func(p *pools.Pool) { p.MaxConcurrentStreams = ptr(-1) }, "maxConcurrentStreams must be between 0 and 100000, got -1"},
		{"the default cap is at most the bound", func(p *pools.Pool) { p.MaxConcurrentStreams = ptr(pools.MaxConcurrentStreams + 1) }, "maxConcurrentStreams must be between 0 and 100000, got 100001"},
		{"the bound itself is valid", func(p *pools.Pool) { p.MaxConcurrentStreams = ptr(pools.MaxConcurrentStreams) }, ""},
		{"no default cap is valid", func(p *pools.Pool) { p.MaxConcurrentStreams = nil }, ""},
		{"a key's cap is >= 0", func(p *pools.Pool) { p.Keys["gpt-4o"] = -1 }, "keys.gpt-4o must be between 0 and 100000, got -1"},
		{"a key is a key", func(p *pools.Pool) { p.Keys["gpt 4o"] = 1 }, `keys each key must be 1-128 bytes of [A-Za-z0-9._:/@-], got "gpt 4o"`},
		{"at most MaxKeys keys", func(p *pools.Pool) { p.Keys = manyKeys }, "keys must list at most 1000 keys, got 1001"},
		{"the failure mode is Open or Closed", func(p *pools.Pool) { p.FailureMode = "open" }, `failureMode must be Open or Closed, got "open"`},
		{"maxWait is at most a minute", func(p *pools.Pool) { p.MaxWait = 61 * time.Second }, "maxWait must be between 0s (no waiting) and 1m0s, got 1m1s"},
		{"maxWait of a minute is valid", func(p *pools.Pool) { p.MaxWait = time.Minute }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := valid
			p.Keys = map[string]int{"gpt-4o": 500}
			tc.edit(&p)
			err := p.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Validate() = %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Validate() = %v, want it to say %q", err, tc.want)
			}
		})
	}
}

func TestTableServesPoolsLikeTiers(t *testing.T) {
	table := pools.NewTable()
	if table.IsSynced() {
		t.Fatal("a new table is synced")
	}
	model := pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(2)}.WithDefaults()
	if err := table.Replace([]pools.Pool{model, model}); err == nil {
		t.Fatal("a pool defined twice was accepted")
	}
	if err := table.Replace([]pools.Pool{{Pool: "Bad"}}); err == nil {
		t.Fatal("an invalid pool was accepted")
	}
	if table.IsSynced() {
		t.Fatal("a refused replace synced the table")
	}
	if err := table.Replace([]pools.Pool{model}); err != nil || !table.IsSynced() {
		t.Fatalf("Replace: %v, synced %v", err, table.IsSynced())
	}
	if err := table.Replace(nil); err != nil {
		t.Fatal(err)
	}
	if _, ok := table.Lookup("model"); ok {
		t.Error("a removed pool is still looked up")
	}
	if got, ok := table.LookupHeld("model"); !ok || got.FailureMode != tiers.FailOpen {
		t.Errorf("LookupHeld of a removed pool = %+v, %v; want its last definition", got, ok)
	}
}
