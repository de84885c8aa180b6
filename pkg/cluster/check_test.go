package cluster

import (
	"context"
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/testenv"
	"github.com/redis/rueidis"
)

func TestServerProblems(t *testing.T) {
	cases := []struct {
		name string
		info string
		want []string
	}{
		{"Redis 7 without maxmemory is fine", "redis_version:7.0.15\r\nmaxmemory:0\r\nmaxmemory_policy:noeviction\r\n", nil},
		{"noeviction with maxmemory is fine", "redis_version:7.2.4\r\nmaxmemory:1073741824\r\nmaxmemory_policy:noeviction\r\n", nil},
		{"an evicting policy without maxmemory never evicts", "redis_version:7.2.4\r\nmaxmemory:0\r\nmaxmemory_policy:allkeys-lru\r\n", nil},
		{"volatile-lru with maxmemory can evict live slots", "redis_version:7.0.0\r\nmaxmemory:100\r\nmaxmemory_policy:volatile-lru\r\n",
			[]string{"maxmemory-policy volatile-lru with maxmemory set can evict live slots; use noeviction"}},
		{"Redis 6 is too old", "redis_version:6.2.14\r\nmaxmemory:0\r\nmaxmemory_policy:noeviction\r\n",
			[]string{"redis_version 6.2.14 is older than 7.0; the scripts need ZADD GT"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := serverProblems(tc.info); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("serverProblems = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestConnectReportsAnEvictingPolicy(t *testing.T) {
	srv := testenv.StartRedis(t)
	setup, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, ForceSingleClient: true, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer setup.Close()
	ctx := context.Background()
	for _, kv := range [][2]string{{"maxmemory", "100mb"}, {"maxmemory-policy", "volatile-lru"}} {
		if err := setup.Do(ctx, setup.B().ConfigSet().ParameterValue().ParameterValue(kv[0], kv[1]).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}

	var logs testenv.Buffer
	c, err := New(Options{Addrs: []string{srv.Addr()}, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.WaitConnected(waitCtx); err != nil {
		t.Fatal(err)
	}
	// The check runs right after the connection is published.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if strings.Contains(logs.String(), "level=ERROR") && strings.Contains(logs.String(), "maxmemory-policy volatile-lru") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("connecting to a Redis with maxmemory-policy volatile-lru logged no error:\n%s", logs.String())
		}
	}
}
