#!/usr/bin/env bash
# Fail when the generated files (deepcopy, CRD, Role) differ from what
# hack/codegen.sh produces from the current sources: someone changed api/ or
# an RBAC marker without running `make generate`. The clone is left
# untouched: generation runs in a scratch copy.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

generated=(api/v1alpha1/zz_generated.deepcopy.go config/crd/bases config/rbac/role.yaml)

scratch=$(mktemp -d "${TMPDIR:-/tmp}/limiter-verify-generated.XXXXXX")
trap 'rm -rf "$scratch"' EXIT

# The sources the generators read, and the committed outputs to compare.
cp -R go.mod go.sum api pkg hack config "$scratch/"
bash hack/codegen.sh "$scratch"

drift=0
for path in "${generated[@]}"; do
	if ! diff -ruN "$path" "$scratch/$path" >"$scratch/diff" 2>&1; then
		drift=1
		cat "$scratch/diff" >&2
	fi
done
if ((drift)); then
	echo >&2
	echo "generated files are out of date: run 'make generate' and commit the result" >&2
	exit 1
fi
echo "generated files are up to date"
