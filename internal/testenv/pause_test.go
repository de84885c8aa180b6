//go:build unix

package testenv

import (
	"testing"
	"time"
)

func TestPauseHangsTheServerUntilCleanup(t *testing.T) {
	t.Parallel()
	s := StartRedis(t)
	t.Run("paused", func(t *testing.T) {
		Pause(t, s.Addr())
		if reply, err := do(s.Addr(), 200*time.Millisecond, "PING"); err == nil {
			t.Fatalf("PING on a paused server: got %v, want a timeout", reply)
		}
	})
	// The subtest's cleanup has resumed the server.
	mustPing(t, s.Addr())
}
