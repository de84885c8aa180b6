package server

import (
	"net/http"
	"strings"
)

// authError is a refusal of who the caller is (ErrUnauthenticated,
// ErrAdminUnauthorized) or of what it may do (ErrPlanNotAllowed,
// ErrAdminForbidden), with a message for the caller; the status already
// says which.
type authError struct {
	kind error
	msg  string
}

func (e *authError) Error() string { return e.msg }
func (e *authError) Unwrap() error { return e.kind }

// bearerToken returns the token of an "Authorization: Bearer <token>"
// header (scheme case-insensitive, RFC 9110).
func bearerToken(r *http.Request) (string, bool) { return bearerValue(r.Header.Get("Authorization")) }

// bearerValue returns the token of a "Bearer <token>" value.
func bearerValue(value string) (string, bool) {
	scheme, token, ok := strings.Cut(value, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}
