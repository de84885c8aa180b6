package server

import (
	"bytes"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"
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
// utf-8), or that is content-coded (Content-Encoding other than
// identity: the API reads bodies as they come, and a gzipped one would
// be refused as bad UTF-8, pointing at the JSON rather than the coding).
// It is what keeps a web page off the API: a browser sends a
// cross-site POST without asking first only as text/plain, a form or
// multipart; application/json needs a CORS preflight, which the API never
// grants (it sends no CORS header).
func checkContentType(r *http.Request) error {
	for _, coding := range r.Header.Values("Content-Encoding") {
		for c := range strings.SplitSeq(coding, ",") {
			if c = strings.TrimSpace(c); c != "" && !strings.EqualFold(c, "identity") {
				return &mediaTypeError{msg: fmt.Sprintf("Content-Encoding %q is not accepted: the body must be sent as plain application/json, not content-coded", Clean(c, 100))}
			}
		}
	}
	header := r.Header.Get("Content-Type")
	if header == "application/json" { // what clients send: no need to parse
		return nil
	}
	mediaType, params, err := mime.ParseMediaType(header)
	switch {
	case header == "":
		return &mediaTypeError{msg: "no Content-Type: the body must be sent as application/json"}
	case err != nil || mediaType != "application/json":
		return &mediaTypeError{msg: fmt.Sprintf("Content-Type %q is not accepted: the body must be sent as application/json", Clean(header, 100))}
	case params["charset"] != "" && !strings.EqualFold(params["charset"], "utf-8"):
		return &mediaTypeError{msg: fmt.Sprintf("charset %q is not accepted: JSON bodies are UTF-8", Clean(params["charset"], 100))}
	}
	return nil
}

// decode reads r's body into dst, one of the API's request types,
// strictly: declared application/json (checkContentType), at most limit
// bytes, valid UTF-8 (decoders would silently replace bad bytes, letting
// two different ids collide), one JSON object, no unknown, repeated or
// case-folded fields, right types (jsonReader). The body is read once, into
// a pooled buffer, and parsed once; the strings of dst share one copy of
// it.
func decode(w http.ResponseWriter, r *http.Request, limit int64, dst any) error {
	if err := checkContentType(r); err != nil {
		return err
	}
	body, buf, err := readBody(w, r, limit)
	if err != nil {
		return err
	}
	trimmed := bytes.TrimSpace(body)
	switch {
	case len(trimmed) == 0:
		err = badRequest("request body is empty; a JSON object is required")
	case !utf8.Valid(body):
		err = badRequest("request body is not valid UTF-8")
	case trimmed[0] != '{':
		err = badRequest("request body must be a JSON object")
	}
	d := jsonReader{}
	if err == nil {
		d.s = string(body)
	}
	buf.release(body)
	if err != nil {
		return err
	}
	// Whitespace that TrimSpace knows and JSON does not (U+00A0) is left.
	if d.skipSpace(); d.peek() != '{' {
		return d.syntaxError("looking for beginning of value")
	}
	switch v := dst.(type) {
	case *httpapi.AcquireRequest:
		err = d.acquire(v)
	case *httpapi.HeartbeatRequest:
		err = d.stringObject(heartbeatFields, []*string{&v.UserID, &v.Plan, &v.StreamID}, -1)
	case *httpapi.ReleaseRequest:
		err = d.stringObject(releaseFields, []*string{&v.UserID, &v.StreamID}, -1)
	case *httpapi.AdminReleaseRequest:
		err = d.stringObject(adminReleaseFields, []*string{&v.Reason}, -1)
	case *httpapi.AdminOverrideRemoveRequest:
		err = d.stringObject(adminReleaseFields, []*string{&v.Reason}, -1)
	case *httpapi.AdminOverrideRequest:
		err = d.overrideRequest(v)
	case *httpapi.HeartbeatsRequest:
		err = d.heartbeats(v)
	default:
		panic("server: decode of a type that is not a request body")
	}
	if err != nil {
		return err
	}
	return d.end()
}

// The fields of each request type, as their json tags name them.
var (
	acquireFields      = stringFields{"user_id", "plan", "stream_id", "label", "wait_ms", "pools"}
	heartbeatFields    = stringFields{"user_id", "plan", "stream_id"}
	releaseFields      = stringFields{"user_id", "stream_id"}
	adminReleaseFields = stringFields{"reason"}
	heartbeatsFields   = stringFields{"slots"}
	overrideFields     = stringFields{"max_concurrent_streams", "expires_in", "reason"}
)

// acquire reads a POST /v1/slots/acquire body: acquireFields, wait_ms a
// whole number, pools an object of strings, the others strings.
func (d *jsonReader) acquire(v *httpapi.AcquireRequest) error {
	strs := [...]*string{&v.UserID, &v.Plan, &v.StreamID, &v.Label}
	return d.fields(acquireFields, -1, func(i int, name string) error {
		switch i {
		case len(strs):
			return d.intValue(name, &v.WaitMs)
		case len(strs) + 1:
			return d.stringMap(name, httpapi.MaxPools, &v.Pools)
		}
		return d.stringValue(name, strs[i])
	})
}

// overrideRequest reads a POST /v1/admin/users/{user_id}/override body:
// two whole numbers and a string, each may be null or absent (the handler
// requires them and checks their bounds).
func (d *jsonReader) overrideRequest(v *httpapi.AdminOverrideRequest) error {
	return d.fields(overrideFields, -1, func(i int, name string) error {
		if isNull, err := d.null(); isNull || err != nil {
			return err
		}
		if i == 2 {
			if d.peek() != '"' {
				return d.typeError(name, "a string")
			}
			s, err := d.str()
			v.Reason = s
			return err
		}
		if c := d.peek(); c != '-' && (c < '0' || c > '9') {
			return d.typeError(name, "a whole number")
		}
		n, err := d.integer(name)
		if err != nil {
			return err
		}
		if i == 0 {
			m := int(n) // int is 64 bits wherever the limiter is built
			v.MaxConcurrentStreams = &m
		} else {
			v.ExpiresIn = &n
		}
		return nil
	})
}

// heartbeats reads a POST /v1/slots/heartbeats body: {"slots": [slot...]},
// each slot a heartbeatFields object or null (an empty slot, which the
// limiter refuses by its ids); slots null or absent is no slots.
func (d *jsonReader) heartbeats(v *httpapi.HeartbeatsRequest) error {
	return d.fields(heartbeatsFields, -1, func(int, string) error {
		if isNull, err := d.null(); isNull || err != nil {
			return err
		}
		if d.peek() != '[' {
			return d.typeError("slots", "an array")
		}
		d.pos++
		// Every slot is an object: their count bounds the array.
		v.Slots = make([]httpapi.HeartbeatRequest, 0, min(strings.Count(d.s[d.pos:], "{"), httpapi.MaxBatch+1))
		d.skipSpace()
		if d.peek() == ']' {
			d.pos++
			return nil
		}
		for {
			d.skipSpace()
			at := len(v.Slots)
			v.Slots = append(v.Slots, httpapi.HeartbeatRequest{})
			slot := &v.Slots[at]
			switch isNull, err := d.null(); {
			case err != nil:
				return err
			case isNull:
			case d.peek() == '{':
				if err := d.stringObject(heartbeatFields, []*string{&slot.UserID, &slot.Plan, &slot.StreamID}, at); err != nil {
					return err
				}
			default:
				return d.typeError("slots["+strconv.Itoa(at)+"]", "an object")
			}
			d.skipSpace()
			switch d.peek() {
			case ',':
				d.pos++
			case ']':
				d.pos++
				return nil
			default:
				return d.syntaxError("after array element")
			}
		}
	})
}

// bodyBuffer is a pooled buffer request bodies are read into.
type bodyBuffer struct{ b []byte }

var bodyPool = sync.Pool{New: func() any { return &bodyBuffer{b: make([]byte, 0, 1024)} }}

// maxPooledBody bounds the buffers kept for reuse, so that a rare batch
// does not keep its megabyte.
const maxPooledBody = 256 << 10

// release puts buf back, with body, its contents, when body grew from it
// and is not too large to keep.
func (buf *bodyBuffer) release(body []byte) {
	if cap(body) <= maxPooledBody {
		buf.b = body[:0]
	}
	bodyPool.Put(buf)
}

// readBody reads r's body, at most limit bytes, into a pooled buffer; the
// caller releases it. A longer body is refused and, as
// http.MaxBytesReader has it, the connection is closed after the answer
// rather than the rest read.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, *bodyBuffer, error) {
	if r.ContentLength > limit {
		w.Header().Set("Connection", "close")
		return nil, nil, badRequest("request body exceeds the limit of %d bytes", limit)
	}
	buf := bodyPool.Get().(*bodyBuffer)
	b := buf.b[:0]
	if n := r.ContentLength; n >= 0 && int64(cap(b)) <= n {
		b = make([]byte, 0, n+1) // +1: room to read the end
	}
	if r.Body == nil {
		return b, buf, nil
	}
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Body.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		switch {
		case int64(len(b)) > limit:
			buf.release(b)
			w.Header().Set("Connection", "close")
			return nil, nil, badRequest("request body exceeds the limit of %d bytes", limit)
		case err == io.EOF:
			return b, buf, nil
		case err != nil:
			buf.release(b)
			return nil, nil, badRequest("reading the request body: %v", err)
		}
	}
}
