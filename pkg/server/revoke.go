package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"

	"github.com/joishi/limiter/pkg/limiter"
)

// A caller is authenticated once, as its request starts; an acquire may
// then wait up to its plan's maxWait. A reload of the API tokens file
// that revokes the caller (or its token, or the plan) meanwhile must not
// let the wait end granted: the caller could neither heartbeat nor
// release that slot, which would hold the user's place until its TTL. So
// the wait ends when the reload comes (whileInForce), and a grant that
// came as the reload did is looked at again before it is answered
// (stillInForce) and released if it no longer stands.

// errWaitRevoked ends the wait of an acquire whose caller a reload of the
// API tokens file revoked; the answer is the cause whileInForce names. It
// wraps limiter.ErrRevoked, so that the limiter counts the wait revoked,
// not cancelled: the client did not leave.
var errWaitRevoked = fmt.Errorf("%w: the API tokens file no longer holds the waiting acquire's caller", limiter.ErrRevoked)

// stillInForce returns nil while r's credentials still name who (the
// caller authenticate found for r) in set, and who may still use plan;
// else the error that answers r: ErrUnauthenticated when the caller or
// its token is no longer in the file, ErrPlanNotAllowed when its line no
// longer lists plan.
func stillInForce(set *callerSet, r *http.Request, who caller, plan string) error {
	now, err := set.authenticate(r.TLS, r.Header.Values("Authorization")...)
	if err != nil || now.c.name != who.name {
		return &authError{ErrUnauthenticated, fmt.Sprintf("caller %q was revoked: the API tokens file was rewritten without its credentials while the acquire waited, so its wait is ended and no slot is held", who.name)}
	}
	if !now.c.allows(plan) {
		return &authError{ErrPlanNotAllowed, fmt.Sprintf("caller %q may no longer use plan %q: the API tokens file was rewritten while the acquire waited, so its wait is ended and no slot is held", who.name, plan)}
	}
	return nil
}

// stillInForce is the package function against the callers in force.
func (c *Callers) stillInForce(r *http.Request, who caller, plan string) error {
	return stillInForce(c.file.current(), r, who, plan)
}

// whileInForce returns a context that ends, its cause stillInForce's
// error, once a reload of the file no longer holds r's caller who for
// plan. Nothing runs while the file stays as it is: each generation's end
// looks once at the next. stop releases it; call it when the acquire
// returns.
func (c *Callers) whileInForce(r *http.Request, who caller, plan string) (ctx context.Context, stop func()) {
	ctx, end := context.WithCancelCause(context.Background())
	var mu sync.Mutex
	unwatch := func() bool { return false }
	var watch func()
	watch = func() {
		gen := c.file.generation()
		if err := stillInForce(gen.set, r, who, plan); err != nil {
			end(err)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if ctx.Err() == nil { // not stopped meanwhile
			unwatch = context.AfterFunc(gen.replaced, watch)
		}
	}
	watch()
	return ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		end(nil)
		unwatch()
	}
}

// refuseRevoked answers an acquire whose wait stillInForce's err ended:
// 401 unauthenticated with its challenge, or 403 plan_not_allowed.
func (s *Server) refuseRevoked(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, ErrUnauthenticated) {
		challenge(w, r)
	}
	s.fail(w, r, err)
}
