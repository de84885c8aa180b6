# shellcheck shell=bash
# The Kubernetes binaries the tests run that build from Go modules sharing
# most of their code: envtest's kube-apiserver and etcd
# (hack/envtest-assets.sh) and helm (hack/helm.sh). Sourced by those
# scripts, not run.
#
# They build in ONE scratch module with ONE `go build`, whichever script
# asks first, so that the code they share (k8s.io/api, apimachinery,
# client-go, apiserver, gRPC, protobuf, OpenTelemetry: about 80 % of helm's
# source) is compiled once. The module requires all three whatever is
# missing, so a binary is built against the same versions whichever script
# builds it:
#   - kube-apiserver as Kubernetes ${KUBE_VERSION} releases it, its staging
#     modules (k8s.io/api, ...) at their published v0.<minor>.<patch>;
#   - etcd ${KUBE_ETCD_VERSION}, the release Kubernetes ${KUBE_VERSION}
#     names (its build/dependencies.yaml): it adds no module version;
#   - helm ${KUBE_HELM_VERSION}, on those staging modules (v0.37.2 for its
#     own v0.37.0). Its requirements raise a few of kube-apiserver's
#     dependencies by a patch or minor release (golang.org/x/crypto,
#     x/text, go.yaml.in/yaml/v3, Masterminds/semver).
# They are built without the compiler's optimisations and inlining (-N -l):
# the build is the largest part of a cold `make test`, and they answer a
# test's few requests, not a cluster's load.
#
#   kube_build
#       Build whichever of the three is not in its cache folder (below),
#       holding $KUBE_CACHE/.kube-build.lock, so that side-by-side runs
#       build once. Needs go in PATH.

# shellcheck source=hack/lib/install.sh
source "$(dirname "${BASH_SOURCE[0]}")/install.sh"

KUBE_VERSION="1.37.2"
KUBE_ETCD_VERSION="3.7.0"
KUBE_HELM_VERSION="v3.22.0"

KUBE_CACHE="${LIMITER_CACHE:-$HOME/.cache/limiter}"
# envtest's folder (KUBEBUILDER_ASSETS): etcd, kube-apiserver, kubectl.
KUBE_ENVTEST_DIR="$KUBE_CACHE/envtest/k8s-${KUBE_VERSION}-etcd-${KUBE_ETCD_VERSION}"
KUBE_HELM="$KUBE_CACHE/bin/helm-${KUBE_HELM_VERSION}/helm"

kube_build() {
	local log=${0##*/} start=$SECONDS pkgs=() names=() dests=() i
	command -v go >/dev/null 2>&1 || {
		echo "$log: go not found in PATH" >&2
		exit 1
	}
	mkdir -p "$KUBE_CACHE"
	hold_lock "$KUBE_CACHE/.kube-build.lock"
	# Each: its package, the name `go build -o DIR/` gives it, its place.
	kube_missing k8s.io/kubernetes/cmd/kube-apiserver kube-apiserver "$KUBE_ENVTEST_DIR/kube-apiserver"
	kube_missing go.etcd.io/etcd/server/v3 server "$KUBE_ENVTEST_DIR/etcd"
	kube_missing helm.sh/helm/v3/cmd/helm helm "$KUBE_HELM"
	if ((${#pkgs[@]} == 0)); then
		return 0 # built by a run that held the lock before
	fi
	echo "$log: building ${names[*]} (kube-apiserver v$KUBE_VERSION, etcd v$KUBE_ETCD_VERSION, helm $KUBE_HELM_VERSION: one module, one go build)" >&2

	# The scratch module, and the binaries until each is renamed into
	# place: an interrupted build leaves no half-written binary behind.
	local scratch out
	scratch=$(mktemp -d "${TMPDIR:-/tmp}/limiter-kube-build.XXXXXX")
	out="$KUBE_CACHE/.kube-build.out.$$"
	kube_tmp=("$scratch" "$out")
	trap 'kube_scratch_remove "${kube_tmp[@]}"' EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM
	rm -rf -- "$out"
	mkdir -p -- "$out"
	(cd "$scratch" && kube_module && kube_go_build "$out" "${pkgs[@]}") || {
		echo "$log: building ${names[*]} failed" >&2
		exit 1
	}
	for i in "${!pkgs[@]}"; do
		if [[ ${names[i]} == helm ]]; then
			"$out/helm" version --short >&2
		else
			"$out/${names[i]}" --version >&2
		fi
		mkdir -p -- "$(dirname -- "${dests[i]}")"
		mv -f -- "$out/${names[i]}" "${dests[i]}"
	done
	echo "$log: built ${names[*]} in $((SECONDS - start))s" >&2
}

# kube_missing PKG NAME DEST adds PKG to kube_build's list when DEST is
# not executable.
kube_missing() {
	[[ -x "$3" ]] && return 0
	pkgs+=("$1")
	names+=("$2")
	dests+=("$3")
}

# kube_module makes the current folder the module the binaries build in.
# Scratch modules outside the clone, never a workspace, static binaries.
kube_module() {
	local gomod mods m staging="v0.${KUBE_VERSION#*.}"
	export GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0
	go mod init scratch >/dev/null 2>&1
	# k8s.io/kubernetes replaces its staging modules with ./staging/src/...,
	# which only works inside its own repo. Read that replace list from the
	# released go.mod and point each module at its published version instead.
	gomod=$(go mod download -json "k8s.io/kubernetes@v$KUBE_VERSION" |
		sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
	[[ -n "$gomod" && -f "$gomod" ]] || {
		echo "could not locate go.mod of k8s.io/kubernetes@v$KUBE_VERSION" >&2
		return 1
	}
	mods=$(awk '
		/^replace[[:space:]]*\(/ { inblock = 1; next }
		inblock && /^\)/ { inblock = 0; next }
		inblock && $2 == "=>" && $3 ~ /^\.\/staging\// { print $1; next }
		/^replace[[:space:]]/ && $3 == "=>" && $4 ~ /^\.\/staging\// { print $2 }
	' "$gomod")
	[[ -n "$mods" ]] || {
		echo "no staging replaces found in $gomod" >&2
		return 1
	}
	for m in $mods; do
		go mod edit "-replace=$m=$m@$staging"
	done
	go get "k8s.io/kubernetes/cmd/kube-apiserver@v$KUBE_VERSION" \
		"go.etcd.io/etcd/server/v3@v$KUBE_ETCD_VERSION" \
		"helm.sh/helm/v3/cmd/helm@$KUBE_HELM_VERSION" >&2
}

# kube_go_build DIR PKG... builds the packages into DIR, each binary named
# after its package ("server" for go.etcd.io/etcd/server/v3).
kube_go_build() {
	local dir=$1 ldflags pkg build_date major=${KUBE_VERSION%%.*} minor
	shift
	minor=$(cut -d. -f2 <<<"$KUBE_VERSION")
	# The version stamps the upstream builds set (Kubernetes'
	# hack/lib/version.sh, etcd's scripts/build-binary.sh, helm's
	# Makefile); each -X reaches the binaries that link its package.
	build_date=$(date -u +'%Y-%m-%dT%H:%M:%SZ')
	ldflags="-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=v$KUBE_ETCD_VERSION"
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ldflags+=" -X $pkg.gitVersion=v$KUBE_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
		ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$build_date"
	done
	# The Kubernetes version helm assumes without a cluster (helm
	# template, lint): that of the client-go it is built with; unstamped,
	# helm would claim 1.20.
	ldflags+=" -X helm.sh/helm/v3/internal/version.version=$KUBE_HELM_VERSION"
	for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
		ldflags+=" -X $pkg.k8sVersionMajor=$major -X $pkg.k8sVersionMinor=$minor"
	done
	go build -trimpath -gcflags="all=-N -l" -ldflags="$ldflags" -o "$dir/" "$@" >&2
}

# kube_scratch_remove DIR... removes folders the module cache may have
# left read-only.
kube_scratch_remove() {
	chmod -R u+w -- "$@" 2>/dev/null || true
	rm -rf -- "$@"
}
