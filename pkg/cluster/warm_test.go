package cluster

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/keys"
	"github.com/redis/rueidis"
)

// awaitWarmed polls c.Warmed until it is true and returns how long that
// took; it fails the test after within.
func awaitWarmed(t *testing.T, c *Client, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for !c.Warmed() {
		if time.Since(start) > within {
			t.Fatalf("not warmed within %v", within)
		}
		time.Sleep(time.Millisecond)
	}
	return time.Since(start)
}

// TestWarmedLoadsTheScriptsOnEveryNode: Warmed turns true, long before
// its bound, once every node holds a connection and every script; a
// script's first EVALSHA then runs, on any node.
func TestWarmedLoadsTheScriptsOnEveryNode(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		addrs func(t *testing.T) []string
	}{
		{"standalone", func(t *testing.T) []string { return []string{testenv.Redis(t)} }},
		{"cluster", func(t *testing.T) []string { return testenv.Cluster(t) }},
		{"embedded", func(t *testing.T) []string { return nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// A script no earlier run loaded: this client's warm-up must.
			script := "-- warm-up test " + keys.NewStreamID() + "\nreturn 1"
			sum := sha1.Sum([]byte(script))
			sha := hex.EncodeToString(sum[:])
			c, err := New(Options{Addrs: tc.addrs(t), Scripts: []string{script}, WarmWithin: time.Minute, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.Close)
			awaitWarmed(t, c, 10*time.Second)

			redis := connected(t, c)
			nodes := redis.Nodes()
			if tc.name == "cluster" && len(nodes) < 3 {
				t.Fatalf("the cluster client knows %d nodes, want its 3 masters at least", len(nodes))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			for addr, node := range nodes {
				got, err := node.Do(ctx, node.B().ScriptExists().Sha1(sha).Build()).AsIntSlice()
				if err != nil || len(got) != 1 || got[0] != 1 {
					t.Errorf("SCRIPT EXISTS on %s after the warm-up: %v, %v; want [1]", addr, got, err)
				}
			}
			// Through the client, as the limiter calls: EVALSHA, and no EVAL.
			if err := redis.Do(ctx, redis.B().Evalsha().Sha1(sha).Numkeys(1).Key("{warm}").Build()).Error(); err != nil {
				t.Errorf("EVALSHA after the warm-up: %v", err)
			}
		})
	}
}

// TestWarmedWithinTheBoundWhenRedisIsDown: with nothing answering, Warmed
// turns true WarmWithin after New, so readiness never waits for Redis.
func TestWarmedWithinTheBoundWhenRedisIsDown(t *testing.T) {
	t.Parallel()
	const bound = 300 * time.Millisecond
	for _, tc := range []struct {
		name string
		addr func(t *testing.T) string
	}{
		{"nothing listens", func(t *testing.T) string { return testenv.FreeAddr(t) }},
		{"a black hole", func(t *testing.T) string { return testenv.BlackHole(t) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			c, err := New(Options{Addrs: []string{tc.addr(t)}, WarmWithin: bound, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.Close)
			if c.Warmed() && time.Since(start) < bound {
				t.Error("warmed at once, with nothing answering")
			}
			awaitWarmed(t, c, 5*time.Second)
			if took := time.Since(start); took < bound || took > bound+time.Second {
				t.Errorf("warmed %v after New, want the bound %v (+1s for a loaded machine)", took, bound)
			}
		})
	}
}

// TestEmbeddedStoreTakesALargePipeline: rueidis writes a pipeline whole
// before it reads a reply, as the warm-up's SCRIPT LOADs are sent; the
// embedded store, on a connection with no buffer of its own, must keep
// reading it while its replies wait.
func TestEmbeddedStoreTakesALargePipeline(t *testing.T) {
	t.Parallel()
	c, err := New(Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	redis := connected(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var cmds rueidis.Commands
	for i := range 64 {
		cmds = append(cmds, redis.B().Set().Key("big:"+string(rune('a'+i%26))).Value(strings.Repeat("x", 16<<10)).Build())
	}
	for i, res := range redis.DoMulti(ctx, cmds...) {
		if err := res.Error(); err != nil {
			t.Fatalf("command %d of a 1 MiB pipeline: %v", i, err)
		}
	}
}
