package controller

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/joishi/limiter/api/v1alpha1"
)

// Retry delays of failed status writes.
const (
	minStatusRetry = 250 * time.Millisecond
	maxStatusRetry = 30 * time.Second
)

// writeStatus brings the status of every object of every kind served in
// line with resolve on each change, until term ends. Only the elected
// replica runs it.
func (c *Controller) writeStatus(term context.Context) {
	select {
	case <-term.Done():
		return
	case <-c.watched:
	}
	retry := time.NewTimer(0) // a full pass at the start of each term
	defer retry.Stop()
	backoff := minStatusRetry
	// Per kind, name → resourceVersion a successful write was based on.
	// Until the cache holds a newer version, that object is not written
	// again: the write would be refused as stale.
	wroteFrom := make([]map[string]string, len(c.kinds))
	for i := range wroteFrom {
		wroteFrom[i] = map[string]string{}
	}
	for {
		select {
		case <-term.Done():
			return
		case <-c.statusKick:
		case <-retry.C:
		}
		var errs []error
		for i, kind := range c.kinds {
			if err := kind.syncStatus(term, wroteFrom[i]); err != nil {
				errs = append(errs, fmt.Errorf("%s status: %w", kind.kindName(), err))
			}
		}
		if err := errors.Join(errs...); err != nil {
			if term.Err() != nil {
				return
			}
			c.log.Warn("writing status; retrying", "err", err, "in", backoff.String())
			retry.Reset(backoff)
			backoff = min(backoff*2, maxStatusRetry)
			continue
		}
		backoff = minStatusRetry
	}
}

// syncStatus updates each object whose status differs from its verdict.
func (r *reconciler[O, S, E]) syncStatus(ctx context.Context, wroteFrom map[string]string) error {
	items, err := r.list(ctx)
	if err != nil {
		return err
	}
	res := resolve(r.k, items, r.seen)
	for name := range wroteFrom {
		if _, ok := res.verdicts[name]; !ok {
			delete(wroteFrom, name) // deleted
		}
	}
	var errs []error
	for _, o := range items { // the cache hands out copies
		name := o.GetName()
		v, ok := res.verdicts[name]
		if !ok || wroteFrom[name] == o.GetResourceVersion() || !setStatus(r.k, o, v) {
			continue
		}
		// Update, not patch: the resourceVersion makes a write based on a
		// stale copy fail, and the next pass redoes it from fresh data.
		base := o.GetResourceVersion()
		err := r.c.mgr.GetClient().Status().Update(ctx, o)
		switch {
		case apierrors.IsNotFound(err):
		case apierrors.IsConflict(err):
			// The object changed since the cache saw it: the watch is about
			// to deliver the change, and with it the next pass.
			r.c.log.Debug(r.k.name()+" changed while its status was written; waiting for the watch", "name", name)
		case err != nil:
			errs = append(errs, err)
		default:
			wroteFrom[name] = base
			r.c.log.Info(r.k.name()+" status written", "name", name, r.k.claim(), v.claim,
				"reason", v.reason, "message", v.message, "generation", o.GetGeneration())
		}
	}
	return errors.Join(errs...)
}

// setStatus sets o's status to say v and reports whether that changed it.
func setStatus[O client.Object, S any, E entry](k kind[O, S, E], o O, v verdict) bool {
	before := o.DeepCopyObject()
	s := k.status(o)
	*s.observedGeneration = o.GetGeneration()
	switch {
	case v.acceptedGeneration == o.GetGeneration():
		// The spec is valid: it is the one to fall back on from now on.
		*s.acceptedSpec = k.spec(o.DeepCopyObject().(O))
		*s.acceptedGeneration = o.GetGeneration()
	case v.acceptedSpec != nil:
		// A valid generation this replica saw, newer than the one
		// recorded (see seenSpecs).
		*s.acceptedSpec = v.acceptedSpec.(*S)
		*s.acceptedGeneration = v.acceptedGeneration
	}
	ready := metav1.ConditionFalse
	if v.accepted() {
		ready = metav1.ConditionTrue
	}
	meta.SetStatusCondition(s.conditions, metav1.Condition{
		Type:               v1alpha1.ConditionReady,
		Status:             ready,
		Reason:             v.reason,
		Message:            v.message,
		ObservedGeneration: o.GetGeneration(),
	})
	k.show(o, v)
	return !equality.Semantic.DeepEqual(before, o)
}

// formatDuration writes d the way the CRD's slotTTL default is written:
// in whole seconds (120s), in milliseconds below that (1500ms), else as Go
// does (33.333333ms); "" for 0 or less. Every duration column of kubectl
// reads this, so they compare at a glance.
func formatDuration(d time.Duration) string {
	switch {
	case d <= 0:
		return ""
	case d%time.Second == 0:
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	case d%time.Millisecond == 0:
		return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
	default:
		return d.String()
	}
}
