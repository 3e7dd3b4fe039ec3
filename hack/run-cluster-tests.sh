#!/usr/bin/env bash
# The cluster stage of `make test`: a fresh local cluster, every cargo test of
# the workspace (unit, agent, and cluster tests against the real API server),
# then the Prometheus checks. The cluster is stopped whatever happens.
#
# The cluster tests are #[ignore]d so that plain `cargo test` passes without a
# cluster; they are the test targets named cluster* (tests/cluster_*.rs, the
# plugin's tests/cluster*.rs) and run here with --ignored. The chaos tests
# (tests/chaos*.rs, also ignored) are not run here: hack/chaos.sh runs them on a
# cluster of their own, through its fault-injecting proxy.
set -euo pipefail
cd "$(dirname "$0")/.."
bash hack/cluster.sh down >/dev/null 2>&1 || true
trap 'bash hack/cluster.sh down >/dev/null 2>&1 || true' EXIT
KUBECONFIG=$(bash hack/cluster.sh up)
export KUBECONFIG
PATH="$(bash hack/build-testbin.sh 2>/dev/null | tail -n1):$PATH"
export PATH
status=0
# Every tier that needs no cluster (the ignored tests are only listed).
cargo test --workspace --no-fail-fast || status=1
# The cluster tests: only the ignored tests of the cluster* targets (the rest
# of those targets ran above). Same build as above: nothing is recompiled.
cargo test --workspace --no-fail-fast --test 'cluster*' -- --ignored || status=1
bash hack/test-prometheus.sh || status=1
exit $status
