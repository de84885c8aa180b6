#!/usr/bin/env bash
# Regenerate what controller-gen derives from api/ and pkg/controller
# (what `make generate` runs):
#
#   api/v1alpha1/zz_generated.deepcopy.go   DeepCopy methods of the API types
#   config/crd/bases/*.yaml                 the LimitTier and LimitPool CRDs
#                                           (schema, defaults, printer columns)
#                                           from the markers
#   config/rbac/role.yaml                   the Role, from the +kubebuilder:rbac
#                                           markers in pkg/controller
#
# then the Python and TypeScript clients' request and response types from
# api/openapi.yaml (hack/clientgen; its test is the drift check),
# and refreshes the Helm chart's copies of the CRD and Role (hack/sync-chart.sh), so
# one `make generate` leaves nothing to sync by hand.
#
# controller-gen is installed once, at a pinned version, into a cache outside
# the clone: ${LIMITER_CACHE:-$HOME/.cache/limiter}/bin.
#
# Usage: hack/codegen.sh [ROOT]   ROOT defaults to the clone; hack/verify-generated.sh
#                                 passes a scratch copy to check for drift.
set -euo pipefail

CONTROLLER_GEN_VERSION="v0.23.0"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
root="$(cd "${1:-$here}" && pwd)"

cache="${LIMITER_CACHE:-$HOME/.cache/limiter}"
bin_dir="$cache/bin/controller-gen-$CONTROLLER_GEN_VERSION"
controller_gen="$bin_dir/controller-gen"

if [[ ! -x "$controller_gen" ]]; then
	echo "codegen: installing controller-gen $CONTROLLER_GEN_VERSION into $bin_dir" >&2
	mkdir -p "$bin_dir"
	# Outside any module, so the clone's go.mod is left alone.
	(cd "$bin_dir" && GOBIN="$bin_dir" go install "sigs.k8s.io/controller-tools/cmd/controller-gen@$CONTROLLER_GEN_VERSION")
fi

cd "$root"
"$controller_gen" object:headerFile=hack/boilerplate.go.txt paths=./api/...
# Stale outputs of removed kinds must not survive a regeneration.
rm -f config/crd/bases/*.yaml config/rbac/role.yaml
"$controller_gen" crd paths=./api/... output:crd:artifacts:config=config/crd/bases
"$controller_gen" rbac:roleName=limiter paths=./pkg/controller/... output:rbac:artifacts:config=config/rbac
# The chart's copies (crds/, files/rbac/). A scratch ROOT without the chart
# (hack/verify-generated.sh) has none to refresh.
if [[ -d "$root/charts/limiter" ]]; then
	bash "$root/hack/sync-chart.sh"
fi
# The clients' types. A scratch ROOT without the clients has none to refresh.
if [[ -d "$root/clients" ]]; then
	go run ./hack/clientgen -root "$root"
fi
