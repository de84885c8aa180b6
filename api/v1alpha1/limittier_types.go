package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// LimitTierSpec is one plan's limit.
//
// The API server checks each field on its own; the rule that relates two
// fields (heartbeatInterval at most slotTTL/3) is checked by the limiter,
// which reports a breach as Ready=False with reason Invalid.
type LimitTierSpec struct {
	// plan is the name API requests carry in their "plan" field. When
	// empty, the object's metadata.name is the plan. Two LimitTiers of one
	// namespace claiming the same plan conflict: the older one (by
	// creationTimestamp, then name) with a generation in force keeps it,
	// even while its current spec is invalid (see status.acceptedSpec), and
	// the other reports Ready=False with reason Conflict.
	//
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9][A-Za-z0-9._-]*$`
	Plan string `json:"plan,omitempty"`

	// maxConcurrentStreams is how many streams one user of the plan may
	// hold at once, at most 1000. 0 means users of the plan may not stream
	// at all. Lowering it does not end streams already held: it applies
	// from the next acquire. The bound keeps the scripts that read all of a
	// user's slots (the admin listing, releasing them all) short, since
	// Redis serves nothing else on that shard while one runs.
	//
	// +required
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	MaxConcurrentStreams int32 `json:"maxConcurrentStreams"`

	// slotTTL is how long a slot stays counted without a heartbeat: the
	// longest a crashed holder keeps a user's slot. A duration such as
	// 90s or 2m, between 100ms and 24h.
	//
	// +optional
	// +kubebuilder:default="120s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('100ms') && duration(self) <= duration('24h')",message="must be between 100ms and 24h"
	SlotTTL *metav1.Duration `json:"slotTTL,omitempty"`

	// heartbeatInterval is how often a holder should heartbeat its slot;
	// the acquire answer passes it on. It must be at most slotTTL/3, so
	// that two lost heartbeats in a row do not lose the slot, and at least
	// 1ms (the answer's heartbeat_interval_ms is whole milliseconds). A
	// duration such as 20s. When absent, the limiter uses 20s, or
	// slotTTL/3 when that is shorter (the same default as a tier of the
	// static list); the API server stores no default, since it cannot
	// relate the two fields.
	//
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1ms') && duration(self) <= duration('8h')",message="must be between 1ms and 8h"
	HeartbeatInterval *metav1.Duration `json:"heartbeatInterval,omitempty"`

	// failureMode is what the plan's requests get when Redis does not
	// answer in time: Open grants them, marked degraded (an outage of the
	// limiter is not an outage of the product); Closed refuses them with
	// 503 limiter_unavailable.
	//
	// +optional
	// +kubebuilder:default=Open
	FailureMode FailureMode `json:"failureMode,omitempty"`

	// maxWait is how long an acquire of the plan may wait for one of the
	// user's slots to free up, first come first served across every
	// replica, instead of being refused with 429 at once. A request asks
	// to wait with wait_ms, which this caps; one that is still waiting
	// when its wait runs out gets the usual 429 with Retry-After. A
	// duration such as 10s, between 0s and 60s; 0s (the default) means
	// no waiting: every request is answered at once, as without the field.
	//
	// +optional
	// +kubebuilder:default="0s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s') && duration(self) <= duration('60s')",message="must be between 0s and 60s"
	MaxWait *metav1.Duration `json:"maxWait,omitempty"`

	// priority orders the plan's acquires that wait for a full pool key:
	// when a membership of the key frees up, it goes to the waiter of the
	// highest priority first, then to the user holding the fewest streams
	// of the key, then to the user waiting for the fewest, then to the one
	// that came first. 0 (the default) to 9;
	// give paying plans a higher one than free plans.
	//
	// +optional
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=9
	Priority int32 `json:"priority,omitempty"`

	// enforce, false, puts the plan in shadow mode: its limit decides and
	// counts every acquire as usual but refuses none. An acquire the limit
	// would refuse is granted and takes its slot (so used stays the true
	// number of the user's live streams, even above maxConcurrentStreams);
	// the answer says "would_refuse": "stream_limit_reached", and
	// limiter_acquire_total{outcome="shadow_refused"} counts it by plan. An
	// acquire that asks to wait (wait_ms) never waits for the plan's limit.
	// Roll a new limit out with enforce: false, watch that counter fall to
	// what you can accept, then set enforce: true (the default): it applies
	// from the next acquire, without a restart.
	//
	// +optional
	// +kubebuilder:default=true
	Enforce *bool `json:"enforce,omitempty"`
}

// LimitTierStatus is what the limiter made of a LimitTier. Only the
// elected replica writes it; every replica reads acceptedSpec from it.
type LimitTierStatus struct {
	// plan is the plan this object defines: that of the generation in
	// force (see acceptedSpec) when there is one, else that of spec
	// (spec.plan, or metadata.name when spec.plan is empty).
	//
	// +optional
	Plan string `json:"plan,omitempty"`

	// observedGeneration is the metadata.generation this status describes.
	//
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// slotTTL is spec.slotTTL as the limiter reads it, written in whole
	// seconds (120s), or in milliseconds or finer when it has a fraction of
	// a second (1500ms), the same way as heartbeatInterval, so that
	// kubectl's TTL and Heartbeat columns compare at a glance.
	//
	// +optional
	SlotTTL string `json:"slotTTL,omitempty"`

	// heartbeatInterval is spec.heartbeatInterval, or its default,
	// min(20s, slotTTL/3), when spec leaves it unset; written as slotTTL
	// is.
	//
	// +optional
	HeartbeatInterval string `json:"heartbeatInterval,omitempty"`

	// maxWait is spec.maxWait, written as slotTTL is (0s: no waiting),
	// for kubectl's Wait column.
	//
	// +optional
	MaxWait string `json:"maxWait,omitempty"`

	// acceptedSpec is the last spec of this object that the limiter found
	// valid; acceptedGeneration is its metadata.generation. While spec is valid they are spec and the
	// current generation. When an update makes spec invalid, every replica
	// (including one that starts later) goes on enforcing acceptedSpec, so
	// that one bad edit does not take the plan away, and the object keeps
	// its claim on the plan against younger LimitTiers; the Ready
	// condition says which generation is in force. Absent when no
	// generation of the object was valid: it then enforces nothing.
	//
	// +optional
	AcceptedSpec *LimitTierSpec `json:"acceptedSpec,omitempty"`

	// acceptedGeneration is the metadata.generation of acceptedSpec.
	//
	// +optional
	AcceptedGeneration int64 `json:"acceptedGeneration,omitempty"`

	// conditions hold one condition, Ready: True (reason Accepted) when
	// the current generation is in force, False with reason Invalid or
	// Conflict and a message saying why, and which generation if any is
	// in force instead, when it is not; False with reason Deleting once
	// the object is being deleted, out of force.
	//
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// LimitTier is the limit of one plan: how many streams a user of the plan
// may hold at once, and how their slots expire. Every limiter replica
// watching the namespace enforces it within a second of a change.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=lt,categories=limiter
// +kubebuilder:printcolumn:name="Plan",type=string,JSONPath=`.status.plan`
// +kubebuilder:printcolumn:name="Max",type=integer,JSONPath=`.spec.maxConcurrentStreams`
// +kubebuilder:printcolumn:name="TTL",type=string,JSONPath=`.status.slotTTL`
// +kubebuilder:printcolumn:name="Heartbeat",type=string,JSONPath=`.status.heartbeatInterval`
// +kubebuilder:printcolumn:name="Failure",type=string,JSONPath=`.spec.failureMode`
// +kubebuilder:printcolumn:name="Wait",type=string,JSONPath=`.status.maxWait`
// +kubebuilder:printcolumn:name="Priority",type=integer,JSONPath=`.spec.priority`
// +kubebuilder:printcolumn:name="Enforce",type=boolean,JSONPath=`.spec.enforce`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type LimitTier struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the plan's limit.
	// +required
	Spec LimitTierSpec `json:"spec"`

	// status is what the limiter made of spec.
	// +optional
	Status LimitTierStatus `json:"status,omitempty"`
}

// LimitTierList is a list of LimitTiers.
//
// +kubebuilder:object:root=true
type LimitTierList struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []LimitTier `json:"items"`
}
