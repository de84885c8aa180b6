package server

import (
	"fmt"
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

// bearerToken returns the token of the request's "Authorization: Bearer
// <token>" header (scheme case-insensitive, RFC 9110). A request of two
// Authorization headers presents none: which one names its caller is not
// for the limiter to guess (see ambiguous).
func bearerToken(r *http.Request) (string, bool) {
	values := r.Header.Values("Authorization")
	if len(values) != 1 {
		return "", false
	}
	return bearerValue(values[0])
}

// ambiguous is the refusal of a request of several Authorization values
// (headers, or gRPC metadata), n: one front end may add its own beside
// the client's, and the first is not always the one meant.
func ambiguous(n int) string {
	return fmt.Sprintf("the request carries %d Authorization values; send one", n)
}

// bearerValue returns the token of a "Bearer <token>" value.
func bearerValue(value string) (string, bool) {
	scheme, token, ok := strings.Cut(value, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}
