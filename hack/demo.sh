#!/usr/bin/env bash
# One-command demo on a local simulated cluster (no existing cluster needed):
# builds the test-cluster binaries and the operator, starts a kwok cluster with
# two Tenstorrent pools and one ordinary node, runs the controller and a
# simulated node agent, installs 2.7.0 everywhere, then bumps the canary pool
# to 2.8.0 and the prod pool after it, showing the rollout live.
#
#   hack/demo.sh        run the demo (leaves the cluster up to explore)
#   hack/demo.sh down   stop the controller, the agent and the cluster
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib.sh
source hack/lib.sh
export TTDRV_CLUSTER_NAME=${TTDRV_CLUSTER_NAME:-ttdrv-demo}
state=${TMPDIR:-/tmp}/ttdrv-demo
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

say "Building the local Kubernetes binaries (cached after the first run) and the operator"
bin=$(bash hack/build-testbin.sh etcd kwok kubernetes | tail -n1)
export PATH="$bin:$PATH"
cargo build -q --bin ttdrv-controller --bin ttdrv-sim-agent -p ttdrv-controller -p ttdrv-testkit
cargo build -q -p kubectl-tt-driver
# kubectl finds the plugin as kubectl-tt-driver, and as kubectl-tt-fw (a link)
mkdir -p "$state/bin" && ln -sf "$PWD/target/debug/kubectl-tt-driver" "$state/bin/kubectl-tt-fw"
export PATH="$PWD/target/debug:$state/bin:$PATH"

say "Starting a simulated cluster: real kube-apiserver, etcd, controller-manager, scheduler; kwok nodes"
stop_ours
bash hack/cluster.sh down >/dev/null 2>&1 || true
KUBECONFIG=$(bash hack/cluster.sh up)
export KUBECONFIG

kubectl apply -f hack/demo/nodes.yaml >/dev/null
kubectl get nodes -L tt.tenstorrent.com/pool,feature.node.kubernetes.io/pci-1200_1e52.present

say "Installing the CRD and the operator namespace; starting the controller and a simulated node agent"
kubectl apply -f crds/ >/dev/null
kubectl create namespace "$ns" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl wait --for condition=Established crd/tenstorrentdriverpolicies.driver.tenstorrent.com --timeout=60s >/dev/null
ttdrv-controller --namespace "$ns" --admin-addr 127.0.0.1:18080 --leader-elect=true \
  --installer-image ghcr.io/tenstorrent/tt-k8s-driver-manager-rs/agent:demo >"$state/controller.log" 2>&1 &
procs_record "$state/controller.pid" $! ttdrv-controller
ttdrv-sim-agent --namespace "$ns" --work-ms 2000 >"$state/sim-agent.log" 2>&1 &
procs_record "$state/sim-agent.pid" $! ttdrv-sim-agent

say "Two pools at tt-kmd 2.7.0"
kubectl apply -f hack/demo/policies.yaml
kubectl wait --for=condition=Ready ttdp/canary ttdp/prod --timeout=180s
kubectl get ttdp

say "A workload using the device on tt-prod-1 (the drain will evict it before the module swap)"
kubectl apply -f hack/demo/workload.yaml >/dev/null

say "Canary first: bump canary to 2.8.0 and watch it roll, one node at a time"
kubectl patch ttdp canary --type merge -p '{"spec":{"version":"2.8.0"}}'
kubectl tt driver watch canary --timeout 300

say "Canary healthy; what would prod's bump do? (dry run)"
kubectl tt driver plan prod --version 2.8.0 || true

say "Now prod"
kubectl patch ttdp prod --type merge -p '{"spec":{"version":"2.8.0"}}'
kubectl tt driver watch prod --timeout 300

say "Firmware: flash prod's cards to 19.8.0, two nodes at a time, never on a node in a driver cycle"
kubectl apply -f hack/demo/firmware.yaml
kubectl tt fw watch prod-fw --timeout 300

say "Done. The cluster keeps running; look around:"
cat <<TXT
  export KUBECONFIG=$KUBECONFIG PATH=$bin:$PWD/target/debug:$state/bin:\$PATH
  kubectl tt driver                       # fleet view
  kubectl get ttdp                        # Version, Matched, UpToDate, InProgress, Failed, Age, Phase, Ready
  kubectl tt fw                           # firmware policies (kubectl get ttfwp)
  kubectl get nodes -L driver.tenstorrent.com/kmd-version,driver.tenstorrent.com/install-mode
  kubectl get events -A --field-selector involvedObject.kind=TenstorrentDriverPolicy
  curl -s 127.0.0.1:18080/metrics | grep ttdriver_node_state   # Prometheus metrics
  less $state/controller.log              # controller log
  docs/README.md                          # what it does to your nodes, operations, runbook
Stop everything with: make demo-down
TXT
