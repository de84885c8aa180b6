package controller

import (
	"cmp"
	"context"
	"fmt"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/joishi/limiter/api/v1alpha1"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/tiers"
)

// poolKind serves LimitPools into a pools.Table: each object is one
// pool's caps.
type poolKind struct{}

func (poolKind) name() string                   { return "LimitPool" }
func (poolKind) claim() string                  { return "pool" }
func (poolKind) newObject() *v1alpha1.LimitPool { return &v1alpha1.LimitPool{} }

func (poolKind) list(ctx context.Context, r client.Reader, ns string) ([]*v1alpha1.LimitPool, error) {
	var list v1alpha1.LimitPoolList
	if err := r.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	out := make([]*v1alpha1.LimitPool, len(list.Items))
	for i := range list.Items {
		out[i] = &list.Items[i]
	}
	return out, nil
}

func (poolKind) spec(lp *v1alpha1.LimitPool) *v1alpha1.LimitPoolSpec { return &lp.Spec }
func (poolKind) specClaim(spec *v1alpha1.LimitPoolSpec) string       { return spec.Pool }

// entry applies the defaults of a pool of pools.static
// (pools.Pool.WithDefaults). It copies what it reads, so the entry shares
// no memory with the object (the informer's cache hands out copies, but
// the table outlives them).
func (poolKind) entry(pool string, spec *v1alpha1.LimitPoolSpec) pools.Pool {
	p := pools.Pool{
		Pool:        pool,
		FailureMode: tiers.FailureMode(spec.FailureMode),
	}
	if m := spec.MaxConcurrentStreams; m != nil {
		limit := int(*m)
		p.MaxConcurrentStreams = &limit
	}
	if len(spec.Keys) > 0 {
		p.Keys = make(map[string]int, len(spec.Keys))
		for key, limit := range spec.Keys {
			p.Keys[key] = int(limit)
		}
	}
	if spec.MaxWait != nil {
		p.MaxWait = spec.MaxWait.Duration
	}
	p.Enforce = enforce(spec.Enforce)
	return p.WithDefaults()
}

// describe is "100 concurrent streams per key, 2 keys with a cap of their
// own", or "keys not listed are not capped, ..." without a default cap;
// then shadowNote for a pool in shadow mode.
func (poolKind) describe(p pools.Pool) string {
	var parts []string
	switch m := p.MaxConcurrentStreams; {
	case m == nil:
		parts = append(parts, "keys not listed are not capped")
	case *m == 1:
		parts = append(parts, "1 concurrent stream per key")
	default:
		parts = append(parts, fmt.Sprintf("%d concurrent streams per key", *m))
	}
	switch n := len(p.Keys); n {
	case 0:
	case 1:
		parts = append(parts, "1 key with a cap of its own")
	default:
		parts = append(parts, fmt.Sprintf("%d keys with a cap of their own", n))
	}
	return strings.Join(parts, ", ") + shadowNote(p.Enforced())
}

func (poolKind) status(lp *v1alpha1.LimitPool) statusFields[v1alpha1.LimitPoolSpec] {
	s := &lp.Status
	return statusFields[v1alpha1.LimitPoolSpec]{&s.ObservedGeneration, &s.AcceptedSpec, &s.AcceptedGeneration, &s.Conditions}
}

// show writes the pool, how many keys the spec lists and its maxWait, for
// kubectl's Pool, Keys and Wait columns.
func (poolKind) show(lp *v1alpha1.LimitPool, v verdict) {
	s := &lp.Status
	s.Pool = v.claim
	s.KeyCount = int32(len(lp.Spec.Keys))
	var wait string
	if lp.Spec.MaxWait != nil {
		wait = formatDuration(lp.Spec.MaxWait.Duration)
	}
	s.MaxWait = cmp.Or(wait, "0s")
}
