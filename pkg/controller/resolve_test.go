package controller

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/joishi/limiter/api/v1alpha1"
	"github.com/joishi/limiter/pkg/tiers"
)

var epoch = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// limitTier is a LimitTier as the API server would hand it out: defaults
// applied, created createdAt seconds after epoch.
func limitTier(name, plan string, limit int32, createdAt int) v1alpha1.LimitTier {
	return v1alpha1.LimitTier{
		ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(epoch.Add(time.Duration(createdAt) * time.Second))},
		Spec: v1alpha1.LimitTierSpec{
			Plan:                 plan,
			MaxConcurrentStreams: limit,
			SlotTTL:              &metav1.Duration{Duration: 120 * time.Second},
			HeartbeatInterval:    &metav1.Duration{Duration: 20 * time.Second},
			FailureMode:          v1alpha1.FailOpen,
		},
	}
}

// resolveTiers is resolve of the LimitTiers items.
func resolveTiers(items []v1alpha1.LimitTier) resolution[tiers.Tier] {
	return resolve(tierKind{}, addrs(items), nil)
}

// addrs points at each of items, as a kind's list hands them to resolve.
func addrs[T any](items []T) []*T {
	ptrs := make([]*T, len(items))
	for i := range items {
		ptrs[i] = &items[i]
	}
	return ptrs
}

// planLimits is "free=1 paid=3": each plan of list with its limit.
func planLimits(list []tiers.Tier) string {
	parts := make([]string, len(list))
	for i, t := range list {
		parts[i] = fmt.Sprintf("%s=%d", t.Plan, t.MaxConcurrentStreams)
	}
	return strings.Join(parts, " ")
}

// with is obj changed by mutate.
func with[T any](obj T, mutate func(*T)) T {
	mutate(&obj)
	return obj
}

// editedInvalid is lt at generation 2, its spec made invalid (heartbeat
// above slotTTL/3), generation 1 (lt as given) recorded as accepted.
func editedInvalid(lt v1alpha1.LimitTier) v1alpha1.LimitTier {
	accepted := lt.Spec.DeepCopy()
	lt.Generation = 2
	lt.Spec.HeartbeatInterval = &metav1.Duration{Duration: time.Minute}
	lt.Status.AcceptedSpec, lt.Status.AcceptedGeneration = accepted, 1
	return lt
}

func TestResolve(t *testing.T) {
	deleting := metav1.NewTime(epoch)
	cases := []resolveCase[v1alpha1.LimitTier]{
		{
			name:        "a valid tier is accepted",
			items:       []v1alpha1.LimitTier{limitTier("paid", "", 3, 0)},
			want:        []string{"paid:Accepted"},
			wantEntries: "paid=3",
		},
		{
			name:        "spec.plan overrides metadata.name",
			items:       []v1alpha1.LimitTier{limitTier("paid-2026", "paid", 3, 0)},
			want:        []string{"paid-2026:Accepted"},
			wantEntries: "paid=3",
		},
		{
			name:        "zero streams is a valid tier",
			items:       []v1alpha1.LimitTier{limitTier("banned", "", 0, 0)},
			want:        []string{"banned:Accepted"},
			wantEntries: "banned=0",
		},
		{
			name: "a heartbeat above slotTTL/3 is invalid and says so",
			items: []v1alpha1.LimitTier{with(limitTier("paid", "", 3, 0), func(lt *v1alpha1.LimitTier) {
				lt.Spec.SlotTTL.Duration = 30 * time.Second
			})},
			want:        []string{"paid:Invalid"},
			wantEntries: "",
			wantMsg:     map[string]string{"paid": "spec.heartbeatInterval must be <= slotTTL/3 (10s), got 20s"},
		},
		{
			name:        "a metadata.name unfit as a plan is invalid",
			items:       []v1alpha1.LimitTier{limitTier(strings.Repeat("p", 64), "", 3, 0)},
			want:        []string{strings.Repeat("p", 64) + ":Invalid"},
			wantEntries: "",
			wantMsg:     map[string]string{strings.Repeat("p", 64): "metadata.name must be 1-63 characters"},
		},
		{
			// The schema refuses it, but an object stored before the bound
			// (or kept by validation ratcheting) still holds it.
			name:        "a limit above 1000 is invalid",
			items:       []v1alpha1.LimitTier{limitTier("bulk", "", 5000, 0), limitTier("free", "", 1, 0)},
			want:        []string{"bulk:Invalid", "free:Accepted"},
			wantEntries: "free=1",
			wantMsg:     map[string]string{"bulk": "spec.maxConcurrentStreams must be <= 1000, got 5000"},
		},
		{
			name: "every field at fault is named",
			items: []v1alpha1.LimitTier{with(limitTier("bulk", "", -1, 0), func(lt *v1alpha1.LimitTier) {
				lt.Spec.FailureMode = "Sometimes"
			})},
			want:    []string{"bulk:Invalid"},
			wantMsg: map[string]string{"bulk": `spec.maxConcurrentStreams must be >= 0, got -1; spec.failureMode must be Open or Closed, got "Sometimes"`},
		},
		{
			name:        "fields the API server did not default take the tier defaults",
			items:       []v1alpha1.LimitTier{{ObjectMeta: metav1.ObjectMeta{Name: "free"}, Spec: v1alpha1.LimitTierSpec{MaxConcurrentStreams: 1}}},
			want:        []string{"free:Accepted"},
			wantEntries: "free=1",
		},
		{
			name:        "the older of two claims on a plan wins",
			items:       []v1alpha1.LimitTier{limitTier("paid-new", "paid", 5, 10), limitTier("paid-old", "paid", 3, 0)},
			want:        []string{"paid-new:Conflict", "paid-old:Accepted"},
			wantEntries: "paid=3",
			wantMsg:     map[string]string{"paid-new": `plan "paid" is already defined by the older LimitTier "paid-old"`},
		},
		{
			name:        "created in the same second, the name decides",
			items:       []v1alpha1.LimitTier{limitTier("b", "paid", 5, 0), limitTier("a", "paid", 3, 0)},
			want:        []string{"a:Accepted", "b:Conflict"},
			wantEntries: "paid=3",
		},
		{
			name: "an invalid older claim does not hold the plan",
			items: []v1alpha1.LimitTier{
				with(limitTier("paid-old", "paid", 3, 0), func(lt *v1alpha1.LimitTier) { lt.Spec.FailureMode = "Sometimes" }),
				limitTier("paid-new", "paid", 5, 10),
			},
			want:        []string{"paid-new:Accepted", "paid-old:Invalid"},
			wantEntries: "paid=5",
		},
		{
			name: "an object being deleted is out of force and says so",
			items: []v1alpha1.LimitTier{
				with(limitTier("paid-old", "paid", 3, 0), func(lt *v1alpha1.LimitTier) { lt.DeletionTimestamp = &deleting }),
				limitTier("paid-new", "paid", 5, 10),
			},
			want:        []string{"paid-new:Accepted", "paid-old:Deleting"},
			wantEntries: "paid=5",
			wantMsg:     map[string]string{"paid-old": `being deleted: this LimitTier is out of force, and plan "paid" is left to any other LimitTier that defines it`},
		},
		{
			name:        "an invalid edit leaves the accepted generation in force",
			items:       []v1alpha1.LimitTier{editedInvalid(limitTier("paid", "", 5, 0))},
			want:        []string{"paid:Invalid"},
			wantEntries: "paid=5",
			wantMsg: map[string]string{"paid": `generation 2 is invalid: spec.heartbeatInterval must be <= slotTTL/3 (40s), got 1m0s; ` +
				`generation 1 stays in force: plan "paid", 5 concurrent streams per user`},
		},
		{
			name:        "the accepted generation of an older object keeps its plan against a younger claim",
			items:       []v1alpha1.LimitTier{limitTier("paid-dup", "paid", 9, 10), editedInvalid(limitTier("paid", "", 5, 0))},
			want:        []string{"paid-dup:Conflict", "paid:Invalid"},
			wantEntries: "paid=5",
			wantMsg:     map[string]string{"paid-dup": `already defined by the older LimitTier "paid"`},
		},
		{
			name:        "the accepted generation of a younger claim is not in force either",
			items:       []v1alpha1.LimitTier{limitTier("paid", "", 5, 0), editedInvalid(limitTier("paid-dup", "paid", 9, 10))},
			want:        []string{"paid-dup:Invalid", "paid:Accepted"},
			wantEntries: "paid=5",
			wantMsg:     map[string]string{"paid-dup": `generation 1 is not in force either: plan "paid" is already defined by the older LimitTier "paid"`},
		},
		{
			name: "the accepted generation decides the plan claimed",
			items: []v1alpha1.LimitTier{with(editedInvalid(limitTier("tier-a", "paid", 5, 0)), func(lt *v1alpha1.LimitTier) {
				lt.Spec.Plan = "gold"
			})},
			want:        []string{"tier-a:Invalid"},
			wantEntries: "paid=5",
		},
		{
			name: "an accepted generation no longer valid enforces nothing",
			items: []v1alpha1.LimitTier{with(editedInvalid(limitTier("bulk", "", 5, 0)), func(lt *v1alpha1.LimitTier) {
				lt.Status.AcceptedSpec.MaxConcurrentStreams = 5000
			})},
			want:        []string{"bulk:Invalid"},
			wantEntries: "",
			wantMsg:     map[string]string{"bulk": "the accepted generation 1 is no longer valid either (spec.maxConcurrentStreams must be <= 1000, got 5000), so this LimitTier enforces nothing"},
		},
		{
			name:        "an invalid spec with nothing accepted enforces nothing",
			items:       []v1alpha1.LimitTier{with(limitTier("paid", "", 5, 0), func(lt *v1alpha1.LimitTier) { lt.Spec.FailureMode = "Sometimes" })},
			want:        []string{"paid:Invalid"},
			wantEntries: "",
			wantMsg:     map[string]string{"paid": "no generation of this LimitTier was accepted, so it enforces nothing"},
		},
		{
			name:        "one stream is said in the singular",
			items:       []v1alpha1.LimitTier{limitTier("free", "", 1, 0)},
			want:        []string{"free:Accepted"},
			wantEntries: "free=1",
			wantMsg:     map[string]string{"free": `plan "free" is in force: 1 concurrent stream per user`},
		},
		{
			name:        "no objects, no tiers",
			items:       nil,
			want:        nil,
			wantEntries: "",
		},
	}
	runResolveCases(t, cases, resolveTiers, planLimits)
}

// resolveCase is a case of TestResolve or TestResolvePools: objects O, and
// what resolve makes of them.
type resolveCase[O any] struct {
	name  string
	items []O
	// want is "object:reason" per object, and wantEntries the entries in
	// force as planLimits or poolCaps writes them.
	want        []string
	wantEntries string
	wantMsg     map[string]string // object → part of its message
}

// runResolveCases runs each case through resolve, show writing the entries
// in force as the cases' wantEntries do, and checks that a table of the
// entries takes them.
func runResolveCases[O any, E entry](t *testing.T, cases []resolveCase[O], resolve func([]O) resolution[E], show func([]E) string) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res := resolve(tc.items)
			var got []string
			for name, v := range res.verdicts {
				got = append(got, name+":"+v.reason)
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Errorf("verdicts = %v, want %v", got, tc.want)
			}
			if got := show(res.entries); got != tc.wantEntries {
				t.Errorf("entries in force = %q, want %q", got, tc.wantEntries)
			}
			for name, part := range tc.wantMsg {
				if msg := res.verdicts[name].message; !strings.Contains(msg, part) {
					t.Errorf("message of %s = %q, want it to contain %q", name, msg, part)
				}
			}
			if err := tiers.NewCatalog[E]().Replace(res.entries); err != nil {
				t.Errorf("the table refuses the resolved entries: %v", err)
			}
		})
	}
}

func TestResolveIgnoresListOrder(t *testing.T) {
	items := []v1alpha1.LimitTier{
		limitTier("paid-b", "paid", 4, 5),
		limitTier("paid-a", "paid", 5, 5),
		limitTier("paid-old", "paid", 3, 0),
		limitTier("free", "", 1, 9),
		limitTier("free-2", "free", 2, 9),
	}
	want := resolveTiers(items)
	for i := range len(items) {
		rotated := append(slices.Clone(items[i:]), items[:i]...)
		slices.Reverse(rotated)
		if got := resolveTiers(rotated); !slices.Equal(got.entries, want.entries) || !maps.Equal(got.verdicts, want.verdicts) {
			t.Fatalf("resolve(order %d) = %+v, want %+v", i, got, want)
		}
	}
	if got := planLimits(want.entries); got != "free=1 paid=3" {
		t.Errorf("tiers = %q, want %q", got, "free=1 paid=3")
	}
}
