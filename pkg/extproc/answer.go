package extproc

import (
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/joishi/limiter/pkg/hold"
)

// immediate returns r as an ImmediateResponse; Envoy's
// %RESPONSE_CODE_DETAILS% is "limiter_" and its code.
func immediate(r hold.Refusal) *extprocv3.ProcessingResponse {
	set := []*corev3.HeaderValueOption{
		header("content-type", "application/json"),
		header("cache-control", "no-store"),
	}
	for _, kv := range r.Headers {
		set = append(set, header(kv[0], kv[1]))
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(r.Status)},
			Headers: &extprocv3.HeaderMutation{SetHeaders: set},
			Body:    r.Body(),
			Details: "limiter_" + r.Error.Code,
		},
	}}
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
