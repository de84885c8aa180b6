package identity_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/joishi/limiter/pkg/identity"
)

// A body the sources cannot read is refused with a message that names
// what the client sent, a Content-Encoding before a Content-Type, rather
// than one calling its JSON not JSON; JSON sent plainly is told only what
// is wrong with it, and a refusal of a key (not of the body) names neither.
func TestBodyRefusalNamesTheEncodingOrTheType(t *testing.T) {
	r := poolResolver(t, map[string]string{"model": "body:model"})
	for _, tc := range []struct {
		name, body, contentType, contentEncoding string
		wantCode, says, saysNot                  string
	}{
		{"a gzip body", "\x1f\x8b\x08\x00", "application/json", "gzip", "invalid_body",
			"(it was sent with Content-Encoding: gzip; a pool's body source reads uncompressed JSON request bodies)", ""},
		{"a br body without a Content-Type", "\x1b\x0e\x00\xf8", "", "br", "invalid_body", "Content-Encoding: br", ""},
		{"a form", "model=big", "application/x-www-form-urlencoded", "", "invalid_body",
			"(it was sent as application/x-www-form-urlencoded; a pool's body source reads JSON request bodies)", ""},
		{"an encoding named before a type", "\x1f\x8b", "text/plain", "gzip", "invalid_body", "Content-Encoding: gzip", "text/plain"},
		{"JSON with a charset", "model=big", "application/json; charset=utf-8", "", "invalid_body", "not valid JSON", "it was sent"},
		{"a +json type", "model=big", "application/vnd.api+json", "", "invalid_body", "not valid JSON", "it was sent"},
		{"the identity encoding", "model=big", "application/json", "Identity", "invalid_body", "not valid JSON", "it was sent"},
		{"no header at all", "model=big", "", "", "invalid_body", "not valid JSON", "it was sent"},
		{"a bad key in a gzip-labelled body", `{"model":7}`, "application/json", "gzip", "invalid_pool_key", "model", "Content-Encoding"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var id identity.Identity
			err := r.BodyPools(&id, []byte(tc.body))
			if err == nil {
				t.Fatalf("BodyPools(%q) = nil, want an error", tc.body)
			}
			h := http.Header{}
			if tc.contentType != "" {
				h.Set("Content-Type", tc.contentType)
			}
			if tc.contentEncoding != "" {
				h.Set("Content-Encoding", tc.contentEncoding)
			}
			got := identity.BodyRefusal(err, h)
			if got.Status != http.StatusBadRequest || got.Error.Code != tc.wantCode {
				t.Errorf("refusal %d %s, want 400 %s", got.Status, got.Error.Code, tc.wantCode)
			}
			if !strings.Contains(got.Error.Message, tc.says) {
				t.Errorf("message %q does not say %q", got.Error.Message, tc.says)
			}
			if tc.saysNot != "" && strings.Contains(got.Error.Message, tc.saysNot) {
				t.Errorf("message %q says %q, want it not to", got.Error.Message, tc.saysNot)
			}
		})
	}
}
