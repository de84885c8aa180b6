package server

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// Clean makes a caller-supplied string safe to log and display: invalid
// UTF-8 and every control or format character (newlines, escapes,
// bidirectional overrides, zero-width marks) becomes U+FFFD, so a user id
// holding a newline can neither forge a second log line nor pass for a
// different id; past max bytes it is cut, marked with "…". The admin
// audit cleans every field a caller sent with it.
func Clean(s string, max int) string {
	var b strings.Builder
	for i, r := range s {
		if b.Len() >= max {
			b.WriteString("…")
			break
		}
		switch {
		case r == utf8.RuneError && !strings.HasPrefix(s[i:], "\uFFFD"):
			b.WriteRune(utf8.RuneError)
		case unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == '\u2028' || r == '\u2029':
			b.WriteRune(utf8.RuneError)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}
