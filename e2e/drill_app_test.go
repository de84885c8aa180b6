package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/joishi/limiter/pkg/client"
)

// runDrillApp is the application of the incident drill (E2E_CHILD=drill):
// E2E_USERS users, each streaming up to the plan's limit through the
// servers of E2E_SERVERS (one pkg/client per server, as behind a load
// balancer), as caller E2E_TOKEN, each stream labelled
// "<E2E_GEN>/worker-<n>". A stream refused at the limit is asked again
// until granted, as users retry. It prints READY <streams> once all are
// held; then, after E2E_STREAM_FOR (unset: never), it ends every stream
// but those of user E2E_STUCK_USER, whose worker hangs with its slots
// still heartbeated, prints ENDED <streams released>, and runs on.
func runDrillApp(ctx context.Context) error {
	users := envInt("E2E_USERS")
	prefix, gen := os.Getenv("E2E_USER_PREFIX"), os.Getenv("E2E_GEN")
	var clients []*client.Client
	for _, url := range strings.Split(os.Getenv("E2E_SERVERS"), ",") {
		c, err := client.New(url, client.WithToken(os.Getenv("E2E_TOKEN")))
		if err != nil {
			return err
		}
		clients = append(clients, c)
	}
	stuck := -1
	if s := os.Getenv("E2E_STUCK_USER"); s != "" {
		stuck = envInt("E2E_STUCK_USER")
	}
	type held struct {
		user  int
		lease *client.Lease
	}
	var (
		mu     sync.Mutex
		leases []held
		failed error
		wg     sync.WaitGroup
	)
	for i := range users { // users come back each on their own
		wg.Go(func() {
			plan, limit := planOf(i)
			for k := range limit {
				c := clients[(i+k)%len(clients)]
				label := fmt.Sprintf("%s/worker-%d", gen, i%8)
				deadline := time.Now().Add(time.Minute)
				for {
					l, err := c.Acquire(ctx, fmt.Sprintf("%s%d", prefix, i), plan, client.WithLabel(label))
					if err == nil {
						mu.Lock()
						leases = append(leases, held{i, l})
						mu.Unlock()
						break
					}
					if !client.IsLimited(err) || time.Now().After(deadline) {
						mu.Lock()
						failed = fmt.Errorf("acquire user %d stream %d: %w", i, k, err)
						mu.Unlock()
						return
					}
					time.Sleep(100 * time.Millisecond) // the user tries again
				}
			}
		})
	}
	wg.Wait()
	if failed != nil {
		return failed
	}
	fmt.Printf("READY %d\n", len(leases))
	if os.Getenv("E2E_STREAM_FOR") == "" {
		select {} // stream until killed
	}
	d, err := time.ParseDuration(os.Getenv("E2E_STREAM_FOR"))
	if err != nil {
		return err
	}
	time.Sleep(d)
	ended := 0
	for _, h := range leases {
		if h.user == stuck {
			continue // a hung worker: its stream is gone, its lease heartbeats on
		}
		if err := h.lease.Release(ctx); err != nil {
			return err
		}
		ended++
	}
	fmt.Printf("ENDED %d\n", ended)
	select {}
}
