package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
)

// apiError maps an error from decoding or from the limiter to the HTTP
// status and the stable code of the API. It is the only place that does.
func apiError(err error) (int, httpapi.Error) {
	var reqErr *requestError
	var typeErr *mediaTypeError
	var poolErr *limiter.PoolUnavailableError
	switch {
	case errors.As(err, &reqErr):
		return http.StatusBadRequest, httpapi.Error{Code: httpapi.CodeInvalidRequest, Message: err.Error()}
	case errors.As(err, &typeErr):
		return http.StatusUnsupportedMediaType, httpapi.Error{Code: httpapi.CodeUnsupportedMediaType, Message: err.Error()}
	case errors.As(err, &poolErr) && errors.Is(err, limiter.ErrUnavailable) && !errors.Is(err, limiter.ErrOutcomeUnknown):
		return http.StatusServiceUnavailable, httpapi.Error{Code: httpapi.CodeUnavailable, Message: poolUnavailable(poolErr)}
	}
	for _, m := range sentinelErrors {
		if errors.Is(err, m.err) {
			e := httpapi.Error{Code: m.code, Message: err.Error()}
			if m.message != "" {
				e.Message = m.message
			} else if m.hint != "" {
				e.Message += ": " + m.hint
			}
			return m.status, e
		}
	}
	return http.StatusInternalServerError, httpapi.Error{Code: httpapi.CodeInternal, Message: "internal error"}
}

// Answers that replace the error's own text.
const (
	messageOutcomeUnknown = "the call reached the limiter's Redis but its answer was lost: it may or may not have taken effect (a release: some or all of the user's slots; a removal: the override); list the user's slots to see what holds now"
	// The cause (a Redis error, node addresses) stays in the log.
	messageUnavailable = "the limiter's Redis did not answer within its deadline and this plan fails closed; retry later"
	// Redis answered; too few of its replicas confirmed the slot.
	messageUnconfirmed = "the limiter's Redis granted the slot, but fewer of its replicas than redis.syncReplicas asks confirmed it in time (a replica down or lagging), and this plan fails closed, so the slot was given back; retry later"
)

// poolUnavailable is the message of an acquire that a pool failing
// closed refused in an outage, and of a heartbeat its key did not answer.
func poolUnavailable(e *limiter.PoolUnavailableError) string {
	return fmt.Sprintf("the limiter's Redis did not answer within its deadline and pool %q fails closed (its key %s=%s); retry later", e.Pool, e.Pool, e.Key)
}

// sentinelErrors map the sentinels of the limiter and of this package to
// the status and code apiError answers, in order: the first that the
// error wraps decides. The answer's message is the error's own, followed
// by hint if set, or message instead if set.
var sentinelErrors = []struct {
	err           error
	status        int
	code          string
	hint, message string
}{
	{err: limiter.ErrInvalidUserID, status: http.StatusBadRequest, code: httpapi.CodeInvalidUserID},
	{err: limiter.ErrInvalidStreamID, status: http.StatusBadRequest, code: httpapi.CodeInvalidStreamID},
	{err: limiter.ErrInvalidLabel, status: http.StatusBadRequest, code: httpapi.CodeInvalidLabel},
	{err: limiter.ErrInvalidOverride, status: http.StatusBadRequest, code: httpapi.CodeInvalidRequest},
	{err: limiter.ErrUnknownPool, status: http.StatusUnprocessableEntity, code: httpapi.CodeUnknownPool},
	{err: limiter.ErrInvalidPoolKey, status: http.StatusBadRequest, code: httpapi.CodeInvalidPoolKey},
	{err: limiter.ErrPoolsDiffer, status: http.StatusBadRequest, code: httpapi.CodeInvalidRequest},
	{err: limiter.ErrUnknownPlan, status: http.StatusUnprocessableEntity, code: httpapi.CodeUnknownPlan},
	{err: limiter.ErrSlotLost, status: http.StatusGone, code: httpapi.CodeSlotLost},
	{err: ErrUnauthenticated, status: http.StatusUnauthorized, code: httpapi.CodeUnauthenticated}, // slot API (auth.go)
	{err: ErrPlanNotAllowed, status: http.StatusForbidden, code: httpapi.CodePlanNotAllowed},
	{err: limiter.ErrNotSlotHolder, status: http.StatusForbidden, code: httpapi.CodeNotSlotHolder,
		hint: "a slot, and a waiting acquire's place, belong to the caller that took them; support releases a user's slots through the admin API"},
	{err: ErrAdminUnauthorized, status: http.StatusUnauthorized, code: httpapi.CodeUnauthorized}, // admin API (pkg/admin)
	{err: ErrAdminForbidden, status: http.StatusForbidden, code: httpapi.CodeForbidden},
	{err: ErrShuttingDown, status: http.StatusServiceUnavailable, code: httpapi.CodeUnavailable},
	// Before the outage it wraps.
	{err: limiter.ErrOutcomeUnknown, status: http.StatusServiceUnavailable, code: httpapi.CodeOutcomeUnknown, message: messageOutcomeUnknown},
	{err: limiter.ErrUnconfirmed, status: http.StatusServiceUnavailable, code: httpapi.CodeUnavailable, message: messageUnconfirmed},
	{err: limiter.ErrUnavailable, status: http.StatusServiceUnavailable, code: httpapi.CodeUnavailable, message: messageUnavailable},
	{err: context.DeadlineExceeded, status: http.StatusServiceUnavailable, code: httpapi.CodeUnavailable, message: messageUnavailable},
	{err: context.Canceled, status: http.StatusServiceUnavailable, code: httpapi.CodeUnavailable, message: messageUnavailable},
	{err: limiter.ErrRedisRefused, status: http.StatusInternalServerError, code: httpapi.CodeInternal,
		message: "the limiter's Redis refused the call (a misconfiguration); the limiter's log names it"},
}

// statusClientGone is the status of a request whose client left before
// its answer (nginx's 499, "client closed request"): counted as the
// client's doing, not as the limiter failing.
const statusClientGone = 499

func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	status, e := apiError(err)
	s.answerError(w, r, err, status, e)
}

// answerError logs a failure of the service itself and answers e, the
// mapping of err (see apiError), with status.
func (s *Server) answerError(w http.ResponseWriter, r *http.Request, err error, status int, e httpapi.Error) {
	if r.Context().Err() != nil && errors.Is(err, context.Canceled) {
		// The client left (a wait it gave up on): no one reads the answer,
		// and it is no outage of the limiter's.
		w.WriteHeader(statusClientGone)
		return
	}
	s.logFailure(r, status, err)
	writeError(w, status, e)
}

// logFailure logs err, a failure of the service itself answered with
// status (of the request, or of one slot of a batch), at most once per
// failureLogEvery a kind: ERROR for a 500 (a misconfiguration), WARN for
// an outage.
func (s *Server) logFailure(r *http.Request, status int, err error) {
	caller := ""
	if info := infoOf(r.Context()); info != nil {
		caller = info.who.name
	}
	switch {
	case status == http.StatusInternalServerError:
		s.failedInternal.Log(r.Context(), slog.LevelError, "request failed", "path", r.URL.Path, "status", status, "caller", caller, "err", err)
	case status > 500:
		s.failedUnavailable.Log(r.Context(), slog.LevelWarn, "request failed", "path", r.URL.Path, "status", status, "caller", caller, "err", err)
	}
}
