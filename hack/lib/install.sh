# shellcheck shell=bash
# How the hack/ scripts install what they need: sourced by them, not run.
#
#   install_once DIR EXE NEEDS COMMAND...
#       Unless EXE is executable: fail (exit 1) when a tool of NEEDS (names,
#       space separated; "" for none) is not in PATH, create DIR, take
#       DIR/.lock so that concurrent cold runs install once, and run
#       COMMAND... unless a run that held the lock before installed EXE.
#       The lock is held until the script exits.
#   hold_lock FILE
#       Take the lock FILE (where flock is installed), held until the
#       script exits.
#   answer_cached EXE ARG
#       The tool scripts' --cached argument: when ARG is --cached, exit
#       without installing anything, 0 printing EXE if it is executable,
#       1 otherwise. hack/test.sh asks first so that it can say what it is
#       about to build.
#   go_install DIR LDFLAGS PKG@VERSION
#       Build PKG@VERSION stripped, with LDFLAGS, into DIR, outside any
#       module and workspace so that the clone's go.mod is left alone; go's
#       output goes to stderr.
#   apt_install PACKAGE...
#       Install Debian packages, through sudo unless root.
#   apt_provide TOOL=PACKAGE...
#       Install, in one apt_install, the package of each TOOL that is not
#       in PATH (TOOL=P1,P2 for several packages), saying which first.
#   apt_extract PACKAGE FILE DEST
#       Download the .deb of PACKAGE that apt would install and copy FILE
#       (its path in the package, e.g. usr/bin/promtool) to DEST: nothing
#       is installed, so no service starts and no other package comes along.
#   apt_candidate PACKAGE
#       Print the upstream version of PACKAGE that apt would install (epoch
#       and Debian revision stripped; 2.42.0+ds for 2.42.0+ds-5+deb12u1), or
#       nothing when apt has none.
#   install_tools SPEC...
#       Run tool scripts side by side (the scripts above, which print the
#       tool's path as their last line), wait for all, and export each
#       path. SPEC is VAR|SCRIPT|WHAT: the variable to export, the script,
#       and what it builds for which tests, said before it builds (a script
#       run with --cached exits 1 when it would). Each script logs to a file
#       of its own; one that fails is named and its log shown, and
#       install_tools returns 1 once the others are done too.
#
# The apt functions refresh the package lists first and hold
# $LIMITER_CACHE/.apt.lock meanwhile: test.sh runs the tool scripts side by
# side, and a second apt-get update fails at once instead of waiting.

install_once() {
	local dir=$1 exe=$2 needs=$3 tool
	shift 3
	if [[ -x "$exe" ]]; then
		return 0
	fi
	for tool in $needs; do
		command -v "$tool" >/dev/null 2>&1 || {
			echo "${0##*/}: $tool not found in PATH" >&2
			exit 1
		}
	done
	mkdir -p "$dir"
	hold_lock "$dir/.lock"
	if [[ ! -x "$exe" ]]; then
		"$@"
	fi
}

hold_lock() {
	if command -v flock >/dev/null 2>&1; then
		exec 9>"$1"
		flock 9
	fi
}

answer_cached() {
	local exe=$1 arg=$2
	[[ "$arg" == --cached ]] || return 0
	[[ -x "$exe" ]] || exit 1
	printf '%s\n' "$exe"
	exit 0
}

# go_install builds a tool the tests run, without the compiler's
# optimisations and inlining (-N -l): a tool renders or checks a few files
# per test, and a cold build of it is minutes of a cold `make test`.
go_install() {
	local dir=$1 ldflags=$2 pkg=$3
	(cd "$dir" && GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0 GOBIN="$dir" \
		go install -trimpath -gcflags "all=-N -l" -ldflags "-s -w $ldflags" "$pkg" >&2)
}

apt_install() {
	apt_locked apt_update
	apt_locked as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 \
		install -y -qq --no-install-recommends "$@"
}

apt_provide() {
	local spec add packages=()
	for spec in "$@"; do
		if ! command -v "${spec%%=*}" >/dev/null 2>&1; then
			IFS=, read -ra add <<<"${spec#*=}"
			packages+=("${add[@]}")
		fi
	done
	((${#packages[@]})) || return 0
	# One package can provide several tools: each is named once.
	mapfile -t packages < <(printf '%s\n' "${packages[@]}" | sort -u)
	echo "${0##*/}: installing ${packages[*]} (apt)" >&2
	apt_install "${packages[@]}"
}

apt_extract() {
	local pkg=$1 file=$2 dest=$3 dir deb
	dir=$(mktemp -d "${TMPDIR:-/tmp}/limiter-deb.XXXXXX")
	# The download runs as us, not as apt's sandbox user, who could not
	# write into our private directory.
	if ! (cd "$dir" && apt_locked apt-get -qq -o APT::Sandbox::User="$(id -un)" download "$pkg" >&2); then
		rm -rf "$dir"
		return 1
	fi
	deb=("$dir"/*.deb)
	if ! dpkg-deb --fsys-tarfile "${deb[0]}" | tar -xOf - "./$file" >"$dest.tmp.$$"; then
		rm -rf "$dir" "$dest.tmp.$$"
		return 1
	fi
	rm -rf "$dir"
	chmod 755 "$dest.tmp.$$"
	mv -f "$dest.tmp.$$" "$dest"
}

apt_candidate() {
	local version
	if ! apt_locked apt_update; then
		echo "could not refresh apt's package lists: reading them as they are" >&2
	fi
	version=$(apt-cache policy "$1" | awk '$1 == "Candidate:" { print $2 }')
	[[ -n "$version" && "$version" != "(none)" ]] || return 0
	version=${version#*:}
	printf '%s\n' "${version%-*}"
}

# apt_update refreshes the package lists. While another apt-get update
# holds their lock, it fails at once (DPkg::Lock::Timeout waits for the
# dpkg lock only): try again, for up to 10 minutes.
apt_update() {
	local out try
	for ((try = 0; try < 120; try++)); do
		out=$(as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq 2>&1) && return 0
		[[ "$out" == *"Could not get lock"* ]] || break
		sleep 5
	done
	printf '%s\n' "$out" >&2
	return 1
}

# apt_locked COMMAND... runs COMMAND holding $LIMITER_CACHE/.apt.lock.
apt_locked() {
	local lock=${LIMITER_CACHE:-$HOME/.cache/limiter}/.apt.lock
	mkdir -p "${lock%/*}"
	(
		if command -v flock >/dev/null 2>&1; then
			flock 8
		fi
		"$@"
	) 8>"$lock"
}

# as_root COMMAND... runs COMMAND as root, through sudo unless root.
as_root() {
	if [[ $(id -u) -eq 0 ]]; then
		"$@"
		return
	fi
	command -v sudo >/dev/null || {
		echo "need root or sudo to run: $*" >&2
		exit 1
	}
	sudo "$@"
}

# install_tools_pids are the scripts install_tools is waiting for, which
# stop_tools stops when the caller exits early (an interrupt).
install_tools_pids=()

install_tools() {
	local cache=${LIMITER_CACHE:-$HOME/.cache/limiter} logs spec var script what pid rc failed=() building=0
	local -A var_of=() name_of=() start_of=()
	local old_exit old_int old_term
	old_exit=$(trap -p EXIT) old_int=$(trap -p INT) old_term=$(trap -p TERM)
	logs=$(mktemp -d "${TMPDIR:-/tmp}/limiter-tools.XXXXXX")
	trap stop_tools EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM
	for spec in "$@"; do
		IFS='|' read -r var script what <<<"$spec"
		if ! bash "$script" --cached >/dev/null 2>&1; then
			printf '==> %s, once; cached in %s\n' "$what" "$cache"
			building=1
		fi
		bash "$script" </dev/null >"$logs/$var.out" 2>"$logs/$var.log" &
		var_of[$!]=$var name_of[$!]=$script start_of[$!]=$SECONDS
		install_tools_pids+=("$!")
	done
	if ((!building)); then
		printf '==> test tools: cached in %s\n' "$cache"
	fi
	while ((${#var_of[@]})); do
		rc=0
		wait -n -p pid "${!var_of[@]}" || rc=$?
		var=${var_of[$pid]} script=${name_of[$pid]}
		unset "var_of[$pid]"
		if ((rc != 0)); then
			failed+=("$script")
			printf '==> %s failed (exit %d) after %ds; its log (the last 60 lines of %s):\n' \
				"$script" "$rc" "$((SECONDS - start_of[$pid]))" "$logs/$var.log" >&2
			tail -n 60 "$logs/$var.log" | sed 's/^/    /' >&2
			continue
		fi
		export "$var=$(tail -n 1 "$logs/$var.out")"
		if ((SECONDS - start_of[$pid] > 1)); then
			printf '    %s ready after %ds: %s\n' "$script" "$((SECONDS - start_of[$pid]))" "${!var}"
		fi
	done
	install_tools_pids=()
	eval "${old_exit:-trap - EXIT}"
	eval "${old_int:-trap - INT}"
	eval "${old_term:-trap - TERM}"
	if ((${#failed[@]})); then
		echo "==> could not install the tools of ${failed[*]} (logs in $logs)" >&2
		return 1
	fi
	rm -rf "$logs"
}

# stop_tools stops the scripts install_tools started and everything they
# started (go build's compilers, npm).
stop_tools() {
	local pid tree=()
	for pid in "${install_tools_pids[@]}"; do
		descendants "$pid"
	done
	((${#tree[@]})) && kill -TERM "${tree[@]}" 2>/dev/null
	return 0
}

# descendants PID appends PID and its descendants to the caller's tree.
descendants() {
	local child
	tree+=("$1")
	for child in $(pgrep -P "$1" 2>/dev/null); do
		descendants "$child"
	done
}
