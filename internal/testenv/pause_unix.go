//go:build unix

package testenv

import (
	"strconv"
	"syscall"
	"testing"
	"time"
)

// Pause stops the Redis server at addr with SIGSTOP, as a hung node would
// be (a frozen VM, a stalled disk): its port still accepts connections, and
// nothing on it answers. t.Cleanup resumes it with SIGCONT. The server must
// be one of this test's private servers (StartRedis, StartCluster).
func Pause(t testing.TB, addr string) {
	t.Helper()
	reply, err := do(addr, time.Second, "INFO", "server")
	if err != nil {
		t.Fatalf("pause %s: INFO server: %v", addr, err)
	}
	info, _ := reply.(string)
	pid, err := strconv.Atoi(infoField(info, "process_id"))
	if err != nil || pid <= 1 {
		t.Fatalf("pause %s: INFO server names no process_id", addr)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("pause %s: SIGSTOP %d: %v", addr, pid, err)
	}
	t.Cleanup(func() {
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
			t.Logf("resume %s: SIGCONT %d: %v", addr, pid, err)
		}
	})
}
