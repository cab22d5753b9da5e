# gpuslice — `make help` lists the targets.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

OUT        := _output
BIN        := $(OUT)/bin
TOOLS      := $(OUT)/tools
VERSION    ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
GO_LDFLAGS := -X main.version=$(VERSION)
# grpcnotrace drops gRPC's tracing package, which keeps html/template and so
# every exported method in the binaries: the device plugin runs in about 29
# MiB instead of 34 (docs/architecture.md). make image, hack/build-cluster.sh and
# the e2e tests build with the same tag.
GO_TAGS    := grpcnotrace
# go-nvml needs cgo; its headers warn about deprecated declarations.
export CGO_ENABLED := 1
export CGO_CFLAGS  := -Wno-deprecated-declarations
# The nested module test/ holds the tests that run real Kubernetes code.
MODULES    := . test
# Packages with fuzz targets (make fuzz); make test runs their seed corpora only.
FUZZ_PKGS   := ./vgpu ./extender ./extender/drascore ./webhook ./deviceplugin ./node/handoff ./node/kubeletstate
# Packages with golden files (tests named *Golden*, flag -update).
GOLDEN_PKGS := ./vgpu/ ./webhook/ ./extender/ ./internal/inspect/
# make image: one image with every binary, assembled by test/image from the built binaries and
# the distribution's libc6 (no container engine); push _output/image/gpuslice.tar with any OCI
# tool, e.g. crane push or skopeo copy oci-archive:...
IMAGE          ?= ghcr.io/gpuslice/gpuslice:$(VERSION)
IMAGE_BINARIES := gpuslice-device-plugin gpuslice-dra-plugin gpuslice-scheduler gpuslice-webhook gpuslice

.PHONY: help
help: ## List the targets.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build the binaries into _output/bin, gpuslice also as kubectl-gpuslice (a kubectl plugin).
	go build -tags $(GO_TAGS) -ldflags "$(GO_LDFLAGS)" -o $(BIN)/ ./cmd/...
	cp $(BIN)/gpuslice $(BIN)/kubectl-gpuslice

# make krew: the platforms of the kubectl-gpuslice archives (hack/krew/gpuslice.yaml lists the same).
KREW_PLATFORMS := linux/amd64 linux/arm64 darwin/amd64 darwin/arm64

.PHONY: krew
krew: ## Build the kubectl-gpuslice archives for krew and their manifest into _output/krew (VERSION=vX.Y.Z).
	rm -rf $(OUT)/krew && mkdir -p $(OUT)/krew
	@for p in $(KREW_PLATFORMS); do os=$${p%/*}; arch=$${p#*/}; d=$(OUT)/krew/$$os-$$arch; \
		echo "building kubectl-gpuslice for $$os/$$arch"; \
		CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch go build -trimpath -tags $(GO_TAGS) -ldflags "$(GO_LDFLAGS)" -o $$d/kubectl-gpuslice ./cmd/gpuslice || exit 1; \
		tar -czf $(OUT)/krew/kubectl-gpuslice_$(VERSION)_$${os}_$${arch}.tar.gz -C $$d kubectl-gpuslice && rm -rf $$d || exit 1; \
	done
	cd test && go run ./cmd/krew-manifest --template ../hack/krew/gpuslice.yaml --tag $(VERSION) --archives ../$(OUT)/krew --out ../$(OUT)/krew/gpuslice.yaml
	@echo "install locally: kubectl krew install --manifest=$(OUT)/krew/gpuslice.yaml --archive=$(OUT)/krew/kubectl-gpuslice_$(VERSION)_linux_amd64.tar.gz"

.PHONY: image
image: ## Build the gpuslice image (IMAGE=...) and the local cluster's pause and shell images as OCI archives in _output/image, without a container engine.
	rm -rf $(OUT)/image/bin && mkdir -p $(OUT)/image/bin
	go build -trimpath -tags $(GO_TAGS) -ldflags "-s -w $(GO_LDFLAGS)" -o $(OUT)/image/bin/ $(addprefix ./cmd/,$(IMAGE_BINARIES))
	cd test && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o ../$(OUT)/image/bin/ ./cmd/gpuslice-pause
	cd test && go run ./cmd/gpuslice-image --bin-dir ../$(OUT)/image/bin --pause ../$(OUT)/image/bin/gpuslice-pause --name $(IMAGE) --version $(VERSION) --out ../$(OUT)/image

.PHONY: cluster
cluster: ## Build the local cluster's binaries into _output/cluster/bin (first time ~10 min on 2 cores, then seconds).
	./hack/build-cluster.sh

.PHONY: runtime
runtime: ## Install the real runtime of the local cluster into _output/runtime: runc, busybox-static (apt-get), containerd v2.4.2 (first time ~4 min).
	./hack/install-runtime.sh

.PHONY: prometheus
prometheus: ## Install Prometheus and promtool (the distribution's package, unpacked, no system install) into _output/prometheus: the alert tests, the monitoring e2e test and make demo use it (seconds).
	./hack/install-prometheus.sh

.PHONY: test
test: cluster runtime prometheus ## The test command: unit tests, real kubelet/API server tests, the chart's alert tests (promtool), the e2e scenarios (one on containerd and runc, one with Prometheus) and a 2-minute chaos soak on a local cluster, all with -race.
	go test -race -count=1 ./...
	cd test && SOAK_MINUTES=2 go test -race -count=1 -timeout 25m ./...

.PHONY: e2e
e2e: cluster runtime prometheus ## Run only the end-to-end scenarios on a local cluster of real processes (root; CI=true fails instead of skipping).
	cd test && go test -race -count=1 -timeout 15m -v ./e2e/... ./cluster/... ./fakecri/...

.PHONY: e2e-monitoring
e2e-monitoring: cluster prometheus ## Only the chart's monitoring: the alert unit tests (promtool) and every dashboard panel and alert queried from a real Prometheus scraping a local cluster (root).
	cd test && go test -race -count=1 -timeout 10m -v -run '^(TestAlertRules|TestPrometheusConfig)$$' ./chart/
	cd test && go test -race -count=1 -timeout 10m -v -run '^TestMonitoring' ./e2e/

# make e2e-runtime: GPU pods created at once in its sharing scenario (16 slices between 2 nodes).
RUNTIME_PODS ?= 60

.PHONY: e2e-runtime
e2e-runtime: cluster runtime ## Only the real-runtime scenarios: the chart's image on containerd and runc, GPU pods printing env and mounts, container and kubelet restarts (root).
	cd test && GPUSLICE_RUNTIME_PODS=$(RUNTIME_PODS) go test -race -count=1 -timeout 15m -v -run '^TestRealRuntime' ./e2e/

# make gpu-check runs on machines with NVIDIA GPUs only; without a driver it stops at once.
.PHONY: gpu-check
gpu-check: ## On a GPU machine: NVML tests, the device plugin on real NVML against the kubelet device manager, and a report (< 5 min).
	./hack/gpu-check.sh

# make soak: minutes of chaos (a whole number; make test runs 2) and the seed of its choices
# (empty: the time; the summary prints the seed to repeat a run); on failure, the components'
# logs are copied to SOAK_LOG_DIR.
SOAK_MINUTES ?= 20
SOAK_SEED    ?=
SOAK_LOG_DIR ?= $(CURDIR)/$(OUT)/soak-logs

.PHONY: soak
soak: cluster ## Chaos soak on a local cluster for SOAK_MINUTES (default 20): pods driven, components killed, XIDs injected, invariants checked (root).
	cd test && SOAK_MINUTES=$(SOAK_MINUTES) SOAK_SEED=$(SOAK_SEED) SOAK_LOG_DIR=$(SOAK_LOG_DIR) go test -count=1 -timeout $$(( $(SOAK_MINUTES) + 20 ))m -run '^TestSoak$$' -v ./soak/

# make bench-scale: node counts (comma-separated) and, optionally, pods per phase, plain pods
# bound before the phases (for memory at a cluster's worth of pods) and a phase deadline.
SCALE_NODES         ?= 100,1000,5000
SCALE_PODS          ?=
SCALE_BACKGROUND_PODS ?= 0
SCALE_PHASE_TIMEOUT ?= 5m
# SCALE_CHART_SET: extra helm --set values, comma-separated (e.g. scheduler.percentageOfNodesToScore=0).
SCALE_CHART_SET     ?=

.PHONY: bench-scale
bench-scale: cluster ## Scale harness: plain vs GPU pods to bound on SCALE_NODES hollow 8-GPU nodes (default 100,1000,5000); prints the table.
	cd test && SCALE_NODES=$(SCALE_NODES) SCALE_PODS=$(SCALE_PODS) SCALE_BACKGROUND_PODS=$(SCALE_BACKGROUND_PODS) SCALE_PHASE_TIMEOUT=$(SCALE_PHASE_TIMEOUT) SCALE_CHART_SET=$(SCALE_CHART_SET) \
		go test -count=1 -timeout 180m -run '^TestBenchScale$$' -v ./scale/

# make bench-fgd: the seed and policy of the FGD replay.
FGD_SEED   ?= 42
FGD_POLICY ?= fragmentation
# FGD_CPU_TASKS: where the trace's tasks without GPUs go, gpuslice (the gpuslice profile, the
# extender placing them) or default-scheduler.
FGD_CPU_TASKS ?= gpuslice

.PHONY: bench-fgd
bench-fgd: cluster ## Replay the FGD trace (../shared/data/fgd-trace) through kube-scheduler + extender; unallocated GPU beside gpuslice simulate's.
	cd test && FGD_SEED=$(FGD_SEED) FGD_POLICY=$(FGD_POLICY) FGD_CPU_TASKS=$(FGD_CPU_TASKS) SCALE_CHART_SET=$(SCALE_CHART_SET) go test -count=1 -timeout 150m -run '^TestReplayFGD$$' -v ./scale/

.PHONY: demo
demo: cluster build prometheus ## Start a 2-node fake-GPU cluster with sample pods and a Prometheus scraping it, print kubectl gpuslice status, the KUBECONFIG and the Prometheus URL (root).
	cd test && go run ./cmd/gpuslice-demo --cli-dir ../$(BIN) up

.PHONY: demo-dra
demo-dra: cluster build ## make demo plus a third node in DRA mode, where the webhook turns two hami.io pods into claims (root).
	cd test && go run ./cmd/gpuslice-demo --cli-dir ../$(BIN) --dra up

.PHONY: demo-down
demo-down: ## Stop the demo cluster; leaves no process, mount or file.
	cd test && go run ./cmd/gpuslice-demo down

.PHONY: fuzz
fuzz: ## Fuzz every input a stranger controls for FUZZTIME each (default 30s); failing inputs land in testdata/fuzz.
	@for p in $(FUZZ_PKGS); do for f in $$(go test -tags $(GO_TAGS) -list 'Fuzz.*' $$p | grep ^Fuzz); do \
		go test -tags $(GO_TAGS) $$p -run '^$$' -fuzz "^$$f$$" -fuzztime $${FUZZTIME:-30s} || exit 1; done; done

.PHONY: tools
tools: ## Install pinned tools (golangci-lint) into _output/tools.
	./hack/install-tools.sh

.PHONY: lint
lint: tools ## Run golangci-lint on every module.
	@for m in $(MODULES); do (cd $$m && $(CURDIR)/$(TOOLS)/golangci-lint run ./...); done

.PHONY: update
update: ## Rewrite generated files: gofmt, go mod tidy, replace block, golden files.
	gofmt -w $$(git ls-files '*.go')
	./test/hack/gen-replace.sh
	@for m in $(MODULES); do (cd $$m && go mod tidy); done
	go test $(GOLDEN_PKGS) -run 'Golden' -update
	cd test && go test ./chart/ -run 'Golden' -update

.PHONY: verify
verify: tools prometheus ## Fail on gofmt, go vet, lint, go mod tidy drift, replace-block drift, stale golden files (chart renders too), helm lint and promtool check rules; needs make cluster.
	@bad=$$(gofmt -l $$(git ls-files '*.go')); if [[ -n "$$bad" ]]; then echo "gofmt needed: $$bad"; exit 1; fi
	@for m in $(MODULES); do (cd $$m && go vet ./... && go mod tidy -diff) || { echo "go vet or go mod tidy drift in $$m (run make update)"; exit 1; }; done
	./test/hack/gen-replace.sh --verify
	go test -count=1 -run 'Golden' $(GOLDEN_PKGS)
	@test -x $(OUT)/cluster/bin/helm || { echo "make verify: $(OUT)/cluster/bin/helm is missing: run make cluster first (it builds helm)"; exit 1; }
	@# Lint renders without a cluster: the chart then needs a webhook certificate made once.
	$(OUT)/cluster/bin/helm lint --strict --kube-version 1.37.2 charts/gpuslice -f test/chart/testdata/webhook-tls.yaml
	@# TestAlertRules runs promtool check rules (then its unit tests) on the rules the chart's PrometheusRule renders.
	cd test && CI=true go test -count=1 -run 'Golden|^TestAlertRules$$' ./chart/
	$(MAKE) lint

.PHONY: clean
clean: ## Remove gpuslice's build outputs (keeps _output/cluster, which takes ~10 min to rebuild, and the Go build cache).
	rm -rf $(BIN)
