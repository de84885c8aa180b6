#!/usr/bin/env bash
# Install (once) the pinned helm the chart tests use and print its path as the
# LAST line on stdout (progress goes to stderr), so callers can do:
#
#   export LIMITER_HELM=$(bash hack/helm.sh | tail -1)
#
# helm is built from its Go module (no binary downloads) into a cache outside
# the clone: ${LIMITER_CACHE:-$HOME/.cache/limiter}/bin/helm-<version>/helm.
# With a warm cache the script returns immediately.
#
# With --cached it installs nothing: it prints the path and exits 0 when
# helm is cached, and exits 1 otherwise.
set -euo pipefail
# shellcheck source=hack/lib/install.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/install.sh"

HELM_VERSION="v3.22.0"
# The Kubernetes version helm assumes without a cluster (helm template, lint):
# upstream's Makefile stamps it from the client-go helm is built with (v0.37
# for v3.22.0 -> 1.37); unstamped, helm would claim 1.20.
HELM_KUBE_MAJOR="1"
HELM_KUBE_MINOR="37"

cache="${LIMITER_CACHE:-$HOME/.cache/limiter}"
bin_dir="$cache/bin/helm-$HELM_VERSION"
helm="$bin_dir/helm"

build() {
	echo "helm.sh: installing helm $HELM_VERSION into $bin_dir (takes a few minutes)" >&2
	# The ldflags stamp what upstream's release build stamps.
	local ldflags="-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" pkg
	for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
		ldflags+=" -X $pkg.k8sVersionMajor=$HELM_KUBE_MAJOR -X $pkg.k8sVersionMinor=$HELM_KUBE_MINOR"
	done
	go_install "$bin_dir" "$ldflags" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
}

answer_cached "$helm" "${1:-}"
install_once "$bin_dir" "$helm" go build

"$helm" version --short >&2
printf '%s\n' "$helm"
