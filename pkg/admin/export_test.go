package admin

import (
	"time"

	"github.com/joishi/limiter/pkg/ratelog"
)

// SetAnonymousAuditLogEvery makes a log refused anonymous admin calls at
// most once per every (1s in production); 0 logs every one.
func SetAnonymousAuditLogEvery(a *Admin, every time.Duration) {
	a.audit.anonymous = ratelog.New(a.audit.log, every)
}
