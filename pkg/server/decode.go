package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"reflect"
	"strings"
	"unicode/utf8"

	"github.com/joishi/limiter/pkg/httpapi"
)

// maxBatchBodyBytes bounds POST /v1/slots/heartbeats: 1000 slots of
// maximal ids do not fit in MaxBodyBytes.
const maxBatchBodyBytes = 1 << 20

// requestError is a malformed request: 400 invalid_request.
type requestError struct{ msg string }

func (e *requestError) Error() string { return e.msg }

func badRequest(format string, args ...any) error {
	return &requestError{msg: fmt.Sprintf(format, args...)}
}

// mediaTypeError is a body not declared as JSON: 415 unsupported_media_type.
type mediaTypeError struct{ msg string }

func (e *mediaTypeError) Error() string { return e.msg }

// checkContentType refuses a body whose Content-Type is not
// application/json (parameters allowed; a charset, if given, must be
// utf-8). It is what keeps a web page off the API: a browser sends a
// cross-site POST without asking first only as text/plain, a form or
// multipart; application/json needs a CORS preflight, which the API never
// grants (it sends no CORS header).
func checkContentType(r *http.Request) error {
	header := r.Header.Get("Content-Type")
	mediaType, params, err := mime.ParseMediaType(header)
	switch {
	case header == "":
		return &mediaTypeError{msg: "no Content-Type: the body must be sent as application/json"}
	case err != nil || mediaType != "application/json":
		return &mediaTypeError{msg: fmt.Sprintf("Content-Type %q is not accepted: the body must be sent as application/json", clean(header, 100))}
	case params["charset"] != "" && !strings.EqualFold(params["charset"], "utf-8"):
		return &mediaTypeError{msg: fmt.Sprintf("charset %q is not accepted: JSON bodies are UTF-8", clean(params["charset"], 100))}
	}
	return nil
}

// decode reads r's body into dst strictly: declared application/json
// (checkContentType), at most limit bytes, valid UTF-8 (decoders would
// silently replace bad bytes, letting two different ids collide), one JSON
// object, no unknown fields, right types.
func decode(w http.ResponseWriter, r *http.Request, limit int64, dst any) error {
	if err := checkContentType(r); err != nil {
		return err
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return badRequest("request body exceeds the limit of %d bytes", limit)
		}
		return badRequest("reading the request body: %v", err)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return badRequest("request body is empty; a JSON object is required")
	}
	if !utf8.Valid(body) {
		return badRequest("request body is not valid UTF-8")
	}
	if trimmed := bytes.TrimSpace(body); trimmed[0] != '{' {
		return badRequest("request body must be a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return badRequest("%s", describeJSONError(err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return badRequest("request body holds data after the JSON object")
	}
	if err := checkFields(body, reflect.TypeOf(dst).Elem()); err != nil {
		return badRequest("request body: %v", err)
	}
	return nil
}

func describeJSONError(err error) string {
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.As(err, &typeErr):
		if typeErr.Field == "" {
			return fmt.Sprintf("request body must be a JSON object, got %s", typeErr.Value)
		}
		return fmt.Sprintf("field %q must be %s, got %s", typeErr.Field, jsonType(typeErr.Type.Kind().String()), typeErr.Value)
	case errors.As(err, &syntaxErr):
		return fmt.Sprintf("request body is not valid JSON at byte %d: %v", syntaxErr.Offset, err)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "request body is truncated JSON"
	default:
		// DisallowUnknownFields reports `json: unknown field "x"`.
		return fmt.Sprintf("request body: %v", err)
	}
}

func jsonType(kind string) string {
	switch kind {
	case "string":
		return "a string"
	case "slice":
		return "an array"
	case "struct", "map":
		return "an object"
	case "bool":
		return "a boolean"
	default:
		return "a number"
	}
}

func writeJSON(w http.ResponseWriter, status int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

// unavailableRetryAfter is the Retry-After, in seconds, of every 503.
// Each call is judged anew under the per-call deadline (250ms by default),
// so a second is long enough not to pile retries onto a struggling Redis
// and short enough not to keep a caller waiting once it is back.
const unavailableRetryAfter = "1"

func writeError(w http.ResponseWriter, status int, e httpapi.Error) {
	if status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", unavailableRetryAfter)
	}
	writeJSON(w, status, httpapi.ErrorResponse{Error: e})
}
