package cluster

import (
	"context"
	"strconv"
	"strings"

	"github.com/redis/rueidis"
)

// minRedisMajor is the oldest Redis the scripts work on (ZADD GT, TIME in
// scripts replicated as effects).
const minRedisMajor = 7

// checkServers logs, at ERROR, every node whose settings break the
// limiter's guarantees: a Redis older than 7, or a maxmemory with an
// evicting policy, which would drop live slots (every slot key carries an
// expiry, so volatile-* policies pick exactly them). It never stops the
// limiter: the operator must hear it, not lose the service over it.
//
// Each node's read has the per-call deadline, as the limiter's calls do:
// it may dial (a second connection of a standalone client), and a call of
// the limiter waiting on that dial must still end by its own deadline (see
// HonorsDeadlines).
func (c *Client) checkServers(client rueidis.Client) {
	for addr, node := range client.Nodes() {
		ctx, cancel := context.WithTimeout(context.Background(), c.opts.Timeout)
		info, err := node.Do(ctx, node.B().Info().Section("server", "memory").Build()).ToString()
		cancel()
		if err != nil {
			c.opts.Logger.Warn("could not read the Redis settings the limiter depends on", "node", addr, "err", err)
			continue
		}
		for _, problem := range serverProblems(info) {
			c.opts.Logger.Error("redis is misconfigured for the limiter", "node", addr, "problem", problem)
		}
	}
}

// serverProblems reads an INFO reply and names what breaks the limiter.
func serverProblems(info string) []string {
	fields := map[string]string{}
	for _, line := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			fields[k] = v
		}
	}
	var problems []string
	if v := fields["redis_version"]; v != "" {
		major, _ := strconv.Atoi(strings.SplitN(v, ".", 2)[0])
		if major < minRedisMajor {
			problems = append(problems, "redis_version "+v+" is older than 7.0; the scripts need ZADD GT")
		}
	}
	policy := fields["maxmemory_policy"]
	if fields["maxmemory"] != "0" && fields["maxmemory"] != "" && policy != "" && policy != "noeviction" {
		problems = append(problems, "maxmemory-policy "+policy+" with maxmemory set can evict live slots; use noeviction")
	}
	return problems
}
