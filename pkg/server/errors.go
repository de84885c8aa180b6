package server

import (
	"context"
	"errors"
	"log/slog"
	"net/http"

	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
)

// apiError maps an error from decoding or from the limiter to the HTTP
// status and the stable code of the API. It is the only place that does.
func apiError(err error) (int, httpapi.Error) {
	e := httpapi.Error{Message: err.Error()}
	var reqErr *requestError
	var typeErr *mediaTypeError
	switch {
	case errors.As(err, &reqErr):
		e.Code = httpapi.CodeInvalidRequest
		return http.StatusBadRequest, e
	case errors.As(err, &typeErr):
		e.Code = httpapi.CodeUnsupportedMediaType
		return http.StatusUnsupportedMediaType, e
	case errors.Is(err, limiter.ErrInvalidUserID):
		e.Code = httpapi.CodeInvalidUserID
		return http.StatusBadRequest, e
	case errors.Is(err, limiter.ErrInvalidStreamID):
		e.Code = httpapi.CodeInvalidStreamID
		return http.StatusBadRequest, e
	case errors.Is(err, limiter.ErrInvalidLabel):
		e.Code = httpapi.CodeInvalidLabel
		return http.StatusBadRequest, e
	case errors.Is(err, limiter.ErrInvalidOverride):
		e.Code = httpapi.CodeInvalidRequest
		return http.StatusBadRequest, e
	case errors.Is(err, limiter.ErrUnknownPool):
		e.Code = httpapi.CodeUnknownPool
		return http.StatusUnprocessableEntity, e
	case errors.Is(err, limiter.ErrInvalidPoolKey):
		e.Code = httpapi.CodeInvalidPoolKey
		return http.StatusBadRequest, e
	case errors.Is(err, limiter.ErrUnknownPlan):
		e.Code = httpapi.CodeUnknownPlan
		return http.StatusUnprocessableEntity, e
	case errors.Is(err, limiter.ErrSlotLost):
		e.Code = httpapi.CodeSlotLost
		return http.StatusGone, e
	case errors.Is(err, ErrUnauthenticated): // slot API (auth.go)
		e.Code = httpapi.CodeUnauthenticated
		return http.StatusUnauthorized, e
	case errors.Is(err, ErrPlanNotAllowed):
		e.Code = httpapi.CodePlanNotAllowed
		return http.StatusForbidden, e
	case errors.Is(err, limiter.ErrNotSlotHolder):
		e.Code = httpapi.CodeNotSlotHolder
		e.Message = err.Error() + ": a slot belongs to the caller that took it; support releases it through the admin API"
		return http.StatusForbidden, e
	case errors.Is(err, errUnauthorized): // admin API (admin.go)
		e.Code = httpapi.CodeUnauthorized
		return http.StatusUnauthorized, e
	case errors.Is(err, errForbidden):
		e.Code = httpapi.CodeForbidden
		return http.StatusForbidden, e
	case errors.Is(err, limiter.ErrOutcomeUnknown): // before the outage it wraps
		e.Code = httpapi.CodeOutcomeUnknown
		e.Message = "the call reached the limiter's Redis but its answer was lost: it may or may not have taken effect (a release: some or all of the user's slots; a removal: the override); list the user's slots to see what holds now"
		return http.StatusServiceUnavailable, e
	case errors.Is(err, limiter.ErrUnavailable), errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		// The cause (a Redis error, node addresses) stays in the log.
		e.Code = httpapi.CodeUnavailable
		e.Message = "the limiter's Redis did not answer within its deadline and this plan fails closed; retry later"
		return http.StatusServiceUnavailable, e
	case errors.Is(err, limiter.ErrRedisRefused):
		e.Code, e.Message = httpapi.CodeInternal, "the limiter's Redis refused the call (a misconfiguration); the limiter's log names it"
		return http.StatusInternalServerError, e
	default:
		e.Code, e.Message = httpapi.CodeInternal, "internal error"
		return http.StatusInternalServerError, e
	}
}

func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	status, e := apiError(err)
	s.answerError(w, r, err, status, e)
}

// answerError logs a failure of the service itself and answers e, the
// mapping of err (see apiError), with status.
func (s *Server) answerError(w http.ResponseWriter, r *http.Request, err error, status int, e httpapi.Error) {
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
	writeError(w, status, e)
}
