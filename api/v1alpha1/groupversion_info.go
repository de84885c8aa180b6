// Package v1alpha1 is the limiter.joishi.dev/v1alpha1 API: the LimitTier
// kind, from which every limiter replica reads the limit of each plan, and
// the LimitPool kind, from which it reads the caps of each pool.
//
// +kubebuilder:object:generate=true
// +groupName=limiter.joishi.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the group and version of this package's kinds.
var GroupVersion = schema.GroupVersion{Group: "limiter.joishi.dev", Version: "v1alpha1"}

var schemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

// AddToScheme registers LimitTier, LimitPool and their lists with a scheme.
var AddToScheme = schemeBuilder.AddToScheme

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &LimitTier{}, &LimitTierList{}, &LimitPool{}, &LimitPoolList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
