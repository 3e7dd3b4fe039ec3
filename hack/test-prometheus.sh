#!/usr/bin/env bash
# Observability acceptance against the real parts: the controller drives a
# simulated rollout (one node made to fail) and a firmware rollout (one flash
# made to fail) on the test cluster, and the VFIO
# binder runs over a planted host (one Wormhole function on vfio-pci), while a
# real Prometheus (Debian package) scrapes both with our alert rules loaded; then every
# PromQL query of the dashboards must parse and return data (0 is data: the
# controller has seen no error, restart or full mailbox, and those panels must
# show 0, not "no data"), and the TTDriverNodeFailed expression must return
# the failed node.
#
# Needs KUBECONFIG pointing at the test cluster (make test sets it).
#
# Everything it starts (controller, simulated agent, prometheus) listens on a
# free port of its own and is stopped at the end by the PIDs recorded at start
# (hack/lib.sh). A prometheus service of the machine is left alone.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${KUBECONFIG:?run from make test, or export KUBECONFIG=\$(hack/cluster.sh kubeconfig)}"
# shellcheck source=lib.sh
source hack/lib.sh
bash hack/install-prometheus.sh
bin=$(bash hack/build-testbin.sh etcd kwok kubernetes 2>/dev/null | tail -n1)
export PATH="$bin:${CARGO_TARGET_DIR:-$PWD/target}/debug:$PATH"
cargo build -q --bin ttdrv-controller --bin ttdrv-sim-agent --bin ttdrv-vfio-manage \
  -p ttdrv-controller -p ttdrv-testkit -p ttdrv-vfio

id=prom-$RANDOM
work=$(mktemp -d)
pids=$work/pids
cleanup() {
  procs_stop "$pids"
  kubectl delete ttdp,ttfwp -l ttdrv-test=$id --wait=false >/dev/null 2>&1 || true
  kubectl delete nodes -l ttdrv-test=$id --wait=false >/dev/null 2>&1 || true
  kubectl delete ns $id --wait=false >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
admin=$(free_port); promport=$(free_port); vfioport=$(free_port)

kubectl apply -f crds/ >/dev/null
kubectl create ns $id >/dev/null
for n in a b c; do
  kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Node
metadata:
  name: $id-$n
  annotations: {kwok.x-k8s.io/node: fake}
  labels: {type: kwok, ttdrv-test: $id, kubernetes.io/hostname: $id-$n, feature.node.kubernetes.io/pci-1200_1e52.present: "true"}
status: {allocatable: {cpu: "8", memory: 32Gi, pods: "110"}, capacity: {cpu: "8", memory: 32Gi, pods: "110"}}
YAML
done

ttdrv-controller --namespace $id --policy-selector ttdrv-test=$id --leader-elect=false \
  --admin-addr 127.0.0.1:$admin --resync-ms 500 --upgrade-timeout-seconds 8 >"$work/controller.log" 2>&1 &
procs_record "$pids" $! ttdrv-controller
ttdrv-sim-agent --namespace $id --work-ms 500 >"$work/agent.log" 2>&1 &
procs_record "$pids" $! ttdrv-sim-agent
# The binder's host: one n150 function already on vfio-pci (nothing to bind).
h=$work/host; fn=$h/sys/devices/pci0000:00/0000:01:00.0
mkdir -p "$fn" "$h/sys/bus/pci/devices" "$h/sys/bus/pci/drivers/vfio-pci" "$h/proc/sys/kernel/random"
printf '%s\n' 0x1e52 >"$fn/vendor"; printf '%s\n' 0x401e >"$fn/device"; printf '%s\n' 0x0018 >"$fn/subsystem_device"
ln -s ../../../bus/pci/drivers/vfio-pci "$fn/driver"
ln -s ../../../devices/pci0000:00/0000:01:00.0 "$h/sys/bus/pci/devices/0000:01:00.0"
echo b0071d >"$h/proc/sys/kernel/random/boot_id"
printf 'devices:\n- {resourceName: tenstorrent.com/wormhole-vfio, vendorId: "1e52", deviceId: ["401e"]}\n' >"$work/vfio.yaml"
ttdrv-vfio-manage --host-root "$h" --config "$work/vfio.yaml" --state-dir= --no-node-report \
  --bind-interval 2s --metrics-addr 127.0.0.1:$vfioport >"$work/vfio.log" 2>&1 &
procs_record "$pids" $! ttdrv-vfio-manage
cat > "$work/prometheus.yml" <<YAML
global: {scrape_interval: 2s, evaluation_interval: 2s}
rule_files: [$PWD/dashboards/alerts/ttdriver.rules.yaml]
scrape_configs:
  - job_name: tt-driver-manager
    # cluster: as a Prometheus of several clusters labels them (the
    # dashboards' cluster variable then has a value to offer).
    static_configs: [{targets: ["127.0.0.1:$admin"], labels: {cluster: $id}}]
  - job_name: tt-vfio
    # node: as the chart's PodMonitor labels the binder's series.
    static_configs: [{targets: ["127.0.0.1:$vfioport"], labels: {cluster: $id, node: $id-a}}]
YAML
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/data" \
  --web.listen-address=127.0.0.1:$promport >"$work/prometheus.log" 2>&1 &
prom_pid=$!
procs_record "$pids" $prom_pid prometheus
prom_start=$(procs_starttime $prom_pid || true)

# The DRA kubelet plugin of tt-dra-driver on every node, each node's slice
# listing its one card (the simulated agent counts one): the upgraded nodes'
# plugins are restarted and their cards seen again before the uncordon
# (ttdriver_node_scheduling_surface_seconds).
kubectl apply -n $id -f - >/dev/null <<YAML
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: dra}
spec:
  selector: {matchLabels: {app.kubernetes.io/name: tt-dra-driver}}
  template:
    metadata: {labels: {app.kubernetes.io/name: tt-dra-driver}}
    spec:
      nodeSelector: {ttdrv-test: $id}
      containers: [{name: plugin, image: busybox}]
YAML
for n in a b c; do
  uid=$(kubectl get node $id-$n -o jsonpath='{.metadata.uid}')
  kubectl apply -f - >/dev/null <<YAML
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata:
  name: $id-$n-tenstorrent.com
  ownerReferences: [{apiVersion: v1, kind: Node, name: $id-$n, uid: $uid}]
spec:
  driver: tenstorrent.com
  nodeName: $id-$n
  pool: {name: $id-$n, generation: 1, resourceSliceCount: 1}
  devices: [{name: card0}]
YAML
done

kubectl apply -f - >/dev/null <<YAML
apiVersion: driver.tenstorrent.com/v1alpha1
kind: TenstorrentDriverPolicy
metadata: {name: $id, labels: {ttdrv-test: $id}}
spec: {version: "2.7.0", nodeAffinity: {matchLabels: {ttdrv-test: $id}}}
YAML
kubectl wait --for=condition=Ready ttdp/$id --timeout=120s >/dev/null
# The last node in rollout order will fail its upgrade (the simulated agent never
# becomes Ready), so the two others complete first and then the rollout halts.
kubectl annotate node $id-c sim.ttdrv.io/fail=true >/dev/null
kubectl patch ttdp $id --type merge -p '{"spec":{"version":"2.8.0"}}' >/dev/null
for _ in $(seq 1 120); do
  state=$(kubectl get ttdp $id -o jsonpath="{.status.nodes[?(@.name=='$id-c')].state}")
  [ "$state" = Failed ] && break
  sleep 1
done
[ "$state" = Failed ] || { echo "node $id-c did not reach Failed (state: $state)"; tail -20 "$work/controller.log"; exit 1; }
# A firmware policy over the same nodes: a flashes, b's simulated flash fails
# (c keeps the driver's cordon of its failed upgrade: not flashed). a's DRA
# plugin is restarted before its uncordon (ttfw_scheduling_surface_seconds).
kubectl annotate node $id-b sim.ttdrv.io/fw-fault=flash >/dev/null
kubectl apply -f - >/dev/null <<YAML
apiVersion: firmware.tenstorrent.com/v1alpha1
kind: TenstorrentFirmwarePolicy
metadata: {name: $id-fw, labels: {ttdrv-test: $id}}
spec: {version: "19.8.0", nodeAffinity: {matchLabels: {ttdrv-test: $id}}, upgradePolicy: {maxParallel: 2}}
YAML
# fw_state_within NODE STATE SECONDS: waits for the firmware policy's NODE
# to reach STATE, or fails saying what it was.
fw_state_within() {
  local fw=""
  for _ in $(seq 1 "$3"); do
    fw=$(kubectl get ttfwp $id-fw -o jsonpath="{.status.nodes[?(@.name=='$1')].state}")
    [ "$fw" = "$2" ] && return 0
    sleep 1
  done
  echo "firmware node $1 not $2 within $3 s (state: $fw)"; tail -20 "$work/controller.log"; exit 1
}
fw_state_within $id-b Failed 60
fw_state_within $id-a Done 90
echo "test-prometheus: node $id-c (driver) and $id-b (firmware) are Failed as arranged; checking dashboards and alerts"
python3 hack/check-dashboard-queries.py "http://127.0.0.1:$promport" --wait 60 \
  --expect-alert "TTDriverNodeFailed:node=$id-c" --expect-alert "TTFirmwareFlashFailed:cr=$id-fw"
# The answers came from our prometheus only if it still holds its port.
procs_is $prom_pid "$prom_start" "$(procs_boot_id)" \
  || { echo "test-prometheus: our prometheus (pid $prom_pid) is not running"; tail -20 "$work/prometheus.log"; exit 1; }
