#!/usr/bin/env bash
# What `make test` runs: installs the servers the tests need, starts a shared
# standalone Redis and Redis Cluster (stopped again on exit, whatever happens),
# checks generated code and formatting, vets, and runs every test with
# LIMITER_TEST_REQUIRE=1 so a test whose server is missing fails instead of
# skipping.
#
# Environment:
#   TEST_ARGS  extra `go test` flags, e.g. TEST_ARGS='-run TestAcquire -v'
#   TEST_PKGS  packages to test (default ./...)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# shellcheck source=hack/lib/install.sh
source hack/lib/install.sh

step() { printf '==> [%d:%02d] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }

# npm_ci DIR SRC PKG WHAT: installs the packages SRC/package-lock.json pins
# into DIR (npm ci), in a cache outside the clone: again only when the lock
# file changes, or when DIR lacks PKG.
npm_ci() {
	local dir=$1 src=$2 pkg=$3 what=$4 lock
	lock=$(sha1sum "$src/package-lock.json" | cut -d' ' -f1)
	if [[ "$(cat "$dir/.installed" 2>/dev/null)" != "$lock" || ! -f "$dir/node_modules/$pkg/package.json" ]]; then
		step "installing $what ($src) into $dir"
		mkdir -p "$dir"
		rm -f "$dir/.installed"
		cp "$src/package.json" "$src/package-lock.json" "$dir/"
		npm ci --prefix "$dir" --no-audit --no-fund --loglevel=error
		echo "$lock" >"$dir/.installed"
	fi
}

# node and npm, before the tools: Redocly's CLI is an npm package, and the
# OpenAI SDK and TypeScript client tests run on node.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
	step "installing nodejs npm"
	apt_install nodejs npm
fi

# The Debian packages the tests use and the tools do not: Redis; Chromium,
# for the admin page's browser tests; python3 with venv, setuptools and
# wheel, for the Python client's suite and its offline install test
# (e2e/clients_test.go). They install in the background while the tools
# build (apt waits on the network, the builds on the CPU).
packages=()
if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
	packages+=(redis-server redis-tools)
fi
if [[ ! -x /usr/bin/chromium ]]; then
	packages+=(chromium)
fi
if ! command -v python3 >/dev/null || ! /usr/bin/python3 -c 'import ensurepip, setuptools, wheel' 2>/dev/null; then
	packages+=(python3 python3-venv python3-setuptools python3-wheel)
fi
packages_pid=
packages_log=$(mktemp "${TMPDIR:-/tmp}/limiter-apt.XXXXXX")
if ((${#packages[@]})); then
	step "installing ${packages[*]} (apt), beside the tools"
	apt_install "${packages[@]}" >"$packages_log" 2>&1 &
	packages_pid=$!
fi
# wait_packages waits for those packages, and stops the run when they
# failed to install.
wait_packages() {
	if [[ -n "$packages_pid" ]] && ! wait "$packages_pid"; then
		echo "installing ${packages[*]} failed; apt's output:" >&2
		sed 's/^/    /' "$packages_log" >&2
		rm -f "$packages_log"
		exit 1
	fi
	rm -f "$packages_log"
	[[ -z "$packages_pid" ]] || step "installed ${packages[*]}"
}

# The servers and analysers the tests run, each installed once into
# ${LIMITER_CACHE:-~/.cache/limiter} by its own script: envtest's
# kube-apiserver and etcd; helm and kube-score on the rendered chart;
# Redocly's OpenAPI lint on api/openapi.yaml; Prometheus's rule tester,
# promtool, on the shipped alert rules. Cold, the builds are most of a run,
# so they run side by side (hack/lib/install.sh: install_tools), and
# kube-apiserver, etcd and helm, which share most of their code, build in
# one go build (hack/lib/kube.sh).
install_tools \
	"KUBEBUILDER_ASSETS|hack/envtest-assets.sh|building kube-apiserver and etcd for the envtest tests (api/v1alpha1, pkg/controller, config/envoy, charts/limiter/test, e2e)" \
	"LIMITER_HELM|hack/helm.sh|building helm for the chart tests (charts/limiter/test), in kube-apiserver's go build" \
	"LIMITER_KUBE_SCORE|hack/kube-score.sh|building kube-score for the chart tests (charts/limiter/test)" \
	"LIMITER_REDOCLY|hack/redocly.sh|installing Redocly's CLI (npm) for the OpenAPI lint (internal/apitest)" \
	"LIMITER_PROMTOOL|hack/promtool.sh|installing promtool, Debian's or else built from source, for the alert rule tests (e2e)"

wait_packages

# The official OpenAI Node SDK the proxy's e2e tests stream through, as
# e2e/openai/package-lock.json pins it.
npm_dir=${LIMITER_E2E_NPM_DIR:-${LIMITER_CACHE:-$HOME/.cache/limiter}/npm-e2e-openai}
npm_ci "$npm_dir" e2e/openai openai "the OpenAI Node SDK"
export LIMITER_TEST_NODE_MODULES=$npm_dir/node_modules

# The TypeScript compiler and Node's type definitions the TypeScript client
# is checked and built with (e2e/clients_test.go), as
# clients/typescript/package-lock.json pins them; without the package's
# scripts, since its prepare (the build) needs the package's own files.
ts_dir=${LIMITER_TS_NPM_DIR:-${LIMITER_CACHE:-$HOME/.cache/limiter}/npm-clients-typescript}
npm_config_ignore_scripts=true npm_ci "$ts_dir" clients/typescript typescript "the TypeScript compiler"
export LIMITER_TEST_TS_NODE_MODULES=$ts_dir/node_modules
# npm's cache for the test that installs the client from its folder into a
# new project (e2e/clients_test.go): filled on its first run, then used
# without asking the registry again.
export LIMITER_TEST_NPM_CACHE=${LIMITER_NPM_CACHE:-${LIMITER_CACHE:-$HOME/.cache/limiter}/npm-cache}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/limiter-test.XXXXXX")
# Private clusters that testenv.StartCluster starts live here too, so a test
# binary that dies without its cleanups leaves no server behind.
export LIMITER_TEST_TMPDIR="$tmp/private"
# Everything else the tests put in temp dirs (envtest's etcd and
# kube-apiserver data, the limiter binaries they build, browser profiles)
# goes here too: the cleanup kills what still runs from it and removes it.
mkdir -p "$tmp/tmp"
export TMPDIR="$tmp/tmp"

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	step "stopping test servers"
	local dir
	for dir in "$tmp"/private/*/ "$tmp/servers"; do
		[[ -d "$dir" ]] && bash hack/redis-cluster.sh stop "$dir"
	done
	# A test binary killed by its timeout leaves its children (envtest's
	# etcd and kube-apiserver, serve processes) running; their command lines
	# name files under $tmp.
	pkill -KILL -f -- "$tmp/" 2>/dev/null || true
	rm -rf "$tmp"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

step "starting Redis and a 6-node Redis Cluster"
bash hack/redis-cluster.sh start "$tmp/servers" all
# shellcheck disable=SC1091
source "$tmp/servers/env"

if [[ -f hack/verify-generated.sh ]]; then
	step "checking generated code (hack/verify-generated.sh)"
	bash hack/verify-generated.sh
fi

step "gofmt"
# Tracked files plus new ones not yet added (but not ignored ones).
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	mapfile -d '' listed < <(git ls-files -z --cached --others --exclude-standard -- '*.go')
else
	mapfile -d '' listed < <(find . -name '*.go' -not -path './.git/*' -print0)
fi
go_files=()
for f in "${listed[@]}"; do
	[[ -f "$f" ]] && go_files+=("$f") # skip deletions not yet staged
done
if ((${#go_files[@]})); then
	unformatted=$(gofmt -l "${go_files[@]}")
	if [[ -n "$unformatted" ]]; then
		echo "these files need gofmt (run make fmt):" >&2
		sed 's/^/  /' <<<"$unformatted" >&2
		exit 1
	fi
fi

# go vet runs every check, so go test vets nothing again (-vet=off). Its
# build is not -race: the serve binary the tests build (servetest) is not
# either, and reuses what vet compiled.
step "go vet"
go vet ./...

step "go test"
# The tests that time every decision of a burst against P4's bound
# (DESIGN §10: the per-call timeout + 100ms, Redis black-holed, down or
# redialled) run after the rest, alone: beside e2e's servers, browsers
# and API servers the two cores are so busy that a goroutine can wait
# past the bound for a core, whatever the limiter does.
timed='^(TestBlackHoleAtConcurrency|TestRedisDownAtConcurrency|TestRedisStopped|TestRedisBlackHoled|TestClusterSeedsUnreachable)'
if [[ -z "${TEST_ARGS:-}${TEST_PKGS:-}" ]]; then
	LIMITER_TEST_REQUIRE=1 go test -race -vet=off -count=1 -timeout 25m -skip "$timed" ./...
	step "go test, the outage bounds alone"
	LIMITER_TEST_REQUIRE=1 go test -race -vet=off -count=1 -timeout 5m -run "$timed" ./pkg/limiter
else
	# shellcheck disable=SC2086
	LIMITER_TEST_REQUIRE=1 go test -race -vet=off -count=1 -timeout 25m ${TEST_ARGS:-} ${TEST_PKGS:-./...}
fi

if [[ -z "${TEST_ARGS:-}${TEST_PKGS:-}" ]]; then
	# make bench's Go benchmarks, once each, so that a change that breaks
	# one (a script's answer read at an old length) fails here rather
	# than in the next make bench. The same build as above: nothing to
	# compile again.
	# With -bench, go test runs its packages' binaries one at a time:
	# pkg/limiter's, the longest, runs beside the other three's.
	step "benchmarks, once each"
	bench_once() {
		LIMITER_TEST_REQUIRE=1 go test -race -vet=off -count=1 -run '^$' -bench . -benchtime 1x "$@"
	}
	bench_once ./pkg/limiter >"$tmp/bench-once-limiter.txt" 2>&1 &
	limiter_bench=$!
	bench_ok=true
	bench_once ./pkg/lua ./pkg/proxy ./pkg/telemetry >"$tmp/bench-once.txt" 2>&1 || bench_ok=false
	wait "$limiter_bench" || bench_ok=false
	if [[ $bench_ok != true ]]; then
		cat "$tmp/bench-once-limiter.txt" "$tmp/bench-once.txt" >&2
		exit 1
	fi
fi
