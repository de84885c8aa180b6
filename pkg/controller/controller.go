// Package controller keeps a tiers.Table in step with the LimitTier objects
// of one namespace, and a pools.Table with its LimitPool objects, and
// reports on each object in its status.
//
// Every replica watches the namespace through an informer cache and
// replaces its tables on every change, so the request path reads memory
// only and never calls the API server. One replica, elected with a Lease,
// also writes each object's status: Ready=True (Accepted), or Ready=False
// with reason Invalid, Conflict or Deleting, and the last spec it found valid
// (status.acceptedSpec), which stays in force when an edit makes the spec
// invalid. The decision itself (resolve) depends on the objects alone,
// status included, so every replica enforces the same tiers and pools
// whether it leads or not, and one that restarts after the edit enforces
// them too. Both kinds run through one path (resolve, the watch, the
// status writer), over what differs between them (kind: tierKind,
// poolKind).
package controller

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/joishi/limiter/api/v1alpha1"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/tiers"
)

// What the controller needs, and nothing else: config/rbac/role.yaml is
// generated from these markers (make generate). Leases: get and update of
// its own (DefaultLeaseName) only; create cannot be limited by name, since
// the object does not exist yet when it is authorized.
//
// +kubebuilder:rbac:groups=limiter.joishi.dev,namespace=limiter,resources=limittiers,verbs=get;list;watch
// +kubebuilder:rbac:groups=limiter.joishi.dev,namespace=limiter,resources=limittiers/status,verbs=update
// +kubebuilder:rbac:groups=limiter.joishi.dev,namespace=limiter,resources=limitpools,verbs=get;list;watch
// +kubebuilder:rbac:groups=limiter.joishi.dev,namespace=limiter,resources=limitpools/status,verbs=update
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=limiter,resources=leases,verbs=create
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=limiter,resources=leases,resourceNames=limiter-tiers,verbs=get;update

// Defaults of Options.
const (
	DefaultLeaseName     = "limiter-tiers"
	DefaultLeaseDuration = 15 * time.Second
)

// Options configure a Controller. Zero values take the documented defaults.
type Options struct {
	// Namespace whose LimitTiers (and LimitPools) are watched, and where
	// the Lease lives. Required.
	Namespace string
	// Table receives the tiers in force. It must be fresh (NewTable): it
	// turns synced, and /readyz true, once the first full list of the
	// namespace is in, even when the namespace holds no LimitTier (and,
	// with Pools, only once Pools has synced too). Required.
	Table *tiers.Table
	// Pools receives the pools in force, from the namespace's LimitPools.
	// It must be fresh (pools.NewTable), and turns synced just before
	// Table. Default nil: LimitPools are not watched.
	Pools *pools.Table
	// Logger receives watch, election and status events. Default
	// slog.Default().
	Logger *slog.Logger
	// Identity names this replica in the Lease. Default: the host name
	// (the pod name in Kubernetes), '_' and 8 random hex digits, unique
	// even across restarts of one pod.
	Identity string
	// LeaseName is the coordination.k8s.io Lease electing the status
	// writer. Default DefaultLeaseName, the one name the generated Role
	// (config/rbac) lets the controller get and update.
	LeaseName string
	// LeaseDuration is how long a leader that stops renewing (a crashed
	// replica) keeps the status writer's role; the leader gives it up after
	// two thirds of it without a renewal and renews every 2/15 of it
	// (15s, 10s and 2s by default, as in client-go). Default
	// DefaultLeaseDuration.
	LeaseDuration time.Duration
}

// Controller watches one namespace's LimitTiers and LimitPools. Create it
// with New, run it with Start.
type Controller struct {
	opts    Options
	log     *slog.Logger
	mgr     manager.Manager
	watched chan struct{} // closed once the cache holds the namespace
	// kinds are the kinds served, pools before tiers (see syncTables).
	kinds []served

	// Raised on every change of an object of any kind served; drained by
	// the table and the status loops.
	tableKick, statusKick kick
}

// New returns a Controller talking to the API server of cfg. It does not
// contact the API server: Start does.
func New(cfg *rest.Config, opts Options) (*Controller, error) {
	if opts.Namespace == "" {
		return nil, errors.New("controller: Options.Namespace is required")
	}
	if opts.Table == nil {
		return nil, errors.New("controller: Options.Table is required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Identity == "" {
		opts.Identity = defaultIdentity()
	}
	if opts.LeaseName == "" {
		opts.LeaseName = DefaultLeaseName
	}
	if opts.LeaseDuration == 0 {
		opts.LeaseDuration = DefaultLeaseDuration
	}
	if opts.LeaseDuration < time.Second {
		return nil, fmt.Errorf("controller: Options.LeaseDuration must be >= 1s, got %s", opts.LeaseDuration)
	}

	c := &Controller{
		opts:       opts,
		log:        opts.Logger.With("component", "tiers", "namespace", opts.Namespace),
		watched:    make(chan struct{}),
		tableKick:  newKick(),
		statusKick: newKick(),
	}
	if opts.Pools != nil {
		c.kinds = append(c.kinds, serve(c, poolKind{}, opts.Pools))
	}
	c.kinds = append(c.kinds, serve(c, tierKind{}, opts.Table))
	// Each kind sees every object the watch delivers before the cache
	// holds it (see seenSpecs).
	byObject := make(map[client.Object]cache.ByObject, len(c.kinds))
	for _, kind := range c.kinds {
		byObject[kind.newObject()] = cache.ByObject{Transform: kind.observe}
	}

	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	mgr, err := manager.New(cfg, manager.Options{
		Scheme: scheme,
		Logger: logr.FromSlogHandler(opts.Logger.Handler()),
		// Kinds known in advance: no discovery round trips, and a missing
		// CRD shows as a failing list (logged, /readyz false) rather than
		// an error at start.
		MapperProvider: staticMapper,
		Cache: cache.Options{
			DefaultNamespaces: map[string]cache.Config{opts.Namespace: {}},
			ByObject:          byObject,
		},
		// The limiter serves its own /metrics and /readyz.
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		return nil, fmt.Errorf("controller: %w", err)
	}
	c.mgr = mgr
	if err := mgr.Add(manager.RunnableFunc(c.watch)); err != nil {
		return nil, err
	}
	if err := mgr.Add(manager.RunnableFunc(c.elect)); err != nil {
		return nil, err
	}
	return c, nil
}

// Start watches until ctx ends, then gives up the Lease if it holds it and
// returns nil. It returns an error only when the watch cannot run at all.
// An unreachable API server, a missing CRD or a denied list is not one: the
// table keeps its last contents (or stays unsynced) while the watch
// retries.
func (c *Controller) Start(ctx context.Context) error {
	c.log.Info("watching LimitTiers", "limitPools", c.opts.Pools != nil, "identity", c.opts.Identity, "lease", c.opts.LeaseName)
	return c.mgr.Start(ctx)
}

// Identity is this replica's name in the Lease.
func (c *Controller) Identity() string { return c.opts.Identity }

// staticMapper maps LimitTier and LimitPool, the kinds the controller
// reads, without asking the API server.
func staticMapper(*rest.Config, *http.Client) (meta.RESTMapper, error) {
	m := meta.NewDefaultRESTMapper([]schema.GroupVersion{v1alpha1.GroupVersion})
	for _, kind := range []string{"LimitTier", "LimitPool"} {
		lower := strings.ToLower(kind)
		plural, singular := v1alpha1.GroupVersion.WithResource(lower+"s"), v1alpha1.GroupVersion.WithResource(lower)
		// The namespaced cache also asks for the scope of the list kind.
		for _, k := range []string{kind, kind + "List"} {
			m.AddSpecific(v1alpha1.GroupVersion.WithKind(k), plural, singular, meta.RESTScopeNamespace)
		}
	}
	return m, nil
}

func defaultIdentity() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "limiter"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return host + "_" + hex.EncodeToString(b[:])
}

// kick is a coalescing wake-up: any number of raises before the loop
// looks count as one.
type kick chan struct{}

func newKick() kick { return make(kick, 1) }

func (k kick) raise() {
	select {
	case k <- struct{}{}:
	default:
	}
}
