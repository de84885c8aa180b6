package tiers

import (
	"strings"
	"sync"
	"testing"
	"time"
)

func TestValidate(t *testing.T) {
	valid := Tier{Plan: "paid", MaxConcurrentStreams: 3}.WithDefaults()
	cases := []struct {
		name    string
		mutate  func(*Tier)
		wantErr string
	}{
		{"the defaults are valid", func(*Tier) {}, ""},
		{"zero streams is allowed", func(t *Tier) { t.MaxConcurrentStreams = 0 }, ""},
		{"a negative limit is refused", func(t *Tier) { t.MaxConcurrentStreams = -1 }, "maxConcurrentStreams must be >= 0, got -1"},
		{"a limit of 1000 is allowed", func(t *Tier) { t.MaxConcurrentStreams = 1000 }, ""},
		{"a limit above 1000 is refused", func(t *Tier) { t.MaxConcurrentStreams = 1001 }, "maxConcurrentStreams must be <= 1000, got 1001"},
		{"a limit of 100000 is refused", func(t *Tier) { t.MaxConcurrentStreams = 100_000 }, "maxConcurrentStreams must be <= 1000, got 100000"},
		{"an empty plan is refused", func(t *Tier) { t.Plan = "" }, "plan is required"},
		{"a plan with a space is refused", func(t *Tier) { t.Plan = "pro plan" }, "must be 1-63 characters"},
		{"heartbeat above ttl/3 is refused", func(t *Tier) { t.HeartbeatInterval = 41 * time.Second }, "heartbeatInterval must be <= slotTTL/3 (40s), got 41s"},
		{"heartbeat at ttl/3 is allowed", func(t *Tier) { t.HeartbeatInterval = 40 * time.Second }, ""},
		{"a zero heartbeat is refused", func(t *Tier) { t.HeartbeatInterval = 0 }, "heartbeatInterval must be at least 1ms"},
		// heartbeat_interval_ms is whole milliseconds, at least 1: under
		// 1ms it would read 0.
		{"a heartbeat under 1ms is refused", func(t *Tier) { t.HeartbeatInterval = 500 * time.Microsecond }, "heartbeatInterval must be at least 1ms (heartbeat_interval_ms is whole milliseconds), got 500µs"},
		{"a heartbeat of 1ms is allowed", func(t *Tier) { t.HeartbeatInterval = time.Millisecond }, ""},
		{"a tiny ttl is refused", func(t *Tier) { t.SlotTTL = time.Millisecond }, "slotTTL must be between 100ms and 24h0m0s, got 1ms"},
		{"an unknown failure mode is refused", func(t *Tier) { t.FailureMode = "Sometimes" }, `failureMode must be Open or Closed, got "Sometimes"`},
		{"no wait is the default", func(t *Tier) { t.MaxWait = 0 }, ""},
		{"a wait of 60s is allowed", func(t *Tier) { t.MaxWait = 60 * time.Second }, ""},
		{"a wait above 60s is refused", func(t *Tier) { t.MaxWait = 61 * time.Second }, "maxWait must be between 0s (no waiting) and 60s, got 1m1s"},
		{"a negative wait is refused", func(t *Tier) { t.MaxWait = -time.Second }, "maxWait must be between 0s (no waiting) and 60s, got -1s"},
		{"priority 0 is the default", func(t *Tier) { t.Priority = 0 }, ""},
		{"priority 9 is allowed", func(t *Tier) { t.Priority = 9 }, ""},
		{"priority 10 is refused", func(t *Tier) { t.Priority = 10 }, "priority must be 0 to 9 (higher is served first), got 10"},
		{"a negative priority is refused", func(t *Tier) { t.Priority = -1 }, "priority must be 0 to 9 (higher is served first), got -1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tier := valid
			tc.mutate(&tier)
			err := tier.Validate()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Validate() = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestWithDefaultsKeepsHeartbeatWithinShortTTL(t *testing.T) {
	got := Tier{Plan: "x", MaxConcurrentStreams: 1, SlotTTL: 3 * time.Second}.WithDefaults()
	if got.HeartbeatInterval != time.Second {
		t.Fatalf("HeartbeatInterval = %s, want 1s (slotTTL/3)", got.HeartbeatInterval)
	}
	if err := got.Validate(); err != nil {
		t.Fatalf("Validate() = %v", err)
	}
}

func TestTableReplaceIsAllOrNothing(t *testing.T) {
	table := NewTable()
	if table.IsSynced() {
		t.Fatal("a new table reports synced")
	}
	if err := table.Replace(Defaults()); err != nil {
		t.Fatal(err)
	}
	if !table.IsSynced() {
		t.Fatal("table not synced after Replace")
	}
	bad := append(Defaults(), Tier{Plan: "free", MaxConcurrentStreams: 9}.WithDefaults())
	if err := table.Replace(bad); err == nil || !strings.Contains(err.Error(), "defined twice") {
		t.Fatalf("Replace(duplicate) = %v, want a duplicate-plan error", err)
	}
	if got, _ := table.Lookup("free"); got.MaxConcurrentStreams != 1 {
		t.Fatalf("free limit after a refused Replace = %d, want 1", got.MaxConcurrentStreams)
	}
	if got := table.List(); len(got) != 2 || got[0].Plan != "free" || got[1].Plan != "paid" {
		t.Fatalf("List() = %+v, want free then paid", got)
	}
}

func TestTableConcurrentReadsDuringReplace(t *testing.T) {
	table := NewTable()
	_ = table.Replace(Defaults())
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if tier, ok := table.Lookup("paid"); !ok || (tier.MaxConcurrentStreams != 3 && tier.MaxConcurrentStreams != 5) {
					t.Errorf("Lookup(paid) = %+v, %v: saw a torn or missing tier", tier, ok)
					return
				}
			}
		}()
	}
	for i := range 1000 {
		limit := 3
		if i%2 == 0 {
			limit = 5
		}
		_ = table.Replace([]Tier{Defaults()[0], Tier{Plan: "paid", MaxConcurrentStreams: limit}.WithDefaults()})
	}
	close(stop)
	wg.Wait()
}

func TestARemovedPlanStillGovernsHeldSlots(t *testing.T) {
	table := NewTable()
	gold := Tier{Plan: "gold", MaxConcurrentStreams: 5, SlotTTL: 30 * time.Second}.WithDefaults()
	if err := table.Replace(append(Defaults(), gold)); err != nil {
		t.Fatal(err)
	}
	if err := table.Replace(Defaults()); err != nil {
		t.Fatal(err)
	}
	if _, ok := table.Lookup("gold"); ok {
		t.Error("a removed plan is still accepted for new acquires")
	}
	if got, ok := table.LookupHeld("gold"); !ok || got != gold {
		t.Errorf("LookupHeld(gold) after removal = %+v, %v; want its last definition", got, ok)
	}
	if _, ok := table.LookupHeld("never"); ok {
		t.Error("LookupHeld found a plan that never existed")
	}
	gold.MaxConcurrentStreams = 7
	if err := table.Replace(append(Defaults(), gold)); err != nil {
		t.Fatal(err)
	}
	if got, _ := table.LookupHeld("gold"); got.MaxConcurrentStreams != 7 {
		t.Errorf("LookupHeld(gold) after it came back = %+v, want the tier in force", got)
	}
}

// TestChangedIsClosedByTheNextReplace: a reader that took Changed before
// reading learns of the next Replace that succeeds, and of no refused one.
func TestChangedIsClosedByTheNextReplace(t *testing.T) {
	table := NewTable()
	before := table.Changed()
	if err := table.Replace(Defaults()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-before:
	default:
		t.Fatal("the channel taken before Replace is open after it; want closed")
	}
	after := table.Changed()
	if err := table.Replace(append(Defaults(), Defaults()[0])); err == nil {
		t.Fatal("Replace(duplicate) succeeded; want refused")
	}
	select {
	case <-after:
		t.Fatal("the channel taken after the last Replace is closed by a refused one; want open")
	default:
	}
}
