// Package adminui holds the admin page's static files (HTML, CSS and
// JavaScript written by hand: no build step, nothing fetched from a CDN),
// embedded in the binary. pkg/admin serves them at /admin/ under a strict
// Content-Security-Policy, which is why no file holds an inline script or
// style.
package adminui

import (
	"embed"
	"io/fs"
)

//go:embed static
var static embed.FS

// Files returns the page's files, index.html at the root.
func Files() (fs.FS, error) {
	return fs.Sub(static, "static")
}
