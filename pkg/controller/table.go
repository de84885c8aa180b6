package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	toolscache "k8s.io/client-go/tools/cache"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/joishi/limiter/api/v1alpha1"
	"github.com/joishi/limiter/pkg/tiers"
)

// watch runs on every replica: it fills the cache with the namespace's
// LimitTiers and replaces the table on every change until ctx ends.
func (c *Controller) watch(ctx context.Context) error {
	informer, err := c.mgr.GetCache().GetInformer(ctx, &v1alpha1.LimitTier{}, ctrlcache.BlockUntilSynced(false))
	if err != nil {
		return fmt.Errorf("watching LimitTiers: %w", err)
	}
	changed := func() {
		c.tableKick.raise()
		c.statusKick.raise()
	}
	reg, err := informer.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { changed() },
		UpdateFunc: func(any, any) { changed() },
		DeleteFunc: func(any) { changed() },
	})
	if err != nil {
		return fmt.Errorf("watching LimitTiers: %w", err)
	}
	defer func() { _ = informer.RemoveEventHandler(reg) }()

	// Until the first full list is in, the table stays unsynced (and
	// /readyz false): an empty cache is not an empty namespace.
	if !toolscache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
		return nil
	}
	close(c.watched)
	c.tableKick.raise()

	for {
		select {
		case <-ctx.Done():
			return nil
		case <-c.tableKick:
		}
		if err := c.syncTable(ctx); err != nil {
			c.log.Error("updating the tier table", "err", err)
			// The cache only fails when ctx ends; try again on the next change.
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
				c.tableKick.raise()
			}
		}
	}
}

// syncTable replaces the table with the tiers in force, when they changed.
func (c *Controller) syncTable(ctx context.Context) error {
	items, err := c.list(ctx)
	if err != nil {
		return err
	}
	res := Resolve(items)
	if c.opts.Table.IsSynced() && slices.Equal(res.Tiers, c.opts.Table.List()) {
		return nil
	}
	if err := c.opts.Table.Replace(res.Tiers); err != nil {
		return err // Resolve hands over valid, distinct tiers only
	}
	c.log.Info("tiers in force", "tiers", summary(res.Tiers))
	return nil
}

// summary is "free=1 paid=3": each plan with its limit.
func summary(list []tiers.Tier) string {
	parts := make([]string, len(list))
	for i, t := range list {
		parts[i] = fmt.Sprintf("%s=%d", t.Plan, t.MaxConcurrentStreams)
	}
	return strings.Join(parts, " ")
}
