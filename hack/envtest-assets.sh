#!/usr/bin/env bash
# Build (once) and cache the binaries controller-runtime's envtest needs:
# etcd and kube-apiserver are compiled from Go modules (no binary downloads),
# with helm, in one go build (hack/lib/kube.sh); kubectl is taken from PATH
# and symlinked next to them.
#
# The cache lives outside the clone:
#   ${LIMITER_CACHE:-$HOME/.cache/limiter}/envtest/k8s-<ver>-etcd-<ver>/
# The folder's path is printed as the LAST line on stdout (progress goes to
# stderr), so callers can do:
#   export KUBEBUILDER_ASSETS=$(hack/envtest-assets.sh | tail -1)
#
# With a warm cache the script returns immediately. With --cached it builds
# nothing: it prints the folder and exits 0 when the binaries are cached,
# and exits 1 otherwise.
set -euo pipefail
# shellcheck source=hack/lib/kube.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/kube.sh"

DIR=$KUBE_ENVTEST_DIR

have() { [[ -f "$DIR/$1" && -x "$DIR/$1" ]]; }

all_present() { have etcd && have kube-apiserver && have kubectl; }

if all_present; then
	printf '%s\n' "$DIR"
	exit 0
fi
[[ "${1:-}" != --cached ]] || exit 1

link_kubectl() {
	local k
	k="$(command -v kubectl || true)"
	[[ -n "$k" ]] || {
		echo "envtest-assets.sh: kubectl not found in PATH (envtest expects it in $DIR)" >&2
		exit 1
	}
	[[ "$k" == /* ]] || k="$PWD/$k"
	mkdir -p "$DIR"
	ln -sfn -- "$k" "$DIR/.kubectl.tmp.$$"
	mv -fT -- "$DIR/.kubectl.tmp.$$" "$DIR/kubectl"
	echo "envtest-assets.sh: kubectl -> $k" >&2
}

{ have etcd && have kube-apiserver; } || kube_build
have kubectl || link_kubectl

all_present || {
	echo "envtest-assets.sh: assets incomplete in $DIR" >&2
	exit 1
}
printf '%s\n' "$DIR"
