//go:build linux

package benchenv

import (
	"syscall"
	"testing"
	"time"
)

// TestReadMachineCountsThisProcesssWorkAsBusy spins one processor for
// 200ms of this process's CPU time: the machine's busy time grows by at
// least that (less /proc/stat's 10ms ticks), and all its time by more.
func TestReadMachineCountsThisProcesssWorkAsBusy(t *testing.T) {
	const spin = 200 * time.Millisecond
	before := ReadMachine(t)
	cpu := processCPU(t)
	for processCPU(t)-cpu < spin {
		for range 100_000 {
		}
	}
	d := ReadMachine(t).Sub(before)
	if d.Busy < spin-20*time.Millisecond {
		t.Errorf("busy %v after spinning for %v of CPU", d.Busy, spin)
	}
	if d.All < d.Busy {
		t.Errorf("all %v is less than busy %v", d.All, d.Busy)
	}
	if s := d.BusyShare(); s <= 0 || s > 1 {
		t.Errorf("busy share %v, want in (0, 1]", s)
	}
	if got := (Machine{}).Add(d).Add(d); got.Busy != 2*d.Busy || got.All != 2*d.All {
		t.Errorf("%+v added twice is %+v", d, got)
	}
}

func processCPU(t *testing.T) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
