package controller

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	toolscache "k8s.io/client-go/tools/cache"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"
)

// watch runs on every replica: it fills the cache with the namespace's
// objects of every kind served and replaces the tables on every change
// until ctx ends.
func (c *Controller) watch(ctx context.Context) error {
	changed := func() {
		c.tableKick.raise()
		c.statusKick.raise()
	}
	synced := make([]toolscache.InformerSynced, 0, len(c.kinds))
	for _, kind := range c.kinds {
		handler := toolscache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { changed() },
			UpdateFunc: func(any, any) { changed() },
			DeleteFunc: func(obj any) {
				kind.forget(obj)
				changed()
			},
		}
		informer, err := c.mgr.GetCache().GetInformer(ctx, kind.newObject(), ctrlcache.BlockUntilSynced(false))
		if err != nil {
			return fmt.Errorf("watching %ss: %w", kind.kindName(), err)
		}
		reg, err := informer.AddEventHandler(handler)
		if err != nil {
			return fmt.Errorf("watching %ss: %w", kind.kindName(), err)
		}
		defer func() { _ = informer.RemoveEventHandler(reg) }()
		synced = append(synced, reg.HasSynced)
	}

	// Until the first full list of every kind is in, the tables stay
	// unsynced (and /readyz false): an empty cache is not an empty
	// namespace.
	if !toolscache.WaitForCacheSync(ctx.Done(), synced...) {
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
		if err := c.syncTables(ctx); err != nil {
			c.log.Error("updating the tables", "err", err)
			// The cache only fails when ctx ends; try again on the next change.
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
				c.tableKick.raise()
			}
		}
	}
}

// syncTables syncs the table of each kind in the order of c.kinds, and
// stops at the first that fails: the tier table, last, turns synced (and
// /readyz, which reads it, true) only once every other table has.
func (c *Controller) syncTables(ctx context.Context) error {
	for _, kind := range c.kinds {
		if err := kind.syncTable(ctx); err != nil {
			return fmt.Errorf("%ss: %w", kind.kindName(), err)
		}
	}
	return nil
}

// syncTable replaces the table with the entries in force, when they
// changed.
func (r *reconciler[O, S, E]) syncTable(ctx context.Context) error {
	items, err := r.list(ctx)
	if err != nil {
		return err
	}
	res := resolve(r.k, items, r.seen)
	same := func(a, b E) bool { return reflect.DeepEqual(a, b) } // a pool holds a map
	if r.table.IsSynced() && slices.EqualFunc(res.entries, r.table.List(), same) {
		return nil
	}
	if err := r.table.Replace(res.entries); err != nil {
		return err // resolve hands over valid, distinct entries only
	}
	r.c.log.Info(r.k.claim()+"s in force", r.k.claim()+"s", summary(r.k.describe, res.entries))
	return nil
}

// summary is `"free": 1 concurrent stream per user; "paid": ...`: each
// entry with what it enforces.
func summary[E entry](describe func(E) string, list []E) string {
	parts := make([]string, len(list))
	for i, e := range list {
		parts[i] = fmt.Sprintf("%q: %s", e.Name(), describe(e))
	}
	return strings.Join(parts, "; ")
}
