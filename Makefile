GO ?= go

.PHONY: test deps demo build vet bench fuzz docs image binaries

# RACE_PKGS are the packages with concurrency of their own (the pipeline,
# the capture sources, the sinks): test runs them under the race detector.
RACE_PKGS = ./pipeline/... ./capture/... ./sink/...

# test installs missing test dependencies, then runs every test in three
# go test runs at the same time: RACE_PKGS with -race; the relay module's
# other packages without (their tests, cmd/relay's above all, mostly wait on
# servers and relay processes, which leaves the race run CPU); and those of
# the nested modules helpers and deploy/helm (./... stops at their go.mod),
# one after the other, which mostly wait on their PostgreSQL cluster and the
# helm CLI. The output of the race run, then of the nested modules, is
# printed after the relay module's; test fails if any run failed, and runs
# every one also when an earlier one failed. -parallel 4 lets four of
# cmd/relay's parallel tests wait at once on two cores. deploy/helm
# requires the relay's module through a replace, so -mod=mod lets it follow
# the relay's go.mod as that changes.
test: deps
	status=0; race=$$(mktemp); nested=$$(mktemp); \
	$(GO) test -count=1 -timeout 15m -race $(RACE_PKGS) >$$race 2>&1 & race_pid=$$!; \
	( s=0; (cd helpers && $(GO) test -count=1 -timeout 5m ./...) || s=1; \
	  (cd deploy/helm && $(GO) test -mod=mod -count=1 -timeout 10m ./...) || s=1; exit $$s ) >$$nested 2>&1 & nested_pid=$$!; \
	$(GO) test -count=1 -timeout 25m -parallel 4 $$($(GO) list ./... | grep -v -E '/relay/(pipeline|capture|sink)(/|$$)') || status=1; \
	wait $$race_pid || status=1; cat $$race; \
	wait $$nested_pid || status=1; cat $$nested; \
	rm -f $$race $$nested; exit $$status

# fuzz runs the fuzz targets on the paths from a row's bytes to metric
# labels, log lines, templates and headers (Kafka record headers, SQS
# message attributes), and from environment values to
# the config, for FUZZTIME each (go test runs one -fuzz target per call);
# make test runs every target on its seeds only.
FUZZTIME ?= 5s
FUZZ_TARGETS = FuzzClean:./internal/rowtext FuzzPublishedByType:./pipeline FuzzRowValuesLogged:./pipeline \
	FuzzRender:./sink/template FuzzParseHeaders:./event FuzzEnvSecret:./config \
	FuzzRecordHeaders:./sink/kafka FuzzMessageAttributes:./sink/sqs FuzzMessage:./sink/pubsub FuzzFields:./sink/redis
# FuzzRedactDSN (internal/redact) runs on its seeds only: a fuzzer still
# finds garbled, unencoded URLs whose password redact cannot tell from the
# host (the relay's own messages never echo postgres.url).
fuzz:
	@GO=$(GO) FUZZTIME=$(FUZZTIME) bash scripts/fuzz.sh $(FUZZ_TARGETS)

deps:
	bash scripts/deps.sh

demo:
	$(GO) run ./cmd/relay demo

# bench runs the performance benchmark of docs/benchmarks.md (under 10
# minutes; BENCH_FLAGS=-quick for a run of about a minute, BENCH_FLAGS=-rss
# adds 1,000,000-event drains for the relay's peak RSS, several minutes).
bench: deps
	$(GO) run ./cmd/relaybench $(BENCH_FLAGS)

# build compiles every package and puts the commands in bin/.
build:
	$(GO) build ./...
	$(GO) build -o bin/ ./cmd/...

# The release image (docs/operations.md, "The image"): IMAGE:VERSION for
# every platform of PLATFORMS, built from the Dockerfile by docker buildx,
# which cross-compiles (no emulation), and pushed. VERSION defaults to the
# Helm chart's appVersion, the tag its image.tag defaults to; the release
# commit is tagged VERSION. make image IMAGE=registry.example.com/relay
# pushes to another registry (docker login first).
IMAGE ?= outboxrelay/relay
VERSION ?= $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$$/\1/p' deploy/helm/relay/Chart.yaml)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
PLATFORMS ?= linux/amd64,linux/arm64
# The build the Dockerfile's builder stage runs for each platform
# (deploy/helm's TestImageBuild compares the two).
BUILD_FLAGS = -trimpath -buildvcs=false -ldflags="-s -w -X github.com/outboxrelay/relay/internal/buildinfo.version=$(VERSION) -X github.com/outboxrelay/relay/internal/buildinfo.commit=$(COMMIT)"
BINDIR ?= bin

image:
	docker buildx build --platform $(PLATFORMS) --build-arg VERSION=$(VERSION) --build-arg COMMIT=$(COMMIT) \
		-t $(IMAGE):$(VERSION) --push .

# binaries builds the image's binary for every platform of PLATFORMS
# without Docker, as BINDIR/OS-ARCH/relay.
binaries:
	@set -e; for p in $$(echo $(PLATFORMS) | tr , ' '); do \
		os=$${p%/*}; arch=$${p#*/}; echo "binaries: $$os/$$arch"; \
		CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build $(BUILD_FLAGS) -o $(BINDIR)/$$os-$$arch/relay ./cmd/relay; \
	done

# docs checks every Markdown file of the repository as a renderer reads it:
# no code fence left open, no relative link to a missing file or heading
# (internal/mdcheck; make test runs it too).
docs:
	$(GO) test -count=1 ./internal/mdcheck

# vet also fails on committed executables and files over 1 MiB outside
# testdata/ (scripts/check-files.sh).
vet: docs
	bash scripts/check-files.sh
	$(GO) vet ./...
	cd helpers && $(GO) vet ./...
	cd deploy/helm && $(GO) vet -mod=mod ./...
	@out="$$(gofmt -l .)"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
