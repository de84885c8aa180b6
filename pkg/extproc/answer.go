package extproc

import (
	"encoding/json"
	"math"
	"net/http"
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/joishi/limiter/pkg/limiter"
)

// Error types, as OpenAI's API names them (the proxy answers the same).
const (
	typeRateLimit      = "rate_limit_error"
	typeInvalidRequest = "invalid_request_error"
	typeServer         = "server_error"
)

// Error codes of the answers Envoy sends for the limiter.
const (
	codeLimitReached    = "stream_limit_reached"
	codeUnauthenticated = "unauthenticated"
	codePlanNotAllowed  = "plan_not_allowed"
	codeUnknownPlan     = "unknown_plan"
	codeInvalidUserID   = "invalid_user_id"
	codeUnavailable     = "limiter_unavailable"
	codeSlotLost        = "slot_lost"
	codeInternal        = "internal_error"
)

// apiError is the body of every ImmediateResponse, in the shape of
// OpenAI's errors, plus the limiter's figures on a 429.
type apiError struct {
	Message      string  `json:"message"`
	Type         string  `json:"type"`
	Param        *string `json:"param"`
	Code         string  `json:"code"`
	RetryAfterMs *int64  `json:"retry_after_ms,omitempty"`
	Used         *int    `json:"used,omitempty"`
	Limit        *int    `json:"limit,omitempty"`
}

// refusal is an answer that ends the HTTP stream: an ImmediateResponse.
type refusal struct {
	status  int
	err     apiError
	headers map[string]string // beside content-type and cache-control
}

// immediate returns r as an ImmediateResponse. details (no spaces) fills
// Envoy's %RESPONSE_CODE_DETAILS%.
func (r refusal) immediate() *extprocv3.ProcessingResponse {
	body, _ := json.Marshal(struct {
		Error apiError `json:"error"`
	}{r.err})
	set := []*corev3.HeaderValueOption{
		header("content-type", "application/json"),
		header("cache-control", "no-store"),
	}
	for name, value := range r.headers {
		set = append(set, header(name, value))
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(r.status)},
			Headers: &extprocv3.HeaderMutation{SetHeaders: set},
			Body:    append(body, '\n'),
			Details: "limiter_" + r.err.Code,
		},
	}}
}

// limited is the answer to a user holding the plan's limit: 429,
// Retry-After (seconds, rounded up), and x-should-retry: false, which
// keeps the OpenAI SDKs from sleeping out Retry-After themselves (see
// pkg/proxy's writeLimited).
func limited(res limiter.AcquireResult) refusal {
	ms := res.RetryAfter.Milliseconds()
	used, limit := res.Used, res.Limit
	return refusal{
		status: http.StatusTooManyRequests,
		err: apiError{
			Type: typeRateLimit, Code: codeLimitReached,
			Message:      "this account already has " + strconv.Itoa(used) + " of its " + strconv.Itoa(limit) + " concurrent streams open; wait for one to finish",
			RetryAfterMs: &ms, Used: &used, Limit: &limit,
		},
		headers: map[string]string{
			"retry-after":    strconv.FormatInt(max(1, int64(math.Ceil(res.RetryAfter.Seconds()))), 10),
			"x-should-retry": "false",
		},
	}
}

func refused(status int, typ, code, message string) refusal {
	r := refusal{status: status, err: apiError{Type: typ, Code: code, Message: message}}
	if status == http.StatusServiceUnavailable {
		r.headers = map[string]string{"retry-after": "1"}
	}
	return r
}

// header is a header to set, replacing any of the same name (a client
// cannot smuggle its own stream id past the limiter).
func header(name, value string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: name, RawValue: []byte(value)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

// proceed is CONTINUE, setting the given headers (none when set is nil).
func proceed(set ...*corev3.HeaderValueOption) *extprocv3.CommonResponse {
	r := &extprocv3.CommonResponse{Status: extprocv3.CommonResponse_CONTINUE}
	if len(set) > 0 {
		r.HeaderMutation = &extprocv3.HeaderMutation{SetHeaders: set}
	}
	return r
}

func requestHeadersContinue(set ...*corev3.HeaderValueOption) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
		RequestHeaders: &extprocv3.HeadersResponse{Response: proceed(set...)}}}
}

func responseHeadersContinue(set ...*corev3.HeaderValueOption) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
		ResponseHeaders: &extprocv3.HeadersResponse{Response: proceed(set...)}}}
}

// bodyContinue answers a body chunk. In FULL_DUPLEX_STREAMED mode Envoy
// forwards only what the processor sends back, so the chunk is returned
// as it came.
func bodyContinue(body *extprocv3.HttpBody, duplex, response bool) *extprocv3.ProcessingResponse {
	common := proceed()
	if duplex {
		common.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
			StreamedResponse: &extprocv3.StreamedBodyResponse{Body: body.GetBody(), EndOfStream: body.GetEndOfStream()}}}
	}
	br := &extprocv3.BodyResponse{Response: common}
	if response {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: br}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: br}}
}

func trailersContinue(response bool) *extprocv3.ProcessingResponse {
	tr := &extprocv3.TrailersResponse{}
	if response {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: tr}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: tr}}
}
