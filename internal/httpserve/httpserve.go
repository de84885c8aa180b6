// Package httpserve runs the HTTP listeners of `limiter serve` and
// `limiter proxy` alike.
package httpserve

import (
	"errors"
	"net"
	"net/http"
)

// Serve serves srv on ln until it is shut down or closed, over TLS when
// srv has a TLS configuration (its certificate from
// TLSConfig.GetCertificate). A server shut down or closed is not an
// error.
func Serve(srv *http.Server, ln net.Listener) error {
	var err error
	if srv.TLSConfig != nil {
		err = srv.ServeTLS(ln, "", "")
	} else {
		err = srv.Serve(ln)
	}
	if !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
