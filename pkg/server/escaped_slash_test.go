package server

import "testing"

// TestEscapedSlash: a path is routed by a stand-in only when one of its
// segments is an escaped slash alone, in either case; not when a slash is
// escaped inside a segment, nor when one segment holds two.
func TestEscapedSlash(t *testing.T) {
	for p, want := range map[string]bool{
		"/v1/admin/users/%2F/slots":           true,
		"/v1/admin/users/%2f/slots":           true,
		"/v1/admin/pools/model/keys/%2F":      true,
		"/%2F":                                true,
		"/v1/admin/users/a%2F/slots":          false,
		"/v1/admin/users/%2Fa/slots":          false,
		"/v1/admin/users/%2F%2F/slots":        false,
		"/v1/admin/pools/model/keys/a%2F%2Fb": false,
		"/v1/admin/users/%252F/slots":         false,
		"/v1/slots/acquire":                   false,
		"/":                                   false,
		"":                                    false,
	} {
		if got := escapedSlash(p); got != want {
			t.Errorf("escapedSlash(%q) = %v, want %v", p, got, want)
		}
	}
}
