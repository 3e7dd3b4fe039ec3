#!/usr/bin/env bash
# The real-node test (a stage of `make test`): the shipped chart and images on
# a real kubelet. This script only brings things up and down: it builds the
# test (tests/real_node.rs) and the kubectl plugin, brings up the real node
# (hack/realnode.sh: containerd, runc, kubelet, kube-proxy joined to a local
# control plane in a private mount + network namespace, the images of `make
# images` imported), and runs the test inside those namespaces. The phases
# and every check are the test's (docs/development.md, "The real-node test");
# each phase is timed and the table printed at the end. The node is taken down
# whatever happens (KEEP_REALNODE=1 keeps it up for a look around).
#
# Env: TTDRV_CLUSTER_NAME (default ttdrv-realnode), KWOK_WORKDIR (default
# ~/.kwok-realnode) as hack/realnode.sh takes them, TIMEOUT (seconds per wait, default 120).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# The same names as hack/realnode.sh: "-realnode" appended unless there.
TTDRV_CLUSTER_NAME=${TTDRV_CLUSTER_NAME:-ttdrv}
[[ $TTDRV_CLUSTER_NAME == *-realnode ]] || TTDRV_CLUSTER_NAME=$TTDRV_CLUSTER_NAME-realnode
KWOK_WORKDIR=${KWOK_WORKDIR:-$HOME/.kwok}
[[ $KWOK_WORKDIR == *-realnode ]] || KWOK_WORKDIR=$KWOK_WORKDIR-realnode
export TTDRV_CLUSTER_NAME KWOK_WORKDIR
LIB_NAME=test-realnode
# shellcheck source=lib.sh
source hack/lib.sh
phases_start
cleanup() {
  local rc=$?
  if [ "${KEEP_REALNODE:-0}" = 1 ]; then
    log "KEEP_REALNODE=1: the node stays up (hack/realnode.sh down when done)"
  else
    bash hack/realnode.sh down >&2 || { log "hack/realnode.sh down left something behind"; rc=1; }
  fi
  exit $rc
}
trap cleanup EXIT

# The test binary and the kubectl plugin, built out here (shared with cargo test's build).
cargo build -q -p kubectl-tt-driver >&2 || fail "building kubectl-tt-driver"
bin=$(cargo test -p ttdrv-controller --test real_node --no-run --message-format=json-render-diagnostics |
  grep '"name":"real_node"' | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p')
[ -x "${bin:-}" ] || fail "building tests/real_node.rs"
phase "test binary and kubectl-tt-driver built"

log "bringing up the real node (cluster $TTDRV_CLUSTER_NAME, workdir $KWOK_WORKDIR)"
bash hack/realnode.sh up || fail "hack/realnode.sh up"
phase "real node up (images, control plane, containerd, kubelet, kube-proxy)"
ref() { awk -v n="$1" '$1 == n {print $2}' <(bash hack/realnode.sh images); }

if bash hack/realnode.sh exec env REALNODE_NODE="${REALNODE_NAME:-real-node-1}" \
  REALNODE_NAMESPACE=tt-k8s-driver-manager-system REALNODE_RELEASE=tt-k8s-driver-manager \
  REALNODE_AUDIT_LOG="$KWOK_WORKDIR/clusters/$TTDRV_CLUSTER_NAME/logs/audit.log" \
  REALNODE_CA="$KWOK_WORKDIR/clusters/$TTDRV_CLUSTER_NAME/pki/ca.crt" \
  REALNODE_CONTROLLER_IMAGE="$(ref controller)" REALNODE_AGENT_IMAGE="$(ref agent)" \
  REALNODE_PAUSE_IMAGE="$(ref pause)" REALNODE_VFIO_IMAGE="$(ref vfio)" \
  REALNODE_FLASHER_IMAGE="$(ref flasher)" REALNODE_FLASH_SIM="$KWOK_WORKDIR/flash-sim" "$bin" --ignored --exact real_node --nocapture --test-threads=1 >&2; then
  echo "test-realnode: 1 passed, 0 failed"
else
  fail "tests/real_node.rs (its output above)"
fi
