package keys_test

import (
	"errors"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"

	"github.com/joishi/limiter/pkg/keys"
)

func TestPoolKey(t *testing.T) {
	schema := keys.Schema{Prefix: "p:"}
	for _, tc := range []struct {
		name, pool, key, want string
		err                   error
	}{
		{"a model name is a key", "model", "meta-llama/Llama-3.1-70B-Instruct", "p:pool:{model=meta-llama/Llama-3.1-70B-Instruct}", nil},
		{"an organisation id with ':' and '@' is a key", "org", "acme:eu@1", "p:pool:{org=acme:eu@1}", nil},
		{"128 bytes is the longest key", "model", strings.Repeat("k", 128), "p:pool:{model=" + strings.Repeat("k", 128) + "}", nil},
		{"129 bytes is one too many", "model", strings.Repeat("k", 129), "", keys.ErrInvalidPoolKey},
		{"a brace would move the hash tag", "model", "a}b", "", keys.ErrInvalidPoolKey},
		{"a ';' would break the stream's record", "model", "a;b", "", keys.ErrInvalidPoolKey},
		{"a ',' would break the stream's record", "model", "a,b", "", keys.ErrInvalidPoolKey},
		{"whitespace is refused", "model", "gpt 4o", "", keys.ErrInvalidPoolKey},
		{"an empty key is refused", "model", "", "", keys.ErrInvalidPoolKey},
		{"an upper-case pool name is refused", "Model", "x", "", keys.ErrInvalidPool},
		{"'=' in a pool name is refused", "a=b", "x", "", keys.ErrInvalidPool},
		{"63 characters is the longest pool name", strings.Repeat("p", 63), "x", "p:pool:{" + strings.Repeat("p", 63) + "=x}", nil},
		{"64 characters is one too many", strings.Repeat("p", 64), "x", "", keys.ErrInvalidPool},
		{"a pool name starts with a letter or digit", "-model", "x", "", keys.ErrInvalidPool},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := schema.PoolKey(tc.pool, tc.key)
			if got != tc.want || !errors.Is(err, tc.err) {
				t.Errorf("PoolKey(%q, %q) = %q, %v; want %q, %v", tc.pool, tc.key, got, err, tc.want, tc.err)
			}
		})
	}
}

// TestPoolKeysNeverMeetUserKeys: a pool key is no user's key, however the
// user id is chosen, and its own keys are read as a user's are.
func TestPoolKeysNeverMeetUserKeys(t *testing.T) {
	schema := keys.Schema{}
	pool, _ := schema.PoolKey("model", "gpt-4o")
	for _, user := range []string{"pool:", "model=gpt-4o", "pool:{model=gpt-4o"} {
		if u, err := schema.UserKey(user); err == nil && u == pool {
			t.Errorf("user %q has the pool key %q", user, pool)
		}
	}
	if !keys.IsQueue(keys.Queue(pool)) || !keys.IsOverride(keys.Override(pool)) {
		t.Errorf("a pool key's queue and override are not read as such: %q, %q", keys.Queue(pool), keys.Override(pool))
	}
}

// TestPoolNamesAndKeysAreCheckedAsTheirPatternsSay: the byte-wise checks
// of a pool's name and key answer as the patterns the docs and the CRD
// state, on every string of up to two bytes, on each length bound ± 1 and
// on random strings of the bytes that matter.
func TestPoolNamesAndKeysAreCheckedAsTheirPatternsSay(t *testing.T) {
	namePattern := regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)
	keyPattern := regexp.MustCompile(`^[A-Za-z0-9._:/@-]{1,128}$`)
	schema := keys.Schema{}
	check := func(s string) {
		t.Helper()
		if got, want := keys.ValidatePoolName(s) == nil, namePattern.MatchString(s); got != want {
			t.Errorf("ValidatePoolName(%q) accepts: %v, the pattern: %v", s, got, want)
		}
		if got, want := keys.ValidatePoolKey(s) == nil, keyPattern.MatchString(s); got != want {
			t.Errorf("ValidatePoolKey(%q) accepts: %v, the pattern: %v", s, got, want)
		}
		_, err := schema.PoolKey("model", s)
		if got, want := err == nil, keyPattern.MatchString(s); got != want {
			t.Errorf("PoolKey(model, %q) accepts: %v, the pattern: %v", s, got, want)
		}
	}
	check("")
	for a := range 256 {
		check(string([]byte{byte(a)}))
		for b := range 256 {
			check(string([]byte{byte(a), byte(b)}))
		}
	}
	for _, n := range []int{62, 63, 64, 127, 128, 129} {
		check(strings.Repeat("a", n))
		check(strings.Repeat("a", n-1) + "/")
		check("-" + strings.Repeat("a", n-1))
	}
	good := []byte("az09AZ._-:/@")
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20000 { // of good bytes, half of them with one byte of any value
		b := make([]byte, 1+rng.IntN(135))
		for i := range b {
			b[i] = good[rng.IntN(len(good))]
		}
		if rng.IntN(2) == 0 {
			b[rng.IntN(len(b))] = byte(rng.IntN(256))
		}
		check(string(b))
	}
}

func BenchmarkPoolKey(b *testing.B) {
	schema := keys.Schema{}
	for b.Loop() {
		if _, err := schema.PoolKey("model", "meta-llama/Llama-3.1-70B-Instruct"); err != nil {
			b.Fatal(err)
		}
	}
}

// PoolOf reads the pool back from any PoolKey of its schema, and from
// nothing else: a user's key (whose id may spell "pool:model=k"), another
// prefix's pool key, a key with no pool name.
func TestPoolOfReadsThePoolOfAPoolKey(t *testing.T) {
	for _, k := range []keys.Schema{{}, {Prefix: "app:"}} {
		for _, c := range [][2]string{{"model", "gpt-4o"}, {"a.b_c-9", "meta-llama/Llama-3.1-70B-Instruct"}, {"org", "a:b@c"}} {
			slots, err := k.PoolKey(c[0], c[1])
			if err != nil {
				t.Fatal(err)
			}
			if pool, ok := k.PoolOf(slots); !ok || pool != c[0] {
				t.Errorf("prefix %q: PoolOf(%q) = %q, %v; want %q", k.Prefix, slots, pool, ok, c[0])
			}
		}
		user, err := k.UserKey("pool:model=gpt-4o")
		if err != nil {
			t.Fatal(err)
		}
		other, _ := keys.Schema{Prefix: "other:"}.PoolKey("model", "k")
		for _, notPool := range []string{user, other, k.Prefix + "pool:{=k}", k.Prefix + "pool:{model}"} {
			if pool, ok := k.PoolOf(notPool); ok {
				t.Errorf("prefix %q: PoolOf(%q) = %q; want no pool key", k.Prefix, notPool, pool)
			}
		}
	}
}
