package identity

import (
	"errors"
	"net/http"
	"strings"

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

// BodyRefusal is Refusal for an error of Resolver.BodyPools on a request
// with headers h. A body the sources cannot read because it is compressed
// (a Content-Encoding other than identity) or is not sent as JSON (a
// Content-Type that is not JSON's) is refused invalid_body with a message
// that names the encoding, else the type, rather than one telling the
// client its JSON is not JSON: the body sources read uncompressed JSON.
func BodyRefusal(err error, h Headers) hold.Refusal {
	r := Refusal(err)
	if !errors.Is(err, ErrInvalidBody) {
		return r
	}
	ct, ce := strings.TrimSpace(h.Get("Content-Type")), strings.TrimSpace(h.Get("Content-Encoding"))
	switch {
	case ce != "" && !strings.EqualFold(ce, "identity"):
		r.Error.Message += " (it was sent with Content-Encoding: " + ce + "; a pool's body source reads uncompressed JSON request bodies)"
	case ct != "" && !isJSON(ct):
		r.Error.Message += " (it was sent as " + ct + "; a pool's body source reads JSON request bodies)"
	}
	return r
}

// isJSON reports whether a Content-Type is JSON's.
func isJSON(contentType string) bool {
	mt, _, _ := strings.Cut(contentType, ";")
	mt = strings.ToLower(strings.TrimSpace(mt))
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}
