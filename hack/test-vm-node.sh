#!/usr/bin/env bash
# The VM-node test (`make test-vm-node`): a real module swap, driven by the
# controller, on a Kubernetes node whose kernel loads modules. This script
# only brings things up and down; the phases and every check are
# tests/vm_node.rs's (docs/development.md, "The VM node"), run inside the
# namespace, and the cordon-window checks ttdrv_testkit::real_node::cycle's.
#
# hack/realnode.sh brings up the private namespace, the local control plane
# and the host-side real node (which runs the controller from the chart);
# this script builds the guest's initramfs: a Debian rootfs with containerd,
# runc and the CNI plugins, kubelet (built from the same Go modules as the
# control plane), the kernel's headers, a tt-kmd repository with the real
# driver's releases (hack/versions.env) and the stub's, the static map-hold
# (the workload's device holder), the agent and pause image archives of
# `make images`, its configuration from hack/vm-node/ and hack/vm-node/init as
# PID 1; and boots it under QEMU (Debian's kernel, TCG, a q35 machine with one
# emulated Wormhole served by testkit's ttdrv-ttcard) inside the namespace, so
# the guest's slirp network reaches only
# it: the guest is 10.0.2.15, the namespace 10.0.2.2, where the API server
# listens. The guest registers as node vm-node-1 and reports on its console.
# Everything is taken down afterwards, whatever the outcome: QEMU by its
# recorded PID (hack/lib.sh), then hack/realnode.sh down.
#
# Env: TTDRV_CLUSTER_NAME (default ttdrv-vmnode; "-realnode" appended as
# hack/realnode.sh does), KWOK_WORKDIR (default ~/.kwok-vmnode), TIMEOUT
# (seconds per wait, default 900: a source build under TCG takes minutes), VM_MEM (MiB, default 3584),
# VM_SMP (default 2), KEEP_VMNODE=1 (leave everything up; stop it with
# hack/test-vm-node.sh down), VMNODE_STOP_AFTER=boot|ready|install|real (end early; real: after the real driver's phases),
# VMNODE_COMPARE=0 (skip the prepare-off upgrade to 2.9.0), VMNODE_REBOOTS=0
# (skip the guest reboots), VMNODE_FAULTS=0 (skip the faults), VMNODE_STACK=0
# (skip the stack's privileged device holders),
# VMNODE_BOOT_TIMEOUT (seconds a reboot may take, default 300: then the
# guest is dumped and reset), VMNODE_REBOOT_SOAK=N (a boot made to hang, then
# N reboots at rest), VMNODE_CARGO_DONE (a file written once this script
# has no more cargo to run: make test's other lane waits for it before its
# own builds take the target directory's lock). The guest takes its faults on its second serial port
# ($vmdir/ctl.sock), QEMU's monitor is $vmdir/monitor.sock, and the guest
# keeps its module cache and images on $vmdir/disk.img. TTDRV_TTKMD_SOURCE: the
# real driver's repository (default: ../shared/data/tt-kmd.bundle beside the
# repository, else github.com/tenstorrent/tt-kmd).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
cd "$root"
LIB_NAME=test-vm-node
# shellcheck source=lib.sh
source "$here/lib.sh"
# shellcheck source=shared-data.sh
source "$here/shared-data.sh"
TTDRV_CLUSTER_NAME=${TTDRV_CLUSTER_NAME:-ttdrv-vmnode}
[[ $TTDRV_CLUSTER_NAME == *-realnode ]] || TTDRV_CLUSTER_NAME=$TTDRV_CLUSTER_NAME-realnode
KWOK_WORKDIR=${KWOK_WORKDIR:-$HOME/.kwok-vmnode}
[[ $KWOK_WORKDIR == *-realnode ]] || KWOK_WORKDIR=$KWOK_WORKDIR-realnode
export TTDRV_CLUSTER_NAME KWOK_WORKDIR
vnode=vm-node-1
pod_cidr=10.215.0.0/24
real_label=ttdrv.io/real-node
pki="$KWOK_WORKDIR/clusters/$TTDRV_CLUSTER_NAME/pki"
kubeconfig="$KWOK_WORKDIR/clusters/$TTDRV_CLUSTER_NAME/kubeconfig.yaml"
# Kept next to the real node's state, so its down removes what is left.
vmdir="$KWOK_WORKDIR/vmnode-$TTDRV_CLUSTER_NAME"
console="$vmdir/console.log"
images_cache=${TTDRV_IMAGES_CACHE:-$HOME/.cache/ttdrv-images}
# Bump when the guest's base rootfs recipe changes (its cache key).
recipe=2
# udev: the agent's rule (tt-kmd's) makes the by-id links, as on a real host.
guest_pkgs=containerd,runc,containernetworking-plugins,iptables,kmod,iproute2,procps,udev

phases_start
qemu_down() {
  [ -f "$vmdir/pids/qemu" ] && PROCS_STOP_TIMEOUT=5 procs_stop "$vmdir/pids/qemu"
  return 0
}
cleanup() {
  local rc=$?
  # A failed run keeps the guest's console (the VM's directory goes below)
  # and shows what the kernel and udev said about the cards.
  if [ "$rc" != 0 ] && [ -f "$console" ]; then
    { mkdir -p target/ci && cp "$console" target/ci/vm-node-console.log; } || true
    log "the guest's console: target/ci/vm-node-console.log; its kernel and udev lines about the cards:"
    grep -a -i -E 'tenstorrent|udev|telemetry|hwmon' "$console" | grep -a -v ' agent ' | tail -n 15 | cut -c1-300 >&2 || true
  fi
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

# --- 1. the test, the namespace, the control plane, the host-side node, the images
trap cleanup EXIT
bin=$(cargo test -p ttdrv-controller --test vm_node --no-run --message-format=json-render-diagnostics |
  grep '"name":"vm_node"' | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p')
[ -x "${bin:-}" ] || fail "building tests/vm_node.rs"
# The emulated card (testkit's ttdrv-ttcard), run here, beside QEMU.
cargo build -q -p ttdrv-testkit --bin ttdrv-ttcard || fail "building ttdrv-ttcard"
ttcard="${CARGO_TARGET_DIR:-$root/target}/debug/ttdrv-ttcard"
log "bringing up the namespace and control plane (hack/realnode.sh, cluster $TTDRV_CLUSTER_NAME)"
bash hack/realnode.sh up || fail "hack/realnode.sh up"
read -r _ ctl_ref _ < <(grep '^controller ' <(bash hack/realnode.sh images))
read -r _ agent_ref agent_tar < <(grep '^agent ' <(bash hack/realnode.sh images))
read -r _ pause_ref pause_tar < <(grep '^pause ' <(bash hack/realnode.sh images))
phase "namespace, control plane, host-side node, images (hack/realnode.sh up)"
# No cargo after this: make test's other lane builds its test binaries then.
if [ -n "${VMNODE_CARGO_DONE:-}" ]; then : >"$VMNODE_CARGO_DONE"; fi

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
# udev runs for the agent's rule only: init sets up the network, and udev's
# default link policy would rename eth0 and give bridges and veths new MACs.
ln -sf /dev/null "$groot/etc/udev/rules.d/80-net-setup-link.rules"
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
# crc7 too, not loaded at boot: the stub module depends on it, and the agent
# loads it from the guest's /lib/modules (as tt-kmd's hwmon where CONFIG_HWMON=m).
for m in $guest_mods crc7; do
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

# The tt-kmd sources the agent clones, read through the installer pod's
# /host mount: one repository with the real driver's releases of
# hack/versions.env (TTKMD_TEST_VERSIONS: the first install and the upgrade
# under the mmap workload, on the emulated card), each tag checked against
# the chart's pin, and the stub module's tags for the later phases (prepare
# off, faults, reboots), whose in-guest builds take seconds, not minutes.
# The real driver's source as in hack/test-vm.sh real: TTDRV_TTKMD_SOURCE,
# else the bundle in ../shared/data, else GitHub.
src=${TTDRV_TTKMD_SOURCE:-}
if [ -z "$src" ]; then
  src=$(shared_data "$root" tt-kmd.bundle)
  [ -n "$src" ] || src=https://github.com/tenstorrent/tt-kmd.git
fi
kmd="$groot/opt/tt-kmd.git"
git clone -q --bare "$src" "$kmd" 2>/dev/null || fail "cloning tt-kmd from $src (set TTDRV_TTKMD_SOURCE to a clone or URL)"
real_versions=$TTKMD_TEST_VERSIONS
for v in $real_versions; do
  c=$(sed -n "s/^    \"${v//./\\.}\": \([0-9a-f]\{40\}\)\$/\1/p" "$root/chart/values.yaml")
  got=$(git -C "$kmd" rev-parse "ttkmd-$v^{commit}" 2>/dev/null) || fail "tag ttkmd-$v not in $src"
  [ -n "$c" ] && [ "$got" = "$c" ] || fail "tag ttkmd-$v names $got in $src, the chart pins ${c:-nothing} (driver.sourceCommits)"
done
# Only those releases' tags stay; the stub's versions must not be real ones.
git -C "$kmd" tag -l | grep -vxF -f <(printf 'ttkmd-%s\n' $real_versions) | xargs -r git -C "$kmd" tag -d >/dev/null
stub_versions="2.9.0 2.11.0"
for v in $stub_versions; do
  case " $real_versions " in *" $v "*) fail "stub version $v is one of the real releases ($real_versions)" ;; esac
done
# shellcheck disable=SC2086
"$root/tests/fixtures/stub-module/make-repo.sh" "$vmdir/stub.git" $stub_versions
git -C "$kmd" fetch -q "$vmdir/stub.git" 'refs/tags/*:refs/tags/*' || fail "adding the stub's tags"
rm -rf "$vmdir/stub.git"
log "tt-kmd repository for the guest: real $real_versions (from $src), stub $stub_versions"
# The workload's device holder: maps /dev/tenstorrent/0 and closes the fd
# (tests/fixtures/map-hold), static, mounted into its pod from the guest.
mkdir -p "$groot/opt/ttdrv-test"
gcc -static -O2 -o "$groot/opt/ttdrv-test/map-hold" "$root/tests/fixtures/map-hold/map-hold.c" \
  || fail "building map-hold (gcc -static; libc6-dev)"
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
# The guest's configuration files (hack/vm-node/), the placeholders filled.
tmpl() { sed -e "s|\${API_PORT}|$api_port|g" -e "s|\${PAUSE_REF}|$pause_ref|g" -e "s|\${POD_CIDR}|$pod_cidr|g" "$here/vm-node/$1" >"$groot/$2"; }
tmpl kubelet.kubeconfig etc/kubernetes/kubelet.kubeconfig
tmpl kubelet.yaml etc/kubernetes/kubelet.yaml
tmpl containerd.toml etc/containerd/config.toml
tmpl 10-vmnode.conflist etc/cni/net.d/10-vmnode.conflist
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

# The guest's disk: what survives its reboots (the module cache, containerd's
# images; hack/vm-node/init mounts it). Sparse.
truncate -s 4G "$vmdir/disk.img"
mkfs.ext4 -q -F -L vmnode "$vmdir/disk.img" || fail "mkfs.ext4 of the guest's disk"

# --- 3. boot, inside the namespace; then the test, in there too -------------------------
anchor=$(awk '{print $1}' "$KWOK_WORKDIR/realnode-$TTDRV_CLUSTER_NAME/pids/anchor")
# One host thread for both vCPUs (thread=single): with a thread per vCPU
# (QEMU 7.2's default) the guest's kernel locked up now and then in its
# boot, both CPUs stuck in the same NOP of kmem_cache_alloc (a patch site)
# while the kubelet created its first cgroups: soft lockups, RCU stalls,
# the kubelet never reporting the boot (docs/reliability.md).
# One emulated Wormhole (ttdrv-ttcard over QEMU's x-pci-proxy-dev, which
# needs the guest's RAM in a shared memfd; its BAR0 shrunk to 64 MiB to fit
# the 32-bit window): what the real tt-kmd and the stub both bind. Its log
# says what the card was asked.
setsid nsenter -t "$anchor" -m -n -- "$ttcard" --cards wh --wh-bar0-mb 64 --log "$vmdir/cards.log" -- \
  qemu-system-x86_64 -accel tcg,thread=single -smp "${VM_SMP:-2}" \
  -machine q35,memory-backend=ram -object "memory-backend-memfd,id=ram,size=${VM_MEM:-3584}M,share=on" -device @TTCARD@ \
  -kernel "/boot/vmlinuz-$kver" -initrd "$vmdir/initramfs.cpio" \
  -append "console=ttyS0 rdinit=/init panic=-1 quiet loglevel=4 sysrq_always_enabled" \
  -drive "file=$vmdir/disk.img,format=raw,if=virtio,cache=unsafe" \
  -nic user,model=virtio-net-pci -nographic -monitor "unix:$vmdir/monitor.sock,server=on,wait=off" -serial stdio \
  -serial "unix:$vmdir/ctl.sock,server=on,wait=off" -nodefaults \
  </dev/null >"$console" 2>&1 &
procs_record "$vmdir/pids/qemu" $! qemu
log "qemu started (pid $!), console $console"

if bash hack/realnode.sh exec env TIMEOUT="${TIMEOUT:-900}" VMNODE_NODE="$vnode" \
  VMNODE_NAMESPACE=tt-k8s-driver-manager-system VMNODE_RELEASE=tt-k8s-driver-manager \
  VMNODE_CONSOLE="$console" VMNODE_TIMELINE="$vmdir/timeline" VMNODE_CTL="$vmdir/ctl.sock" VMNODE_MONITOR="$vmdir/monitor.sock" \
  VMNODE_AUDIT_LOG="$KWOK_WORKDIR/clusters/$TTDRV_CLUSTER_NAME/logs/audit.log" \
  VMNODE_CONTROLLER_IMAGE="$ctl_ref" VMNODE_AGENT_IMAGE="$agent_ref" \
  VMNODE_REAL_VERSIONS="$real_versions" VMNODE_STUB_VERSIONS="$stub_versions" \
  "$bin" --ignored --exact vm_node --nocapture --test-threads=1 >&2; then
  echo "test-vm-node: 1 passed, 0 failed"
else
  fail "tests/vm_node.rs (its output above)"
fi
