package controller

import (
	"errors"
	"strings"

	"github.com/joishi/limiter/api/v1alpha1"
	"github.com/joishi/limiter/pkg/tiers"
)

// PlanOf returns the plan lt defines: spec.plan, or metadata.name when
// spec.plan is empty.
func PlanOf(lt *v1alpha1.LimitTier) string {
	if lt.Spec.Plan != "" {
		return lt.Spec.Plan
	}
	return lt.Name
}

// ToTier converts lt's spec into the tier the limiter enforces and
// validates it with the same rules as a tier of the static list
// (tiers.Tier.Problems). Absent fields take the defaults of a static tier
// (tiers.Tier.WithDefaults), so both sources agree: in particular
// heartbeatInterval, which the CRD leaves unset, becomes min(20s,
// slotTTL/3). The error is one line, fit for a condition message, and
// names each field at fault by its path in the object:
// "spec.maxConcurrentStreams must be <= 1000, got 5000".
func ToTier(lt *v1alpha1.LimitTier) (tiers.Tier, error) {
	return specTier(lt.Name, &lt.Spec)
}

// specTier is ToTier for spec, a spec of the object named name (its
// current one or status.acceptedSpec).
func specTier(name string, spec *v1alpha1.LimitTierSpec) (tiers.Tier, error) {
	tier := defaultedTier(name, spec)
	problems := tier.Problems()
	if len(problems) == 0 {
		return tier, nil
	}
	msgs := make([]string, len(problems))
	for i, p := range problems {
		field := "spec." + p.Field
		if p.Field == "plan" && spec.Plan == "" {
			field = "metadata.name" // the plan when spec.plan is empty
		}
		msgs[i] = (&tiers.FieldError{Field: field, Problem: p.Problem, Got: p.Got}).Error()
	}
	return tiers.Tier{}, errors.New(strings.Join(msgs, "; "))
}

// defaultedTier is spec as a tier, with the defaults of a static tier
// applied, not validated.
func defaultedTier(name string, spec *v1alpha1.LimitTierSpec) tiers.Tier {
	tier := tiers.Tier{
		Plan:                 spec.Plan,
		MaxConcurrentStreams: int(spec.MaxConcurrentStreams),
		FailureMode:          tiers.FailureMode(spec.FailureMode),
	}
	if tier.Plan == "" {
		tier.Plan = name
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
	return tier.WithDefaults()
}
