package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/joishi/limiter/pkg/config"
	"github.com/joishi/limiter/pkg/controller"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/tiers"
)

// errTierWatchStopped marks the cause fail is given when the LimitTier
// (and LimitPool) watch ends on its own: runServe then drains and returns
// it.
var errTierWatchStopped = errors.New("the LimitTier watch stopped, so the tier table no longer follows the namespace")

// tierWatch runs a LimitTier and LimitPool watch until ctx ends, as
// (*controller.Controller).Start does.
type tierWatch func(watch *controller.Controller, ctx context.Context) error

// startKubernetesTiers starts watching the LimitTiers and LimitPools of
// tiers.namespace (running the watch with watchTiers) and returns the
// tables the watch keeps in step: empty, and unsynced (so /readyz is
// false) until the first full list of both kinds is in. The watch ends
// with ctx; stop waits for it, so the Lease is given up before the process
// exits. Should the watch end with an error instead, fail is called with
// one wrapping errTierWatchStopped: serving on would enforce frozen tables
// while /readyz stays true, whereas a restart brings a fresh watch.
//
// Pools come from LimitPools only, as tiers come from LimitTiers only:
// pools.static must then be empty, since the pools it lists would be
// unknown_pool to every acquire.
func startKubernetesTiers(ctx context.Context, cfg config.Config, watchTiers tierWatch, logger *slog.Logger, fail context.CancelCauseFunc) (tables limitTables, stop func(), err error) {
	if len(cfg.Pools.Static) > 0 {
		names := make([]string, len(cfg.Pools.Static))
		for i, p := range cfg.Pools.Static {
			names[i] = strconv.Quote(p.Pool)
		}
		return limitTables{}, nil, &config.KeyError{Key: "pools.static", Got: strings.Join(names, ", "),
			Problem: "must be empty with tiers.source kubernetes: pools come from the LimitPool objects of tiers.namespace (config/samples/model-pool.yaml)"}
	}
	kube, err := kubeConfig()
	if err != nil {
		return limitTables{}, nil, fmt.Errorf("tiers.source kubernetes: %w", err)
	}
	kube.UserAgent = "limiter/" + currentBuild().Version

	// client-go and controller-runtime log through globals: route both to
	// the process log, so every line has one format.
	kubeLog := logger.With("component", "kubernetes")
	klog.SetSlogLogger(kubeLog)
	ctrllog.SetLogger(logr.FromSlogHandler(kubeLog.Handler()))

	tables = limitTables{tiers: tiers.NewTable(), pools: pools.NewTable()}
	watch, err := controller.New(kube, controller.Options{
		Namespace:     cfg.Tiers.Namespace,
		Table:         tables.tiers,
		Pools:         tables.pools,
		Logger:        logger,
		LeaseDuration: cfg.Tiers.LeaseDuration,
	})
	if err != nil {
		return limitTables{}, nil, fmt.Errorf("tiers.source kubernetes: %w", err)
	}
	watchCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := watchTiers(watch, watchCtx); err != nil {
			logger.Error("the LimitTier watch stopped; the tier and pool tables no longer follow the namespace: stopping", "err", err)
			fail(fmt.Errorf("tiers.source kubernetes: %w: %w", errTierWatchStopped, err))
		}
	})
	return tables, func() { cancel(); wg.Wait() }, nil
}

// kubeConfig finds the API server: the file(s) in KUBECONFIG when it is
// set, else the pod's service account, else ~/.kube/config.
func kubeConfig() (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules() // KUBECONFIG, else ~/.kube/config
	if os.Getenv(clientcmd.RecommendedConfigPathEnvVar) == "" {
		cfg, err := rest.InClusterConfig()
		if err == nil {
			return cfg, nil
		}
		if !errors.Is(err, rest.ErrNotInCluster) {
			return nil, fmt.Errorf("in-cluster config: %w", err)
		}
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("no Kubernetes API server: not in a pod, and KUBECONFIG (or ~/.kube/config) gives none: %w", err)
	}
	return cfg, nil
}
