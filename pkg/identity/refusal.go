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
// ambiguous_identity for ErrAmbiguous, else 401 unauthenticated, with the
// error's message (which never quotes a token).
func Refusal(err error) hold.Refusal {
	if errors.Is(err, ErrAmbiguous) {
		return hold.Refused(http.StatusBadRequest, hold.TypeInvalidRequest, CodeAmbiguousIdentity, err.Error())
	}
	return hold.Refused(http.StatusUnauthorized, hold.TypeInvalidRequest, hold.CodeUnauthenticated, err.Error())
}
