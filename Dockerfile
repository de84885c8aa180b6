# syntax=docker/dockerfile:1
#
# The limiter image: a static binary on an empty base, running as 65532
# (the chart's securityContext.runAsUser).
#
#   docker build --build-arg VERSION=v0.1.0 --build-arg COMMIT=$(git rev-parse HEAD) -t joishi/limiter:0.1.0 .
#
# The builder runs on the build machine's platform and cross-compiles for the
# target's (docker buildx build --platform linux/amd64,linux/arm64 ...).

# The Go of go.mod's go line, exactly: an older image would refuse (or
# download a toolchain), a floating tag would build differently each time.
FROM --platform=$BUILDPLATFORM golang:1.26.8 AS build
WORKDIR /src
# Dependencies first: this layer is reused until go.mod or go.sum change.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG TARGETOS
ARG TARGETARCH
ARG VERSION=dev
ARG COMMIT=unknown
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath \
      -ldflags="-s -w -X main.version=${VERSION} -X main.commit=${COMMIT}" \
      -o /out/limiter ./cmd/limiter

FROM scratch
# CA roots, for Redis and OTLP over TLS with redis.tls.caFile unset.
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/limiter /limiter
# A numeric user: scratch has no /etc/passwd, and runAsNonRoot can only
# verify a numeric USER.
USER 65532:65532
# API, ops (/healthz, /readyz, /metrics).
EXPOSE 8080 9090
ENTRYPOINT ["/limiter"]
CMD ["serve"]
