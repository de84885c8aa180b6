package admin

import (
	"net/http"

	"github.com/joishi/limiter/pkg/httpapi"
)

// pageCSP allows the page only its own files and its own origin's API: no
// inline script or style, no plugin, no framing, no form posting anywhere.
const pageCSP = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// servePage serves the admin page's embedded files at /admin/. The files are
// public (no secret is in them); every call the page makes needs a token.
func (a *Admin) servePage(mux *http.ServeMux) {
	static := http.StripPrefix(httpapi.PathAdminPage, http.FileServerFS(a.page))
	mux.Handle("GET "+httpapi.PathAdminPage, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", pageCSP)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		// Revalidate on every load, so a new release's page is never mixed
		// with an old one's script.
		h.Set("Cache-Control", "no-cache")
		static.ServeHTTP(w, r)
	}))
	mux.Handle("GET /admin", http.RedirectHandler(httpapi.PathAdminPage, http.StatusMovedPermanently))
}
