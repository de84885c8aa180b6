#!/usr/bin/env bash
# Starts and stops the Redis servers the tests run against.
#
#   hack/redis-cluster.sh start DIR [all|standalone|cluster]   (default: all)
#   hack/redis-cluster.sh stop DIR
#
# start runs a standalone redis-server and/or a 6-node Redis Cluster (3 masters,
# 3 replicas) on free random ports of 127.0.0.1, each server daemonized with its
# own directory DIR/<port>. It returns once every node reports cluster_state:ok,
# every node sees the same owners for all 16384 slots and every replica's link
# to its master is up. It writes DIR/env and prints the same lines on stdout:
#
#   export LIMITER_TEST_REDIS=127.0.0.1:PORT
#   export LIMITER_TEST_REDIS_CLUSTER=127.0.0.1:P1,...,127.0.0.1:P6
#
# Progress and errors go to stderr, so `eval "$(hack/redis-cluster.sh start DIR)"`
# works. Several instances may run at once: ports are drawn at random from
# 20000-29999 (the cluster bus uses port+10000) and a port that turns out to be
# busy is replaced by another one.
#
# stop signals every server DIR/pids names (SIGTERM, then SIGKILL after a few
# seconds). It is idempotent and never fails because a server is already gone.
set -euo pipefail

readonly PORT_MIN=20000 PORT_SPAN=10000 BUS_OFFSET=10000
readonly READY_TIMEOUT=30 # seconds, for the cluster to converge
readonly CREATE_TIMEOUT=20 # seconds, for redis-cli to see the nodes join
readonly CREATE_ATTEMPTS=3 # sets of 6 nodes tried before giving up
readonly BOOT_TIMEOUT=10  # seconds, for one server to accept connections

log() { printf '%s\n' "redis-cluster: $*" >&2; }
die() {
	log "error: $*"
	exit 1
}

usage() {
	echo "usage: $0 start DIR [all|standalone|cluster] | stop DIR" >&2
	exit 2
}

rcli() { # rcli PORT ARGS...: redis-cli against 127.0.0.1:PORT, CRs stripped
	local port=$1
	shift
	redis-cli -h 127.0.0.1 -p "$port" "$@" 2>/dev/null | tr -d '\r'
}

port_in_use() { # port_in_use PORT: true if something listens on or answers at PORT
	local port=$1
	if command -v ss >/dev/null 2>&1 && [[ -n "$(ss -Htln "sport = :$port" 2>/dev/null)" ]]; then
		return 0
	fi
	(exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null
}

declare -A TAKEN=() # ports this run already uses or gave up on

pick_port() { # pick_port [cluster]: prints a free port (and, for cluster, a free bus port)
	local want_bus=${1:-} port i
	for ((i = 0; i < 500; i++)); do
		port=$((PORT_MIN + (RANDOM * 32768 + RANDOM) % PORT_SPAN))
		[[ -z "${TAKEN[$port]:-}" ]] || continue
		port_in_use "$port" && continue
		if [[ -n "$want_bus" ]]; then
			[[ -z "${TAKEN[$((port + BUS_OFFSET))]:-}" ]] || continue
			port_in_use "$((port + BUS_OFFSET))" && continue
		fi
		echo "$port"
		return 0
	done
	die "no free port found in $PORT_MIN-$((PORT_MIN + PORT_SPAN - 1))"
}

debug_command_args() { # --enable-debug-command exists from Redis 7.0 on
	local version major
	version=$(redis-server --version | sed -n 's/.* v=\([0-9][0-9]*\)\..*/\1/p')
	major=${version:-0}
	if ((major >= 7)); then
		echo "--enable-debug-command yes"
	fi
}

# launch PORT MODE: starts one daemonized server. Returns 0 once it answers on
# PORT as the process whose pid it wrote, 1 if it could not bind (the caller
# retries on another port).
launch() {
	local port=$1 mode=$2 node="$DIR/$1"
	mkdir -p "$node"
	local args=(
		--port "$port" --bind 127.0.0.1
		--daemonize yes --pidfile "$node/redis.pid"
		--dir "$node" --logfile "$node/redis.log"
		--save '' --appendonly no
		--maxmemory-policy noeviction
	)
	# shellcheck disable=SC2207
	args+=($(debug_command_args))
	if [[ "$mode" == cluster ]]; then
		args+=(
			--cluster-enabled yes
			--cluster-config-file "$node/nodes.conf"
			--cluster-node-timeout 1000
			# A replica's full sync starts at once, not after the 5 s default
			# wait for more replicas: startup and resync after failover are quicker.
			--repl-diskless-sync-delay 0
		)
	fi
	# Configuration errors surface here, before redis-server forks.
	if ! redis-server "${args[@]}" </dev/null >"$node/start.out" 2>&1; then
		cat "$node/start.out" >&2
		die "redis-server refused to start on port $port"
	fi

	local deadline=$((SECONDS + BOOT_TIMEOUT)) pid=""
	while ((SECONDS < deadline)); do
		# Redis writes its pid file only after it has bound both its ports.
		if [[ -z "$pid" && -s "$node/redis.pid" ]]; then
			pid=$(<"$node/redis.pid")
			echo "$port $pid" >>"$DIR/pids"
		fi
		if [[ -n "$pid" ]]; then
			if [[ "$(rcli "$port" info server | sed -n 's/^process_id://p')" == "$pid" ]]; then
				return 0
			fi
		elif grep -qE 'Address already in use|Failed listening|aborting' "$node/redis.log" 2>/dev/null; then
			log "port $port is busy, trying another one"
			rm -rf "$node"
			return 1
		fi
		sleep 0.05
	done
	log "redis-server on port $port did not come up within ${BOOT_TIMEOUT}s; its log:"
	tail -n 20 "$node/redis.log" >&2 2>/dev/null || true
	die "redis-server on port $port did not start"
}

STARTED_PORT=""

start_server() { # start_server MODE: starts one server on a free port, sets STARTED_PORT
	local mode=$1 port attempt bus=""
	[[ "$mode" == cluster ]] && bus=bus
	for ((attempt = 0; attempt < 20; attempt++)); do
		port=$(pick_port $bus)
		TAKEN[$port]=1
		TAKEN[$((port + BUS_OFFSET))]=1
		if launch "$port" "$mode"; then
			STARTED_PORT=$port
			return 0
		fi
	done
	die "could not start a $mode redis-server after $attempt attempts"
}

CLUSTER_PORTS=()

start_cluster_nodes() { # starts the 6 nodes of a cluster, sets CLUSTER_PORTS
	local i
	CLUSTER_PORTS=()
	for ((i = 0; i < 6; i++)); do
		start_server cluster
		CLUSTER_PORTS+=("$STARTED_PORT")
	done
}

# create_cluster ADDRS...: makes the 6 nodes a cluster, the first three the
# masters and the last three their replicas; false if redis-cli fails or
# the nodes have not joined within CREATE_TIMEOUT.
create_cluster() {
	log "creating cluster on $*"
	if ! timeout "$CREATE_TIMEOUT" redis-cli --cluster create "$@" \
		--cluster-replicas 1 --cluster-yes </dev/null >"$DIR/cluster-create.log" 2>&1; then
		cat "$DIR/cluster-create.log" >&2
		return 1
	fi
}

report_nodes() { # report_nodes PORTS...: each node's view of the cluster, on stderr
	local port
	for port in "$@"; do
		echo "--- 127.0.0.1:$port" >&2
		rcli "$port" cluster info | grep -E 'cluster_state|slots_(ok|assigned)|known_nodes' >&2 || true
		rcli "$port" cluster nodes >&2 || true
		rcli "$port" info replication | grep -E '^(role|master_link_status):' >&2 || true
		tail -n 5 "$DIR/$port/redis.log" >&2 2>/dev/null || true
	done
}

# cluster_ready PORTS...: true when every node reports cluster_state:ok with all
# slots ok, knows exactly the 6 nodes with none failing, all nodes agree on the
# slot owners, and every replica's link to its master is up.
cluster_ready() {
	local port info nodes signature="" sig
	for port in "$@"; do
		info=$(rcli "$port" cluster info) || return 1
		grep -qx 'cluster_state:ok' <<<"$info" || return 1
		grep -qx 'cluster_slots_ok:16384' <<<"$info" || return 1
		grep -qx "cluster_known_nodes:$#" <<<"$info" || return 1

		nodes=$(rcli "$port" cluster nodes) || return 1
		[[ $(grep -c . <<<"$nodes") -eq $# ]] || return 1
		# Every node healthy and linked: no fail?, handshake or noaddr flags.
		awk '$3 ~ /fail|handshake|noaddr/ || $8 != "connected" { bad = 1 } END { exit !bad }' <<<"$nodes" && return 1
		# Owners of the slots: "<master id> <ranges...>" sorted.
		sig=$(awk '$3 ~ /master/ { printf "%s", $1; for (i = 9; i <= NF; i++) printf " %s", $i; print "" }' <<<"$nodes" | sort)
		[[ $(grep -c . <<<"$sig") -eq 3 ]] || return 1
		if [[ -z "$signature" ]]; then
			signature=$sig
		elif [[ "$sig" != "$signature" ]]; then
			return 1
		fi

		if rcli "$port" info replication | grep -qx 'role:slave'; then
			rcli "$port" info replication | grep -qx 'master_link_status:up' || return 1
		fi
	done
}

start() {
	local what=${1:-all}
	case "$what" in all | standalone | cluster) ;; *) usage ;; esac
	command -v redis-server >/dev/null || die "redis-server is not installed (apt-get install redis-server)"
	command -v redis-cli >/dev/null || die "redis-cli is not installed (apt-get install redis-tools)"

	mkdir -p "$DIR"
	DIR=$(cd "$DIR" && pwd)
	# Whatever fails from here on, leave nothing running.
	trap 'rc=$?; if ((rc != 0)); then stop >/dev/null 2>&1 || true; fi' EXIT

	local env=() port
	if [[ "$what" == all || "$what" == standalone ]]; then
		start_server standalone
		port=$STARTED_PORT
		log "standalone redis on 127.0.0.1:$port"
		env+=("export LIMITER_TEST_REDIS=127.0.0.1:$port")
	fi

	if [[ "$what" == all || "$what" == cluster ]]; then
		local ports=() addrs=() attempt
		for ((attempt = 1; ; attempt++)); do
			start_cluster_nodes
			ports=("${CLUSTER_PORTS[@]}")
			addrs=("${ports[@]/#/127.0.0.1:}")
			create_cluster "${addrs[@]}" && break
			# Seen once under a loaded machine: the nodes never agreed and
			# redis-cli waited for the join until the timeout. New nodes
			# on new ports join like any others.
			report_nodes "${ports[@]}"
			((attempt < CREATE_ATTEMPTS)) ||
				die "redis-cli --cluster create failed $attempt times (log: $DIR/cluster-create.log)"
			log "the cluster did not form (attempt $attempt of $CREATE_ATTEMPTS); starting 6 new nodes"
			stop_ports "${ports[@]}"
		done
		local deadline=$((SECONDS + READY_TIMEOUT))
		until cluster_ready "${ports[@]}"; do
			if ((SECONDS >= deadline)); then
				report_nodes "${ports[@]}"
				die "cluster did not converge within ${READY_TIMEOUT}s (logs: $DIR/*/redis.log)"
			fi
			sleep 0.2
		done
		log "cluster ready"
		env+=("export LIMITER_TEST_REDIS_CLUSTER=$(IFS=,; echo "${addrs[*]}")")
	fi

	printf '%s\n' "${env[@]}" >"$DIR/env"
	cat "$DIR/env"
}

is_redis() { # is_redis PID: true if PID is alive and is a redis-server
	[[ -r "/proc/$1/cmdline" ]] || return 1
	tr '\0' ' ' <"/proc/$1/cmdline" | grep -q 'redis-server'
}

stop() {
	[[ -f "$DIR/pids" ]] || return 0
	local pids=() port pid
	while read -r port pid; do
		[[ "$pid" =~ ^[0-9]+$ ]] && pids+=("$pid")
	done <"$DIR/pids"
	stop_pids "${pids[@]}"
}

# stop_ports PORTS...: stops the servers of this DIR on PORTS and forgets them.
stop_ports() {
	local pids=() port pid p
	while read -r port pid; do
		for p in "$@"; do
			[[ "$port" == "$p" && "$pid" =~ ^[0-9]+$ ]] && pids+=("$pid")
		done
	done <"$DIR/pids"
	stop_pids "${pids[@]}"
	for p in "$@"; do
		awk -v p="$p" '$1 != p' "$DIR/pids" >"$DIR/pids.new" && mv "$DIR/pids.new" "$DIR/pids"
		rm -rf "${DIR:?}/$p"
	done
}

# stop_pids PIDS...: SIGTERM to each that is a redis-server, SIGKILL to
# those still there after 5 s.
stop_pids() {
	local pids=() pid i
	for pid in "$@"; do
		if is_redis "$pid"; then
			pids+=("$pid")
			kill -TERM "$pid" 2>/dev/null || true
		fi
	done
	for ((i = 0; i < 50; i++)); do
		local alive=0
		for pid in "${pids[@]}"; do
			is_redis "$pid" && alive=1
		done
		((alive)) || break
		sleep 0.1
	done
	for pid in "${pids[@]}"; do
		if is_redis "$pid"; then
			kill -KILL "$pid" 2>/dev/null || true
		fi
	done
	return 0
}

[[ $# -ge 2 ]] || usage
cmd=$1
DIR=$2
shift 2
case "$cmd" in
start) start "$@" ;;
stop)
	[[ $# -eq 0 ]] || usage
	stop
	;;
*) usage ;;
esac
