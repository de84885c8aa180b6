package admin

import "testing"

func TestNormalizeReason(t *testing.T) {
	if got := normalizeReason("  ticket 1\n\n\tlocked\u00a0out  "); got != "ticket 1 locked out" {
		t.Errorf("normalizeReason: got %q, want %q", got, "ticket 1 locked out")
	}
}
