// Package kubetest runs a real kube-apiserver and etcd (controller-runtime's
// envtest, binaries from KUBEBUILDER_ASSETS) with the LimitTier CRD of
// config/crd installed, for tests of the Kubernetes tier source.
package kubetest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/joishi/limiter/api/v1alpha1"
	"github.com/joishi/limiter/internal/testenv"
)

// Env is a running API server with the LimitTier CRD installed.
type Env struct {
	// Config authenticates as an administrator (system:masters).
	Config *rest.Config
	// Client is an administrator's client knowing the built-in kinds and
	// LimitTier. It reads from the API server, not from a cache.
	Client client.Client
	// Kubeconfig is a kubeconfig file for the administrator, for
	// processes (KUBECONFIG=...) and kubectl.
	Kubeconfig string

	env *envtest.Environment
	dir string
}

// Start starts an API server for the test, stopped at its cleanup. Without
// KUBEBUILDER_ASSETS the test fails under `make test` and skips otherwise.
func Start(t testing.TB) *Env {
	t.Helper()
	e, err := start(testenv.KubebuilderAssets(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.Stop(); err != nil {
			t.Errorf("stopping envtest: %v", err)
		}
	})
	return e
}

// Shared is one API server for a whole test binary: tests call Get, which
// starts it on first use, and the package's TestMain is Main.
type Shared struct {
	mu  sync.Mutex
	env *Env
	err error
}

// Get returns the shared API server, starting it if no test has. It fails
// (or skips, outside `make test`) t when it cannot.
func (s *Shared) Get(t testing.TB) *Env {
	t.Helper()
	assets := testenv.KubebuilderAssets(t)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.env == nil && s.err == nil {
		s.env, s.err = start(assets)
	}
	if s.err != nil {
		t.Fatal(s.err)
	}
	return s.env
}

// Main runs the test binary's tests, then stops the shared API server: a
// package's TestMain is func TestMain(m *testing.M) { kube.Main(m) }.
// (The test binary exits with the status of m.Run.)
func (s *Shared) Main(m *testing.M) {
	defer s.Stop()
	m.Run()
}

// Stop stops the shared API server, if it was started.
func (s *Shared) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.env != nil {
		if err := s.env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping envtest:", err)
		}
		s.env = nil
	}
}

// Scheme knows the built-in kinds and LimitTier.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = v1alpha1.AddToScheme(s)
	return s
}

func start(assets string) (*Env, error) {
	root, err := repoRoot()
	if err != nil {
		return nil, err
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory:    assets,
		CRDDirectoryPaths:        []string{filepath.Join(root, "config", "crd", "bases")},
		ErrorIfCRDPathMissing:    true,
		ControlPlaneStartTimeout: 2 * time.Minute, // two cores, and maybe a busy machine
		ControlPlaneStopTimeout:  30 * time.Second,
	}
	cfg, err := env.Start()
	if err != nil {
		_ = env.Stop()
		return nil, fmt.Errorf("starting envtest (KUBEBUILDER_ASSETS=%s): %w", assets, err)
	}
	e := &Env{Config: cfg, env: env}
	fail := func(err error) (*Env, error) {
		_ = e.Stop()
		return nil, err
	}
	if e.Client, err = client.New(cfg, client.Options{Scheme: Scheme()}); err != nil {
		return fail(err)
	}
	if e.dir, err = os.MkdirTemp("", "limiter-kubetest-"); err != nil {
		return fail(err)
	}
	e.Kubeconfig = filepath.Join(e.dir, "kubeconfig")
	if err := os.WriteFile(e.Kubeconfig, env.KubeConfig, 0o600); err != nil {
		return fail(err)
	}
	return e, nil
}

// Stop stops the API server and etcd and removes their files.
func (e *Env) Stop() error {
	err := e.env.Stop()
	if e.dir != "" {
		_ = os.RemoveAll(e.dir)
	}
	return err
}

// Namespace creates a namespace for t alone, named after it. (envtest runs
// no namespace controller, so it is not deleted afterwards; nothing in it
// outlives the API server.)
func (e *Env) Namespace(t testing.TB) string {
	t.Helper()
	name := strings.ToLower(t.Name())
	name = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, name)
	if len(name) > 40 {
		name = name[:40]
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: strings.Trim(name, "-") + "-"}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.Client.Create(ctx, ns); err != nil {
		t.Fatalf("creating a namespace: %v", err)
	}
	return ns.Name
}

func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above %s", dir)
		}
		dir = parent
	}
}
