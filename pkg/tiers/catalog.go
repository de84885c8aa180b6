package tiers

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// Entry is what a Catalog holds: a named, validated definition (a Tier,
// a pools.Pool).
type Entry interface {
	// Name is the entry's key in the catalog: a tier's plan, a pool's name.
	Name() string
	// Validate reports every field out of bounds.
	Validate() error
}

// Catalog is the set of entries in force, by name. Lookups are lock-free
// (one atomic load); writers replace the whole contents, so a reader never
// sees half an update. Tiers and pools are read alike: one catalog type
// serves both.
type Catalog[T Entry] struct {
	// contents are swapped whole, the entries in force and the retired
	// together: a reader of both (LookupHeld) never sees an entry put back
	// in neither.
	contents atomic.Pointer[contents[T]]
	mu       sync.Mutex // serialises Replace
	synced   chan struct{}
	once     sync.Once
	// changed is closed by the next Replace, which stores a new one (see
	// Changed).
	changed atomic.Pointer[chan struct{}]
}

// contents is one state of a Catalog.
type contents[T Entry] struct {
	inForce map[string]T
	// retired holds the last definition of every entry removed from the
	// catalog, for what is still held under it (see LookupHeld).
	retired map[string]T
}

// NewCatalog returns an empty catalog that has not synced yet.
func NewCatalog[T Entry]() *Catalog[T] {
	c := &Catalog[T]{synced: make(chan struct{})}
	c.contents.Store(&contents[T]{inForce: map[string]T{}, retired: map[string]T{}})
	changed := make(chan struct{})
	c.changed.Store(&changed)
	return c
}

// Replace validates entries and, when every one is valid and no name
// appears twice, makes them the catalog's contents and marks it synced.
// On error the catalog is unchanged.
func (c *Catalog[T]) Replace(entries []T) error {
	next := make(map[string]T, len(entries))
	for _, e := range entries {
		if err := e.Validate(); err != nil {
			return err
		}
		if _, dup := next[e.Name()]; dup {
			return fmt.Errorf("%q is defined twice", e.Name())
		}
		next[e.Name()] = e
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	was := c.contents.Load()
	retired := map[string]T{}
	for name, e := range was.retired {
		if _, back := next[name]; !back {
			retired[name] = e
		}
	}
	for name, e := range was.inForce {
		if _, kept := next[name]; !kept {
			retired[name] = e
		}
	}
	c.contents.Store(&contents[T]{inForce: next, retired: retired})
	c.once.Do(func() { close(c.synced) })
	changed := make(chan struct{})
	close(*c.changed.Swap(&changed))
	return nil
}

// Changed returns a channel that the next Replace closes, once its
// entries are in force. A reader that acts on what it read (a loop of
// acquires waiting under a plan's limit) takes the channel before it
// reads, and reads again when the channel is closed: no change made
// after its read goes unseen.
func (c *Catalog[T]) Changed() <-chan struct{} { return *c.changed.Load() }

// Lookup returns the entry named name.
func (c *Catalog[T]) Lookup(name string) (T, bool) {
	e, ok := c.contents.Load().inForce[name]
	return e, ok
}

// LookupHeld returns the entry that governs what is already held under
// name: the entry in force, or, for one since removed, its last
// definition. Limits apply at acquire time; a slot taken under a plan
// that is later deleted keeps its TTL and may be heartbeated until it is
// released.
func (c *Catalog[T]) LookupHeld(name string) (T, bool) {
	now := c.contents.Load()
	if e, ok := now.inForce[name]; ok {
		return e, true
	}
	e, ok := now.retired[name]
	return e, ok
}

// List returns every entry, ordered by name.
func (c *Catalog[T]) List() []T {
	snap := c.contents.Load().inForce
	out := make([]T, 0, len(snap))
	for _, e := range snap {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b T) int { return strings.Compare(a.Name(), b.Name()) })
	return out
}

// Len returns the number of entries in force.
func (c *Catalog[T]) Len() int { return len(c.contents.Load().inForce) }

// Synced is closed once the catalog has been filled for the first time.
func (c *Catalog[T]) Synced() <-chan struct{} { return c.synced }

// IsSynced reports whether the catalog has been filled at least once.
func (c *Catalog[T]) IsSynced() bool {
	select {
	case <-c.synced:
		return true
	default:
		return false
	}
}
