#!/usr/bin/env bash
# The kubectl baseline: what an operator would script by hand to roll a new
# installer template across nodes, one node at a time.
#
#   bench/baseline.sh <namespace> <daemonset> <claim-label-selector> <version> <node>...
#
# Changes the DaemonSet's TT_KMD_VERSION (the DaemonSet is OnDelete, so nothing
# moves yet), then per node: cordon, drain, write the upgrade record and the
# go-ahead the agent waits for before it swaps a loaded module (what the
# controller writes), delete the node's installer pod, wait until its
# replacement is Ready (the simulated agent makes it Ready after its work),
# remove both annotations, uncordon. Prints nothing but errors; the caller
# times it.
set -euo pipefail
ns=$1 ds=$2 sel=$3 version=$4
shift 4
policy=${sel#*=}
kubectl -n "$ns" set env "daemonset/$ds" "TT_KMD_VERSION=$version" >/dev/null
for node in "$@"; do
  kubectl cordon "$node" >/dev/null
  kubectl drain "$node" --ignore-daemonsets --delete-emptydir-data --force --timeout=300s >/dev/null 2>&1
  now=$(date +%s)
  kubectl annotate node "$node" --overwrite >/dev/null \
    "driver.tenstorrent.com/upgrade-state={\"policy\":\"$policy\",\"state\":\"Upgrading\",\"target\":\"$version\",\"since\":$now,\"started\":$now,\"cordonedByUs\":true}" \
    "driver.tenstorrent.com/go-ahead={\"policy\":\"$policy\",\"node\":\"$node\",\"target\":\"$version\",\"cycle\":$now}"
  old=$(kubectl -n "$ns" get pods -l "$sel" --field-selector "spec.nodeName=$node" -o name)
  [ -n "$old" ] && kubectl -n "$ns" delete $old --wait=true >/dev/null
  # The DaemonSet controller creates the replacement; wait until it exists and
  # is Ready (kubectl wait fails at once while no pod matches: retry, for at
  # most 5 minutes so an orphaned run cannot loop forever).
  deadline=$((SECONDS + 300))
  until kubectl -n "$ns" wait pod -l "$sel" --field-selector "spec.nodeName=$node" \
      --for=condition=Ready --timeout=300s >/dev/null 2>&1; do
    if ((SECONDS > deadline)); then
      echo "baseline: no Ready installer pod on $node after 300s" >&2
      exit 1
    fi
    sleep 0.1
  done
  kubectl annotate node "$node" driver.tenstorrent.com/upgrade-state- driver.tenstorrent.com/go-ahead- >/dev/null
  kubectl uncordon "$node" >/dev/null
done
