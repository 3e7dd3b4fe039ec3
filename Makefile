# Tenstorrent driver manager: common entry points.
#   make test     fmt + clippy + unit, agent, cluster, alert-rule, chart, chaos and kernel (QEMU) tests
#   make bench    rollout benchmark at 10/100/1000 simulated nodes
#   make demo     a rollout on a local simulated cluster, watched live
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
CARGO ?= cargo

.PHONY: test lint unit cluster-up cluster-down crds install-plugins demo demo-down bench testbin

testbin:
	bash hack/build-testbin.sh >/dev/null

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

crds:
	$(CARGO) run -q --bin ttdrv-crdgen > crds/tenstorrentdriverpolicies.yaml

cluster-up:
	bash hack/cluster.sh up

cluster-down:
	bash hack/cluster.sh down

# The whole suite: lint; unit, agent and cluster tests against a fresh local
# cluster (stopped afterwards whatever the outcome); alert rules with promtool;
# the Helm chart; fault injection on its own cluster (one trial of each of the
# 11 fault kinds, plus the drain and Event regressions); the agent on a real
# kernel under QEMU.
test: lint
	bash hack/build-testbin.sh >/dev/null
	bash hack/run-cluster-tests.sh
	TTDRV_REQUIRE_HELM=1 bash hack/test-alerts.sh
	bash hack/test-chart.sh
	CHAOS_TRIALS=11 bash hack/chaos.sh
	bash hack/test-vm.sh

install-plugins:
	$(CARGO) build --release -p kubectl-tt-driver
	mkdir -p $(HOME)/.local/bin
	cp target/release/kubectl-tt-driver $(HOME)/.local/bin/
	@echo "installed kubectl-tt-driver to $(HOME)/.local/bin (make sure it is on PATH): kubectl tt driver"

# One-command demo on a local simulated cluster (see hack/demo.sh).
demo:
	bash hack/demo.sh

demo-down:
	bash hack/demo.sh down

# Rollout benchmark at 10, 100 and 1000 simulated nodes against a kubectl
# baseline, on its own cluster (see docs/benchmarks.md).
bench:
	bash hack/bench.sh
