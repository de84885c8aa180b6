#!/usr/bin/env bash
# What `make bench-scale` runs: BenchmarkScale (pkg/limiter), the answer to
# "what at N live streams", through the library and over HTTP.
#
# It installs Redis with apt when it is missing, starts its own standalone
# Redis and 6-node Redis Cluster (3 masters; hack/redis-cluster.sh), builds `limiter` and the benchmark binary of
# pkg/limiter, starts SCALE_REPLICAS `limiter serve` processes on each
# deployment (caller authentication on, plan "scale": TTL 120s, heartbeat
# every 20s), and runs BenchmarkScale: for every N it holds N slots and
# refreshes all of them round after round, once through Limiter.HeartbeatBatch
# and once as POST /v1/slots/heartbeats spread over the serve processes, in
# an order that alternates. The benchmark's lines go to stdout, progress to
# stderr; BENCHMARKS.md ("At scale") says what each figure is. Everything it
# started is stopped on exit, whatever happens.
#
# Environment:
#   SCALE_SLOTS        comma list of N (default 900,45000,900000)
#   SCALE_ROUNDS       refresh rounds per N and side (default 3)
#   SCALE_CONCURRENCY  batches of 1000 in flight (default 4)
#   SCALE_REPLICAS     serve processes per deployment (default 2)
#   SCALE_CLUSTER      1 (default): the cluster too; 0: standalone only
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

SCALE_SLOTS=${SCALE_SLOTS:-900,45000,900000}
SCALE_ROUNDS=${SCALE_ROUNDS:-3}
SCALE_CONCURRENCY=${SCALE_CONCURRENCY:-4}
SCALE_REPLICAS=${SCALE_REPLICAS:-2}
SCALE_CLUSTER=${SCALE_CLUSTER:-1}

step() { printf '==> [%d:%02d] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*" >&2; }
die() {
	printf 'bench-scale: error: %s\n' "$*" >&2
	exit 1
}
need() { command -v "$1" >/dev/null || die "$1 is not installed ($2)"; }
need go "Go 1.26, see README.md"
# Redis: installed with apt when missing, as `make test` does.
# shellcheck source=hack/lib/install.sh
source hack/lib/install.sh
apt_provide redis-server=redis-server redis-cli=redis-tools ||
	die "could not install Redis with apt; install redis-server redis-tools"
need redis-server "apt-get install redis-server"
need redis-cli "apt-get install redis-tools"
[[ "$SCALE_SLOTS" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || die "SCALE_SLOTS must be a comma list of positive integers, got '$SCALE_SLOTS'"
for v in SCALE_ROUNDS SCALE_CONCURRENCY SCALE_REPLICAS; do
	[[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer, got '${!v}'"
done
case "$SCALE_CLUSTER" in 0 | 1) ;; *) die "SCALE_CLUSTER must be 0 or 1, got '$SCALE_CLUSTER'" ;; esac

tmp=$(mktemp -d "${TMPDIR:-/tmp}/limiter-bench-scale.XXXXXX")
started=()
# shellcheck source=hack/bench/lib.sh
source hack/bench/lib.sh
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

start_redis "$SCALE_CLUSTER"

step "building limiter and the benchmarks of pkg/limiter"
go build -o "$tmp/limiter" ./cmd/limiter
go test -c -o "$tmp/limiter.test" ./pkg/limiter

readonly scale_prefix="bench:scale:"
scale_token=scale-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')

step "starting $SCALE_REPLICAS limiter serve per deployment"
start_scale_serves standalone "$LIMITER_TEST_REDIS" "$SCALE_REPLICAS"
export LIMITER_BENCH_SCALE_SERVE_STANDALONE=$SCALE_SERVE
if [[ -n "${LIMITER_TEST_REDIS_CLUSTER:-}" ]]; then
	start_scale_serves cluster "$LIMITER_TEST_REDIS_CLUSTER" "$SCALE_REPLICAS"
	export LIMITER_BENCH_SCALE_SERVE_CLUSTER=$SCALE_SERVE
fi
printf '    standalone: %s\n    cluster: %s\n' "$LIMITER_BENCH_SCALE_SERVE_STANDALONE" "${LIMITER_BENCH_SCALE_SERVE_CLUSTER:--}" >&2

export LIMITER_BENCH_SCALE=1 LIMITER_BENCH_SCALE_PREFIX=$scale_prefix LIMITER_BENCH_SCALE_TOKEN=$scale_token
export LIMITER_BENCH_SCALE_SLOTS=$SCALE_SLOTS LIMITER_BENCH_SCALE_ROUNDS=$SCALE_ROUNDS LIMITER_BENCH_SCALE_CONCURRENCY=$SCALE_CONCURRENCY
step "BenchmarkScale: N = $SCALE_SLOTS, $SCALE_ROUNDS rounds per side, $SCALE_CONCURRENCY batches in flight (load average $(cut -d' ' -f1 /proc/loadavg))"
(cd pkg/limiter && "$tmp/limiter.test" -test.run '^$' -test.bench '^BenchmarkScale$' -test.benchtime 1x -test.timeout 60m -test.v)
step "done (load average $(cut -d' ' -f1 /proc/loadavg))"
