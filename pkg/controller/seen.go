package controller

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
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
//
// The informer notes each generation it delivers before the cache holds
// it (reconciler.observe), not resolve: the passes over the cache
// coalesce, and one of a namespace of large LimitPools takes long enough
// for a valid edit and the invalid one after it to arrive during it, so
// a pass would only ever see the invalid one.
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

// forget forgets uid (deleted).
func (m *seenSpecs[S]) forget(uid types.UID) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.by, uid)
}

// observe notes obj's spec when it is valid. The informer calls it on
// every object it receives, before the cache (and so any pass over it)
// holds that object, and may call it twice on one: noting is idempotent.
// It returns obj unchanged.
func (r *reconciler[O, S, E]) observe(obj any) (any, error) {
	if o, ok := obj.(O); ok {
		if _, err := toEntry(r.k, o.GetName(), r.k.spec(o)); err == nil {
			r.seen.note(o.GetUID(), o.GetGeneration(), r.k.spec(o.DeepCopyObject().(O)))
		}
	}
	return obj, nil
}

// forget drops the spec noted of obj, an object the informer deleted
// (or its tombstone, when the watch missed the deletion). Not a pass over
// the cache: one that listed the namespace just before observe noted a
// new object would forget it.
func (r *reconciler[O, S, E]) forget(obj any) {
	if tombstone, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = tombstone.Obj
	}
	if o, ok := obj.(client.Object); ok {
		r.seen.forget(o.GetUID())
	}
}
