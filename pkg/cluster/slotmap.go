package cluster

import (
	"context"
	"fmt"
	"net"
	"strconv"

	"github.com/redis/rueidis"
)

// hashSlots is the number of hash slots of a Redis Cluster.
const hashSlots = 16384

// SlotMap is which master served each hash slot when it was read: a hint
// for grouping commands by node, never for routing them (rueidis routes,
// and follows MOVED). A stale map only groups commands of two nodes
// together until the next read.
type SlotMap struct {
	nodes  []string          // master addresses
	of     [hashSlots]uint16 // 1 + index in nodes; 0: no master known
	served int               // slots with a master
}

// ReadSlotMap reads the map of a cluster with CLUSTER SLOTS.
func ReadSlotMap(ctx context.Context, c rueidis.Client) (*SlotMap, error) {
	ranges, err := c.Do(ctx, c.B().ClusterSlots().Build()).ToArray()
	if err != nil {
		return nil, err
	}
	m := &SlotMap{}
	index := map[string]uint16{}
	for _, r := range ranges {
		// [start, end, [host, port, id, ...] of the master, replicas...]
		fields, err := r.ToArray()
		if err != nil || len(fields) < 3 {
			return nil, fmt.Errorf("CLUSTER SLOTS: malformed range %v (%v)", r, err)
		}
		start, err1 := fields[0].AsInt64()
		end, err2 := fields[1].AsInt64()
		master, err3 := fields[2].ToArray()
		if err1 != nil || err2 != nil || err3 != nil || len(master) < 2 || start < 0 || end >= hashSlots || start > end {
			return nil, fmt.Errorf("CLUSTER SLOTS: malformed range %v", fields)
		}
		host, _ := master[0].ToString()
		port, _ := master[1].AsInt64()
		addr := net.JoinHostPort(host, strconv.FormatInt(port, 10))
		i, ok := index[addr]
		if !ok {
			m.nodes = append(m.nodes, addr)
			i = uint16(len(m.nodes))
			index[addr] = i
		}
		for s := start; s <= end; s++ {
			if m.of[s] == 0 {
				m.served++
			}
			m.of[s] = i
		}
	}
	return m, nil
}

// Complete reports whether a master served every hash slot.
func (m *SlotMap) Complete() bool { return m != nil && m.served == hashSlots }

// NodeOf returns the address of the master that served hashSlot, or ""
// when none did or m is nil.
func (m *SlotMap) NodeOf(hashSlot uint16) string {
	if m == nil || int(hashSlot) >= hashSlots || m.of[hashSlot] == 0 {
		return ""
	}
	return m.nodes[m.of[hashSlot]-1]
}

// NodeOf returns the address of the master that served hashSlot when the
// client last read the cluster's map (at connect and every ProbeInterval),
// or "" when it does not know (not a cluster, not read yet).
func (c *Client) NodeOf(hashSlot uint16) string { return c.slots.Load().NodeOf(hashSlot) }
