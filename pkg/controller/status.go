package controller

import (
	"cmp"
	"context"
	"errors"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/joishi/limiter/api/v1alpha1"
)

// Retry delays of failed status writes.
const (
	minStatusRetry = 250 * time.Millisecond
	maxStatusRetry = 30 * time.Second
)

// writeStatus brings every LimitTier's status in line with Resolve on
// each change, until term ends. Only the elected replica runs it.
func (c *Controller) writeStatus(term context.Context) {
	select {
	case <-term.Done():
		return
	case <-c.watched:
	}
	retry := time.NewTimer(0) // a full pass at the start of each term
	defer retry.Stop()
	backoff := minStatusRetry
	// name → resourceVersion a successful write was based on. Until the
	// cache holds a newer version, that object is not written again: the
	// write would be refused as stale.
	wroteFrom := map[string]string{}
	for {
		select {
		case <-term.Done():
			return
		case <-c.statusKick:
		case <-retry.C:
		}
		if err := c.syncStatus(term, wroteFrom); err != nil {
			if term.Err() != nil {
				return
			}
			c.log.Warn("writing LimitTier status; retrying", "err", err, "in", backoff.String())
			retry.Reset(backoff)
			backoff = min(backoff*2, maxStatusRetry)
			continue
		}
		backoff = minStatusRetry
	}
}

// syncStatus updates each object whose status differs from its verdict.
func (c *Controller) syncStatus(ctx context.Context, wroteFrom map[string]string) error {
	items, err := c.list(ctx)
	if err != nil {
		return err
	}
	res := Resolve(items)
	for name := range wroteFrom {
		if _, ok := res.Verdicts[name]; !ok {
			delete(wroteFrom, name) // deleted
		}
	}
	var errs []error
	for i := range items {
		lt := &items[i] // the cache hands out copies
		verdict, ok := res.Verdicts[lt.Name]
		if !ok || wroteFrom[lt.Name] == lt.ResourceVersion || !setStatus(lt, verdict) {
			continue
		}
		// Update, not patch: the resourceVersion makes a write based on a
		// stale copy fail, and the next pass redoes it from fresh data.
		base := lt.ResourceVersion
		err := c.mgr.GetClient().Status().Update(ctx, lt)
		switch {
		case apierrors.IsNotFound(err):
		case apierrors.IsConflict(err):
			// The object changed since the cache saw it: the watch is about
			// to deliver the change, and with it the next pass.
			c.log.Debug("LimitTier changed while its status was written; waiting for the watch", "name", lt.Name)
		case err != nil:
			errs = append(errs, err)
		default:
			wroteFrom[lt.Name] = base
			c.log.Info("LimitTier status written", "name", lt.Name, "plan", verdict.Plan,
				"reason", verdict.Reason, "message", verdict.Message, "generation", lt.Generation)
		}
	}
	return errors.Join(errs...)
}

// setStatus sets lt's status to say verdict and reports whether that
// changed it.
func setStatus(lt *v1alpha1.LimitTier, verdict Verdict) bool {
	s := &lt.Status
	before := s.DeepCopy()
	s.Plan = verdict.Plan
	s.ObservedGeneration = lt.Generation
	s.SlotTTL = formatDuration(verdict.SlotTTL)
	s.HeartbeatInterval = formatDuration(verdict.HeartbeatInterval)
	s.MaxWait = cmp.Or(formatDuration(verdict.MaxWait), "0s")
	if verdict.AcceptedGeneration == lt.Generation {
		// The spec is valid: it is the one to fall back on from now on.
		s.AcceptedSpec = lt.Spec.DeepCopy()
		s.AcceptedGeneration = lt.Generation
	}
	ready := metav1.ConditionFalse
	if verdict.Accepted() {
		ready = metav1.ConditionTrue
	}
	meta.SetStatusCondition(&s.Conditions, metav1.Condition{
		Type:               v1alpha1.ConditionReady,
		Status:             ready,
		Reason:             verdict.Reason,
		Message:            verdict.Message,
		ObservedGeneration: lt.Generation,
	})
	return !equality.Semantic.DeepEqual(before, s)
}

// formatDuration writes d the way the CRD's slotTTL default is written:
// in whole seconds (120s), in milliseconds below that (1500ms), else as Go
// does (33.333333ms); "" for 0. Both duration columns of kubectl read
// this, so they compare at a glance.
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
