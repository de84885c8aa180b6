package lua_test

import (
	"context"
	"crypto/sha1"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/benchenv"
	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/lua"
	"github.com/redis/rueidis"
)

// BenchmarkHeartbeatRefresh measures what one heartbeat refresh costs Redis
// itself, next to a plain `ZADD XX GT` + `PEXPIREAT` pair on the same keys:
// 1000 users holding one slot each, refreshed in 1000-slot batches (the
// heartbeat through lua.HeartbeatMulti, the pair as one pipeline of 2000
// commands), so both sides are batched alike. One op is one round: a few
// batches of each side, back to back, in an order that alternates between
// rounds; each figure is the median of the rounds.
//
// Besides the plain pair it runs the same pair as a script (pair-script):
// TIME, then the ZADD XX GT and the PEXPIREAT, batched alike. It is the
// least a heartbeat script does that takes its time from Redis, and what it
// costs above the plain pair is the price of running any script per slot;
// what the heartbeat costs above it is the heartbeat's own work (reading
// the slot's TTL from its record, pruning, moving both keys' expiry).
//
// Figures per refresh: redis-cpu-µs (the servers' CPU time, user and
// system, from INFO cpu: parsing, the script, replies, and on a cluster
// the replicas applying what the masters send them) and cmd-µs (the time
// INFO commandstats counts in the commands: EVALSHA, or ZADD plus
// PEXPIREAT). On the cluster redis-cpu-µs sums masters and replicas;
// replica-cpu-µs is the replicas' share. The ratios (heartbeat/pair,
// heartbeat/pair-script, pair-script/pair) are of redis-cpu-µs, each the
// median of the rounds' own ratios.
//
//	LIMITER_TEST_REDIS=host:port LIMITER_TEST_REDIS_CLUSTER=h1:p1,... \
//	  go test -run '^$' -bench HeartbeatRefresh -benchtime 7x ./pkg/lua
func BenchmarkHeartbeatRefresh(b *testing.B) {
	b.Run("standalone", func(b *testing.B) { benchRefresh(b, []string{testenv.Redis(b)}) })
	b.Run("cluster", func(b *testing.B) { benchRefresh(b, testenv.Cluster(b)) })
}

const (
	refreshUsers   = 1000
	refreshBatches = 5 // per side and round
	refreshTTL     = 2 * time.Minute
)

// pairSource is the pair as a script: KEYS[1] the slots, ARGV[1] the
// stream id, ARGV[2] the ttl (ms).
const pairSource = `local t = redis.call('TIME')
local ttl = tonumber(ARGV[2])
local expires = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + ttl
redis.call('ZADD', KEYS[1], 'XX', 'GT', string.format('%d', expires), ARGV[1])
return redis.call('PEXPIREAT', KEYS[1], string.format('%d', expires + ttl))`

func benchRefresh(b *testing.B, addrs []string) {
	ctx := context.Background()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: addrs, DisableCache: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	servers := benchenv.Dial(b, c)

	run := keys.NewStreamID()[:12]
	slots := make([]lua.HeartbeatArgs, refreshUsers)
	for i := range slots {
		slots[i] = lua.HeartbeatArgs{Key: "bench-refresh:" + run + ":{" + strconv.Itoa(i) + "}", StreamID: "s", TTL: refreshTTL}
		if got, err := lua.Acquire(ctx, c, slots[i].Key, "s", 3, refreshTTL, lua.Record{}, false); err != nil || !got.Granted {
			b.Fatalf("acquire %s = %+v, %v", slots[i].Key, got, err)
		}
	}
	b.Cleanup(func() {
		for _, s := range slots {
			c.Do(ctx, c.B().Del().Key(s.Key).Build())
			c.Do(ctx, c.B().Del().Key(keys.SlotRecords(s.Key)).Build())
		}
	})
	pairSHA := fmt.Sprintf("%x", sha1.Sum([]byte(pairSource)))
	benchenv.LoadScript(b, servers.Masters, pairSource)

	sides := []struct {
		name  string
		cmd   string // the command commandstats counts
		batch func()
	}{
		{"heartbeat", "evalsha", func() {
			beats, errs := lua.HeartbeatMulti(ctx, c, slots, nil)
			for i, err := range errs {
				if err != nil || !beats[i].Alive {
					b.Fatalf("heartbeat %s: %+v, %v", slots[i].Key, beats[i], err)
				}
			}
		}},
		{"pair", "zadd+pexpireat", func() {
			now := time.Now().UnixMilli()
			expires, at := float64(now+refreshTTL.Milliseconds()), now+2*refreshTTL.Milliseconds()
			cmds := make(rueidis.Commands, 0, 2*len(slots))
			for _, s := range slots {
				cmds = append(cmds,
					c.B().Zadd().Key(s.Key).Xx().Gt().ScoreMember().ScoreMember(expires, s.StreamID).Build(),
					c.B().Pexpireat().Key(s.Key).MillisecondsTimestamp(at).Build())
			}
			for _, resp := range c.DoMulti(ctx, cmds...) {
				if err := resp.Error(); err != nil {
					b.Fatal(err)
				}
			}
		}},
		{"pair-script", "evalsha", func() {
			ttl := strconv.FormatInt(refreshTTL.Milliseconds(), 10)
			cmds := make(rueidis.Commands, len(slots))
			for i, s := range slots {
				cmds[i] = c.B().Evalsha().Sha1(pairSHA).Numkeys(1).Key(s.Key).Arg(s.StreamID, ttl).Build()
			}
			for _, resp := range c.DoMulti(ctx, cmds...) {
				if err := resp.Error(); err != nil {
					b.Fatal(err)
				}
			}
		}},
	}
	for _, side := range sides { // loads the scripts, warms the servers
		side.batch()
	}

	type figures struct{ cpu, replicaCPU, cmd []float64 }
	got := make(map[string]*figures)
	round := 0
	for b.Loop() {
		order := slices.Clone(sides)
		if round%2 == 1 {
			slices.Reverse(order)
		}
		round++
		for _, side := range order {
			before := sample(b, servers)
			for range refreshBatches {
				side.batch()
			}
			after := sample(b, servers)
			n := float64(refreshBatches * len(slots))
			f := got[side.name]
			if f == nil {
				f = &figures{}
				got[side.name] = f
			}
			f.cpu = append(f.cpu, (after.cpu-before.cpu)/n)
			f.replicaCPU = append(f.replicaCPU, (after.replicaCPU-before.replicaCPU)/n)
			var usec float64
			for cmd := range strings.SplitSeq(side.cmd, "+") {
				usec += float64(after.usec[cmd] - before.usec[cmd])
			}
			f.cmd = append(f.cmd, usec/n)
		}
	}
	ratio := func(a, b string) float64 {
		r := make([]float64, len(got[a].cpu))
		for i := range r {
			r[i] = got[a].cpu[i] / got[b].cpu[i]
		}
		return limitertest.Median(r)
	}
	for _, side := range sides {
		f := got[side.name]
		b.ReportMetric(limitertest.Median(f.cpu), side.name+"-redis-cpu-µs")
		b.ReportMetric(limitertest.Median(f.cmd), side.name+"-cmd-µs")
		if len(servers.Replicas) > 0 {
			b.ReportMetric(limitertest.Median(f.replicaCPU), side.name+"-replica-cpu-µs")
		}
	}
	b.ReportMetric(ratio("heartbeat", "pair"), "heartbeat/pair")
	b.ReportMetric(ratio("heartbeat", "pair-script"), "heartbeat/pair-script")
	b.ReportMetric(ratio("pair-script", "pair"), "pair-script/pair")
	b.Logf("%d rounds; redis-cpu-µs per refresh, round by round: heartbeat %.2f, pair %.2f, pair-script %.2f",
		round, got["heartbeat"].cpu, got["pair"].cpu, got["pair-script"].cpu)
}

// serverSample is the servers' CPU time (µs) and commandstats usec by
// command (lower case), summed over the nodes.
type serverSample struct {
	cpu, replicaCPU float64
	usec            map[string]int64
}

// sample reads the figures of every node of servers.
func sample(b *testing.B, servers benchenv.Nodes) serverSample {
	b.Helper()
	out := serverSample{usec: map[string]int64{}}
	for _, node := range servers.Masters {
		out.cpu += benchenv.CPU(b, node)
		info, err := node.Do(context.Background(), node.B().Info().Section("commandstats").Build()).ToString()
		if err != nil {
			b.Fatal(err)
		}
		for line := range strings.Lines(info) {
			rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_")
			if !ok {
				continue
			}
			name, fields, _ := strings.Cut(rest, ":")
			for field := range strings.SplitSeq(fields, ",") {
				if v, ok := strings.CutPrefix(field, "usec="); ok {
					n, _ := strconv.ParseInt(v, 10, 64)
					out.usec[name] += n
				}
			}
		}
	}
	for _, node := range servers.Replicas {
		cpu := benchenv.CPU(b, node)
		out.cpu += cpu
		out.replicaCPU += cpu
	}
	return out
}
