package config

import (
	"reflect"
	"strings"
	"time"
)

// EnvPrefix starts every environment variable of a key.
const EnvPrefix = "LIMITER_"

// key is one leaf of Config: a value that the file, the environment or a
// flag can set.
type key struct {
	// name is the dotted path of mapstructure tags, e.g. "redis.keyPrefix".
	name  string
	index []int
	typ   reflect.Type
}

// configKeys lists every leaf of Config, in declaration order. Deriving them from
// the struct keeps the file schema, the environment and the flags from
// drifting apart.
func configKeys() []key {
	var out []key
	var walk func(t reflect.Type, prefix string, index []int)
	walk = func(t reflect.Type, prefix string, index []int) {
		for i := range t.NumField() {
			f := t.Field(i)
			name := prefix + f.Tag.Get("mapstructure")
			idx := append(append([]int(nil), index...), i)
			if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeFor[time.Duration]() {
				walk(f.Type, name+".", idx)
				continue
			}
			out = append(out, key{name: name, index: idx, typ: f.Type})
		}
	}
	walk(reflect.TypeFor[Config](), "", nil)
	return out
}

// lookupKey returns the key named name, compared case-insensitively (viper
// lower-cases file keys).
func lookupKey(name string) (key, bool) {
	for _, k := range configKeys() {
		if strings.EqualFold(k.name, name) {
			return k, true
		}
	}
	return key{}, false
}

// field returns the field of c that k names.
func (k key) field(c *Config) reflect.Value {
	return reflect.ValueOf(c).Elem().FieldByIndex(k.index)
}

// EnvVar returns the environment variable of a key: LIMITER_ then the key
// in upper case with '.' turned into '_' (redis.keyPrefix →
// LIMITER_REDIS_KEYPREFIX).
func EnvVar(key string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

// sectionKeys returns the keys under section ("redis.tls" → redis.tls.*).
func sectionKeys(names []string, section string) []string {
	var out []string
	for _, n := range names {
		if len(n) > len(section) && strings.EqualFold(n[:len(section)+1], section+".") {
			out = append(out, n)
		}
	}
	return out
}

// nearestKey returns the key most like name, when one is close enough to be
// a likely typo ("redis.key_prefix", "redis.keyprefx" → redis.keyPrefix).
func nearestKey(names []string, name string) string {
	if i, ok := nearest(names, name); ok {
		return names[i]
	}
	return ""
}

// nearest returns the index of the name most like name, ignoring case, '_'
// and '-', when it is at most two edits away (more is not a typo); the
// first of equals.
func nearest(names []string, name string) (int, bool) {
	norm := strings.NewReplacer("_", "", "-", "")
	target := norm.Replace(strings.ToLower(name))
	best, bestDist := -1, 3
	for i, n := range names {
		if d := editDistance(norm.Replace(strings.ToLower(n)), target); d < bestDist {
			best, bestDist = i, d
		}
	}
	return best, best >= 0
}

// editDistance is the Levenshtein distance of a and b (bytes).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
