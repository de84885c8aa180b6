package config

import "github.com/joishi/limiter/pkg/pools"

// Pools are the caps shared by many users (per model, per organisation).
type Pools struct {
	// Static is the pool list: each pool's name, the cap of each of its
	// keys, its maxWait and failure mode (see pools.Pool). Zero optional
	// fields take the pool defaults. A key's case is kept: the list is
	// read from the file as written (lists.go), not through viper, which
	// lower-cases keys. Default none: acquires may name no pool.
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

func (c Config) validateStaticPools(v *validator) {
	validateStatic(v, "pools.static", "pool", c.StaticPools())
}
