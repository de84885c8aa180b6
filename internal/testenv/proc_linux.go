package testenv

import (
	"os/exec"
	"syscall"
)

// setProcAttr makes the kernel kill a private server when the test binary
// dies without running its cleanups (a panic, a -timeout), and keeps it out of
// the terminal's process group so Ctrl-C reaches the test binary first.
func setProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
}
