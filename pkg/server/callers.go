package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/joishi/limiter/pkg/tiers"
)

// maxCallerNameLength bounds a caller's name: a DNS name, since a client
// certificate's DNS name is the name of a caller over mutual TLS.
const maxCallerNameLength = 253

// certOnly in the token column is a caller without a token: one that
// authenticates with its client certificate only.
const certOnly = "-"

// allPlans in the plans column lets the caller use every plan.
const allPlans = "*"

// caller is one line of the API tokens file: who may call the slot API,
// and for which plans. Only the token's SHA-256 is kept, as for admin
// tokens.
type caller struct {
	name     string
	hasToken bool // false: certificate only
	digest   [sha256.Size]byte
	anyPlan  bool
	plans    []string // sorted; when not anyPlan
}

// openCaller is the caller of an API without a tokens file: anyone, for
// any plan.
var openCaller = caller{anyPlan: true}

// allows reports whether the caller may acquire and heartbeat slots of plan.
func (c caller) allows(plan string) bool {
	if c.anyPlan {
		return true
	}
	_, found := slices.BinarySearch(c.plans, plan)
	return found
}

// callerSet is an immutable set of callers, swapped whole on reload.
type callerSet struct {
	callers []caller
}

func (s *callerSet) len() int { return len(s.callers) }

// byToken returns the caller whose token is presented. Like
// tokenSet.lookup it compares against every token, in constant time.
func (s *callerSet) byToken(presented string) (caller, bool) {
	digest := sha256.Sum256([]byte(presented))
	var found caller
	matched := 0
	for _, c := range s.callers {
		if c.hasToken && subtle.ConstantTimeCompare(digest[:], c.digest[:]) == 1 {
			found, matched = c, 1
		}
	}
	return found, matched == 1
}

// byName returns the caller named name (a client certificate's name).
func (s *callerSet) byName(name string) (caller, bool) {
	for _, c := range s.callers {
		if c.name == name {
			return c, true
		}
	}
	return caller{}, false
}

// parseCallers reads an API tokens file: one "name token plans" per line,
// whitespace-separated; token "-" for a caller that authenticates by
// client certificate only; plans "*" or a comma-separated list. Blank
// lines and lines starting with '#' are skipped. Errors name the line and
// the field but never echo a field's value.
func parseCallers(r io.Reader) (*callerSet, error) {
	set := &callerSet{}
	nameLine := map[string]int{}
	tokenLine := map[[sha256.Size]byte]int{}
	err := scanTokenLines(r, func(line int, fields []string) error {
		if len(fields) != 3 {
			return fmt.Errorf("want 3 fields \"name token plans\", got %d", len(fields))
		}
		name, token, plans := fields[0], fields[1], fields[2]
		if !validName(name, maxCallerNameLength) {
			return fmt.Errorf("the name (field 1) must be 1-%d characters of [A-Za-z0-9._@-]", maxCallerNameLength)
		}
		if first, dup := nameLine[name]; dup {
			return fmt.Errorf("the name (field 1) is already used on line %d", first)
		}
		c := caller{name: name}
		if token != certOnly {
			if err := checkToken(token, 2); err != nil {
				return fmt.Errorf("%w (or %q for a caller with a client certificate only)", err, certOnly)
			}
			c.hasToken, c.digest = true, sha256.Sum256([]byte(token))
			if first, dup := tokenLine[c.digest]; dup {
				return fmt.Errorf("the token (field 2) is already used on line %d; give each caller its own", first)
			}
			tokenLine[c.digest] = line
		}
		if plans == allPlans {
			c.anyPlan = true
		} else {
			for plan := range strings.SplitSeq(plans, ",") {
				if !tiers.ValidPlan(plan) {
					return fmt.Errorf("the plans (field 3) must be %q or a comma-separated list of plan names (1-%d characters of [A-Za-z0-9._-], starting with a letter or digit)", allPlans, tiers.MaxPlanLength)
				}
				c.plans = append(c.plans, plan)
			}
			slices.Sort(c.plans)
			c.plans = slices.Compact(c.plans)
		}
		nameLine[name] = line
		set.callers = append(set.callers, c)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return set, nil
}
