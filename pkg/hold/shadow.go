package hold

import "github.com/joishi/limiter/pkg/limiter"

// HeaderWouldRefuse is the response header by which the front ends (the
// proxy, the ext_proc server) tell the client, and whatever logs its
// answers, that a scope in shadow mode (enforce: false, DESIGN §18) would
// have refused the stream it let through: its value is WouldRefuse's. It
// is set on shadow grants only; the front ends drop one the upstream
// sent, so that it is always the limiter's word.
const HeaderWouldRefuse = "X-Limiter-Would-Refuse"

// WouldRefuse is the value of HeaderWouldRefuse for a grant res: the code
// of the refusal a shadow scope would have answered, and for a pool key
// the key, as pool=key:
//
//	stream_limit_reached
//	pool_limit_reached model=big
//
// "" when no shadow scope would have refused it (no header). A grant the
// plan's limit and a pool key would both have refused says the plan's
// (res.WouldRefuse names one refusal). Pool names and keys hold no space
// or '=' (keys.ValidatePoolName, ValidatePoolKey), so the value splits
// back on the first space and the first '='.
func WouldRefuse(res limiter.AcquireResult) string {
	if res.WouldRefuse == limiter.CodePoolLimitReached && res.WouldRefuseBy != nil {
		return res.WouldRefuse + " " + res.WouldRefuseBy.Pool + "=" + res.WouldRefuseBy.Key
	}
	return res.WouldRefuse
}
