#!/usr/bin/env bash
# Checks the shipped observability artifacts; exits non-zero on the first failure.
#
#   bash hack/test-alerts.sh
#
#  1. promtool check rules  dashboards/alerts/ttdriver.rules.yaml
#  2. promtool test rules   dashboards/alerts/ttdriver.rules.test.yaml
#     (installs the Debian package `prometheus` when promtool is missing, without
#     letting it start a service: hack/install-prometheus.sh)
#  3. the chart's copies (chart/files/ttdriver.rules.yaml, chart/files/dashboards/*.json)
#     are byte-identical to dashboards/alerts/ttdriver.rules.yaml and dashboards/*.json
#  4. dashboards/*.json are what dashboards/generate.py produces
#  5. lint of dashboards, rules and docs (python, stdlib only):
#     - every dashboard has its stable uid, a recent schemaVersion, a `datasource`
#       variable of type prometheus, the `cr` variable, and only non-Angular panel
#       types (deprecated "graph", "singlestat", "table-old", ... fail); every
#       panel queries through ${datasource}; panel ids are unique
#     - every alert has severity, summary, description and a runbook_url whose
#       anchor is a heading of docs/runbook.md; the alert set is the expected one
#     - every ttdriver_* metric of src/metrics/, the rules and the dashboards is
#       documented in docs/metrics.md
#     - every alert has a firing and a non-firing case in the promtool tests
#  6. `helm template` of the chart with the monitoring toggles on and off, when
#     chart/Chart.yaml exists and helm is found (PATH or the test-bin cache); set
#     TTDRV_REQUIRE_HELM=1 to fail instead of skipping when helm is missing.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

log() { printf '[test-alerts] %s\n' "$*" >&2; }
fail() { printf '[test-alerts] FAIL: %s\n' "$*" >&2; exit 1; }

rules=dashboards/alerts/ttdriver.rules.yaml
tests=dashboards/alerts/ttdriver.rules.test.yaml

# --- 1, 2: promtool -----------------------------------------------------------
if ! command -v promtool >/dev/null 2>&1; then
  log "promtool not found; installing the Debian package prometheus"
  bash hack/install-prometheus.sh || fail "installing the Debian package prometheus"
fi
log "$(promtool --version 2>&1 | head -n1)"
promtool check rules "$rules" || fail "promtool check rules $rules"
(cd "$(dirname "$tests")" && promtool test rules "$(basename "$tests")") || fail "promtool test rules $tests"

# --- 3: chart copies ------------------------------------------------------------
cmp -s "$rules" chart/files/ttdriver.rules.yaml \
  || fail "chart/files/ttdriver.rules.yaml differs from $rules (cp $rules chart/files/ttdriver.rules.yaml)"
canon=$(cd dashboards && ls -1 ./*.json | sed 's|^\./||' | sort)
copies=$(cd chart/files/dashboards 2>/dev/null && ls -1 ./*.json 2>/dev/null | sed 's|^\./||' | sort || true)
[ "$canon" = "$copies" ] || fail "chart/files/dashboards/ holds [$(echo $copies)], dashboards/ holds [$(echo $canon)] (cp dashboards/*.json chart/files/dashboards/)"
for f in $canon; do
  cmp -s "dashboards/$f" "chart/files/dashboards/$f" \
    || fail "chart/files/dashboards/$f differs from dashboards/$f (cp dashboards/*.json chart/files/dashboards/)"
done
log "chart copies match"

# --- 5: lint ----------------------------------------------------------------------
python3 - "$rules" "$tests" <<'PY' || fail "lint"
import json, re, sys
from pathlib import Path

rules_path, tests_path = sys.argv[1], sys.argv[2]
errors = []
def err(msg): errors.append(msg)

# Dashboards -------------------------------------------------------------------
ALLOWED = {"timeseries", "stat", "gauge", "table", "state-timeline", "bargauge", "text", "row"}
ANGULAR = {"graph", "singlestat", "table-old", "grafana-piechart-panel", "grafana-worldmap-panel",
           "grafana-polystat-panel", "heatmap-old"}  # deprecated AngularJS panels
UIDS = {"ttdriver-rollout.json": "ttdriver-rollout", "ttdriver-controller.json": "ttdriver-controller"}
dash_exprs = []
def walk(panels):
    for p in panels or []:
        yield p
        yield from walk(p.get("panels"))
files = sorted(Path("dashboards").glob("*.json"))
if {f.name for f in files} != set(UIDS):
    err(f"dashboards/: expected {sorted(UIDS)}, found {[f.name for f in files]}")
for f in files:
    d = json.loads(f.read_text())
    uid = d.get("uid")
    if not uid:
        err(f"{f}: no uid")
    elif f.name in UIDS and uid != UIDS[f.name]:
        err(f"{f}: uid {uid!r}, expected the stable {UIDS[f.name]!r}")
    if not isinstance(d.get("schemaVersion"), int) or d["schemaVersion"] < 36:
        err(f"{f}: schemaVersion {d.get('schemaVersion')!r} is not recent (>= 36)")
    if d.get("id") not in (None,):
        err(f"{f}: carries a database id; drop it so imports do not clash")
    tvars = {v.get("name"): v for v in d.get("templating", {}).get("list", [])}
    ds = tvars.get("datasource")
    if not ds or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        err(f"{f}: needs a `datasource` variable of type datasource, query prometheus")
    cr = tvars.get("cr")
    if not cr or "label_values(ttdriver_node_state{" not in str(cr.get("definition")):
        err(f"{f}: needs the `cr` variable from label_values(ttdriver_node_state{{...}}, cr)")
    for v in ("cluster", "job"):
        if v not in tvars or tvars[v].get("type") != "query":
            err(f"{f}: needs the `{v}` query variable")
    ids = []
    for p in walk(d.get("panels")):
        t, title = p.get("type"), p.get("title")
        ids.append(p.get("id"))
        if t in ANGULAR:
            err(f"{f}: panel {title!r} uses the deprecated Angular panel type {t!r}")
        elif t not in ALLOWED:
            err(f"{f}: panel {title!r} has type {t!r}, not one of {sorted(ALLOWED)}")
        if "gridPos" not in p:
            err(f"{f}: panel {title!r} has no gridPos")
        if t in ("row", "text"):
            continue
        if p.get("datasource", {}).get("uid") != "${datasource}":
            err(f"{f}: panel {title!r} does not use the ${{datasource}} variable")
        if not p.get("targets"):
            err(f"{f}: panel {title!r} has no query")
        for tg in p.get("targets") or []:
            if tg.get("datasource", {}).get("uid") not in (None, "${datasource}"):
                err(f"{f}: panel {title!r} target {tg.get('refId')} pins a data source")
            if tg.get("expr"):
                dash_exprs.append(tg["expr"])
                for m in ('cluster=~"$cluster"', 'job=~"$job"'):
                    if tg["expr"].count("ttdriver_") != tg["expr"].count(m):
                        err(f"{f}: panel {title!r} target {tg.get('refId')}: a metric without {m}")
        if not p.get("fieldConfig", {}).get("defaults", {}).get("unit"):
            err(f"{f}: panel {title!r} has no unit")
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        err(f"{f}: duplicate panel ids {sorted(dup)}")

# Rules ------------------------------------------------------------------------
# Parsed without PyYAML: the file's shape is fixed (see the rules file).
rules_text = Path(rules_path).read_text()
EXPECTED = ["TTDriverNodeFailed", "TTDriverNodeStuckInPhase", "TTDriverRolloutStalled",
            "TTDriverTooManyUnavailable", "TTDriverControllerDown", "TTDriverReconcileErrors",
            "TTDriverDeployGateLeftClosed", "TTDriverRolloutBraked",
            "TTDriverNextKernelBuildFailed"]
blocks = re.split(r"\n(?=[ \t]*- alert: )", rules_text)[1:]
alerts = {}
for b in blocks:
    name = re.search(r"- alert: (\S+)", b).group(1)
    alerts[name] = b
if sorted(alerts) != sorted(EXPECTED):
    err(f"{rules_path}: alerts {sorted(alerts)}, expected {sorted(EXPECTED)}")
runbook = Path("docs/runbook.md").read_text() if Path("docs/runbook.md").exists() else ""
if not runbook:
    err("docs/runbook.md is missing")
def anchor(heading):
    a = heading.strip().lower()
    a = re.sub(r"[^\w\- ]", "", a)
    return a.replace(" ", "-")
anchors = {anchor(h) for h in re.findall(r"^#{1,6}\s+(.+)$", runbook, re.M)}
for name, b in alerts.items():
    if not re.search(r"^\s+for:\s*\d+[smh]", b, re.M):
        err(f"alert {name}: no `for:` (one odd evaluation would page)")
    expr = re.search(r"expr: \|\n((?:\s{10}.*\n)+)", b)
    for clause in re.findall(r"\b(?:by|on) \(([^)]*)\)", expr.group(1) if expr else ""):
        if "namespace" not in [c.strip() for c in clause.split(",")]:
            err(f"alert {name}: `by/on ({clause})` drops the namespace label")
    sev = re.search(r"severity:\s*(\S+)", b)
    if not sev or sev.group(1) not in ("critical", "warning", "info"):
        err(f"alert {name}: severity missing or not critical|warning|info")
    for key in ("summary", "description", "runbook_url"):
        if not re.search(rf"^\s+{key}:", b, re.M):
            err(f"alert {name}: annotation {key} missing")
    m = re.search(r"runbook_url:\s*\"?([^\"\s]+)", b)
    if m:
        url = m.group(1)
        if "docs/runbook.md#" not in url:
            err(f"alert {name}: runbook_url {url} does not point into docs/runbook.md")
        elif url.split("#", 1)[1] not in anchors:
            err(f"alert {name}: runbook anchor #{url.split('#', 1)[1]} is not a heading of docs/runbook.md")
        elif url.split("#", 1)[1] != name.lower():
            err(f"alert {name}: runbook anchor should be #{name.lower()}")

# Tests: a firing and a non-firing case per alert --------------------------------
tests_text = Path(tests_path).read_text()
cases = re.split(r"\n(?=[ \t]*- eval_time:)", tests_text)[1:]
fired, quiet = set(), set()
for c in cases:
    n = re.search(r"alertname:\s*(\S+)", c)
    if not n:
        continue
    exp = re.search(r"exp_alerts:\s*(\[\])?", c)
    (quiet if exp is None or exp.group(1) else fired).add(n.group(1))
for name in EXPECTED:
    if name not in fired:
        err(f"{tests_path}: no firing test case for {name}")
    if name not in quiet:
        err(f"{tests_path}: no non-firing test case for {name}")

# Metric documentation -------------------------------------------------------------
doc = Path("docs/metrics.md").read_text() if Path("docs/metrics.md").exists() else ""
if not doc:
    err("docs/metrics.md is missing")
# The metric families are defined in src/metrics/ (one file per group); its
# tests and the test-only text parser define none.
src = "".join(
    p.read_text().split("#[cfg(test)]")[0]
    for p in sorted(Path("src/metrics").glob("*.rs"))
    if p.name not in ("tests.rs", "text_parser.rs")
)
names = set(re.findall(r'"(ttdriver_[a-z0-9_]+)"', src))
if len(names) < 20:
    err(f"src/metrics/: found only {len(names)} metric names")
used = set()
for e in dash_exprs + [rules_text]:
    used |= set(re.findall(r"\b(ttdriver_[a-z0-9_]+)", e))
hist = {n for n in names if n.endswith("_seconds") and f"{n}_bucket" in " ".join(dash_exprs) + rules_text}
def base(n):
    for suf in ("_bucket", "_sum", "_count"):
        if n.endswith(suf) and n[: -len(suf)] in names:
            return n[: -len(suf)]
    return n
for n in sorted(names | {base(u) for u in used}):
    if f"`{n}`" not in doc and f"`{n}{{" not in doc:
        err(f"docs/metrics.md does not document {n}")
for u in sorted({base(u) for u in used} - names):
    err(f"{u} is queried by a dashboard or rule but not defined in src/metrics/")
LEGACY = ["ttdriver_policy_nodes", "ttdriver_nodes_by_kmd_version", "ttdriver_policy_desired_version",
          "ttdriver_pods_evicted_total", "ttdriver_drain_blocked_total", "ttdriver_errors_total",
          "ttdriver_last_successful_reconcile_timestamp_seconds"]
for n in LEGACY:
    if n not in names:
        err(f"src/metrics/ lacks the Go operator's metric {n}")

if errors:
    print("\n".join(f"  - {e}" for e in errors), file=sys.stderr)
    sys.exit(1)
print(f"[test-alerts] lint ok: {len(files)} dashboards, {len(dash_exprs)} queries, {len(alerts)} alerts, {len(names)} metrics",
      file=sys.stderr)
PY

# --- 4 (after the lint): generated dashboards ----------------------------------------------------
python3 dashboards/generate.py --check || fail "dashboards/*.json are stale: run python3 dashboards/generate.py"

# --- 6: helm template ------------------------------------------------------------
helm_bin=$(command -v helm 2>/dev/null || true)
if [ -z "$helm_bin" ] && [ -f hack/versions.env ]; then
  helm_dir="${TTDRV_TESTBIN_CACHE:-$HOME/.cache/ttdrv-testbin}/helm-$(. hack/versions.env && echo "$HELM_VERSION")"
  [ -f "$helm_dir/.complete" ] && helm_bin="$helm_dir/helm"
fi
if [ ! -f chart/Chart.yaml ]; then
  log "SKIP helm template: chart/Chart.yaml does not exist yet"
elif [ -z "$helm_bin" ] || [ ! -x "$helm_bin" ]; then
  [ "${TTDRV_REQUIRE_HELM:-0}" = 1 ] && fail "helm not found (hack/build-testbin.sh helm builds it)"
  log "SKIP helm template: helm not found (hack/build-testbin.sh helm; TTDRV_REQUIRE_HELM=1 makes this fatal)"
else
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  "$helm_bin" template ttdrv chart -n tt-k8s-driver-manager-system --kube-version "$(. hack/versions.env && echo "${K8S_VERSION#v}")" \
    --set metrics.serviceMonitor.enabled=false --set metrics.prometheusRule.enabled=false \
    --set metrics.dashboards.enabled=false >"$tmp/off.yaml" || fail "helm template (monitoring off)"
  "$helm_bin" template ttdrv chart -n tt-k8s-driver-manager-system --kube-version "$(. hack/versions.env && echo "${K8S_VERSION#v}")" \
    --set metrics.serviceMonitor.enabled=true --set metrics.prometheusRule.enabled=true \
    --set metrics.dashboards.enabled=true >"$tmp/on.yaml" || fail "helm template (monitoring on)"
  python3 - "$tmp/off.yaml" "$tmp/on.yaml" "$rules" <<'PY' || fail "helm template output"
import json, sys
from pathlib import Path
try:
    import yaml
except ImportError:
    print("[test-alerts] PyYAML missing: only checking the kinds", file=sys.stderr)
    yaml = None
off, on, rules = (Path(p).read_text() for p in sys.argv[1:4])
def kinds(text):
    return [l.split(":", 1)[1].strip() for l in text.splitlines() if l.startswith("kind:")]
ours = {"ServiceMonitor", "PrometheusRule"}
if ours & set(kinds(off)):
    sys.exit(f"monitoring off still renders {sorted(ours & set(kinds(off)))}")
missing = ours - set(kinds(on))
if missing:
    sys.exit(f"monitoring on does not render {sorted(missing)}")
if yaml:
    docs = [d for d in yaml.safe_load_all(on) if d]
    pr = next(d for d in docs if d["kind"] == "PrometheusRule")
    # The one rewrite the chart makes: absent() names the release namespace.
    want = rules.replace("absent(ttdriver_build_info)",
                         'absent(ttdriver_build_info{namespace="tt-k8s-driver-manager-system"})')
    if pr["spec"] != yaml.safe_load(want):
        sys.exit("the PrometheusRule's spec differs from the rules file")
    cms = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"].get("labels", {}).get("grafana_dashboard") == "1"]
    if not cms:
        sys.exit("no ConfigMap labelled grafana_dashboard=\"1\"")
    data = {k: v for cm in cms for k, v in cm.get("data", {}).items()}
    for f in sorted(Path("dashboards").glob("*.json")):
        if f.name not in data or json.loads(data[f.name]) != json.loads(f.read_text()):
            sys.exit(f"dashboards ConfigMap lacks or alters {f.name}")
print("[test-alerts] helm template ok", file=sys.stderr)
PY
fi

log "all checks passed"
