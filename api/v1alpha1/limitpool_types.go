package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// LimitPoolSpec is one pool's caps.
//
// The API server checks each field as far as a schema can; the limiter
// checks the spec again with the rules of a pool of the config file's
// pools.static list, and reports a breach (a metadata.name unfit as a pool
// name, a value stored before a bound was tightened) as Ready=False with
// reason Invalid.
type LimitPoolSpec struct {
	// pool is the name acquires give the pool ("pools": {"model":
	// "gpt-4o"} joins key gpt-4o of pool model). When empty, the object's
	// metadata.name is the pool. Two LimitPools of one namespace naming
	// the same pool conflict: the older one (by creationTimestamp, then
	// name) with a generation in force keeps it, even while its current
	// spec is invalid (see status.acceptedSpec), and the other reports
	// Ready=False with reason Conflict.
	//
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9][a-z0-9._-]*$`
	Pool string `json:"pool,omitempty"`

	// maxConcurrentStreams is how many streams, of all users together, may
	// hold each key of the pool that keys does not list, at most 100000.
	// 0 means no stream may join such a key. When absent, keys not listed
	// are not capped, and joining them costs nothing. Lowering it does not
	// end streams already held: it applies from the next acquire.
	//
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	MaxConcurrentStreams *int32 `json:"maxConcurrentStreams,omitempty"`

	// keys are the keys with a cap of their own, key → cap, at most 1000
	// of them: gpt-4o: 500 lets 500 streams join key gpt-4o at once,
	// whatever maxConcurrentStreams says. A key is 1-128 bytes of
	// [A-Za-z0-9._:/@-] (a model name such as
	// meta-llama/Llama-3.1-70B-Instruct is one); a cap is between 0 (no
	// stream may join the key) and 100000.
	//
	// +optional
	// +kubebuilder:validation:MaxProperties=1000
	// +kubebuilder:validation:XValidation:rule="self.all(k, k.matches('^[A-Za-z0-9._:/@-]{1,128}$'))",message="each key must be 1-128 bytes of [A-Za-z0-9._:/@-]"
	// +kubebuilder:validation:XValidation:rule="self.all(k, self[k] >= 0 && self[k] <= 100000)",message="each cap must be between 0 and 100000"
	Keys map[string]int32 `json:"keys,omitempty"`

	// maxWait is how long an acquire may wait for a key of this pool to
	// free up instead of being refused with 429 at once; the request's
	// wait_ms is capped by it. A duration such as 10s, between 0s and 60s;
	// 0s (the default) means no waiting.
	//
	// +optional
	// +kubebuilder:default="0s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s') && duration(self) <= duration('60s')",message="must be between 0s and 60s"
	MaxWait *metav1.Duration `json:"maxWait,omitempty"`

	// failureMode is what an acquire joining the pool gets when the Redis
	// shard of its key does not answer in time: Open grants it, marked
	// degraded; Closed refuses it with 503 limiter_unavailable.
	//
	// +optional
	// +kubebuilder:default=Open
	FailureMode FailureMode `json:"failureMode,omitempty"`

	// enforce, false, puts the pool in shadow mode: its caps decide and
	// count every membership as usual but refuse none. A stream joining a
	// key already at its cap joins it all the same (so the key's used stays
	// the true number of its live streams, even above its cap); the answer
	// says "would_refuse": "pool_limit_reached", with would_refuse_by
	// naming the pool and the key, and
	// limiter_pool_acquire_total{outcome="shadow_refused"} counts it by
	// pool. An acquire that asks to wait (wait_ms) never waits for a key of
	// the pool. Roll a new pool out with enforce: false, watch that counter
	// fall to what you can accept, then set enforce: true (the default): it
	// applies from the next acquire, without a restart.
	//
	// +optional
	// +kubebuilder:default=true
	Enforce *bool `json:"enforce,omitempty"`
}

// LimitPoolStatus is what the limiter made of a LimitPool. Only the
// elected replica writes it; every replica reads acceptedSpec from it.
type LimitPoolStatus struct {
	// pool is the pool this object defines: that of the generation in
	// force (see acceptedSpec) when there is one, else that of spec
	// (spec.pool, or metadata.name when spec.pool is empty).
	//
	// +optional
	Pool string `json:"pool,omitempty"`

	// observedGeneration is the metadata.generation this status describes.
	//
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// keyCount is how many keys spec.keys lists, for kubectl's Keys
	// column.
	//
	// +optional
	KeyCount int32 `json:"keyCount"`

	// maxWait is spec.maxWait as the limiter reads it, written in whole
	// seconds (10s), or in milliseconds or finer when it has a fraction of
	// a second (1500ms), as a LimitTier's is (0s: no waiting).
	//
	// +optional
	MaxWait string `json:"maxWait,omitempty"`

	// acceptedSpec is the last spec of this object that the limiter found
	// valid; acceptedGeneration is its metadata.generation. While spec is
	// valid they are spec and the current generation. When an update
	// makes spec invalid, every replica (including one that starts later)
	// goes on enforcing acceptedSpec, so that one bad edit does not take
	// the pool away, and the object keeps its claim on the pool against
	// younger LimitPools; the Ready condition says which generation is in
	// force. Absent when no generation of the object was valid: it then
	// enforces nothing.
	//
	// +optional
	AcceptedSpec *LimitPoolSpec `json:"acceptedSpec,omitempty"`

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

// LimitPool is one pool: a cap on concurrent streams shared by every user
// whose streams join it (per model, per organisation), each key of the
// pool a cap of its own. Every limiter replica watching the namespace
// enforces it within a second of a change; an acquire naming a pool no
// LimitPool defines is refused with 422 unknown_pool.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=lp,categories=limiter
// +kubebuilder:printcolumn:name="Pool",type=string,JSONPath=`.status.pool`
// +kubebuilder:printcolumn:name="Default",type=integer,JSONPath=`.spec.maxConcurrentStreams`
// +kubebuilder:printcolumn:name="Keys",type=integer,JSONPath=`.status.keyCount`
// +kubebuilder:printcolumn:name="Enforce",type=boolean,JSONPath=`.spec.enforce`
// +kubebuilder:printcolumn:name="Failure",type=string,JSONPath=`.spec.failureMode`,priority=1
// +kubebuilder:printcolumn:name="Wait",type=string,JSONPath=`.status.maxWait`,priority=1
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type LimitPool struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the pool's caps.
	// +required
	Spec LimitPoolSpec `json:"spec"`

	// status is what the limiter made of spec.
	// +optional
	Status LimitPoolStatus `json:"status,omitempty"`
}

// LimitPoolList is a list of LimitPools.
//
// +kubebuilder:object:root=true
type LimitPoolList struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []LimitPool `json:"items"`
}
