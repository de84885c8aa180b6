//go:build !faultpoints

package limiter

// atFault is where a crash test stops the process (see fault_on.go); a
// build without the faultpoints tag has no fault points.
func atFault(string) {}
