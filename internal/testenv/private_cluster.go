package testenv

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// PrivateCluster is a Redis Cluster of the test's own (StartPrivateCluster):
// its nodes may be killed without disturbing any other test.
type PrivateCluster struct {
	// Addrs are the six nodes, "127.0.0.1:PORT"; the first three started
	// as masters.
	Addrs []string

	t      testing.TB
	dir    string // hack/redis-cluster.sh's DIR: DIR/<port>/redis.pid
	mu     sync.Mutex
	killed map[string]bool
}

// clusterNode is one line of CLUSTER NODES.
type clusterNode struct {
	addr   string // host:port, without the bus port
	master bool
	failed bool // flagged fail or fail?
	slots  [][2]int
}

// nodes returns the cluster's view from the first live node that answers.
func (c *PrivateCluster) nodes() ([]clusterNode, error) {
	var lastErr error
	for _, addr := range c.Addrs {
		if c.isKilled(addr) {
			continue
		}
		reply, err := do(addr, time.Second, "CLUSTER", "NODES")
		if err != nil {
			lastErr = err
			continue
		}
		text, _ := reply.(string)
		return parseClusterNodes(text), nil
	}
	return nil, fmt.Errorf("no node answered CLUSTER NODES: %w", lastErr)
}

// parseClusterNodes parses CLUSTER NODES: "<id> <ip:port@cport> <flags>
// <master> <ping> <pong> <epoch> <link> <slot or range>...".
func parseClusterNodes(text string) []clusterNode {
	var out []clusterNode
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		addr, _, _ := strings.Cut(f[1], "@")
		n := clusterNode{
			addr:   addr,
			master: strings.Contains(f[2], "master"),
			failed: strings.Contains(f[2], "fail"),
		}
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") { // a slot being migrated
				continue
			}
			lo, hi, isRange := strings.Cut(r, "-")
			a, errA := strconv.Atoi(lo)
			b := a
			var errB error
			if isRange {
				b, errB = strconv.Atoi(hi)
			}
			if errA == nil && errB == nil {
				n.slots = append(n.slots, [2]int{a, b})
			}
		}
		out = append(out, n)
	}
	return out
}

// MasterOf returns the address of the live master serving key's hash slot,
// as the cluster sees it now.
func (c *PrivateCluster) MasterOf(key string) string {
	c.t.Helper()
	slot := KeySlot(key)
	nodes, err := c.nodes()
	if err != nil {
		c.t.Fatalf("master of %q: %v", key, err)
	}
	for _, n := range nodes {
		if !n.master || n.failed || c.isKilled(n.addr) {
			continue
		}
		for _, r := range n.slots {
			if slot >= r[0] && slot <= r[1] {
				return n.addr
			}
		}
	}
	c.t.Fatalf("master of %q: no live master serves slot %d", key, slot)
	return ""
}

// Kill SIGKILLs the node at addr, as a crash or a lost machine would, and
// waits until its port is closed. Nothing restarts it.
func (c *PrivateCluster) Kill(addr string) {
	c.t.Helper()
	_, port, _ := net.SplitHostPort(addr)
	data, err := os.ReadFile(filepath.Join(c.dir, port, "redis.pid"))
	if err != nil {
		c.t.Fatalf("kill %s: %v", addr, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		c.t.Fatalf("kill %s: pid file holds %q", addr, data)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		c.t.Fatalf("kill %s (pid %d): %v", addr, pid, err)
	}
	c.mu.Lock()
	if c.killed == nil {
		c.killed = map[string]bool{}
	}
	c.killed[addr] = true
	c.mu.Unlock()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		conn, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err != nil {
			return
		}
		conn.Close()
		time.Sleep(10 * time.Millisecond)
	}
	c.t.Fatalf("kill %s: port still open 5s after SIGKILL", addr)
}

func (c *PrivateCluster) isKilled(addr string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.killed[addr]
}

// AwaitServed waits up to within until every hash slot is served by a
// master that was not killed, as every live node sees it (after Kill: once a
// replica has been promoted and the others know), and returns how long that
// took.
func (c *PrivateCluster) AwaitServed(within time.Duration) time.Duration {
	c.t.Helper()
	start := time.Now()
	for {
		if c.allServed() {
			return time.Since(start)
		}
		if time.Since(start) > within {
			c.t.Fatalf("cluster: some hash slots still without a live master %v after asking", within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// allServed reports whether every live node sees all slots served by
// masters not killed.
func (c *PrivateCluster) allServed() bool {
	for _, addr := range c.Addrs {
		if c.isKilled(addr) {
			continue
		}
		reply, err := do(addr, time.Second, "CLUSTER", "NODES")
		if err != nil {
			return false
		}
		text, _ := reply.(string)
		if !c.slotsServed(parseClusterNodes(text)) {
			return false
		}
	}
	return true
}

func (c *PrivateCluster) slotsServed(nodes []clusterNode) bool {
	served := 0
	for _, n := range nodes {
		if !n.master || n.failed || c.isKilled(n.addr) {
			continue
		}
		for _, r := range n.slots {
			served += r[1] - r[0] + 1
		}
	}
	return served == 16384
}

// KeySlot is the Redis Cluster hash slot of key: CRC16 (XMODEM) of the
// key's hash tag (the part between the first '{' and the next '}', if not
// empty) or of the whole key, modulo 16384.
func KeySlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for k := 0; k < len(key); k++ {
		crc ^= uint16(key[k]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % 16384
}
