package cluster

import (
	"context"
	"sync"
	"time"

	"github.com/redis/rueidis"
)

// Warmed reports whether the client is ready for a new replica's first
// calls: connected, with the cluster's slots learnt (rueidis reads them to
// connect, the probe for NodeOf), a connection open to every node and
// Options.Scripts loaded on each. Without it, the calls that arrive the
// moment a replica turns ready (a rolling deploy sends them all at once)
// are granted degraded while the client connects, then wait for their
// node's dial and a NOSCRIPT round trip.
//
// It is also true once WarmWithin has passed since New, whatever Redis
// does: readiness waits on it, and a Redis that is down must not keep a
// replica out of the load balancer (each plan's failure mode answers for
// it). Once true it stays true.
func (c *Client) Warmed() bool {
	select {
	case <-c.warmed:
		return true
	default:
		return time.Since(c.started) >= c.opts.WarmWithin
	}
}

// warm opens a connection to every node of client and loads the scripts
// on each, all nodes at once, each within the per-call deadline. Every
// node is a cluster's replicas too: one that takes over after a failover
// then has the scripts already. A node that fails is left as it was: its
// first call dials it, and a script's first EVALSHA there falls back to
// EVAL.
func (c *Client) warm(client rueidis.Client) {
	start := time.Now()
	nodes := client.Nodes()
	failures := make(chan error, len(nodes))
	var wg sync.WaitGroup
	for addr, node := range nodes {
		wg.Go(func() {
			if err := c.warmNode(node); err != nil {
				c.opts.Logger.Warn("could not warm up a redis node; its first calls will connect and load scripts", "node", addr, "err", err)
				failures <- err
			}
		})
	}
	wg.Wait()
	c.opts.Logger.Info("redis warmed up", "nodes", len(nodes), "failed", len(failures), "scripts", len(c.opts.Scripts),
		"took", time.Since(start).Round(time.Microsecond).String())
}

// warmNode sends node one pipeline: PING, which dials it when it has no
// connection yet, then a SCRIPT LOAD of each script. On a hung node these
// few commands keep their places in the connection's queue after the
// deadline, well within the room HonorsDeadlines leaves above
// MaxDirectCalls.
func (c *Client) warmNode(node rueidis.Client) error {
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.Timeout)
	defer cancel()
	cmds := make(rueidis.Commands, 0, 1+len(c.opts.Scripts))
	cmds = append(cmds, node.B().Ping().Build())
	for _, src := range c.opts.Scripts {
		cmds = append(cmds, node.B().ScriptLoad().Script(src).Build())
	}
	for _, res := range node.DoMulti(ctx, cmds...) {
		if err := res.Error(); err != nil {
			return err
		}
	}
	return nil
}
