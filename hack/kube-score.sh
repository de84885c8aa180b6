#!/usr/bin/env bash
# Install (once) the pinned kube-score the chart tests run on the rendered
# chart, and print its path as the LAST line on stdout (progress goes to
# stderr), so callers can do:
#
#   export LIMITER_KUBE_SCORE=$(bash hack/kube-score.sh | tail -1)
#
# kube-score is built from its Go module (no binary downloads) into a cache
# outside the clone: ${LIMITER_CACHE:-$HOME/.cache/limiter}/bin/kube-score-<version>/kube-score.
# With a warm cache the script returns immediately.
#
# With --cached it installs nothing: it prints the path and exits 0 when
# kube-score is cached, and exits 1 otherwise.
set -euo pipefail
# shellcheck source=hack/lib/install.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/install.sh"

KUBE_SCORE_VERSION="v1.20.0"

cache="${LIMITER_CACHE:-$HOME/.cache/limiter}"
bin_dir="$cache/bin/kube-score-$KUBE_SCORE_VERSION"
kube_score="$bin_dir/kube-score"

build() {
	echo "kube-score.sh: installing kube-score $KUBE_SCORE_VERSION into $bin_dir" >&2
	# The ldflags stamp the version as upstream's release build does.
	go_install "$bin_dir" "-X main.version=${KUBE_SCORE_VERSION#v}" \
		"github.com/zegl/kube-score/cmd/kube-score@$KUBE_SCORE_VERSION"
}

answer_cached "$kube_score" "${1:-}"
install_once "$bin_dir" "$kube_score" go build

"$kube_score" version >&2
printf '%s\n' "$kube_score"
