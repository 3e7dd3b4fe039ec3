//! Checks of committed files that need no cluster and no tool: the chart's
//! copies of the CRD, rules and dashboards; values.schema.json against
//! values.yaml; the Dockerfiles against the workspace; the dashboards, alert
//! rules and their promtool tests; the metric documentation; the links of
//! docs/*.md; the docs' tables that copy a source: the controller's RBAC
//! (from the chart), the default read-back and the added spec fields (from
//! the CRD). (hack/test-alerts.sh and hack/test-chart.sh run them with the
//! checks that need promtool and helm.)
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use regex::Regex;
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
}

fn re(pattern: &str) -> Regex {
    Regex::new(pattern).unwrap_or_else(|e| panic!("regex {pattern}: {e}"))
}

/// Names of the files in `dir` (relative to the repository) ending in `suffix`, sorted.
fn files(dir: &str, suffix: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(root().join(dir))
        .unwrap_or_else(|e| panic!("read_dir {dir}: {e}"))
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(suffix))
        .collect();
    names.sort();
    names
}

fn assert_no_errors(what: &str, errors: &[String]) {
    assert!(errors.is_empty(), "{what}:\n  - {}", errors.join("\n  - "));
}

/// Markdown without its fenced code blocks (whose `#` lines are no headings).
fn without_code(text: &str) -> String {
    re(r"(?ms)^```.*?^```").replace_all(text, "").into_owned()
}

/// The anchor GitHub gives a heading.
fn slug(heading: &str) -> String {
    re(r"[^\w\- ]")
        .replace_all(&heading.trim().to_lowercase(), "")
        .replace(' ', "-")
}

fn anchors(markdown: &str) -> BTreeSet<String> {
    re(r"(?m)^#{1,6}\s+(.+)$")
        .captures_iter(&without_code(markdown))
        .map(|c| slug(&c[1]))
        .collect()
}

#[test]
fn chart_copies_match_their_sources() {
    let copies = [
        (
            "crds/tenstorrentdriverpolicies.yaml",
            "chart/crds/tenstorrentdriverpolicies.yaml",
            "cp crds/tenstorrentdriverpolicies.yaml chart/crds/",
        ),
        (
            "crds/tenstorrentfirmwarepolicies.yaml",
            "chart/crds/tenstorrentfirmwarepolicies.yaml",
            "cp crds/tenstorrentfirmwarepolicies.yaml chart/crds/",
        ),
        (
            "dashboards/alerts/ttdriver.rules.yaml",
            "chart/files/ttdriver.rules.yaml",
            "cp dashboards/alerts/ttdriver.rules.yaml chart/files/",
        ),
    ];
    for (src, copy, fix) in copies {
        assert!(read(src) == read(copy), "{copy} differs from {src} ({fix})");
    }
    assert_eq!(
        files("chart/crds", ""),
        [
            "tenstorrentdriverpolicies.yaml",
            "tenstorrentfirmwarepolicies.yaml"
        ],
        "chart/crds/ holds files that crds/ does not"
    );
    let dashboards = files("dashboards", ".json");
    assert_eq!(
        files("chart/files/dashboards", ".json"),
        dashboards,
        "chart/files/dashboards/ and dashboards/ hold different files (cp dashboards/*.json chart/files/dashboards/)"
    );
    for f in dashboards {
        assert!(
            read(&format!("dashboards/{f}")) == read(&format!("chart/files/dashboards/{f}")),
            "chart/files/dashboards/{f} differs from dashboards/{f} (cp dashboards/*.json chart/files/dashboards/)"
        );
    }
}

/// Every key of values.yaml is in values.schema.json, with a description.
#[test]
fn values_schema_covers_values() {
    fn walk(path: &str, value: &Value, schema: &Value, missing: &mut Vec<String>) {
        if !path.is_empty() && schema["description"].as_str().unwrap_or("").is_empty() {
            missing.push(format!("{path}: no description"));
        }
        let mut objects = vec![schema];
        if let Some(alternatives) = schema["oneOf"].as_array() {
            objects.extend(alternatives.iter().filter(|o| o["type"] == "object"));
        }
        let props: BTreeMap<&String, &Value> = objects
            .iter()
            .filter_map(|o| o["properties"].as_object())
            .flatten()
            .collect();
        let (Some(map), false) = (value.as_object(), props.is_empty()) else {
            return;
        };
        for (k, sub) in map {
            let p = if path.is_empty() {
                k.clone()
            } else {
                format!("{path}.{k}")
            };
            match props.get(k) {
                None => missing.push(p),
                Some(s) => walk(&p, sub, s, missing),
            }
        }
    }
    let schema: Value =
        serde_json::from_str(&read("chart/values.schema.json")).expect("values.schema.json parses");
    let values: Value =
        serde_yaml::from_str(&read("chart/values.yaml")).expect("values.yaml parses");
    let mut missing = Vec::new();
    walk("", &values, &schema, &mut missing);
    assert_no_errors("values.schema.json does not cover values.yaml", &missing);
}

/// Both Dockerfiles copy every workspace member and build with a Rust no
/// older than the workspace's rust-version.
#[test]
fn dockerfiles_match_the_workspace() {
    let cargo = read("Cargo.toml");
    let members: Vec<String> = re(r#"(?m)^members = \[(.*)\]"#)
        .captures(&cargo)
        .map(|c| {
            re(r#""([^"]+)""#)
                .captures_iter(&c[1])
                .map(|m| m[1].to_string())
                .collect()
        })
        .expect("Cargo.toml lists the workspace members on one line");
    let version = |v: &str| -> Vec<u32> {
        v.split('.')
            .take(2)
            .filter_map(|x| x.parse().ok())
            .collect()
    };
    let need = re(r#"(?m)^rust-version = "([^"]+)""#)
        .captures(&cargo)
        .map(|c| version(&c[1]))
        .expect("Cargo.toml has the workspace rust-version");
    let mut errors = Vec::new();
    for f in ["Dockerfile", "agent/Dockerfile"] {
        let text = read(f);
        let copied: BTreeSet<String> = re(r"(?m)^COPY (\S+) ")
            .captures_iter(&text)
            .map(|c| c[1].to_string())
            .filter(|s| !s.starts_with("--from"))
            .collect();
        for m in members.iter().filter(|m| *m != ".") {
            if !copied.contains(m) {
                errors.push(format!(
                    "{f}: workspace member {m} is not copied into the build stage"
                ));
            }
        }
        for src in ["src", "Cargo.toml"] {
            if !copied.contains(src) {
                errors.push(format!("{f}: {src} is not copied"));
            }
        }
        match re(r"(?m)^ARG RUST_VERSION=(\S+)").captures(&text) {
            Some(c) if version(&c[1]) >= need => {}
            _ => errors.push(format!(
                "{f}: ARG RUST_VERSION older than the workspace rust-version"
            )),
        }
    }
    assert_no_errors("Dockerfiles do not match the workspace", &errors);
}

/// Relative links and #anchors in docs/*.md resolve.
#[test]
fn docs_links_resolve() {
    let mut bad = Vec::new();
    let (link, scheme) = (re(r"\]\(([^)\s]+)\)"), re(r"^[a-z]+:"));
    let mut headings: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files("docs", ".md") {
        let rel = format!("docs/{f}");
        let text = without_code(&read(&rel));
        for c in link.captures_iter(&text) {
            let l = &c[1];
            if scheme.is_match(l) {
                continue;
            }
            let (path, anchor) = l.split_once('#').unwrap_or((l, ""));
            let target = if path.is_empty() {
                rel.clone()
            } else {
                normalize(&Path::new("docs").join(path))
            };
            if !root().join(&target).exists() {
                bad.push(format!("{rel}: {l}: no such file"));
            } else if !anchor.is_empty()
                && target.ends_with(".md")
                && !headings
                    .entry(target.clone())
                    .or_insert_with(|| anchors(&read(&target)))
                    .contains(anchor)
            {
                bad.push(format!("{rel}: {l}: no such heading"));
            }
        }
    }
    assert_no_errors("docs links", &bad);
}

/// `docs/../README.md` -> `README.md` (the file need not exist).
fn normalize(p: &Path) -> String {
    let mut parts: Vec<String> = Vec::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                parts.pop();
            }
            std::path::Component::Normal(s) => parts.push(s.to_string_lossy().into_owned()),
            _ => {}
        }
    }
    parts.join("/")
}

const RULES: &str = "dashboards/alerts/ttdriver.rules.yaml";
const RULE_TESTS: &str = "dashboards/alerts/ttdriver.rules.test.yaml";
const ALERTS: [&str; 15] = [
    "TTDriverNodeFailed",
    "TTDriverNodeStuckInPhase",
    "TTDriverNodeRolledBack",
    "TTDriverRolloutStalled",
    "TTDriverTooManyUnavailable",
    "TTDriverControllerDown",
    "TTDriverReconcileErrors",
    "TTDriverDeployGateLeftClosed",
    "TTDriverRolloutBraked",
    "TTDriverPromotionBlocked",
    "TTDriverNextKernelBuildFailed",
    "TTVfioBindErrors",
    "TTVfioNoIommu",
    "TTFirmwareFlashFailed",
    "TTFirmwareRolloutHalted",
];

/// Splits `text` before every match of `start` (the first piece, before any, is dropped).
fn blocks<'a>(text: &'a str, start: &Regex) -> Vec<&'a str> {
    let starts: Vec<usize> = start.find_iter(text).map(|m| m.start()).collect();
    starts
        .iter()
        .enumerate()
        .map(|(i, &s)| &text[s..starts.get(i + 1).copied().unwrap_or(text.len())])
        .collect()
}

fn panels(list: &Value, out: &mut Vec<Value>) {
    for p in list.as_array().into_iter().flatten() {
        out.push(p.clone());
        panels(&p["panels"], out);
    }
}

/// The PromQL of every dashboard query, after checking each dashboard's shape:
/// its stable uid, a recent schema, the datasource/cr/cluster/job variables,
/// non-Angular panels that query through ${datasource}, with units, unique ids.
fn dashboard_queries(errors: &mut Vec<String>) -> Vec<String> {
    const ALLOWED: [&str; 8] = [
        "timeseries",
        "stat",
        "gauge",
        "table",
        "state-timeline",
        "bargauge",
        "text",
        "row",
    ];
    let uids = BTreeMap::from([
        ("ttdriver-controller.json", "ttdriver-controller"),
        ("ttdriver-rollout.json", "ttdriver-rollout"),
    ]);
    let names = files("dashboards", ".json");
    if names != uids.keys().copied().collect::<Vec<_>>() {
        errors.push(format!(
            "dashboards/: expected {:?}, found {names:?}",
            uids.keys()
        ));
    }
    let mut exprs = Vec::new();
    for name in names {
        let f = format!("dashboards/{name}");
        let d: Value = match serde_json::from_str(&read(&f)) {
            Ok(d) => d,
            Err(e) => {
                errors.push(format!("{f}: {e}"));
                continue;
            }
        };
        if uids.get(name.as_str()).is_some_and(|u| d["uid"] != *u) {
            errors.push(format!("{f}: uid {}, expected the stable one", d["uid"]));
        }
        if d["schemaVersion"].as_i64().unwrap_or(0) < 36 {
            errors.push(format!(
                "{f}: schemaVersion {} is not recent (>= 36)",
                d["schemaVersion"]
            ));
        }
        if !d["id"].is_null() {
            errors.push(format!(
                "{f}: carries a database id; drop it so imports do not clash"
            ));
        }
        let vars: BTreeMap<&str, &Value> = d["templating"]["list"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| Some((v["name"].as_str()?, v)))
            .collect();
        let var = |n: &str| vars.get(n).copied().unwrap_or(&Value::Null);
        if var("datasource")["type"] != "datasource" || var("datasource")["query"] != "prometheus" {
            errors.push(format!(
                "{f}: needs a `datasource` variable of type datasource, query prometheus"
            ));
        }
        if !var("cr")["definition"]
            .as_str()
            .unwrap_or("")
            .contains("label_values(ttdriver_node_state{")
        {
            errors.push(format!(
                "{f}: needs the `cr` variable from label_values(ttdriver_node_state{{...}}, cr)"
            ));
        }
        for v in ["cluster", "job"] {
            if var(v)["type"] != "query" {
                errors.push(format!("{f}: needs the `{v}` query variable"));
            }
        }
        let mut all = Vec::new();
        panels(&d["panels"], &mut all);
        let mut ids = BTreeSet::new();
        for p in &all {
            let (t, title) = (p["type"].as_str().unwrap_or(""), &p["title"]);
            if !ids.insert(p["id"].to_string()) {
                errors.push(format!("{f}: duplicate panel id {}", p["id"]));
            }
            if !ALLOWED.contains(&t) {
                errors.push(format!(
                    "{f}: panel {title} has type {t:?} (Angular or unknown), not one of {ALLOWED:?}"
                ));
            }
            if p.get("gridPos").is_none() {
                errors.push(format!("{f}: panel {title} has no gridPos"));
            }
            if t == "row" || t == "text" {
                continue;
            }
            if p["datasource"]["uid"] != "${datasource}" {
                errors.push(format!(
                    "{f}: panel {title} does not use the ${{datasource}} variable"
                ));
            }
            let targets = p["targets"].as_array().cloned().unwrap_or_default();
            if targets.is_empty() {
                errors.push(format!("{f}: panel {title} has no query"));
            }
            for tg in &targets {
                let uid = &tg["datasource"]["uid"];
                if !uid.is_null() && uid != "${datasource}" {
                    errors.push(format!(
                        "{f}: panel {title} target {} pins a data source",
                        tg["refId"]
                    ));
                }
                let Some(expr) = tg["expr"].as_str().filter(|e| !e.is_empty()) else {
                    continue;
                };
                for m in [r#"cluster=~"$cluster""#, r#"job=~"$job""#] {
                    // Our metrics: the controller's (driver and firmware), the
                    // VFIO binder's, and the standard process_* ones (every
                    // process exports them: unscoped they would mix in others').
                    let metrics = expr.matches("ttdriver_").count()
                        + expr.matches("ttfw_").count()
                        + expr.matches("tt_vfio_").count()
                        + expr.matches("process_").count();
                    if metrics != expr.matches(m).count() {
                        errors.push(format!(
                            "{f}: panel {title} target {}: a metric without {m}",
                            tg["refId"]
                        ));
                    }
                }
                exprs.push(expr.to_string());
            }
            if p["fieldConfig"]["defaults"]["unit"]
                .as_str()
                .unwrap_or("")
                .is_empty()
            {
                errors.push(format!("{f}: panel {title} has no unit"));
            }
        }
    }
    exprs
}

/// The alert rules (parsed as text: the file's shape is fixed), their promtool
/// tests, the runbook they point into, and the metric documentation.
#[test]
fn dashboards_rules_and_metric_docs_lint() {
    let mut errors = Vec::new();
    let exprs = dashboard_queries(&mut errors);

    let rules = read(RULES);
    let alerts: BTreeMap<String, &str> = blocks(&rules, &re(r"(?m)^[ \t]*- alert: "))
        .into_iter()
        .filter_map(|b| Some((re(r"- alert: (\S+)").captures(b)?[1].to_string(), b)))
        .collect();
    let mut expected: Vec<String> = ALERTS.iter().map(|s| s.to_string()).collect();
    expected.sort();
    if alerts.keys().cloned().collect::<Vec<_>>() != expected {
        errors.push(format!(
            "{RULES}: alerts {:?}, expected {expected:?}",
            alerts.keys()
        ));
    }
    let runbook = anchors(&read("docs/runbook.md"));
    for (name, b) in &alerts {
        if !re(r"(?m)^\s+for:\s*\d+[smh]").is_match(b) {
            errors.push(format!(
                "alert {name}: no `for:` (one odd evaluation would page)"
            ));
        }
        let expr = re(r"expr: \|\n((?:\s{10}.*\n)+)")
            .captures(b)
            .map(|c| c[1].to_string())
            .unwrap_or_default();
        for c in re(r"\b(?:by|on) \(([^)]*)\)").captures_iter(&expr) {
            if !c[1].split(',').any(|l| l.trim() == "namespace") {
                errors.push(format!(
                    "alert {name}: `by/on ({})` drops the namespace label",
                    &c[1]
                ));
            }
        }
        match re(r"severity:\s*(\S+)").captures(b) {
            Some(c) if ["critical", "warning", "info"].contains(&&c[1]) => {}
            _ => errors.push(format!(
                "alert {name}: severity missing or not critical|warning|info"
            )),
        }
        for key in ["summary", "description", "runbook_url"] {
            if !re(&format!(r"(?m)^\s+{key}:")).is_match(b) {
                errors.push(format!("alert {name}: annotation {key} missing"));
            }
        }
        if let Some(c) = re(r#"runbook_url:\s*"?([^"\s]+)"#).captures(b) {
            match c[1].split_once("docs/runbook.md#") {
                None => errors.push(format!(
                    "alert {name}: runbook_url {} does not point into docs/runbook.md",
                    &c[1]
                )),
                Some((_, a)) if !runbook.contains(a) => errors.push(format!(
                    "alert {name}: runbook anchor #{a} is not a heading of docs/runbook.md"
                )),
                Some((_, a)) if a != name.to_lowercase() => errors.push(format!(
                    "alert {name}: runbook anchor should be #{}",
                    name.to_lowercase()
                )),
                Some(_) => {}
            }
        }
    }

    // A firing and a non-firing promtool case per alert.
    let tests = read(RULE_TESTS);
    let (mut fired, mut quiet) = (BTreeSet::new(), BTreeSet::new());
    for c in blocks(&tests, &re(r"(?m)^[ \t]*- eval_time:")) {
        let Some(n) = re(r"alertname:\s*(\S+)").captures(c) else {
            continue;
        };
        let firing = re(r"exp_alerts:\s*(\[\])?")
            .captures(c)
            .is_some_and(|e| e.get(1).is_none());
        if firing { &mut fired } else { &mut quiet }.insert(n[1].to_string());
    }
    for name in ALERTS {
        if !fired.contains(name) {
            errors.push(format!("{RULE_TESTS}: no firing test case for {name}"));
        }
        if !quiet.contains(name) {
            errors.push(format!("{RULE_TESTS}: no non-firing test case for {name}"));
        }
    }

    // The metric families are defined in src/metrics/ (one file per group);
    // its tests and the test-only text parser define none.
    let doc = read("docs/metrics.md");
    let src: String = files("src/metrics", ".rs")
        .into_iter()
        .filter(|f| f != "tests.rs" && f != "text_parser.rs")
        .map(|f| {
            let text = read(&format!("src/metrics/{f}"));
            text.split("#[cfg(test)]").next().unwrap_or("").to_string()
        })
        .collect();
    let names: BTreeSet<String> = re(r#""(ttdriver_[a-z0-9_]+)""#)
        .captures_iter(&src)
        .map(|c| c[1].to_string())
        .collect();
    if names.len() < 20 {
        errors.push(format!(
            "src/metrics/: found only {} metric names",
            names.len()
        ));
    }
    let base = |n: &str| -> String {
        for suffix in ["_bucket", "_sum", "_count"] {
            if let Some(b) = n.strip_suffix(suffix).filter(|b| names.contains(*b)) {
                return b.to_string();
            }
        }
        n.to_string()
    };
    let used: BTreeSet<String> = exprs
        .iter()
        .map(String::as_str)
        .chain([rules.as_str()])
        .flat_map(|e| {
            re(r"\b(ttdriver_[a-z0-9_]+)")
                .captures_iter(e)
                .map(|c| base(&c[1]))
                .collect::<Vec<_>>()
        })
        .collect();
    for n in names.union(&used) {
        if !doc.contains(&format!("`{n}`")) && !doc.contains(&format!("`{n}{{")) {
            errors.push(format!("docs/metrics.md does not document {n}"));
        }
    }
    for u in used.difference(&names) {
        errors.push(format!(
            "{u} is queried by a dashboard or rule but not defined in src/metrics/"
        ));
    }
    // The Go operator's metrics, which existing dashboards and alerts query.
    for n in [
        "ttdriver_policy_nodes",
        "ttdriver_nodes_by_kmd_version",
        "ttdriver_policy_desired_version",
        "ttdriver_pods_evicted_total",
        "ttdriver_drain_blocked_total",
        "ttdriver_errors_total",
        "ttdriver_last_successful_reconcile_timestamp_seconds",
    ] {
        if !names.contains(n) {
            errors.push(format!("src/metrics/ lacks the Go operator's metric {n}"));
        }
    }
    assert_no_errors("dashboards, rules and metric docs", &errors);
}

/// The chart pins every tt-kmd release a policy can name by default: each
/// MAJOR.MINOR.PATCH release tag of github.com/tenstorrent/tt-kmd up to the
/// newest one known here (ttkmd-2.10.0), the six 1.x point releases
/// included (the other 1.x tags have two parts, which no policy can name),
/// has its full commit in `driver.sourceCommits`. hack/test-vm.sh real
/// checks the pins it builds against the real repository.
#[test]
fn chart_pins_every_upstream_release() {
    const RELEASES: [&str; 18] = [
        "1.5.1", "1.9.1", "1.11.1", "1.18.1", "1.20.1", "1.27.1", "2.0.0", "2.1.0", "2.2.0",
        "2.3.0", "2.4.0", "2.4.1", "2.5.0", "2.6.0", "2.7.0", "2.8.0", "2.9.0", "2.10.0",
    ];
    let values: serde_yaml::Value =
        serde_yaml::from_str(&read("chart/values.yaml")).expect("values.yaml parses");
    let table = values["driver"]["sourceCommits"]
        .as_mapping()
        .expect("driver.sourceCommits is a map");
    let mut errors = vec![];
    for v in RELEASES {
        match table.get(v).and_then(|c| c.as_str()) {
            Some(c) if ttdrv_core::trust::validate_commit(c).as_deref() == Ok(c) => {}
            other => errors.push(format!("{v}: {other:?} (a full, lowercase commit)")),
        }
    }
    for k in table.keys() {
        let k = k.as_str().unwrap_or_default();
        if !RELEASES.contains(&k) {
            errors.push(format!("{k}: not a known release"));
        }
    }
    assert_no_errors("driver.sourceCommits", &errors);
}

/// The demo (the README's first command) starts the controller with an
/// installer image the controller accepts: it refuses the Go operator's
/// builder at start-up, which once left the demo waiting on a controller
/// that had exited.
#[test]
fn the_demo_starts_a_controller_that_accepts_its_arguments() {
    let demo = read("hack/demo.sh");
    let image = demo
        .split("--installer-image")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .expect("hack/demo.sh passes --installer-image");
    assert!(
        !ttdrv_api::images::is_go_builder(image),
        "hack/demo.sh starts the controller with the Go builder image {image}, which it refuses"
    );
    for file in ["hack/demo/policies.yaml", "hack/demo/firmware.yaml"] {
        assert!(root().join(file).exists(), "{file}");
    }
}

/// One permission: (scope, API group, resource) and its verbs, with the
/// values the chart grants it under (`flasher.enabled`); scope is `cluster`
/// (ClusterRole) or `operator namespace` (Role).
type Grants = BTreeMap<(String, String, String), (BTreeSet<String>, BTreeSet<String>)>;

/// The controller's ClusterRole and Role rules in chart/templates/rbac.yaml,
/// read from the template itself (helm is not needed here): every rule of
/// the documents labelled `component: controller`, with the `{{ if }}`
/// blocks around it.
fn chart_controller_rbac() -> Grants {
    let text = read("chart/templates/rbac.yaml");
    let text = re(r"(?s)\{\{-?\s*/\*.*?\*/\s*-?\}\}").replace_all(&text, "");
    let (open, end) = (
        re(r"\{\{-?\s*(?:if|with|range)\s+(.*?)\s*-?\}\}"),
        re(r"\{\{-?\s*end\s*-?\}\}"),
    );
    let list = |l: &str| -> Vec<String> {
        let inner = l.split_once('[').and_then(|(_, r)| r.rsplit_once(']'));
        inner
            .map(|(i, _)| i)
            .unwrap_or_default()
            .split(',')
            .map(|v| v.trim().trim_matches('"').to_string())
            .collect()
    };
    let mut grants = Grants::new();
    let mut conditions: Vec<String> = Vec::new();
    for doc in text.split("\n---") {
        let scope = if !doc.contains("app.kubernetes.io/component: controller") {
            continue;
        } else if re(r"(?m)^kind: ClusterRole$").is_match(doc) {
            "cluster"
        } else if re(r"(?m)^kind: Role$").is_match(doc) {
            "operator namespace"
        } else {
            // A binding: the `if`s around it still count.
            ""
        };
        let mut group = Vec::new();
        let mut resources = Vec::new();
        for line in doc.lines() {
            if let Some(c) = open.captures(line) {
                conditions.push(c[1].trim_start_matches(".Values.").to_string());
            } else if end.is_match(line) {
                conditions.pop();
            } else if line.trim_start().starts_with("- apiGroups:") {
                group = list(line);
            } else if line.trim_start().starts_with("resources:") {
                resources = list(line);
            } else if line.trim_start().starts_with("verbs:") && !scope.is_empty() {
                // rbac.create gates the whole file: not a condition of a rule.
                let when: BTreeSet<String> = conditions
                    .iter()
                    .filter(|c| *c != "rbac.create")
                    .cloned()
                    .collect();
                for g in &group {
                    for r in &resources {
                        let key = (scope.to_string(), g.clone(), r.clone());
                        let verbs = list(line).into_iter().collect();
                        grants.insert(key, (verbs, when.clone()));
                    }
                }
            }
        }
    }
    grants
}

/// The table after "The controller's permissions, in full" in
/// docs/operations.md: scope | API group | resources | verbs | why.
fn documented_controller_rbac() -> Grants {
    let doc = read("docs/operations.md");
    let only_with = re(r"only with `([^`]+)`");
    doc.lines()
        .skip_while(|l| !l.starts_with("The controller's permissions, in full"))
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let cell = |i: usize| cells.get(i).copied().unwrap_or_default();
            let group = match cell(2).trim_matches('`') {
                "core" => "",
                g => g,
            };
            let key = (
                cell(1).to_string(),
                group.to_string(),
                cell(3).trim_matches('`').to_string(),
            );
            let verbs = cell(4).split(',').map(|v| v.trim().to_string()).collect();
            let when = only_with
                .captures_iter(cell(5))
                .map(|c| c[1].to_string())
                .collect();
            (key, (verbs, when))
        })
        .collect()
}

/// docs/operations.md lists the controller's permissions "in full": the
/// same rules, verbs and conditions as the chart's ClusterRole and Role.
#[test]
fn controller_rbac_table_matches_the_chart() {
    let chart = chart_controller_rbac();
    let doc = documented_controller_rbac();
    assert!(
        chart.len() >= 10,
        "read only {} rules of the chart",
        chart.len()
    );
    let mut errors = Vec::new();
    for (k, v) in &chart {
        match doc.get(k) {
            None => errors.push(format!("{k:?}: in the chart, not in the table")),
            Some(d) if d != v => errors.push(format!("{k:?}: the chart {v:?}, the table {d:?}")),
            Some(_) => {}
        }
    }
    for k in doc.keys().filter(|k| !chart.contains_key(*k)) {
        errors.push(format!("{k:?}: in the table, not in the chart"));
    }
    assert_no_errors(
        "docs/operations.md's RBAC table against chart/templates/rbac.yaml",
        &errors,
    );
}

/// Applies the CRD schema's defaults to `value` as the API server does:
/// a missing property with a default gets it, then its own properties are
/// defaulted in turn.
fn apply_defaults(value: &mut Value, schema: &Value) {
    if let (Some(obj), Some(props)) = (value.as_object_mut(), schema["properties"].as_object()) {
        for (k, sub) in props {
            if !obj.contains_key(k)
                && let Some(d) = sub.get("default")
            {
                obj.insert(k.clone(), d.clone());
            }
            if let Some(v) = obj.get_mut(k) {
                apply_defaults(v, sub);
            }
        }
    }
    if let Some(items) = value.as_array_mut() {
        for v in items {
            apply_defaults(v, &schema["items"]);
        }
    }
}

/// The read-back of the minimum policy in docs/crd-reference.md is what the
/// API server makes of it with the CRD's defaults: no default missing, none
/// made up.
#[test]
fn crd_reference_readback_has_every_default() {
    let doc = read("docs/crd-reference.md");
    let blocks: Vec<Value> = re(r"(?ms)^## The minimum policy\n(.*?)^## ")
        .captures(&doc)
        .map(|c| c[1].to_string())
        .map(|section| {
            re(r"(?ms)^```yaml\n(.*?)^```")
                .captures_iter(&section)
                .map(|b| serde_yaml::from_str(&b[1]).expect("the yaml block parses"))
                .collect()
        })
        .unwrap_or_default();
    let [policy, readback] = blocks.as_slice() else {
        panic!(
            "crd-reference.md's minimum policy: expected the policy and its read-back, found {} yaml blocks",
            blocks.len()
        );
    };
    let crd: Value =
        serde_yaml::from_str(&read("crds/tenstorrentdriverpolicies.yaml")).expect("the CRD parses");
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    assert!(schema.is_object(), "the CRD has a spec schema");
    let mut spec = policy["spec"].clone();
    apply_defaults(&mut spec, schema);
    assert_eq!(
        readback["spec"], spec,
        "docs/crd-reference.md's read-back of the minimum policy (left) against the CRD's defaults (right)"
    );
}

/// The CRD's spec fields as documented: top-level fields by name, and those
/// of `upgradePolicy` and `installer` one level further down
/// (`upgradePolicy.prepare`), which is how the lists below name them.
fn crd_spec_fields() -> BTreeSet<String> {
    let crd: Value =
        serde_yaml::from_str(&read("crds/tenstorrentdriverpolicies.yaml")).expect("the CRD parses");
    let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let mut fields = BTreeSet::new();
    for (k, sub) in spec["properties"].as_object().into_iter().flatten() {
        match k.as_str() {
            "upgradePolicy" | "installer" => {
                for c in sub["properties"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|c| c.0)
                {
                    fields.insert(format!("{k}.{c}"));
                }
            }
            _ => {
                fields.insert(k.clone());
            }
        }
    }
    fields
}

/// The fields among the backticked words of `text` (`upgradePolicy.drain.*`
/// names `upgradePolicy.drain`; words that name no field are left out).
fn fields_named(text: &str, fields: &BTreeSet<String>) -> BTreeSet<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(|w| w.trim_end_matches(".*"))
        .filter(|w| fields.contains(*w))
        .map(String::from)
        .collect()
}

/// crd-reference.md's opening says which spec fields are Go's and which were
/// added: together they are every field of the CRD, and the migration guide's
/// "New spec fields" names every addition.
#[test]
fn added_spec_fields_are_listed() {
    let fields = crd_spec_fields();
    assert!(fields.len() >= 20, "read only {} spec fields", fields.len());
    let doc = read("docs/crd-reference.md");
    let intro = doc
        .split_once("The additions are")
        .and_then(|(_, rest)| rest.split_once("The CRD is generated"))
        .map(|(p, _)| p)
        .expect("crd-reference.md's opening lists the additions, then the Go fields");
    let (added, go) = intro
        .split_once("the Go fields")
        .expect("crd-reference.md's opening lists the Go fields after the additions");
    let (added, go) = (fields_named(added, &fields), fields_named(go, &fields));
    let mut errors = Vec::new();
    for f in &fields {
        if !added.contains(f) && !go.contains(f) {
            errors.push(format!(
                "{f}: crd-reference.md lists it neither as an addition nor as a Go field"
            ));
        }
    }
    for f in added.intersection(&go) {
        errors.push(format!("{f}: both an addition and a Go field"));
    }
    let guide = read("docs/migrating-from-go-operator.md");
    let bullet: String = guide
        .lines()
        .skip_while(|l| !l.starts_with("- **New spec fields**"))
        .enumerate()
        .take_while(|(i, l)| *i == 0 || l.starts_with("  "))
        .map(|(_, l)| format!("{l}\n"))
        .collect();
    // The bullet goes on with the Go fields, unchanged.
    let new = fields_named(bullet.split("the Go").next().unwrap_or_default(), &fields);
    for f in added.difference(&new) {
        errors.push(format!(
            "{f}: an addition the migration guide's \"New spec fields\" does not name"
        ));
    }
    for f in new.difference(&added) {
        errors.push(format!(
            "{f}: a new spec field in the migration guide, not an addition in crd-reference.md"
        ));
    }
    assert_no_errors("the added spec fields", &errors);
}

/// The "Run it" prose around the README's two commands (issue 51): the two
/// stay two, and a newcomer learns what `make demo` needs and how long it
/// takes before starting it.
fn run_it() -> String {
    let readme = read("README.md");
    readme
        .split("\n## Run it\n")
        .nth(1)
        .and_then(|r| r.split("\n## ").next())
        .expect("README.md has a \"## Run it\" section")
        .to_string()
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn the_readme_keeps_two_commands_and_says_what_the_demo_needs() {
    let run_it = run_it();
    let commands: Vec<&str> = run_it
        .lines()
        .filter(|l| l.starts_with("    ") || l.starts_with("```"))
        .map(str::trim)
        .collect();
    assert_eq!(commands, ["make demo", "make test"], "README's commands");
    let rust = read("Cargo.toml")
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = "))
        .map(|v| v.trim_matches('"').to_string())
        .expect("Cargo.toml's rust-version");
    let prose = one_line(&run_it);
    let mut missing = vec![];
    for need in [
        format!("Rust toolchain {rust} or newer"),
        "Go 1.26 or newer".to_string(),
        "python3".to_string(),
        // The cold figure (issue 51's) and a measured warm one.
        "cold (a fresh clone".to_string(),
        "29 min 55 s".to_string(),
        "Warm (cluster binaries cached".to_string(),
    ] {
        if !prose.contains(&need) {
            missing.push(need);
        }
    }
    assert_no_errors("README \"Run it\" should say", &missing);
}

/// The pacing the README promises is the demo's: the simulated agent's
/// times in hack/demo.sh and the workload's stop time in
/// hack/demo/workload.yaml, each a few seconds, so that every state is seen.
#[test]
fn the_readme_quotes_the_demos_pacing() {
    let demo = read("hack/demo.sh");
    let pacing = demo
        .lines()
        .find(|l| l.starts_with("agent_pacing=("))
        .expect("hack/demo.sh sets agent_pacing");
    let secs = |flag: &str| -> u64 {
        let ms: u64 = pacing
            .split(flag)
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|v| v.trim_end_matches(')').parse().ok())
            .unwrap_or_else(|| panic!("agent_pacing has no {flag}: {pacing}"));
        assert!(
            ms.is_multiple_of(1000) && (1000..=10_000).contains(&ms),
            "{flag} {ms}: a few whole seconds"
        );
        ms / 1000
    };
    let workload = read("hack/demo/workload.yaml");
    let stop: u64 = workload
        .split(&format!(
            "{}: \"",
            ttdrv_testkit::sim_workload::STOP_SECONDS_LABEL
        ))
        .nth(1)
        .and_then(|r| r.split('"').next())
        .and_then(|v| v.parse().ok())
        .expect("hack/demo/workload.yaml labels its stop time");
    assert!(
        (1..=10).contains(&stop),
        "stop time {stop} s: a few seconds"
    );
    assert!(
        workload.contains(ttdrv_testkit::sim_workload::STOP_FINALIZER),
        "without the finalizer nothing holds the evicted pod: the drain ends at once"
    );
    let want = format!(
        "it takes {} s to start, {} s to build a version ahead, {} s to swap the module and {} s \
         to flash a card, and the device workload on `tt-prod-1` (`llm-inference`) takes {stop} s \
         to stop when the drain evicts it",
        secs("--work-ms"),
        secs("--build-ms"),
        secs("--load-ms"),
        secs("--flash-ms"),
    );
    assert!(
        one_line(&run_it()).contains(&want),
        "README \"Run it\" should say: {want}"
    );
}

/// hack/lib.sh's heartbeat (the demo's progress through silent builds): a
/// silent step gets a line within its period, the step's status comes
/// through, and a ticker whose shell is gone stops by itself.
#[test]
fn a_silent_step_gets_a_heartbeat_within_its_period() {
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    let script = r#"source "$1"
TTDRV_HEARTBEAT_SECONDS=1 with_heartbeat "napping" sleep 2.5; echo "status $?"
with_heartbeat "failing" false && echo "status 0" || echo "status $?"
exec 2>/dev/null # else the ticker holds the test's pipe open
TTDRV_HEARTBEAT_SECONDS=1 heartbeat_start "left behind"
echo "ticker $lib_heartbeat_pid""#;
    let t0 = Instant::now();
    let mut child = Command::new("bash")
        .args(["-c", script, "bash"])
        .arg(root().join("hack/lib.sh"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("bash");
    let stderr = child.stderr.take().expect("stderr");
    let lines: Vec<(Duration, String)> = std::io::BufReader::new(stderr)
        .lines()
        .map_while(Result::ok)
        .map(|l| (t0.elapsed(), l))
        .collect();
    let out = child.wait_with_output().expect("bash ran");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("status 0\nstatus 1\n"), "{stdout}");
    let beats: Vec<_> = lines
        .iter()
        .filter(|(_, l)| l.contains("still napping"))
        .collect();
    assert_eq!(beats.len(), 2, "a line a second through 2.5 s: {lines:?}");
    assert!(
        beats[0].0 < Duration::from_millis(1900),
        "first heartbeat after {:?}, period 1 s",
        beats[0].0
    );
    let pid = stdout
        .lines()
        .find_map(|l| l.strip_prefix("ticker "))
        .expect("ticker pid");
    let deadline = Instant::now() + Duration::from_secs(5);
    // Gone, or a zombie its new parent has not reaped yet.
    let alive = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
    };
    while alive() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!alive(), "the ticker {pid} outlived its shell");
}
