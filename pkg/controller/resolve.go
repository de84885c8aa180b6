package controller

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/joishi/limiter/api/v1alpha1"
	"github.com/joishi/limiter/pkg/tiers"
)

// verdict is what the limiter makes of one object.
type verdict struct {
	// claim is the plan (or pool) the object claims: that of its
	// definition in force (see resolve), else that of its spec.
	claim string
	// reason is v1alpha1.ReasonAccepted, ReasonInvalid, ReasonConflict
	// or ReasonDeleting.
	reason string
	// message says why, in a sentence or two.
	message string
	// acceptedGeneration is the generation to record as accepted
	// (status.acceptedGeneration): the current one when the spec is valid,
	// else the one recorded before, or a newer one this replica saw; 0
	// when none.
	acceptedGeneration int64
	// acceptedSpec, when set, is the spec (a *S) of acceptedGeneration to
	// record, one this replica saw and status does not hold.
	acceptedSpec any
}

// accepted reports whether the object's current spec is in force.
func (v verdict) accepted() bool { return v.reason == v1alpha1.ReasonAccepted }

// resolution is what the limiter makes of a namespace's objects of one
// kind.
type resolution[E entry] struct {
	// entries are the entries in force, ordered by name: valid, and one
	// per name.
	entries []E
	// verdicts holds one verdict per object, by metadata.name. Objects
	// being deleted are out of force, and theirs says so.
	verdicts map[string]verdict
}

// resolve decides which objects of kind k are in force.
//
// An object's definition is its spec when that is valid; else the last
// spec the limiter accepted (status.acceptedSpec), so that an invalid edit
// leaves the previous generation in force rather than taking the plan (or
// pool) away, or handing it to another object; else it has none, and
// claims nothing. When several objects with a definition claim one name,
// the oldest (by creationTimestamp, then by name) wins and the others are
// in Conflict. An object being deleted (a finalizer holds it) is out of
// force at once, and Deleting. Only the objects decide the outcome, not
// the order they are listed or watched in, so every replica reaches the
// same one.
//
// seen, when not nil, is the newest valid spec this replica saw of each
// object (see seenSpecs).
func resolve[O client.Object, S any, E entry](k kind[O, S, E], items []O, seen *seenSpecs[S]) resolution[E] {
	res := resolution[E]{verdicts: make(map[string]verdict, len(items))}
	ordered := make([]O, 0, len(items))
	for _, o := range items {
		if o.GetDeletionTimestamp() == nil {
			ordered = append(ordered, o)
			continue
		}
		v := verdict{claim: claimOf(k, o.GetName(), k.spec(o)), reason: v1alpha1.ReasonDeleting}
		if def := definitionOf(k, o, seen); def.ok {
			v.claim = def.entry.Name()
		}
		v.message = fmt.Sprintf("being deleted: this %s is out of force, and %s %q is left to any other %s that defines it", k.name(), k.claim(), v.claim, k.name())
		v.acceptedGeneration = *k.status(o).acceptedGeneration // as recorded: a deletion accepts nothing
		res.verdicts[o.GetName()] = v
	}
	slices.SortFunc(ordered, olderFirst)

	owner := map[string]string{} // claim → name of the object in force
	for _, o := range ordered {
		v := verdict{claim: claimOf(k, o.GetName(), k.spec(o))}
		def := definitionOf(k, o, seen)
		if def.ok {
			v.claim = def.entry.Name()
		}
		v.acceptedGeneration, v.acceptedSpec = def.acceptedGeneration, def.acceptedSpec
		switch {
		case !def.ok:
			v.reason, v.message = v1alpha1.ReasonInvalid, def.invalid
		case owner[v.claim] != "":
			conflict := fmt.Sprintf("%s %q is already defined by the older %s %q, which is in force", k.claim(), v.claim, k.name(), owner[v.claim])
			if def.invalid == "" {
				v.reason, v.message = v1alpha1.ReasonConflict, conflict
			} else {
				v.reason = v1alpha1.ReasonInvalid
				v.message = fmt.Sprintf("%s; generation %d is not in force either: %s", def.invalid, def.generation, conflict)
			}
		default:
			owner[v.claim] = o.GetName()
			res.entries = append(res.entries, def.entry)
			if def.invalid == "" {
				v.reason = v1alpha1.ReasonAccepted
				v.message = fmt.Sprintf("%s %q is in force: %s", k.claim(), v.claim, k.describe(def.entry))
			} else {
				v.reason = v1alpha1.ReasonInvalid
				v.message = fmt.Sprintf("%s; generation %d stays in force: %s %q, %s", def.invalid, def.generation, k.claim(), v.claim, k.describe(def.entry))
			}
		}
		res.verdicts[o.GetName()] = v
	}
	slices.SortFunc(res.entries, func(a, b E) int { return strings.Compare(a.Name(), b.Name()) })
	return res
}

// definition is what an object would put in force.
type definition[E entry] struct {
	ok         bool
	entry      E
	generation int64 // of entry
	// acceptedGeneration is what status.acceptedGeneration should hold,
	// and acceptedSpec, when set, the spec it should record with it (a
	// *S): one this replica saw, newer than status holds.
	acceptedGeneration int64
	acceptedSpec       any
	// invalid, when the spec is invalid, says so and why.
	invalid string
}

// definitionOf returns o's definition: its spec when valid, else its
// status.acceptedSpec when that is still valid; or, until status says
// the current generation was judged, the newest valid spec seen holds
// when it is newer than that (see seenSpecs).
func definitionOf[O client.Object, S any, E entry](k kind[O, S, E], o O, seen *seenSpecs[S]) definition[E] {
	e, err := toEntry(k, o.GetName(), k.spec(o))
	if err == nil {
		return definition[E]{ok: true, entry: e, generation: o.GetGeneration(), acceptedGeneration: o.GetGeneration()}
	}
	status := k.status(o)
	acceptedSpec, acceptedGeneration := *status.acceptedSpec, *status.acceptedGeneration
	d := definition[E]{invalid: fmt.Sprintf("generation %d is invalid: %v", o.GetGeneration(), err), acceptedGeneration: acceptedGeneration}
	if s, ok := seen.get(o.GetUID()); ok && s.generation > acceptedGeneration && *status.observedGeneration < o.GetGeneration() {
		acceptedSpec, acceptedGeneration = s.spec, s.generation
		d.acceptedGeneration, d.acceptedSpec = s.generation, s.spec
	}
	switch {
	case acceptedSpec == nil:
		d.invalid += fmt.Sprintf("; no generation of this %s was accepted, so it enforces nothing", k.name())
	case acceptedGeneration == o.GetGeneration():
		// Accepted under rules since tightened: the same spec.
		d.invalid += fmt.Sprintf("; this %s enforces nothing", k.name())
	default:
		accepted, err := toEntry(k, o.GetName(), acceptedSpec)
		if err != nil {
			d.invalid += fmt.Sprintf("; the accepted generation %d is no longer valid either (%v), so this %s enforces nothing", acceptedGeneration, err, k.name())
			break
		}
		d.ok, d.entry, d.generation = true, accepted, acceptedGeneration
	}
	return d
}

// claimOf returns what spec, a spec of the object named name, claims:
// its own claim, or name when it leaves it empty.
func claimOf[O client.Object, S any, E entry](k kind[O, S, E], name string, spec *S) string {
	if c := k.specClaim(spec); c != "" {
		return c
	}
	return name
}

// toEntry converts spec, a spec of the object named name (its current one
// or status.acceptedSpec), into the entry the limiter enforces, and
// validates it with the same rules as an entry of the config file's list
// (Problems). Absent fields take the defaults of that list, so both
// sources agree. The error is one line, fit for a condition message, and
// names each field at fault by its path in the object:
// "spec.maxConcurrentStreams must be <= 1000, got 5000".
func toEntry[O client.Object, S any, E entry](k kind[O, S, E], name string, spec *S) (E, error) {
	e := k.entry(claimOf(k, name, spec), spec)
	problems := e.Problems()
	if len(problems) == 0 {
		return e, nil
	}
	msgs := make([]string, len(problems))
	for i, p := range problems {
		field := "spec." + p.Field
		if p.Field == k.claim() && k.specClaim(spec) == "" {
			field = "metadata.name" // the claim when the spec leaves it empty
		}
		msgs[i] = (&tiers.FieldError{Field: field, Problem: p.Problem, Got: p.Got}).Error()
	}
	var zero E
	return zero, errors.New(strings.Join(msgs, "; "))
}

// olderFirst orders by creationTimestamp (whole seconds), then by name:
// names are unique in a namespace, so the order is total.
func olderFirst[O client.Object](a, b O) int {
	if c := a.GetCreationTimestamp().Compare(b.GetCreationTimestamp().Time); c != 0 {
		return c
	}
	return strings.Compare(a.GetName(), b.GetName())
}
