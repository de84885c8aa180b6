package controller

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// elect stands for the status writer's Lease until ctx ends, and writes
// status while it holds it. Losing the Lease (an API server unreachable
// for the renew deadline) only stops the status writes: this replica goes
// on enforcing its table and stands again. (controller-runtime's own
// election ends the whole process instead, and a replica restarting while
// the API server is away could not become ready again.)
func (c *Controller) elect(ctx context.Context) error {
	coordination, err := coordinationv1.NewForConfigAndClient(c.mgr.GetConfig(), c.mgr.GetHTTPClient())
	if err != nil {
		return fmt.Errorf("lease client: %w", err)
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: c.opts.Namespace, Name: c.opts.LeaseName},
		Client:     coordination,
		LockConfig: resourcelock.ResourceLockConfig{Identity: c.opts.Identity},
	}
	d := c.opts.LeaseDuration
	for ctx.Err() == nil {
		// The elector starts OnStartedLeading in a goroutine of its own;
		// handing the term over here keeps the status writes in this
		// goroutine, which the manager waits for.
		terms := make(chan context.Context, 1)
		elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:            lock,
			Name:            c.opts.LeaseName,
			LeaseDuration:   d,
			RenewDeadline:   d * 2 / 3,
			RetryPeriod:     d * 2 / 15,
			ReleaseOnCancel: true,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(term context.Context) { terms <- term },
				OnStoppedLeading: func() {},
				OnNewLeader: func(identity string) {
					c.log.Info("status writer", "leader", identity, "self", identity == c.opts.Identity)
				},
			},
		})
		if err != nil {
			return fmt.Errorf("leader election: %w", err)
		}
		ran := make(chan struct{})
		go func() {
			defer close(ran)
			elector.Run(ctx) // returns when ctx ends or the Lease is lost
		}()
		select {
		case term := <-terms:
			c.log.Info("elected: writing status", "identity", c.opts.Identity)
			c.writeStatus(term) // until the term ends
			<-ran
		case <-ran:
		}
		if ctx.Err() == nil {
			c.log.Warn("lost the status lease; standing again", "identity", c.opts.Identity)
			select {
			case <-ctx.Done():
			case <-time.After(d * 2 / 15):
			}
		}
	}
	return nil
}
