package v1alpha1_test

import (
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/joishi/limiter/api/v1alpha1"
	"github.com/joishi/limiter/internal/kubetest"
)

// kube is one API server, with the generated CRD, for the whole package.
var kube kubetest.Shared

func TestMain(m *testing.M) { kube.Main(m) }

// create sends spec as an object of kind named name, untyped, so that
// values the Go types could not even hold (a malformed duration) reach the
// server.
func create(t *testing.T, c client.Client, kind, ns, name string, spec map[string]any) error {
	t.Helper()
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(),
		"kind":       kind,
		"metadata":   map[string]any{"name": name, "namespace": ns},
		"spec":       spec,
	}}
	return c.Create(t.Context(), obj)
}

// refusal is a spec the API server must refuse.
type refusal struct {
	name    string
	spec    map[string]any
	wantErr string // part of the API server's message
}

// wantRefused creates each case's spec as an object of kind, named bad-a,
// bad-b, ... in a namespace of t's own, and checks that the API server
// refuses it as Invalid, with a message containing wantErr.
func wantRefused(t *testing.T, kind string, cases []refusal) {
	env := kube.Get(t)
	ns := env.Namespace(t)
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := create(t, env.Client, kind, ns, "bad-"+string(rune('a'+i)), tc.spec)
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("create %v = %v, want Invalid containing %q", tc.spec, err, tc.wantErr)
			}
		})
	}
}
