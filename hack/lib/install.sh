# shellcheck shell=bash
# How the hack/ scripts install what they need: sourced by them, not run.
#
#   install_once DIR EXE NEEDS COMMAND...
#       Unless EXE is executable: fail (exit 1) when a tool of NEEDS (names,
#       space separated; "" for none) is not in PATH, create DIR, take
#       DIR/.lock so that concurrent cold runs install once, and run
#       COMMAND... unless a run that held the lock before installed EXE.
#       The lock is held until the script exits.
#   go_install DIR LDFLAGS PKG@VERSION
#       Build PKG@VERSION stripped, with LDFLAGS, into DIR, outside any
#       module and workspace so that the clone's go.mod is left alone; go's
#       output goes to stderr.
#   apt_install PACKAGE...
#       Install Debian packages, through sudo unless root.

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
	if command -v flock >/dev/null 2>&1; then
		exec 9>"$dir/.lock"
		flock 9
	fi
	if [[ ! -x "$exe" ]]; then
		"$@"
	fi
}

go_install() {
	local dir=$1 ldflags=$2 pkg=$3
	(cd "$dir" && GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0 GOBIN="$dir" \
		go install -trimpath -ldflags "-s -w $ldflags" "$pkg" >&2)
}

apt_install() {
	local sudo=()
	if [[ $(id -u) -ne 0 ]]; then
		command -v sudo >/dev/null || {
			echo "need root or sudo to install: $*" >&2
			exit 1
		}
		sudo=(sudo)
	fi
	# Lock::Timeout waits for another apt-get instead of failing at once.
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -qq
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 \
		install -y -qq --no-install-recommends "$@"
}
