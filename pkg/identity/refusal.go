package identity

import (
	"errors"
	"net/http"

	"github.com/joishi/limiter/pkg/hold"
)

// CodeAmbiguousIdentity is the error code of a request refused for
// ErrAmbiguous.
const CodeAmbiguousIdentity = "ambiguous_identity"

// Refusal is how the front ends holding streams (the proxy, the ext_proc
// server) answer a request whose identity did not resolve: 400
// ambiguous_identity for ErrAmbiguous, 400 invalid_body for
// ErrInvalidBody, 400 invalid_pool_key for ErrInvalidPoolValue, else 401
// unauthenticated, with the error's message (which never quotes a token).
func Refusal(err error) hold.Refusal {
	switch {
	case errors.Is(err, ErrAmbiguous):
		return hold.Refused(http.StatusBadRequest, hold.TypeInvalidRequest, CodeAmbiguousIdentity, err.Error())
	case errors.Is(err, ErrInvalidBody):
		return hold.Refused(http.StatusBadRequest, hold.TypeInvalidRequest, hold.CodeInvalidBody, err.Error())
	case errors.Is(err, ErrInvalidPoolValue):
		return hold.Refused(http.StatusBadRequest, hold.TypeInvalidRequest, hold.CodeInvalidPoolKey, err.Error())
	}
	return hold.Refused(http.StatusUnauthorized, hold.TypeInvalidRequest, hold.CodeUnauthenticated, err.Error())
}
