#!/usr/bin/env bash
# A REAL Kubernetes node on this machine: Debian's containerd + runc and the
# CNI plugins, kubelet and kube-proxy built from the same Go modules as the
# control plane (hack/build-testbin.sh node), joined to the control plane of
# hack/cluster.sh, everything inside one private mount + network namespace.
#
#   hack/realnode.sh up        # idempotent; builds and imports the images (hack/images.sh)
#   hack/realnode.sh down      # idempotent; stops what up started, by PID; leaves nothing
#   hack/realnode.sh env       # `eval "$(hack/realnode.sh env)"`: rn CMD... runs CMD in there
#   hack/realnode.sh exec CMD...   # CMD inside the namespaces, KUBECONFIG and PATH set
#   hack/realnode.sh shell     # an interactive shell in there
#   hack/realnode.sh images    # "<image> <ref> <archive>" of the imported images
#
# The namespaces: the network namespace holds only loopback and a veth pair
# whose both ends stay inside (node IP 10.213.0.1, pods 10.214.0.0/24, Services
# 10.0.0.0/24), so no packet leaves it, and nothing outside reaches in. In the
# mount namespace /var/lib, /var/log, /var/cache, /run and /dev are overlays
# whose upper layers live in the work directory, /etc/hosts and
# /etc/resolv.conf are private files, and the global sysctls kubelet writes
# (vm.overcommit_memory, kernel.panic, ...) are private files too. The control
# plane, containerd, kubelet, kube-proxy and every pod run in there; kubectl
# and helm reach the API server only from in there (`exec`, `rn`).
#
# What it took (docs/development.md, and ../shared/design/REALNODE.md): runc
# may not lower oom_score_adj here (restrict_oom_score_adj); HostToContainer
# propagation needs a shared / (only in the private mount namespace); the API
# server dials the kubelet by hostname (private /etc/hosts); kwok leaves the
# node alone (label ttdrv.io/real-node); in-cluster clients dial the Service IP
# 10.0.0.1 (a certificate SAN, and kube-proxy in iptables mode); cgroup v1 needs
# failCgroupV1: false.
#
# Processes: the namespace anchor, containerd, kubelet and kube-proxy are
# started here and recorded with their start times (hack/lib.sh); the
# control plane is hack/cluster.sh's (kwokctl's pid files). Containers are
# stopped through containerd; their shims are found by the shim.pid files in
# containerd's state directory (checked to be this node's), pods' processes by
# this node's own cgroup tree (/sys/fs/cgroup/*/ttdrv-<cluster>), and the last
# check is for any process left in the network namespace. Nothing is found by
# name or command line.
#
# Env: TTDRV_CLUSTER_NAME (default ttdrv; "-realnode" is appended), KWOK_WORKDIR
# (default ~/.kwok; "-realnode" is appended), REALNODE_NAME (default real-node-1), REALNODE_KEEP=1 (down
# keeps the work directory, e.g. its logs/).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
LIB_NAME=realnode
# shellcheck source=lib.sh
source "$here/lib.sh"
# A cluster and a kwok work directory of its own, never another test's: the
# names get "-realnode" unless they end with it.
name=${TTDRV_CLUSTER_NAME:-ttdrv}
[[ $name == *-realnode ]] || name=$name-realnode
export TTDRV_CLUSTER_NAME=$name
KWOK_WORKDIR=${KWOK_WORKDIR:-$HOME/.kwok}
[[ $KWOK_WORKDIR == *-realnode ]] || KWOK_WORKDIR=$KWOK_WORKDIR-realnode
export KWOK_WORKDIR
node=${REALNODE_NAME:-real-node-1}
dir="$KWOK_WORKDIR/realnode-$name"
kubeconfig="$KWOK_WORKDIR/clusters/$name/kubeconfig.yaml"
pki="$KWOK_WORKDIR/clusters/$name/pki"
cache=${TTDRV_TESTBIN_CACHE:-$HOME/.cache/ttdrv-testbin}
nodebin="$cache/kubernetes-node-$K8S_VERSION"
cgroot="ttdrv-$name"
node_ip=10.213.0.1
pod_cidr=10.214.0.0/24
service_ip=10.0.0.1
# kwok leaves nodes with this label alone; kubelet sets it at registration.
real_label=ttdrv.io/real-node


anchor_pid() {
  local pid st boot rest
  [ -f "$dir/pids/anchor" ] || return 1
  read -r pid st boot rest <"$dir/pids/anchor" || return 1
  procs_is "$pid" "$st" "$boot" || return 1
  echo "$pid"
}
# inns CMD...: runs CMD inside the namespaces.
inns() { nsenter -t "$(anchor_pid)" -m -n -- "$@"; }
kbin=""
[ "${1:-}" = __ns-init ] || kbin=$("$here/build-testbin.sh" etcd kwok kubernetes helm 2>/dev/null | tail -n1)
K() { inns "$kbin/kubectl" --kubeconfig "$kubeconfig" --request-timeout=20s "$@"; }
CTR() { inns ctr --address "$dir/containerd/containerd.sock" -n k8s.io "$@"; }

# --- inside the new namespaces (first process; becomes the anchor) -----------
ns_init() {
  local d
  # Writes to these land in $dir/overlay/*/upper, not on the machine.
  for d in var/lib var/log var/cache run dev; do
    mkdir -p "$dir/overlay/${d//\//-}/upper" "$dir/overlay/${d//\//-}/work"
  done
  # /dev: keep its submounts (pts, shm, mqueue, ...) over the overlay.
  mkdir -p "$dir/ns/olddev"
  mount --rbind /dev "$dir/ns/olddev"
  for d in var/lib var/log var/cache run dev; do
    mount -t overlay overlay -o "lowerdir=/$d,upperdir=$dir/overlay/${d//\//-}/upper,workdir=$dir/overlay/${d//\//-}/work" "/$d"
  done
  local sub
  for sub in pts shm mqueue hugepages; do
    if mountpoint -q "$dir/ns/olddev/$sub"; then mount --rbind "$dir/ns/olddev/$sub" "/dev/$sub"; fi
  done
  umount -l "$dir/ns/olddev"
  # kubelet sets these global sysctls: give it private files instead.
  mkdir -p "$dir/ns/sysctl"
  local s f
  for s in vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops kernel/keys/root_maxkeys kernel/keys/root_maxbytes; do
    [ -e "/proc/sys/$s" ] || continue
    f="$dir/ns/sysctl/${s//\//.}"
    cat "/proc/sys/$s" >"$f"
    mount --bind "$f" "/proc/sys/$s"
  done
  # HostToContainer propagation (the agent's /host) needs a shared /: in here only.
  mount --make-rshared /
  # The API server dials the kubelet by its hostname; no DNS in here.
  printf '127.0.0.1 localhost\n%s %s\n' "$node_ip" "$node" >"$dir/ns/hosts"
  printf 'nameserver 127.0.0.1\noptions timeout:1 attempts:1\n' >"$dir/ns/resolv.conf"
  mount --bind "$dir/ns/hosts" /etc/hosts
  mount --bind "$dir/ns/resolv.conf" /etc/resolv.conf
  # Loopback and a veth pair whose both ends stay in here.
  ip link set lo up
  ip link add rn0 type veth peer name rn1
  ip addr add "$node_ip/24" dev rn0
  ip link set rn0 up
  ip link set rn1 up
  ip route add default via 10.213.0.254 dev rn0
  echo "ns ready"
  exec sleep infinity
}

write_configs() {
  mkdir -p "$dir"/{containerd,cni/net.d,cni/ipam,kubelet,kubelet-conf,kube-proxy,pod-logs,logs}
  cat >"$dir/kwok.yaml" <<EOF
# hack/realnode.sh: loaded by kwokctl after hack/cluster.sh's own config.
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokctlConfiguration
options:
  # in-cluster clients dial the kubernetes Service IP and verify it.
  kubeApiserverCertSANs: ["$service_ip"]
componentsPatches:
- name: kwok-controller
  extraArgs:
  # kwok must leave the real node (labelled at registration by kubelet) alone.
  - key: manage-all-nodes
    value: "false"
    override: true
  - key: manage-nodes-with-label-selector
    value: "!$real_label"
# Real kubelets: Kubernetes' own node-monitor timings, not kwokctl's (3m20s),
# so a node cut off from the API server goes NotReady as on a real cluster.
- name: kube-controller-manager
  extraArgs:
  - key: node-monitor-grace-period
    value: "40s"
    override: true
  - key: node-monitor-period
    value: "5s"
    override: true
EOF
  cat >"$dir/containerd/config.toml" <<EOF
version = 2
root = "$dir/containerd/root"
state = "$dir/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "$dir/containerd/containerd.sock"
[debug]
  address = "$dir/containerd/debug.sock"
  level = "info"
[plugins."io.containerd.internal.v1.opt"]
  path = "$dir/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$pause_ref"
  stream_server_address = "127.0.0.1"
  enable_selinux = false
  # no CAP_SYS_RESOURCE here: runc may not set oom_score_adj below containerd's
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$dir/containerd/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$dir/cni/net.d"
EOF
  cat >"$dir/cni/net.d/10-realnode.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "realnode",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "$dir/cni/ipam", "ranges": [[{"subnet": "$pod_cidr"}]],
              "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
  cat >"$dir/kubelet-conf/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
# this node's own cgroup tree (created by hack/realnode.sh, removed by down)
cgroupRoot: /$cgroot
containerRuntimeEndpoint: unix://$dir/containerd/containerd.sock
address: $node_ip
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: AlwaysAllow}
clusterDomain: cluster.local
resolvConf: $dir/ns/resolv.conf
podLogsDir: $dir/pod-logs
failSwapOn: false
serializeImagePulls: false
evictionHard: {memory.available: "100Mi", nodefs.available: "2%", imagefs.available: "2%"}
imageGCHighThresholdPercent: 99
imageGCLowThresholdPercent: 98
EOF
  cat >"$dir/kube-proxy/config.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: $dir/kube-proxy/kubeconfig.yaml
mode: iptables
hostnameOverride: $node
clusterCIDR: $pod_cidr
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack:
  # nf_conntrack_max is global (read-only outside the first network namespace): leave it.
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
iptables:
  localhostNodePorts: false
EOF
}

# client_cert DIR CN ORG: a client certificate from the cluster's CA and a kubeconfig.
client_cert() {
  local d=$1 server
  openssl req -new -newkey rsa:2048 -nodes -keyout "$d/client.key" -subj "/O=$3/CN=$2" -out "$d/client.csr" 2>/dev/null
  openssl x509 -req -in "$d/client.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -CAserial "$d/ca.srl" -days 7 -out "$d/client.crt" -extfile <(printf 'extendedKeyUsage=clientAuth') 2>/dev/null
  server=$(awk '/server:/ {print $2; exit}' "$kubeconfig")
  cat >"$d/kubeconfig.yaml" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: $name, cluster: {server: "$server", certificate-authority: $pki/ca.crt}}]
users: [{name: u, user: {client-certificate: $d/client.crt, client-key: $d/client.key}}]
contexts: [{name: c, context: {cluster: $name, user: u}}]
current-context: c
EOF
}

# The cgroup hierarchies (v1 controllers and the unified one) this node's tree lives in.
cgroup_dirs() {
  local h
  for h in /sys/fs/cgroup/*/; do
    [ -f "$h/cgroup.procs" ] && echo "${h%/}/$cgroot"
  done
}

wait_for() { # SECONDS DESCRIPTION CMD...
  local deadline=$((SECONDS + $1)) what=$2; shift 2
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || die "timed out after ${deadline}s waiting for $what (logs in $dir/logs)"
    sleep 0.2
  done
}

node_ready() {
  [ "$(K get node "$node" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ]
}

up() {
  if anchor_pid >/dev/null && K get node "$node" >/dev/null 2>&1 && node_ready; then
    log "real node $node of cluster '$name' already up"
    return
  fi
  down_quiet
  [ -x "$nodebin/kubelet" ] || bash "$here/build-testbin.sh" node >&2
  kbin=$("$here/build-testbin.sh" etcd kwok kubernetes helm 2>/dev/null | tail -n1)
  for t in containerd runc ctr iptables-save ip nsenter unshare openssl /usr/lib/cni/bridge /usr/lib/cni/host-local; do
    command -v "$t" >/dev/null || die "$t missing (bash hack/deps.sh installs it)"
  done
  mkdir -p "$dir/pids" "$dir/logs" "$dir/ns"
  local t0; t0=$(date +%s.%N)
  bash "$here/images.sh" >"$dir/images.txt"
  pause_ref=$(awk '$1 == "pause" {print $2}' "$dir/images.txt")
  log "images ready in $(since "$t0")s: $(awk '{printf "%s ", $2}' "$dir/images.txt")"
  write_configs

  # 1. the namespaces
  t0=$(date +%s.%N)
  setsid unshare --mount --net --propagation private -- bash "$here/realnode.sh" __ns-init "$dir" \
    >"$dir/logs/ns.log" 2>&1 </dev/null &
  procs_record "$dir/pids/anchor" $! anchor
  wait_for 20 "the namespaces" grep -q 'ns ready' "$dir/logs/ns.log"
  readlink "/proc/$(anchor_pid)/ns/net" >"$dir/ns/netns"
  log "namespaces ready (anchor pid $(anchor_pid), $(cat "$dir/ns/netns")) in $(since "$t0")s"

  # 2. the control plane, in there
  t0=$(date +%s.%N)
  inns env TTDRV_KWOK_CONFIG="$dir/kwok.yaml" bash "$here/cluster.sh" up >"$dir/logs/cluster-up.log" 2>&1 \
    || { tail -n 20 "$dir/logs/cluster-up.log" >&2; die "control plane did not start"; }
  log "control plane up in $(since "$t0")s"

  # 3. containerd, and the images
  t0=$(date +%s.%N)
  setsid nsenter -t "$(anchor_pid)" -m -n -- containerd --config "$dir/containerd/config.toml" \
    >"$dir/logs/containerd.log" 2>&1 </dev/null &
  procs_record "$dir/pids/containerd" $! containerd
  wait_for 30 containerd CTR version
  local archive
  for archive in $(awk '{print $3}' "$dir/images.txt"); do CTR images import "$archive" >/dev/null; done
  log "containerd up, $(wc -l <"$dir/images.txt") images imported in $(since "$t0")s"

  # 4. kubelet
  t0=$(date +%s.%N)
  client_cert "$dir/kubelet-conf" "system:node:$node" system:nodes
  client_cert "$dir/kube-proxy" system:kube-proxy system:node-proxier
  local c
  for c in $(cgroup_dirs); do
    mkdir -p "$c"
    # a new cpuset needs its cpus and memory nodes before anything can join it
    if [ -f "$c/cpuset.cpus" ] && [ -z "$(cat "$c/cpuset.cpus")" ]; then
      cat "$(dirname "$c")/cpuset.cpus" >"$c/cpuset.cpus"
      cat "$(dirname "$c")/cpuset.mems" >"$c/cpuset.mems"
    fi
  done
  start_kubelet
  wait_for 60 "node $node Ready" node_ready
  log "kubelet up, node $node Ready in $(since "$t0")s"

  # 5. kube-proxy: the kubernetes Service IP reaches the API server
  t0=$(date +%s.%N)
  setsid nsenter -t "$(anchor_pid)" -m -n -- "$nodebin/kube-proxy" --config "$dir/kube-proxy/config.yaml" --v=2 \
    >"$dir/logs/kube-proxy.log" 2>&1 </dev/null &
  procs_record "$dir/pids/kube-proxy" $! kube-proxy
  wait_for 60 "kube-proxy's rules for the kubernetes Service" \
    bash -c "nsenter -t $(anchor_pid) -m -n -- iptables-save -t nat | grep -q 'default/kubernetes:https -> '"
  log "kube-proxy up in $(since "$t0")s"
  log "real node $node of cluster '$name' up in $(since "$lib_t0")s (eval \"\$(hack/realnode.sh env)\"; rn kubectl get nodes)"
}

# Processes whose network namespace is this node's.
ns_procs() {
  local want p
  want=$(cat "$dir/ns/netns" 2>/dev/null) || return 0
  [ -n "$want" ] || return 0
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/ns/net" 2>/dev/null)" = "$want" ] && echo "${p#/proc/}"
  done
  return 0
}

down() {
  [ -d "$dir" ] || { log "no real node of cluster '$name' ($dir absent)"; return 0; }
  local t0; t0=$(date +%s.%N)
  kbin=$("$here/build-testbin.sh" etcd kwok kubernetes helm 2>/dev/null | tail -n1)
  if anchor_pid >/dev/null; then
    # Containers first, through containerd; their shims by their pid files.
    local shims="$dir/pids/shims" f pid exe
    for f in "$dir"/containerd/state/io.containerd.runtime.v2.task/k8s.io/*/shim.pid; do
      [ -f "$f" ] || continue
      pid=$(tr -dc 0-9 <"$f")
      [ -n "$pid" ] || continue
      exe=$(procs_argv0 "$pid") || continue
      # this node's shim runs in its bundle directory
      if [[ $exe == *containerd-shim-runc-v2 ]] && [ "$(readlink "/proc/$pid/cwd")" = "$(dirname "$f")" ]; then
        procs_adopt "$shims" "$pid" shim
      fi
    done
    PROCS_STOP_TIMEOUT=10 procs_stop "$dir/pids/kube-proxy"
    PROCS_STOP_TIMEOUT=10 procs_stop "$dir/pids/kubelet"
    if CTR version >/dev/null 2>&1; then
      local ids
      ids=$(CTR tasks ls -q 2>/dev/null || true)
      for c in $ids; do CTR tasks kill -s SIGKILL "$c" >/dev/null 2>&1 || true; done
      for c in $ids; do CTR tasks delete -f "$c" >/dev/null 2>&1 || true; done
      for c in $(CTR containers ls -q 2>/dev/null); do CTR containers delete "$c" >/dev/null 2>&1 || true; done
    fi
    procs_stop "$dir/pids/containerd"
    PROCS_STOP_TIMEOUT=5 procs_stop "$shims"
    # The control plane: hack/cluster.sh's own teardown, in there.
    inns env TTDRV_KWOK_CONFIG="$dir/kwok.yaml" bash "$here/cluster.sh" down >"$dir/logs/cluster-down.log" 2>&1 || true
    # hack/cluster.sh's stages file; the work directory itself if now empty
    rm -f "$KWOK_WORKDIR/ttdrv-stages.yaml"
  fi
  # Pods' processes that outlived their containers: this node's cgroups hold them.
  local c left
  for c in $(cgroup_dirs); do
    [ -d "$c" ] || continue
    left=$(find "$c" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u)
    [ -z "$left" ] || { log "killing processes left in $c: $(echo $left)"; kill -KILL $left 2>/dev/null || true; }
  done
  # Anything else still in the network namespace was started from in here.
  left=$(ns_procs | grep -vx "$(anchor_pid 2>/dev/null || echo none)" || true)
  if [ -n "$left" ]; then
    log "stopping processes left in the namespace: $(echo $left)"
    kill -TERM $left 2>/dev/null || true; sleep 2; kill -KILL $left 2>/dev/null || true
  fi
  # The anchor last: with it the namespaces and every mount in them go.
  procs_stop "$dir/pids/anchor"
  for c in $(cgroup_dirs); do
    [ -d "$c" ] && find "$c" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
  # What is left on the machine: must be nothing.
  local problems=()
  [ -z "$(ns_procs)" ] || problems+=("processes in the namespace: $(ns_procs | tr '\n' ' ')")
  for c in $(cgroup_dirs); do [ -d "$c" ] && problems+=("cgroup $c"); done
  grep -qF " $dir/" /proc/self/mountinfo && problems+=("mounts under $dir")
  if [ "${REALNODE_KEEP:-0}" = 1 ]; then
    log "kept $dir"
  else
    rm -rf --one-file-system "$dir" 2>/dev/null || rm -rf --one-file-system "$dir"
    rmdir "$KWOK_WORKDIR/clusters" "$KWOK_WORKDIR" 2>/dev/null || true
  fi
  if [ ${#problems[@]} -gt 0 ]; then
    printf '[realnode] left behind: %s\n' "${problems[@]}" >&2
    return 1
  fi
  log "real node of cluster '$name' down in $(since "$t0")s: no process, mount or cgroup left"
}

start_kubelet() {
  setsid nsenter -t "$(anchor_pid)" -m -n -- "$nodebin/kubelet" --config "$dir/kubelet-conf/config.yaml" \
    --kubeconfig "$dir/kubelet-conf/kubeconfig.yaml" --root-dir "$dir/kubelet" --cert-dir "$dir/kubelet/pki" \
    --hostname-override "$node" --node-ip "$node_ip" --node-labels "$real_label=true" --v=2 \
    >>"$dir/logs/kubelet.log" 2>&1 </dev/null &
  procs_record "$dir/pids/kubelet" $! kubelet
}

# Faults (tests/vm_node.rs): the kubelet stopped (SIGTERM, as systemd would)
# and started again, at once or later; the pods' containers run on in their
# shims, and a container that dies meanwhile stays dead until it is back.
stop_kubelet() {
  anchor_pid >/dev/null || die "the real node is not up (hack/realnode.sh up)"
  procs_stop "$dir/pids/kubelet"
  : >"$dir/pids/kubelet"
  log "kubelet stopped"
}
start_kubelet_ready() {
  anchor_pid >/dev/null || die "the real node is not up (hack/realnode.sh up)"
  [ -s "$dir/pids/kubelet" ] && die "the kubelet runs already"
  start_kubelet
  wait_for 60 "node $node Ready again" node_ready
  log "kubelet started"
}
restart_kubelet() { stop_kubelet && start_kubelet_ready; }

# A fault: SIGKILL to a container's first process on this node, found by its
# containerd id (a pod's containerID without "containerd://") in this node's
# containerd state, never by name. The kubelet restarts it.
kill_container() {
  local id=$1 f pid exe
  [[ $id =~ ^[0-9a-f]{64}$ ]] || die "not a container id: $id"
  f="$dir/containerd/state/io.containerd.runtime.v2.task/k8s.io/$id/init.pid"
  [ -f "$f" ] || die "no container $id on this node"
  pid=$(tr -dc 0-9 <"$f")
  [ -n "$pid" ] && exe=$(procs_argv0 "$pid") || die "container $id has no running process"
  kill -KILL "$pid"
  log "container $id: SIGKILL to pid $pid ($exe)"
}

down_quiet() { down >/dev/null 2>&1 || down; }

case ${1:-} in
  __ns-init) dir=$2; ns_init ;;
  up) up ;;
  down) down ;;
  env)
    pid=$(anchor_pid) || die "the real node is not up (hack/realnode.sh up)"
    kbin=$("$here/build-testbin.sh" etcd kwok kubernetes helm 2>/dev/null | tail -n1)
    printf 'export KUBECONFIG=%q\n' "$kubeconfig"
    printf 'export PATH=%q:"$PATH"\n' "$root/target/debug:$kbin"
    printf '# rn CMD...: run CMD inside the real node'"'"'s namespaces\n'
    printf 'rn() { nsenter -t %q -m -n --wd=\"$PWD\" -- env KUBECONFIG=%q PATH=%q HELM_CACHE_HOME=%q HELM_CONFIG_HOME=%q HELM_DATA_HOME=%q "$@"; }\n' \
      "$pid" "$kubeconfig" "${CARGO_TARGET_DIR:-$root/target}/debug:$kbin:$nodebin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
      "$dir/helm/cache" "$dir/helm/config" "$dir/helm/data"
    ;;
  exec | shell)
    pid=$(anchor_pid) || die "the real node is not up (hack/realnode.sh up)"
    kbin=$("$here/build-testbin.sh" etcd kwok kubernetes helm 2>/dev/null | tail -n1)
    cmd=("${@:2}")
    [ "$1" = shell ] && cmd=(bash -i)
    exec nsenter -t "$pid" -m -n --wd="$PWD" -- env KUBECONFIG="$kubeconfig" \
      PATH="${CARGO_TARGET_DIR:-$root/target}/debug:$kbin:$nodebin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
      HELM_CACHE_HOME="$dir/helm/cache" HELM_CONFIG_HOME="$dir/helm/config" HELM_DATA_HOME="$dir/helm/data" \
      CONTAINERD_ADDRESS="$dir/containerd/containerd.sock" CONTAINERD_NAMESPACE=k8s.io PS1='(realnode) \w\$ ' "${cmd[@]}" ;;
  images) cat "$dir/images.txt" ;;
  restart-kubelet) restart_kubelet ;;
  stop-kubelet) stop_kubelet ;;
  start-kubelet) start_kubelet_ready ;;
  kill-container) kill_container "${2:?usage: $0 kill-container ID}" ;;
  *) echo "usage: $0 up|down|env|exec CMD...|shell|images|restart-kubelet|stop-kubelet|start-kubelet|kill-container ID" >&2; exit 2 ;;
esac
