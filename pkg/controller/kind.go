package controller

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/joishi/limiter/pkg/tiers"
)

// kind is what differs between the API kinds the controller serves:
// LimitTier (tierKind) and LimitPool (poolKind). The watch, resolve and
// the status writer are written once, over it. O is the object
// (*v1alpha1.LimitTier), S its spec, E what the limiter enforces of it
// (tiers.Tier).
type kind[O client.Object, S any, E entry] interface {
	// name is the kind, "LimitTier".
	name() string
	// claim is what an object defines and no two objects may both define,
	// "plan": the name of the spec field that sets it, and of the entry's
	// field reporting it (tiers.FieldError.Field).
	claim() string
	// newObject returns an empty object, for the informer.
	newObject() O
	// list returns the objects of namespace ns, as r holds them.
	list(ctx context.Context, r client.Reader, ns string) ([]O, error)
	// spec returns o's spec.
	spec(o O) *S
	// specClaim returns what spec claims; "" when it leaves the claim to
	// the object's metadata.name.
	specClaim(spec *S) string
	// entry reads spec as the limiter does, with claim as the entry's
	// name: the defaults of the config file's list applied, not
	// validated. The two sources of an entry then agree.
	entry(claim string, spec *S) E
	// describe says what e enforces, for the Ready message: "3 concurrent
	// streams per user".
	describe(e E) string
	// status points at the fields of o's status every kind has.
	status(o O) statusFields[S]
	// show writes into o's status what kubectl's columns read besides
	// the Ready condition, from o's spec and v.
	show(o O, v verdict)
}

// entry is what the limiter enforces of an object: a tiers.Tier or a
// pools.Pool.
type entry interface {
	tiers.Entry
	// Problems reports every field out of bounds, by its name in the
	// config file's list, which is its name under spec.
	Problems() []*tiers.FieldError
}

// statusFields point at the fields of an object's status that every kind
// has.
type statusFields[S any] struct {
	observedGeneration *int64
	acceptedSpec       **S
	acceptedGeneration *int64
	conditions         *[]metav1.Condition
}

// served is one kind the controller serves, bound to its table: what the
// watch and the status writer run for each kind, whatever its types.
type served interface {
	// kindName is the kind, "LimitTier".
	kindName() string
	// newObject returns an empty object of the kind, for the informer.
	newObject() client.Object
	// syncTable replaces the kind's table with the entries in force, when
	// they changed.
	syncTable(ctx context.Context) error
	// syncStatus updates each object whose status differs from its
	// verdict. wroteFrom is the kind's own (see writeStatus).
	syncStatus(ctx context.Context, wroteFrom map[string]string) error
	// observe is the informer's transform: it notes each object it is
	// handed, before the cache holds it (see seenSpecs).
	observe(obj any) (any, error)
	// forget drops what observe noted of obj, deleted.
	forget(obj any)
}

// reconciler serves kind k into table, for the controller c.
type reconciler[O client.Object, S any, E entry] struct {
	k     kind[O, S, E]
	table *tiers.Catalog[E]
	c     *Controller
	seen  *seenSpecs[S] // kept by the informer, read by the table's and the status's passes
}

// serve binds k to table.
func serve[O client.Object, S any, E entry](c *Controller, k kind[O, S, E], table *tiers.Catalog[E]) *reconciler[O, S, E] {
	return &reconciler[O, S, E]{k: k, table: table, c: c, seen: &seenSpecs[S]{}}
}

func (r *reconciler[O, S, E]) kindName() string         { return r.k.name() }
func (r *reconciler[O, S, E]) newObject() client.Object { return r.k.newObject() }

// list returns the namespace's objects of the kind from the cache.
func (r *reconciler[O, S, E]) list(ctx context.Context) ([]O, error) {
	return r.k.list(ctx, r.c.mgr.GetCache(), r.c.opts.Namespace)
}

// enforce is the Enforce of an entry whose spec says enforce: a fresh
// false for shadow mode (DESIGN §18), else nil. True, the CRD's default,
// is the default of the config file's lists too, where it is nil (see
// tiers.Tier.Enforced): so the entry of an object is the entry of the same
// tier or pool in the file, field for field. The pointer is the entry's
// own, never the object's (the table outlives the informer's copies).
func enforce(spec *bool) *bool {
	if spec == nil || *spec {
		return nil
	}
	off := false
	return &off
}

// shadowNote is what describe adds for an entry in shadow mode (DESIGN
// §18): nothing when enforced is true.
func shadowNote(enforced bool) string {
	if enforced {
		return ""
	}
	return ", in shadow mode (enforce: false): counts what it would refuse, refuses nothing"
}
