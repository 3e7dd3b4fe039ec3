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
#   3. the policy moves to 2.8.0: cordon, eviction of the workload through the
#      Eviction API, the go-ahead, the agent's real build of 2.8.0,
#      finit_module, readiness, uncordon, labels; the workload comes back
#   4. back to 2.7.0: the same cycle, the module served from the agent's cache
#   5. the deliberate break: the controller stopped, the installer DaemonSet
#      edited by hand to 2.8.0 and the pod replaced, with the workload holding
#      the device: the agent waits for a go-ahead that never comes and the
#      loaded 2.7.0 stays (module, refcnt and holder unchanged)
#
# The guest reports the loaded module, its refcnt and the agent's summaries on
# its console (hack/vm-node/init); the node's record (policy status) and the
# Events give the controller's side. Every phase is timed and printed.
# Everything is taken down afterwards, whatever the outcome: QEMU by its
# recorded PID (hack/procs.sh), then hack/realnode.sh down.
#
# Env: TTDRV_CLUSTER_NAME (default ttdrv-vmnode; "-realnode" appended as
# hack/realnode.sh does), KWOK_WORKDIR (default ~/.kwok-vmnode), TIMEOUT
# (seconds per wait, default 600: TCG is slow), VM_MEM (MiB, default 3072),
# VM_SMP (default 2), KEEP_VMNODE=1 (leave everything up; stop it with
# hack/test-vm-node.sh down), VMNODE_STOP_AFTER=boot|ready|install (end early).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
cd "$root"
# shellcheck source=procs.sh
source "$here/procs.sh"
# shellcheck source=versions.env
source "$here/versions.env"
TTDRV_CLUSTER_NAME=${TTDRV_CLUSTER_NAME:-ttdrv-vmnode}
[[ $TTDRV_CLUSTER_NAME == *-realnode ]] || TTDRV_CLUSTER_NAME=$TTDRV_CLUSTER_NAME-realnode
KWOK_WORKDIR=${KWOK_WORKDIR:-$HOME/.kwok-vmnode}
[[ $KWOK_WORKDIR == *-realnode ]] || KWOK_WORKDIR=$KWOK_WORKDIR-realnode
export TTDRV_CLUSTER_NAME KWOK_WORKDIR
timeout_s=${TIMEOUT:-600}
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
}
cycles=()
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
(cd "/lib/modules/$kver" && cp -a --parents kernel/net/netfilter kernel/net/ipv4/netfilter kernel/net/ipv6/netfilter \
  kernel/net/bridge kernel/net/ipv6/ipv6.ko kernel/net/llc kernel/net/802 kernel/drivers/net/veth.ko \
  kernel/drivers/net/virtio_net.ko kernel/drivers/net/net_failover.ko kernel/net/core/failover.ko \
  kernel/drivers/virtio kernel/fs/overlayfs kernel/lib "$mods/") 2>/dev/null || true
depmod -b "$groot" "$kver"
cp -a "/usr/src/linux-headers-$kver" "$groot/usr/src/"
common=$(readlink -f "/usr/src/linux-headers-$kver/Makefile" | sed -n 's#^/usr/src/\([^/]*\)/.*#\1#p')
[ -n "$common" ] && [ "$common" != "linux-headers-$kver" ] && cp -a "/usr/src/$common" "$groot/usr/src/"
cp -a /usr/lib/linux-kbuild-* "$groot/usr/lib/"
ln -sfn "/usr/src/linux-headers-$kver" "$mods/build"

# The tt-kmd sources the agent clones: the stub module's repository, read
# through the installer pod's /host mount.
"$root/tests/fixtures/stub-module/make-repo.sh" "$groot/opt/tt-kmd.git" 2.7.0 2.8.0
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
setsid nsenter -t "$anchor" -m -n -- qemu-system-x86_64 -accel tcg -m "${VM_MEM:-3072}" -smp "${VM_SMP:-2}" \
  -kernel "/boot/vmlinuz-$kver" -initrd "$vmdir/initramfs.cpio" \
  -append "console=ttyS0 rdinit=/init panic=-1 quiet loglevel=3" \
  -nic user,model=virtio-net-pci -nographic -no-reboot -monitor none -serial stdio -nodefaults \
  </dev/null >"$console" 2>&1 &
procs_record "$vmdir/pids/qemu" $! qemu
log "qemu started (pid $!), console $console"
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

report
echo "test-vm-node: 1 passed, 0 failed"
