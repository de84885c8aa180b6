// Package benchenv gives benchmarks direct connections to every node of a
// Redis deployment, to load scripts on them and to read the servers' own
// figures (CPU time, memory) around what they measure, and the machine's
// own (ReadMachine).
//
// It is apart from testenv, which stays free of client libraries.
package benchenv

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"
)

// LightRate is the light load, in pairs/s, at which the pool benchmarks
// time an acquire (pkg/limiter's BenchmarkPoolsAcquireRelease) and its
// bound (pkg/lua's BenchmarkPoolsLatencyBound): one rate for both, as
// hack/bench.sh prints them side by side.
const LightRate = 2000

// Nodes are direct connections to every node of a deployment.
type Nodes struct {
	Masters, Replicas []rueidis.Client
}

// Dial connects to each node of c's deployment (the one node of a
// standalone client), sorted by ROLE into masters and replicas. The
// connections close on tb's cleanup.
func Dial(tb testing.TB, c rueidis.Client) Nodes {
	tb.Helper()
	var n Nodes
	for addr := range c.Nodes() {
		node, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, ForceSingleClient: true, DisableCache: true})
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(node.Close)
		role, err := node.Do(context.Background(), node.B().Role().Build()).ToArray()
		if err != nil || len(role) == 0 {
			tb.Fatalf("ROLE on %s: %v", addr, err)
		}
		if kind, _ := role[0].ToString(); kind == "slave" {
			n.Replicas = append(n.Replicas, node)
		} else {
			n.Masters = append(n.Masters, node)
		}
	}
	return n
}

// LoadScript loads src on each of nodes (SCRIPT LOAD), so that the
// EVALSHAs of a benchmark find it from the first call.
func LoadScript(tb testing.TB, nodes []rueidis.Client, src string) {
	tb.Helper()
	for _, node := range nodes {
		if err := node.Do(context.Background(), node.B().ScriptLoad().Script(src).Build()).Error(); err != nil {
			tb.Fatal(err)
		}
	}
}

// CPU is the CPU time one server has used, user and system, in µs
// (INFO cpu).
func CPU(tb testing.TB, node rueidis.Client) float64 {
	tb.Helper()
	cpu := readInfo(tb, node, "cpu")
	return 1e6 * (infoFloat(tb, cpu, "cpu", "used_cpu_user") + infoFloat(tb, cpu, "cpu", "used_cpu_sys"))
}

// InfoInt is the integer field of INFO section on node (used_memory of
// memory, say).
func InfoInt(tb testing.TB, node rueidis.Client, section, field string) int64 {
	tb.Helper()
	v, err := strconv.ParseInt(infoField(tb, readInfo(tb, node, section), section, field), 10, 64)
	if err != nil {
		tb.Fatalf("INFO %s %s: %v", section, field, err)
	}
	return v
}

func infoFloat(tb testing.TB, info, section, field string) float64 {
	tb.Helper()
	v, err := strconv.ParseFloat(infoField(tb, info, section, field), 64)
	if err != nil {
		tb.Fatalf("INFO %s %s: %v", section, field, err)
	}
	return v
}

// readInfo is node's reply to INFO section.
func readInfo(tb testing.TB, node rueidis.Client, section string) string {
	tb.Helper()
	info, err := node.Do(context.Background(), node.B().Info().Section(section).Build()).ToString()
	if err != nil {
		tb.Fatal(err)
	}
	return info
}

// infoField is field's value in info, the reply to INFO section
// ("field:value" lines).
func infoField(tb testing.TB, info, section, field string) string {
	tb.Helper()
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	tb.Fatalf("INFO %s has no %s", section, field)
	return ""
}

// Machine is what the machine's processors did, all of them together, as
// /proc/stat counts it since boot: Busy running any process or the kernel
// (user, nice, system, irq, softirq), and All, Busy and idle (idle,
// iowait). Time stolen by a hypervisor is in neither: the machine could
// not have used it.
type Machine struct {
	Busy, All time.Duration
}

// Sub is m less an earlier reading.
func (m Machine) Sub(earlier Machine) Machine {
	return Machine{Busy: m.Busy - earlier.Busy, All: m.All - earlier.All}
}

// Add is m and another reading's difference together.
func (m Machine) Add(other Machine) Machine {
	return Machine{Busy: m.Busy + other.Busy, All: m.All + other.All}
}

// BusyShare is the share of All that was Busy: 1 when every processor was
// busy throughout.
func (m Machine) BusyShare() float64 {
	if m.All <= 0 {
		return 0
	}
	return float64(m.Busy) / float64(m.All)
}

// userHZ is the unit of /proc/stat's times: 1/100 s on every Linux ABI
// (USER_HZ, whatever the kernel's own tick).
const userHZ = 100

// ReadMachine reads /proc/stat's line of all processors; zero where there
// is no /proc/stat (not Linux), so that a reading's All is 0.
func ReadMachine(tb testing.TB) Machine {
	tb.Helper()
	stat, err := os.ReadFile("/proc/stat")
	if errors.Is(err, fs.ErrNotExist) {
		return Machine{}
	}
	if err != nil {
		tb.Fatalf("the machine's CPU time: %v", err)
	}
	line, _, _ := strings.Cut(string(stat), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		tb.Fatalf("/proc/stat begins %q, not the cpu line of user nice system idle iowait irq softirq", line)
	}
	var t [7]time.Duration
	for i := range t {
		n, err := strconv.ParseInt(f[i+1], 10, 64)
		if err != nil {
			tb.Fatalf("/proc/stat's cpu line %q: %v", line, err)
		}
		t[i] = time.Duration(n) * time.Second / userHZ
	}
	busy := t[0] + t[1] + t[2] + t[5] + t[6]
	return Machine{Busy: busy, All: busy + t[3] + t[4]}
}
