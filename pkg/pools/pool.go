// Package pools holds the pools the limiter enforces: caps on concurrent
// streams shared by every user whose streams join them (per model, per
// organisation), each key of a pool a cap of its own; and the atomic table
// the request path reads them from.
package pools

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/tiers"
)

// Bounds of a pool's fields.
const (
	// MaxKeys bounds the keys a pool lists with caps of their own: the
	// table is read on every acquire, and a longer list belongs in a pool
	// of its own or a default cap.
	MaxKeys = 1000
	// MaxConcurrentStreams is the largest cap of one pool key. Every stream
	// of the key is a member of one sorted set on one Redis thread; the
	// listing of a key's holders reads every member.
	MaxConcurrentStreams = 100_000
	// MaxMaxWait is the longest maxWait accepted, as for tiers.
	MaxMaxWait = tiers.MaxMaxWait
)

// Pool is one named cap shared by many users: each key of the pool
// (model=gpt-4o, org=acme) may hold at most its limit of streams at once,
// whoever's they are.
type Pool struct {
	// Pool names the pool; acquires name it ("pools": {"model": ...}).
	// Required: [a-z0-9][a-z0-9._-]*, at most 63 characters.
	Pool string
	// MaxConcurrentStreams is the cap of each key that Keys does not list.
	// Nil: such keys are not capped, and joining them costs nothing.
	MaxConcurrentStreams *int
	// Keys are the keys with a cap of their own: key → cap (>= 0; 0 = no
	// stream may join the key). At most MaxKeys entries.
	Keys map[string]int
	// MaxWait is how long an acquire may wait for a key of this pool to
	// free up; the request's wait is capped by it. Default 0: no waiting.
	MaxWait time.Duration
	// FailureMode applies when the shard of a key does not answer in time.
	// Default Open.
	FailureMode tiers.FailureMode
	// Enforce, false, puts the pool in shadow mode (DESIGN §18): its caps
	// decide and count every membership as usual but never refuse one; a
	// stream a key would refuse joins it all the same and is said to
	// (would_refuse pool_limit_reached). Nil (the default) or true: the
	// caps refuse.
	Enforce *bool
}

// Enforced reports whether the pool's caps refuse (Enforce unset or
// true), rather than only saying what they would refuse.
func (p Pool) Enforced() bool { return p.Enforce == nil || *p.Enforce }

// OutageMode is the failure mode that answers when a key's shard does
// not: the pool's FailureMode, or Open in shadow mode, whose caps refuse
// no one (see tiers.Tier.OutageMode).
func (p Pool) OutageMode() tiers.FailureMode {
	if !p.Enforced() {
		return tiers.FailOpen
	}
	return p.FailureMode
}

// Name is the pool's key in a Table: its name.
func (p Pool) Name() string { return p.Pool }

// Limit returns the cap of key: its own, else the pool's default; false
// when the key is not capped.
func (p Pool) Limit(key string) (int, bool) {
	if limit, ok := p.Keys[key]; ok {
		return limit, true
	}
	if p.MaxConcurrentStreams != nil {
		return *p.MaxConcurrentStreams, true
	}
	return 0, false
}

// WithDefaults returns p with its zero-valued optional fields set to their
// defaults.
func (p Pool) WithDefaults() Pool {
	if p.FailureMode == "" {
		p.FailureMode = tiers.DefaultFailureMode
	}
	return p
}

// Problems returns every field of p that is out of bounds; none when p is
// valid. Keys are reported in order, so the answer does not change from
// one call to the next.
func (p Pool) Problems() []*tiers.FieldError {
	var out []*tiers.FieldError
	add := func(field, problem, got string) {
		out = append(out, &tiers.FieldError{Field: field, Problem: problem, Got: got})
	}
	switch {
	case p.Pool == "":
		add("pool", "is required", "")
	case keys.ValidatePoolName(p.Pool) != nil:
		add("pool", fmt.Sprintf("must be 1-%d characters of [a-z0-9._-], starting with a letter or digit", keys.MaxPoolNameLength), strconv.Quote(p.Pool))
	}
	if m := p.MaxConcurrentStreams; m != nil && (*m < 0 || *m > MaxConcurrentStreams) {
		add("maxConcurrentStreams", fmt.Sprintf("must be between 0 and %d", MaxConcurrentStreams), strconv.Itoa(*m))
	}
	if len(p.Keys) > MaxKeys {
		add("keys", fmt.Sprintf("must list at most %d keys", MaxKeys), strconv.Itoa(len(p.Keys)))
	}
	names := make([]string, 0, len(p.Keys))
	for key := range p.Keys {
		names = append(names, key)
	}
	slices.Sort(names)
	for _, key := range names {
		if keys.ValidatePoolKey(key) != nil {
			add("keys", fmt.Sprintf("each key must be 1-%d bytes of [A-Za-z0-9._:/@-]", keys.MaxPoolKeyBytes), strconv.Quote(key))
		} else if limit := p.Keys[key]; limit < 0 || limit > MaxConcurrentStreams {
			add("keys."+key, fmt.Sprintf("must be between 0 and %d", MaxConcurrentStreams), strconv.Itoa(limit))
		}
	}
	if p.FailureMode != tiers.FailOpen && p.FailureMode != tiers.FailClosed {
		add("failureMode", "must be Open or Closed", strconv.Quote(string(p.FailureMode)))
	}
	if p.MaxWait < 0 || p.MaxWait > MaxMaxWait {
		add("maxWait", fmt.Sprintf("must be between 0s (no waiting) and %s", MaxMaxWait), p.MaxWait.String())
	}
	return out
}

// Validate reports every field of p that is out of bounds (Problems),
// naming the field, the value and what is allowed.
func (p Pool) Validate() error {
	problems := p.Problems()
	if len(problems) == 0 {
		return nil
	}
	errs := make([]error, len(problems))
	for i, e := range problems {
		errs[i] = e
	}
	return fmt.Errorf("pool %q: %w", p.Pool, errors.Join(errs...))
}

// Table is the set of pools in force, by name (see tiers.Catalog).
type Table = tiers.Catalog[Pool]

// NewTable returns an empty table that has not synced yet.
func NewTable() *Table { return tiers.NewCatalog[Pool]() }
