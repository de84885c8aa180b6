#!/usr/bin/env bash
# Install (once) the pinned helm the chart tests use and print its path as the
# LAST line on stdout (progress goes to stderr), so callers can do:
#
#   export LIMITER_HELM=$(bash hack/helm.sh | tail -1)
#
# helm is built from its Go module (no binary downloads), with envtest's
# kube-apiserver and etcd in one go build (hack/lib/kube.sh), into a cache
# outside the clone: ${LIMITER_CACHE:-$HOME/.cache/limiter}/bin/helm-<version>/helm.
# With a warm cache the script returns immediately.
#
# With --cached it installs nothing: it prints the path and exits 0 when
# helm is cached, and exits 1 otherwise.
set -euo pipefail
# shellcheck source=hack/lib/install.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/install.sh"
# shellcheck source=hack/lib/kube.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/kube.sh"

helm=$KUBE_HELM

answer_cached "$helm" "${1:-}"
# With kube-apiserver and etcd, in one go build (hack/lib/kube.sh).
[[ -x "$helm" ]] || kube_build

"$helm" version --short >&2
printf '%s\n' "$helm"
