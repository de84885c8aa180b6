//go:build unix

package limiter_test

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/cluster"
)

// BenchmarkHeartbeatRefresh measures what one heartbeat refresh costs
// Redis, on the standalone server. One op refreshes benchBatch held slots
// (one per user) twice, in alternating order: once with HeartbeatBatch, as
// the library sends it, and once with the plain pair a refresh cannot do
// without, ZADD key XX GT <now+ttl> <stream> and PEXPIREAT key <now+2ttl>
// per slot, pipelined in one DoMulti, on the same keys. INFO, read between
// the halves, gives Redis' own figures, so no client cost counts:
//
//   - script-redis-us/refresh, plain-redis-us/refresh: time Redis spent in
//     the commands (INFO commandstats usec): for the library the scripts
//     (EVAL*, FCALL*: commands a script calls are counted in their own
//     lines too), or every command when it ran no script;
//   - script-cpu-us/refresh, plain-cpu-us/refresh: the server's CPU time
//     (INFO cpu used_cpu_user + used_cpu_sys), reading requests and
//     writing replies included.
//
// Nothing else may use the server meanwhile (hack/bench.sh sees to it).
func BenchmarkHeartbeatRefresh(b *testing.B) {
	b.Run(limitertest.Standalone.String(), func(b *testing.B) {
		redis := cluster.Options{Timeout: benchTimeout, Logger: slog.New(slog.DiscardHandler)}
		e := newEnv(b, limitertest.Options{Backend: limitertest.Standalone, Redis: redis})
		c := newRawClient(b, e)
		reqs := acquireBenchSlots(b, e, nil)
		tier, _ := e.table.Lookup(benchPlan)
		ttl := tier.SlotTTL.Milliseconds()
		keys := make([]string, len(reqs))
		for i, r := range reqs {
			keys[i] = e.key(b, r.UserID)
		}
		ctx := context.Background()
		script := func() {
			results, errs := e.lim.HeartbeatBatch(ctx, reqs)
			for i, err := range errs {
				if err != nil || !results[i].Alive || results[i].Degraded {
					b.Fatalf("HeartbeatBatch: slot %d: %+v, %v; want alive and not degraded", i, results[i], err)
				}
			}
		}
		cmds := make(rueidis.Commands, 0, 2*len(reqs))
		plain := func() {
			now := time.Now().UnixMilli()
			cmds = cmds[:0]
			for i, r := range reqs {
				cmds = append(cmds,
					c.B().Zadd().Key(keys[i]).Xx().Gt().ScoreMember().ScoreMember(float64(now+ttl), r.StreamID).Build(),
					c.B().Pexpireat().Key(keys[i]).MillisecondsTimestamp(now+2*ttl).Build())
			}
			for i, resp := range c.DoMulti(ctx, cmds...) {
				if err := resp.Error(); err != nil {
					b.Fatalf("plain refresh: command %d: %v", i, err)
				}
			}
		}
		script() // loads the script, if needed, before anything is counted
		var scriptCost, plainCost redisCost
		last := readRedisStats(b, c)
		b.ResetTimer()
		for i := range b.N {
			halves := []struct {
				run  func()
				cost *redisCost
				ran  func(before, after redisStats) redisCost
			}{{script, &scriptCost, scriptDelta}, {plain, &plainCost, commandDelta}}
			if i%2 == 1 {
				halves[0], halves[1] = halves[1], halves[0]
			}
			for _, h := range halves {
				h.run()
				now := readRedisStats(b, c)
				h.cost.add(h.ran(last, now))
				last = now
			}
		}
		b.StopTimer()
		refreshes := float64(b.N * len(reqs))
		b.ReportMetric(scriptCost.usec/refreshes, "script-redis-us/refresh")
		b.ReportMetric(plainCost.usec/refreshes, "plain-redis-us/refresh")
		b.ReportMetric(scriptCost.cpu/refreshes, "script-cpu-us/refresh")
		b.ReportMetric(plainCost.cpu/refreshes, "plain-cpu-us/refresh")
	})
}

// redisStats is what INFO cpu commandstats says: the server's CPU time so
// far, and per command its calls and microseconds.
type redisStats struct {
	cpuUsec  float64
	commands map[string]commandStats
}

type commandStats struct{ calls, usec int64 }

// redisCost is a cost in Redis microseconds: in commands, and of CPU.
type redisCost struct{ usec, cpu float64 }

func (r *redisCost) add(o redisCost) { r.usec += o.usec; r.cpu += o.cpu }

// readRedisStats sends INFO cpu commandstats on c, a standalone client.
func readRedisStats(b *testing.B, c rueidis.Client) redisStats {
	b.Helper()
	info, err := c.Do(context.Background(), c.B().Info().Section("cpu", "commandstats").Build()).ToString()
	if err != nil {
		b.Fatalf("INFO: %v", err)
	}
	s := redisStats{commands: map[string]commandStats{}}
	for line := range strings.Lines(info) {
		name, value, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch {
		case name == "used_cpu_user" || name == "used_cpu_sys":
			sec, _ := strconv.ParseFloat(value, 64)
			s.cpuUsec += sec * 1e6
		case strings.HasPrefix(name, "cmdstat_"):
			var cs commandStats
			for field := range strings.SplitSeq(value, ",") {
				k, v, _ := strings.Cut(field, "=")
				switch k {
				case "calls":
					cs.calls, _ = strconv.ParseInt(v, 10, 64)
				case "usec":
					cs.usec, _ = strconv.ParseInt(v, 10, 64)
				}
			}
			s.commands[strings.TrimPrefix(name, "cmdstat_")] = cs
		}
	}
	return s
}

// scriptCommands run scripts and functions: their time includes that of
// the commands they call, which commandstats counts again on their own.
var scriptCommands = []string{"eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro"}

// scriptDelta is the cost between two readings of a half that may run
// scripts: the scripts' time when it ran any, else every command's.
func scriptDelta(before, after redisStats) redisCost {
	cost := redisCost{cpu: after.cpuUsec - before.cpuUsec}
	calls := int64(0)
	for _, name := range scriptCommands {
		calls += after.commands[name].calls - before.commands[name].calls
		cost.usec += float64(after.commands[name].usec - before.commands[name].usec)
	}
	if calls == 0 {
		return commandDelta(before, after)
	}
	return cost
}

// commandDelta is the cost between two readings of a half that runs no
// script: every command's time but INFO's and the client's health PINGs.
func commandDelta(before, after redisStats) redisCost {
	cost := redisCost{cpu: after.cpuUsec - before.cpuUsec}
	for name, s := range after.commands {
		if name != "info" && name != "ping" {
			cost.usec += float64(s.usec - before.commands[name].usec)
		}
	}
	return cost
}
