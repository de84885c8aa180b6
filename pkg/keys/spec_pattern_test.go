package keys_test

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"github.com/joishi/limiter/pkg/keys"
)

// TestTheSpecsPatternsRefuseWhatTheServerRefuses: the UserID and Label
// patterns of api/openapi.yaml (and so the clients' generated schemas)
// refuse a character of the Basic Multilingual Plane exactly when
// ValidateUserID and ValidateLabel do: whitespace, control and format
// characters (a bidirectional mark, U+200B), and braces in a user id.
func TestTheSpecsPatternsRefuseWhatTheServerRefuses(t *testing.T) {
	spec, err := os.ReadFile("../../api/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		schema string
		check  func(string) error
	}{
		{"UserID", keys.ValidateUserID},
		{"Label", keys.ValidateLabel},
	} {
		m := regexp.MustCompile(`(?s)\n    ` + c.schema + `:\n.*?\n      pattern: '([^']*)'`).FindSubmatch(spec)
		if m == nil {
			t.Fatalf("no pattern of %s in the spec", c.schema)
		}
		// ECMA-262's \uXXXX, as Go's regexp spells it.
		re := regexp.MustCompile(regexp.MustCompile(`\\u([0-9A-Fa-f]{4})`).ReplaceAllString(string(m[1]), `\x{$1}`))
		var differ []string
		for r := rune(1); r <= 0xFFFF; r++ {
			if r >= 0xD800 && r <= 0xDFFF {
				continue // surrogates: no character of UTF-8
			}
			s := "a" + string(r)
			if refused, matches := c.check(s) != nil, re.MatchString(s); refused == matches {
				differ = append(differ, fmt.Sprintf("%U (server refuses: %t, Cf: %t)", r, refused, unicode.Is(unicode.Cf, r)))
			}
		}
		if len(differ) > 0 {
			t.Errorf("%s: %d characters the spec's pattern and the server judge apart: %s", c.schema, len(differ), strings.Join(differ[:min(len(differ), 12)], ", "))
		}
	}
}
