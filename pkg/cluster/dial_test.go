package cluster

import (
	"log/slog"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/testenv"
)

func TestDialTimeoutFollowsTheCallTimeout(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		opts     Options
		embedded bool
		want     time.Duration
	}{
		{"no timeout set: the default call timeout", Options{}, false, DefaultTimeout},
		{"a call timeout set: that timeout", Options{Timeout: 400 * time.Millisecond}, false, 400 * time.Millisecond},
		{"a dial timeout set: that one", Options{Timeout: 400 * time.Millisecond, DialTimeout: 3 * time.Second}, false, 3 * time.Second},
		{"embedded: the embedded store's longer call timeout", Options{Timeout: time.Millisecond}, true, EmbeddedMinTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := tc.opts
			opts.Logger = slog.New(slog.DiscardHandler)
			if !tc.embedded {
				opts.Addrs = []string{testenv.FreeAddr(t)} // nothing listens: the client keeps dialling
			}
			c, err := New(opts)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.Close)
			if got := c.clientOption().Dialer.Timeout; got != tc.want {
				t.Errorf("dial timeout: got %v, want %v", got, tc.want)
			}
		})
	}
}
