#!/usr/bin/env bash
# What `make bench` runs: every benchmark of the limiter, each as a ratio
# against a reference measured on the same servers in the same run, in one
# table (BENCHMARKS.md says what each row measures).
#
# It installs Redis, node and npm with apt when they are missing, starts its
# own standalone Redis and 6-node Redis Cluster (3 masters;
# hack/redis-cluster.sh), builds what it runs (the Go benchmark binaries of
# pkg/limiter, pkg/telemetry and pkg/proxy, `limiter`, hack/bench/trivial and
# hack/bench/load), installs redis-semaphore and ioredis at the versions
# hack/bench/semaphore/package-lock.json pins into a cache outside the
# clone, starts `limiter serve` and the trivial handler on the standalone
# Redis, and then runs rounds. In each round both sides of every ratio run
# back to back, in an order that reverses from one round to the next:
#
#   per deployment  redis-benchmark EVALSHA of the acquire script
#                   (unpipelined and -P 16), the library (BenchmarkAcquire,
#                   BenchmarkAcquireRelease, BenchmarkHeartbeatBatch); the
#                   library's pairs and raw rueidis' taking turns
#                   (BenchmarkAcquireReleaseVsRaw); a waiter's grant
#                   after a release against the release's round trip
#                   (BenchmarkWakeUp); acquire+release joining two pools
#                   against joining none (at full load, paced at half of
#                   two pools' pairs/s beside the same pairs made by the
#                   scripts alone on the limiter's client, and at a light
#                   2,000 pairs/s, beside the scripts alone again),
#                   and a heartbeat round's Redis
#                   CPU the same ways, in turns (BenchmarkPoolsAcquireRelease,
#                   BenchmarkPoolsHeartbeat), with the Redis servers' and
#                   the machine's CPU per pair (/proc/stat); the pairs of
#                   one hot pool key against redis-benchmark EVALSHA of the
#                   acquire script on that key (BenchmarkPoolKeyHot), and
#                   the most the key's master, and the machine's cores with
#                   only the servers on them, would allow (their CPU per pair)
#   standalone      the library's Acquire+Release, redis-semaphore
#                   (hack/bench/semaphore/semaphore.js); Redis' cost of a
#                   heartbeat refresh against a plain ZADD+PEXPIREAT
#                   (BenchmarkHeartbeatRefresh); allocations per HTTP acquire
#                   (BenchmarkHandlerAllocs); batched heartbeats over HTTP
#                   against the library's (BenchmarkHeartbeatBatchHTTP, both
#                   sides inside); serve, with a tokens file, and the trivial handler
#                   at full load, then both paced at half of serve's
#                   pairs/s of that round, for latency (hack/bench/load,
#                   the two taking turns in 6 slices of each run);
#                   SSE streams through `limiter proxy`'s handler, without
#                   a pool and with one keyed by the body's model, against
#                   the same streams through a plain httputil.ReverseProxy
#                   and straight from the upstream (BenchmarkProxySSE, every
#                   way inside); the same streams as a new user runs them,
#                   each side a process of its own (hack/bench/load -sse,
#                   32 clients): `limiter proxy` as the README starts it,
#                   without a pool and with one keyed by the body's model,
#                   against a plain reverse proxy (hack/bench/sse), and
#                   against their bound, the plain reverse proxy running
#                   the limiter's scripts around each stream (-scripts,
#                   on the user's key, and on a pool key too), all in
#                   turns of 6 slices; 1,000 waiting acquires against
#                   1,000 clients polling once a second, in Redis commands
#                   and CPU (BenchmarkWaitCost); the same for 1,000
#                   acquires waiting in the queues of 10 full pool keys
#                   (BenchmarkPoolWaitCost); the Redis time of the acquire
#                   script as a pool key runs it, whole, its call alone and
#                   each part (BenchmarkAcquireParts); Redis's CPU per pair
#                   joining none against joining two pools, as sent, with
#                   the pools' work inside the user's call, with it
#                   stripped to the slot, with each membership a lean
#                   script of its own, the same folded into fewer calls,
#                   and with each the least any capped, expiring member
#                   is (BenchmarkPoolsBound); the
#                   same ways' acquire p50, at full load and paced as
#                   BenchmarkPoolsAcquireRelease paced its own in the round
#                   and at its light 2,000 pairs/s (BenchmarkPoolsLatencyBound)
#
# The table, on stdout, gives each ratio's median over the rounds with the
# lowest and highest; progress and the raw benchmark lines go to stderr.
# Everything it started is stopped on exit, whatever happens.
#
# Environment:
#   BENCH_ROUNDS    rounds (default 5)
#   BENCH_CLUSTER   1 (default): also measure the cluster (redis-benchmark,
#                   library, raw rueidis); 0: standalone only
#   BENCH_N         redis-benchmark requests unpipelined (default 60000;
#                   -P 16 runs twice as many)
#   BENCH_TIME      go test -benchtime of each Go benchmark (default 1s)
#   BENCH_DURATION  seconds measured by each HTTP, latency and
#                   redis-semaphore run, after 0.5 s of warm-up (default 3)
#   BENCH_SCALE_SLOTS   live slots of the heartbeat round at scale, on the
#                   cluster, once per run (default 900000; 0: skip it)
#   BENCH_SCALE_ROUNDS  its rounds per way, library and HTTP (default 3)
#   BENCH_NPM_DIR   where redis-semaphore and ioredis are installed (default
#                   ${XDG_CACHE_HOME:-~/.cache}/limiter/npm)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

BENCH_ROUNDS=${BENCH_ROUNDS:-5}
BENCH_CLUSTER=${BENCH_CLUSTER:-1}
BENCH_N=${BENCH_N:-60000}
BENCH_TIME=${BENCH_TIME:-1s}
BENCH_DURATION=${BENCH_DURATION:-3}
BENCH_SCALE_SLOTS=${BENCH_SCALE_SLOTS:-900000}
BENCH_SCALE_ROUNDS=${BENCH_SCALE_ROUNDS:-3}
BENCH_NPM_DIR=${BENCH_NPM_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/limiter/npm}
readonly CLIENTS=50 PROXY_CLIENTS=32 USERS=1000000 PIPELINE=16 WARMUP_MS=500 ALLOC_REQUESTS=2000 PARTS_CALLS=50000 BOUND_PAIRS=20000 LATENCY_PAIRS=10000 HTTP_SLICES=6 RAW_TURNS=3

step() { printf '==> [%d:%02d] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*" >&2; }
die() {
	printf 'bench: error: %s\n' "$*" >&2
	exit 1
}

need() { # need TOOL HINT
	command -v "$1" >/dev/null || die "$1 is not installed ($2)"
}
need go "Go 1.26, see README.md"
# Redis and its tools, and node and npm (they run the redis-semaphore
# reference): installed with apt when missing, as `make test` does.
# shellcheck source=hack/lib/install.sh
source hack/lib/install.sh
apt_provide redis-server=redis-server redis-cli=redis-tools redis-benchmark=redis-tools node=nodejs npm=npm ||
	die "could not install Redis, node or npm with apt; install redis-server redis-tools nodejs npm"
need redis-server "apt-get install redis-server"
need redis-cli "apt-get install redis-tools"
need redis-benchmark "apt-get install redis-tools"
need node "apt-get install nodejs; it runs the redis-semaphore reference"
need npm "apt-get install npm; it installs redis-semaphore and ioredis"
for tool in awk sed sort paste sha1sum cmp; do need "$tool" "coreutils, sed, gawk or mawk"; done
[[ "$BENCH_N" =~ ^[1-9][0-9]*$ ]] || die "BENCH_N must be a positive integer, got '$BENCH_N'"
[[ "$BENCH_ROUNDS" =~ ^[1-9][0-9]*$ ]] || die "BENCH_ROUNDS must be a positive integer, got '$BENCH_ROUNDS'"
if ! [[ "$BENCH_DURATION" =~ ^[0-9]*\.?[0-9]+$ ]] || ! awk -v d="$BENCH_DURATION" 'BEGIN { exit !(d > 0) }'; then
	die "BENCH_DURATION must be a positive number of seconds, got '$BENCH_DURATION'"
fi
[[ "$BENCH_TIME" =~ ^([0-9]*\.?[0-9]+(ns|us|ms|s|m)|[1-9][0-9]*x)$ ]] ||
	die "BENCH_TIME must be a go test -benchtime (1s, 500ms, 100x), got '$BENCH_TIME'"
case "$BENCH_CLUSTER" in 0 | 1) ;; *) die "BENCH_CLUSTER must be 0 or 1, got '$BENCH_CLUSTER'" ;; esac
[[ "$BENCH_SCALE_SLOTS" =~ ^(0|[1-9][0-9]*)$ ]] || die "BENCH_SCALE_SLOTS must be 0 or a positive integer, got '$BENCH_SCALE_SLOTS'"
[[ "$BENCH_SCALE_ROUNDS" =~ ^[1-9][0-9]*$ ]] || die "BENCH_SCALE_ROUNDS must be a positive integer, got '$BENCH_SCALE_ROUNDS'"
DURATION_MS=$(awk -v d="$BENCH_DURATION" 'BEGIN { printf "%d", d * 1000 }')
readonly DURATION_MS

tmp=$(mktemp -d "${TMPDIR:-/tmp}/limiter-bench.XXXXXX")
started=() # pids of the servers this script started in the background
# shellcheck source=hack/bench/lib.sh
source hack/bench/lib.sh
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

start_time=$SECONDS
started_at=$(date -u '+%Y-%m-%d %H:%M UTC')
start_redis "$BENCH_CLUSTER"
find_masters
load_acquire_script

step "building the benchmarks, limiter, hack/bench/trivial, hack/bench/load and hack/bench/sse"
go test -c -o "$tmp/limiter.test" ./pkg/limiter
go test -c -o "$tmp/telemetry.test" ./pkg/telemetry
go test -c -o "$tmp/proxy.test" ./pkg/proxy
go test -c -o "$tmp/lua.test" ./pkg/lua
go build -o "$tmp/limiter" ./cmd/limiter
go build -o "$tmp/trivial" ./hack/bench/trivial
go build -o "$tmp/load" ./hack/bench/load
go build -o "$tmp/sse" ./hack/bench/sse
install_semaphore
start_http_servers
start_proxy_servers

load_start=$(cut -d' ' -f1 /proc/loadavg)
# Other work on the machine comes and goes, so both sides of each ratio run
# back to back, in an order reversed every other round, and every round
# gives its own ratios; the table shows their median.
for ((round = 1; round <= BENCH_ROUNDS; round++)); do
	step "round $round of $BENCH_ROUNDS"
	for d in "${deployments[@]}"; do
		in_order "$round" "rb_bench $round $d" "go_bench $round A $d limiter BenchmarkAcquire BenchmarkAcquireRelease BenchmarkHeartbeatBatch"
		go_bench "$round" V "$d" limiter BenchmarkAcquireReleaseVsRaw
		go_bench "$round" W "$d" limiter BenchmarkWakeUp
		go_bench "$round" O "$d" limiter BenchmarkPoolsAcquireRelease BenchmarkPoolsHeartbeat
		in_order "$round" "rb_pool_bench $round $d" "go_bench $round K $d limiter BenchmarkPoolKeyHot"
	done
	go_bench "$round" C "" limiter BenchmarkWaitCost
	go_bench "$round" Q "" limiter BenchmarkPoolWaitCost
	go_bench "$round" L "" lua BenchmarkAcquireParts
	go_bench "$round" L "" lua BenchmarkPoolsBound
	# The same ways' latency, paced as this round's BenchmarkPoolsAcquireRelease
	# paced its own on the standalone Redis.
	LIMITER_BENCH_PACED_RATE=${GO[$round/O/BenchmarkPoolsAcquireRelease/standalone/paced-pairs/s]} \
		go_bench "$round" L "" lua BenchmarkPoolsLatencyBound
	in_order "$round" "go_bench $round S standalone limiter BenchmarkAcquireRelease" "semaphore_bench $round"
	go_bench "$round" R standalone limiter BenchmarkHeartbeatRefresh
	go_bench "$round" M "" telemetry BenchmarkHandlerAllocs
	go_bench "$round" B "" telemetry BenchmarkHeartbeatBatchHTTP
	go_bench "$round" P "" proxy BenchmarkProxySSE
	proxy_bench "$round"
	http_bench "$round" max
	rate=$(awk -v p="${H[$round/max/serve/pairs/s]}" 'BEGIN { printf "%.0f", p / 2 }')
	http_bench "$round" lat "$rate"
done
# Once per run: it holds BENCH_SCALE_SLOTS slots, which take a while to load.
readonly scale_prefix="bench:scale:"
scale_token=scale-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
if ((BENCH_CLUSTER && BENCH_SCALE_SLOTS > 0)); then
	scale_bench
fi
load_end=$(cut -d' ' -f1 /proc/loadavg)
elapsed=$((SECONDS - start_time))
step "done in $((elapsed / 60))m$((elapsed % 60))s"

# shellcheck source=hack/bench/report.sh
source hack/bench/report.sh
report
