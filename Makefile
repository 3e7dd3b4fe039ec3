# Tenstorrent driver manager: common entry points.
#   make test     installs what is missing (hack/deps.sh), then fmt + clippy + cargo-deny + unit, agent,
#                 cluster, alert-rule, chart, image, real-node, chaos and kernel (QEMU) tests
#   make images   controller, agent, vfio, flasher and pause image archives (hack/images.sh)
#   make release  chart, images, plugin, krew manifest and checksums in dist/<version>/
#   make bench    rollout benchmark at 10/100/1000 simulated nodes
#   make bench-pods  pod density: 1000 nodes, 10,000 pods
#   make demo     a rollout on a local simulated cluster, watched live
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
CARGO ?= cargo

.PHONY: test deps lint unit cluster-up cluster-down crds install-plugins demo demo-down bench bench-pods testbin \
	images release test-realnode realnode-up realnode-down test-vm-node

# Debian packages, promtool, the musl target: installed when missing (idempotent).
deps:
	bash hack/deps.sh

# Image archives built from Debian packages and the static binaries, without a
# registry; cached under ~/.cache/ttdrv-images (see hack/images.sh).
images:
	bash hack/images.sh

# The release artefacts in dist/<version>/ (see hack/release.sh, docs/install.md).
release:
	bash hack/release.sh

# A real node (containerd, kubelet, kube-proxy) joined to its own local control
# plane in a private namespace (see hack/realnode.sh and docs/development.md).
realnode-up:
	bash hack/realnode.sh up

realnode-down:
	bash hack/realnode.sh down

# The images against the Dockerfiles, then the chart and the agent on the real node.
test-realnode:
	bash hack/test-images.sh
	bash hack/test-realnode.sh

# A node in a QEMU guest (Debian's kernel, TCG) joined to the real node's
# control plane: controller-driven swaps of the stub module under a workload,
# then real faults: kubelet and containerd restarts, a cut from the API
# server, the leader killed, reboots (see hack/test-vm-node.sh). Its own
# target (CI runs it after make test): about 16 minutes on an idle machine,
# more under load (TCG; four real module builds).
test-vm-node:
	bash hack/test-vm-node.sh

testbin:
	bash hack/build-testbin.sh >/dev/null

lint:
	$(CARGO) fmt --all -- --check
	python3 hack/check-structure.py
	$(CARGO) clippy --workspace --all-targets -- -D warnings

crds:
	$(CARGO) run -q --bin ttdrv-crdgen > crds/tenstorrentdriverpolicies.yaml
	$(CARGO) run -q --bin ttdrv-crdgen firmware > crds/tenstorrentfirmwarepolicies.yaml

cluster-up:
	bash hack/cluster.sh up

cluster-down:
	bash hack/cluster.sh down

# The whole suite: what is missing installed first (hack/deps.sh); lint;
# cargo-deny (licences, bans, sources, advisories: hack/deny.sh); unit,
# agent and cluster tests against a fresh local cluster (stopped afterwards
# whatever the outcome); alert rules with promtool; the Helm chart; the images
# against the Dockerfiles and the real-node test (chart and agent on a real
# kubelet); fault injection on its own cluster (one trial of each of the 11
# fault kinds, plus the drain and Event regressions); the agent on a real
# kernel under QEMU, with the stub module, then with the real tt-kmd (pinned
# releases from the bundle in ../shared/data, else GitHub) on emulated
# Wormhole and Blackhole cards (testkit's ttdrv-ttcard).
# The Go test binaries (cold: over 10 minutes, cached afterwards) build beside
# lint, cargo-deny, the cargo test binaries and the image archives: the Go
# build waits on the module proxy and links on one core, the image bases wait
# on Debian's mirror, so together they take less than one after the other. A
# failure of either side fails the target, once both have ended.
test: deps
	bash hack/build-testbin.sh >/dev/null & testbin=$$!; status=0; \
	  { $(MAKE) --no-print-directory lint && bash hack/deny.sh && \
	    $(CARGO) test --workspace --no-run -q && bash hack/images.sh >/dev/null; } || status=$$?; \
	  wait $$testbin || status=1; exit $$status
	bash hack/run-cluster-tests.sh
	bash hack/test-alerts.sh
	bash hack/test-chart.sh
	bash hack/test-images.sh
	bash hack/test-realnode.sh
	CHAOS_TRIALS=16 bash hack/chaos.sh
	bash hack/test-vm.sh
	bash hack/test-vm.sh real

install-plugins:
	$(CARGO) build --release -p kubectl-tt-driver
	mkdir -p $(HOME)/.local/bin
	cp target/release/kubectl-tt-driver $(HOME)/.local/bin/
	ln -sf kubectl-tt-driver $(HOME)/.local/bin/kubectl-tt-fw
	@echo "installed kubectl-tt-driver and kubectl-tt-fw to $(HOME)/.local/bin (make sure it is on PATH): kubectl tt driver, kubectl tt fw"

# One-command demo on a local simulated cluster (see hack/demo.sh).
demo:
	bash hack/demo.sh

demo-down:
	bash hack/demo.sh down

# Rollout benchmark at 10, 100 and 1000 simulated nodes against a kubectl
# baseline, on its own cluster (see docs/benchmarks.md).
bench:
	bash hack/bench.sh

# Pod density: the controller's memory and CPU with 1000 Tenstorrent nodes and
# 10,000 ordinary pods (docs/benchmarks.md#pod-density).
bench-pods:
	bash hack/bench.sh pods
