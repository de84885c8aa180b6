//go:build !unix

package testenv

import "testing"

// Pause needs SIGSTOP; without it the test is skipped.
func Pause(t testing.TB, addr string) {
	t.Helper()
	t.Skipf("pausing %s needs SIGSTOP, which this platform lacks", addr)
}
