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
	// Plan is the plan the object claims (PlanOf).
	Plan string
	// Reason is v1alpha1.ReasonAccepted, ReasonInvalid or ReasonConflict.
	Reason string
	// Message says why, in a sentence.
	Message string
	// HeartbeatInterval is the object's heartbeat interval with the
	// default applied (spec.heartbeatInterval, else min(20s, slotTTL/3));
	// 0 when not even that is above 0.
	HeartbeatInterval time.Duration
}

// Accepted reports whether the object's tier is in force.
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

// Resolve decides which LimitTiers are in force. An invalid object is out
// of force and claims no plan. When several valid objects claim one plan,
// the oldest (by creationTimestamp, then by name) wins and the others are
// in Conflict. Only the objects decide the outcome, not the order they are
// listed or watched in, so every replica reaches the same one.
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
		plan := PlanOf(lt)
		heartbeat := max(defaultedTier(lt).HeartbeatInterval, 0)
		tier, err := ToTier(lt)
		switch {
		case err != nil:
			res.Verdicts[lt.Name] = Verdict{Plan: plan, Reason: v1alpha1.ReasonInvalid, Message: err.Error(), HeartbeatInterval: heartbeat}
		case owner[plan] != "":
			res.Verdicts[lt.Name] = Verdict{Plan: plan, Reason: v1alpha1.ReasonConflict,
				Message:           fmt.Sprintf("plan %q is already defined by the older LimitTier %q, which is in force", plan, owner[plan]),
				HeartbeatInterval: heartbeat}
		default:
			owner[plan] = lt.Name
			res.Tiers = append(res.Tiers, tier)
			res.Verdicts[lt.Name] = Verdict{Plan: plan, Reason: v1alpha1.ReasonAccepted,
				Message:           fmt.Sprintf("plan %q is in force: %d concurrent streams per user", plan, tier.MaxConcurrentStreams),
				HeartbeatInterval: heartbeat}
		}
	}
	slices.SortFunc(res.Tiers, func(a, b tiers.Tier) int { return strings.Compare(a.Plan, b.Plan) })
	return res
}

// olderFirst orders by creationTimestamp (whole seconds), then by name:
// names are unique in a namespace, so the order is total.
func olderFirst(a, b *v1alpha1.LimitTier) int {
	if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
		return c
	}
	return strings.Compare(a.Name, b.Name)
}
