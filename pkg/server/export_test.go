package server

import (
	"time"

	"github.com/joishi/limiter/pkg/ratelog"
)

// SetFailureLogEvery makes s log failed requests at most once per every
// (10s in production), so a test can see the next line.
func SetFailureLogEvery(s *Server, every time.Duration) {
	s.failedInternal = ratelog.New(s.log, every)
	s.failedUnavailable = ratelog.New(s.log, every)
}

// APIError is apiError, for the mapping's own tests.
var APIError = apiError
