#!/usr/bin/env bash
# What `make bench` runs: the limiter's benchmarks as ratios against the
# physical limit measured in the same run (BENCHMARKS.md).
#
# It starts its own Redis (hack/redis-cluster.sh; stopped again on exit),
# loads the acquire script, measures redis-benchmark running EVALSHA of that
# script (50 clients, random users, unpipelined and -P 16) and, next to it,
# BenchmarkAcquire, BenchmarkAcquireRelease and BenchmarkHeartbeatBatch
# (pkg/limiter/bench_test.go, built once with go test -c) against the same
# servers, in a few rounds, and prints the ratios. Progress goes to stderr,
# the table to stdout.
#
# Environment:
#   BENCH_CLUSTER  1 (default): also start a 6-node Redis Cluster and measure
#                  it the same way (redis-benchmark --cluster); 0: standalone only
#   BENCH_N        redis-benchmark requests unpipelined (default 60000;
#                  -P 16 runs twice as many)
#   BENCH_TIME     go test -benchtime per sub-benchmark (default 1s)
#   BENCH_ROUNDS   rounds (default 3); each round runs both sides per deployment,
#                  back to back; the table shows the median of the rounds' ratios
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

BENCH_CLUSTER=${BENCH_CLUSTER:-1}
BENCH_N=${BENCH_N:-60000}
BENCH_TIME=${BENCH_TIME:-1s}
BENCH_ROUNDS=${BENCH_ROUNDS:-3}
readonly CLIENTS=50 USERS=1000000 PIPELINE=16

step() { printf '==> %s\n' "$*" >&2; }
die() {
	printf 'bench: error: %s\n' "$*" >&2
	exit 1
}

for tool in redis-server redis-cli redis-benchmark go awk; do
	command -v "$tool" >/dev/null || die "$tool is not installed (redis-benchmark is in redis-tools)"
done
[[ "$BENCH_N" =~ ^[1-9][0-9]*$ ]] || die "BENCH_N must be a positive integer, got '$BENCH_N'"
[[ "$BENCH_ROUNDS" =~ ^[1-9][0-9]*$ ]] || die "BENCH_ROUNDS must be a positive integer, got '$BENCH_ROUNDS'"
case "$BENCH_CLUSTER" in 0 | 1) ;; *) die "BENCH_CLUSTER must be 0 or 1, got '$BENCH_CLUSTER'" ;; esac

tmp=$(mktemp -d "${TMPDIR:-/tmp}/limiter-bench.XXXXXX")
cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	bash hack/redis-cluster.sh stop "$tmp/servers" || true
	rm -rf "$tmp"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Never benchmark against servers from the caller's environment.
unset LIMITER_TEST_REDIS LIMITER_TEST_REDIS_CLUSTER
what=standalone
((BENCH_CLUSTER)) && what=all
step "starting Redis ($what)"
bash hack/redis-cluster.sh start "$tmp/servers" "$what" >/dev/null
# shellcheck disable=SC1091
source "$tmp/servers/env"

port_of() { echo "${1##*:}"; }
rcli() { # rcli PORT ARGS...
	local port=$1
	shift
	redis-cli -h 127.0.0.1 -p "$port" "$@" | tr -d '\r'
}

# The ports of each deployment, and of its masters (where EVALSHA runs).
declare -A PORTS=() MASTERS=()
PORTS[standalone]=$(port_of "$LIMITER_TEST_REDIS")
MASTERS[standalone]=${PORTS[standalone]}
if ((BENCH_CLUSTER)); then
	PORTS[cluster]=""
	MASTERS[cluster]=""
	IFS=, read -ra addrs <<<"$LIMITER_TEST_REDIS_CLUSTER"
	for addr in "${addrs[@]}"; do
		port=$(port_of "$addr")
		PORTS[cluster]+="$port "
		if [[ "$(rcli "$port" role | head -n 1)" == master ]]; then
			MASTERS[cluster]+="$port "
		fi
	done
	[[ $(wc -w <<<"${MASTERS[cluster]}") -eq 3 ]] || die "expected 3 cluster masters, found: ${MASTERS[cluster]}"
	deployments=(standalone cluster)
else
	deployments=(standalone)
fi

step "loading pkg/lua/acquire.lua"
sha=""
for d in "${deployments[@]}"; do
	for port in ${PORTS[$d]}; do
		# -x: the file's exact bytes (a "$(cat ...)" argument would lose the
		# trailing newline and so hash differently from the embedded source).
		got=$(rcli "$port" -x SCRIPT LOAD <pkg/lua/acquire.lua)
		[[ "$got" =~ ^[0-9a-f]{40}$ ]] || die "SCRIPT LOAD on port $port answered: $got"
		[[ -z "$sha" || "$got" == "$sha" ]] || die "SCRIPT LOAD answered $got on port $port, $sha elsewhere"
		sha=$got
	done
done
# The limiter runs the script by the same SHA1 (rueidis hashes the embedded source).
[[ "$(sha1sum pkg/lua/acquire.lua | cut -d' ' -f1)" == "$sha" ]] || die "SCRIPT LOAD answered $sha, not the SHA1 of pkg/lua/acquire.lua"

flush() { # flush DEPLOYMENT: empty the masters and reset their command stats
	local port
	for port in ${MASTERS[$1]}; do
		[[ "$(rcli "$port" FLUSHALL)" == OK ]] || die "FLUSHALL on port $port failed"
		rcli "$port" CONFIG RESETSTAT >/dev/null
	done
}

# evalsha_stats DEPLOYMENT: prints "calls failed" of EVALSHA summed over the
# masters since the last flush.
evalsha_stats() {
	local port
	for port in ${MASTERS[$1]}; do
		rcli "$port" INFO commandstats
	done | awk -F'[:,=]' '
		$1 == "cmdstat_evalsha" {
			for (i = 2; i < NF; i += 2) {
				if ($i == "calls") calls += $(i + 1)
				if ($i == "failed_calls" || $i == "rejected_calls") failed += $(i + 1)
			}
		}
		END { printf "%d %d\n", calls, failed }'
}

declare -A RPS=() # RPS[<round>/<deployment>/p<pipeline>]: redis-benchmark rps
declare -A GO=()  # GO[<round>/<Benchmark>/<deployment>/<unit>]: go test figures

# redis_bench ROUND DEPLOYMENT PIPELINE REQUESTS: runs redis-benchmark on the
# deployment's first master and records its rps.
redis_bench() {
	local round=$1 d=$2 pipeline=$3 n=$4 key='joishi:streams:{u__rand_int__}' extra=() first calls failed rps
	if [[ "$d" == cluster ]]; then
		# In cluster mode redis-benchmark replaces "{tag}" with a hash tag of
		# the node each client talks to; the user number follows it.
		key='joishi:streams:{tag}:u__rand_int__'
		extra=(--cluster)
	fi
	read -r first _ <<<"${MASTERS[$d]}"
	flush "$d"
	step "redis-benchmark $d: EVALSHA acquire, -c $CLIENTS -n $n -P $pipeline -r $USERS"
	# -r: every __rand_int__ becomes its own random 12-digit number below
	# $USERS on every request, so users (and stream ids) vary and almost
	# every acquire finds its user below the limit of 3. The records key
	# draws its own number too (the same work; in cluster mode "{tag}"
	# still puts both keys in the client's node's slot).
	redis-benchmark -h 127.0.0.1 -p "$first" "${extra[@]}" -c "$CLIENTS" -n "$n" -P "$pipeline" -r "$USERS" --csv \
		EVALSHA "$sha" 2 "$key" "$key:meta" 's__rand_int__' 3 120000 >"$tmp/rb.csv" 2>"$tmp/rb.err" ||
		die "redis-benchmark failed: $(cat "$tmp/rb.err" "$tmp/rb.csv")"
	rps=$(awk -F'","' 'NF > 1 && $2 ~ /^[0-9.]+$/ { v = $2 } END { print v }' "$tmp/rb.csv")
	[[ -n "$rps" ]] || die "no rps in redis-benchmark output: $(cat "$tmp/rb.csv" "$tmp/rb.err")"
	read -r calls failed <<<"$(evalsha_stats "$d")"
	((calls >= n && failed == 0)) || die "EVALSHA on $d: $calls calls ($failed failed), want >= $n and none failed: $(cat "$tmp/rb.err")"
	RPS[$round/$d/p$pipeline]=$rps
	printf '    %s rps\n' "$rps" >&2
}

((BENCH_CLUSTER)) || unset LIMITER_TEST_REDIS_CLUSTER

step "building the benchmark binary (go test -c ./pkg/limiter)"
go test -c -o "$tmp/limiter.test" ./pkg/limiter

# go_bench ROUND DEPLOYMENT: runs the limiter benchmarks on the deployment
# (the binary go test -bench would run) and records their ops/s, slots/s and
# granted/op.
go_bench() {
	local round=$1 d=$2 name unit value key b
	flush "$d"
	step "go test -bench on $d (benchtime $BENCH_TIME)"
	# LIMITER_TEST_REQUIRE: a missing server fails the benchmark instead of skipping it.
	(cd pkg/limiter && LIMITER_TEST_REQUIRE=1 "$tmp/limiter.test" -test.run '^$' \
		-test.bench "^(BenchmarkAcquire|BenchmarkAcquireRelease|BenchmarkHeartbeatBatch)\$/^$d\$" \
		-test.benchtime "$BENCH_TIME") >"$tmp/go.txt" 2>&1 ||
		die "go test -bench failed: $(cat "$tmp/go.txt")"
	grep '^Benchmark' "$tmp/go.txt" >&2 || true
	while read -r name unit value; do
		GO[$round/$name/$unit]=$value
	done < <(awk '/^Benchmark[^ ]*-[0-9]+[ \t]/ {
		name = $1; sub(/-[0-9]+$/, "", name)
		for (i = 3; i <= NF; i++) if ($i == "ops/s" || $i == "slots/s" || $i == "granted/op") print name, $i, $(i - 1)
	}' "$tmp/go.txt")
	for key in BenchmarkAcquire/$d/ops/s BenchmarkAcquireRelease/$d/ops/s BenchmarkHeartbeatBatch/$d/slots/s \
		BenchmarkAcquire/$d/granted/op BenchmarkAcquireRelease/$d/granted/op; do
		[[ "${GO[$round/$key]:-}" =~ ^[0-9.e+]+$ ]] || die "go test printed no $key: $(cat "$tmp/go.txt")"
	done
	for b in BenchmarkAcquire BenchmarkAcquireRelease; do
		awk -v g="${GO[$round/$b/$d/granted/op]}" 'BEGIN { exit !(g >= 0.99) }' ||
			die "$b/$d granted only ${GO[$round/$b/$d/granted/op]} of its acquires"
	done
}

rb_bench() { # rb_bench ROUND DEPLOYMENT: redis-benchmark unpipelined and -P 16
	redis_bench "$1" "$2" 1 "$BENCH_N"
	redis_bench "$1" "$2" "$PIPELINE" $((2 * BENCH_N))
}

load_start=$(cut -d' ' -f1 /proc/loadavg)
# Other work on the machine comes and goes, so the two sides run in short
# adjacent phases per deployment, in alternating order, several rounds; each
# round gives its own ratios and the table shows their median.
for ((round = 1; round <= BENCH_ROUNDS; round++)); do
	step "round $round of $BENCH_ROUNDS"
	for d in "${deployments[@]}"; do
		if ((round % 2)); then
			rb_bench "$round" "$d"
			go_bench "$round" "$d"
		else
			go_bench "$round" "$d"
			rb_bench "$round" "$d"
		fi
	done
done
load_end=$(cut -d' ' -f1 /proc/loadavg)

# median: the median of the numbers on stdin, one per line.
median() { sort -g | awk '{ v[NR] = $1 } END { printf "%.6g", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
# ratios GO-SUFFIX RPS-SUFFIX: the per-round ratios, one per line.
ratios() {
	local round
	for ((round = 1; round <= BENCH_ROUNDS; round++)); do
		awk -v a="${GO[$round/$1]}" -v b="${RPS[$round/$2]}" 'BEGIN { printf "%.4f\n", a / b }'
	done
}
# per_round ARRAY SUFFIX: ARRAY[<round>/SUFFIX] of every round, one per line.
per_round() {
	local -n arr=$1
	local round
	for ((round = 1; round <= BENCH_ROUNDS; round++)); do
		echo "${arr[$round/$2]}"
	done
}

redis_version=$(redis-server --version | sed -n 's/.* v=\([^ ]*\) .*/\1/p')
cores=$(nproc)
{
	echo
	echo "limiter vs redis-benchmark EVALSHA of pkg/lua/acquire.lua, same servers, same run"
	echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $cores cores shared by client and servers, Redis $redis_version, $(go env GOVERSION)"
	echo "1-minute load average $load_start at the start, $load_end at the end (this run itself keeps about 2 busy)"
	echo "redis-benchmark -c $CLIENTS -r $USERS -n $BENCH_N (-P $PIPELINE: $((2 * BENCH_N))); limiter ~$CLIENTS goroutines, benchtime $BENCH_TIME"
	echo "median of $BENCH_ROUNDS rounds' ratios [lowest-highest]"
	echo
	printf '%-46s' "ratio"
	for d in "${deployments[@]}"; do printf '%20s' "$d"; done
	echo
	row() { # row LABEL BENCHMARK UNIT RB-PIPELINE
		local d all
		printf '%-46s' "$1"
		for d in "${deployments[@]}"; do
			all=$(ratios "$2/$d/$3" "$d/p$4")
			printf '%20s' "$(median <<<"$all" | xargs printf '%.2f') [$(sort -g <<<"$all" | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%.2f-%.2f", lo, hi }')]"
		done
		echo
	}
	row "Acquire ops/s / EVALSHA rps" BenchmarkAcquire ops/s 1
	row "Acquire ops/s / EVALSHA rps -P $PIPELINE" BenchmarkAcquire ops/s "$PIPELINE"
	row "Acquire+Release ops/s / EVALSHA rps" BenchmarkAcquireRelease ops/s 1
	row "HeartbeatBatch slots/s / EVALSHA rps -P $PIPELINE" BenchmarkHeartbeatBatch slots/s "$PIPELINE"
	echo
	echo "medians of the $BENCH_ROUNDS rounds (this machine, this run only)"
	printf '%-46s' ""
	for d in "${deployments[@]}"; do printf '%20s' "$d"; done
	echo
	raw() { # raw LABEL ARRAY PREFIX SUFFIX: ARRAY[<round>/PREFIX<deployment>SUFFIX]
		local d
		printf '%-46s' "$1"
		for d in "${deployments[@]}"; do printf '%20.0f' "$(per_round "$2" "$3$d$4" | median)"; done
		echo
	}
	raw "redis-benchmark EVALSHA rps" RPS "" /p1
	raw "redis-benchmark EVALSHA rps -P $PIPELINE" RPS "" "/p$PIPELINE"
	raw "limiter Acquire ops/s" GO BenchmarkAcquire/ /ops/s
	raw "limiter Acquire+Release ops/s (2 calls each)" GO BenchmarkAcquireRelease/ /ops/s
	raw "limiter HeartbeatBatch slots/s (1000 per op)" GO BenchmarkHeartbeatBatch/ /slots/s
}
