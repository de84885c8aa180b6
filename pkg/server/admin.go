package server

import (
	"errors"
	"net/http"

	"github.com/joishi/limiter/pkg/httpapi"
)

// The admin API and page live in pkg/admin, served on the admin listener
// (Options.Admin, AdminHandler). They read bodies, answer and map errors
// exactly as the slot API does, through what this file exports: one body
// reader, one set of answers, one error mapping (apiError) for both
// listeners.

// AdminRoutes are the admin listener's routes: pkg/admin's Admin.
type AdminRoutes interface {
	// Routes adds the admin API and page to mux.
	Routes(mux *http.ServeMux)
}

// Outcomes of admin authentication, mapped to 401 unauthorized and 403
// forbidden by MapError. pkg/admin returns them (wrapped by AdminRefusal).
var (
	// ErrAdminUnauthorized: no admin token, or one the admin tokens file
	// does not hold.
	ErrAdminUnauthorized = errors.New("unauthorized")
	// ErrAdminForbidden: the token's role may not make the call.
	ErrAdminForbidden = errors.New("forbidden")
)

// AdminRefusal returns an error wrapping kind (ErrAdminUnauthorized or
// ErrAdminForbidden) whose message, msg, is the whole answer's message.
func AdminRefusal(kind error, msg string) error { return &authError{kind, msg} }

// Decode reads r's body into dst, one of httpapi's request types, as the
// slot API reads its own (decode): declared application/json, at most
// limit bytes, valid UTF-8, one JSON object, no unknown, repeated or
// case-folded field. Its errors map to 400 invalid_request and 415
// unsupported_media_type.
func Decode(w http.ResponseWriter, r *http.Request, limit int64, dst any) error {
	return decode(w, r, limit, dst)
}

// OutOfRange reports whether err, from Decode, is a whole number too
// large for 64 bits, and which field and number (as sent, cut past 20
// digits) it was, so that the caller can answer with the field's bound.
func OutOfRange(err error) (field, number string, ok bool) {
	var rangeErr *rangeError
	if !errors.As(err, &rangeErr) {
		return "", "", false
	}
	return rangeErr.field, rangeErr.number, true
}

// BadRequest is a malformed request, 400 invalid_request, with the
// message format and args make.
func BadRequest(format string, args ...any) error { return badRequest(format, args...) }

// MapError maps err, from Decode or from the limiter, to the HTTP status
// and error of the API (apiError, the one place that does), in the admin
// API's words where the slot API's would name a plan or a user that the
// call is not about.
func MapError(err error) (status int, e httpapi.Error) {
	status, e = apiError(err)
	switch e.Code {
	case httpapi.CodeUnavailable:
		e.Message = adminUnavailable
	case httpapi.CodeOutcomeUnknown:
		e.Message = adminOutcomeUnknown
	}
	return status, e
}

// The admin API's answers to an outage: an admin call applies no plan's
// failure mode, and is about a user or a pool key.
const (
	adminUnavailable    = "the limiter's Redis did not answer within its deadline: nothing was changed; retry later"
	adminOutcomeUnknown = "the call reached the limiter's Redis but its answer was lost: it may or may not have taken effect (a release: some or all of the slots; a removal: the override); list the slots of the user or the pool key to see what holds now"
)

// WriteError answers e with status, as every error of the API is
// answered (with Retry-After on a 503).
func WriteError(w http.ResponseWriter, status int, e httpapi.Error) { writeError(w, status, e) }

// BearerToken returns the token of r's "Authorization: Bearer <token>"
// header (scheme case-insensitive, RFC 9110).
func BearerToken(r *http.Request) (string, bool) { return bearerToken(r) }
