#!/usr/bin/env bash
# Copy into the Helm chart the files whose one source is config/:
#
#   config/crd/bases/*.yaml          -> charts/limiter/crds/            (installed by helm before the templates)
#   config/rbac/role.yaml            -> charts/limiter/files/rbac/role.yaml (the Role template takes its rules)
#   config/observability/*.{json,yaml,yml}
#                                    -> charts/limiter/files/observability/ (dashboard ConfigMap, PrometheusRule)
#
# Run it after `make generate` or a change under config/observability, and
# commit the result. The chart tests (make test) fail while the copies differ
# from config/.
#
# Usage: hack/sync-chart.sh           copy
#        hack/sync-chart.sh --check   only report drift; exit 1 if any
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

chart=charts/limiter
check=0
case "${1:-}" in
"") ;;
--check) check=1 ;;
*)
	echo "usage: $0 [--check]" >&2
	exit 2
	;;
esac

drift=0
# sync_dir SRC DST PATTERN...: make DST hold exactly the copies of SRC's files
# matching the patterns (stale copies are removed); with --check, only report.
sync_dir() {
	local src=$1 dst=$2
	shift 2
	local want=() f
	if [[ -d "$src" ]]; then
		for pattern in "$@"; do
			for f in "$src"/$pattern; do
				[[ -f "$f" ]] && want+=("$(basename "$f")")
			done
		done
	fi
	# Copies to add or update.
	for f in "${want[@]+"${want[@]}"}"; do
		if ! cmp -s "$src/$f" "$dst/$f"; then
			if ((check)); then
				echo "sync-chart: $dst/$f differs from $src/$f" >&2
				drift=1
			else
				mkdir -p "$dst"
				cp "$src/$f" "$dst/$f"
				echo "sync-chart: $src/$f -> $dst/$f" >&2
			fi
		fi
	done
	# Stale copies whose source is gone.
	[[ -d "$dst" ]] || return 0
	for pattern in "$@"; do
		for f in "$dst"/$pattern; do
			[[ -f "$f" ]] || continue
			local name
			name=$(basename "$f")
			if [[ ! -f "$src/$name" ]]; then
				if ((check)); then
					echo "sync-chart: $f has no source in $src" >&2
					drift=1
				else
					rm -f "$f"
					echo "sync-chart: removed $f" >&2
				fi
			fi
		done
	done
}

sync_dir config/crd/bases "$chart/crds" '*.yaml'
sync_dir config/rbac "$chart/files/rbac" role.yaml
sync_dir config/observability "$chart/files/observability" '*.json' '*.yaml' '*.yml'

if ((drift)); then
	echo "the chart's copies of config/ are out of date: run hack/sync-chart.sh and commit the result" >&2
	exit 1
fi
if ((check)); then
	echo "the chart's copies of config/ are up to date" >&2
fi
