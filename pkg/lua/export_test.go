package lua

// For rolling_test.go: the pieces this release composes its scripts of,
// to compose the previous release's with those it shares.
var (
	Compose     = compose
	ReleaseBody = releaseBody
	LibPrune    = libPrune
	LibTickets  = libTickets
)
