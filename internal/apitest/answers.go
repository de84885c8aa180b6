package apitest

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/joishi/limiter/pkg/httpapi"
)

// Reply is an answer a test received, read whole.
type Reply struct {
	Status int
	Header http.Header
	Body   []byte
}

// Decode unmarshals r's body into a new T, failing the test when its
// status is not want.
func Decode[T any](t testing.TB, r Reply, want int) T {
	t.Helper()
	var v T
	if r.Status != want {
		t.Fatalf("status: got %d, want %d; body %s", r.Status, want, r.Body)
	}
	if err := json.Unmarshal(r.Body, &v); err != nil {
		t.Fatalf("decoding %s: %v", r.Body, err)
	}
	return v
}

// WantError checks that r is an error answer with status and code and a
// message, and returns its error.
func WantError(t testing.TB, r Reply, status int, code string) httpapi.Error {
	t.Helper()
	if r.Status != status {
		t.Errorf("status: got %d, want %d; body %s", r.Status, status, r.Body)
	}
	var e httpapi.ErrorResponse
	if err := json.Unmarshal(r.Body, &e); err != nil {
		t.Fatalf("decoding the error %s: %v", r.Body, err)
	}
	if e.Error.Code != code {
		t.Errorf("error code: got %q, want %q (message %q)", e.Error.Code, code, e.Error.Message)
	}
	if e.Error.Message == "" {
		t.Errorf("error message: got empty, want a description")
	}
	return e.Error
}
