# shellcheck shell=bash disable=SC2154
# (SC2154: the figures, versions and times are set by hack/bench.sh and
# hack/bench/lib.sh.)
# The table of hack/bench.sh, which sources this file after the rounds:
# report prints it from the arrays hack/bench/lib.sh fills.

# per_round ARRAY KEY: ARRAY[<round>/KEY] of every round, one per line.
per_round() {
	local -n arr=$1
	local round
	for ((round = 1; round <= BENCH_ROUNDS; round++)); do
		echo "${arr[$round/$2]}"
	done
}

# ratios NUM-ARRAY NUM-KEY DEN-ARRAY DEN-KEY: each round's NUM / DEN.
ratios() {
	paste <(per_round "$1" "$2") <(per_round "$3" "$4") | awk '{ printf "%.6g\n", $1 / $2 }'
}

# spread FORMAT: "median [lowest-highest]" of the numbers on stdin.
spread() {
	sort -g | awk -v f="$1" '{ v[NR] = $1 } END {
		m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
		printf f " [" f "-" f "]", m, v[1], v[NR]
	}'
}

# median FORMAT: the median of the numbers on stdin.
median() {
	sort -g | awk -v f="$1" '{ v[NR] = $1 } END { printf f, NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

has_cluster() { [[ " ${deployments[*]} " == *" cluster "* ]]; }

# line LABEL STANDALONE [CLUSTER]: one row; "-" where the cluster was
# measured but not this row.
line() {
	if has_cluster; then
		printf '%-62s%22s%22s\n' "$1" "$2" "${3:--}"
	else
		printf '%-62s%22s\n' "$1" "$2"
	fi
}

# ratio_line LABEL NUM-ARRAY NUM-KEY DEN-ARRAY DEN-KEY [both]: a ratio row;
# the keys hold a literal "%d", replaced by the deployment. With "both" the
# cluster column is measured too.
ratio_line() {
	local cluster=-
	if [[ "${6:-}" == both ]] && has_cluster; then
		cluster=$(ratios "$2" "${3//%d/cluster}" "$4" "${5//%d/cluster}" | spread %.2f)
	fi
	line "$1" "$(ratios "$2" "${3//%d/standalone}" "$4" "${5//%d/standalone}" | spread %.2f)" "$cluster"
}

# figure_line LABEL FORMAT ARRAY KEY [both]: the median of a raw figure.
figure_line() {
	local cluster=-
	if [[ "${5:-}" == both ]] && has_cluster; then
		cluster=$(per_round "$3" "${4//%d/cluster}" | median "$2")
	fi
	line "$1" "$(per_round "$3" "${4//%d/standalone}" | median "$2")" "$cluster"
}

# spread_line LABEL FORMAT ARRAY KEY [both]: a row of a figure that is a
# ratio already (the benchmark divides): its spread over the rounds.
spread_line() {
	local cluster=-
	if [[ "${5:-}" == both ]] && has_cluster; then
		cluster=$(per_round "$3" "${4//%d/cluster}" | spread "$2")
	fi
	line "$1" "$(per_round "$3" "${4//%d/standalone}" | spread "$2")" "$cluster"
}

# per_core_bound CORES US-ARRAY US-KEY RPS-ARRAY RPS-KEY: each round's most
# ops/s that CORES processors allow at US-KEY's µs of CPU per op, divided
# by RPS-KEY's measured ops/s.
per_core_bound() {
	paste <(per_round "$2" "$3") <(per_round "$4" "$5") | awk -v c="$1" '{ printf "%.6g\n", c * 1e6 / $1 / $2 }'
}

# bound_line LABEL CORES US-ARRAY US-KEY RPS-ARRAY RPS-KEY: a row of
# per_core_bound, standalone and cluster (keys with a literal "%d").
bound_line() {
	local cluster=-
	if has_cluster; then
		cluster=$(per_core_bound "$2" "$3" "${4//%d/cluster}" "$5" "${6//%d/cluster}" | spread %.2f)
	fi
	line "$1" "$(per_core_bound "$2" "$3" "${4//%d/standalone}" "$5" "${6//%d/standalone}" | spread %.2f)" "$cluster"
}

report() {
	local redis_version
	redis_version=$(redis-server --version | sed -n 's/.* v=\([^ ]*\) .*/\1/p')
	echo
	echo "limiter benchmarks: ratios against references measured on the same servers, same run (BENCHMARKS.md)"
	echo "$started_at, $(nproc) cores shared by clients and servers, Redis $redis_version, $(go env GOVERSION), node $(node --version), redis-semaphore $semaphore_version, ioredis $ioredis_version"
	echo "1-minute load average $load_start at the start, $load_end at the end (the run itself keeps about 2 busy); the run took $((elapsed / 60))m$((elapsed % 60))s"
	echo "$CLIENTS clients everywhere; redis-benchmark -r $USERS -n $BENCH_N (-P $PIPELINE: $((2 * BENCH_N))); go benchtime $BENCH_TIME (library against raw rueidis: $(times_benchtime "$BENCH_TIME" "$RAW_TURNS")); load and redis-semaphore ${BENCH_DURATION}s each"
	echo "median of $BENCH_ROUNDS rounds [lowest-highest]; in each round both sides of a ratio run back to back (HTTP: in turns, $HTTP_SLICES slices each)"
	echo
	line "ratio" standalone "$(has_cluster && echo cluster)"
	echo "redis-benchmark EVALSHA of the acquire script (the ceiling)"
	ratio_line "  Acquire ops/s / EVALSHA rps" GO 'A/BenchmarkAcquire/%d/ops/s' RPS '%d/p1' both
	ratio_line "  Acquire ops/s / EVALSHA rps -P $PIPELINE" GO 'A/BenchmarkAcquire/%d/ops/s' RPS "%d/p$PIPELINE" both
	ratio_line "  Acquire+Release pairs/s / EVALSHA rps" GO 'A/BenchmarkAcquireRelease/%d/ops/s' RPS '%d/p1' both
	ratio_line "  HeartbeatBatch slots/s / EVALSHA rps -P $PIPELINE" GO 'A/BenchmarkHeartbeatBatch/%d/slots/s' RPS "%d/p$PIPELINE" both
	echo "raw rueidis: the same scripts as bare EVALSHA, in turns with the library (BenchmarkAcquireReleaseVsRaw)"
	ratio_line "  Acquire+Release pairs/s / raw pairs/s" GO 'V/BenchmarkAcquireReleaseVsRaw/%d/library-pairs/s' GO 'V/BenchmarkAcquireReleaseVsRaw/%d/raw-pairs/s' both
	ratio_line "  client CPU per pair / raw" GO 'V/BenchmarkAcquireReleaseVsRaw/%d/library-cpu-us/pair' GO 'V/BenchmarkAcquireReleaseVsRaw/%d/raw-cpu-us/pair' both
	ratio_line "  Redis CPU per pair / raw" GO 'V/BenchmarkAcquireReleaseVsRaw/%d/library-redis-cpu-us/pair' GO 'V/BenchmarkAcquireReleaseVsRaw/%d/raw-redis-cpu-us/pair' both
	echo "redis-semaphore tryAcquire+release (node, ioredis)"
	ratio_line "  Acquire+Release pairs/s / redis-semaphore pairs/s" GO 'S/BenchmarkAcquireRelease/%d/ops/s' SEM 'pairs/s'
	ratio_line "  Redis CPU per pair / redis-semaphore" GO 'S/BenchmarkAcquireRelease/%d/redis-cpu-us/op' SEM 'redis-cpu-us/pair'
	echo "HTTP: limiter serve vs a net/http handler doing one EVALSHA per request"
	ratio_line "  acquire+release pairs/s / trivial" H 'max/serve/pairs/s' H 'max/trivial/pairs/s'
	ratio_line "  server CPU per pair / trivial" H 'max/serve/server-cpu-us/pair' H 'max/trivial/server-cpu-us/pair'
	ratio_line "  acquire p50 at half of serve's max pairs/s / trivial" H 'lat/serve/acquire-p50-us' H 'lat/trivial/acquire-p50-us'
	ratio_line "  acquire p99 at half of serve's max pairs/s / trivial" H 'lat/serve/acquire-p99-us' H 'lat/trivial/acquire-p99-us'
	echo "batched heartbeats, 1000 slots: POST /v1/slots/heartbeats through the handler / HeartbeatBatch"
	ratio_line "  process CPU per refreshed slot" GO 'B/BenchmarkHeartbeatBatchHTTP/http-cpu-us/slot' GO 'B/BenchmarkHeartbeatBatchHTTP/library-cpu-us/slot'
	echo "proxy: SSE chat completions (8 chunks) through limiter proxy / straight from the upstream (BenchmarkProxySSE)"
	line "  streams/s through the proxy / direct, 32 clients" "$(per_round GO 'P/BenchmarkProxySSE/throughput_ratio' | spread %.2f)"
	line "  time to first chunk through the proxy / direct" "$(per_round GO 'P/BenchmarkProxySSE/ttfb_ratio' | spread %.2f)"
	echo "proxy / a plain httputil.ReverseProxy to the same upstream (BenchmarkProxySSE: 32 clients, each way alone, in turns)"
	line "  streams/s, no pool / plain (goal >= 0.8)" "$(per_round GO 'P/BenchmarkProxySSE/vs_plain_ratio' | spread %.2f)"
	line "  time to first chunk over plain's - one acquire, us (goal <= 300)" "$(paste <(per_round GO 'P/BenchmarkProxySSE/added_ttfb_vs_plain_us') <(per_round GO 'P/BenchmarkProxySSE/acquire_us') | awk '{ printf "%.6g\n", $1 - $2 }' | spread %.0f)"
	line "  the same, a pool keyed by the body's model, us" "$(paste <(per_round GO 'P/BenchmarkProxySSE/pooled_added_ttfb_vs_plain_us') <(per_round GO 'P/BenchmarkProxySSE/acquire_us') | awk '{ printf "%.6g\n", $1 - $2 }' | spread %.0f)"
	line "  streams/s, a pool keyed by the body's model / plain" "$(per_round GO 'P/BenchmarkProxySSE/pooled_vs_plain_ratio' | spread %.2f)"
	line "  streams/s, a pool keyed by the body's model / no pool" "$(per_round GO 'P/BenchmarkProxySSE/pooled_vs_proxied_ratio' | spread %.2f)"
	echo "the same in processes, as a new user runs them: limiter proxy (README) / a plain reverse proxy process ($PROXY_CLIENTS clients, in turns)"
	ratio_line "  streams/s, no pool / plain (goal >= 0.8)" H 'sse/proxy/streams/s' H 'sse/plain/streams/s'
	ratio_line "  streams/s, body-keyed pool / plain (goal >= 0.8)" H 'sse/pooled/streams/s' H 'sse/plain/streams/s'
	ratio_line "  process CPU per stream, no pool / plain" H 'sse/proxy/server-cpu-us/stream' H 'sse/plain/server-cpu-us/stream'
	ratio_line "  process CPU per stream, body-keyed pool / plain" H 'sse/pooled/server-cpu-us/stream' H 'sse/plain/server-cpu-us/stream'
	ratio_line "  bound: plain running the limiter's scripts / plain" H 'sse/scripted/streams/s' H 'sse/plain/streams/s'
	ratio_line "  bound, with a pool key's scripts too / plain" H 'sse/scripted-pooled/streams/s' H 'sse/plain/streams/s'
	ratio_line "  limiter proxy / its bound, no pool" H 'sse/proxy/streams/s' H 'sse/scripted/streams/s'
	ratio_line "  limiter proxy / its bound, body-keyed pool" H 'sse/pooled/streams/s' H 'sse/scripted-pooled/streams/s'
	echo "heartbeat refresh, Redis' own cost: script (batched) / ZADD XX GT + PEXPIREAT"
	ratio_line "  time in commands (INFO commandstats)" GO 'R/BenchmarkHeartbeatRefresh/%d/script-redis-us/refresh' GO 'R/BenchmarkHeartbeatRefresh/%d/plain-redis-us/refresh'
	ratio_line "  server CPU (INFO cpu)" GO 'R/BenchmarkHeartbeatRefresh/%d/script-cpu-us/refresh' GO 'R/BenchmarkHeartbeatRefresh/%d/plain-cpu-us/refresh'
	echo "pools: each stream joining two pools (a model's, an org's) / joining none, in turns (BenchmarkPoolsAcquireRelease, BenchmarkPoolsHeartbeat)"
	ratio_line "  acquire+release pairs/s" GO 'O/BenchmarkPoolsAcquireRelease/%d/two-pairs/s' GO 'O/BenchmarkPoolsAcquireRelease/%d/none-pairs/s' both
	ratio_line "  acquire p50 at full load (follows pairs/s)" GO 'O/BenchmarkPoolsAcquireRelease/%d/two-acquire-p50-us' GO 'O/BenchmarkPoolsAcquireRelease/%d/none-acquire-p50-us' both
	ratio_line "  acquire p50, both paced at half of two pools' pairs/s" GO 'O/BenchmarkPoolsAcquireRelease/%d/two-paced-acquire-p50-us' GO 'O/BenchmarkPoolsAcquireRelease/%d/none-paced-acquire-p50-us' both
	ratio_line "  the same, the scripts alone on the limiter's client" GO 'O/BenchmarkPoolsAcquireRelease/%d/two-sent-paced-acquire-p50-us' GO 'O/BenchmarkPoolsAcquireRelease/%d/none-sent-paced-acquire-p50-us' both
	ratio_line "  two pools' paced acquire p50, limiter / the scripts alone" GO 'O/BenchmarkPoolsAcquireRelease/%d/two-paced-acquire-p50-us' GO 'O/BenchmarkPoolsAcquireRelease/%d/two-sent-paced-acquire-p50-us' both
	ratio_line "  acquire p50, both at a light 2,000 pairs/s" GO 'O/BenchmarkPoolsAcquireRelease/%d/two-light-acquire-p50-us' GO 'O/BenchmarkPoolsAcquireRelease/%d/none-light-acquire-p50-us' both
	ratio_line "  the same, the scripts alone on the limiter's client" GO 'O/BenchmarkPoolsAcquireRelease/%d/two-sent-light-acquire-p50-us' GO 'O/BenchmarkPoolsAcquireRelease/%d/none-sent-light-acquire-p50-us' both
	ratio_line "  two pools' light acquire p50, limiter / the scripts alone" GO 'O/BenchmarkPoolsAcquireRelease/%d/two-light-acquire-p50-us' GO 'O/BenchmarkPoolsAcquireRelease/%d/two-sent-light-acquire-p50-us' both
	ratio_line "  the most the servers allow: their CPU per pair, none / two" GO 'O/BenchmarkPoolsAcquireRelease/%d/none-servers-cpu-us/pair' GO 'O/BenchmarkPoolsAcquireRelease/%d/two-servers-cpu-us/pair' both
	ratio_line "  the machine's CPU per pair, none / two" GO 'O/BenchmarkPoolsAcquireRelease/%d/none-machine-cpu-us/pair' GO 'O/BenchmarkPoolsAcquireRelease/%d/two-machine-cpu-us/pair' both
	ratio_line "  heartbeat round, Redis CPU per stream" GO 'O/BenchmarkPoolsHeartbeat/%d/two-redis-cpu-us/stream' GO 'O/BenchmarkPoolsHeartbeat/%d/none-redis-cpu-us/stream' both
	ratio_line "  the same, every stream in one hot pool key" GO 'O/BenchmarkPoolsHeartbeat/%d/hot-redis-cpu-us/stream' GO 'O/BenchmarkPoolsHeartbeat/%d/none-redis-cpu-us/stream' both
	echo "the most pairs/s Redis allows two pools / none: its CPU per pair, none / two, pipelined (BenchmarkPoolsBound)"
	spread_line "  each key's scripts a call of their own, as sent" %.2f GO 'L/BenchmarkPoolsBound/sent-bound'
	spread_line "  the same work inside the user's one call" %.2f GO 'L/BenchmarkPoolsBound/inside-bound'
	spread_line "  memberships stripped to the slot, inside it" %.2f GO 'L/BenchmarkPoolsBound/bare-bound'
	spread_line "  memberships not slots: a lean script of their own, sent" %.2f GO 'L/BenchmarkPoolsBound/lean-bound'
	spread_line "  the same, folded: no record, override and queue read at once" %.2f GO 'L/BenchmarkPoolsBound/folded-bound'
	spread_line "  the least: a capped member with its expiry, nothing else" %.2f GO 'L/BenchmarkPoolsBound/least-bound'
	echo "acquire p50, two pools / none, the scripts sent by rueidis alone, no limiter code, in turns (BenchmarkPoolsLatencyBound)"
	spread_line "  at full load, as sent" %.2f GO 'L/BenchmarkPoolsLatencyBound/full-sent-p50-bound'
	spread_line "  at full load, stripped to the slot, inside the user's call" %.2f GO 'L/BenchmarkPoolsLatencyBound/full-bare-p50-bound'
	spread_line "  at full load, memberships a lean script of their own" %.2f GO 'L/BenchmarkPoolsLatencyBound/full-lean-p50-bound'
	spread_line "  at full load, the same folded" %.2f GO 'L/BenchmarkPoolsLatencyBound/full-folded-p50-bound'
	spread_line "  at full load, the least memberships" %.2f GO 'L/BenchmarkPoolsLatencyBound/full-least-p50-bound'
	spread_line "  paced as BenchmarkPoolsAcquireRelease's, as sent" %.2f GO 'L/BenchmarkPoolsLatencyBound/paced-sent-p50-bound'
	spread_line "  the same work inside the user's one call" %.2f GO 'L/BenchmarkPoolsLatencyBound/paced-inside-p50-bound'
	spread_line "  memberships stripped to the slot, inside it" %.2f GO 'L/BenchmarkPoolsLatencyBound/paced-bare-p50-bound'
	spread_line "  at a light 2,000 pairs/s, as sent" %.2f GO 'L/BenchmarkPoolsLatencyBound/light-sent-p50-bound'
	spread_line "  the same work inside the user's one call" %.2f GO 'L/BenchmarkPoolsLatencyBound/light-inside-p50-bound'
	spread_line "  memberships stripped to the slot, inside it" %.2f GO 'L/BenchmarkPoolsLatencyBound/light-bare-p50-bound'
	spread_line "  memberships a lean script of their own" %.2f GO 'L/BenchmarkPoolsLatencyBound/light-lean-p50-bound'
	spread_line "  the same folded" %.2f GO 'L/BenchmarkPoolsLatencyBound/light-folded-p50-bound'
	spread_line "  the least memberships" %.2f GO 'L/BenchmarkPoolsLatencyBound/light-least-p50-bound'
	echo "one hot pool key: acquire+release pairs/s / redis-benchmark EVALSHA of the acquire script on that key (BenchmarkPoolKeyHot)"
	ratio_line "  pairs/s / EVALSHA rps" GO 'K/BenchmarkPoolKeyHot/%d/pairs/s' RPS '%d/pool' both
	bound_line "  the most the key's master allows (1 core) / EVALSHA rps" 1 GO 'K/BenchmarkPoolKeyHot/%d/hot-master-cpu-us/op' RPS '%d/pool'
	bound_line "  the most $(nproc) cores allow the servers alone / EVALSHA rps" "$(nproc)" GO 'K/BenchmarkPoolKeyHot/%d/servers-cpu-us/pair' RPS '%d/pool'
	ratio_line "  the machine's CPU, per EVALSHA / per pair" MACHINE '%d/pool/cpu-us' GO 'K/BenchmarkPoolKeyHot/%d/machine-cpu-us/pair' both
	echo "waiting for a slot: the head's grant after a release / the release's own round trip (BenchmarkWakeUp)"
	spread_line "  grant p50 / release round trip" %.2f GO 'W/BenchmarkWakeUp/%d/p50/release' both
	spread_line "  grant p99 / release round trip" %.2f GO 'W/BenchmarkWakeUp/%d/p99/release' both
	echo "waiting for a slot: 1,000 waiters of 100 users / 1,000 clients polling once a second (BenchmarkWaitCost)"
	spread_line "  Redis CPU" %.2f GO 'C/BenchmarkWaitCost/wait/poll-redis-cpu'
	echo "a pool's waiter queue: Redis CPU per waiter-second / the same clients polling once a second (BenchmarkPoolWaitCost)"
	spread_line "  1,000 waiters for 10 full pool keys (goal <= 0.6)" %.2f GO 'Q/BenchmarkPoolWaitCost/wait/poll-redis-cpu'
	if [[ -n "${SCALE[http-round-s]:-}" ]]; then
		echo "heartbeats at scale: one round of $BENCH_SCALE_SLOTS live slots in batches of 1000, median of $BENCH_SCALE_ROUNDS rounds (BenchmarkScale, once)"
		line "  round over HTTP (2 serve) / the least its CPU allows on $(nproc) cores" - "$(printf %.2f "${SCALE[http-round/cpu-bound]}")"
		line "  round through the library / the same" - "$(printf %.2f "${SCALE[round/cpu-bound]}")"
		line "  every stream also in one pool key, over HTTP / the least its CPU allows" - "$(printf %.2f "${SCALE[pooled/http-round/cpu-bound]}")"
		line "  the pool key's master, CPU per refresh: in one pool key / none" - "$(awk -v a="${SCALE[pooled/http-busiest-master-µs/refresh]}" -v b="${SCALE[http-busiest-master-µs/refresh]}" 'BEGIN { printf "%.2f", a / b }')"
	fi
	echo "allocations per HTTP acquire through the handler, metrics on (counts, not ratios)"
	line "  allocs (handler only)" "$(per_round GO 'M/BenchmarkHandlerAllocs/handler-allocs/op' | spread %.0f)"
	line "  bytes (handler only)" "$(per_round GO 'M/BenchmarkHandlerAllocs/handler-B/op' | spread %.0f)"

	echo
	echo "medians of the $BENCH_ROUNDS rounds (this machine, this run only)"
	line "" standalone "$(has_cluster && echo cluster)"
	figure_line "redis-benchmark EVALSHA rps" %.0f RPS '%d/p1' both
	figure_line "redis-benchmark EVALSHA rps -P $PIPELINE" %.0f RPS "%d/p$PIPELINE" both
	figure_line "library Acquire ops/s" %.0f GO 'A/BenchmarkAcquire/%d/ops/s' both
	figure_line "library Acquire+Release pairs/s" %.0f GO 'A/BenchmarkAcquireRelease/%d/ops/s' both
	figure_line "library HeartbeatBatch slots/s (1000 per batch)" %.0f GO 'A/BenchmarkHeartbeatBatch/%d/slots/s' both
	figure_line "library Acquire+Release pairs/s, in turns with raw" %.0f GO 'V/BenchmarkAcquireReleaseVsRaw/%d/library-pairs/s' both
	figure_line "raw rueidis Acquire+Release pairs/s" %.0f GO 'V/BenchmarkAcquireReleaseVsRaw/%d/raw-pairs/s' both
	figure_line "library client CPU us per pair" %.1f GO 'V/BenchmarkAcquireReleaseVsRaw/%d/library-cpu-us/pair' both
	figure_line "raw rueidis client CPU us per pair" %.1f GO 'V/BenchmarkAcquireReleaseVsRaw/%d/raw-cpu-us/pair' both
	figure_line "library Redis CPU us per pair (all servers)" %.1f GO 'V/BenchmarkAcquireReleaseVsRaw/%d/library-redis-cpu-us/pair' both
	figure_line "raw rueidis Redis CPU us per pair (all servers)" %.1f GO 'V/BenchmarkAcquireReleaseVsRaw/%d/raw-redis-cpu-us/pair' both
	figure_line "library Acquire+Release pairs/s (next to redis-semaphore)" %.0f GO 'S/BenchmarkAcquireRelease/%d/ops/s'
	figure_line "redis-semaphore pairs/s" %.0f SEM 'pairs/s'
	figure_line "redis-semaphore client CPU us per pair (node)" %.1f SEM 'cpu-us/pair'
	figure_line "library Redis CPU us per pair" %.1f GO 'S/BenchmarkAcquireRelease/%d/redis-cpu-us/op'
	figure_line "redis-semaphore Redis CPU us per pair" %.1f SEM 'redis-cpu-us/pair'
	figure_line "HTTP serve pairs/s" %.0f H 'max/serve/pairs/s'
	figure_line "HTTP trivial pairs/s" %.0f H 'max/trivial/pairs/s'
	figure_line "HTTP serve server CPU us per pair" %.1f H 'max/serve/server-cpu-us/pair'
	figure_line "HTTP trivial server CPU us per pair" %.1f H 'max/trivial/server-cpu-us/pair'
	figure_line "paced load, pairs/s (half of serve's max)" %.0f H 'lat/serve/offered-pairs/s'
	figure_line "HTTP serve acquire p50 us (paced)" %.0f H 'lat/serve/acquire-p50-us'
	figure_line "HTTP serve acquire p99 us (paced)" %.0f H 'lat/serve/acquire-p99-us'
	figure_line "HTTP trivial acquire p50 us (paced)" %.0f H 'lat/trivial/acquire-p50-us'
	figure_line "HTTP trivial acquire p99 us (paced)" %.0f H 'lat/trivial/acquire-p99-us'
	figure_line "CPU us per slot, POST /v1/slots/heartbeats (handler)" %.2f GO 'B/BenchmarkHeartbeatBatchHTTP/http-cpu-us/slot'
	figure_line "  Limiter.HeartbeatBatch" %.2f GO 'B/BenchmarkHeartbeatBatchHTTP/library-cpu-us/slot'
	figure_line "Redis us in commands per refresh: script" %.2f GO 'R/BenchmarkHeartbeatRefresh/%d/script-redis-us/refresh'
	figure_line "  plain ZADD XX GT + PEXPIREAT" %.2f GO 'R/BenchmarkHeartbeatRefresh/%d/plain-redis-us/refresh'
	figure_line "Redis CPU us per refresh: script" %.2f GO 'R/BenchmarkHeartbeatRefresh/%d/script-cpu-us/refresh'
	figure_line "  plain ZADD XX GT + PEXPIREAT" %.2f GO 'R/BenchmarkHeartbeatRefresh/%d/plain-cpu-us/refresh'
	figure_line "proxy: time to first chunk added by the proxy, us" %.0f GO 'P/BenchmarkProxySSE/added_ttfb_us'
	figure_line "  over a plain reverse proxy's, no pool, us" %.0f GO 'P/BenchmarkProxySSE/added_ttfb_vs_plain_us'
	figure_line "  over a plain reverse proxy's, body-keyed pool, us" %.0f GO 'P/BenchmarkProxySSE/pooled_added_ttfb_vs_plain_us'
	figure_line "  one library acquire, the goal's round trip, us" %.0f GO 'P/BenchmarkProxySSE/acquire_us'
	figure_line "proxy: us per stream, direct" %.0f GO 'P/BenchmarkProxySSE/direct_us/stream'
	figure_line "  through a plain reverse proxy" %.0f GO 'P/BenchmarkProxySSE/plain_us/stream'
	figure_line "  through the proxy" %.0f GO 'P/BenchmarkProxySSE/proxied_us/stream'
	figure_line "  through the proxy, body-keyed pool" %.0f GO 'P/BenchmarkProxySSE/pooled_us/stream'
	figure_line "proxy: streams/s, 32 clients, direct" %.0f GO 'P/BenchmarkProxySSE/direct_streams/s'
	figure_line "  through a plain reverse proxy" %.0f GO 'P/BenchmarkProxySSE/plain_streams/s'
	figure_line "  through the proxy" %.0f GO 'P/BenchmarkProxySSE/proxied_streams/s'
	figure_line "  through the proxy, body-keyed pool" %.0f GO 'P/BenchmarkProxySSE/pooled_streams/s'
	figure_line "proxy processes: streams/s, $PROXY_CLIENTS clients, plain" %.0f H 'sse/plain/streams/s'
	figure_line "  limiter proxy, no pool" %.0f H 'sse/proxy/streams/s'
	figure_line "  limiter proxy, body-keyed pool" %.0f H 'sse/pooled/streams/s'
	figure_line "  plain running the limiter's scripts" %.0f H 'sse/scripted/streams/s'
	figure_line "  plain running the limiter's scripts, and a pool key's" %.0f H 'sse/scripted-pooled/streams/s'
	figure_line "proxy processes: CPU us per stream, plain" %.0f H 'sse/plain/server-cpu-us/stream'
	figure_line "  limiter proxy, no pool" %.0f H 'sse/proxy/server-cpu-us/stream'
	figure_line "  limiter proxy, body-keyed pool" %.0f H 'sse/pooled/server-cpu-us/stream'
	figure_line "  plain running the limiter's scripts" %.0f H 'sse/scripted/server-cpu-us/stream'
	figure_line "  plain running the limiter's scripts, and a pool key's" %.0f H 'sse/scripted-pooled/server-cpu-us/stream'
	figure_line "  the load generator, per stream" %.0f H 'sse/plain/load-cpu-us/stream'
	figure_line "allocs per HTTP acquire, request and recorder included" %.0f GO 'M/BenchmarkHandlerAllocs/allocs/op'
	if [[ -n "${SCALE[http-round-s]:-}" ]]; then
		line "round of $BENCH_SCALE_SLOTS slots over HTTP, s" - "$(printf %.2f "${SCALE[http-round-s]}")"
		line "  through the library, s" - "$(printf %.2f "${SCALE[round-s]}")"
		line "  Redis CPU us per refresh, masters (+ replicas), HTTP" - "$(printf '%.1f (+%.1f)' "${SCALE[http-redis-µs/refresh]}" "${SCALE[http-replica-µs/refresh]}")"
		line "  serve CPU us per refresh; cores for a round per 20s" - "$(printf '%.2f; %.2f' "${SCALE[serve-µs/refresh]}" "${SCALE[serve-cores@20s]}")"
		line "  every stream also in one pool key: round over HTTP, s" - "$(printf %.2f "${SCALE[pooled/http-round-s]}")"
		line "    through the library, s" - "$(printf %.2f "${SCALE[pooled/round-s]}")"
		line "    Redis CPU us per refresh, masters (+ replicas), HTTP" - "$(printf '%.1f (+%.1f)' "${SCALE[pooled/http-redis-µs/refresh]}" "${SCALE[pooled/http-replica-µs/refresh]}")"
		line "    the pool key's master (the busiest), CPU us per refresh" - "$(printf %.2f "${SCALE[pooled/http-busiest-master-µs/refresh]}")"
		line "    the busiest master without the pool, CPU us per refresh" - "$(printf %.2f "${SCALE[http-busiest-master-µs/refresh]}")"
	fi
	figure_line "pools: acquire+release pairs/s joining none" %.0f GO 'O/BenchmarkPoolsAcquireRelease/%d/none-pairs/s' both
	figure_line "  joining two" %.0f GO 'O/BenchmarkPoolsAcquireRelease/%d/two-pairs/s' both
	figure_line "  acquire p50 us joining none" %.0f GO 'O/BenchmarkPoolsAcquireRelease/%d/none-acquire-p50-us' both
	figure_line "  joining two" %.0f GO 'O/BenchmarkPoolsAcquireRelease/%d/two-acquire-p50-us' both
	figure_line "  the limiter's process CPU us per pair joining none" %.1f GO 'O/BenchmarkPoolsAcquireRelease/%d/none-client-cpu-us/pair' both
	figure_line "  joining two" %.1f GO 'O/BenchmarkPoolsAcquireRelease/%d/two-client-cpu-us/pair' both
	figure_line "  the Redis servers' CPU us per pair joining none" %.1f GO 'O/BenchmarkPoolsAcquireRelease/%d/none-servers-cpu-us/pair' both
	figure_line "  joining two" %.1f GO 'O/BenchmarkPoolsAcquireRelease/%d/two-servers-cpu-us/pair' both
	figure_line "  the machine's CPU us per pair joining none" %.1f GO 'O/BenchmarkPoolsAcquireRelease/%d/none-machine-cpu-us/pair' both
	figure_line "  joining two" %.1f GO 'O/BenchmarkPoolsAcquireRelease/%d/two-machine-cpu-us/pair' both
	figure_line "  the machine's processors busy, joining none" %.2f GO 'O/BenchmarkPoolsAcquireRelease/%d/none-machine-busy' both
	figure_line "  joining two" %.2f GO 'O/BenchmarkPoolsAcquireRelease/%d/two-machine-busy' both
	figure_line "  the same, paced: joining none" %.2f GO 'O/BenchmarkPoolsAcquireRelease/%d/none-paced-machine-busy' both
	figure_line "  joining two" %.2f GO 'O/BenchmarkPoolsAcquireRelease/%d/two-paced-machine-busy' both
	figure_line "  the same, at 2,000 pairs/s: joining none" %.2f GO 'O/BenchmarkPoolsAcquireRelease/%d/none-light-machine-busy' both
	figure_line "  joining two" %.2f GO 'O/BenchmarkPoolsAcquireRelease/%d/two-light-machine-busy' both
	figure_line "  paced at half of two pools' pairs/s: pairs/s" %.0f GO 'O/BenchmarkPoolsAcquireRelease/%d/paced-pairs/s' both
	figure_line "  acquire p50 us joining none, paced" %.0f GO 'O/BenchmarkPoolsAcquireRelease/%d/none-paced-acquire-p50-us' both
	figure_line "  joining two, paced" %.0f GO 'O/BenchmarkPoolsAcquireRelease/%d/two-paced-acquire-p50-us' both
	figure_line "  the scripts alone, joining none, paced" %.0f GO 'O/BenchmarkPoolsAcquireRelease/%d/none-sent-paced-acquire-p50-us' both
	figure_line "  the scripts alone, joining two, paced" %.0f GO 'O/BenchmarkPoolsAcquireRelease/%d/two-sent-paced-acquire-p50-us' both
	figure_line "  acquire p50 us joining none, 2,000 pairs/s" %.0f GO 'O/BenchmarkPoolsAcquireRelease/%d/none-light-acquire-p50-us' both
	figure_line "  joining two, 2,000 pairs/s" %.0f GO 'O/BenchmarkPoolsAcquireRelease/%d/two-light-acquire-p50-us' both
	figure_line "  the scripts alone, joining none, 2,000 pairs/s" %.0f GO 'O/BenchmarkPoolsAcquireRelease/%d/none-sent-light-acquire-p50-us' both
	figure_line "  the scripts alone, joining two, 2,000 pairs/s" %.0f GO 'O/BenchmarkPoolsAcquireRelease/%d/two-sent-light-acquire-p50-us' both
	figure_line "  heartbeat Redis CPU us per stream, no pool" %.2f GO 'O/BenchmarkPoolsHeartbeat/%d/none-redis-cpu-us/stream' both
	figure_line "  two pools" %.2f GO 'O/BenchmarkPoolsHeartbeat/%d/two-redis-cpu-us/stream' both
	figure_line "  one hot pool key" %.2f GO 'O/BenchmarkPoolsHeartbeat/%d/hot-redis-cpu-us/stream' both
	figure_line "  of which replicas, no pool" %.2f GO 'O/BenchmarkPoolsHeartbeat/%d/none-replicas-cpu-us/stream' both
	figure_line "  of which replicas, two pools" %.2f GO 'O/BenchmarkPoolsHeartbeat/%d/two-replicas-cpu-us/stream' both
	figure_line "  heartbeat slots/s, every stream in one hot pool key" %.0f GO 'O/BenchmarkPoolsHeartbeat/%d/hot-slots/s' both
	figure_line "hot pool key: acquire+release pairs/s" %.0f GO 'K/BenchmarkPoolKeyHot/%d/pairs/s' both
	figure_line "  its master's Redis CPU us per pair" %.1f GO 'K/BenchmarkPoolKeyHot/%d/hot-master-cpu-us/op' both
	figure_line "  all the Redis servers' CPU us per pair" %.1f GO 'K/BenchmarkPoolKeyHot/%d/servers-cpu-us/pair' both
	figure_line "  the limiter's process CPU us per pair" %.1f GO 'K/BenchmarkPoolKeyHot/%d/client-cpu-us/pair' both
	figure_line "  the machine's CPU us per pair" %.1f GO 'K/BenchmarkPoolKeyHot/%d/machine-cpu-us/pair' both
	figure_line "  the machine's processors busy" %.2f GO 'K/BenchmarkPoolKeyHot/%d/machine-busy' both
	figure_line "  redis-benchmark EVALSHA acquire on the key, rps" %.0f RPS '%d/pool' both
	figure_line "    the machine's CPU us per request" %.1f MACHINE '%d/pool/cpu-us' both
	figure_line "    the machine's processors busy" %.2f MACHINE '%d/pool/busy' both
	figure_line "a pool membership's acquire script, Redis us per call" %.2f GO 'L/BenchmarkAcquireParts/whole-redis-µs/call'
	figure_line "  of which the call itself (a script returning 1)" %.2f GO 'L/BenchmarkAcquireParts/call-redis-µs/call'
	figure_line "  the membership's record" %.2f GO 'L/BenchmarkAcquireParts/record-redis-µs/call'
	figure_line "  pruning expired members" %.2f GO 'L/BenchmarkAcquireParts/prune-redis-µs/call'
	figure_line "  reading the key's override" %.2f GO 'L/BenchmarkAcquireParts/override-redis-µs/call'
	figure_line "  looking at the key's queue" %.2f GO 'L/BenchmarkAcquireParts/queue-redis-µs/call'
	figure_line "  its release script, Redis us per call" %.2f GO 'L/BenchmarkAcquireParts/release-redis-µs/call'
	figure_line "Redis CPU us per pair, pipelined: joining none" %.1f GO 'L/BenchmarkPoolsBound/none-redis-cpu-µs/pair'
	figure_line "  joining two, as sent" %.1f GO 'L/BenchmarkPoolsBound/sent-redis-cpu-µs/pair'
	figure_line "  the pools' work inside the user's call" %.1f GO 'L/BenchmarkPoolsBound/inside-redis-cpu-µs/pair'
	figure_line "  memberships stripped to the slot, inside it" %.1f GO 'L/BenchmarkPoolsBound/bare-redis-cpu-µs/pair'
	figure_line "  memberships a lean script of their own" %.1f GO 'L/BenchmarkPoolsBound/lean-redis-cpu-µs/pair'
	figure_line "  the same folded" %.1f GO 'L/BenchmarkPoolsBound/folded-redis-cpu-µs/pair'
	figure_line "  the least memberships" %.1f GO 'L/BenchmarkPoolsBound/least-redis-cpu-µs/pair'
	figure_line "acquire p50 us by rueidis alone, paced: joining none" %.0f GO 'L/BenchmarkPoolsLatencyBound/paced-none-acquire-p50-µs'
	figure_line "  joining two, as sent" %.0f GO 'L/BenchmarkPoolsLatencyBound/paced-sent-acquire-p50-µs'
	figure_line "  memberships stripped to the slot, inside the user's call" %.0f GO 'L/BenchmarkPoolsLatencyBound/paced-bare-acquire-p50-µs'
	figure_line "acquire p50 us by rueidis alone, 2,000 pairs/s: joining none" %.0f GO 'L/BenchmarkPoolsLatencyBound/light-none-acquire-p50-µs'
	figure_line "  joining two, as sent" %.0f GO 'L/BenchmarkPoolsLatencyBound/light-sent-acquire-p50-µs'
	figure_line "grant after a release, p50 us (BenchmarkWakeUp)" %.0f GO 'W/BenchmarkWakeUp/%d/p50-us' both
	figure_line "  p99 us" %.0f GO 'W/BenchmarkWakeUp/%d/p99-us' both
	figure_line "  the release's round trip, p50 us" %.0f GO 'W/BenchmarkWakeUp/%d/release-us' both
	figure_line "Redis commands per waiter-second (BenchmarkWaitCost)" %.2f GO 'C/BenchmarkWaitCost/cmds/waiter-s'
	figure_line "  Redis CPU us per waiter-second" %.1f GO 'C/BenchmarkWaitCost/redis-cpu-us/waiter-s'
	figure_line "  polling once a second: commands per client-second" %.2f GO 'C/BenchmarkWaitCost/poll-cmds/client-s'
	figure_line "  polling once a second: Redis CPU us per client-second" %.1f GO 'C/BenchmarkWaitCost/poll-redis-cpu-us/client-s'
	figure_line "Redis commands per waiter-second (BenchmarkPoolWaitCost)" %.2f GO 'Q/BenchmarkPoolWaitCost/cmds/waiter-s'
	figure_line "  Redis CPU us per waiter-second" %.1f GO 'Q/BenchmarkPoolWaitCost/redis-cpu-us/waiter-s'
	figure_line "  polling once a second: commands per client-second" %.2f GO 'Q/BenchmarkPoolWaitCost/poll-cmds/client-s'
	figure_line "  polling once a second: Redis CPU us per client-second" %.1f GO 'Q/BenchmarkPoolWaitCost/poll-redis-cpu-us/client-s'
}
