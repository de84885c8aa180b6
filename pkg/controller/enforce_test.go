package controller

import (
	"fmt"
	"strings"
	"testing"

	"github.com/joishi/limiter/api/v1alpha1"
)

// enforceCases are spec.enforce as the API server may hand it out: absent
// (an object stored before the field existed, read without its default),
// true (the default) and false (shadow mode, DESIGN §18).
// The entry holds what a tier or pool of the config file's lists holds:
// Enforce nil (the default, enforced) unless the spec says false.
var enforceCases = []struct {
	name     string
	enforce  func() *bool
	want     string // the entry's Enforce, as showBool writes it
	enforced bool
}{
	{"absent", func() *bool { return nil }, "nil", true},
	{"true", func() *bool { v := true; return &v }, "nil", true},
	{"false", func() *bool { v := false; return &v }, "false", false},
}

// showBool is *b, or "nil".
func showBool(b *bool) string {
	if b == nil {
		return "nil"
	}
	return fmt.Sprint(*b)
}

// A LimitTier's enforce is its tier's, as tiers.static reads the same
// tier: false is shadow mode, true (the CRD's default) and absent the
// static default, nil; the entry shares no memory with the object, which
// the next event replaces; and the Ready message says when the plan is in
// shadow mode.
func TestEnforceOfALimitTier(t *testing.T) {
	for _, tc := range enforceCases {
		t.Run(tc.name, func(t *testing.T) {
			lt := limitTier("free", "", 1, 0)
			lt.Spec.Enforce = tc.enforce()
			res := resolveTiers([]v1alpha1.LimitTier{lt})
			if len(res.entries) != 1 {
				t.Fatalf("entries = %+v, want the one tier", res.entries)
			}
			got := res.entries[0]
			if showBool(got.Enforce) != tc.want || got.Enforced() != tc.enforced {
				t.Errorf("tier Enforce = %s (Enforced %v), want %s (Enforced %v)", showBool(got.Enforce), got.Enforced(), tc.want, tc.enforced)
			}
			if got.Enforce != nil {
				if got.Enforce == lt.Spec.Enforce {
					t.Error("the tier's Enforce points into the object")
				}
				*lt.Spec.Enforce = !*lt.Spec.Enforce
				if got.Enforced() != tc.enforced {
					t.Error("the tier changed with the object")
				}
			}
			msg := res.verdicts["free"].message
			if shadow := strings.Contains(msg, "in shadow mode (enforce: false)"); shadow == tc.enforced {
				t.Errorf("Ready message %q: says shadow mode = %v, want %v", msg, shadow, !tc.enforced)
			}
		})
	}
}

// A LimitPool's enforce is its pool's, likewise.
func TestEnforceOfALimitPool(t *testing.T) {
	for _, tc := range enforceCases {
		t.Run(tc.name, func(t *testing.T) {
			lp := limitPool("model", "", 1, map[string]int32{"gpt-4o": 2}, 0)
			lp.Spec.Enforce = tc.enforce()
			res := resolvePools([]v1alpha1.LimitPool{lp})
			if len(res.entries) != 1 {
				t.Fatalf("entries = %+v, want the one pool", res.entries)
			}
			got := res.entries[0]
			if showBool(got.Enforce) != tc.want || got.Enforced() != tc.enforced {
				t.Errorf("pool Enforce = %s (Enforced %v), want %s (Enforced %v)", showBool(got.Enforce), got.Enforced(), tc.want, tc.enforced)
			}
			if got.Enforce != nil {
				if got.Enforce == lp.Spec.Enforce {
					t.Error("the pool's Enforce points into the object")
				}
				*lp.Spec.Enforce = !*lp.Spec.Enforce
				if got.Enforced() != tc.enforced {
					t.Error("the pool changed with the object")
				}
			}
			msg := res.verdicts["model"].message
			if shadow := strings.Contains(msg, "in shadow mode (enforce: false)"); shadow == tc.enforced {
				t.Errorf("Ready message %q: says shadow mode = %v, want %v", msg, shadow, !tc.enforced)
			}
		})
	}
}
