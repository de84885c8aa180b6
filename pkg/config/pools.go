package config

import (
	"fmt"
	"os"
	"reflect"

	"github.com/go-viper/mapstructure/v2"
	"github.com/joishi/limiter/pkg/pools"
	"go.yaml.in/yaml/v3"
)

// Pools are the caps shared by many users (per model, per organisation).
type Pools struct {
	// Static is the pool list: each pool's name, the cap of each of its
	// keys, its maxWait and failure mode (see pools.Pool). Zero optional
	// fields take the pool defaults. Default none: acquires may name no
	// pool.
	Static []pools.Pool `mapstructure:"static"`
}

// StaticPools returns pools.static with each pool's defaults applied.
func (c Config) StaticPools() []pools.Pool {
	out := make([]pools.Pool, len(c.Pools.Static))
	for i, p := range c.Pools.Static {
		out[i] = p.WithDefaults()
	}
	return out
}

// poolListHook parses a pool list given as one string (the environment's
// form, LIMITER_POOLS_STATIC): JSON or YAML.
func poolListHook(from, to reflect.Type, data any) (any, error) {
	s, ok := data.(string)
	if !ok || to != reflect.TypeFor[[]pools.Pool]() {
		return data, nil
	}
	var list []any
	if err := yaml.Unmarshal([]byte(s), &list); err != nil {
		return nil, fmt.Errorf("want a JSON or YAML list of pools, like [{pool: model, keys: {gpt-4o: 500}}]: %w", err)
	}
	return list, nil
}

// filePools reads pools.static from the config file at path as written.
// viper lower-cases every key of the file, and a pool's keys are names
// (a model's, meta-llama/Llama-3.1-70B-Instruct) whose case matters, so
// the pool list is decoded from the file's own text. ok is false when the
// file sets no pools.static, or the environment does (it wins).
func filePools(path string) (list []pools.Pool, ok bool, err error) {
	if path == "" || os.Getenv(EnvVar("pools.static")) != "" {
		return nil, false, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, false, err
	}
	var file struct {
		Pools struct {
			Static any `yaml:"static"`
		} `yaml:"pools"`
	}
	if err := yaml.Unmarshal(data, &file); err != nil || file.Pools.Static == nil {
		return nil, false, err
	}
	dec, err := mapstructure.NewDecoder(&mapstructure.DecoderConfig{
		DecodeHook: decodeHook(), ErrorUnused: true, Result: &list,
	})
	if err != nil {
		return nil, false, err
	}
	if err := dec.Decode(file.Pools.Static); err != nil {
		return nil, false, &KeyError{Key: "pools.static", Problem: "cannot be read: " + decodeMessage(err), Err: err}
	}
	return list, true, nil
}

func (c Config) validateStaticPools(v *validator) {
	seen := map[string]int{}
	for i, p := range c.StaticPools() {
		for _, e := range p.Problems() {
			v.errs = append(v.errs, &KeyError{Key: "pools.static", Field: fmt.Sprintf("[%d].%s", i, e.Field), Problem: e.Problem, Got: e.Got, Err: e})
		}
		if first, dup := seen[p.Pool]; dup && p.Pool != "" {
			v.errs = append(v.errs, &KeyError{Key: "pools.static", Field: fmt.Sprintf("[%d].pool", i),
				Problem: fmt.Sprintf("%q is already defined by pools.static[%d]", p.Pool, first)})
		} else {
			seen[p.Pool] = i
		}
	}
}
