package client_test

import (
	"testing"
	"time"

	"github.com/joishi/limiter/pkg/client"
)

// TestRetryAfterHeaderReadsDigitsAndDates: a Retry-After header is delay
// seconds of ASCII digits alone (more than a day reads as a day, never a
// wrapped or negative wait), or an HTTP date ahead, in any of its three
// forms, read as UTC; anything else says nothing. The Python and
// TypeScript clients read it alike (their tests of parse_retry_after and
// parseRetryAfter).
func TestRetryAfterHeaderReadsDigitsAndDates(t *testing.T) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		header string
		want   time.Duration
	}{
		{"3", 3 * time.Second},
		{" 2 ", 2 * time.Second},
		{"0", 0},
		{"86400", 24 * time.Hour},
		{"86401", 24 * time.Hour},
		{"10000000000", 24 * time.Hour},          // × 1s overflows int64 nanoseconds
		{"18446744074", 24 * time.Hour},          // wraps to 0.29s
		{"99999999999999999999", 24 * time.Hour}, // past uint64
		{"+3", 0},
		{"-1", 0},
		{"²", 0},
		{"3s", 0},
		{"", 0},
		{"Mon, 07 Dec 2026 12:00:05 GMT", 5 * time.Second},  // IMF-fixdate
		{"Monday, 07-Dec-26 12:00:05 GMT", 5 * time.Second}, // RFC 850
		{"Mon Dec  7 12:00:05 2026", 5 * time.Second},       // asctime, no zone: UTC
		{"Mon, 07 Dec 2026 11:59:55 GMT", 0},                // past
	} {
		if got := client.RetryAfterHeader(tc.header, now); got != tc.want {
			t.Errorf("Retry-After %q = %v, want %v", tc.header, got, tc.want)
		}
	}
}
