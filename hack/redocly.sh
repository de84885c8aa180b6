#!/usr/bin/env bash
# Install (once) the pinned Redocly CLI, the OpenAPI linter the tests run on
# api/openapi.yaml, and print its path as the LAST line on stdout (progress
# goes to stderr), so callers can do:
#
#   export LIMITER_REDOCLY=$(bash hack/redocly.sh | tail -1)
#
# It comes from the npm registry, installed with the machine's node and npm
# into a cache outside the clone:
# ${LIMITER_CACHE:-$HOME/.cache/limiter}/npm/redocly-cli-<version>. With a
# warm cache the script returns immediately.
#
# With --cached it installs nothing: it prints the path and exits 0 when
# the CLI is cached, and exits 1 otherwise.
set -euo pipefail
# shellcheck source=hack/lib/install.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/install.sh"

# 1.34.5 runs on node >= 18.17: on Debian 12's nodejs (18.19) as on newer
# ones. The 2.x releases need node >= 20.19, which Debian 12 does not have.
REDOCLY_VERSION="1.34.5"

cache="${LIMITER_CACHE:-$HOME/.cache/limiter}"
prefix="$cache/npm/redocly-cli-$REDOCLY_VERSION"
redocly="$prefix/node_modules/.bin/redocly"

# No usage telemetry and no update check: the tests run offline.
export REDOCLY_TELEMETRY=off REDOCLY_SUPPRESS_UPDATE_NOTICE=true

build() {
	echo "redocly.sh: installing @redocly/cli $REDOCLY_VERSION into $prefix" >&2
	# A package.json of its own, so npm never walks up into the clone.
	[[ -f "$prefix/package.json" ]] || printf '{"private":true}\n' >"$prefix/package.json"
	npm install --prefix "$prefix" --no-audit --no-fund --no-save --loglevel=error \
		"@redocly/cli@$REDOCLY_VERSION" >&2
}

answer_cached "$redocly" "${1:-}"
install_once "$prefix" "$redocly" "node npm" build

printf 'redocly %s\n' "$("$redocly" --version 2>/dev/null)" >&2
printf '%s\n' "$redocly"
