#!/usr/bin/env bash
# Install (once) the pinned promtool, Prometheus's own rule tester, which the
# incident drill (e2e) runs on config/observability/alerts.yaml, and print its
# path as the LAST line on stdout (progress goes to stderr), so callers can do:
#
#   export LIMITER_PROMTOOL=$(bash hack/promtool.sh | tail -1)
#
# promtool is built from its Go module (no binary downloads) into a cache
# outside the clone: ${LIMITER_CACHE:-$HOME/.cache/limiter}/bin/promtool-<version>/promtool.
# A cold build takes several minutes; with a warm cache the script returns
# immediately. Where the module cannot be built, Debian's prometheus package
# (which ships promtool) is installed instead.
set -euo pipefail
# shellcheck source=hack/lib/install.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/install.sh"

# The Go module version of Prometheus (v0.316.0 is Prometheus 3.16.0).
PROMTOOL_VERSION="v0.316.0"

cache="${LIMITER_CACHE:-$HOME/.cache/limiter}"
bin_dir="$cache/bin/promtool-$PROMTOOL_VERSION"
promtool="$bin_dir/promtool"

build() {
	command -v go >/dev/null 2>&1 || {
		echo "promtool.sh: go not found in PATH" >&2
		return 1
	}
	echo "promtool.sh: installing promtool $PROMTOOL_VERSION into $bin_dir (takes several minutes)" >&2
	go_install "$bin_dir" "-X github.com/prometheus/common/version.Version=${PROMTOOL_VERSION#v}" \
		"github.com/prometheus/prometheus/cmd/promtool@$PROMTOOL_VERSION"
}

debian() {
	echo "promtool.sh: building promtool failed; installing Debian's prometheus package for its promtool" >&2
	apt_install prometheus >&2
	ln -sf "$(command -v promtool)" "$promtool"
}

# go is not needed up front: without it, Debian's package is installed.
build_or_debian() { build || debian; }

install_once "$bin_dir" "$promtool" "" build_or_debian

"$promtool" --version >&2
printf '%s\n' "$promtool"
