package controller

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/joishi/limiter/api/v1alpha1"
	"github.com/joishi/limiter/pkg/tiers"
)

// Verdict is what the limiter makes of one LimitTier.
type Verdict struct {
	// Plan is the plan the object claims: that of its definition in force
	// (see Resolve), else that of its spec (PlanOf).
	Plan string
	// Reason is v1alpha1.ReasonAccepted, ReasonInvalid or ReasonConflict.
	Reason string
	// Message says why, in a sentence or two.
	Message string
	// SlotTTL and HeartbeatInterval are those of the object's spec with
	// the defaults applied (heartbeatInterval: else min(20s, slotTTL/3));
	// 0 when not even that is above 0.
	SlotTTL, HeartbeatInterval time.Duration
	// MaxWait is the object's spec.maxWait (0 when absent or below 0).
	MaxWait time.Duration
	// AcceptedGeneration is the generation to record as accepted
	// (status.acceptedGeneration): the current one when the spec is valid,
	// else the one recorded before; 0 when none.
	AcceptedGeneration int64
}

// Accepted reports whether the object's current spec is in force.
func (v Verdict) Accepted() bool { return v.Reason == v1alpha1.ReasonAccepted }

// Resolution is what the limiter makes of a namespace's LimitTiers.
type Resolution struct {
	// Tiers are the tiers in force, ordered by plan: valid, and one per
	// plan.
	Tiers []tiers.Tier
	// Verdicts holds one verdict per object, by metadata.name. Objects
	// being deleted have none: they are already out of force.
	Verdicts map[string]Verdict
}

// Resolve decides which LimitTiers are in force.
//
// An object's definition is its spec when that is valid; else the last
// spec the limiter accepted (status.acceptedSpec), so that an invalid edit
// leaves the previous generation in force rather than taking the plan away
// (or handing it to another object); else it has none, and claims no plan.
// When several objects with a definition claim one plan, the oldest (by
// creationTimestamp, then by name) wins and the others are in Conflict.
// Only the objects decide the outcome, not the order they are listed or
// watched in, so every replica reaches the same one.
func Resolve(items []v1alpha1.LimitTier) Resolution {
	ordered := make([]*v1alpha1.LimitTier, 0, len(items))
	for i := range items {
		if items[i].DeletionTimestamp == nil {
			ordered = append(ordered, &items[i])
		}
	}
	slices.SortFunc(ordered, olderFirst)

	res := Resolution{Verdicts: make(map[string]Verdict, len(ordered))}
	owner := map[string]string{} // plan → name of the object in force
	for _, lt := range ordered {
		asked := defaultedTier(lt.Name, &lt.Spec)
		v := Verdict{Plan: PlanOf(lt), SlotTTL: max(asked.SlotTTL, 0), HeartbeatInterval: max(asked.HeartbeatInterval, 0), MaxWait: max(asked.MaxWait, 0)}
		def := definitionOf(lt)
		if def.ok {
			v.Plan = def.tier.Plan
		}
		v.AcceptedGeneration = def.acceptedGeneration
		switch {
		case !def.ok:
			v.Reason, v.Message = v1alpha1.ReasonInvalid, def.invalid
		case owner[v.Plan] != "":
			conflict := fmt.Sprintf("plan %q is already defined by the older LimitTier %q, which is in force", v.Plan, owner[v.Plan])
			if def.invalid == "" {
				v.Reason, v.Message = v1alpha1.ReasonConflict, conflict
			} else {
				v.Reason = v1alpha1.ReasonInvalid
				v.Message = fmt.Sprintf("%s; generation %d is not in force either: %s", def.invalid, def.generation, conflict)
			}
		default:
			owner[v.Plan] = lt.Name
			res.Tiers = append(res.Tiers, def.tier)
			if def.invalid == "" {
				v.Reason = v1alpha1.ReasonAccepted
				v.Message = fmt.Sprintf("plan %q is in force: %s", v.Plan, perUser(def.tier))
			} else {
				v.Reason = v1alpha1.ReasonInvalid
				v.Message = fmt.Sprintf("%s; generation %d stays in force: plan %q, %s", def.invalid, def.generation, v.Plan, perUser(def.tier))
			}
		}
		res.Verdicts[lt.Name] = v
	}
	slices.SortFunc(res.Tiers, func(a, b tiers.Tier) int { return strings.Compare(a.Plan, b.Plan) })
	return res
}

// definition is what an object would put in force.
type definition struct {
	ok         bool
	tier       tiers.Tier
	generation int64 // of tier
	// acceptedGeneration is what status.acceptedGeneration should hold.
	acceptedGeneration int64
	// invalid, when the spec is invalid, says so and why.
	invalid string
}

// definitionOf returns lt's definition: its spec when valid, else its
// status.acceptedSpec when that is still valid.
func definitionOf(lt *v1alpha1.LimitTier) definition {
	tier, err := ToTier(lt)
	if err == nil {
		return definition{ok: true, tier: tier, generation: lt.Generation, acceptedGeneration: lt.Generation}
	}
	s := lt.Status
	d := definition{invalid: fmt.Sprintf("generation %d is invalid: %v", lt.Generation, err), acceptedGeneration: s.AcceptedGeneration}
	switch {
	case s.AcceptedSpec == nil:
		d.invalid += "; no generation of this LimitTier was accepted, so it enforces nothing"
	case s.AcceptedGeneration == lt.Generation:
		// Accepted under rules since tightened: the same spec.
		d.invalid += "; this LimitTier enforces nothing"
	default:
		accepted, err := specTier(lt.Name, s.AcceptedSpec)
		if err != nil {
			d.invalid += fmt.Sprintf("; the accepted generation %d is no longer valid either (%v), so this LimitTier enforces nothing", s.AcceptedGeneration, err)
			break
		}
		d.ok, d.tier, d.generation = true, accepted, s.AcceptedGeneration
	}
	return d
}

// perUser is "3 concurrent streams per user".
func perUser(t tiers.Tier) string {
	if t.MaxConcurrentStreams == 1 {
		return "1 concurrent stream per user"
	}
	return fmt.Sprintf("%d concurrent streams per user", t.MaxConcurrentStreams)
}

// olderFirst orders by creationTimestamp (whole seconds), then by name:
// names are unique in a namespace, so the order is total.
func olderFirst(a, b *v1alpha1.LimitTier) int {
	if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
		return c
	}
	return strings.Compare(a.Name, b.Name)
}
