// Package benchenv gives benchmarks direct connections to every node of a
// Redis deployment, to load scripts on them and to read the servers' own
// figures (CPU time, memory) around what they measure.
//
// It is apart from testenv, which stays free of client libraries.
package benchenv

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/rueidis"
)

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
