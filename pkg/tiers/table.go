package tiers

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// Table is the set of tiers in force. Lookups are lock-free (one atomic
// load); writers replace the whole snapshot, so a reader never sees half an
// update.
type Table struct {
	snapshot atomic.Pointer[map[string]Tier]
	// retired holds the last definition of every plan removed from the
	// table, for the slots still held under it (see LookupHeld).
	retired atomic.Pointer[map[string]Tier]
	mu      sync.Mutex // serialises Replace
	synced  chan struct{}
	once    sync.Once
}

// NewTable returns an empty table that has not synced yet.
func NewTable() *Table {
	t := &Table{synced: make(chan struct{})}
	empty, none := map[string]Tier{}, map[string]Tier{}
	t.snapshot.Store(&empty)
	t.retired.Store(&none)
	return t
}

// Replace validates tiers and, when every one is valid and no plan appears
// twice, makes them the table's contents and marks the table synced. On
// error the table is unchanged.
func (t *Table) Replace(tiers []Tier) error {
	next := make(map[string]Tier, len(tiers))
	for _, tier := range tiers {
		if err := tier.Validate(); err != nil {
			return err
		}
		if _, dup := next[tier.Plan]; dup {
			return fmt.Errorf("tier %q: plan is defined twice", tier.Plan)
		}
		next[tier.Plan] = tier
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	retired := map[string]Tier{}
	for plan, tier := range *t.retired.Load() {
		if _, back := next[plan]; !back {
			retired[plan] = tier
		}
	}
	for plan, tier := range *t.snapshot.Load() {
		if _, kept := next[plan]; !kept {
			retired[plan] = tier
		}
	}
	t.retired.Store(&retired)
	t.snapshot.Store(&next)
	t.once.Do(func() { close(t.synced) })
	return nil
}

// Lookup returns the tier of plan.
func (t *Table) Lookup(plan string) (Tier, bool) {
	tier, ok := (*t.snapshot.Load())[plan]
	return tier, ok
}

// LookupHeld returns the tier that governs slots already held under plan:
// the tier in force, or, for a plan since removed, its last definition.
// Limits apply at acquire time; a slot taken under a plan that is later
// deleted keeps its TTL and may be heartbeated until it is released.
func (t *Table) LookupHeld(plan string) (Tier, bool) {
	if tier, ok := t.Lookup(plan); ok {
		return tier, true
	}
	tier, ok := (*t.retired.Load())[plan]
	return tier, ok
}

// List returns every tier, ordered by plan.
func (t *Table) List() []Tier {
	snap := *t.snapshot.Load()
	out := make([]Tier, 0, len(snap))
	for _, tier := range snap {
		out = append(out, tier)
	}
	slices.SortFunc(out, func(a, b Tier) int { return strings.Compare(a.Plan, b.Plan) })
	return out
}

// Len returns the number of tiers in force.
func (t *Table) Len() int { return len(*t.snapshot.Load()) }

// Synced is closed once the table has been filled for the first time.
func (t *Table) Synced() <-chan struct{} { return t.synced }

// IsSynced reports whether the table has been filled at least once.
func (t *Table) IsSynced() bool {
	select {
	case <-t.synced:
		return true
	default:
		return false
	}
}
