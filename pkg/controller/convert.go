package controller

import (
	"fmt"
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
// with the same rules as a tier of the static list (tiers.Tier.Validate).
// Fields the API server would have defaulted take the tier defaults when
// absent. The error is one line, fit for a condition message.
func ToTier(lt *v1alpha1.LimitTier) (tiers.Tier, error) {
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
	tier = tier.WithDefaults()
	if err := tier.Validate(); err != nil {
		return tiers.Tier{}, fmt.Errorf("%s", strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	return tier, nil
}
