# shellcheck shell=bash disable=SC2034,SC2153,SC2154
# (SC2034, SC2153, SC2154: the arrays are read, and tmp and the constants set,
# by hack/bench.sh and hack/bench/report.sh.)
# The measurements of hack/bench.sh, which sources this file. Each one
# records its figures in an associative array keyed by round:
#
#   RPS[<round>/<deployment>/p<pipeline>]    redis-benchmark rps
#   GO[<round>/<tag>/<benchmark>/<unit>]     a go test -bench figure; the tag
#                                            tells apart the runs of one
#                                            benchmark in a round
#   SEM[<round>/<field>]                     hack/bench/semaphore/semaphore.js
#   H[<round>/<max|lat>/<target>/<field>]    hack/bench/load against serve or
#                                            trivial
#   H[<round>/sse/<target>/<field>]          hack/bench/load -sse against plain,
#                                            proxy or pooled (start_proxy_servers)
#   SCALE[<unit>]                            BenchmarkScale, once per run
#
# It uses tmp, started, CLIENTS, USERS, BENCH_* and the LIMITER_TEST_REDIS*
# variables of hack/bench.sh (hack/bench-scale.sh uses only cleanup and
# start_scale_serves).

# cleanup is the EXIT trap of the scripts that source this file: it stops
# every process of started (SIGTERM, SIGKILL those left after 3 s) and the
# Redis servers of $tmp/servers, removes $tmp, and exits with the script's
# status.
cleanup() {
	local rc=$? pid i
	trap - EXIT INT TERM
	for pid in "${started[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
	for ((i = 0; i < 30; i++)); do
		any_alive "${started[@]}" || break
		sleep 0.1
	done
	for pid in "${started[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
	bash hack/redis-cluster.sh stop "$tmp/servers" || true
	rm -rf "$tmp"
	exit "$rc"
}

any_alive() { # any_alive PID...: true while one of them runs
	local pid
	for pid in "$@"; do kill -0 "$pid" 2>/dev/null && return 0; done
	return 1
}

# start_redis CLUSTER: starts a standalone Redis in $tmp/servers, and the
# 6-node cluster too when CLUSTER is 1, and sets LIMITER_TEST_REDIS (and
# LIMITER_TEST_REDIS_CLUSTER) to them. Never the servers of the caller's
# environment: the benchmarks empty the servers they are given.
start_redis() {
	local what=standalone
	unset LIMITER_TEST_REDIS LIMITER_TEST_REDIS_CLUSTER
	(($1)) && what=all
	step "starting Redis ($what)"
	bash hack/redis-cluster.sh start "$tmp/servers" "$what" >/dev/null
	# shellcheck disable=SC1091
	source "$tmp/servers/env"
	(($1)) || unset LIMITER_TEST_REDIS_CLUSTER
}

declare -A PORTS=() MASTERS=() RPS=() GO=() SEM=() H=() URL=() PID=() SCALE=() MACHINE=()
deployments=(standalone)

port_of() { echo "${1##*:}"; }
rcli() { # rcli PORT ARGS...
	local port=$1
	shift
	redis-cli -h 127.0.0.1 -p "$port" "$@" | tr -d '\r'
}

# find_masters fills PORTS and MASTERS (where EVALSHA runs) per deployment.
find_masters() {
	local addrs addr port
	PORTS[standalone]=$(port_of "$LIMITER_TEST_REDIS")
	MASTERS[standalone]=${PORTS[standalone]}
	[[ -n "${LIMITER_TEST_REDIS_CLUSTER:-}" ]] || return 0
	PORTS[cluster]="" MASTERS[cluster]=""
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
}

# load_acquire_script loads the acquire script as the limiter runs it
# (pkg/lua/acquire.lua after the pieces it shares with the other scripts,
# printed by hack/bench/script) on every server and sets sha.
load_acquire_script() {
	local d port got
	step "loading the acquire script (hack/bench/script acquire)"
	go run ./hack/bench/script acquire >"$tmp/acquire.lua"
	sha=""
	for d in "${deployments[@]}"; do
		for port in ${PORTS[$d]}; do
			# -x: the file's exact bytes (a "$(cat ...)" argument would lose a
			# trailing newline and so hash differently from the embedded source).
			got=$(rcli "$port" -x SCRIPT LOAD <"$tmp/acquire.lua")
			[[ "$got" =~ ^[0-9a-f]{40}$ ]] || die "SCRIPT LOAD on port $port answered: $got"
			[[ -z "$sha" || "$got" == "$sha" ]] || die "SCRIPT LOAD answered $got on port $port, $sha elsewhere"
			sha=$got
		done
	done
	# The limiter runs the script by the same SHA1 (rueidis hashes the source).
	[[ "$(sha1sum "$tmp/acquire.lua" | cut -d' ' -f1)" == "$sha" ]] || die "SCRIPT LOAD answered $sha, not the SHA1 of the acquire script"
}

flush() { # flush DEPLOYMENT: empty the masters and reset their command stats
	local port
	for port in ${MASTERS[$1]}; do
		[[ "$(rcli "$port" FLUSHALL)" == OK ]] || die "FLUSHALL on port $port failed"
		rcli "$port" CONFIG RESETSTAT >/dev/null
	done
}

# in_order ROUND COMMAND...: runs the commands (each a string of words) in
# the order given in odd rounds, in reverse in even ones.
in_order() {
	local round=$1 i
	shift
	local cmds=("$@")
	if ((round % 2)); then
		for ((i = 0; i < ${#cmds[@]}; i++)); do ${cmds[i]}; done
	else
		for ((i = ${#cmds[@]} - 1; i >= 0; i--)); do ${cmds[i]}; done
	fi
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

# redis_bench ROUND DEPLOYMENT PIPELINE REQUESTS: runs redis-benchmark on the
# deployment's first master and records its rps.
redis_bench() {
	local round=$1 d=$2 pipeline=$3 n=$4 key='joishi:streams:{u__rand_int__}' extra=() first
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
	# every acquire finds its user below the limit of 3. The other keys
	# draw their own numbers too (the same work: none of them exists; in
	# cluster mode "{tag}" still puts them all in the client's node's slot).
	rb_evalsha "$round/$d/p$pipeline" "$d" "$first" "$pipeline" "$n" "${extra[@]}" \
		EVALSHA "$sha" 6 "$key" "$key:meta" "$key:override" "$key:q" "$key:q:expiry" "$key:q:rec" 's__rand_int__' 3 120000 ''
}

# rb_evalsha RPS-KEY DEPLOYMENT PORT PIPELINE REQUESTS [--cluster] COMMAND...:
# runs redis-benchmark's COMMAND against PORT, checks that every call
# succeeded and records its rps in RPS[RPS-KEY].
rb_evalsha() {
	local at=$1 d=$2 port=$3 pipeline=$4 n=$5 rps calls failed
	shift 5
	redis-benchmark -h 127.0.0.1 -p "$port" -c "$CLIENTS" -n "$n" -P "$pipeline" -r "$USERS" --csv "$@" \
		>"$tmp/rb.csv" 2>"$tmp/rb.err" || die "redis-benchmark failed: $(cat "$tmp/rb.err" "$tmp/rb.csv")"
	rps=$(awk -F'","' 'NF > 1 && $2 ~ /^[0-9.]+$/ { v = $2 } END { print v }' "$tmp/rb.csv")
	[[ -n "$rps" ]] || die "no rps in redis-benchmark output: $(cat "$tmp/rb.csv" "$tmp/rb.err")"
	read -r calls failed <<<"$(evalsha_stats "$d")"
	((calls >= n && failed == 0)) || die "EVALSHA on $d: $calls calls ($failed failed), want >= $n and none failed: $(cat "$tmp/rb.err")"
	RPS[$at]=$rps
	printf '    %s rps\n' "$rps" >&2
}

# machine_times: the machine's processors' busy and all time since boot,
# in /proc/stat's 1/100 s (as benchenv.ReadMachine counts them: stolen
# time in neither).
machine_times() {
	awk '$1 == "cpu" { busy = $2 + $3 + $4 + $7 + $8; print busy, busy + $5 + $6; exit }' /proc/stat
}

# rb_pool_bench ROUND DEPLOYMENT: redis-benchmark EVALSHA of the acquire
# script on one pool key, as the limiter runs it for a pool's membership
# (member "<stream> <user>", the holder's user in the record), on the
# master that holds the key; every call adds a member (the cap is the
# most a pool key may have). RPS[<round>/<deployment>/pool]; the machine's
# CPU per request in µs, MACHINE[<round>/<deployment>/pool/cpu-us], and the
# share of its processors' time that was busy, MACHINE[.../busy].
rb_pool_bench() {
	local round=$1 d=$2 key='bench:pool:{hot=hot}' port moved
	read -r port _ <<<"${MASTERS[$d]}"
	if [[ "$d" == cluster ]]; then
		moved=$(rcli "$port" TYPE "$key")
		[[ "$moved" == MOVED* ]] && port=${moved##*:}
	fi
	flush "$d"
	step "redis-benchmark $d: EVALSHA acquire on one pool key, -c $CLIENTS -n $BENCH_N"
	local busy0 all0 busy1 all1
	read -r busy0 all0 <<<"$(machine_times)"
	rb_evalsha "$round/$d/pool" "$d" "$port" 1 "$BENCH_N" \
		EVALSHA "$sha" 6 "$key" "$key:meta" "$key:override" "$key:q" "$key:q:expiry" "$key:q:rec" \
		's__rand_int__ u__rand_int__' 100000 120000 ';user=13:u__rand_int__'
	read -r busy1 all1 <<<"$(machine_times)"
	MACHINE[$round/$d/pool/cpu-us]=$(awk -v b=$((busy1 - busy0)) -v n="$BENCH_N" 'BEGIN { printf "%.6g", b * 1e4 / n }')
	MACHINE[$round/$d/pool/busy]=$(awk -v b=$((busy1 - busy0)) -v a=$((all1 - all0)) 'BEGIN { printf "%.6g", a ? b / a : 0 }')
}

rb_bench() { # rb_bench ROUND DEPLOYMENT: redis-benchmark unpipelined and -P 16
	redis_bench "$1" "$2" 1 "$BENCH_N"
	redis_bench "$1" "$2" "$PIPELINE" $((2 * BENCH_N))
}

# times_benchtime BENCHTIME N prints the -benchtime N times as long (a
# duration, or a count of calls).
times_benchtime() {
	local t=$1 n=$2
	if [[ "$t" =~ ^([1-9][0-9]*)x$ ]]; then
		echo "$((BASH_REMATCH[1] * n))x"
	else
		[[ "$t" =~ ^([0-9]*\.?[0-9]+)(ns|us|ms|s|m)$ ]] || die "times_benchtime: '$t' is not a -benchtime"
		awk -v v="${BASH_REMATCH[1]}" -v n="$n" -v u="${BASH_REMATCH[2]}" 'BEGIN { printf "%.10g%s\n", v * n, u }'
	fi
}

# go_bench ROUND TAG DEPLOYMENT PACKAGE BENCHMARK...: runs the benchmarks of
# pkg/PACKAGE (the binary go test -bench would run), on the deployment's
# sub-benchmark (none: the benchmark itself, on the standalone Redis), and
# records every figure they print.
go_bench() {
	local round=$1 tag=$2 d=$3 pkg=$4 name unit value b benchtime=$BENCH_TIME
	shift 4
	local pattern
	pattern="^($(
		IFS='|'
		echo "$*"
	))\$"
	[[ -n "$d" ]] && pattern+="/^$d\$"
	# Allocation counts need a fixed number of calls, not a time.
	[[ "$*" == BenchmarkHandlerAllocs ]] && benchtime=${ALLOC_REQUESTS}x
	# So is a profile read off INFO commandstats in turns of 5,000 calls, and
	# the bounds of pairs read off INFO cpu in turns of 2,000 and of latency
	# in turns of 500.
	[[ "$*" == BenchmarkAcquireParts ]] && benchtime=${PARTS_CALLS}x
	[[ "$*" == BenchmarkPoolsBound ]] && benchtime=${BOUND_PAIRS}x
	[[ "$*" == BenchmarkPoolsLatencyBound ]] && benchtime=${LATENCY_PAIRS}x
	# The library's pairs against raw rueidis' run RAW_TURNS times as long:
	# in one BENCH_TIME each of their eight turns is short enough that a
	# round's ratio moved 0.90-1.04 with both sides' CPU unchanged.
	[[ "$*" == BenchmarkAcquireReleaseVsRaw ]] && benchtime=$(times_benchtime "$benchtime" "$RAW_TURNS")
	flush "${d:-standalone}"
	step "go test -bench '$pattern' ./pkg/$pkg (benchtime $benchtime)"
	# LIMITER_TEST_REQUIRE: a missing server fails the benchmark instead of skipping it.
	(cd "pkg/$pkg" && LIMITER_TEST_REQUIRE=1 "$tmp/$pkg.test" -test.run '^$' -test.bench "$pattern" \
		-test.benchtime "$benchtime" -test.benchmem) >"$tmp/go.txt" 2>&1 ||
		die "go test -bench failed: $(cat "$tmp/go.txt")"
	grep '^Benchmark' "$tmp/go.txt" | sed 's/^/    /' >&2 || true
	while read -r name unit value; do
		GO[$round/$tag/$name/$unit]=$value
	done < <(awk '/^Benchmark[^ ]*-[0-9]+[ \t]/ {
		name = $1; sub(/-[0-9]+$/, "", name)
		for (i = 3; i < NF; i += 2) print name, $(i + 1), $i
	}' "$tmp/go.txt")
	for b in "$@"; do
		name=$b${d:+/$d}
		[[ "${GO[$round/$tag/$name/ns/op]:-}" =~ ^[0-9.e+]+$ ]] || die "go test printed no $name: $(cat "$tmp/go.txt")"
		value=${GO[$round/$tag/$name/granted/op]:-}
		if [[ -n "$value" ]]; then
			awk -v g="$value" 'BEGIN { exit !(g >= 0.99) }' || die "$name granted only $value of its acquires"
		fi
	done
}

# install_semaphore installs redis-semaphore and ioredis, as
# hack/bench/semaphore/package-lock.json pins them, into BENCH_NPM_DIR,
# unless that lock file is what is installed there already.
install_semaphore() {
	local lock=hack/bench/semaphore/package-lock.json want
	want=$(sha1sum "$lock" | cut -d' ' -f1)
	if [[ "$(cat "$BENCH_NPM_DIR/.installed" 2>/dev/null)" != "$want" || ! -d "$BENCH_NPM_DIR/node_modules" ]]; then
		step "installing redis-semaphore and ioredis ($lock) into $BENCH_NPM_DIR"
		mkdir -p "$BENCH_NPM_DIR"
		rm -f "$BENCH_NPM_DIR/.installed"
		cp hack/bench/semaphore/package.json "$lock" "$BENCH_NPM_DIR/"
		npm ci --prefix "$BENCH_NPM_DIR" --no-audit --no-fund --loglevel=error >&2 ||
			die "npm ci in $BENCH_NPM_DIR failed"
		echo "$want" >"$BENCH_NPM_DIR/.installed"
	fi
	if ! semaphore_version=$(node -p 'require("redis-semaphore/package.json").version' 2>/dev/null) ||
		! ioredis_version=$(node -p 'require("ioredis/package.json").version' 2>/dev/null); then
		die "redis-semaphore or ioredis missing from $BENCH_NPM_DIR/node_modules; remove $BENCH_NPM_DIR to reinstall"
	fi
}
[[ -z "${BENCH_NPM_DIR:-}" ]] || export NODE_PATH=$BENCH_NPM_DIR/node_modules

# parse_fields ARRAY PREFIX FILE: ARRAY[PREFIX/<name>]=<value> for each
# name=value word of FILE's last line.
parse_fields() {
	local -n into=$1
	local field
	for field in $(tail -n 1 "$3"); do
		[[ "$field" == *=* ]] && into[$2/${field%%=*}]=${field#*=}
	done
}

semaphore_bench() { # semaphore_bench ROUND
	local round=$1
	flush standalone
	step "redis-semaphore $semaphore_version (ioredis $ioredis_version): tryAcquire+release, $CLIENTS workers, ${BENCH_DURATION}s"
	node hack/bench/semaphore/semaphore.js "$LIMITER_TEST_REDIS" "$CLIENTS" "$WARMUP_MS" "$DURATION_MS" >"$tmp/sem.txt" 2>&1 ||
		die "semaphore.js failed: $(cat "$tmp/sem.txt")"
	sed 's/^/    /' "$tmp/sem.txt" >&2
	parse_fields SEM "$round" "$tmp/sem.txt"
	[[ "${SEM[$round/pairs/s]:-}" =~ ^[0-9.]+$ ]] || die "semaphore.js printed no pairs/s: $(cat "$tmp/sem.txt")"
	awk -v g="${SEM[$round/granted/pair]}" 'BEGIN { exit !(g >= 0.99) }' || die "redis-semaphore granted only ${SEM[$round/granted/pair]} of its acquires"
}

# start_http_servers starts `limiter serve` and the trivial handler on the
# standalone Redis and fills URL and PID. serve authenticates its callers
# (api.tokensFile), as in production, and the load generator sends the
# token to both.
start_http_servers() {
	api_token=bench-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
	printf 'bench %s *\n' "$api_token" >"$tmp/api-tokens"
	cat >"$tmp/limiter.yaml" <<-EOF
		redis:
		  addrs: ["$LIMITER_TEST_REDIS"]
		  # As the Go benchmarks: a call that waits on a saturated machine
		  # must not be answered degraded (the load generator refuses those).
		  timeout: 10s
		  keyPrefix: "bench:serve:"
		http:
		  shutdownGrace: 1s
		api:
		  tokensFile: "$tmp/api-tokens"
		tiers:
		  source: static
		  static:
		    - plan: three
		      maxConcurrentStreams: 3
	EOF
	step "starting limiter serve and hack/bench/trivial on the standalone Redis"
	"$tmp/limiter" serve --config "$tmp/limiter.yaml" --http-addr 127.0.0.1:0 --ops-addr 127.0.0.1:0 >"$tmp/serve.log" 2>&1 &
	PID[serve]=$!
	started+=("${PID[serve]}")
	"$tmp/trivial" -redis "$LIMITER_TEST_REDIS" -limit 3 -ttl 120s >"$tmp/trivial.log" 2>&1 &
	PID[trivial]=$!
	started+=("${PID[trivial]}")
	await_log serve '"msg":"connected to redis"'
	URL[serve]=$(sed -n 's/.*"msg":"listening","api":"\([^"]*\)".*/\1/p' "$tmp/serve.log")
	await_log trivial '^listening http://'
	URL[trivial]=$(sed -n 's/^listening //p' "$tmp/trivial.log")
	[[ -n "${URL[serve]}" && -n "${URL[trivial]}" ]] || die "no listen address in $(cat "$tmp/serve.log" "$tmp/trivial.log")"
	printf '    serve %s (pid %s), trivial %s (pid %s)\n' "${URL[serve]}" "${PID[serve]}" "${URL[trivial]}" "${PID[trivial]}" >&2
	# A few pairs for many users now: the Redis client dials each of its
	# connections when a call first picks it, and serve runs its calls in
	# their callers' goroutines only two dial timeouts (here 2 × 10 s) after
	# its latest dial, long before the first HTTP step.
	local target
	for target in serve trivial; do
		"$tmp/load" -url "${URL[$target]}" -pid "${PID[$target]}" -token "$api_token" -conns 4 \
			-warmup 0ms -duration 300ms >"$tmp/load.txt" 2>&1 || die "warming up $target failed: $(cat "$tmp/load.txt")"
	done
}

# start_proxy_servers starts, on the standalone Redis, what a new user runs
# (the README): hack/bench/sse's upstream, a plain reverse proxy to it
# (hack/bench/sse -plain), and two `limiter proxy` processes in front of
# it, as the README starts one, logging each stream at the default level:
# one without a pool (proxy) and one with a pool keyed by the request
# body's model (pooled), every key capped, so that every stream joins one.
# Beside them, the two proxies' bound: the plain reverse proxy running the
# limiter's scripts around each stream, and nothing else of the limiter's
# (hack/bench/sse -scripts), on the user's key (scripted) and on a pool
# key too (scripted-pooled). It fills URL and PID.
start_proxy_servers() {
	step "starting hack/bench/sse's upstream, plain reverse proxy and the same running the limiter's scripts, and two limiter proxy processes, on the standalone Redis"
	"$tmp/sse" -upstream >"$tmp/upstream.log" 2>&1 &
	PID[upstream]=$!
	started+=("${PID[upstream]}")
	await_log upstream '^listening http://'
	URL[upstream]=$(sed -n 's/^listening //p' "$tmp/upstream.log")
	local target
	for target in plain scripted scripted-pooled; do
		local -a scripts=()
		[[ $target == scripted* ]] && scripts=(-scripts "$LIMITER_TEST_REDIS")
		[[ $target == scripted-pooled ]] && scripts+=(-pool)
		"$tmp/sse" -plain "${URL[upstream]}" "${scripts[@]}" >"$tmp/$target.log" 2>&1 &
		PID[$target]=$!
		started+=("${PID[$target]}")
	done
	for target in proxy pooled; do
		local -a pools=()
		[[ $target == pooled ]] && pools=(LIMITER_POOLS_STATIC='[{"pool":"model","maxConcurrentStreams":100000}]' LIMITER_IDENTITY_POOLS=model=body:model)
		env "${pools[@]}" "$tmp/limiter" proxy --upstream "${URL[upstream]}" --redis-addrs "$LIMITER_TEST_REDIS" \
			--redis-key-prefix "bench:$target:" --redis-timeout 10s --listen 127.0.0.1:0 --ops-addr 127.0.0.1:0 >"$tmp/$target.log" 2>&1 &
		PID[$target]=$!
		started+=("${PID[$target]}")
	done
	for target in plain scripted scripted-pooled; do
		await_log "$target" '^listening http://'
		URL[$target]=$(sed -n 's/^listening //p' "$tmp/$target.log")
	done
	for target in proxy pooled; do
		await_log "$target" '"msg":"connected to redis"'
		URL[$target]=$(sed -n 's/.*"msg":"proxying","listen":"\([^"]*\)".*/\1/p' "$tmp/$target.log")
		[[ -n "${URL[$target]}" ]] || die "no listen address in $(cat "$tmp/$target.log")"
	done
	printf '    upstream %s, plain %s, scripted %s, scripted-pooled %s, proxy %s, pooled %s\n' "${URL[upstream]}" "${URL[plain]}" \
		"${URL[scripted]}" "${URL[scripted-pooled]}" "${URL[proxy]}" "${URL[pooled]}" >&2
	for target in "${PROXY_TARGETS[@]}"; do
		"$tmp/load" -sse -plan paid -url "${URL[$target]}" -conns 4 -warmup 0ms -duration 300ms >"$tmp/load.txt" 2>&1 ||
			die "warming up $target failed: $(cat "$tmp/load.txt")"
	done
}

# PROXY_TARGETS are the processes proxy_bench streams through, in turns.
PROXY_TARGETS=(plain scripted proxy scripted-pooled pooled)

# proxy_bench ROUND: hack/bench/load -sse against the plain reverse proxy,
# its two bounds and both limiter proxies (start_proxy_servers) in one
# run, taking turns in HTTP_SLICES slices each (the order reversed every
# other round), with PROXY_CLIENTS streams at a time: SSE streams/s, time
# to the first chunk and each process's CPU per stream.
proxy_bench() {
	local round=$1 targets=("${PROXY_TARGETS[@]}") i urls pids
	((round % 2)) || targets=($(printf '%s\n' "${PROXY_TARGETS[@]}" | tac))
	for i in "${!targets[@]}"; do
		kill -0 "${PID[${targets[i]}]}" 2>/dev/null ||
			die "${targets[i]} is no longer running: $(tail -n 20 "$tmp/${targets[i]}.log")"
	done
	flush standalone
	urls=$(for i in "${!targets[@]}"; do printf '%s,' "${URL[${targets[i]}]}"; done)
	pids=$(for i in "${!targets[@]}"; do printf '%s,' "${PID[${targets[i]}]}"; done)
	step "SSE streams through ${targets[*]} in turns: $PROXY_CLIENTS clients, ${BENCH_DURATION}s each in $HTTP_SLICES slices"
	"$tmp/load" -sse -plan paid -url "${urls%,}" -pid "${pids%,}" -conns "$PROXY_CLIENTS" -warmup "${WARMUP_MS}ms" \
		-duration "${BENCH_DURATION}s" -slices "$HTTP_SLICES" >"$tmp/load.txt" 2>&1 || die "SSE load failed: $(cat "$tmp/load.txt")"
	for i in "${!targets[@]}"; do
		local target=${targets[i]}
		sed -n "$((i + 1))p" "$tmp/load.txt" >"$tmp/load-$target.txt"
		sed "s/^/    $target: /" "$tmp/load-$target.txt" >&2
		parse_fields H "$round/sse/$target" "$tmp/load-$target.txt"
		[[ "${H[$round/sse/$target/streams/s]:-}" =~ ^[0-9.]+$ ]] || die "load printed no streams/s for $target: $(cat "$tmp/load.txt")"
	done
	for target in scripted scripted-pooled; do
		! grep -q '^sse: ' "$tmp/$target.log" || die "$target failed: $(grep -m 5 '^sse: ' "$tmp/$target.log")"
	done
}

# start_scale_serves NAME ADDRS COUNT: starts COUNT `limiter serve`
# processes ($tmp/limiter) for BenchmarkScale on the Redis servers ADDRS
# (comma separated), with key prefix $scale_prefix and the tokens file
# $tmp/scale-tokens (one caller, token $scale_token), and sets SCALE_SERVE
# to their PID@URL list.
start_scale_serves() {
	local name=$1 addrs count=$3 r
	addrs=$(sed 's/[^,]*/"&"/g; s/,/, /g' <<<"$2")
	[[ -f "$tmp/scale-tokens" ]] || printf 'scale %s *\n' "$scale_token" >"$tmp/scale-tokens"
	cat >"$tmp/$name.yaml" <<-EOF
		redis:
		  addrs: [$addrs]
		  # A call waiting on the saturated machine must not be answered
		  # degraded: the benchmark refuses those.
		  timeout: 10s
		  keyPrefix: "$scale_prefix"
		http:
		  shutdownGrace: 1s
		api:
		  tokensFile: "$tmp/scale-tokens"
		tiers:
		  source: static
		  static:
		    - plan: scale
		      maxConcurrentStreams: 3
		      slotTTL: 120s
		      heartbeatInterval: 20s
		      failureMode: Open
	EOF
	SCALE_SERVE=""
	for ((r = 1; r <= count; r++)); do
		"$tmp/limiter" serve --config "$tmp/$name.yaml" --http-addr 127.0.0.1:0 --ops-addr 127.0.0.1:0 >"$tmp/$name-$r.log" 2>&1 &
		PID[$name-$r]=$!
		started+=("${PID[$name-$r]}")
		await_log "$name-$r" '"msg":"connected to redis"'
		URL[$name-$r]=$(sed -n 's/.*"msg":"listening","api":"\([^"]*\)".*/\1/p' "$tmp/$name-$r.log")
		[[ -n "${URL[$name-$r]}" ]] || die "$name-$r logged no listen address: $(cat "$tmp/$name-$r.log")"
		SCALE_SERVE+="${SCALE_SERVE:+,}${PID[$name-$r]}@${URL[$name-$r]}"
	done
}

# scale_bench: BenchmarkScale once, on the cluster, N = BENCH_SCALE_SLOTS,
# through the library and over HTTP to two serve processes; records its
# figures in SCALE[<unit>].
scale_bench() {
	local name unit value
	flush cluster
	start_scale_serves scale "$LIMITER_TEST_REDIS_CLUSTER" 2
	step "go test -bench BenchmarkScale/cluster: $BENCH_SCALE_SLOTS slots, $BENCH_SCALE_ROUNDS rounds per way, library and HTTP (2 serve)"
	(cd pkg/limiter && LIMITER_TEST_REQUIRE=1 LIMITER_BENCH_SCALE=1 LIMITER_BENCH_SCALE_POOLED=1 LIMITER_BENCH_SCALE_SLOTS=$BENCH_SCALE_SLOTS \
		LIMITER_BENCH_SCALE_ROUNDS=$BENCH_SCALE_ROUNDS LIMITER_BENCH_SCALE_SERVE_CLUSTER=$SCALE_SERVE \
		LIMITER_BENCH_SCALE_PREFIX=$scale_prefix LIMITER_BENCH_SCALE_TOKEN=$scale_token \
		"$tmp/limiter.test" -test.run '^$' -test.bench '^BenchmarkScale$/^cluster$' -test.benchtime 1x -test.timeout 30m) >"$tmp/go.txt" 2>&1 ||
		die "BenchmarkScale failed: $(cat "$tmp/go.txt")"
	grep '^Benchmark.*-[0-9]' "$tmp/go.txt" | sed 's/^/    /' >&2 || true
	while read -r unit value; do
		SCALE[$unit]=$value
	done < <(awk '/^BenchmarkScale\/cluster\/slots=[0-9]+-[0-9]+[ \t]/ { for (i = 3; i < NF; i += 2) print $(i + 1), $i }' "$tmp/go.txt")
	# The same round with every stream in one pool key: pooled/<unit>.
	while read -r unit value; do
		SCALE[pooled/$unit]=$value
	done < <(awk '/^BenchmarkScale\/cluster\/slots=[0-9]+-pooled-[0-9]+[ \t]/ { for (i = 3; i < NF; i += 2) print $(i + 1), $i }' "$tmp/go.txt")
	[[ "${SCALE[http-round-s]:-}" =~ ^[0-9.e+]+$ ]] || die "BenchmarkScale printed no http-round-s: $(cat "$tmp/go.txt")"
	[[ "${SCALE[pooled/http-round-s]:-}" =~ ^[0-9.e+]+$ ]] || die "BenchmarkScale printed no pooled http-round-s: $(cat "$tmp/go.txt")"
}

await_log() { # await_log SERVER PATTERN: waits up to 10s for PATTERN in its log
	local i
	for ((i = 0; i < 100; i++)); do
		grep -q -- "$2" "$tmp/$1.log" && return 0
		kill -0 "${PID[$1]}" 2>/dev/null || die "$1 exited: $(cat "$tmp/$1.log")"
		sleep 0.1
	done
	die "$1 did not log '$2' within 10s: $(cat "$tmp/$1.log")"
}

# http_bench ROUND KIND [RATE]: hack/bench/load against serve and the
# trivial handler in one run, taking turns in HTTP_SLICES slices each
# (serve first in odd rounds, the trivial handler in even ones), as fast as
# they answer (KIND max) or paced at RATE pairs/s (KIND lat).
http_bench() {
	local round=$1 kind=$2 rate=${3:-0} targets=(serve trivial) i
	((round % 2)) || targets=(trivial serve)
	for i in 0 1; do
		kill -0 "${PID[${targets[i]}]}" 2>/dev/null ||
			die "${targets[i]} is no longer running: $(tail -n 20 "$tmp/${targets[i]}.log")"
	done
	flush standalone
	step "load ${targets[0]} and ${targets[1]} in turns: $CLIENTS connections, ${BENCH_DURATION}s each in $HTTP_SLICES slices$( ((rate)) && echo ", paced at $rate pairs/s")"
	"$tmp/load" -url "${URL[${targets[0]}]},${URL[${targets[1]}]}" -pid "${PID[${targets[0]}]},${PID[${targets[1]}]}" \
		-token "$api_token" -conns "$CLIENTS" -rate "$rate" -warmup "${WARMUP_MS}ms" -duration "${BENCH_DURATION}s" \
		-slices "$HTTP_SLICES" >"$tmp/load.txt" 2>&1 || die "load against serve and trivial failed: $(cat "$tmp/load.txt")"
	for i in 0 1; do
		local target=${targets[i]}
		sed -n "$((i + 1))p" "$tmp/load.txt" >"$tmp/load-$target.txt"
		sed "s/^/    $target: /" "$tmp/load-$target.txt" >&2
		parse_fields H "$round/$kind/$target" "$tmp/load-$target.txt"
		[[ "${H[$round/$kind/$target/pairs/s]:-}" =~ ^[0-9.]+$ ]] || die "load printed no pairs/s for $target: $(cat "$tmp/load.txt")"
		awk -v g="${H[$round/$kind/$target/granted/pair]}" 'BEGIN { exit !(g >= 0.99) }' ||
			die "$target granted only ${H[$round/$kind/$target/granted/pair]} of its acquires"
	done
}
