package server

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/tiers"
)

func (s *Server) acquire(w http.ResponseWriter, r *http.Request) {
	var req httpapi.AcquireRequest
	if err := decodeForPlan(w, r, &req, &req.Plan); err != nil {
		if field, number, ok := OutOfRange(err); ok && field == "wait_ms" {
			err = badRequest("wait_ms must be 0 (no waiting) to %d milliseconds (the plan's max_wait_ms caps the wait), got %s", int64(math.MaxInt64), number)
		}
		s.fail(w, r, err)
		return
	}
	if req.WaitMs < 0 {
		s.fail(w, r, badRequest("wait_ms must be 0 (no waiting) or more milliseconds, got %d", req.WaitMs))
		return
	}
	wait := waitOf(req.WaitMs)
	if wait > 0 {
		s.allowWait(w, req.Plan, wait)
	}
	// Without a stream_id the limiter makes the id, as its own: an
	// acquire whose answer is lost (a 503, or a client gone before it)
	// may have taken the slot under an id no one else knows, and the
	// limiter releases it then (see limiter.AcquireRequest.StreamID). A
	// grant whose client left before its answer is written is released
	// here (releaseUnanswered).
	ctx := r.Context()
	acquire := limiter.AcquireRequest{UserID: req.UserID, Plan: req.Plan, StreamID: req.StreamID, Caller: callerOf(r).name, Label: req.Label, Wait: wait, Pools: req.Pools}
	revoked := context.Background() // never ends: the API is open, or the acquire does not wait
	if wait > 0 {
		var cancel context.CancelFunc
		ctx, acquire, cancel = limiter.EndWaitsWith(ctx, s.waitsOver, ErrShuttingDown, acquire)
		defer cancel()
		if s.opts.Callers != nil {
			var stop func()
			revoked, stop = s.opts.Callers.whileInForce(r, callerOf(r), req.Plan)
			defer stop()
			ctx, acquire, cancel = limiter.EndWaitsWith(ctx, revoked, errWaitRevoked, acquire)
			defer cancel()
		}
	}
	res, err := s.lim.Acquire(ctx, acquire)
	switch cause := context.Cause(ctx); {
	case err == nil:
	case errors.Is(cause, ErrShuttingDown):
		err = ErrShuttingDown
	case errors.Is(cause, errWaitRevoked):
		// The limiter took the ticket out of the queue, or released the
		// slot granted as the wait ended.
		s.refuseRevoked(w, r, context.Cause(revoked))
		return
	}
	if err != nil {
		status, e := apiError(err)
		// The caller's id, which may hold the slot with only the answer
		// lost: retry under it, or release it. One the limiter made is
		// released already.
		if status == http.StatusServiceUnavailable {
			e.StreamID = req.StreamID
		}
		s.answerError(w, r, err, status, e)
		return
	}
	if !res.Granted && res.RefusedBy != nil {
		writePoolRefusal(w, res, noWait(wait, res, s.lim.MaxQueue()), s.lim.MaxQueue())
		return
	}
	if !res.Granted {
		retryMs := res.RetryAfter.Milliseconds()
		w.Header().Set("Retry-After", strconv.FormatInt(retryAfterSeconds(res.RetryAfter), 10))
		allowed := fmt.Sprintf("plan %q", req.Plan)
		if res.Overridden {
			allowed = fmt.Sprintf("a support override of plan %q", req.Plan)
		}
		e := httpapi.Error{
			Code:         httpapi.CodeStreamLimitReached,
			Message:      fmt.Sprintf("user holds %d of %d concurrent streams allowed by %s", res.Used, res.Limit, allowed) + owedNote(res.Limit-res.Used, res.Owed, "the user's queue"),
			Used:         &res.Used,
			Limit:        &res.Limit,
			RetryAfterMs: &retryMs,
		}
		switch waited := waitedMs(res.Waited); {
		case res.Waited > 0 && res.QueueFull:
			e.WaitedMs = &waited
			e.Message += fmt.Sprintf("; waited %dms in the queue, then its place went to a waiter served before it: the queue holds its most waiters, %d", waited, s.lim.MaxQueue())
		case res.Waited > 0:
			e.WaitedMs = &waited
			e.Message += fmt.Sprintf("; waited %dms in the queue (wait_ms, capped by the plan's maxWait of %s) without a slot freeing up", waited, res.Tier.MaxWait)
		}
		e.Message += noWait(wait, res, s.lim.MaxQueue())
		writeError(w, http.StatusTooManyRequests, e)
		return
	}
	if res.Waited > 0 && s.opts.Callers != nil {
		// Granted as a reload revoked the caller, before its wait could
		// be ended: a new slot goes, as an unanswered one does. An
		// extension of a stream the caller held already is not this
		// request's alone to end: it lasts its TTL, as the revoked
		// caller's other slots do.
		if err := s.opts.Callers.stillInForce(r, callerOf(r), req.Plan); err != nil {
			if !res.Extended {
				_, _ = s.lim.ReleaseJoined(context.WithoutCancel(r.Context()), req.UserID, res.StreamID, res.Pools)
			}
			s.refuseRevoked(w, r, err)
			return
		}
	}
	if req.StreamID == "" && r.Context().Err() != nil {
		s.releaseUnanswered(w, r, req.UserID, res)
		return
	}
	a := newAnswer()
	a.b = appendAcquireResponse(a.b, httpapi.AcquireResponse{
		Granted:             true,
		StreamID:            res.StreamID,
		Used:                res.Used,
		Limit:               res.Limit,
		ExpiresAt:           res.ExpiresAt,
		TTLMs:               res.Tier.SlotTTL.Milliseconds(),
		HeartbeatIntervalMs: res.Tier.HeartbeatInterval.Milliseconds(),
		Pruned:              res.Pruned,
		Degraded:            res.Degraded,
		WaitedMs:            waitedMs(res.Waited),
		Pools:               poolGrants(res.Pools),
		WouldRefuse:         res.WouldRefuse,
		WouldRefuseBy:       wouldRefuseBy(res.WouldRefuseBy),
	})
	a.send(w, http.StatusOK)
}

// releaseUnanswered releases the slot of an acquire granted under an id
// the limiter made (res.StreamID) whose client left before its answer
// was written: only that answer would have told the id, so no one else
// could release the slot, and it would hold the user's place for its
// whole TTL. (The limiter does the same for a client gone before the
// grant.) It is checked before the answer is written, not after: a
// client that read its answer and hung up keeps its slot. No one waits
// for this answer, so the release runs here, within its per-call
// deadline, and the request is counted as the client's doing (499).
func (s *Server) releaseUnanswered(w http.ResponseWriter, r *http.Request, userID string, res limiter.AcquireResult) {
	_, _ = s.lim.ReleaseJoined(context.WithoutCancel(r.Context()), userID, res.StreamID, res.Pools)
	w.WriteHeader(statusClientGone)
}

// decodeForPlan decodes the body of a request for a plan's slot into req,
// and checks the plan it names (*plan, a field of req): given, and one the
// caller may use.
func decodeForPlan(w http.ResponseWriter, r *http.Request, req any, plan *string) error {
	if err := decode(w, r, httpapi.MaxBodyBytes, req); err != nil {
		return err
	}
	if *plan == "" {
		return badRequest("plan is required")
	}
	return allowPlan(r, *plan)
}

// waitedMs is how long an acquire waited, in whole milliseconds rounded
// up: a wait of a few microseconds was still one, and 0 would read as none.
func waitedMs(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// waitOf is wait_ms as a duration, at most tiers.MaxMaxWait: no plan
// waits longer, and a larger number would overflow.
func waitOf(ms int64) time.Duration {
	return time.Duration(min(ms, tiers.MaxMaxWait.Milliseconds())) * time.Millisecond
}

// allowWait extends the connection's deadlines for an acquire that may
// wait up to wait (capped by plan's maxWait) before it answers: past the
// listener's read and write timeouts, which bound requests that answer at
// once. (net/http reads the connection in the background while a handler
// runs, to notice a client that goes away; that read failing on the read
// timeout would look like one.) The next request on the connection gets
// the listener's own deadlines again.
func (s *Server) allowWait(w http.ResponseWriter, plan string, wait time.Duration) {
	tier, ok := s.lim.Tiers().Lookup(plan)
	if !ok || tier.MaxWait <= 0 {
		return
	}
	wait = min(wait, tier.MaxWait)
	t := s.timeouts()
	rc := http.NewResponseController(w)
	now := time.Now()
	// Unsupported (a recorder in tests): the listener has no deadline to
	// extend either.
	_ = rc.SetReadDeadline(now.Add(wait + t.Read))
	_ = rc.SetWriteDeadline(now.Add(wait + t.Write))
}

// retryAfterSeconds rounds up to whole seconds, at least 1: a Retry-After
// of 0 would invite a hot retry loop.
func retryAfterSeconds(d time.Duration) int64 {
	return max(1, int64((d+time.Second-1)/time.Second))
}

func (s *Server) heartbeat(w http.ResponseWriter, r *http.Request) {
	var req httpapi.HeartbeatRequest
	if err := decodeForPlan(w, r, &req, &req.Plan); err != nil {
		s.fail(w, r, err)
		return
	}
	res, err := s.lim.Heartbeat(r.Context(), limiter.HeartbeatRequest{UserID: req.UserID, Plan: req.Plan, StreamID: req.StreamID, Caller: callerOf(r).name})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	a := newAnswer()
	a.b = appendHeartbeatResponse(a.b, httpapi.HeartbeatResponse{Alive: res.Alive, ExpiresAt: res.ExpiresAt, Degraded: res.Degraded})
	a.send(w, http.StatusOK)
}

func (s *Server) heartbeats(w http.ResponseWriter, r *http.Request) {
	var req httpapi.HeartbeatsRequest
	if err := decode(w, r, maxBatchBodyBytes, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if n := len(req.Slots); n == 0 || n > httpapi.MaxBatch {
		s.fail(w, r, badRequest("slots must hold 1 to %d entries, got %d", httpapi.MaxBatch, n))
		return
	}
	for i, slot := range req.Slots {
		if slot.Plan == "" { // as a single heartbeat's, whatever plans the caller may use
			s.fail(w, r, badRequest("slots[%d].plan is required", i))
			return
		}
	}
	results, errs := s.heartbeatBatch(r, req.Slots)
	// A HeartbeatsResponse, written as the results are read.
	a := newAnswer()
	a.b = append(a.b, `{"results":[`...)
	unavailable := 0
	var times timeAppender
	for i, res := range results {
		item := httpapi.HeartbeatResult{StreamID: req.Slots[i].StreamID, Alive: res.Alive, Degraded: res.Degraded}
		if res.Alive {
			item.ExpiresAt = &res.ExpiresAt
		}
		if err := errs[i]; err != nil && !errors.Is(err, limiter.ErrSlotLost) {
			status, e := apiError(err)
			s.logFailure(r, status, err) // a slot's 500 is as much the service's as a request's
			item.Error = &e
			if e.Code == httpapi.CodeUnavailable {
				unavailable++
			}
		}
		if i > 0 {
			a.b = append(a.b, ',')
		}
		a.b = appendHeartbeatResult(a.b, item, &times)
	}
	a.b = append(a.b, "]}"...)
	if unavailable == len(results) {
		a.recycle()
		s.fail(w, r, fmt.Errorf("%w: no slot of the batch could be heartbeated", limiter.ErrUnavailable))
		return
	}
	a.send(w, http.StatusOK)
}

func (s *Server) release(w http.ResponseWriter, r *http.Request) {
	var req httpapi.ReleaseRequest
	if err := decode(w, r, httpapi.MaxBodyBytes, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	res, err := s.lim.ReleaseAs(r.Context(), callerOf(r).name, req.UserID, req.StreamID)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	a := newAnswer()
	a.b = appendReleaseResponse(a.b, httpapi.ReleaseResponse{Released: res.Released, Degraded: res.Degraded})
	a.send(w, http.StatusOK)
}

func (s *Server) tiers(w http.ResponseWriter, r *http.Request) {
	list := s.lim.Tiers().List()
	out := httpapi.TiersResponse{Tiers: make([]httpapi.Tier, len(list))}
	for i, t := range list {
		out.Tiers[i] = httpapi.Tier{
			Plan:                 t.Plan,
			MaxConcurrentStreams: t.MaxConcurrentStreams,
			SlotTTLMs:            t.SlotTTL.Milliseconds(),
			HeartbeatIntervalMs:  t.HeartbeatInterval.Milliseconds(),
			FailureMode:          string(t.FailureMode),
			MaxWaitMs:            t.MaxWait.Milliseconds(),
			Enforce:              t.Enforced(),
		}
	}
	a := newAnswer()
	a.b = appendTiersResponse(a.b, out)
	a.send(w, http.StatusOK)
}

// noWait is what a refusal adds when the acquire asked to wait and was
// not let: the queue holds its most waiters (maxQueue, the limiter's
// MaxQueue), the limit is 0, or the plan's maxWait (or the pool's) is 0s,
// which caps wait_ms to no waiting.
func noWait(asked time.Duration, res limiter.AcquireResult, maxQueue int) string {
	waited := res.Waited // in the queue of the scope that refused
	if res.RefusedBy != nil {
		waited = res.RefusedBy.Waited
	}
	switch {
	case asked <= 0 || waited > 0:
		return ""
	case res.QueueFull && res.RefusedBy != nil:
		return fmt.Sprintf("; not waited: wait_ms asked %dms, but the queue of pool key %s=%s holds its most waiters, %d, each served before this one would be", asked.Milliseconds(), res.RefusedBy.Pool, res.RefusedBy.Key, maxQueue)
	case res.QueueFull:
		return fmt.Sprintf("; not waited: wait_ms asked %dms, but the user's queue holds its most waiters, %d", asked.Milliseconds(), maxQueue)
	case res.RefusedBy != nil && res.RefusedBy.Limit == 0:
		return fmt.Sprintf("; not waited: wait_ms asked %dms, but pool key %s=%s is capped at 0, so no place will free", asked.Milliseconds(), res.RefusedBy.Pool, res.RefusedBy.Key)
	case res.RefusedBy == nil && res.Limit == 0:
		return fmt.Sprintf("; not waited: wait_ms asked %dms, but the user's limit is 0, so no slot will free", asked.Milliseconds())
	case res.Tier.MaxWait <= 0:
		return fmt.Sprintf("; not waited: wait_ms asked %dms, but plan %q has maxWait 0s (no waiting), which caps it", asked.Milliseconds(), res.Tier.Plan)
	case res.RefusedBy != nil:
		return fmt.Sprintf("; not waited: wait_ms asked %dms, but pool %q has maxWait 0s (no waiting) for its keys", asked.Milliseconds(), res.RefusedBy.Pool)
	}
	return ""
}

// owedNote says, of a refusal with free slots (free > 0), that they are
// owed to owed acquires waiting in queue, served first come, first
// served; "" when none are (a refusal at the limit).
func owedNote(free, owed int, queue string) string {
	if free <= 0 || owed <= 0 {
		return ""
	}
	slots := "the free one is"
	if free > 1 {
		slots = fmt.Sprintf("the %d free are", free)
	}
	waiters := "1 acquire"
	if owed > 1 {
		waiters = fmt.Sprintf("%d acquires", owed)
	}
	return fmt.Sprintf("; %s owed to %s waiting in %s", slots, waiters, queue)
}

// poolCapOf says whose cap refused r: the pool's, or a support override
// of the key's.
func poolCapOf(r *limiter.PoolRefusal) string {
	if r.Overridden {
		return "a support override of the key's cap"
	}
	return "the pool's cap"
}

// writePoolRefusal answers an acquire a pool key's cap refused: 429
// pool_limit_reached, which names the pool key, never the user's
// stream_limit_reached. note is noWait's; maxQueue the limiter's MaxQueue.
func writePoolRefusal(w http.ResponseWriter, res limiter.AcquireResult, note string, maxQueue int) {
	r := res.RefusedBy
	retryMs := r.RetryAfter.Milliseconds()
	w.Header().Set("Retry-After", strconv.FormatInt(retryAfterSeconds(r.RetryAfter), 10))
	used, limit := r.Used, r.Limit
	e := httpapi.Error{
		Code:         httpapi.CodePoolLimitReached,
		Message:      fmt.Sprintf("pool %s=%s holds %d of its %d concurrent streams (%s, shared by every user)", r.Pool, r.Key, used, limit, poolCapOf(r)) + owedNote(limit-used, r.Owed, "the key's queue"),
		Used:         &used,
		Limit:        &limit,
		RetryAfterMs: &retryMs,
		Pool:         r.Pool,
		Key:          r.Key,
	}
	// waited_ms is the whole wait, the user's queue's and the key's; the
	// message says which queue it was in.
	if res.Waited > 0 {
		ms := waitedMs(res.Waited)
		e.WaitedMs = &ms
	}
	switch inKey := waitedMs(r.Waited); {
	case r.Waited > 0 && res.QueueFull:
		e.Message += fmt.Sprintf("; waited %dms in the key's queue, then its place went to a waiter served before it: the queue holds its most waiters, %d", inKey, maxQueue)
	case r.Waited > 0:
		e.Message += fmt.Sprintf("; waited %dms (wait_ms, capped by the plan's and the pool's maxWait) without a place freeing up", *e.WaitedMs)
	case res.Waited > 0:
		e.Message += fmt.Sprintf("; waited %dms for the user's own slot, then not for the key", *e.WaitedMs)
	}
	e.Message += note
	writeError(w, http.StatusTooManyRequests, e)
}

// wouldRefuseBy is the pool key a shadow pool would have refused a grant
// by, as the API answers it; nil when none.
func wouldRefuseBy(r *limiter.PoolRefusal) *httpapi.PoolGrant {
	if r == nil {
		return nil
	}
	return &httpapi.PoolGrant{Pool: r.Pool, Key: r.Key, Used: r.Used, Limit: r.Limit}
}

// poolGrants are a grant's pool keys as the API answers them.
func poolGrants(grants []limiter.PoolGrant) []httpapi.PoolGrant {
	var out []httpapi.PoolGrant
	for _, g := range grants {
		if g.Uncapped {
			continue // judged by no cap: as a new acquire, which joins no such key
		}
		out = append(out, httpapi.PoolGrant{Pool: g.Pool, Key: g.Key, Used: g.Used, Limit: g.Limit})
	}
	return out
}
