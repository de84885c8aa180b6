package controller

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// seenSpecs is the newest valid spec this replica saw of each object, by
// UID. An object's last valid spec is in force while its current one is
// invalid; status.acceptedSpec records it, but only once the elected
// replica has written status for it, which takes a moment, and longer
// while no replica holds the Lease. An invalid edit that follows a valid
// one within that time would put back an older generation than the one
// every replica enforced. So until status records the elected replica's
// judgement of the current generation, a replica falls back on the
// newest valid spec it saw itself, and the elected one records that
// (see definitionOf).
type seenSpecs[S any] struct {
	mu sync.Mutex
	by map[types.UID]seenSpec[S]
}

type seenSpec[S any] struct {
	generation int64
	spec       *S // a copy, never changed
}

// note records spec, valid, as uid's of generation, when it is newer than
// the one seen before.
func (m *seenSpecs[S]) note(uid types.UID, generation int64, spec *S) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.by == nil {
		m.by = map[types.UID]seenSpec[S]{}
	}
	if s, ok := m.by[uid]; !ok || s.generation < generation {
		m.by[uid] = seenSpec[S]{generation: generation, spec: spec}
	}
}

// get returns the newest valid spec seen of uid.
func (m *seenSpecs[S]) get(uid types.UID) (seenSpec[S], bool) {
	if m == nil {
		return seenSpec[S]{}, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.by[uid]
	return s, ok
}

// keep forgets the objects not in live (deleted).
func (m *seenSpecs[S]) keep(live map[types.UID]bool) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for uid := range m.by {
		if !live[uid] {
			delete(m.by, uid)
		}
	}
}
