package server

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/joishi/limiter/pkg/keys"
)

// Clean makes a caller-supplied string safe to log and display: invalid
// UTF-8 and every control or format character (newlines, escapes,
// bidirectional overrides, zero-width marks) becomes U+FFFD, so a user id
// holding a newline can neither forge a second log line nor pass for a
// different id; past max bytes it is cut, marked with "…". The admin
// audit cleans every field a caller sent with it.
func Clean(s string, max int) string { return clean(s, max, false) }

// CleanID is Clean for a user id, and so marks every character
// keys.Invisible names, not only the control and format ones: an id
// already held that keys.ValidateUserID would now refuse, such as
// "alice" followed by a Hangul filler, is acted on by support and shows
// as "alice\uFFFD" in the audit, not as alice.
func CleanID(s string, max int) string { return clean(s, max, true) }

func clean(s string, max int, id bool) string {
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
		case id && keys.Invisible(r):
			b.WriteRune(utf8.RuneError)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}
