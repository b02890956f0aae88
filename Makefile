# The index of what can be run; each target calls the script that does it.
# Scripts take their settings from the environment (see each script's header).
GO ?= go
# The version the binary reports (podres-proxy version).
VERSION ?= dev
# Where node-up and node-down keep the node.
ROOT ?= /var/tmp/podres-node

.PHONY: build test test-from-empty lint e2e e2e-cluster node-up node-down local-up local-down cluster-up cluster-down image image-oci

build: ## the static binary, into _output/bin, built as the Dockerfile builds it
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w -X main.version=$(VERSION)" -o _output/bin/podres-proxy ./cmd/podres-proxy

test: ## the test command (CI's): lint, unit tests with -race, fuzzing, the node and cluster e2e suites as root
	hack/test.sh

test-from-empty: ## the test command with empty Go module, build and node caches
	hack/test-from-empty.sh

lint: ## gofmt, vet, staticcheck and shellcheck only
	PODRES_LINT_ONLY=1 hack/test.sh

e2e: ## the real-node end-to-end suite only (root)
	PODRES_E2E=1 $(GO) test -count=1 -timeout 60m -v ./test/e2e/...

e2e-cluster: ## the one-node cluster suite only (root): deploy/base and the Helm chart on a real control plane
	PODRES_E2E=1 $(GO) test -count=1 -timeout 60m -v ./test/cluster/...

node-up: ## a real node (containerd + NRI + CNI, a standalone kubelet) under ROOT (root)
	hack/build-node.sh && hack/node-up.sh $(ROOT)

node-down: ## stops the node under ROOT
	hack/node-down.sh $(ROOT)

local-up: ## the quick start: a node, podres-proxy, demo pods (root)
	hack/local-up.sh

local-down: ## stops what local-up started
	hack/local-down.sh

cluster-up: ## a one-node cluster (control plane, containerd, kubelet) with podres-proxy from deploy/base (root)
	hack/cluster-up.sh

cluster-down: ## stops what cluster-up started
	hack/cluster-down.sh

image: ## the container image (needs a container engine)
	docker build -t podres-proxy:dev .

image-oci: build ## the same image without an engine: an OCI tarball for `ctr images import`
	$(GO) run ./hack/ociimage --binary _output/bin/podres-proxy --name podres-proxy:$(VERSION) -o _output/podres-proxy-image.tar
