#!/usr/bin/env bash
# The cluster stage of `make test`: a fresh local cluster, every cargo test of
# the workspace (unit, agent, and cluster tests against the real API server),
# then the script-driven cluster checks. The cluster is stopped whatever happens.
set -euo pipefail
cd "$(dirname "$0")/.."
bash hack/cluster.sh down >/dev/null 2>&1 || true
trap 'bash hack/cluster.sh down >/dev/null 2>&1 || true' EXIT
KUBECONFIG=$(bash hack/cluster.sh up)
export KUBECONFIG
PATH="$(bash hack/build-testbin.sh 2>/dev/null | tail -n1):$PATH"
export PATH
status=0
cargo test --workspace --no-fail-fast || status=1
bash hack/test-prometheus.sh || status=1
bash hack/test-chart.sh --cluster || status=1
exit $status
