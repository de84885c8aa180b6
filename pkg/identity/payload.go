package identity

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// SourcePayload is the Source of an identity read from a JWT payload that
// a hop in front verified (Options.Payload).
const SourcePayload = "jwt_payload"

// maxPayloadBytes bounds a payload header: Envoy's own header limits are
// far above any token's claims.
const maxPayloadBytes = 16 << 10

// Payload takes identities from the payload of a JWT that a hop in front
// has already verified, as Envoy's jwt_authn filter passes it on: as a
// header (forward_payload_header: the payload's JSON, base64url-encoded)
// or as dynamic metadata (payload_in_metadata), which only the ext_proc
// server receives and hands to Resolver.FromClaims. The limiter checks no
// signature: trust the header only when the hop in front sets it on every
// request and strips one the caller sent.
type Payload struct {
	// Header names the header holding the payload. Default "": none, the
	// payload comes from dynamic metadata only.
	Header string
	// UserClaim names the claim holding the user id; a dotted path
	// reaches into objects. Default "sub".
	UserClaim string
	// PlanClaim names the claim holding the plan. Default "": the plan is
	// Options.DefaultPlan.
	PlanClaim string
}

func (p Payload) withDefaults() Payload {
	if p.UserClaim == "" {
		p.UserClaim = DefaultUserClaim
	}
	return p
}

// FromClaims returns the identity in claims, the payload of a verified JWT
// (Envoy's jwt_authn payload_in_metadata, as the ext_proc server receives
// it). h, the request's headers, are read by the pools' header sources
// (nil: none is read). It needs Options.Payload; errors wrap
// ErrUnauthenticated, or are those of the pools' sources.
func (r *Resolver) FromClaims(claims map[string]any, h Headers) (Identity, error) {
	if r.opts.Payload == nil {
		return Identity{}, errors.New("identity: FromClaims needs Options.Payload")
	}
	p := *r.opts.Payload
	user, ok := claimString(claims, p.UserClaim)
	if !ok || user == "" {
		return Identity{}, fmt.Errorf("%w: no string claim %q (the user) in the JWT payload", ErrInvalidToken, p.UserClaim)
	}
	var plan string
	if p.PlanClaim != "" {
		if plan, ok = claimString(claims, p.PlanClaim); !ok && hasClaim(claims, p.PlanClaim) {
			return Identity{}, fmt.Errorf("%w: claim %q (the plan) of the JWT payload is not a string", ErrInvalidToken, p.PlanClaim)
		}
	}
	if plan == "" {
		plan = r.opts.DefaultPlan
	}
	if plan == "" {
		return Identity{}, fmt.Errorf("%w: the JWT payload has no %q claim and there is no default plan", ErrNoPlan, p.PlanClaim)
	}
	return r.withPools(Identity{UserID: user, Plan: plan, Source: SourcePayload}, h, claims)
}

// fromPayloadHeader resolves a request by its payload header.
func (r *Resolver) fromPayloadHeader(h Headers) (Identity, error) {
	name := r.opts.Payload.Header
	if name == "" {
		return Identity{}, fmt.Errorf("%w: identities come from a verified JWT payload in dynamic metadata, and there is none", ErrMissing)
	}
	value, err := single(h, name)
	if err != nil {
		return Identity{}, err
	}
	if value == "" {
		return Identity{}, fmt.Errorf("%w: header %s (the verified JWT payload) is missing", ErrMissing, name)
	}
	claims, err := decodePayload(value)
	if err != nil {
		return Identity{}, fmt.Errorf("%w: header %s: %w", ErrInvalidToken, name, err)
	}
	return r.FromClaims(claims, h)
}

// decodePayload decodes a JWT payload as jwt_authn forwards it: JSON in
// base64url, padded or not (standard base64 accepted too).
func decodePayload(value string) (map[string]any, error) {
	if len(value) > maxPayloadBytes {
		return nil, fmt.Errorf("over %d bytes", maxPayloadBytes)
	}
	trimmed := strings.TrimRight(value, "=")
	data, err := base64.RawURLEncoding.DecodeString(trimmed)
	if err != nil {
		if data, err = base64.RawStdEncoding.DecodeString(trimmed); err != nil {
			return nil, errors.New("not base64url")
		}
	}
	var claims map[string]any
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber() // a numeric claim keeps its digits (see claimKey)
	if err := dec.Decode(&claims); err != nil || claims == nil || dec.More() {
		return nil, errors.New("not a JSON object")
	}
	return claims, nil
}
