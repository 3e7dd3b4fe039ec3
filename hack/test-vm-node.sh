#!/usr/bin/env bash
# The VM-node test (`make test-vm-node`): a real module swap, driven by the
# controller, on a Kubernetes node whose kernel loads modules.
#
# hack/realnode.sh brings up the private namespace, the local control plane
# and the host-side real node (which runs the controller from the chart);
# then a QEMU guest (Debian's kernel, TCG) boots into an initramfs holding a
# Debian rootfs with containerd, runc and the CNI plugins, kubelet (built from
# the same Go modules as the control plane), the kernel's headers and the
# agent and pause image archives of `make images`. QEMU runs inside the
# namespace, so the guest's slirp network reaches only it: the guest is
# 10.0.2.15, the namespace 10.0.2.2, where the API server listens. The guest
# registers as node vm-node-1 and:
#
#   1. a policy at 2.7.0 selects it: the chart's installer pod runs the real
#      agent from the agent image, which clones the stub tt-kmd repository
#      (through /host), builds the module with the image's gcc and make against
#      the guest's headers, and loads it (first install: no go-ahead needed)
#   2. a workload pod keeps /dev/tenstorrent/0 open (refcnt 1)
#   3. the policy moves to 2.8.0, build ahead (upgradePolicy.prepare, on by
#      default): the installer pod is replaced at once and its agent builds
#      2.8.0 (cache-cold, real build) while the node serves and labels it
#      kmd-prepared=2.8.0; only then the cordon, the eviction of the workload
#      through the Eviction API, the go-ahead, the same pod's finit_module of
#      the prepared module, readiness, uncordon, labels; the workload comes back
#   4. back to 2.7.0: the same cycle, the module served from the agent's cache
#   4b. (VMNODE_COMPARE=1, the default) 2.7.0 -> 2.9.0 with prepare off: the
#      pod replaced after the drain, the cache-cold build inside the window
#   5. the deliberate break: the controller stopped, the installer DaemonSet
#      edited by hand to another cached version and the pod replaced, with the
#      workload holding the device: the agent waits for a go-ahead that never
#      comes and the loaded module stays (module, refcnt and holder unchanged)
#
# The guest reports the loaded module, its refcnt and the agent's summaries on
# its console (hack/vm-node/init); the node's record (policy status) and the
# Events give the controller's side. Every phase is timed and printed, and
# each cycle's steps in the order they happened. hack/vm-node/cycle.py checks
# each cordon window from the order of API snapshots and of the agent's log
# lines (never from durations): with build-ahead the node carried
# kmd-prepared at its cordon, no installer pod was created inside the window
# and the pod that loaded had built (or found in its cache) before it began to
# wait for the go-ahead, with no build after; with prepare off the loading
# pod came after the cordon and built. It prints each window's figures: node
# out of service (cordon to uncordon), the whole phase (version change to
# Done) and the build's duration and place relative to the cordon.
# Everything is taken down afterwards, whatever the outcome: QEMU by its
# recorded PID (hack/lib.sh), then hack/realnode.sh down.
#
# Env: TTDRV_CLUSTER_NAME (default ttdrv-vmnode; "-realnode" appended as
# hack/realnode.sh does), KWOK_WORKDIR (default ~/.kwok-vmnode), TIMEOUT
# (seconds per wait, default 900: a source build under TCG takes minutes), VM_MEM (MiB, default 3584),
# VM_SMP (default 2), KEEP_VMNODE=1 (leave everything up; stop it with
# hack/test-vm-node.sh down), VMNODE_STOP_AFTER=boot|ready|install (end early),
# VMNODE_COMPARE=0 (skip the prepare-off upgrade to 2.9.0).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
cd "$root"
# shellcheck source=lib.sh
source "$here/lib.sh"
# shellcheck source=versions.env
source "$here/versions.env"
TTDRV_CLUSTER_NAME=${TTDRV_CLUSTER_NAME:-ttdrv-vmnode}
[[ $TTDRV_CLUSTER_NAME == *-realnode ]] || TTDRV_CLUSTER_NAME=$TTDRV_CLUSTER_NAME-realnode
KWOK_WORKDIR=${KWOK_WORKDIR:-$HOME/.kwok-vmnode}
[[ $KWOK_WORKDIR == *-realnode ]] || KWOK_WORKDIR=$KWOK_WORKDIR-realnode
export TTDRV_CLUSTER_NAME KWOK_WORKDIR
timeout_s=${TIMEOUT:-900}
vnode=vm-node-1
rel=tt-k8s-driver-manager
ns=tt-k8s-driver-manager-system
policy=vmnode
pod_cidr=10.215.0.0/24
real_label=ttdrv.io/real-node
pci_label=feature.node.kubernetes.io/pci-1200_1e52.present
pki="$KWOK_WORKDIR/clusters/$TTDRV_CLUSTER_NAME/pki"
kubeconfig="$KWOK_WORKDIR/clusters/$TTDRV_CLUSTER_NAME/kubeconfig.yaml"
# Kept next to the real node's state, so its down removes what is left.
vmdir="$KWOK_WORKDIR/vmnode-$TTDRV_CLUSTER_NAME"
console="$vmdir/console.log"
images_cache=${TTDRV_IMAGES_CACHE:-$HOME/.cache/ttdrv-images}
# Bump when the guest's base rootfs recipe changes (its cache key).
recipe=1
guest_pkgs=containerd,runc,containernetworking-plugins,iptables,kmod,iproute2,procps

t_start=$(date +%s.%N)
t_phase=$t_start
phases=()
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
log() { printf '[test-vm-node %6.1fs] %s\n' "$(since "$t_start")" "$*" >&2; }
phase() { # NAME: closes the current phase
  local d; d=$(since "$t_phase")
  phases+=("$(printf '%-62s %7.1fs' "$1" "$d")")
  log "phase done: $1 (${d}s)"
  t_phase=$(date +%s.%N)
}
report() {
  printf '[test-vm-node] phase times:\n' >&2
  local p
  for p in "${phases[@]}"; do printf '[test-vm-node]   %s\n' "$p" >&2; done
  printf '[test-vm-node]   %-62s %7.1fs\n' total "$(since "$t_start")" >&2
  [ ${#cycles[@]} -eq 0 ] || { printf '[test-vm-node] rollout cycles (from the node record and the guest console):\n' >&2; printf '%s\n' "${cycles[@]}" >&2; }
  [ ${#figures[@]} -eq 0 ] || {
    printf '[test-vm-node] cordon windows (out_of_service: cordon to uncordon; phase: version change to record Done; cordon_to_go_ahead: the drain; host clock. go_ahead_to_load, load_to_uncordon, build_*_vs_cordon: agent clock against host clock):\n' >&2
    printf '%s\n' "${figures[@]}" >&2
  }
}
cycles=()
figures=()
fail() {
  printf '[test-vm-node] FAIL: %s\n' "$*" >&2
  diagnose || true
  report
  echo "test-vm-node: 0 passed, 1 failed"
  exit 1
}
diagnose() {
  [ -n "${rn_ready:-}" ] || return 0
  log "--- diagnostics"
  rn kubectl get nodes -o wide >&2 || true
  rn kubectl get pods -A -o wide >&2 || true
  rn kubectl get ttdp -o jsonpath='{.items[*].status.nodes}' >&2 || true; echo >&2
  rn kubectl -n "$ns" logs -l app.kubernetes.io/component=controller --tail=20 >&2 || true
  rn kubectl get events -A --sort-by=.lastTimestamp 2>/dev/null | tail -n 25 >&2 || true
  [ -f "$console" ] && { log "--- guest console (last 40 lines)"; tr -d '\r' <"$console" | tail -n 40 >&2; }
}

qemu_down() {
  [ -f "$vmdir/pids/qemu" ] && PROCS_STOP_TIMEOUT=5 procs_stop "$vmdir/pids/qemu"
  return 0
}
cleanup() {
  local rc=$?
  if [ "${KEEP_VMNODE:-0}" = 1 ]; then
    log "KEEP_VMNODE=1: the VM node stays up (hack/test-vm-node.sh down when done)"
  else
    qemu_down
    rm -rf "$vmdir"
    bash hack/realnode.sh down >&2 || { log "hack/realnode.sh down left something behind"; rc=1; }
  fi
  exit $rc
}

if [ "${1:-}" = down ]; then
  qemu_down
  rm -rf "$vmdir"
  exec bash hack/realnode.sh down
fi

wait_until() { # DESCRIPTION CMD...: polls CMD until it succeeds, or fails the test
  local what=$1 deadline=$((SECONDS + timeout_s)); shift
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || fail "timed out after ${timeout_s}s: $what"
    sleep 0.5
  done
}
# The guest's console, without carriage returns and escape sequences.
con() { tr -d '\r' <"$console" 2>/dev/null | sed 's/\x1b\[[0-9;?]*[A-Za-z]//g'; }
con_has() { con | grep -q -- "$1"; }
# The guest's time of the first report line matching PATTERN.
con_time() { con | grep -m1 -- "$1" | awk '{print $2}'; }
# The guest's last module report: "module=V refcnt=N dev=..."
module_now() { con | grep '^VMNODE [0-9.]* module=' | tail -n1 | cut -d' ' -f3-; }
node_label() { rn kubectl get node "$vnode" -o jsonpath="{.metadata.labels.${1//./\\.}}"; }
node_state() { rn kubectl get ttdp "$policy" -o jsonpath="{.status.nodes[?(@.name==\"$vnode\")].$1}"; }
is_cordoned() { [ "$(rn kubectl get node "$vnode" -o jsonpath='{.spec.unschedulable}')" = true ]; }
node_ready() { [ "$(rn kubectl get node "$vnode" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ]; }
pods_running() { # NS SELECTOR COUNT
  [ "$(rn kubectl -n "$1" get pods -l "$2" --field-selector="status.phase=Running,spec.nodeName=$vnode" -o name | wc -l)" -eq "$3" ]
}

# --- 1. the namespace, the control plane, the host-side node, the images ----------
trap cleanup EXIT
log "bringing up the namespace and control plane (hack/realnode.sh, cluster $TTDRV_CLUSTER_NAME)"
bash hack/realnode.sh up || fail "hack/realnode.sh up"
eval "$(bash hack/realnode.sh env)"
export -f rn
rn_ready=1
read -r _ ctl_ref _ < <(grep '^controller ' <(bash hack/realnode.sh images))
read -r _ agent_ref agent_tar < <(grep '^agent ' <(bash hack/realnode.sh images))
read -r _ pause_ref pause_tar < <(grep '^pause ' <(bash hack/realnode.sh images))
phase "namespace, control plane, host-side node, images (hack/realnode.sh up)"

# --- 2. the guest's initramfs ---------------------------------------------------------
kver=""
for k in $(ls /boot 2>/dev/null | sed -n 's/^vmlinuz-//p' | sort -V); do
  [ -f "/lib/modules/$k/build/Makefile" ] && kver=$k
done
[ -n "$kver" ] || fail "no kernel with both /boot/vmlinuz-<kver> and its headers (bash hack/deps.sh installs them)"
command -v qemu-system-x86_64 >/dev/null || fail "qemu-system-x86_64 missing (bash hack/deps.sh installs it)"
qemu_down
rm -rf "$vmdir"
mkdir -p "$vmdir/pids" "$vmdir/root"
groot="$vmdir/root"

# The base: Debian with containerd, runc, the CNI plugins, iptables (cached).
sources=""
for f in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list; do
  [ -s "$f" ] && grep -qE '^(deb |Types:)' "$f" && { sources=$f; break; }
done
[ -n "$sources" ] || fail "no Debian apt sources on this machine"
key=$( { echo "recipe=$recipe packages=$guest_pkgs"; cat "$sources"; mmdebstrap --version; } | sha256sum | cut -c1-16)
base="$images_cache/base/vmnode-guest-$key.tar"
if [ ! -s "$base" ]; then
  log "guest base: mmdebstrap --variant=minbase bookworm ($guest_pkgs)"
  mkdir -p "$images_cache/base"
  mmdebstrap --mode=root --quiet --variant=minbase --include="$guest_pkgs" \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
    bookworm "$base.part.tar" "$sources" >&2 || { rm -f "$base.part.tar"; fail "mmdebstrap of the guest base"; }
  mv "$base.part.tar" "$base"
  ls -1t "$images_cache/base/vmnode-guest-"*.tar | tail -n +3 | xargs -r rm -f
fi
tar -xf "$base" -C "$groot"
# iptables: the legacy backend (fewer modules; nothing else in the guest uses nft)
for t in iptables iptables-save iptables-restore; do ln -sf "/usr/sbin/${t/iptables/iptables-legacy}" "$groot/etc/alternatives/$t"; done

# kubelet, from the same Go modules as the control plane
nodebin="${TTDRV_TESTBIN_CACHE:-$HOME/.cache/ttdrv-testbin}/kubernetes-node-$K8S_VERSION"
install -m 0755 "$nodebin/kubelet" "$groot/usr/local/bin/kubelet"

# The kernel's modules the node needs (netfilter, bridge, veth, overlay, virtio), and its headers.
mods="$groot/lib/modules/$kver"
mkdir -p "$mods"
cp /lib/modules/"$kver"/modules.{order,builtin,builtin.modinfo} "$mods/"
# (the list hack/vm-node/init loads, with what each depends on)
guest_mods=$(sed -n 's/^guest_modules="\(.*\)"$/\1/p' "$here/vm-node/init")
[ -n "$guest_mods" ] || fail "no guest_modules list in hack/vm-node/init"
for m in $guest_mods; do
  modprobe -S "$kver" --show-depends "$m" || fail "module $m not found for $kver"
done | awk '$1 == "insmod" {print $2}' | sort -u | while read -r f; do
  mkdir -p "$groot$(dirname "$f")" && cp "$f" "$groot$f"
done
depmod -b "$groot" "$kver"
cp -a "/usr/src/linux-headers-$kver" "$groot/usr/src/"
# Debian's flavour tree includes the common one (linux-headers-<abi>-common) by path.
[ -d "/usr/src/linux-headers-${kver%-*}-common" ] && cp -a "/usr/src/linux-headers-${kver%-*}-common" "$groot/usr/src/"
cp -a /usr/lib/linux-kbuild-* "$groot/usr/lib/"
ln -sfn "/usr/src/linux-headers-$kver" "$mods/build"

# The tt-kmd sources the agent clones: the stub module's repository, read
# through the installer pod's /host mount.
"$root/tests/fixtures/stub-module/make-repo.sh" "$groot/opt/tt-kmd.git" 2.7.0 2.8.0 2.9.0
mkdir -p "$groot/opt/images"
cp "$agent_tar" "$groot/opt/images/agent.tar"
cp "$pause_tar" "$groot/opt/images/pause.tar"

# kubelet's identity, from the cluster's CA; the API server through slirp.
api_port=$(awk -F: '/server:/ {print $NF; exit}' "$kubeconfig" | tr -dc 0-9)
[ -n "$api_port" ] || fail "no API server port in $kubeconfig"
mkdir -p "$groot/etc/kubernetes" "$groot/etc/containerd" "$groot/etc/cni/net.d" "$groot/var/lib/kubelet"
openssl req -new -newkey rsa:2048 -nodes -keyout "$groot/etc/kubernetes/kubelet.key" \
  -subj "/O=system:nodes/CN=system:node:$vnode" -out "$vmdir/kubelet.csr" 2>/dev/null
openssl x509 -req -in "$vmdir/kubelet.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
  -CAserial "$vmdir/ca.srl" -days 2 -out "$groot/etc/kubernetes/kubelet.crt" \
  -extfile <(printf 'extendedKeyUsage=clientAuth') 2>/dev/null
cp "$pki/ca.crt" "$groot/etc/kubernetes/ca.crt"
cat >"$groot/etc/kubernetes/kubelet.kubeconfig" <<EOF
apiVersion: v1
kind: Config
# 10.0.2.2 is the test's namespace through slirp; the certificate names localhost
clusters: [{name: c, cluster: {server: "https://10.0.2.2:$api_port", certificate-authority: /etc/kubernetes/ca.crt, tls-server-name: localhost}}]
users: [{name: u, user: {client-certificate: /etc/kubernetes/kubelet.crt, client-key: /etc/kubernetes/kubelet.key}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
EOF
cat >"$groot/etc/kubernetes/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
address: 10.0.2.15
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
  x509: {clientCAFile: /etc/kubernetes/ca.crt}
authorization: {mode: AlwaysAllow}
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
failSwapOn: false
serializeImagePulls: false
# the guest's root is an initramfs: no disk to watch
evictionHard: {memory.available: "50Mi"}
imageGCHighThresholdPercent: 100
# TCG is slow: the defaults would mark a busy guest unhealthy
runtimeRequestTimeout: 10m
nodeStatusUpdateFrequency: 10s
EOF
cat >"$groot/etc/containerd/config.toml" <<EOF
version = 2
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$pause_ref"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        # the root is the initramfs, which pivot_root cannot leave
        NoPivotRoot = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "/etc/cni/net.d"
EOF
cat >"$groot/etc/cni/net.d/10-vmnode.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "vmnode", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$pod_cidr"}]], "routes": [{"dst": "0.0.0.0/0"}]}}]}
EOF
printf '127.0.0.1 localhost\n10.0.2.15 %s\n' "$vnode" >"$groot/etc/hosts"
printf 'nameserver 127.0.0.1\noptions timeout:1 attempts:1\n' >"$groot/etc/resolv.conf"
echo "$vnode" >"$groot/etc/hostname"
sha256sum <<<"$vnode-$TTDRV_CLUSTER_NAME" | cut -c1-32 >"$groot/etc/machine-id"
printf 'NODE_NAME=%q\nAPI_PORT=%q\nPOD_CIDR=%q\nNODE_LABELS=%q\n' "$vnode" "$api_port" "$pod_cidr" \
  "$real_label=true" >"$groot/etc/vm-node.env"
install -m 0755 "$here/vm-node/init" "$groot/init"
# Uncompressed: TCG would spend minutes in the kernel's gunzip.
(cd "$groot" && find . -print0 | cpio --null -o -H newc --quiet -R 0:0) >"$vmdir/initramfs.cpio"
rm -rf "$groot"
log "initramfs $(du -h "$vmdir/initramfs.cpio" | cut -f1) for kernel $kver"
phase "guest initramfs (Debian base, kubelet, headers, images)"

# --- 3. boot, inside the namespace --------------------------------------------------------
anchor=$(awk '{print $1}' "$KWOK_WORKDIR/realnode-$TTDRV_CLUSTER_NAME/pids/anchor")
setsid nsenter -t "$anchor" -m -n -- qemu-system-x86_64 -accel tcg -m "${VM_MEM:-3584}" -smp "${VM_SMP:-2}" \
  -kernel "/boot/vmlinuz-$kver" -initrd "$vmdir/initramfs.cpio" \
  -append "console=ttyS0 rdinit=/init panic=-1 quiet loglevel=3" \
  -nic user,model=virtio-net-pci -nographic -no-reboot -monitor none -serial stdio -nodefaults \
  </dev/null >"$console" 2>&1 &
procs_record "$vmdir/pids/qemu" $! qemu
log "qemu started (pid $!), console $console"

# The chart, while the guest boots: the controller in-cluster on the host-side
# node; the installer DaemonSet it renders (the agent image) on the VM node.
helm_args=(-n "$ns" --set "controller.image.repository=${ctl_ref%:*}" --set "controller.image.tag=${ctl_ref##*:}"
  --set "driver.image.repository=${agent_ref%:*}" --set "driver.image.tag=${agent_ref##*:}"
  --set controller.image.pullPolicy=Never --set driver.image.pullPolicy=Never
  --set controller.replicas=1 --set 'controller.nodeSelector.kubernetes\.io/hostname=real-node-1'
  # the stub tt-kmd repository in the guest, through the installer pod's /host
  --set 'controller.extraArgs={--resync-ms=1000,--source-repository=/host/opt/tt-kmd.git}')
rn helm install "$rel" chart --create-namespace "${helm_args[@]}" --wait --timeout "${timeout_s}s" >/dev/null \
  || fail "helm install of chart/"
log "chart installed: controller Ready on real-node-1"
wait_until "the guest's init" con_has 'VMNODE [0-9.]* init '
phase "guest kernel boot to init"
wait_until "containerd in the guest" con_has 'VMNODE [0-9.]* containerd up'
phase "guest network, containerd up"
wait_until "images imported in the guest" con_has 'VMNODE [0-9.]* images imported'
phase "agent and pause images imported into the guest's containerd"
[ "${VMNODE_STOP_AFTER:-}" = boot ] && { report; exit 0; }
wait_until "node $vnode Ready" node_ready
phase "kubelet started -> node $vnode registered and Ready"
[ "${VMNODE_STOP_AFTER:-}" = ready ] && { report; exit 0; }

# --- 4. the timeline: the node record, the Node and the workload, on change -------------
timeline="$vmdir/timeline"
: >"$timeline"
watch_cluster() {
  local last="" now p_inst p_wl ok
  while :; do
    # the pods in parallel with the Node and the record: a loaded machine makes
    # each kubectl slow, and the sample period is the figures' resolution
    # (the installer pod(s) on the node: which pod builds, and whether one is
    # replaced inside the cordon window, hack/vm-node/cycle.py)
    rn kubectl -n "$ns" get pods -l app.kubernetes.io/name=tt-driver-installer \
      --field-selector "spec.nodeName=$vnode" -o name >"$timeline.inst" 2>/dev/null &
    p_inst=$!
    rn kubectl -n ml get pods -l app=hold --field-selector=status.phase=Running -o name >"$timeline.wl" 2>/dev/null &
    p_wl=$!
    now=$(rn kubectl get "node/$vnode" "ttdp/$policy" -o json 2>/dev/null | python3 -c '
import json, sys
items = json.load(sys.stdin).get("items", [])
node = next((i for i in items if i["kind"] == "Node"), {})
pol = next((i for i in items if i["kind"] != "Node"), {})
rec = next((n for n in pol.get("status", {}).get("nodes", []) if n["name"] == sys.argv[1]), {})
m = node.get("metadata", {})
print("state=%s reason=%s cordoned=%s go-ahead=%s kmd-version=%s prepared=%s" % (rec.get("state", "-"), rec.get("reason", "-"),
      str(node.get("spec", {}).get("unschedulable", False)).lower(),
      "yes" if "driver.tenstorrent.com/go-ahead" in m.get("annotations", {}) else "no",
      m.get("labels", {}).get("driver.tenstorrent.com/kmd-version", "-"),
      m.get("labels", {}).get("driver.tenstorrent.com/kmd-prepared", "-")))' "$vnode" 2>/dev/null) || now=""
    # a failed query is no sample (an empty pod list would read as gone)
    ok=1
    wait "$p_inst" || ok=0
    wait "$p_wl" || ok=0
    if [ $ok = 0 ] || [ -z "$now" ]; then sleep 0.5; continue; fi
    now="$now installer=$(sed 's#pod/##' "$timeline.inst" | paste -sd, -)"
    now="$now workload=$(sed 's#pod/##' "$timeline.wl" | paste -sd, -)"
    [ "$now" = "$last" ] || { echo "$(date +%s.%N | cut -c1-14) $now" >>"$timeline"; last=$now; }
    sleep 0.5
  done
}
watch_cluster >/dev/null 2>&1 &
procs_record "$vmdir/pids/watch" $! timeline-watch
stop_watch() { [ -f "$vmdir/pids/watch" ] && procs_stop "$vmdir/pids/watch"; return 0; }
trap 'stop_watch; cleanup' EXIT

# first time (host clock) a timeline line at or after T0 matches REGEX
tl_time() { awk -v t0="$1" -v re="$2" '$1 >= t0 && $0 ~ re {print $1; exit}' "$timeline"; }
# first time (guest clock) a console report at or after T0 matches REGEX
con_at() { con | awk -v t0="$1" -v re="$2" '$1 == "VMNODE" && $2 >= t0 && $0 ~ re {print $2; exit}'; }
# the same, for the module reports only ("module=V refcnt=N dev=...")
mod_at() { con | awk -v t0="$1" -v re="$2" '$1 == "VMNODE" && $2 >= t0 && $3 ~ /^module=/ && $0 ~ re {print $2; exit}'; }
# first time an agent log line (by its own timestamp) at or after T0 matches
# REGEX [of installer pod POD only]
agent_at() {
  con | python3 -c '
import re, sys, datetime
t0, pat, pod = float(sys.argv[1]), re.compile(sys.argv[2]), sys.argv[3]
for l in sys.stdin:
    m = re.match(r"VMNODE \S+ agent (\S+) (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z", l)
    if not m or (pod and "_%s_" % pod not in m.group(1)):
        continue
    t = datetime.datetime.fromisoformat(m.group(2)[:26]).replace(tzinfo=datetime.timezone.utc).timestamp()
    if t >= t0 and pat.search(l):
        print("%.3f" % t)
        break' "$1" "$2" "${3:-}"
}
rel() { if [ -n "$2" ]; then awk -v a="$1" -v b="$2" 'BEGIN { printf "%+7.1fs", b - a }'; else printf '%8s' "-"; fi; }
# cycle_table TITLE T0 VERSION [workload]: what happened after the policy moved
# to VERSION at T0, in the order it happened (API rows: host clock; agent and
# console rows: the guest's clock, within about a second of it)
cycle_table() {
  local t0=$2 v=$3 wl=${4:-} t_cord t_load t_upg pod rows row when what out unseen
  t_cord=$(tl_time "$t0" 'cordoned=true')
  t_load=$(mod_at "$t0" "module=$v ")
  t_upg=$(tl_time "$t0" 'state=Upgrading')
  # the installer pod that loaded VERSION: its agent's lines only
  pod=$(con | python3 "$here/vm-node/cycle.py" loader "$timeline" "$t0" "$v")
  rows=(
    "$(tl_time "$t0" "installer=[^ ]*$pod")|installer pod $pod in the API"
    "$(tl_time "$t0" 'reason=Preparing')|record Pending (Preparing: building ahead)"
    "$(agent_at "$t0" "ttdrv-agent starting" "$pod")|agent: started (its first log line)"
    "$(agent_at "$t0" 'cache hit \(verified\)' "$pod")|agent: cache hit (verified)"
    "$(agent_at "$t0" "cache miss" "$pod")|agent: build started (cache miss)"
    "$(agent_at "$t0" 'step="build"' "$pod")|agent: build done"
    "$(tl_time "$t0" "prepared=$v ")|Node label kmd-prepared=$v"
    "$(agent_at "$t0" "waiting for the controller" "$pod")|agent: waiting for the go-ahead"
    "$t_cord|node cordoned (controller)"
    "$(tl_time "$t0" 'state=Draining')|record Draining"
    "$(tl_time "$t0" 'go-ahead=yes')|go-ahead on the Node"
    "$t_upg|record Upgrading"
    "$(agent_at "$t0" "go-ahead is on the node" "$pod")|agent: go-ahead seen"
    "$(agent_at "$t0" 'step="unload"' "$pod")|agent: old module unloaded"
    "$(agent_at "$t0" 'step="load"' "$pod")|agent: new module loaded (finit_module)"
    "$t_load|guest console: $v loaded"
    "$(agent_at "$t0" "summary: result=installed version=$v" "$pod")|agent: summary (installed)"
    "$(tl_time "$t0" "kmd-version=$v ")|Node label kmd-version=$v"
    "$(tl_time "$t0" 'state=Uncordoning')|record Uncordoning"
    "$([ -z "$t_cord" ] || tl_time "$t_cord" 'cordoned=false')|node uncordoned"
    "$([ -z "$t_upg" ] || tl_time "$t_upg" 'state=Done')|record Done"
  )
  # without a workload these rows say nothing
  [ -z "$wl" ] || rows+=(
    "$(tl_time "$t0" 'workload= *$')|workload pod object gone (evicted)"
    "$(mod_at "$t0" 'refcnt=0')|device released in the guest (refcnt 0)"
    "$([ -z "$t_load" ] || mod_at "$t_load" "module=$v refcnt=1")|workload holds the device again (refcnt 1, guest)")
  out=$(printf '[test-vm-node] %s (times after the policy change, in order)\n' "$1"
    for row in "${rows[@]}"; do
      when=${row%%|*} what=${row#*|}
      if [ -n "$when" ]; then printf '%s\t[test-vm-node]   %-58s %s\n' "$when" "$what" "$(rel "$t0" "$when")"; fi
    done | sort -g -k1,1 | cut -f2-
    unseen=""
    for row in "${rows[@]}"; do if [ -z "${row%%|*}" ]; then unseen="$unseen [${row#*|}]"; fi; done
    if [ -n "$unseen" ]; then printf '[test-vm-node]   not seen:%s\n' "$unseen"; fi)
  cycles+=("$out")
  printf '%s\n' "$out" >&2
}
# window_check TITLE T0 VERSION ahead|inside: the structural checks of the
# cordon window (hack/vm-node/cycle.py) and its figures
window_check() {
  local f
  f=$(con | python3 "$here/vm-node/cycle.py" check "$timeline" "$2" "$3" "$4") || fail "$1: cordon window check failed (above)"
  figures+=("$(printf '[test-vm-node]   %-44s %s' "$1:" "$f")")
  log "$1: $f"
}
summary_of() { con | grep -o "summary: result=installed version=$1 .*" | tail -n1; }
# The console lags the API: wait for the agent's summary line of VERSION naming PREVIOUS.
has_summary() { summary_of "$1" | grep -q "previous=$2 "; }
last_module_is() { con | grep '^VMNODE [0-9.]* module=' | tail -n1 | grep -q "$1"; }
done_at() { # VERSION: the record Done, the label at VERSION, not cordoned
  [ "$(node_state state)" = Done ] && [ "$(node_label driver.tenstorrent.com/kmd-version)" = "$1" ] && ! is_cordoned
}
# The audit log: the controller's eviction of a pod through the Eviction API.
evicted_by_controller() {
  python3 - "$KWOK_WORKDIR/clusters/$TTDRV_CLUSTER_NAME/logs/audit.log" "$1" "system:serviceaccount:$ns:$rel-controller" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    e = json.loads(line)
    o = e.get("objectRef", {})
    if (e.get("stage") == "ResponseComplete" and e.get("verb") == "create" and o.get("subresource") == "eviction"
            and o.get("name") == sys.argv[2] and e.get("user", {}).get("username") == sys.argv[3]
            and e.get("responseStatus", {}).get("code", 500) < 300):
        sys.exit(0)
sys.exit(1)
PY
}
inst() { rn kubectl -n "$ns" get pods -l app.kubernetes.io/name=tt-driver-installer --field-selector "spec.nodeName=$vnode" -o jsonpath='{.items[0].metadata.name}'; }
has_inst() { [ -n "$(inst)" ]; }
pod_gone() { ! rn kubectl -n "$1" get pod "$2"; }

# --- 5. first install of 2.7.0: a real build in the installer pod ----------------------------
rn kubectl label node "$vnode" --overwrite "$pci_label=true" >/dev/null
t0=$(date +%s.%N)
rn kubectl apply -f - >/dev/null <<EOF
apiVersion: driver.tenstorrent.com/v1alpha1
kind: TenstorrentDriverPolicy
metadata: {name: $policy}
spec:
  version: "2.7.0"
  nodeAffinity: {matchLabels: {kubernetes.io/hostname: $vnode}}
  upgradePolicy:
    maxUnavailable: 1
    drain: {enable: true, fullNode: false, timeoutSeconds: 600}
EOF
wait_until "an installer pod on $vnode" has_inst
wait_until "the installer container running on $vnode" con_has "VMNODE [0-9.]* agent "
phase "policy 2.7.0 -> installer pod scheduled, agent container started"
wait_until "2.7.0 loaded in the guest" con_has "VMNODE [0-9.]* module=2.7.0 "
phase "agent: clone, real build, finit_module of 2.7.0"
wait_until "the node Done at 2.7.0" done_at 2.7.0
wait_until "the agent's summary for 2.7.0 (previous none)" has_summary 2.7.0 none
summary_of 2.7.0 | grep -q 'previous=none source=build' || fail "2.7.0 was not a source build: $(summary_of 2.7.0)"
p=$(inst)
log "installer pod $p: created $(rn kubectl -n "$ns" get pod "$p" -o jsonpath='{.metadata.creationTimestamp}'), started $(rn kubectl -n "$ns" get pod "$p" -o jsonpath='{.status.containerStatuses[0].state.running.startedAt}'), Ready $(rn kubectl -n "$ns" get pod "$p" -o jsonpath='{.status.conditions[?(@.type=="Ready")].lastTransitionTime}')"
cycle_table "first install of 2.7.0 (nothing loaded)" "$t0" 2.7.0
phase "readiness, labels, node Done at 2.7.0"
[ "${VMNODE_STOP_AFTER:-}" = install ] && { report; exit 0; }

# --- 6. the workload: /dev/tenstorrent/0 held open ---------------------------------------
rn kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Namespace
metadata: {name: ml}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: hold, namespace: ml}
spec:
  replicas: 1
  selector: {matchLabels: {app: hold}}
  template:
    metadata: {labels: {app: hold}}
    spec:
      nodeSelector: {kubernetes.io/hostname: $vnode}
      terminationGracePeriodSeconds: 2
      containers:
      - name: hold
        image: $agent_ref
        imagePullPolicy: Never
        # privileged: no device plugin here, and the device cgroup denies the rest
        securityContext: {privileged: true}
        command: ["/bin/sh", "-c", "until [ -c /dev/tenstorrent/0 ]; do sleep 1; done; exec sleep infinity </dev/tenstorrent/0"]
        volumeMounts: [{name: dev, mountPath: /dev/tenstorrent}]
      volumes:
      - name: dev
        hostPath: {path: /dev/tenstorrent, type: DirectoryOrCreate}
EOF
wait_until "the workload Running on $vnode" pods_running ml app=hold 1
wait_until "the workload holding /dev/tenstorrent/0 (refcnt 1)" last_module_is 'module=2.7.0 refcnt=1'
hold1=$(rn kubectl -n ml get pods -l app=hold -o jsonpath='{.items[0].metadata.name}')
phase "workload $hold1 holds /dev/tenstorrent/0 (refcnt 1)"

# The order: the module changed only after the eviction and the go-ahead.
# (the agent's own time of the unload; the console's reports lag)
swap_after_drain() { # T0 VERSION
  local t_gone t_go t_swap pod
  pod=$(con | python3 "$here/vm-node/cycle.py" loader "$timeline" "$1" "$2")
  t_gone=$(tl_time "$1" 'workload= *$'); t_go=$(tl_time "$1" 'go-ahead=yes'); t_swap=$(agent_at "$1" 'step="unload"' "$pod")
  [ -n "$t_gone" ] && [ -n "$t_go" ] && [ -n "$t_swap" ] || fail "timeline incomplete: evicted=$t_gone go-ahead=$t_go swap=$t_swap"
  awk -v a="$t_gone" -v b="$t_go" -v c="$t_swap" 'BEGIN { exit !(a <= c + 1 && b <= c + 1) }' \
    || fail "module swapped at $t_swap before the eviction ($t_gone) or the go-ahead ($t_go)"
}
prepared_is() { [ "$(node_label driver.tenstorrent.com/kmd-prepared)" = "$1" ]; }

# --- 7. the upgrade 2.7.0 -> 2.8.0 under the workload, built ahead ---------------------------
# Build ahead (upgradePolicy.prepare, on by default): the installer pod is
# replaced at once and its agent builds 2.8.0 (cache-cold) while the node
# serves; the controller cordons only once the node carries
# kmd-prepared=2.8.0, and keeps that pod through the window.
t0=$(date +%s.%N)
rn kubectl patch ttdp "$policy" --type merge -p '{"spec":{"version":"2.8.0"}}' >/dev/null
wait_until "2.8.0 built ahead (kmd-prepared=2.8.0 on the node)" prepared_is 2.8.0
phase "upgrade to 2.8.0: installer pod replaced ahead, real build while the node serves"
wait_until "the node cordoned" is_cordoned
# Until the drain and the go-ahead, the module and its holder stay.
last_module_is 'module=2.7.0 refcnt=1 ' || fail "module touched before the drain: $(module_now)"
wait_until "the workload evicted" pod_gone ml "$hold1"
evicted_by_controller "$hold1" || fail "no eviction of ml/$hold1 by the controller in the audit log"
wait_until "2.8.0 loaded in the guest" con_has "VMNODE [0-9.]* module=2.8.0 "
wait_until "the node Done at 2.8.0" done_at 2.8.0
wait_until "the agent's summary for 2.8.0 (previous 2.7.0)" has_summary 2.8.0 2.7.0
# source=build: this pod built it, ahead of the cordon (window_check)
summary_of 2.8.0 | grep -q 'previous=2.7.0 source=build' || fail "2.8.0 was not a source build replacing 2.7.0: $(summary_of 2.8.0)"
wait_until "the workload back, holding the 2.8.0 device" last_module_is 'module=2.8.0 refcnt=1 '
swap_after_drain "$t0" 2.8.0
window_check "upgrade 2.7.0 -> 2.8.0 (cache-cold, built ahead)" "$t0" 2.8.0 ahead
cycle_table "upgrade 2.7.0 -> 2.8.0 under the workload (real build, ahead)" "$t0" 2.8.0 workload
phase "upgrade to 2.8.0: cordon, eviction, go-ahead, load of the prepared module, uncordon"
hold2=$(rn kubectl -n ml get pods -l app=hold -o jsonpath='{.items[0].metadata.name}')

# --- 8. the downgrade back to 2.7.0, from the agent's cache ------------------------------------
t0=$(date +%s.%N)
rn kubectl patch ttdp "$policy" --type merge -p '{"spec":{"version":"2.7.0"}}' >/dev/null
wait_until "the workload evicted again" pod_gone ml "$hold2"
wait_until "the node Done at 2.7.0 again" done_at 2.7.0
wait_until "the agent's summary for 2.7.0 (previous 2.8.0)" has_summary 2.7.0 2.8.0
summary_of 2.7.0 | grep -q 'previous=2.8.0 source=cache' || fail "the downgrade did not come from the cache: $(summary_of 2.7.0)"
wait_until "the workload back, holding the 2.7.0 device" last_module_is 'module=2.7.0 refcnt=1 '
swap_after_drain "$t0" 2.7.0
window_check "downgrade 2.8.0 -> 2.7.0 (cache hit)" "$t0" 2.7.0 ahead
cycle_table "downgrade 2.8.0 -> 2.7.0 (from the agent's cache)" "$t0" 2.7.0 workload
phase "downgrade to 2.7.0 from the cache"

# --- 8b. without build-ahead: 2.7.0 -> 2.9.0, cache-cold, prepare off ---------------------------
# The comparison: the pod is replaced after the cordon and the drain, and the
# build falls inside the window. VMNODE_COMPARE=0 skips it (one more real build).
cur=2.7.0 other=2.8.0
if [ "${VMNODE_COMPARE:-1}" = 1 ]; then
  hold3=$(rn kubectl -n ml get pods -l app=hold -o jsonpath='{.items[0].metadata.name}')
  t0=$(date +%s.%N)
  rn kubectl patch ttdp "$policy" --type merge \
    -p '{"spec":{"version":"2.9.0","upgradePolicy":{"prepare":{"enabled":false}}}}' >/dev/null
  wait_until "the node cordoned (prepare off)" is_cordoned
  wait_until "the workload evicted (prepare off)" pod_gone ml "$hold3"
  wait_until "the node Done at 2.9.0" done_at 2.9.0
  wait_until "the agent's summary for 2.9.0 (previous 2.7.0)" has_summary 2.9.0 2.7.0
  summary_of 2.9.0 | grep -q 'previous=2.7.0 source=build' || fail "2.9.0 was not a source build replacing 2.7.0: $(summary_of 2.9.0)"
  wait_until "the workload back, holding the 2.9.0 device" last_module_is 'module=2.9.0 refcnt=1 '
  swap_after_drain "$t0" 2.9.0
  window_check "upgrade 2.7.0 -> 2.9.0 (cache-cold, prepare off)" "$t0" 2.9.0 inside
  cycle_table "upgrade 2.7.0 -> 2.9.0 under the workload (real build, prepare off)" "$t0" 2.9.0 workload
  phase "upgrade to 2.9.0, prepare off: cordon, eviction, pod replaced, build, load, uncordon"
  # the cache keeps the target and the previous version
  cur=2.9.0 other=2.7.0
fi

# --- 9. the break: no go-ahead, the module stays -------------------------------------------------
[ -z "$(rn kubectl get node "$vnode" -o jsonpath='{.metadata.annotations.driver\.tenstorrent\.com/go-ahead}')" ] \
  || fail "the go-ahead outlived the cycle"
rn kubectl -n "$ns" scale deploy "$rel-controller" --replicas=0 >/dev/null
no_controller() { [ -z "$(rn kubectl -n "$ns" get pods -l app.kubernetes.io/component=controller -o name)" ]; }
wait_until "no controller pod" no_controller
holdb=$(rn kubectl -n ml get pods -l app=hold -o jsonpath='{.items[0].metadata.name}')
before=$(module_now)
t0=$(date +%s.%N)
# A pod that starts for another reason (here: the DaemonSet edited by hand and
# the pod deleted) with another target (one still cached: no build to wait
# for), while the workload holds the device.
rn kubectl -n "$ns" set env "ds/ttdrv-$policy" "TT_KMD_VERSION=$other" >/dev/null
old=$(inst)
rn kubectl -n "$ns" delete pod "$old" --wait=false >/dev/null
new_inst() { local p; p=$(inst); [ -n "$p" ] && [ "$p" != "$old" ]; }
wait_until "a replacement installer pod" new_inst
agent_waits() { [ -n "$(con_at "$t0" "waiting for the controller.s go-ahead")" ]; }
wait_until "the agent waiting for the go-ahead" agent_waits
# three of the agent's go-ahead polls (every 5 s) later
sleep 16
after=$(module_now)
[ "$before" = "module=$cur refcnt=1 dev=0," ] || fail "unexpected state before the break: $before"
[ "$after" = "$before" ] || fail "without the go-ahead the module changed: before '$before', after '$after'"
[ "$(rn kubectl -n ml get pod "$holdb" -o jsonpath='{.status.phase}')" = Running ] || fail "the workload pod $holdb is not Running"
is_cordoned && fail "node cordoned without a controller"
[ "$(node_label driver.tenstorrent.com/kmd-version)" = "$cur" ] || fail "kmd-version label changed without a go-ahead"
log "no go-ahead: $after, workload $holdb Running, agent: $(con | grep -o "waiting for the controller.s go-ahead.*" | tail -n1 | cut -c1-200)"
phase "break: no controller, pod replaced with target $other: $cur untouched"

stop_watch
log "--- the policy's Events (the controller's side)"
rn kubectl get events -A --field-selector "involvedObject.name=$policy" --sort-by=.lastTimestamp \
  -o custom-columns=TIME:.lastTimestamp,REASON:.reason,MESSAGE:.message 2>/dev/null | tail -n 40 | sed 's/^/[events] /' >&2 || true
log "--- the node's Events"
rn kubectl get events -A --field-selector "involvedObject.name=$vnode" --sort-by=.lastTimestamp \
  -o custom-columns=TIME:.lastTimestamp,REASON:.reason,MESSAGE:.message 2>/dev/null | tail -n 40 | sed 's/^/[events] /' >&2 || true

report
echo "test-vm-node: 1 passed, 0 failed"
