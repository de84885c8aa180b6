# Run `make help` for the targets.

.PHONY: help test vet fmt build bench bench-scale generate

help: ## Show this help.
	@awk 'BEGIN { FS = ":.*## " } /^[a-z][a-z-]*:.*## / { printf "  %-9s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

test: ## Start Redis and a Redis Cluster, check gofmt, vet, run all tests (TEST_ARGS adds go test flags).
	bash hack/test.sh

vet: ## Run go vet.
	go vet ./...

fmt: ## Format all Go files in place.
	git ls-files -z --cached --others --exclude-standard -- '*.go' | xargs -0 -r gofmt -w

build: ## Build bin/limiter.
	go build -o bin/limiter ./cmd/limiter

bench: ## Run every benchmark and print one table of ratios (hack/bench.sh, BENCHMARKS.md).
	@if [ -f hack/bench.sh ]; then bash hack/bench.sh; else echo "hack/bench.sh does not exist yet"; fi

bench-scale: ## Hold 900 to 900,000 slots and time full heartbeat rounds, library and HTTP (hack/bench-scale.sh, BENCHMARKS.md).
	bash hack/bench-scale.sh

generate: ## Regenerate code and manifests (hack/codegen.sh).
	@if [ -f hack/codegen.sh ]; then bash hack/codegen.sh; else echo "hack/codegen.sh does not exist yet"; fi
