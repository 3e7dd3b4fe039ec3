# Tenstorrent driver manager: common entry points.
#   make test     installs what is missing (hack/deps.sh), then fmt + clippy + cargo-deny + unit, agent,
#                 cluster, alert-rule, chart, image, real-node, chaos and kernel (QEMU) tests, with
#                 the VM node (make test-vm-node) beside them
#   make images   controller, agent, vfio, flasher and pause image archives (hack/images.sh)
#   make release  chart, images, plugin, krew manifest and checksums in dist/<version>/
#   make bench    rollout benchmark at 10/100/1000 simulated nodes
#   make bench-pods  pod density: 1000 nodes, 10,000 pods
#   make demo     a rollout on a local simulated cluster, watched live
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
CARGO ?= cargo

.PHONY: test deps lint unit cluster-up cluster-down crds install-plugins demo demo-down bench bench-pods testbin \
	images release test-realnode realnode-up realnode-down test-vm-node test-stages

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
# target, and part of make test (beside its other stages): about 18 minutes on
# an idle machine, more under load (TCG; four real module builds).
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

# The whole suite (what CI runs): what is missing installed first
# (hack/deps.sh); then what the VM node needs (the Go test binaries, its test
# binary, the emulated card, the image archives); then two lanes at once:
#  - the VM node (hack/test-vm-node.sh: a real kubelet in a QEMU guest, the
#    controller-driven swap of the real tt-kmd on an emulated Wormhole, its
#    faults and reboots). QEMU runs it on one TCG thread, so it keeps one
#    core busy for 40 minutes or more: it is the longer lane and starts
#    first. Its output goes to target/ci/vm-node.log, printed whole when it
#    ends. Each of its waits may take 1500 s here (900 alone): the other lane
#    slows the guest's in-guest builds of the real driver (TIMEOUT overrides).
#  - everything else, one after the other: lint (clippy in its own target
#    directory, target/lint, so it never waits on the VM node's cargo lock),
#    cargo-deny (licences, bans, sources, advisories: hack/deny.sh), the
#    other test binaries once the VM node has left cargo (its marker,
#    target/ci/vm-node.cargo-done, or its end), then test-stages below: unit, agent and
#    cluster tests against a fresh local cluster; alert rules with promtool;
#    the Helm chart; the images and the real-node test (chart and agent on a
#    real kubelet); fault injection on its own cluster (one trial of each
#    kind); the agent on a real kernel under QEMU, with the stub module, then
#    the real tt-kmd on emulated Wormhole and Blackhole cards. These mostly
#    wait on API servers and kubelets.
# Each lane has its own cluster, namespace and work directory (the VM node's
# is ~/.kwok-vmnode-realnode). A failure of either fails the target, once both
# have ended.
# The Go test binaries (cold: over 10 minutes, cached afterwards) build beside
# the VM node's cargo builds and the image archives: the Go build waits on the
# module proxy and links on one core, the image bases wait on Debian's
# mirror, so together they take less than one after the other.
test: deps
	bash hack/build-testbin.sh >/dev/null & testbin=$$!; status=0; \
	  { $(CARGO) test -q -p ttdrv-controller --test vm_node --no-run && \
	    $(CARGO) build -q -p ttdrv-testkit --bin ttdrv-ttcard && \
	    bash hack/images.sh >/dev/null; } || status=$$?; \
	  wait $$testbin || status=1; exit $$status
	mkdir -p target/ci; rm -f target/ci/vm-node.cargo-done
	t0=$$(date +%s); TIMEOUT=$${TIMEOUT:-1500} VMNODE_CARGO_DONE=$(CURDIR)/target/ci/vm-node.cargo-done \
	  bash hack/test-vm-node.sh >target/ci/vm-node.log 2>&1 & vm=$$!; \
	  echo "== make test: the VM node runs beside the other stages (pid $$vm, log target/ci/vm-node.log)"; \
	  status=0; { CARGO_TARGET_DIR=$(CURDIR)/target/lint $(MAKE) --no-print-directory lint && \
	    bash hack/deny.sh && \
	    { while [ ! -e $(CURDIR)/target/ci/vm-node.cargo-done ] && kill -0 $$vm 2>/dev/null; do sleep 2; done; } && \
	    $(CARGO) test --workspace --no-run -q && \
	    $(MAKE) --no-print-directory test-stages; } || status=$$?; \
	  echo "== make test: the other stages ended (status $$status) after $$(( $$(date +%s) - t0 )) s; waiting for the VM node"; \
	  vm_status=0; wait $$vm || vm_status=$$?; \
	  echo "== make test: the VM node's log (status $$vm_status, ended after $$(( $$(date +%s) - t0 )) s)"; \
	  cat target/ci/vm-node.log; \
	  [ $$vm_status = 0 ] || { echo "== make test: the VM node FAILED (target/ci/vm-node.log above)"; status=1; }; \
	  exit $$status

# The stages of `make test` that run beside the VM node, in order.
test-stages:
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
