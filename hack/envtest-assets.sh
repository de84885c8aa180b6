#!/usr/bin/env bash
# Build (once) and cache the binaries controller-runtime's envtest needs:
# etcd and kube-apiserver are compiled from Go modules (no binary downloads),
# kubectl is taken from PATH and symlinked next to them.
#
# The cache lives outside the clone:
#   ${LIMITER_CACHE:-$HOME/.cache/limiter}/envtest/k8s-<ver>-etcd-<ver>/
# The folder's path is printed as the LAST line on stdout (progress goes to
# stderr), so callers can do:
#   export KUBEBUILDER_ASSETS=$(hack/envtest-assets.sh | tail -1)
#
# With a warm cache the script returns immediately. Binaries are built into a
# temporary folder inside the target folder and renamed into place, so an
# interrupted build never leaves a half-written binary behind.
#
# With --cached it builds nothing: it prints the folder and exits 0 when the
# binaries are cached, and exits 1 otherwise.
set -euo pipefail

K8S_VERSION="1.37.2"
# The etcd Kubernetes ${K8S_VERSION} is released with (its build/dependencies.yaml).
ETCD_VERSION="3.7.0"
# Staging modules (k8s.io/api, k8s.io/apimachinery, ...) are published as v0.<minor>.<patch>.
K8S_STAGING_VERSION="v0.${K8S_VERSION#*.}"

CACHE_ROOT="${LIMITER_CACHE:-$HOME/.cache/limiter}"
DIR="${CACHE_ROOT}/envtest/k8s-${K8S_VERSION}-etcd-${ETCD_VERSION}"

log() { printf 'envtest-assets: %s\n' "$*" >&2; }

have() { [[ -f "$DIR/$1" && -x "$DIR/$1" ]]; }

all_present() { have etcd && have kube-apiserver && have kubectl; }

# Fast path: warm cache.
if all_present; then
  printf '%s\n' "$DIR"
  exit 0
fi
[[ "${1:-}" != --cached ]] || exit 1

command -v go >/dev/null 2>&1 || { log "go not found in PATH"; exit 1; }

mkdir -p "$DIR"

# Serialise concurrent cold runs (e.g. parallel CI jobs) so the work is done once.
if command -v flock >/dev/null 2>&1; then
  exec 9>"$DIR/.lock"
  log "waiting for lock $DIR/.lock"
  flock 9
fi

SCRATCH_DIRS=()
cleanup() {
  local p
  for p in "${SCRATCH_DIRS[@]+"${SCRATCH_DIRS[@]}"}"; do
    # The module cache marks files read-only; make sure rm can descend.
    chmod -R u+w -- "$p" 2>/dev/null || true
    rm -rf -- "$p"
  done
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Build environment: scratch modules outside the repo, never a workspace,
# static binaries, and no vendor mode inherited from the caller.
export GOWORK=off
export GOFLAGS="-mod=mod"
export CGO_ENABLED=0

# These set the caller's `scratch` / `tmp` variables (no command substitution:
# a subshell would lose the bookkeeping the EXIT trap relies on).
new_scratch() {
  scratch="$(mktemp -d "${TMPDIR:-/tmp}/limiter-envtest-$1.XXXXXX")"
  SCRATCH_DIRS+=("$scratch")
  (cd "$scratch" && go mod init scratch >/dev/null 2>&1)
}

# build_servers builds etcd and kube-apiserver with one `go build` in one
# scratch module: kube-apiserver's dependencies (gRPC, protobuf,
# OpenTelemetry, etcd's client, ...) are most of etcd's, so each is compiled
# once, not once per server at two versions. etcd is the release
# Kubernetes ${K8S_VERSION} names (its build/dependencies.yaml), and adds
# no module version kube-apiserver's own build would not pick: MVS keeps
# kube-apiserver's dependencies as its release pins them.
build_servers() {
  local scratch tmp start gomod mods m ldflags build_date pkg
  start=$SECONDS
  log "building kube-apiserver v${K8S_VERSION} (from k8s.io/kubernetes) and etcd v${ETCD_VERSION} (from go.etcd.io/etcd/server/v3)"
  new_scratch servers
  tmp="$DIR/.servers.tmp.$$"
  SCRATCH_DIRS+=("$tmp")
  rm -rf -- "$tmp"
  mkdir -p -- "$tmp"
  (
    cd "$scratch"
    # k8s.io/kubernetes replaces its staging modules with ./staging/src/...,
    # which only works inside its own repo. Read that replace list from the
    # released go.mod and point each module at its published version instead.
    gomod="$(go mod download -json "k8s.io/kubernetes@v${K8S_VERSION}" |
      sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
    [[ -n "$gomod" && -f "$gomod" ]] || { log "could not locate go.mod of k8s.io/kubernetes@v${K8S_VERSION}"; exit 1; }
    mods="$(awk '
      /^replace[[:space:]]*\(/ { inblock = 1; next }
      inblock && /^\)/ { inblock = 0; next }
      inblock && $2 == "=>" && $3 ~ /^\.\/staging\// { print $1; next }
      /^replace[[:space:]]/ && $3 == "=>" && $4 ~ /^\.\/staging\// { print $2 }
    ' "$gomod")"
    [[ -n "$mods" ]] || { log "no staging replaces found in $gomod"; exit 1; }
    log "replacing $(wc -w <<<"$mods") staging modules with ${K8S_STAGING_VERSION}"
    for m in $mods; do
      go mod edit "-replace=${m}=${m}@${K8S_STAGING_VERSION}"
    done
    go get "k8s.io/kubernetes/cmd/kube-apiserver@v${K8S_VERSION}" "go.etcd.io/etcd/server/v3@v${ETCD_VERSION}" >&2

    # The version stamps the upstream builds set (Kubernetes'
    # hack/lib/version.sh, etcd's scripts/build-binary.sh); each -X reaches
    # the binaries that link its package.
    build_date="$(date -u +'%Y-%m-%dT%H:%M:%SZ')"
    ldflags="-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=v${ETCD_VERSION}"
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ldflags+=" -X ${pkg}.gitVersion=v${K8S_VERSION}"
      ldflags+=" -X ${pkg}.gitMajor=${K8S_VERSION%%.*}"
      ldflags+=" -X ${pkg}.gitMinor=$(cut -d. -f2 <<<"$K8S_VERSION")"
      ldflags+=" -X ${pkg}.gitTreeState=clean"
      ldflags+=" -X ${pkg}.buildDate=${build_date}"
    done
    # Into a folder, each binary is named after its package: "server" for
    # go.etcd.io/etcd/server/v3. Without the compiler's optimisations and
    # inlining (-N -l): the build is the largest part of a cold `make test`,
    # and these servers answer a test's few requests, not a cluster's load.
    go build -trimpath -gcflags="all=-N -l" -ldflags="$ldflags" -o "$tmp/" \
      k8s.io/kubernetes/cmd/kube-apiserver go.etcd.io/etcd/server/v3 >&2
  )
  "$tmp/server" --version >&2
  "$tmp/kube-apiserver" --version >&2
  mv -f -- "$tmp/server" "$DIR/etcd"
  mv -f -- "$tmp/kube-apiserver" "$DIR/kube-apiserver"
  log "kube-apiserver and etcd done in $((SECONDS - start))s"
}

link_kubectl() {
  local k
  k="$(command -v kubectl || true)"
  [[ -n "$k" ]] || { log "kubectl not found in PATH (envtest expects it in $DIR)"; exit 1; }
  [[ "$k" == /* ]] || k="$PWD/$k"
  ln -sfn -- "$k" "$DIR/.kubectl.tmp.$$"
  mv -fT -- "$DIR/.kubectl.tmp.$$" "$DIR/kubectl"
  log "kubectl -> $k"
}

{ have etcd && have kube-apiserver; } || build_servers
have kubectl || link_kubectl

all_present || { log "assets incomplete in $DIR"; exit 1; }
log "assets ready"
printf '%s\n' "$DIR"
