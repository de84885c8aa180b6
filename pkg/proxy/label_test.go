package proxy_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/joishi/limiter/pkg/proxy"
)

// The configured label header labels the stream's slot, for support to see
// who holds it; a value the limiter cannot show, or the header sent more
// than once (which value labels the slot cannot be told), is refused with
// a JSON error naming the header and its bound, before any slot, and
// never reaches the upstream.
func TestTheLabelHeaderLabelsTheSlot(t *testing.T) {
	up := newSSE()
	e := newEnv(t, up, envOptions{proxy: proxy.Options{LabelHeader: "X-Model"}})
	user := newUser()

	req := e.request(t, context.Background(), "POST", "/v1/chat/completions", user, "three", strings.NewReader(`{"stream":true}`))
	req.Header.Set("X-Model", "meta-llama/Llama-3.1-8B")
	resp := e.do(t, req)
	defer resp.Body.Close()
	<-up.started
	slots, err := e.Stack.Limiter.Slots(context.Background(), user)
	if err != nil || len(slots.Slots) != 1 || slots.Slots[0].Label != "meta-llama/Llama-3.1-8B" || slots.Slots[0].Plan != "three" {
		t.Fatalf("slots mid-stream: got %+v, %v; want one slot labelled meta-llama/Llama-3.1-8B on plan three", slots, err)
	}

	for _, tc := range []struct {
		name   string
		values []string
		want   string
	}{
		{"a label over 128 bytes", []string{strings.Repeat("m", 129)}, "header X-Model: invalid label: 129 bytes, the limit is 128"},
		{"a label with a space", []string{"two words"}, "header X-Model: invalid label: must not contain whitespace"},
		{"the label twice", []string{"first", "second"}, "header X-Model: invalid label: the header came more than once (2 values); send it once"},
		{"the label twice with the same value", []string{"first", "first"}, "header X-Model: invalid label: the header came more than once (2 values); send it once"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := e.request(t, context.Background(), "POST", "/v1/chat/completions", user, "three", strings.NewReader(`{"stream":true}`))
			req.Header["X-Model"] = tc.values
			resp := e.do(t, req)
			if resp.StatusCode != http.StatusBadRequest {
				t.Fatalf("status %d, want 400", resp.StatusCode)
			}
			if body := decodeError(t, resp); body.Error.Code != "invalid_label" || body.Error.Type != "invalid_request_error" || !strings.Contains(body.Error.Message, tc.want) {
				t.Errorf("body %+v, want invalid_request_error / invalid_label saying %q", body.Error, tc.want)
			}
		})
	}
	e.checkRefused(t, up, user, 1, "invalid", 4) // the first stream's slot
	close(up.tokens)
}
