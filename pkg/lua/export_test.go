package lua

import "strings"

// For rolling_test.go: the pieces this release composes its scripts of,
// to compose the previous release's with those it shares.
var (
	ComposeWhole = composeWhole
	LibPrune     = libPrune
)

// composeWhole composes body as the previous release did, after its
// pieces whole (compose now keeps only the parts a script uses): the
// SHA1s its replicas load scripts by are of these sources.
func composeWhole(body string, pieces ...string) string {
	header, code := splitHeader(body)
	return header + strings.Join(pieces, "\n") + "\n" + code
}
