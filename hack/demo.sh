#!/usr/bin/env bash
# One-command demo on a local simulated cluster (no existing cluster needed):
# builds the test-cluster binaries and the operator, starts a kwok cluster with
# two Tenstorrent pools and one ordinary node, runs the controller and a
# simulated node agent, installs 2.7.0 everywhere, then bumps the canary pool
# to 2.8.0 and the prod pool after it, showing the rollout live.
#
# Paced so that each state can be seen: the simulated agent takes the times
# in agent_pacing below, and the device workload on tt-prod-1 takes
# workload_stop seconds to stop when evicted (its node stays Draining), then
# comes back once the node is uncordoned. Every long step prints a line at
# least every 20 s (hack/lib.sh heartbeat), cold builds included.
#
#   hack/demo.sh        run the demo (leaves the cluster up to explore)
#   hack/demo.sh down   stop the controller, the agent and the cluster
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib.sh
source hack/lib.sh
export TTDRV_CLUSTER_NAME=${TTDRV_CLUSTER_NAME:-ttdrv-demo}
# Per cluster name, so that two demos on one machine keep their own PID files.
state=${TMPDIR:-/tmp}/$TTDRV_CLUSTER_NAME
admin_addr=${TTDRV_DEMO_ADMIN_ADDR:-127.0.0.1:18080}
# The simulated agent's pacing, in ms: start, build ahead (before the
# go-ahead: the node is still Pending), module swap (Upgrading), flash. The
# README's "Run it" quotes these (checked by tests/repo_files.rs).
agent_pacing=(--work-ms 2000 --build-ms 5000 --load-ms 6000 --flash-ms 6000)
# Seconds the evicted workload takes to stop: hack/demo/workload.yaml's
# sim.ttdrv.io/stop-seconds label (same check).
workload_stop=$(sed -n 's|.*sim.ttdrv.io/stop-seconds: "\([0-9]*\)".*|\1|p' hack/demo/workload.yaml)
mkdir -p "$state"
ns=tt-k8s-driver-manager-system
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

# The controller and the agent outlive this script; their PIDs and start times
# are kept in $state/<name>.pid, and only those processes are stopped.
stop_ours() {
  for p in controller sim-agent; do procs_stop "$state/$p.pid"; done
}
down() {
  stop_ours
  bash hack/cluster.sh down
}
if [ "${1:-}" = down ]; then down; exit 0; fi
trap heartbeat_stop EXIT

say "Building the local Kubernetes binaries from the Go module proxy (cold: about 20 minutes; cached after the first run)"
bin=$(bash hack/build-testbin.sh etcd kwok kubernetes | tail -n1)
export PATH="$bin:$PATH"
say "Building the operator, the simulated agent and the kubectl plugin (cargo; cold: about 8 minutes)"
# cargo names each crate it compiles; the heartbeat covers the long links.
with_heartbeat "building ttdrv-controller and ttdrv-sim-agent (cargo)" \
  cargo build --bin ttdrv-controller --bin ttdrv-sim-agent -p ttdrv-controller -p ttdrv-testkit
with_heartbeat "building kubectl-tt-driver (cargo)" cargo build -p kubectl-tt-driver
# kubectl finds the plugin as kubectl-tt-driver, and as kubectl-tt-fw (a link)
mkdir -p "$state/bin" && ln -sf "$PWD/target/debug/kubectl-tt-driver" "$state/bin/kubectl-tt-fw"
export PATH="$PWD/target/debug:$state/bin:$PATH"

say "Starting a simulated cluster: real kube-apiserver, etcd, controller-manager, scheduler; kwok nodes"
stop_ours
bash hack/cluster.sh down >/dev/null 2>&1 || true
KUBECONFIG=$(with_heartbeat "starting the cluster" bash hack/cluster.sh up)
export KUBECONFIG

kubectl apply -f hack/demo/nodes.yaml >/dev/null
kubectl get nodes -L tt.tenstorrent.com/pool,feature.node.kubernetes.io/pci-1200_1e52.present

say "Installing the CRD and the operator namespace; starting the controller and a simulated node agent"
kubectl apply -f crds/ >/dev/null
kubectl create namespace "$ns" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl wait --for condition=Established crd/tenstorrentdriverpolicies.driver.tenstorrent.com --timeout=60s >/dev/null
ttdrv-controller --namespace "$ns" --admin-addr "$admin_addr" --leader-elect=true \
  --installer-image ghcr.io/tenstorrent/tt-k8s-driver-manager-rs/agent:demo >"$state/controller.log" 2>&1 &
procs_record "$state/controller.pid" $! ttdrv-controller
ttdrv-sim-agent --namespace "$ns" "${agent_pacing[@]}" >"$state/sim-agent.log" 2>&1 &
procs_record "$state/sim-agent.pid" $! ttdrv-sim-agent

say "Two pools at tt-kmd 2.7.0"
kubectl apply -f hack/demo/policies.yaml
with_heartbeat "installing 2.7.0 (the simulated agent builds and loads it)" \
  kubectl wait --for=condition=Ready ttdp/canary ttdp/prod --timeout=180s
kubectl get ttdp

say "A workload using the device on tt-prod-1 (the drain will evict it before the module swap)"
kubectl apply -f hack/demo/workload.yaml >/dev/null
kubectl rollout status deploy/llm-inference --timeout=60s
kubectl get pods -l app=llm-inference -o wide

say "Canary first: bump canary to 2.8.0 and watch it roll, one node at a time"
echo "Each node: Pending (the agent builds 2.8.0 ahead, while the node still serves) →"
echo "Draining (cordoned; device users evicted) → Upgrading (module swap) → Done (uncordoned)."
echo "The table is the policy's status; each state change is a line of its own (TRANSITIONS)."
kubectl patch ttdp canary --type merge -p '{"spec":{"version":"2.8.0"}}'
# Half-second polls of the table; the transition lines follow the Nodes' records,
# so a state that lasts one write shows too.
kubectl tt driver watch canary --timeout 300 --interval 0.5

say "Canary healthy; what would prod's bump do? (dry run)"
kubectl tt driver plan prod --version 2.8.0 || true

say "Now prod: tt-prod-1 stays Draining while llm-inference stops (${workload_stop}s), then it comes back"
kubectl patch ttdp prod --type merge -p '{"spec":{"version":"2.8.0"}}'
kubectl tt driver watch prod --timeout 300 --interval 0.5

say "The workload is back on tt-prod-1 (a new pod, started after the uncordon)"
kubectl rollout status deploy/llm-inference --timeout=60s
kubectl get pods -l app=llm-inference -o wide

say "Firmware: flash prod's cards to 19.8.0, two nodes at a time, never on a node in a driver cycle"
kubectl apply -f hack/demo/firmware.yaml
kubectl tt fw watch prod-fw --timeout 300 --interval 0.5

say "Done. The cluster keeps running; look around:"
cat <<TXT
  export KUBECONFIG=$KUBECONFIG PATH=$bin:$PWD/target/debug:$state/bin:\$PATH
  kubectl tt driver                       # fleet view
  kubectl get ttdp                        # Version, Matched, UpToDate, InProgress, Failed, Age, Phase, Ready
  kubectl tt fw                           # firmware policies (kubectl get ttfwp)
  kubectl get nodes -L driver.tenstorrent.com/kmd-version,driver.tenstorrent.com/install-mode
  kubectl get events -A --field-selector involvedObject.kind=TenstorrentDriverPolicy
  curl -s $admin_addr/metrics | grep ttdriver_node_state   # Prometheus metrics
  less $state/controller.log              # controller log
  docs/README.md                          # what it does to your nodes, operations, runbook
Stop everything with: make demo-down
TXT
