# syntax=docker/dockerfile:1
#
# The relay's container image: a static binary on a distroless base, running
# as a non-root user. Build and run:
#
#   docker build -t outboxrelay/relay --build-arg VERSION=v0.1.0 --build-arg COMMIT=$(git rev-parse HEAD) .
#   docker run --rm -v "$PWD/relay.yaml:/etc/relay/relay.yaml:ro" -p 127.0.0.1:9090:9090 outboxrelay/relay
#
# The release image, for linux/amd64 and linux/arm64, tagged with the Helm
# chart's appVersion and pushed: make image (docs/operations.md, "The image").
#
# compose.yaml builds this image and runs it against Postgres and the brokers.
# deploy/deploy_test.go checks this file's shape (docker cannot run in CI).

# ---- build stage -----------------------------------------------------------
# Runs on the build machine's platform and cross-compiles for the target, so
# multi-arch builds (docker buildx --platform linux/amd64,linux/arm64) need
# no emulation.
FROM --platform=$BUILDPLATFORM golang:1.26 AS builder
WORKDIR /src

# Modules first, so code changes do not re-download them. go.mod replaces
# the helpers module with its directory, whose go.mod must be there too.
COPY go.mod go.sum ./
COPY helpers/go.mod helpers/go.sum ./helpers/
RUN --mount=type=cache,target=/go/pkg/mod go mod download

COPY . .
ARG TARGETOS
ARG TARGETARCH
# The version and commit `relay version` and relay_build_info report. The
# build context has no .git (.dockerignore), so Go cannot stamp them; pass
# them: docker build --build-arg VERSION=$(git describe --tags --always)
# --build-arg COMMIT=$(git rev-parse HEAD) .
ARG VERSION=dev
ARG COMMIT=unknown
# CGO_ENABLED=0: a fully static binary that needs no libc in the final image.
# The same build as the Makefile's BUILD_FLAGS (make binaries builds it
# without Docker; deploy/helm's TestImageBuild keeps the two equal).
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS:-linux} GOARCH=${TARGETARCH} \
    go build -trimpath -buildvcs=false -ldflags="-s -w -X github.com/outboxrelay/relay/internal/buildinfo.version=${VERSION} -X github.com/outboxrelay/relay/internal/buildinfo.commit=${COMMIT}" \
      -o /out/relay ./cmd/relay

# ---- final stage -----------------------------------------------------------
# distroless/static has CA certificates (for TLS to brokers, SQS and webhooks)
# and tzdata, and nothing else: no shell, no package manager. The :nonroot tag
# runs as uid/gid 65532, its user nonroot; USER names it by number, so that
# Kubernetes can check runAsNonRoot against the image without a runAsUser
# (which OpenShift's restricted SCC would refuse), and a platform that picks
# its own uid (OpenShift) may: /relay is world-readable and executable.
FROM gcr.io/distroless/static:nonroot
COPY --from=builder /out/relay /relay
USER 65532:65532

# The Go runtime's monitor thread otherwise polls every 20 µs after each
# wake of an idle relay, which on a relay that wakes hundreds of times a
# second made half its context switches; with schedtrace set it polls every
# 10 ms instead. The runtime then prints one SCHED line to stderr at start on
# a host up longer than about 25 days. Set GODEBUG (e.g. schedtrace=0) to
# change it: docs/operations.md, "The runtime's monitor thread".
ENV GODEBUG=schedtrace=2147483647

# http.listen: /metrics, /healthz, /readyz, unauthenticated. The config
# must listen on 0.0.0.0:9090 (not 127.0.0.1) for the port to be reachable
# from outside the container (the examples do with RELAY_HTTP_LISTEN set);
# publish it only where Prometheus and the probes need it, e.g.
# -p 127.0.0.1:9090:9090 (docs/operations.md, "Exposing /metrics").
EXPOSE 9090

# No HEALTHCHECK: distroless has no shell, curl or wget to run one, and the
# relay has no probe subcommand. Orchestrators probe over HTTP instead:
# Kubernetes livenessProbe httpGet /healthz and readinessProbe httpGet /readyz
# on port 9090; compose.yaml orders start-up with depends_on on the healthy
# Postgres and brokers and a completed `relay init`.
ENTRYPOINT ["/relay"]
CMD ["run", "--config", "/etc/relay/relay.yaml"]
