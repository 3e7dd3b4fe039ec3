#!/usr/bin/env bash
# Starts or stops the local simulated test cluster: a real kube-apiserver, etcd,
# kube-controller-manager and kube-scheduler, plus kwok simulating the nodes,
# all run as local processes by `kwokctl --runtime binary`.
#
#   hack/cluster.sh up        # idempotent; prints the kubeconfig path last
#   hack/cluster.sh down      # idempotent; leaves no processes behind
#   hack/cluster.sh kubeconfig
#   hack/cluster.sh env       # `eval "$(hack/cluster.sh env)"` sets PATH and KUBECONFIG
#
# kwokctl starts each component in a session of its own (setsid) and records its
# PID in $KWOK_WORKDIR/clusters/<name>/pids/<component>.pid (tests/chaos.rs
# rewrites the file when it restarts a component); `kwokctl delete cluster`
# stops them by those files. `down` then stops, by the same PIDs, whatever of
# them outlived that — never a process found by name or pattern.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"
name=${TTDRV_CLUSTER_NAME:-ttdrv}
# shellcheck source=versions.env
source "$here/versions.env"
bin=$("$here/build-testbin.sh" etcd kwok kubernetes | tail -n1)
export PATH="$bin:$PATH"
export KWOK_WORKDIR=${KWOK_WORKDIR:-$HOME/.kwok}
kubeconfig="$KWOK_WORKDIR/clusters/$name/kubeconfig.yaml"

log() { printf '[cluster %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

healthy() {
  [ -f "$kubeconfig" ] && kubectl --kubeconfig "$kubeconfig" get --raw /readyz >/dev/null 2>&1
}

# kwok's default stages, except that pods of our installer DaemonSet (labelled
# driver.tenstorrent.com/policy) are left for the simulated agent to make Ready:
# on a real node the agent's readiness depends on the loaded module version.
write_stages() {
  local dir out=$1
  dir=$(cd "$here" && GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  python3 "$here/kwok-stages.py" "$dir/kustomize/stage" "$out"
}

up() {
  if healthy; then log "cluster '$name' already running"; echo "$kubeconfig"; return; fi
  # A half-started or stale cluster (processes killed by a previous session) is
  # torn down and recreated rather than trusted.
  down >/dev/null 2>&1 || true
  log "creating cluster '$name' from $bin"
  mkdir -p "$KWOK_WORKDIR"
  local stages="$KWOK_WORKDIR/ttdrv-stages.yaml"
  write_stages "$stages"
  # Extra kwokctl configuration files (space-separated), e.g. hack/realnode.sh's
  # KwokctlConfiguration (certificate SANs, which nodes kwok leaves alone).
  local -a extra=()
  local c
  for c in ${TTDRV_KWOK_CONFIG:-}; do extra+=(--config "$c"); done
  kwokctl create cluster --name "$name" --runtime binary \
    --kube-apiserver-binary "$bin/kube-apiserver" \
    --kube-controller-manager-binary "$bin/kube-controller-manager" \
    --kube-scheduler-binary "$bin/kube-scheduler" \
    --etcd-binary "$bin/etcd" \
    --kwok-controller-binary "$bin/kwok" \
    --config "$stages" "${extra[@]}" \
    --kube-audit-policy "$here/audit-policy.yaml" \
    --wait 120s >&2
  kubectl --kubeconfig "$kubeconfig" get --raw /readyz >/dev/null
  log "cluster '$name' ready"
  echo "$kubeconfig"
}

down() {
  local dir="$KWOK_WORKDIR/clusters/$name" f pid exe procs
  procs=$(mktemp)
  # Before kwokctl removes them: the components its pid files name, each only if
  # that PID still runs this cluster's own copy of the binary ($dir/bin/...);
  # a stale file's PID may belong to another process by now.
  for f in "$dir"/pids/*.pid; do
    [ -f "$f" ] || continue
    pid=$(tr -dc 0-9 <"$f")
    [ -n "$pid" ] || continue
    exe=$(procs_argv0 "$pid") || continue
    case $exe in
      "$dir"/*) procs_adopt "$procs" "$pid" "$(basename "$f" .pid)" ;;
      *) log "not stopping pid $pid of $f: it runs $exe, not this cluster's" ;;
    esac
  done
  kwokctl delete cluster --name "$name" >&2 || true
  # kwokctl SIGKILLs each component it knows of; anything recorded above that
  # survived it (or its process group) is stopped here.
  procs_stop "$procs" group
  rm -f "$procs"
  log "cluster '$name' stopped"
}

case ${1:-up} in
  up) up ;;
  down) down ;;
  kubeconfig) echo "$kubeconfig" ;;
  env) printf 'export PATH=%q:"$PATH"\nexport KUBECONFIG=%q\n' "$bin" "$kubeconfig" ;;
  *) echo "usage: $0 up|down|kubeconfig|env" >&2; exit 2 ;;
esac
