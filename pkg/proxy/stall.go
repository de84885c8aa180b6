package proxy

import (
	"errors"
	"net/http"
	"os"
	"time"
)

// stallWriter bounds each write and flush of a limited request's response
// to its client by timeout (Options.StallTimeout). The deadline is set
// afresh by each write and cleared once the flush that follows it (the
// reverse proxy flushes after every write of a stream) is done: a stream
// may be quiet for longer than timeout (the upstream thinking), and what
// net/http writes once the handler returns, the last chunk, must not
// meet an old deadline. Two deadline updates a write, not four. A write
// or flush that meets one marks the exchange stalled and fails, which
// ends the copy, and so the stream, as a client gone away does.
type stallWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
	x       *exchange
}

func (s *stallWriter) Write(b []byte) (int, error) {
	_ = s.rc.SetWriteDeadline(time.Now().Add(s.timeout)) // ErrNotSupported: no bound, as before
	n, err := s.ResponseWriter.Write(b)
	if err != nil {
		err = s.disarm(err)
	}
	return n, err
}

// FlushError is what http.ResponseController.Flush calls: the reverse
// proxy flushes after each write of a stream, under that write's
// deadline.
func (s *stallWriter) FlushError() error {
	return s.disarm(s.rc.Flush())
}

// Unwrap lets http.ResponseController reach the connection's writer
// (EnableFullDuplex, and Hijack for a WebSocket upgrade).
func (s *stallWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

func (s *stallWriter) disarm(err error) error {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		s.x.stalled.Store(true)
	}
	_ = s.rc.SetWriteDeadline(time.Time{})
	return err
}
