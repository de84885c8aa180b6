#!/usr/bin/env bash
# Install (once) promtool, Prometheus's own rule tester, which the incident
# drill and the pool alert test (e2e) run on config/observability/alerts.yaml,
# and print its path as the LAST line on stdout (progress goes to stderr), so
# callers can do:
#
#   export LIMITER_PROMTOOL=$(bash hack/promtool.sh | tail -1)
#
# It comes from Debian's prometheus package when apt offers one of at least
# PROMTOOL_MIN_VERSION: only promtool is taken out of the downloaded .deb, so
# no Prometheus server is installed or started. Otherwise it is built from the
# pinned Go module, which compiles most of the Prometheus module tree (the
# longest build of `make test` on a new machine). Either lands in a cache
# outside the clone, ${LIMITER_CACHE:-$HOME/.cache/limiter}/bin/:
#   promtool-debian/promtool          Debian's
#   promtool-<version>/promtool       built from source
# and with a warm cache the script returns immediately.
#
# With --cached it installs nothing: it prints the path and exits 0 when
# promtool is cached, and exits 1 otherwise.
set -euo pipefail
# shellcheck source=hack/lib/install.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/install.sh"

# The oldest promtool the rule tests (the drill's and the pool alert's) have
# been run on and pass with: Debian 12's.
PROMTOOL_MIN_VERSION="2.42.0"
# The Go module version of Prometheus built where Debian's will not do
# (v0.316.0 is Prometheus 3.16.0).
PROMTOOL_VERSION="v0.316.0"

cache="${LIMITER_CACHE:-$HOME/.cache/limiter}"
source_dir="$cache/bin/promtool-$PROMTOOL_VERSION"
debian_dir="$cache/bin/promtool-debian"

# recent_enough EXE: whether EXE is a promtool of PROMTOOL_MIN_VERSION or later.
recent_enough() {
	local version
	[[ -x "$1" ]] || return 1
	version=$("$1" --version 2>/dev/null | awk 'NR == 1 { print $3 }')
	[[ -n "$version" ]] && dpkg --compare-versions "$version" ge "$PROMTOOL_MIN_VERSION" 2>/dev/null
}

# cached: the promtool already installed, the pinned build first.
cached() {
	if [[ -x "$source_dir/promtool" ]]; then
		printf '%s\n' "$source_dir/promtool"
	elif recent_enough "$debian_dir/promtool"; then
		printf '%s\n' "$debian_dir/promtool"
	fi
}

# from_debian: take promtool out of Debian's prometheus package, if apt has
# one recent enough.
from_debian() {
	local version
	command -v apt-get >/dev/null 2>&1 && command -v dpkg-deb >/dev/null 2>&1 || {
		echo "promtool.sh: no apt here: building promtool from source" >&2
		return 1
	}
	version=$(apt_candidate prometheus)
	if [[ -z "$version" ]]; then
		echo "promtool.sh: apt offers no prometheus package: building promtool from source" >&2
		return 1
	fi
	if ! dpkg --compare-versions "$version" ge "$PROMTOOL_MIN_VERSION"; then
		echo "promtool.sh: Debian's prometheus is $version, older than $PROMTOOL_MIN_VERSION: building promtool from source" >&2
		return 1
	fi
	echo "promtool.sh: taking promtool $version from Debian's prometheus package into $debian_dir" >&2
	mkdir -p "$debian_dir"
	apt_extract prometheus usr/bin/promtool "$debian_dir/promtool" || {
		echo "promtool.sh: could not take promtool out of Debian's prometheus package: building it from source" >&2
		return 1
	}
}

from_source() {
	command -v go >/dev/null 2>&1 || {
		echo "promtool.sh: go not found in PATH" >&2
		return 1
	}
	echo "promtool.sh: building promtool $PROMTOOL_VERSION into $source_dir (takes many minutes)" >&2
	mkdir -p "$source_dir"
	go_install "$source_dir" "-X github.com/prometheus/common/version.Version=${PROMTOOL_VERSION#v}" \
		"github.com/prometheus/prometheus/cmd/promtool@$PROMTOOL_VERSION"
}

promtool=$(cached)
if [[ "${1:-}" == --cached ]]; then
	[[ -n "$promtool" ]] || exit 1
	printf '%s\n' "$promtool"
	exit 0
fi
if [[ -z "$promtool" ]]; then
	# One lock for both ways, so that concurrent cold runs install once.
	mkdir -p "$cache/bin"
	hold_lock "$cache/bin/.promtool.lock"
	promtool=$(cached)
fi
if [[ -z "$promtool" ]]; then
	if from_debian; then
		promtool="$debian_dir/promtool"
	else
		from_source
		promtool="$source_dir/promtool"
	fi
fi

"$promtool" --version >&2
printf '%s\n' "$promtool"
