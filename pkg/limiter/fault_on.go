//go:build faultpoints

package limiter

import "os"

// atFault blocks the calling goroutine forever at the fault point named
// by LIMITER_FAULT_POINT, so that a crash test can SIGKILL the process
// there: between two steps that production code runs back to back. Built
// only with the faultpoints tag (internal/servetest.FaultBinary), never
// into a release.
func atFault(point string) {
	if os.Getenv("LIMITER_FAULT_POINT") == point {
		select {}
	}
}
