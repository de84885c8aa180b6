package limiter_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/redis/rueidis"
)

// TestAPipelineSplitsByNodeOnlyWhereEachCommandHasOne: where the limiter
// bounds a call itself, it sends each node's commands of a pipeline on
// their own, so that one node's hang is its own commands' outage. It
// splits only what rueidis would send to different nodes: nothing on one
// Redis, and on a cluster nothing of a pipeline holding a command of no
// key (a synced acquire's WAIT, which must follow its script on the
// script's connection).
func TestAPipelineSplitsByNodeOnlyWhereEachCommandHasOne(t *testing.T) {
	for _, b := range []limitertest.Backend{limitertest.Standalone, limitertest.RedisCluster} {
		t.Run(b.String(), func(t *testing.T) {
			t.Parallel()
			s := limitertest.New(t, limitertest.Options{Backend: b})
			c, err := s.Redis.Redis()
			if err != nil {
				t.Fatal(err)
			}
			// Two keys on one node and one on another, as the slot map says.
			var near, far []string
			first := ""
			for i := 0; len(near) < 2 || len(far) < 1; i++ {
				if i > 10000 {
					t.Fatalf("no keys on two nodes found: %d beside the first, %d elsewhere", len(near), len(far))
				}
				k := fmt.Sprintf("%sk-%d", s.Keys.Prefix, i)
				cmd := c.B().Get().Key(k).Build()
				node := s.Redis.NodeOf(cmd.Slot())
				if node == "" && b == limitertest.RedisCluster {
					// The slot map is read just after the client connects.
					if i > 500 {
						t.Fatalf("the cluster's slot map is not known after %d tries", i)
					}
					time.Sleep(10 * time.Millisecond)
					continue
				}
				switch {
				case b == limitertest.Standalone:
					near = append(near, k)
					far = append(far, k)
				case first == "":
					first = node
					near = append(near, k)
				case node == first:
					near = append(near, k)
				default:
					far = append(far, k)
				}
			}
			get := func(k string) rueidis.Completed { return c.B().Get().Key(k).Build() }
			split, err := limiter.PipelineGroups(s.Limiter, get(near[0]), get(far[0]), get(near[1]))
			if err != nil {
				t.Fatal(err)
			}
			want := [][]int{{0, 2}, {1}}
			if b == limitertest.Standalone {
				want = [][]int{{0, 1, 2}}
			}
			if !slices.EqualFunc(split, want, slices.Equal) {
				t.Errorf("a pipeline of keys on two nodes splits into %v, want %v", split, want)
			}
			withWait, err := limiter.PipelineGroups(s.Limiter, get(near[0]), c.B().Wait().Numreplicas(1).Timeout(0).Build())
			if err != nil {
				t.Fatal(err)
			}
			if want := [][]int{{0, 1}}; !slices.EqualFunc(withWait, want, slices.Equal) {
				t.Errorf("a pipeline of a script and its WAIT splits into %v, want %v: the WAIT on its script's connection", withWait, want)
			}
		})
	}
}
