// Package apitest checks HTTP traffic against the API contract,
// api/openapi.yaml: wrap a test client's transport with ValidatingTransport
// and every request and response that goes through it is validated, each
// mismatch failing the test with the method, path, status and violation.
package apitest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
)

// SpecPath is the contract's path relative to the repository root.
const SpecPath = "api/openapi.yaml"

// InvalidHeader marks a request the test sends invalid on purpose (bad JSON,
// unknown fields, out-of-bounds ids...): its request is not validated, but
// its response still is. The transport strips the header before sending.
// Set it with Invalid.
const InvalidHeader = "X-Apitest-Invalid"

// Tags of the operations of the ops and admin listeners in the spec; the
// other operations are the API listener's.
const (
	OpsTag   = "ops"
	AdminTag = "admin"
)

// listener is the part of the spec one listener serves.
type listener int

const (
	apiListener listener = iota
	opsListener
	adminListener
)

// Invalid marks req as deliberately invalid (see InvalidHeader) and returns it.
func Invalid(req *http.Request) *http.Request {
	req.Header.Set(InvalidHeader, "1")
	return req
}

// Spec loads api/openapi.yaml from the repository root (found by walking up
// from the working directory to go.mod) and validates it; any failure is
// fatal. Each call returns a fresh document the caller may modify.
func Spec(t testing.TB) *openapi3.T {
	t.Helper()
	doc, err := LoadSpec(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

// LoadSpec loads api/openapi.yaml as Spec does, returning errors.
func LoadSpec(ctx context.Context) (*openapi3.T, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	path := filepath.Join(root, SpecPath)
	loader := openapi3.NewLoader()
	loader.Context = ctx
	doc, err := loader.LoadFromFile(path)
	if err != nil {
		return nil, fmt.Errorf("apitest: loading %s: %w", path, err)
	}
	if err := doc.Validate(ctx); err != nil {
		return nil, fmt.Errorf("apitest: %s is not a valid OpenAPI document: %w", path, err)
	}
	return doc, nil
}

// RepoRoot returns the nearest directory at or above the working directory
// that holds go.mod.
func RepoRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("apitest: %w", err)
	}
	for dir := wd; ; {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("apitest: no go.mod at or above %s", wd)
		}
		dir = parent
	}
}

// ValidatingTransport returns a RoundTripper that sends each request through
// next (http.DefaultTransport when nil) and validates it against the API
// listener's part of the spec (every operation not tagged "ops" or
// "admin"): the request
// (unless marked Invalid) and the response, whatever the status. A status the
// operation does not list is a mismatch. A path the spec does not list must
// answer the generic 404 (#/components/responses/NotFound), and a listed
// path called with an unlisted method the generic 405
// (#/components/responses/MethodNotAllowed). Mismatches are reported with
// t.Errorf; transport errors are returned as they are.
func ValidatingTransport(t testing.TB, next http.RoundTripper) http.RoundTripper {
	t.Helper()
	return newTransport(t, next, apiListener)
}

// ValidatingAdminTransport is ValidatingTransport for the admin listener:
// it validates against the operations tagged "admin". A path the spec does
// not list must answer the generic 404.
func ValidatingAdminTransport(t testing.TB, next http.RoundTripper) http.RoundTripper {
	t.Helper()
	return newTransport(t, next, adminListener)
}

// ValidatingOpsTransport is ValidatingTransport for the ops listener: it
// validates against the operations tagged "ops". A path the spec does not
// list must answer 404.
func ValidatingOpsTransport(t testing.TB, next http.RoundTripper) http.RoundTripper {
	t.Helper()
	return newTransport(t, next, opsListener)
}

type transport struct {
	t      testing.TB
	next   http.RoundTripper
	doc    *openapi3.T
	router routers.Router
	ops    bool // the ops listener, whose 404 and 405 are net/http's text
	opts   *openapi3filter.Options
}

func newTransport(t testing.TB, next http.RoundTripper, l listener) *transport {
	t.Helper()
	if next == nil {
		next = http.DefaultTransport
	}
	doc := Spec(t)
	listenerView(doc, l)
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		t.Fatalf("apitest: building the router of %s: %v", SpecPath, err)
	}
	return &transport{
		t:      t,
		next:   next,
		doc:    doc,
		router: router,
		ops:    l == opsListener,
		opts: &openapi3filter.Options{
			// A status the operation does not list is a mismatch.
			IncludeResponseStatus: true,
			MultiError:            true,
			// Authorization is the server's business, not the contract's.
			AuthenticationFunc: openapi3filter.NoopAuthenticationFunc,
			// Name the field and the rule, not the whole schema.
			SchemaValidationOptions: []openapi3.SchemaValidationOption{openapi3.DisableSchemaErrorDetails()},
		},
	}
}

// listenerView keeps the paths of one listener and drops every servers
// entry, so that routes match requests to any host and port (the httptest
// server's).
func listenerView(doc *openapi3.T, l listener) {
	doc.Servers = nil
	for path, item := range doc.Paths.Map() {
		if listenerOf(item) != l {
			doc.Paths.Delete(path)
			continue
		}
		item.Servers = nil
		for _, op := range item.Operations() {
			op.Servers = nil
		}
	}
}

func listenerOf(item *openapi3.PathItem) listener {
	for _, op := range item.Operations() {
		for _, tag := range op.Tags {
			switch tag {
			case OpsTag:
				return opsListener
			case AdminTag:
				return adminListener
			}
		}
	}
	return apiListener
}

func (tr *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	reqBody, err := readBody(req)
	if err != nil {
		return nil, err
	}
	skipRequest := req.Header.Get(InvalidHeader) != ""

	out := req.Clone(req.Context())
	out.Header.Del(InvalidHeader)
	setRequestBody(out, reqBody)

	// Validate a copy, so validation cannot touch what is sent.
	check := out.Clone(context.Background())
	setRequestBody(check, reqBody)
	route, pathParams, routeErr := tr.router.FindRoute(check)
	// The router hands path parameters over as sent, escaped; the contract
	// describes their values (a pool key "a/b" is sent a%2Fb).
	for name, value := range pathParams {
		if unescaped, err := url.PathUnescape(value); err == nil {
			pathParams[name] = unescaped
		}
	}
	var problems []string
	var input *openapi3filter.RequestValidationInput
	if routeErr == nil {
		input = &openapi3filter.RequestValidationInput{Request: check, PathParams: pathParams, Route: route, Options: tr.opts}
		if !skipRequest {
			if err := openapi3filter.ValidateRequest(check.Context(), input); err != nil {
				problems = append(problems, "request does not match the spec: "+flatten(err))
			}
		}
	}

	resp, err := tr.next.RoundTrip(out)
	if err != nil {
		if len(problems) > 0 {
			tr.t.Errorf("apitest: %s %s (not answered: %v): %s", req.Method, req.URL.Path, err, strings.Join(problems, "; "))
		}
		return nil, err
	}
	respBody, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("apitest: reading the response of %s %s: %w", req.Method, req.URL.Path, err)
	}
	resp.Body = io.NopCloser(bytes.NewReader(respBody))

	if p := tr.checkResponse(check, input, routeErr, resp, respBody); p != "" {
		problems = append(problems, p)
	}
	if len(problems) > 0 {
		tr.t.Errorf("apitest: %s %s → %d: %s", req.Method, req.URL.Path, resp.StatusCode, strings.Join(problems, "; "))
	}
	return resp, nil
}

// checkResponse returns what is wrong with resp, or "".
func (tr *transport) checkResponse(req *http.Request, input *openapi3filter.RequestValidationInput, routeErr error, resp *http.Response, body []byte) string {
	if routeErr != nil {
		var want int
		var generic string
		switch {
		case errors.Is(routeErr, routers.ErrPathNotFound):
			want, generic = http.StatusNotFound, "NotFound"
		case errors.Is(routeErr, routers.ErrMethodNotAllowed):
			want, generic = http.StatusMethodNotAllowed, "MethodNotAllowed"
		default:
			return "routing the request in the spec: " + routeErr.Error()
		}
		if resp.StatusCode != want {
			return fmt.Sprintf("the spec has no operation %s %s (%v), so the answer must be %d, got %d", req.Method, req.URL.Path, routeErr, want, resp.StatusCode)
		}
		if tr.ops {
			return "" // the ops listener's 404 and 405 are net/http's own text
		}
		input = tr.genericInput(req, want, generic)
		if input == nil {
			return fmt.Sprintf("the spec has no #/components/responses/%s for a %d", generic, want)
		}
	}
	rin := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: input,
		Status:                 resp.StatusCode,
		Header:                 resp.Header,
		Options:                tr.opts,
	}
	rin.SetBodyBytes(body)
	if err := openapi3filter.ValidateResponse(req.Context(), rin); err != nil {
		return "response does not match the spec: " + flatten(err)
	}
	return ""
}

// genericInput returns a validation input whose operation answers status
// with the component response name: the routing errors, which no
// operation of the spec lists.
func (tr *transport) genericInput(req *http.Request, status int, name string) *openapi3filter.RequestValidationInput {
	ref := tr.doc.Components.Responses[name]
	if ref == nil || ref.Value == nil {
		return nil
	}
	op := openapi3.NewOperation()
	op.Responses = openapi3.NewResponses(openapi3.WithStatus(status, ref))
	route := &routers.Route{Spec: tr.doc, Path: req.URL.Path, Method: req.Method, Operation: op}
	return &openapi3filter.RequestValidationInput{Request: req, Route: route, Options: tr.opts}
}

func readBody(req *http.Request) ([]byte, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, nil
	}
	defer req.Body.Close()
	b, err := io.ReadAll(req.Body)
	if err != nil {
		return nil, fmt.Errorf("apitest: reading the request body of %s %s: %w", req.Method, req.URL.Path, err)
	}
	return b, nil
}

func setRequestBody(req *http.Request, body []byte) {
	if body == nil {
		req.Body, req.GetBody, req.ContentLength = http.NoBody, nil, 0
		return
	}
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	req.ContentLength = int64(len(body))
}

// flatten renders a (multi-)error of kin-openapi on one line.
func flatten(err error) string {
	var me openapi3.MultiError
	if errors.As(err, &me) && len(me) > 0 {
		parts := make([]string, len(me))
		for i, e := range me {
			parts[i] = flatten(e)
		}
		return strings.Join(parts, " | ")
	}
	return strings.Join(strings.Fields(err.Error()), " ")
}
