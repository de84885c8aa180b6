//go:build !linux

package testenv

import "os/exec"

// setProcAttr is a no-op where Pdeathsig does not exist; cleanups stop servers.
func setProcAttr(*exec.Cmd) {}
