package identity

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/joishi/limiter/pkg/jsonfield"
	"github.com/joishi/limiter/pkg/keys"
)

// Kinds of a PoolSource: where a request's key of a pool comes from.
const (
	// PoolFromHeader: a request header (header:X-Org).
	PoolFromHeader = "header"
	// PoolFromClaim: a claim of the verified JWT, or of the JWT payload a
	// hop in front verified (claim:org_id; dots reach into objects).
	PoolFromClaim = "claim"
	// PoolFromValue: a constant, the same key for every request
	// (value:shared).
	PoolFromValue = "value"
	// PoolFromBody: a top-level field of the JSON request body
	// (body:model), which the front end must buffer to read.
	PoolFromBody = "body"
)

// PoolSourceKinds lists the kinds, as a configuration error names them.
const PoolSourceKinds = "header:NAME, claim:NAME, value:KEY or body:FIELD"

// Errors of resolving a request's pool keys; Refusal answers both with 400.
var (
	// ErrInvalidPoolValue: a pool's source holds something that cannot
	// be a key (a claim that is an object, a body field that is a
	// number, a value outside the key charset, a header or claim sent
	// empty).
	ErrInvalidPoolValue = errors.New("invalid pool key")
	// ErrInvalidBody: a body source is configured and the request body is
	// not a JSON object, or names a source's field more than once.
	ErrInvalidBody = errors.New("invalid request body")
)

// PoolSource says where the key of one pool comes from.
type PoolSource struct {
	// Pool is the pool's name.
	Pool string
	// Kind is PoolFromHeader, PoolFromClaim, PoolFromValue or
	// PoolFromBody.
	Kind string
	// Name is the header's name, the claim's path, the constant key, or
	// the body field's name.
	Name string
}

// String is the source as configured: "body:model".
func (s PoolSource) String() string { return s.Kind + ":" + s.Name }

// ParsePoolSource parses the source of pool's keys, "KIND:NAME". Its
// errors say what is allowed.
func ParsePoolSource(pool, spec string) (PoolSource, error) {
	if err := keys.ValidatePoolName(pool); err != nil {
		return PoolSource{}, err
	}
	kind, name, ok := strings.Cut(spec, ":")
	s := PoolSource{Pool: pool, Kind: kind, Name: name}
	if !ok || name == "" {
		return PoolSource{}, fmt.Errorf("%q is not a source: want %s", spec, PoolSourceKinds)
	}
	switch kind {
	case PoolFromHeader:
		if !ValidHeaderName(name) {
			return PoolSource{}, fmt.Errorf("%q: %q is not an HTTP header name", spec, name)
		}
	case PoolFromClaim:
		if strings.Contains(name, "..") || strings.HasPrefix(name, ".") || strings.HasSuffix(name, ".") {
			return PoolSource{}, fmt.Errorf("%q: %q is not a claim path (names joined by single dots)", spec, name)
		}
	case PoolFromValue:
		if err := keys.ValidatePoolKey(name); err != nil {
			return PoolSource{}, fmt.Errorf("%q: %w", spec, err)
		}
	case PoolFromBody:
		if strings.ContainsAny(name, "\"\\") || strings.IndexFunc(name, func(r rune) bool { return r < ' ' }) >= 0 {
			return PoolSource{}, fmt.Errorf("%q: %q is not a plain JSON field name", spec, name)
		}
	default:
		return PoolSource{}, fmt.Errorf("%q has the unknown kind %q: want %s", spec, kind, PoolSourceKinds)
	}
	return s, nil
}

// PoolSources are the sources of every pool a front end's requests join,
// in the order of the pools' names.
type PoolSources []PoolSource

// ParsePoolSources parses identity.pools, pool → "KIND:NAME". Its errors
// name the pool.
func ParsePoolSources(specs map[string]string) (PoolSources, error) {
	out := make(PoolSources, 0, len(specs))
	var errs []error
	for pool, spec := range specs {
		s, err := ParsePoolSource(pool, spec)
		if err != nil {
			errs = append(errs, fmt.Errorf("pool %s: %w", pool, err))
			continue
		}
		out = append(out, s)
	}
	if len(errs) > 0 {
		slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
		return nil, errors.Join(errs...)
	}
	slices.SortFunc(out, func(a, b PoolSource) int { return strings.Compare(a.Pool, b.Pool) })
	return out, nil
}

// BodyFields are the distinct body fields the sources read; none when
// no source reads the body, and the request need not be buffered.
func (ps PoolSources) BodyFields() []string {
	var fields []string
	for _, s := range ps {
		if s.Kind == PoolFromBody && !slices.Contains(fields, s.Name) {
			fields = append(fields, s.Name)
		}
	}
	return fields
}

// NeedsClaims reports whether a source reads a JWT claim.
func (ps PoolSources) NeedsClaims() bool {
	return slices.ContainsFunc(ps, func(s PoolSource) bool { return s.Kind == PoolFromClaim })
}

// fromRequest returns the keys of the sources that read headers, claims
// (nil claims: none) or constants. A source whose header or claim is
// absent (a claim of null too) joins no key of its pool; one sent empty,
// or blank, is ErrInvalidPoolValue, as an empty body field is: a key is
// 1-128 bytes, and a value no key would let the request past the pool's
// cap.
func (ps PoolSources) fromRequest(h Headers, claims map[string]any) (map[string]string, error) {
	var out map[string]string
	for _, s := range ps {
		var key string
		switch s.Kind {
		case PoolFromValue:
			key = s.Name
		case PoolFromHeader:
			if h == nil {
				continue
			}
			v, present, err := lookup(h, s.Name)
			if err != nil {
				return nil, err
			}
			if !present {
				continue
			}
			if v == "" {
				return nil, s.emptyKey("the header")
			}
			key = v
			if isHostHeader(s.Name) {
				var ok bool
				if key, ok = canonicalHost(v, h.Get(schemeHeader)); !ok {
					return nil, fmt.Errorf("%w: pool %s (from %s): the host %q names no host", ErrInvalidPoolValue, s.Pool, s, v)
				}
			}
		case PoolFromClaim:
			v, err := claimKey(claims, s)
			if err != nil {
				return nil, err
			}
			if v == "" {
				continue // absent, or null
			}
			key = v
		default:
			continue
		}
		if err := keys.ValidatePoolKey(key); err != nil {
			return nil, fmt.Errorf("%w: pool %s (from %s): %w", ErrInvalidPoolValue, s.Pool, s, err)
		}
		if out == nil {
			out = make(map[string]string, len(ps))
		}
		out[s.Pool] = key
	}
	return out, nil
}

// claimKey is the key in a claim: a string, or a number written as JSON
// writes it (an organisation id of 42 is the key "42"). An integer keeps
// its digits however long: ids past 2^53, which a float64 rounds, would
// otherwise share one key that is neither's (1234567890123456789 and
// 1234567890123456700 both 1234567890123456800). "" is a claim absent or
// null; an empty or blank string is ErrInvalidPoolValue.
func claimKey(claims map[string]any, s PoolSource) (string, error) {
	v, ok := claimAt(claims, s.Name)
	if !ok || v == nil {
		return "", nil
	}
	switch v := v.(type) {
	case string:
		if key := trimOWS(v); key != "" {
			return key, nil
		}
		return "", s.emptyKey("the claim")
	case json.Number:
		if digits := strings.TrimPrefix(v.String(), "-"); digits != "" && strings.Trim(digits, "0123456789") == "" {
			return v.String(), nil
		}
		if f, err := v.Float64(); err == nil {
			return s.doubleKey(f)
		}
	case float64: // Envoy's dynamic metadata carries a claim's number so
		return s.doubleKey(v)
	}
	return "", fmt.Errorf("%w: pool %s (from %s): the claim is a %s; want a string or a number", ErrInvalidPoolValue, s.Pool, s, jsonKind(v))
}

// emptyKey is the error of a source whose header or claim is there but
// empty, or only spaces and tabs: no key, which the request must not
// send to join none.
func (s PoolSource) emptyKey(what string) error {
	return fmt.Errorf("%w: pool %s (from %s): %s is empty (or only spaces and tabs); a key must be 1-%d bytes of [A-Za-z0-9._:/@-], "+
		"and a request that joins no key of the pool does not send it", ErrInvalidPoolValue, s.Pool, s, what, keys.MaxPoolKeyBytes)
}

// doubleKey is the key of a claim's number read as a double. Past 2^53
// an integer's digits are lost, and two ids would read as one key that is
// neither's: refused.
func (s PoolSource) doubleKey(f float64) (string, error) {
	if math.Abs(f) >= 1<<53 {
		return "", fmt.Errorf("%w: pool %s (from %s): the claim is a number past 2^53 read as a double (as Envoy's metadata carries numbers), whose digits are lost; send it as a string",
			ErrInvalidPoolValue, s.Pool, s)
	}
	return strconv.FormatFloat(f, 'f', -1, 64), nil
}

func jsonKind(v any) string {
	switch v.(type) {
	case bool:
		return "boolean"
	case map[string]any:
		return "object"
	case []any:
		return "array"
	case json.Number:
		return "number beyond a float64's range"
	}
	return fmt.Sprintf("%T", v)
}

// BodyPools adds to id.Pools the keys that the body sources read from
// body, the whole request body: a top-level field of a JSON object, whose
// absence (or null) joins no key. Errors wrap ErrInvalidBody (the body is
// not a JSON object, or holds a source's field more than once, however
// spelt: JSON parsers disagree on which one counts, so the limiter takes
// neither and refuses the request) or
// ErrInvalidPoolValue (a field that is not a string, or not a key).
func (r *Resolver) BodyPools(id *Identity, body []byte) error {
	fields := r.bodyFields
	if len(fields) == 0 {
		return nil
	}
	values, err := jsonfield.Strings(body, fields)
	var field *jsonfield.FieldError
	switch {
	case errors.As(err, &field) && field.Count > 1:
		return fmt.Errorf("%w: %w", ErrInvalidBody, err)
	case errors.Is(err, jsonfield.ErrInvalidField):
		return fmt.Errorf("%w: %w", ErrInvalidPoolValue, err)
	case err != nil:
		return fmt.Errorf("%w: %w", ErrInvalidBody, err)
	}
	for _, s := range r.opts.Pools {
		if s.Kind != PoolFromBody {
			continue
		}
		key, ok := values[s.Name]
		if !ok {
			continue
		}
		if err := keys.ValidatePoolKey(key); err != nil {
			return fmt.Errorf("%w: pool %s (from %s): %w", ErrInvalidPoolValue, s.Pool, s, err)
		}
		if id.Pools == nil {
			id.Pools = make(map[string]string, len(r.opts.Pools))
		}
		id.Pools[s.Pool] = key
		if id.BodyLabel == "" || s.Name == "model" {
			id.BodyLabel = key
		}
	}
	return nil
}

// ReadsBody reports whether a source reads the request body: the front
// end must then buffer it and call BodyPools before acquiring.
func (r *Resolver) ReadsBody() bool { return len(r.bodyFields) > 0 }

// PoolSources returns the sources the resolver reads pool keys from.
func (r *Resolver) PoolSources() PoolSources { return r.opts.Pools }
