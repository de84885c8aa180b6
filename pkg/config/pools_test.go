package config

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/pkg/tiers"
)

const poolsFile = `pools:
  static:
    - pool: model
      maxConcurrentStreams: 100
      keys: {gpt-4o: 500, meta-llama/Llama-3.1-70B-Instruct: 64}
    - pool: org
      maxWait: 10s
      failureMode: Closed
`

// TestLoadPoolsKeepsTheCaseOfTheirKeys: a pool's keys are names whose
// case matters; the file's pools.static is read as written, though every
// other key of the file is read without case.
func TestLoadPoolsKeepsTheCaseOfTheirKeys(t *testing.T) {
	cfg, err := load(t, poolsFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := cfg.StaticPools()
	if len(got) != 2 {
		t.Fatalf("pools: %+v, want model and org", got)
	}
	model, org := got[0], got[1]
	if limit, ok := model.Limit("meta-llama/Llama-3.1-70B-Instruct"); !ok || limit != 64 {
		t.Errorf("model's meta-llama/Llama-3.1-70B-Instruct: %d, %v; want its own cap of 64 (keys: %v)", limit, ok, model.Keys)
	}
	if limit, ok := model.Limit("meta-llama/llama-3.1-70b-instruct"); !ok || limit != 100 {
		t.Errorf("the lower-cased key: %d, %v; want the default cap of 100, another key", limit, ok)
	}
	if model.FailureMode != tiers.FailOpen || org.FailureMode != tiers.FailClosed || org.MaxWait != 10*time.Second || org.MaxConcurrentStreams != nil {
		t.Errorf("pools read as %+v and %+v", model, org)
	}
}

// TestLoadPoolsFromTheEnvironment: LIMITER_POOLS_STATIC holds a JSON or
// YAML list and wins over the file.
func TestLoadPoolsFromTheEnvironment(t *testing.T) {
	cfg, err := load(t, poolsFile, map[string]string{"LIMITER_POOLS_STATIC": `[{"pool":"provider","keys":{"OpenAI":64}}]`})
	if err != nil {
		t.Fatal(err)
	}
	got := cfg.StaticPools()
	if len(got) != 1 || got[0].Pool != "provider" || got[0].Keys["OpenAI"] != 64 {
		t.Errorf("pools: %+v, want the environment's provider pool with key OpenAI", got)
	}
}

func TestLoadPoolsNamesWhatIsWrong(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		want       []string
	}{
		{"a key over its bound", "pools:\n  static:\n    - pool: model\n      keys: {gpt-4o: 100001}\n",
			[]string{"pools.static[0].keys.gpt-4o: must be between 0 and 100000", "env LIMITER_POOLS_STATIC", "got 100001"}},
		{"a pool defined twice", "pools:\n  static:\n    - pool: model\n    - pool: model\n",
			[]string{`pools.static[1].pool: "model" is already defined by pools.static[0]`}},
		{"an unknown field", "pools:\n  static:\n    - pool: model\n      maxConcurentStreams: 3\n",
			[]string{"pools.static", "maxConcurentStreams"}},
		{"a maxWait with no unit", "pools:\n  static:\n    - pool: model\n      maxWait: 10\n",
			[]string{"pools.static", "has no unit"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := load(t, tc.file, nil)
			if err == nil || !errors.Is(err, ErrInvalid) {
				t.Fatalf("Load: %v, want ErrInvalid", err)
			}
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Load: %v; want it to say %q", err, want)
				}
			}
		})
	}
}

// A misspelt field of a tier or pool is named as written, with where it
// was written (the file's line, or the environment variable) and the
// field meant.
func TestLoadNamesMisspeltListFields(t *testing.T) {
	cases := []struct {
		name string
		file string
		env  map[string]string
		want string // %s is the file's path
	}{
		{"a tier's field in the file",
			"tiers:\n  static:\n    - plan: free\n      maxConcurrentStreams: 1\n    - plan: paid\n      maxConcurentStreams: 3\n", nil,
			`tiers.static[1]: unknown field "maxConcurentStreams" (%s line 6); did you mean "maxConcurrentStreams"?`},
		{"a tier's field in the environment", "",
			map[string]string{"LIMITER_TIERS_STATIC": `[{"plan":"free","slotTtl":"30s","failuremode":"Closed","maxConcurentStreams":1}]`},
			`tiers.static[0]: unknown field "maxConcurentStreams" (env LIMITER_TIERS_STATIC); did you mean "maxConcurrentStreams"?`},
		{"a pool's field in the file", poolsFile + "    - pool: provider\n      kyes: {OpenAI: 64}\n", nil,
			`pools.static[2]: unknown field "kyes" (%s line 10); did you mean "keys"?`},
		{"a pool's field in the environment", poolsFile,
			map[string]string{"LIMITER_POOLS_STATIC": "- pool: model\n  maxWiat: 5s\n"},
			`pools.static[0]: unknown field "maxWiat" (env LIMITER_POOLS_STATIC); did you mean "maxWait"?`},
		{"a field of a merged anchor", "tiers:\n  static:\n    - &base\n      plan: free\n      maxConcurrentStream: 1\n    - <<: *base\n      plan: paid\n", nil,
			`tiers.static[0]: unknown field "maxConcurrentStream" (%s line 5); did you mean "maxConcurrentStreams"?`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { wantLoadError(t, tc.file, tc.env, tc.want) })
	}
}

// A field of a pool or tier set twice, in the environment's JSON (whose
// reader keeps the last) or in another case (names match without case),
// is refused with both spellings and where: the cap in force would not be
// the one a reader of the first sees. A merged anchor's field that the
// entry overrides is not set twice.
func TestLoadRefusesAListFieldSetTwice(t *testing.T) {
	cases := []struct {
		name string
		file string
		env  map[string]string
		want string // %s is the file's path
	}{
		{"a pool's cap in the environment", "",
			map[string]string{"LIMITER_POOLS_STATIC": `[{"pool":"model","maxConcurrentStreams":1,"maxConcurrentStreams":100}]`},
			`pools.static[0].maxConcurrentStreams: is set twice ("maxConcurrentStreams", then "maxConcurrentStreams"): write each field once (env LIMITER_POOLS_STATIC)`},
		{"a pool's name in the environment", "",
			map[string]string{"LIMITER_POOLS_STATIC": `[{"pool":"model","keys":{"gpt-4o":1},"pool":"org"}]`},
			`pools.static[0].pool: is set twice ("pool", then "pool")`},
		{"a pool's cap in another case in the file", "pools:\n  static:\n    - pool: model\n      maxConcurrentStreams: 1\n      MaxConcurrentStreams: 100\n", nil,
			`pools.static[0].maxConcurrentStreams: is set twice ("maxConcurrentStreams", then "MaxConcurrentStreams"): write each field once (%s line 5)`},
		{"a tier's cap in the environment", "",
			map[string]string{"LIMITER_TIERS_STATIC": `[{"plan":"free","maxConcurrentStreams":1,"maxconcurrentstreams":3}]`},
			`tiers.static[0].maxConcurrentStreams: is set twice ("maxConcurrentStreams", then "maxconcurrentstreams")`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { wantLoadError(t, tc.file, tc.env, tc.want) })
	}
	cfg, err := load(t, "pools:\n  static:\n    - &base\n      pool: model\n      maxConcurrentStreams: 1\n    - <<: *base\n      pool: org\n      maxConcurrentStreams: 2\n", nil)
	if err != nil || len(cfg.StaticPools()) != 2 || *cfg.StaticPools()[1].MaxConcurrentStreams != 2 {
		t.Errorf("a pool overriding a merged anchor's name and cap: %+v, %v; want org capped at 2", cfg.StaticPools(), err)
	}
}

// wantLoadError loads file (none when "") and env, and wants ErrInvalid
// saying want, in which %s is the file's path.
func wantLoadError(t *testing.T, file string, env map[string]string, want string) {
	t.Helper()
	path := ""
	if file != "" {
		path = writeFile(t, "limiter.yaml", file)
	}
	_, err := loadFile(t, path, env)
	if strings.Contains(want, "%s") {
		want = fmt.Sprintf(want, path)
	}
	if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), want) {
		t.Errorf("Load() = %v\nwant ErrInvalid saying %s", err, want)
	}
}

// A tier may take its fields from another's anchor (<<: *base), the keys
// of its own winning.
func TestLoadMergesTierAnchors(t *testing.T) {
	cfg, err := load(t, "tiers:\n  static:\n    - &base\n      plan: free\n      maxConcurrentStreams: 1\n      failureMode: Closed\n    - <<: *base\n      plan: paid\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	want(t, "tiers.static", cfg.StaticTiers(), []tiers.Tier{
		withDefaults(tiers.Tier{Plan: "free", MaxConcurrentStreams: 1, FailureMode: tiers.FailClosed}),
		withDefaults(tiers.Tier{Plan: "paid", MaxConcurrentStreams: 1, FailureMode: tiers.FailClosed}),
	})
}

// TestLoadPoolKeysAsWritten: a key that YAML would read as a number or a
// boolean (007, 1.10, 0x1F, 1e3, true) is the key as written, not the
// number's spelling ("7", "1.1"), which would put the cap on another key
// and leave the written one uncapped.
func TestLoadPoolKeysAsWritten(t *testing.T) {
	cfg, err := load(t, "pools:\n  static:\n    - pool: org\n      keys: {007: 3, 1.10: 5, 0x1F: 2, 1e3: 1, true: 4, -0: 6, gpt-4o: 7}\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	got := cfg.StaticPools()
	want := map[string]int{"007": 3, "1.10": 5, "0x1F": 2, "1e3": 1, "true": 4, "-0": 6, "gpt-4o": 7}
	if len(got) != 1 || !reflect.DeepEqual(got[0].Keys, want) {
		t.Errorf("keys %v, want %v", got[0].Keys, want)
	}
}

// TestLoadTiersWantTheirCapAndNoZeroTTL: a tier that leaves its cap out
// is an error naming the field and its line, not a plan whose cap of 0
// refuses every stream; a slotTTL or heartbeatInterval written as 0 is an
// error with the bounds, not the default it would silently become. Left
// out, they take their defaults; a cap written as 0 is a cap of 0.
func TestLoadTiersWantTheirCapAndNoZeroTTL(t *testing.T) {
	for _, tc := range []struct{ name, file, want string }{
		{"no cap", "tiers:\n  static:\n    - plan: free\n      slotTTL: 1m\n",
			"tiers.static[0].maxConcurrentStreams: is required: the streams one user of the plan may hold at once, 0 to 1000 (0 refuses every stream) ("},
		{"no cap, the second tier", "tiers:\n  static:\n    - plan: free\n      maxConcurrentStreams: 1\n    - plan: paid\n",
			"tiers.static[1].maxConcurrentStreams: is required"},
		{"a slotTTL of 0s", "tiers:\n  static:\n    - plan: free\n      maxConcurrentStreams: 1\n      slotTTL: 0s\n",
			"tiers.static[0].slotTTL: must be between 100ms and 24h0m0s (leave it out for the default, 2m0s) ("},
		{"a heartbeatInterval of 0", "tiers:\n  static:\n    - plan: free\n      maxConcurrentStreams: 1\n      heartbeatInterval: 0\n",
			"tiers.static[0].heartbeatInterval: must be at least 1ms and <= slotTTL/3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := load(t, tc.file, nil)
			if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "line ") {
				t.Errorf("Load: %v\nwant ErrInvalid saying %q, with the line", err, tc.want)
			}
		})
	}
	cfg, err := load(t, "tiers:\n  static:\n    - plan: free\n      maxConcurrentStreams: 0\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.StaticTiers(); len(got) != 1 || got[0].MaxConcurrentStreams != 0 || got[0].SlotTTL != 2*time.Minute {
		t.Errorf("a tier capped at 0 with no slotTTL: %+v; want a cap of 0 and the default slotTTL", got)
	}
}

// TestLoadListsWantWholeNumbers: a cap, a key's cap or a priority is a
// whole number, and enforce a boolean, as written; 0.5, true, an empty string or
// nothing is an error naming the field, never a cap of 0 or 1.
func TestLoadListsWantWholeNumbers(t *testing.T) {
	tier := "tiers:\n  static:\n    - plan: free\n      "
	pool := "pools:\n  static:\n    - pool: model\n      "
	for _, tc := range []struct{ name, file, want string }{ // want: "field: problem, got value"
		{"a tier's cap of 0.5", tier + "maxConcurrentStreams: 0.5\n", `tiers.static[0].maxConcurrentStreams: must be a whole number, got 0.5`},
		{"a tier's cap of 2.0", tier + "maxConcurrentStreams: 2.0\n", `tiers.static[0].maxConcurrentStreams: must be a whole number, got 2.0`},
		{"a tier's cap of true", tier + "maxConcurrentStreams: true\n", `tiers.static[0].maxConcurrentStreams: must be a whole number, got true`},
		{"a tier's cap of ''", tier + "maxConcurrentStreams: ''\n", `tiers.static[0].maxConcurrentStreams: must be a whole number, got ""`},
		{"a tier's cap of nothing", tier + "maxConcurrentStreams:\n", `tiers.static[0].maxConcurrentStreams: must be a whole number, got nothing`},
		{"a tier's cap past int64", tier + "maxConcurrentStreams: 9223372036854775808\n", `tiers.static[0].maxConcurrentStreams: must be a whole number, got 9223372036854775808`},
		{"a priority of 1.5", tier + "maxConcurrentStreams: 1\n      priority: 1.5\n", `tiers.static[0].priority: must be a whole number, got 1.5`},
		{"enforce of 0", tier + "maxConcurrentStreams: 1\n      enforce: 0\n", `tiers.static[0].enforce: must be true or false, got 0`},
		{"a pool's cap of 2.9", pool + "maxConcurrentStreams: 2.9\n", `pools.static[0].maxConcurrentStreams: must be a whole number, got 2.9`},
		{"a key's cap of 1.7", pool + "keys: {gpt-4o: 1.7}\n", `pools.static[0].keys.gpt-4o: must be a whole number, got 1.7`},
		{"a key's cap of true", pool + "keys: {gpt-4o: true}\n", `pools.static[0].keys.gpt-4o: must be a whole number, got true`},
		{"a key's cap of nothing", pool + "keys: {gpt-4o: }\n", `pools.static[0].keys.gpt-4o: must be a whole number, got nothing`},
		{"a key's cap of nothing, in block style", pool + "keys:\n        gpt-4o:\n", `pools.static[0].keys.gpt-4o: must be a whole number, got nothing`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := load(t, tc.file, nil)
			problem, got, _ := strings.Cut(tc.want, ", got ")
			if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), problem+" (") || !strings.HasSuffix(err.Error(), ", got "+got) {
				t.Errorf("Load: %v\nwant ErrInvalid saying %s (where), got %s", err, problem, got)
			}
		})
	}

	// What a whole number may look like: quoted as the environment's other
	// keys are, signed, in the environment's JSON; a pool's cap of nothing
	// is no cap, as when it is left out.
	cfg, err := load(t, tier+"maxConcurrentStreams: '3'\n      priority: +2\n"+
		"pools:\n  static:\n    - pool: model\n      maxConcurrentStreams: ~\n      keys: {a: 0x10}\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.StaticTiers()[0]; got.MaxConcurrentStreams != 3 || got.Priority != 2 {
		t.Errorf("tier %+v, want a cap of 3 and priority 2", got)
	}
	if got := cfg.StaticPools()[0]; got.MaxConcurrentStreams != nil || got.Keys["a"] != 16 {
		t.Errorf("pool %+v, want no default cap and a's cap of 16", got)
	}
	cfg, err = load(t, "", map[string]string{"LIMITER_POOLS_STATIC": `[{"pool":"model","maxConcurrentStreams":5,"keys":{"a":1},"enforce":false}]`})
	if got := cfg.StaticPools(); err != nil || len(got) != 1 || *got[0].MaxConcurrentStreams != 5 || got[0].Keys["a"] != 1 || got[0].Enforced() {
		t.Errorf("pools from JSON %+v, %v", got, err)
	}
}

// TestLoadPlanAndPoolNamesAsWritten: a plan or pool named in the file as
// YAML would read a number or a date (007, 1.0, 1e3, 2026-01-01) is the
// name as written, not the number's "7" or "1", which acquires naming it
// would not find; one that is no valid name as written is refused,
// naming it so.
func TestLoadPlanAndPoolNamesAsWritten(t *testing.T) {
	for _, name := range []string{"007", "1.0", "1e3", "2026-01-01", "-1"} {
		cfg, err := load(t, "tiers:\n  static:\n    - {plan: "+name+", maxConcurrentStreams: 1}\npools:\n  static:\n    - {pool: "+name+", maxConcurrentStreams: 1}\n", nil)
		if strings.HasPrefix(name, "-") {
			if err == nil || !strings.Contains(err.Error(), name) {
				t.Errorf("plan and pool %s: %v; want refused, naming %s", name, err, name)
			}
			continue
		}
		if err != nil {
			t.Errorf("plan and pool %s: %v", name, err)
			continue
		}
		if got := cfg.StaticTiers()[0].Plan; got != name {
			t.Errorf("plan written %s is %q; want %q", name, got, name)
		}
		if got := cfg.StaticPools()[0].Pool; got != name {
			t.Errorf("pool written %s is %q; want %q", name, got, name)
		}
	}
}
