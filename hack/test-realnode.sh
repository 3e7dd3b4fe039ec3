#!/usr/bin/env bash
# The real-node test (a stage of `make test`): the shipped artefacts on a real
# kubelet. hack/realnode.sh brings up a real node (containerd, runc, kubelet,
# kube-proxy) joined to its own local control plane, in a private mount +
# network namespace, with the images of `make images` imported; then:
#
#   1. helm install of chart/ with those images: the controller in-cluster,
#      two replicas with leader election, its metrics Service scraped through
#      the Service IP (kube-proxy) and each endpoint (one leader)
#   2. a workload on the real node: a Deployment whose pod mounts the hostPath
#      /dev/tenstorrent, a PodDisruptionBudget that first refuses, and a
#      "telemetry" DaemonSet behind the deploy gate
#   3. a policy (2.8.0) for the node, which carries kmd-version=2.7.0 from an
#      earlier install: the real agent runs in the installer pod (privileged,
#      hostPID, the node's / at /host with HostToContainer propagation, its
#      exec readiness probe). This machine's kernel cannot load modules
#      (CONFIG_MODULES unset, no headers for it): the agent refuses a source
#      build, naming the missing kernel headers, and the test asserts that
#   4. cordon, deploy gate closed (the telemetry pod leaves), the drain's
#      eviction refused by the PDB (ttdriver_drain_blocked_total); meanwhile
#      `helm upgrade` and `helm rollback` of the controller (new pods, a lease
#      handover) keep the rollout where it was; the PDB relaxed, the pod is
#      evicted through the Eviction API (audit log)
#   5. a DKMS install appears on the node (/var/lib/dkms/tenstorrent): the new
#      installer pod's agent takes its host path (no module load), labels its
#      node install-mode=host with its own pod-bound token through the Service
#      IP (audit log: its ServiceAccount, its node); the controller uncordons,
#      opens the gate (the telemetry pod returns), the node is Done
#      (HostManaged) and the workload runs again
#   6. the admission policy, with the agent pod's own token: it may set its own
#      node's driver labels, and nothing else (another node, another label, the
#      go-ahead annotation, the spec)
#   7. `kubectl tt driver` reads the rollout
#
# Every phase is timed; the figures are printed at the end. The node is taken
# down whatever happens (KEEP_REALNODE=1 keeps it up for a look around).
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
timeout_s=${TIMEOUT:-120}
node=${REALNODE_NAME:-real-node-1}
rel=tt-k8s-driver-manager
ns=tt-k8s-driver-manager-system
agent_sa="system:serviceaccount:$ns:$rel-agent"
ctl_sa="system:serviceaccount:$ns:$rel-controller"
audit="$KWOK_WORKDIR/clusters/$TTDRV_CLUSTER_NAME/logs/audit.log"

t_start=$(date +%s.%N)
t_phase=$t_start
phases=()
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
log() { printf '[test-realnode %6.1fs] %s\n' "$(since "$t_start")" "$*" >&2; }
phase() { # NAME: closes the current phase
  local d; d=$(since "$t_phase")
  phases+=("$(printf '%-58s %6.1fs' "$1" "$d")")
  log "phase done: $1 (${d}s)"
  t_phase=$(date +%s.%N)
}
report() {
  printf '[test-realnode] phase times:\n' >&2
  local p
  for p in "${phases[@]}"; do printf '[test-realnode]   %s\n' "$p" >&2; done
  printf '[test-realnode]   %-58s %6.1fs\n' total "$(since "$t_start")" >&2
}
fail() {
  printf '[test-realnode] FAIL: %s\n' "$*" >&2
  diagnose || true
  report
  echo "test-realnode: 0 passed, 1 failed"
  exit 1
}
diagnose() {
  [ -n "${rn_ready:-}" ] || return 0
  log "--- diagnostics"
  rn kubectl get nodes -o wide --show-labels >&2 || true
  rn kubectl get pods -A -o wide >&2 || true
  rn kubectl get ttdp -o jsonpath='{.items[*].status.nodes}' >&2 || true; echo >&2
  rn kubectl -n "$ns" logs -l app.kubernetes.io/name=tt-driver-installer --tail=30 --all-containers >&2 || true
  rn kubectl -n "$ns" logs -l app.kubernetes.io/component=controller --tail=30 >&2 || true
  rn kubectl get events -A --sort-by=.lastTimestamp 2>/dev/null | tail -n 30 >&2 || true
}

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

# wait_until DESCRIPTION CMD...: polls CMD until it succeeds, or fails the test.
wait_until() {
  local what=$1 deadline=$((SECONDS + timeout_s)); shift
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || fail "timed out after ${timeout_s}s: $what"
    sleep 0.5
  done
}
node_label() { rn kubectl get node "$node" -o jsonpath="{.metadata.labels.${1//./\\.}}"; }
node_state() { rn kubectl get ttdp realnode -o jsonpath="{.status.nodes[?(@.name==\"$node\")].$1}"; }
state_is() { [ "$(node_state state)" = "$1" ]; }
is_cordoned() { [ "$(rn kubectl get node "$node" -o jsonpath='{.spec.unschedulable}')" = true ]; }
pods_running() { # NS SELECTOR COUNT
  [ "$(rn kubectl -n "$1" get pods -l "$2" --field-selector=status.phase=Running -o name | wc -l)" -eq "$3" ]
}
no_pods() { [ -z "$(rn kubectl -n "$1" get pods -l "$2" -o name)" ]; }
audit_has() { # JQ-ish python filter over the audit log: verb resource user [subresource]
  python3 - "$audit" "$@" <<'PY'
import json, sys
log, verb, resource, user = sys.argv[1:5]
sub = sys.argv[5] if len(sys.argv) > 5 else ""
name = sys.argv[6] if len(sys.argv) > 6 else ""
node_claim = sys.argv[7] if len(sys.argv) > 7 else ""
for line in open(log):
    e = json.loads(line)
    o = e.get("objectRef", {})
    u = e.get("user", {})
    if (e.get("stage") == "ResponseComplete" and e.get("verb") == verb and o.get("resource") == resource
            and o.get("subresource", "") == sub and u.get("username") == user
            and (not name or o.get("name") == name)
            and e.get("responseStatus", {}).get("code", 0) < 300
            and (not node_claim or u.get("extra", {}).get("authentication.kubernetes.io/node-name") == [node_claim])):
        print(json.dumps({"verb": verb, "resource": resource, "sub": sub, "name": o.get("name"),
                          "user": user, "sourceIPs": e.get("sourceIPs"), "code": e["responseStatus"]["code"]}))
        sys.exit(0)
sys.exit(1)
PY
}
metric() { # TEXT NAME [LABEL_MATCH]: the first sample value of NAME (whose labels contain LABEL_MATCH)
  awk -v n="$2" -v m="${3:-}" '$1 ~ "^"n"([{]|$)" && index($1, m) { print $2; exit }' <<<"$1"
}

# --- the node --------------------------------------------------------------------
log "bringing up the real node (cluster $TTDRV_CLUSTER_NAME, workdir $KWOK_WORKDIR)"
bash hack/realnode.sh up || fail "hack/realnode.sh up"
eval "$(bash hack/realnode.sh env)"
export -f rn
rn_ready=1
phase "real node up (images, control plane, containerd, kubelet, kube-proxy)"
# The kubectl plugin, built for this machine (shared with cargo test's build).
cargo build -q -p kubectl-tt-driver >&2
phase "kubectl-tt-driver built"

read -r _ ctl_ref _ < <(grep '^controller ' <(bash hack/realnode.sh images))
read -r _ agent_ref _ < <(grep '^agent ' <(bash hack/realnode.sh images))
read -r _ pause_ref _ < <(grep '^pause ' <(bash hack/realnode.sh images))
log "images: $ctl_ref $agent_ref $pause_ref"

# The node as node-feature-discovery and an earlier container install left it.
rn kubectl label node "$node" --overwrite feature.node.kubernetes.io/pci-1200_1e52.present=true \
  driver.tenstorrent.com/kmd-version=2.7.0 driver.tenstorrent.com/install-mode=container >/dev/null
# Another node (an API object that kwok keeps Ready; tainted so no pod lands
# there) for the admission checks.
printf 'apiVersion: v1\nkind: Node\nmetadata:\n  name: other-node\n  labels: {pool: other}\nspec:\n  taints: [{key: ttdrv.io/api-only, effect: NoSchedule}]\n' \
  | rn kubectl apply -f - >/dev/null

# --- 1. the chart -------------------------------------------------------------------
helm_args=(-n "$ns" --set "controller.image.repository=${ctl_ref%:*}" --set "controller.image.tag=${ctl_ref##*:}"
  --set "driver.image.repository=${agent_ref%:*}" --set "driver.image.tag=${agent_ref##*:}"
  --set controller.image.pullPolicy=Never --set driver.image.pullPolicy=Never
  # The only node is the one being upgraded: the controller's new pods
  # (helm upgrade, rollback) must schedule on it while it is cordoned.
  --set 'controller.tolerations[0].key=node.kubernetes.io/unschedulable'
  --set 'controller.tolerations[0].operator=Exists' --set 'controller.tolerations[0].effect=NoSchedule'
  # the rollout's own timers, short for a test
  --set 'controller.extraArgs={--resync-ms=1000}'
  # No registry here: the CRD upgrade Job's kubectl image cannot be pulled.
  # The controller pods share the only node with the drained workload: a PDB
  # of theirs would add its own refusals to the drain this test counts.
  --set crds.upgradeJob.enabled=false --set controller.podDisruptionBudget.enabled=false)
rn helm install "$rel" chart --create-namespace "${helm_args[@]}" --wait --timeout "${timeout_s}s" >/dev/null \
  || fail "helm install of chart/"
phase "helm install (2 controller replicas Ready)"
lease_holder() { rn kubectl -n "$ns" get lease tt-k8s-driver-manager -o jsonpath='{.spec.holderIdentity}'; }
wait_until "a controller replica holds the lease" bash -c "[ -n \"\$(rn kubectl -n $ns get lease tt-k8s-driver-manager -o jsonpath='{.spec.holderIdentity}')\" ]"
holder1=$(lease_holder)
rn kubectl -n "$ns" get pod "$holder1" >/dev/null 2>&1 || fail "lease holder $holder1 is not a controller pod"
# The metrics Service: through its ClusterIP (kube-proxy), and each endpoint.
svc=$rel-controller-metrics
svc_ip=$(rn kubectl -n "$ns" get svc "$svc" -o jsonpath='{.spec.clusterIP}')
scrape=$(rn curl -sf --max-time 5 "http://$svc_ip:8080/metrics") || fail "scrape of Service $svc at $svc_ip:8080"
[ -n "$(metric "$scrape" ttdriver_build_info)" ] || fail "no ttdriver_build_info from $svc"
leaders=0
for ip in $(rn kubectl -n "$ns" get endpointslices -l kubernetes.io/service-name="$svc" -o jsonpath='{.items[*].endpoints[*].addresses[0]}'); do
  v=$(metric "$(rn curl -sf --max-time 5 "http://$ip:8080/metrics")" ttdriver_leader)
  [ "$v" = 1 ] && leaders=$((leaders + 1))
done
[ "$leaders" = 1 ] || fail "expected exactly one replica exporting ttdriver_leader 1, got $leaders"
log "leader $holder1; metrics scraped through $svc_ip and both endpoints (one leader)"
phase "leader elected, metrics Service scraped"

# --- 2. the workload ----------------------------------------------------------------
rn kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Namespace
metadata: {name: ml}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: train, namespace: ml}
spec:
  replicas: 1
  selector: {matchLabels: {app: train}}
  template:
    metadata: {labels: {app: train}}
    spec:
      nodeSelector: {kubernetes.io/hostname: $node}
      terminationGracePeriodSeconds: 1
      containers:
      - name: train
        image: $agent_ref
        imagePullPolicy: Never
        command: ["/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]
        volumeMounts: [{name: dev, mountPath: /dev/tenstorrent}]
      volumes:
      - name: dev
        hostPath: {path: /dev/tenstorrent, type: DirectoryOrCreate}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: train, namespace: ml}
spec:
  minAvailable: 1
  selector: {matchLabels: {app: train}}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: telemetry, namespace: ml}
spec:
  selector: {matchLabels: {app: telemetry}}
  template:
    metadata: {labels: {app: telemetry}}
    spec:
      terminationGracePeriodSeconds: 1
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
            - matchExpressions:
              - {key: tenstorrent.com/deploy.tt-telemetry, operator: NotIn, values: ["false"]}
              - {key: feature.node.kubernetes.io/pci-1200_1e52.present, operator: In, values: ["true"]}
      containers:
      - {name: telemetry, image: $pause_ref, imagePullPolicy: Never}
EOF
wait_until "the workload pod Running on $node" pods_running ml app=train 1
wait_until "the telemetry DaemonSet pod Running" pods_running ml app=telemetry 1
train1=$(rn kubectl -n ml get pods -l app=train -o jsonpath='{.items[0].metadata.name}')
phase "workload (hostPath /dev/tenstorrent, PDB) and telemetry DaemonSet Running"

# --- 3. the policy; the real agent ---------------------------------------------------
rn kubectl apply -f - >/dev/null <<EOF
apiVersion: driver.tenstorrent.com/v1alpha1
kind: TenstorrentDriverPolicy
metadata: {name: realnode}
spec:
  version: "2.8.0"
  nodeAffinity: {}
  upgradePolicy:
    maxUnavailable: 1
    drain: {enable: true, fullNode: false, timeoutSeconds: 600}
    # Build-ahead off: this host cannot build (no headers for its kernel), and
    # with it on the agent's first report (nothing really loaded) would make
    # this a first install without a cordon, which is right but skips the
    # cordon and drain this test is about. Build-ahead on a real kubelet is
    # make test-vm-node's.
    prepare: {enabled: false}
EOF
wait_until "the node cordoned for 2.7.0 -> 2.8.0" is_cordoned
phase "policy applied -> node cordoned"
wait_until "deploy gate closed" bash -c "[ \"\$(rn kubectl get node $node -o jsonpath='{.metadata.labels.tenstorrent\.com/deploy\.tt-telemetry}')\" = false ]"
wait_until "the telemetry pod gone behind the closed gate" no_pods ml app=telemetry
phase "deploy gate closed, telemetry pod left"
# The installer pod on the real node: the real agent, refusing a source build here.
inst() { rn kubectl -n "$ns" get pods -l app.kubernetes.io/name=tt-driver-installer --field-selector "spec.nodeName=$node" -o jsonpath='{.items[0].metadata.name}'; }
has_inst() { [ -n "$(inst)" ]; }
wait_until "an installer pod on $node" has_inst
inst1=$(inst)
refused() { rn kubectl -n "$ns" logs "$inst1" --all-containers 2>/dev/null | grep -q 'result=failed.*linux-headers'; }
refused_prev() { rn kubectl -n "$ns" logs "$inst1" --previous 2>/dev/null | grep -q 'result=failed.*linux-headers'; }
refusal() { refused || refused_prev; }
wait_until "the agent refuses the source build (no kernel headers for $(uname -r))" refusal
words=$( { rn kubectl -n "$ns" logs "$inst1" 2>/dev/null; rn kubectl -n "$ns" logs "$inst1" --previous 2>/dev/null; } | grep -m1 -o 'summary: result=failed.*' || true)
log "agent on $node: ${words:0:240}"
phase "real agent in the installer pod: refusal (no kernel headers) asserted"
# A DKMS install appears on the node while it drains (before the refusing pod
# has crash-looped three times: the controller would fail the node on that
# pod's restarts at Upgrading); the agent's next start finds it.
rn mkdir -p /var/lib/dkms/tenstorrent/2.7.0

# --- 4. the drain, with helm upgrade and rollback in the middle -----------------------
wait_until "the drain blocked by the PDB" state_is Draining
blocked() { [ -n "$(metric "$(rn curl -sf --max-time 5 "http://$svc_ip:8080/metrics" 2>/dev/null || true)" ttdriver_drain_blocked_total)" ] || \
  [ -n "$(for ip in $(rn kubectl -n "$ns" get endpointslices -l kubernetes.io/service-name="$svc" -o jsonpath='{.items[*].endpoints[*].addresses[0]}'); do metric "$(rn curl -sf --max-time 5 "http://$ip:8080/metrics")" ttdriver_drain_blocked_total; done)" ]; }
wait_until "ttdriver_drain_blocked_total (the PDB refused the eviction)" blocked
rn kubectl -n ml get pod "$train1" >/dev/null 2>&1 || fail "the workload pod went although its PDB refuses"
phase "drain: eviction refused by the PDB, pod kept"
rn helm upgrade "$rel" chart "${helm_args[@]}" --set controller.logLevel=debug --wait --timeout "${timeout_s}s" >/dev/null \
  || fail "helm upgrade"
wait_until "the lease held by an upgraded replica" bash -c "h=\$(rn kubectl -n $ns get lease tt-k8s-driver-manager -o jsonpath='{.spec.holderIdentity}'); [ -n \"\$h\" ] && [ \"\$h\" != $holder1 ] && rn kubectl -n $ns get pod \"\$h\""
[ "$(node_state state)" = Draining ] || fail "after helm upgrade the node is $(node_state state), not still Draining"
is_cordoned || fail "helm upgrade uncordoned the node mid-rollout"
phase "helm upgrade: new replicas, lease handed over, still Draining"
holder2=$(lease_holder)
rn helm -n "$ns" rollback "$rel" >/dev/null || fail "helm rollback"
rn kubectl -n "$ns" rollout status deploy/"$rel-controller" --timeout="${timeout_s}s" >/dev/null || fail "rollback's controller pods"
wait_until "the lease held by a rolled-back replica" bash -c "h=\$(rn kubectl -n $ns get lease tt-k8s-driver-manager -o jsonpath='{.spec.holderIdentity}'); [ -n \"\$h\" ] && [ \"\$h\" != $holder2 ] && rn kubectl -n $ns get pod \"\$h\""
[ "$(node_state state)" = Draining ] || fail "after helm rollback the node is $(node_state state), not still Draining"
[ "$(rn helm -n "$ns" history "$rel" -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)[-1]["description"])')" = "Rollback to 1" ] \
  || fail "helm history does not end with the rollback"
phase "helm rollback: old replicas, lease handed over, still Draining"
rn kubectl -n ml patch pdb train --type merge -p '{"spec":{"minAvailable":0}}' >/dev/null
wait_until "the workload pod evicted" bash -c "! rn kubectl -n ml get pod $train1"
audit_has create pods "$ctl_sa" eviction "$train1" >/dev/null || fail "no eviction of ml/$train1 by the controller in the audit log"
phase "PDB relaxed -> pod evicted through the Eviction API"

# --- 5. host path of the agent, uncordon, gate open ------------------------------------
wait_until "the agent labels its node install-mode=host" bash -c "[ \"\$(rn kubectl get node $node -o jsonpath='{.metadata.labels.driver\.tenstorrent\.com/install-mode}')\" = host ]"
by_agent=$(audit_has patch nodes "$agent_sa" "" "$node" "$node") \
  || fail "no node patch by the agent's own pod-bound token ($agent_sa, node claim $node) in the audit log"
log "agent's label patch: $by_agent"
[ -z "$(node_label driver.tenstorrent.com/kmd-version)" ] || fail "kmd-version label kept although no module is loaded"
# The cycle ends (Upgrading replaced the pre-cycle installer pod; the new
# agent reports the host first and idles): take the pod that stays.
wait_until "the node Done" state_is Done
one_inst() { [ "$(rn kubectl -n "$ns" get pods -l app.kubernetes.io/name=tt-driver-installer --field-selector "spec.nodeName=$node" -o name | wc -l)" = 1 ]; }
wait_until "one installer pod on $node (the pre-cycle one gone)" one_inst
# The agent idles now: its exec readiness probe runs on the kubelet and says
# why the pod is not Ready (nothing loaded; a host-managed node's pod is Ready
# only when the host's module is the policy's version).
inst2=$(inst)
probe_said() { rn kubectl -n "$ns" get events --field-selector "involvedObject.name=$inst2,reason=Unhealthy" -o jsonpath='{.items[*].message}' | grep -q 'not ready: loaded none, want 2.8.0'; }
wait_until "the readiness probe (ttdrv-agent ready) of $inst2 reported" probe_said
[ "$(rn kubectl -n "$ns" get pod "$inst2" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = False ] || fail "installer pod Ready without a module"
phase "agent's host path: node labelled with its own token, readiness probe ran"
[ "$(node_state reason)" = HostManaged ] || fail "node Done with reason $(node_state reason), want HostManaged"
is_cordoned && fail "node still cordoned after Done"
[ -z "$(node_label tenstorrent.com/deploy.tt-telemetry)" ] || fail "deploy gate label left on the node"
wait_until "the telemetry pod back" pods_running ml app=telemetry 1
wait_until "the workload Running again on $node" pods_running ml app=train 1
phase "uncordoned, gate open, Done (HostManaged), workload back"

# --- 6. the admission policy on the agent's pod-bound token ----------------------------
token=$(rn kubectl -n "$ns" exec "$inst2" -- cat /var/run/secrets/kubernetes.io/serviceaccount/token) \
  || fail "reading the agent pod's token"
# Only the token: a kubeconfig without the admin's client certificate.
server=$(rn kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}')
ca="$KWOK_WORKDIR/clusters/$TTDRV_CLUSTER_NAME/pki/ca.crt"
as_agent() { rn kubectl --kubeconfig=/dev/null --server="$server" --certificate-authority="$ca" --token="$token" "$@"; }
[ "$(as_agent auth whoami -o jsonpath='{.status.userInfo.username}')" = "$agent_sa" ] || fail "the token is not the agent's"
checks=0
allowed() { local what=$1; shift; out=$("$@" 2>&1) || fail "agent token refused: $what: $out"; checks=$((checks + 1)); log "allowed as expected: $what"; }
denied() {
  local what=$1 want=$2; shift 2
  if out=$("$@" 2>&1); then fail "agent token allowed: $what"; fi
  [[ $out == *"$want"* ]] || fail "agent token refused for another reason: $what: $out"
  checks=$((checks + 1)); log "refused as expected: $what"
}
allowed "label its own node's driver label" as_agent label node "$node" tt-smi.driver.tenstorrent.com/version=6.8.0 --overwrite
denied "label another node" "may not modify node other-node" as_agent label node other-node driver.tenstorrent.com/kmd-version=2.8.0 --overwrite
denied "set another label on its node" "may change only the node labels" as_agent label node "$node" pool=stolen
denied "write the go-ahead annotation" "may not change node annotations" \
  as_agent annotate node "$node" driver.tenstorrent.com/go-ahead='{"policy":"realnode","node":"'"$node"'","target":"2.8.0","cycle":1}'
denied "cordon its node" "may not change the node spec" as_agent patch node "$node" --type merge -p '{"spec":{"unschedulable":true}}'
denied "delete its node (RBAC)" "forbidden" as_agent delete node "$node" --wait=false
phase "admission policy on the agent's pod-bound token ($checks checks)"

# --- 7. kubectl tt driver ------------------------------------------------------------------
out=$(rn kubectl tt driver 2>&1) || fail "kubectl tt driver: $out"
printf '%s\n' "$out" | sed 's/^/[kubectl tt driver] /' >&2
grep -q realnode <<<"$out" && grep -q "$node" <<<"$out" || fail "kubectl tt driver does not show policy realnode and node $node"
phase "kubectl tt driver"

report
echo "test-realnode: 1 passed, 0 failed"
