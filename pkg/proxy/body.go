package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/joishi/limiter/pkg/hold"
	"github.com/joishi/limiter/pkg/identity"
	"github.com/joishi/limiter/pkg/limiter"
)

// bodyReadTimeout bounds reading a buffered request body, so that a
// client trickling its body holds no buffer for long. It does not bound
// the stream, which starts once the body is in.
const bodyReadTimeout = 30 * time.Second

// bufferBody reads r's body, up to MaxBodyBytes, and adds to id the pool
// keys its body sources find there; r then carries the same bytes
// upstream. An empty body joins no key. Not ok: the request is answered
// with the refusal, or, nil, not at all (its client left).
func (p *Proxy) bufferBody(w http.ResponseWriter, r *http.Request, id *identity.Identity) (*hold.Refusal, bool) {
	limit := p.opts.MaxBodyBytes
	if r.ContentLength > limit {
		return tooLarge(fmt.Sprintf("the request body is %d bytes (Content-Length), over the %d bytes proxy.maxBodyBytes allows", r.ContentLength, limit)), false
	}
	body, refusal, ok := p.readBody(w, r)
	if !ok {
		return refusal, false
	}
	if int64(len(body)) > limit {
		return tooLarge(fmt.Sprintf("the request body is over the %d bytes proxy.maxBodyBytes allows", limit)), false
	}
	keepBody(r, body)
	if len(body) == 0 {
		return nil, true
	}
	if err := p.ident.BodyPools(id, body); err != nil {
		refusal := identity.BodyRefusal(err, requestHeaders{r})
		return &refusal, false
	}
	return nil, true
}

// readAhead reads r's body before an acquire that may wait, up to
// MaxBodyBytes: net/http notices a client that goes away only once the
// request's body is read, so a request waiting with its body unread
// would keep its place in the queue, and be granted, forwarded and
// counted, after its client left. whole is false when the body is longer:
// r then carries what was read followed by the rest, and the request is
// not to wait. Not ok: as bufferBody.
func (p *Proxy) readAhead(w http.ResponseWriter, r *http.Request) (refusal *hold.Refusal, whole, ok bool) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, true, true
	}
	if r.ContentLength > p.opts.MaxBodyBytes {
		return nil, false, true
	}
	body, refusal, ok := p.readBody(w, r)
	if !ok {
		return refusal, false, false
	}
	if int64(len(body)) > p.opts.MaxBodyBytes {
		r.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(body), r.Body), r.Body}
		return nil, false, true
	}
	keepBody(r, body)
	return nil, true, true
}

// readBody reads r's body, up to one byte over MaxBodyBytes, within
// bodyReadTimeout. Not ok: the request is answered with the refusal, or,
// nil, not at all (its client left).
func (p *Proxy) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *hold.Refusal, bool) {
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(bodyReadTimeout))
	body, err := readAll(io.LimitReader(r.Body, p.opts.MaxBodyBytes+1), r.ContentLength)
	_ = rc.SetReadDeadline(time.Time{})
	switch {
	case r.Context().Err() != nil:
		return nil, nil, false
	case errors.Is(err, os.ErrDeadlineExceeded):
		refusal := hold.Refused(http.StatusRequestTimeout, hold.TypeInvalidRequest, hold.CodeInvalidBody,
			fmt.Sprintf("the request body did not arrive within %s", bodyReadTimeout))
		return nil, &refusal, false
	case err != nil:
		refusal := hold.Refused(http.StatusBadRequest, hold.TypeInvalidRequest, hold.CodeInvalidBody, "reading the request body: "+err.Error())
		return nil, &refusal, false
	}
	return body, nil, true
}

// keepBody makes body, read whole from r, r's body again: it goes
// upstream with its length, even if it came chunked.
func keepBody(r *http.Request, body []byte) {
	r.Body.Close()
	r.TransferEncoding = nil
	if len(body) == 0 {
		r.Body, r.ContentLength = http.NoBody, 0
		return
	}
	r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
}

// readAll is io.ReadAll into a buffer of the size the body declares
// (Content-Length; -1 when unknown), so that a body of that length is
// read into one allocation rather than grown into from 512 bytes.
func readAll(r io.Reader, declared int64) ([]byte, error) {
	if declared < 0 {
		return io.ReadAll(r)
	}
	// One byte more, so that the read that finds the end needs no room.
	b := make([]byte, 0, declared+1)
	for {
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)] // a body longer than declared: grow as append does
		}
	}
}

func tooLarge(msg string) *hold.Refusal {
	r := hold.Refused(http.StatusRequestEntityTooLarge, hold.TypeInvalidRequest, hold.CodeBodyTooLarge, msg)
	return &r
}

// poolsAttr is a grant's pool keys for the log: "model=gpt-4o,org=acme".
func poolsAttr(grants []limiter.PoolGrant) string {
	var b strings.Builder
	for i, g := range grants {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(g.Pool + "=" + g.Key)
	}
	return b.String()
}

// handlerBody is a request's body that can be read only until its
// handler returns (end), whoever reads it.
type handlerBody struct {
	mu    sync.Mutex // held by a read under way
	rc    io.ReadCloser
	w     http.ResponseWriter
	ended bool
	// returning: the handler is returning, and w is no longer to be used
	// from another goroutine (see interrupt); guarded by wmu.
	wmu       sync.Mutex
	returning bool
}

// interrupt ends a read under way now, from any goroutine, unless the
// handler is returning: the request was cut (its stream's slot lost, or
// the proxy shutting down) while its client still sent the body, and the
// transport's write of it, which the cut's answer waits for, must not wait
// for the client's next bytes.
func (b *handlerBody) interrupt() {
	b.wmu.Lock()
	defer b.wmu.Unlock()
	if !b.returning {
		_ = http.NewResponseController(b.w).SetReadDeadline(time.Now())
	}
}

// handlerReturns says the handler is returning: interrupt does nothing
// from then on (it returns once one under way has).
func (b *handlerBody) handlerReturns() {
	b.wmu.Lock()
	defer b.wmu.Unlock()
	b.returning = true
}

func (b *handlerBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ended {
		return 0, http.ErrBodyReadAfterClose
	}
	return b.rc.Read(p)
}

// Close does nothing: the handler closes the body (end).
func (b *handlerBody) Close() error { return nil }

// end closes the body for good. A read under way (the upstream answered
// before the client sent all of it) is ended by the connection's read
// deadline, so that the answer ends now and not when the client sends
// more.
func (b *handlerBody) end() {
	if !b.mu.TryLock() {
		_ = http.NewResponseController(b.w).SetReadDeadline(time.Now())
		b.mu.Lock()
	}
	defer b.mu.Unlock()
	b.ended = true
	_ = b.rc.Close()
}
