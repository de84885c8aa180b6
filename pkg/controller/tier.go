package controller

import (
	"cmp"
	"context"
	"fmt"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/joishi/limiter/api/v1alpha1"
	"github.com/joishi/limiter/pkg/tiers"
)

// tierKind serves LimitTiers into a tiers.Table: each object is one plan's
// limit.
type tierKind struct{}

func (tierKind) name() string                   { return "LimitTier" }
func (tierKind) claim() string                  { return "plan" }
func (tierKind) newObject() *v1alpha1.LimitTier { return &v1alpha1.LimitTier{} }

func (tierKind) list(ctx context.Context, r client.Reader, ns string) ([]*v1alpha1.LimitTier, error) {
	var list v1alpha1.LimitTierList
	if err := r.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	out := make([]*v1alpha1.LimitTier, len(list.Items))
	for i := range list.Items {
		out[i] = &list.Items[i]
	}
	return out, nil
}

func (tierKind) spec(lt *v1alpha1.LimitTier) *v1alpha1.LimitTierSpec { return &lt.Spec }
func (tierKind) specClaim(spec *v1alpha1.LimitTierSpec) string       { return spec.Plan }

// entry applies the defaults of a static tier (tiers.Tier.WithDefaults):
// in particular heartbeatInterval, which the CRD leaves unset, becomes
// min(20s, slotTTL/3).
func (tierKind) entry(plan string, spec *v1alpha1.LimitTierSpec) tiers.Tier {
	tier := tiers.Tier{
		Plan:                 plan,
		MaxConcurrentStreams: int(spec.MaxConcurrentStreams),
		FailureMode:          tiers.FailureMode(spec.FailureMode),
		Priority:             int(spec.Priority),
	}
	if spec.SlotTTL != nil {
		tier.SlotTTL = spec.SlotTTL.Duration
	}
	if spec.HeartbeatInterval != nil {
		tier.HeartbeatInterval = spec.HeartbeatInterval.Duration
	}
	if spec.MaxWait != nil {
		tier.MaxWait = spec.MaxWait.Duration
	}
	tier.Enforce = enforce(spec.Enforce)
	return tier.WithDefaults()
}

// describe is "3 concurrent streams per user", then shadowNote for a plan
// in shadow mode.
func (tierKind) describe(t tiers.Tier) string {
	limit := fmt.Sprintf("%d concurrent streams per user", t.MaxConcurrentStreams)
	if t.MaxConcurrentStreams == 1 {
		limit = "1 concurrent stream per user"
	}
	return limit + shadowNote(t.Enforced())
}

func (tierKind) status(lt *v1alpha1.LimitTier) statusFields[v1alpha1.LimitTierSpec] {
	s := &lt.Status
	return statusFields[v1alpha1.LimitTierSpec]{&s.ObservedGeneration, &s.AcceptedSpec, &s.AcceptedGeneration, &s.Conditions}
}

// show writes the plan and the durations of the spec with the defaults
// applied (heartbeatInterval: else min(20s, slotTTL/3)), each in the one
// format of formatDuration, for kubectl's Plan, TTL, Heartbeat and Wait
// columns.
func (k tierKind) show(lt *v1alpha1.LimitTier, v verdict) {
	asked := k.entry(v.claim, &lt.Spec)
	s := &lt.Status
	s.Plan = v.claim
	s.SlotTTL = formatDuration(asked.SlotTTL)
	s.HeartbeatInterval = formatDuration(asked.HeartbeatInterval)
	s.MaxWait = cmp.Or(formatDuration(asked.MaxWait), "0s")
}
