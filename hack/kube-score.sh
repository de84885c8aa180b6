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
set -euo pipefail

KUBE_SCORE_VERSION="v1.20.0"

cache="${LIMITER_CACHE:-$HOME/.cache/limiter}"
bin_dir="$cache/bin/kube-score-$KUBE_SCORE_VERSION"
kube_score="$bin_dir/kube-score"

if [[ ! -x "$kube_score" ]]; then
	command -v go >/dev/null 2>&1 || {
		echo "kube-score.sh: go not found in PATH" >&2
		exit 1
	}
	mkdir -p "$bin_dir"
	# Serialise concurrent cold runs so kube-score is built once.
	if command -v flock >/dev/null 2>&1; then
		exec 9>"$bin_dir/.lock"
		flock 9
	fi
	if [[ ! -x "$kube_score" ]]; then
		echo "kube-score.sh: installing kube-score $KUBE_SCORE_VERSION into $bin_dir" >&2
		# Outside any module and workspace, so the clone's go.mod is left alone.
		# The ldflags stamp the version as upstream's release build does.
		(cd "$bin_dir" && GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0 GOBIN="$bin_dir" \
			go install -trimpath -ldflags "-s -w -X main.version=${KUBE_SCORE_VERSION#v}" \
			"github.com/zegl/kube-score/cmd/kube-score@$KUBE_SCORE_VERSION" >&2)
	fi
fi

"$kube_score" version >&2
printf '%s\n' "$kube_score"
