#!/usr/bin/env bash
# Rollout benchmark (issue 11): the controller against a serial kubectl baseline
# on a dedicated local simulated cluster. See docs/benchmarks.md.
#
#   bash hack/bench.sh                 # the full run (about 20 minutes on 2 cores)
#   TTDRV_BENCH_SCENARIOS=10:0:1,10:2000:1 bash hack/bench.sh    # a quick one
#   bash hack/bench.sh prepare         # build ahead (issue 22): TTDRV_BENCH_PREPARE=100:off,100:kubectl
#                                      #   TTDRV_BENCH_PARALLEL=1 (at once), TTDRV_BENCH_BUILD_MS, TTDRV_BENCH_LOAD_MS
#   bash hack/bench.sh combined        # one cordon for firmware + driver (issue 32): TTDRV_BENCH_COMBINED=100:on,100:off
#                                      #   (N:on|off[:K]), TTDRV_BENCH_FLASH_MS, TTDRV_BENCH_SWAP_MS
#   TTDRV_BENCH_CONTROLLER_BIN=/path/ttdrv-controller  # measure that build instead of building one
#   bash hack/bench.sh pods            # pod density (issue 23): 1000 nodes, 10,000 pods
#   TTDRV_BENCH_PODS=10000 TTDRV_BENCH_DENSITY_BINS=before=/path/old,after=/path/new \
#     TTDRV_BENCH_SCENARIOS=100:0:1:1 bash hack/bench.sh     # density of two builds, then a rollout among the pods
#
# Scenarios are N:work_ms:maxUnavailable[:baseline_sample[:rollout_sample]]. Results (table,
# JSON, logs) land in ${TTDRV_BENCH_OUT:-/tmp/ttdrv-bench}; the cluster
# (${TTDRV_CLUSTER_NAME:-ttdrv-bench}) is torn down at the end whatever happens.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
export TTDRV_CLUSTER_NAME=${TTDRV_CLUSTER_NAME:-ttdrv-bench}
if [ "$TTDRV_CLUSTER_NAME" = ttdrv ]; then
  echo "bench: refusing to run on the shared test cluster 'ttdrv'" >&2
  exit 2
fi
out=${TTDRV_BENCH_OUT:-/tmp/ttdrv-bench}
# Defaults: 10 and 100 nodes one at a time (maxUnavailable 1) with 0 s and 2 s
# of simulated work per node, the kubectl baseline on all 10 / on 20 of 100.
# 1000 nodes: a whole rollout one node at a time with 0 s (about 4 minutes),
# whole rollouts with maxUnavailable 10% at 0 s and 2 s, and one node at a time
# with 2 s measured on the first 60 nodes and extrapolated (the whole of it
# would take 37 minutes, nearly all of it the simulated work); the baseline on
# 10 nodes, extrapolated.
scenarios=${TTDRV_BENCH_SCENARIOS:-10:0:1,10:2000:1,100:0:1,100:2000:1,1000:0:1:10,1000:0:10%:10,1000:2000:10%:10,1000:2000:1:10:60}
pods=${TTDRV_BENCH_PODS:-0}
prepare=
if [ "${1:-}" = prepare ]; then
  # Build ahead (issue 22): cache-cold 2.7.0 -> 2.8.0, 60 s build and 2 s
  # load per node, one node at a time: the controller with prepare on, off,
  # and the kubectl loop. TTDRV_BENCH_PARALLEL=1 runs them at once, each on
  # its own nodes.
  prepare=${TTDRV_BENCH_PREPARE:-10:on,10:off,10:kubectl,100:on}
fi
combined=
[ "${1:-}" = combined ] && combined=${TTDRV_BENCH_COMBINED:-100:on,100:off}
if [ "${1:-}" = pods ]; then
  # Pod density: 1000 Tenstorrent nodes and 10,000 ordinary pods, then a
  # rollout among them (maxUnavailable 10%).
  scenarios=${TTDRV_BENCH_SCENARIOS:-1000:0:10%:1}
  pods=${TTDRV_BENCH_PODS:-10000}
fi
# The benchmark and the simulated agent are not what is measured: a debug
# build of them (TTDRV_BENCH_TOOLS_PROFILE=debug) saves a release build.
tools_profile=${TTDRV_BENCH_TOOLS_PROFILE:-release}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}

log() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

log "building ttdrv-controller (release), ttdrv-sim-agent, ttdrv-bench ($tools_profile)"
if [ "$tools_profile" = release ]; then
  (cd "$root" && cargo build --release -q -p ttdrv-testkit -p ttdrv-bench \
    --bin ttdrv-sim-agent --bin ttdrv-bench)
else
  (cd "$root" && cargo build -q -p ttdrv-testkit -p ttdrv-bench \
    --bin ttdrv-sim-agent --bin ttdrv-bench)
fi
bin=$CARGO_TARGET_DIR/$tools_profile
# The controller is measured as the image ships it: static musl (Dockerfile),
# whose allocator decides much of the memory figure. Without the musl target
# (rustup target add x86_64-unknown-linux-musl) the glibc build stands in, and
# the results say so.
musl=x86_64-unknown-linux-musl
if [ -n "${TTDRV_BENCH_CONTROLLER_BIN:-}" ]; then
  # A controller built earlier (e.g. of another commit), measured as given.
  controller_bin=$TTDRV_BENCH_CONTROLLER_BIN
  controller_build="given: $controller_bin"
elif rustup target list --installed 2>/dev/null | grep -qx "$musl"; then
  (cd "$root" && cargo build --release -q -p ttdrv-controller --bin ttdrv-controller --target "$musl")
  controller_bin=$CARGO_TARGET_DIR/$musl/release/ttdrv-controller
  controller_build="$musl (static, as in the image)"
else
  (cd "$root" && cargo build --release -q -p ttdrv-controller --bin ttdrv-controller)
  controller_bin=$bin/ttdrv-controller
  controller_build="x86_64-unknown-linux-gnu (glibc; the image is musl: install the musl target to measure it)"
fi

tools=$("$here/build-testbin.sh" etcd kwok kubernetes 2>/dev/null | tail -n1)
export PATH="$tools:$PATH"
mkdir -p "$out"

# The API server records the controller's requests (and only those) in its
# audit log: the benchmark runs the controller as its own ServiceAccount.
export KWOK_KUBE_AUDIT_POLICY=$root/bench/audit-policy.yaml
bash "$here/cluster.sh" down >/dev/null 2>&1 || true
trap 'bash "$here/cluster.sh" down >/dev/null 2>&1 || true' EXIT
KUBECONFIG=$(bash "$here/cluster.sh" up)
export KUBECONFIG
audit_log=$(dirname "$KUBECONFIG")/logs/audit.log
[ -f "$audit_log" ] || { echo "bench: no audit log at $audit_log" >&2; exit 1; }

sa=ttdrv-bench-controller
kubectl create serviceaccount "$sa" -n default >/dev/null
kubectl create clusterrolebinding "$sa" --clusterrole=cluster-admin --serviceaccount="default:$sa" >/dev/null
ctl_kubeconfig=$out/controller.kubeconfig
rm -f "$ctl_kubeconfig"
server=$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}')
ca=$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.certificate-authority}')
kubectl config --kubeconfig="$ctl_kubeconfig" set-cluster bench --server="$server" --certificate-authority="$ca" >/dev/null
kubectl config --kubeconfig="$ctl_kubeconfig" set-credentials "$sa" \
  --token="$(kubectl create token "$sa" -n default --duration=24h)" >/dev/null
kubectl config --kubeconfig="$ctl_kubeconfig" set-context bench --cluster=bench --user="$sa" >/dev/null
kubectl config --kubeconfig="$ctl_kubeconfig" use-context bench >/dev/null

{
  echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo); load before the run: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "commit: $(cd "$root" && git rev-parse --short HEAD)$(cd "$root" && git diff --quiet HEAD -- src api testkit || echo ' (+ uncommitted changes)')"
  [ -z "$combined" ] || echo "combined: $combined (flash ${TTDRV_BENCH_FLASH_MS:-5000} ms, swap ${TTDRV_BENCH_SWAP_MS:-3000} ms)"
  if [ -n "$prepare" ]; then echo "prepare: $prepare (build ${TTDRV_BENCH_BUILD_MS:-60000} ms, load ${TTDRV_BENCH_LOAD_MS:-2000} ms)"; elif [ -z "$combined" ]; then echo "scenarios: $scenarios"; fi
  echo "controller build: $controller_build"
} | tee "$out/machine.txt" >&2

if [ -n "$combined" ]; then
  log "running combined-wave scenarios $combined"
  "$bin/ttdrv-bench" --combined "$combined" --flash-ms "${TTDRV_BENCH_FLASH_MS:-5000}" \
    --load-ms "${TTDRV_BENCH_SWAP_MS:-3000}" --controller-bin "$controller_bin" \
    --sim-agent-bin "$bin/ttdrv-sim-agent" --out-dir "$out" | tee "$out/combined-table.md"
  log "done; results in $out (combined*.json, combined-*-nodes.jsonl, combined.md, logs)"
  exit 0
fi
if [ -n "$prepare" ]; then
  log "running prepare scenarios $prepare"
  "$bin/ttdrv-bench" \
    --prepare "$prepare" \
    ${TTDRV_BENCH_PARALLEL:+--parallel} \
    --build-ms "${TTDRV_BENCH_BUILD_MS:-60000}" --load-ms "${TTDRV_BENCH_LOAD_MS:-2000}" \
    --controller-bin "$controller_bin" \
    --sim-agent-bin "$bin/ttdrv-sim-agent" \
    --baseline-script "$root/bench/baseline.sh" \
    --out-dir "$out" | tee "$out/prepare-table.md"
  log "done; results in $out (prepare-*.json, prepare-*.jsonl, prepare.md, logs)"
  exit 0
fi
log "running scenarios $scenarios"
"$bin/ttdrv-bench" \
  --scenarios "$scenarios" \
  --controller-bin "$controller_bin" \
  --sim-agent-bin "$bin/ttdrv-sim-agent" \
  --controller-kubeconfig "$ctl_kubeconfig" \
  --audit-log "$audit_log" \
  --baseline-script "$root/bench/baseline.sh" \
  --pods "$pods" \
  ${TTDRV_BENCH_DENSITY_BINS:+--density-bins "$TTDRV_BENCH_DENSITY_BINS"} \
  --out-dir "$out" | tee "$out/table.md"
log "done; results in $out (results.json, results.md, table.md, logs)"
