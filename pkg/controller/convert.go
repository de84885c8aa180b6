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

// ToTier converts lt into the tier the limiter enforces and validates it
// with the same rules as a tier of the static list (tiers.Tier.Problems).
// Absent fields take the defaults of a static tier (tiers.Tier.WithDefaults),
// so both sources agree: in particular heartbeatInterval, which the CRD
// leaves unset, becomes min(20s, slotTTL/3). The error is one line, fit for
// a condition message, and names each field at fault by its path in the
// object: "spec.maxConcurrentStreams must be <= 1000, got 5000".
func ToTier(lt *v1alpha1.LimitTier) (tiers.Tier, error) {
	tier := defaultedTier(lt)
	problems := tier.Problems()
	if len(problems) == 0 {
		return tier, nil
	}
	msgs := make([]string, len(problems))
	for i, p := range problems {
		field := "spec." + p.Field
		if p.Field == "plan" && lt.Spec.Plan == "" {
			field = "metadata.name" // the plan when spec.plan is empty
		}
		msgs[i] = (&tiers.FieldError{Field: field, Problem: p.Problem, Got: p.Got}).Error()
	}
	return tiers.Tier{}, errors.New(strings.Join(msgs, "; "))
}

// defaultedTier is lt as a tier, with the defaults of a static tier
// applied, not validated.
func defaultedTier(lt *v1alpha1.LimitTier) tiers.Tier {
	tier := tiers.Tier{
		Plan:                 PlanOf(lt),
		MaxConcurrentStreams: int(lt.Spec.MaxConcurrentStreams),
		FailureMode:          tiers.FailureMode(lt.Spec.FailureMode),
	}
	if lt.Spec.SlotTTL != nil {
		tier.SlotTTL = lt.Spec.SlotTTL.Duration
	}
	if lt.Spec.HeartbeatInterval != nil {
		tier.HeartbeatInterval = lt.Spec.HeartbeatInterval.Duration
	}
	return tier.WithDefaults()
}
