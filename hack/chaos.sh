#!/usr/bin/env bash
# Chaos test of the controller (issue 12): rollouts on 10 simulated nodes while
# the controller is SIGKILLed at random moments, the kube-apiserver is
# restarted, a node is deleted while Draining, a node is added, the version
# changes mid-rollout, spec.paused is toggled, nodes go NotReady (one, or all),
# installer pods are deleted, nodes leave the policy and come back, and the
# policy's rules (soak, maintenance window, refused spec, canary promotion) are
# checked through kills; an
# independent watcher checks the invariants throughout. See docs/reliability.md.
#
# It runs on its own cluster (default name ttdrv-chaos, never the shared test
# cluster, since it restarts the API server), which it creates and tears down.
# CHAOS_CLUSTER names another one, KWOK_WORKDIR (read by hack/cluster.sh) moves
# its kwok work directory: two runs side by side need both.
#
#   bash hack/chaos.sh                       # 32 trials, two of each of the 16 kinds (~15 min on 2 cores)
#   CHAOS_TRIALS=16 bash hack/chaos.sh       # one of each kind (make test)
#   CHAOS_TRIALS=72 bash hack/chaos.sh       # long variant (six of each kind)
#   CHAOS_SEED=<seed> CHAOS_KIND=<kind> bash hack/chaos.sh   # replay one trial
#   CHAOS_KIND=<kind>[,<kind>...] CHAOS_TRIALS=<n> bash hack/chaos.sh chaos_rollouts
#                                            # n trials cycling through these kinds only
#   CHAOS_RUN_SEED=<seed> bash hack/chaos.sh                # replay a whole run's schedule
#   CHAOS_P409=0.05 CHAOS_P429=0.03 bash hack/chaos.sh      # injected error rates (proxy)
#   bash hack/chaos.sh status_write_conflicts               # only the tests matching a filter
#
# Exit status: the test's. The summary (one line per trial) is printed last and
# written to $CHAOS_SUMMARY (default target dir/chaos-summary.txt).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
export TTDRV_CLUSTER_NAME=${CHAOS_CLUSTER:-ttdrv-chaos}
export CHAOS_CLUSTER=$TTDRV_CLUSTER_NAME
if [ "$TTDRV_CLUSTER_NAME" = "ttdrv" ]; then
  echo "refusing to run chaos on the shared test cluster 'ttdrv'" >&2
  exit 2
fi
export CHAOS_TRIALS=${CHAOS_TRIALS:-24}
target=${CARGO_TARGET_DIR:-$repo/target}
export CHAOS_SUMMARY=${CHAOS_SUMMARY:-$target/chaos-summary.txt}
mkdir -p "$(dirname "$CHAOS_SUMMARY")"
rm -f "$CHAOS_SUMMARY"

start=$(date +%s)
cd "$repo"
# Build first, so the cluster does not idle during compilation.
cargo test --test chaos --no-run >&2

# Controller processes the test started (killed here if the test itself dies).
export CHAOS_PIDFILE=$target/chaos-controllers.pids
rm -f "$CHAOS_PIDFILE"
cleanup() {
  if [ -f "$CHAOS_PIDFILE" ]; then
    while read -r pid; do
      # Only a controller of this run still running (a PID may have been reused
      # since): it runs ttdrv-controller and inherited this run's CHAOS_PIDFILE.
      if { tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null | grep -q ttdrv-controller \
        && { tr '\0' '\n' <"/proc/$pid/environ"; } 2>/dev/null | grep -qxF "CHAOS_PIDFILE=$CHAOS_PIDFILE"; then
        kill -KILL "$pid" 2>/dev/null || true
      fi
    done <"$CHAOS_PIDFILE"
    rm -f "$CHAOS_PIDFILE"
  fi
  bash "$here/cluster.sh" down >/dev/null 2>&1 || true
}
bash "$here/cluster.sh" down >/dev/null 2>&1 || true
trap cleanup EXIT
KUBECONFIG=$(bash "$here/cluster.sh" up)
export KUBECONFIG
eval "$(bash "$here/cluster.sh" env)"

# The controllers reach the API server through a fault-injecting proxy inside
# the test (409 on writes, 429 on any request; rates CHAOS_P409/CHAOS_P429);
# the test and its invariant watcher use the real kubeconfig directly.
export CHAOS_DIRECT_KUBECONFIG=$KUBECONFIG
CHAOS_PROXY_PORT=${CHAOS_PROXY_PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
export CHAOS_PROXY_PORT
proxy_kubeconfig=$target/chaos-proxy-kubeconfig.yaml
cat >"$proxy_kubeconfig" <<YAML
apiVersion: v1
kind: Config
clusters:
- name: chaos-proxy
  cluster:
    server: http://127.0.0.1:$CHAOS_PROXY_PORT
users:
- name: chaos-proxy
  user: {}
contexts:
- name: chaos-proxy
  context: {cluster: chaos-proxy, user: chaos-proxy}
current-context: chaos-proxy
YAML

status=0
# Arguments, if any, filter the tests (e.g. `bash hack/chaos.sh status_write`).
KUBECONFIG=$proxy_kubeconfig cargo test --test chaos -- --ignored --nocapture --test-threads=1 "$@" || status=$?

echo
echo "===== hack/chaos.sh: $(( $(date +%s) - start ))s, exit $status ====="
if [ -f "$CHAOS_SUMMARY" ]; then cat "$CHAOS_SUMMARY"; else echo "no summary written (the test failed before the end)"; fi
exit "$status"
