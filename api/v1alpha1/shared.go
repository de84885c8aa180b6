package v1alpha1

// What LimitTier and LimitPool share: the failure mode, and the Ready
// condition the limiter writes on both.

// FailureMode decides what a tier or a pool does when Redis cannot answer
// in time.
//
// +kubebuilder:validation:Enum=Open;Closed
type FailureMode string

const (
	// FailOpen grants the request and marks it degraded.
	FailOpen FailureMode = "Open"
	// FailClosed refuses the request with 503 limiter_unavailable.
	FailClosed FailureMode = "Closed"
)

// The Ready condition and its reasons, written by the elected limiter
// replica on LimitTiers and LimitPools alike.
const (
	// ConditionReady is True when the current generation of the object is
	// in force on every replica.
	ConditionReady = "Ready"
	// ReasonAccepted: the object is valid and the oldest claiming its plan
	// (a LimitTier) or its pool (a LimitPool).
	ReasonAccepted = "Accepted"
	// ReasonInvalid: the object breaks a rule the API server cannot check
	// (heartbeatInterval above slotTTL/3, a metadata.name unfit as a plan
	// or pool, a value stored before a bound was tightened); the message
	// names each field at fault. The last accepted generation
	// (status.acceptedSpec) stays in force, and the message says which
	// one; when no generation was ever accepted the object enforces
	// nothing, and requests for its plan get unknown_plan (for its pool,
	// unknown_pool) unless another object of its kind defines it.
	ReasonInvalid = "Invalid"
	// ReasonConflict: an older object of the same kind in the namespace
	// already defines the same plan (or pool) and is the one in force.
	ReasonConflict = "Conflict"
	// ReasonDeleting: the object is being deleted (a finalizer holds it)
	// and is out of force; the plan (or pool) it defined is left to any
	// other object of its kind that defines it.
	ReasonDeleting = "Deleting"
)
