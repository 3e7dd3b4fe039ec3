//! What cannot work is refused by the real API server, naming the field: a table
//! of malformed policies, one row per rule of `ttdrv_api::validation` (label
//! syntax of selectors and `podSelectorLabel`, the policy name limit, the image
//! and source repository grammar, the version rule shared with the agent, and the
//! size bounds), each of which must be refused with 422 and the field's path in
//! the message. Policies at the edge of every limit, and every policy example
//! of the docs, must be accepted; for the edge policies the rendered DaemonSet
//! must be valid too (server-side dry run), so an admitted policy can be applied.

use k8s_openapi::api::apps::v1::DaemonSet;
use kube::Api;
use kube::api::{DynamicObject, PostParams};
use serde::Deserialize;
use serde_json::{Value, json};
use ttdrv_api::TenstorrentDriverPolicy;
use ttdrv_api::validation::{
    IMAGE_MAX_LENGTH, LABEL_KEY_MAX_LENGTH, LABEL_NAME_MAX_LENGTH, LABEL_PREFIX_MAX_LENGTH,
    LABEL_VALUE_MAX_LENGTH, MATCH_EXPRESSIONS_MAX, MATCH_LABELS_MAX, POD_SELECTOR_MAX_LENGTH,
    POLICY_NAME_MAX_LENGTH, SELECTOR_VALUES_MAX, SOURCE_REPOSITORY_MAX_LENGTH,
};
use ttdrv_controller::render::{RenderContext, render_daemonset};
use ttdrv_testkit::policy::{create_raw_policy, delete_policies};
use ttdrv_testkit::{TestEnv, ensure_crd};

/// Creates a policy named `name` with `spec` (raw JSON, so malformed values reach
/// the API server as written).
async fn create(env: &TestEnv, name: &str, spec: &Value) -> Result<DynamicObject, kube::Error> {
    create_raw_policy(env, name, spec).await
}

/// A name of this test of exactly `len` characters.
fn name_of_length(env: &TestEnv, len: usize) -> String {
    let base = env.name("");
    assert!(base.len() < len, "{base} is already {} long", base.len());
    format!("{base}{}", "n".repeat(len - base.len()))
}

/// `version: 2.8.0` and `nodeAffinity: {}` under `extra` (merged on top).
fn spec(extra: Value) -> Value {
    let mut s = json!({ "version": "2.8.0", "nodeAffinity": {} });
    merge(&mut s, extra);
    s
}

fn merge(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

fn affinity(term: Value) -> Value {
    spec(json!({ "nodeAffinity": term }))
}

fn labels_term(key: &str, value: &str) -> Value {
    affinity(json!({ "matchLabels": { key: value } }))
}

fn expression(key: &str, op: &str, values: Option<Vec<String>>) -> Value {
    let mut r = json!({ "key": key, "operator": op });
    if let Some(v) = values {
        r["values"] = json!(v);
    }
    affinity(json!({ "matchExpressions": [r] }))
}

fn pod_selector(s: &str) -> Value {
    spec(json!({ "upgradePolicy": { "drain": { "podSelectorLabel": s } } }))
}

fn image(s: &str) -> Value {
    spec(json!({ "installer": { "image": s } }))
}

fn repo(s: &str) -> Value {
    spec(json!({ "installer": { "sourceRepository": s } }))
}

fn strs(v: &[&str]) -> Option<Vec<String>> {
    Some(v.iter().map(|s| s.to_string()).collect())
}

/// A lowercase DNS subdomain of exactly `len` characters (labels of at most 63).
fn dns_prefix(len: usize) -> String {
    let mut s = String::new();
    while s.len() < len {
        if !s.is_empty() {
            s.push('.');
        }
        let take = (len - s.len()).min(63);
        s.push_str(&"p".repeat(take));
    }
    // A label cannot be empty: when the last one came out empty, shift a character.
    if s.ends_with('.') {
        s.pop();
        s.insert(0, 'p');
    }
    assert_eq!(s.len(), len);
    s
}

struct Row {
    what: &'static str,
    /// Name of the policy; `None`: a short name of this test.
    name: Option<String>,
    spec: Value,
    /// Path of the refused field, as the API server prints it.
    field: &'static str,
}

fn row(what: &'static str, spec: Value, field: &'static str) -> Row {
    Row {
        what,
        name: None,
        spec,
        field,
    }
}

fn malformed_policies(env: &TestEnv) -> Vec<Row> {
    let v64 = "v".repeat(LABEL_VALUE_MAX_LENGTH + 1);
    let n64 = "n".repeat(LABEL_NAME_MAX_LENGTH + 1);
    let p254 = dns_prefix(LABEL_PREFIX_MAX_LENGTH + 1);
    let digest = "a".repeat(64);
    let many_labels: serde_json::Map<String, Value> = (0..=MATCH_LABELS_MAX)
        .map(|i| (format!("k{i}"), json!("v")))
        .collect();
    let many_values: Vec<String> = (0..=SELECTOR_VALUES_MAX).map(|i| format!("v{i}")).collect();
    let requirement = json!({ "key": "k", "operator": "Exists" });
    let many_exprs = vec![requirement.clone(); MATCH_EXPRESSIONS_MAX + 1];
    // The issue's 1.6 MB policy: 20,000 requirements.
    let huge: Vec<Value> = (0..20_000)
        .map(|i| json!({ "key": format!("tt.tenstorrent.com/pool-{i}"), "operator": "In", "values": ["training-a", "training-b"] }))
        .collect();

    vec![
        // metadata.name: a label value (driver.tenstorrent.com/policy), DaemonSet ttdrv-<name>
        Row {
            what: "name of 64 characters",
            name: Some(name_of_length(env, POLICY_NAME_MAX_LENGTH + 1)),
            spec: spec(json!({})),
            field: "metadata.name",
        },
        Row {
            what: "name of 253 characters",
            name: Some(name_of_length(env, 253)),
            spec: spec(json!({})),
            field: "metadata.name",
        },
        // spec.version: the agent's rule, at most 9 digits per part
        row(
            "version part of 10 digits",
            spec(json!({ "version": "2.8.1234567890" })),
            "spec.version",
        ),
        row(
            "version major of 10 digits",
            spec(json!({ "version": "1234567890.0.0" })),
            "spec.version",
        ),
        row(
            "version of 30 characters",
            spec(json!({ "version": "123456789.123456789.1234567890" })),
            "spec.version",
        ),
        row(
            "version with v prefix",
            spec(json!({ "version": "v2.8.0" })),
            "spec.version",
        ),
        row(
            "version with a suffix",
            spec(json!({ "version": "2.8.0-rc1" })),
            "spec.version",
        ),
        // nodeAffinity.matchLabels keys
        row(
            "matchLabels key with a space and !",
            labels_term("bad key!", "x"),
            "spec.nodeAffinity.matchLabels",
        ),
        row(
            "matchLabels key starting with -",
            labels_term("-pool", "x"),
            "spec.nodeAffinity.matchLabels",
        ),
        row(
            "matchLabels key with an uppercase prefix",
            labels_term("Example.com/pool", "x"),
            "spec.nodeAffinity.matchLabels",
        ),
        row(
            "matchLabels key with two slashes",
            labels_term("a/b/c", "x"),
            "spec.nodeAffinity.matchLabels",
        ),
        row(
            "matchLabels key with an empty prefix",
            labels_term("/pool", "x"),
            "spec.nodeAffinity.matchLabels",
        ),
        row(
            "matchLabels empty key",
            labels_term("", "x"),
            "spec.nodeAffinity.matchLabels",
        ),
        row(
            "matchLabels key name of 64 characters",
            labels_term(&n64, "x"),
            "spec.nodeAffinity.matchLabels",
        ),
        row(
            "matchLabels key prefix of 254 characters",
            labels_term(&format!("{p254}/pool"), "x"),
            "spec.nodeAffinity.matchLabels",
        ),
        // nodeAffinity.matchLabels values
        row(
            "matchLabels value with a space",
            labels_term("pool", "bad value"),
            "spec.nodeAffinity.matchLabels[pool]",
        ),
        row(
            "matchLabels value of 64 characters",
            labels_term("pool", &v64),
            // OpenAPI bounds print a map entry as `.pool`, CEL rules as `[pool]`.
            "spec.nodeAffinity.matchLabels.pool",
        ),
        row(
            "matchLabels value ending with -",
            labels_term("pool", "prod-"),
            "spec.nodeAffinity.matchLabels[pool]",
        ),
        row(
            "matchLabels value with a slash",
            labels_term("pool", "a/b"),
            "spec.nodeAffinity.matchLabels[pool]",
        ),
        row(
            "matchLabels of 65 entries",
            affinity(json!({ "matchLabels": many_labels })),
            "spec.nodeAffinity.matchLabels",
        ),
        // nodeAffinity.matchExpressions
        row(
            "expression key with a space",
            expression("bad key", "Exists", None),
            "spec.nodeAffinity.matchExpressions[0].key",
        ),
        row(
            "expression empty key",
            expression("", "Exists", None),
            "spec.nodeAffinity.matchExpressions[0].key",
        ),
        row(
            "expression key name of 64 characters",
            expression(&format!("tt.tenstorrent.com/{n64}"), "Exists", None),
            "spec.nodeAffinity.matchExpressions[0].key",
        ),
        row(
            "expression key of 318 characters",
            expression(
                &format!("{}/{}", dns_prefix(254), "n".repeat(63)),
                "Exists",
                None,
            ),
            "spec.nodeAffinity.matchExpressions[0].key",
        ),
        row(
            "expression operator Like",
            expression("pool", "Like", strs(&["a"])),
            "spec.nodeAffinity.matchExpressions[0].operator",
        ),
        row(
            "In without values",
            expression("pool", "In", None),
            "spec.nodeAffinity.matchExpressions[0].values",
        ),
        row(
            "NotIn with an empty list",
            expression("pool", "NotIn", strs(&[])),
            "spec.nodeAffinity.matchExpressions[0].values",
        ),
        row(
            "Exists with values",
            expression("pool", "Exists", strs(&["a"])),
            "spec.nodeAffinity.matchExpressions[0].values",
        ),
        row(
            "DoesNotExist with values",
            expression("pool", "DoesNotExist", strs(&["a"])),
            "spec.nodeAffinity.matchExpressions[0].values",
        ),
        row(
            "expression value with a space",
            expression("pool", "In", strs(&["prod", "a b"])),
            "spec.nodeAffinity.matchExpressions[0].values[1]",
        ),
        row(
            "expression value of 64 characters",
            expression("pool", "In", strs(&[&v64])),
            "spec.nodeAffinity.matchExpressions[0].values[0]",
        ),
        row(
            "expression of 129 values",
            expression("pool", "In", Some(many_values)),
            "spec.nodeAffinity.matchExpressions[0].values",
        ),
        row(
            "33 expressions",
            affinity(json!({ "matchExpressions": many_exprs })),
            "spec.nodeAffinity.matchExpressions",
        ),
        row(
            "20,000 expressions (1.6 MB)",
            affinity(json!({ "matchExpressions": huge })),
            "spec.nodeAffinity.matchExpressions",
        ),
        // nodeSelector, the deprecated alias, has the same rules
        row(
            "nodeSelector matchLabels bad key",
            json!({ "version": "2.8.0", "nodeSelector": { "matchLabels": { "bad key": "x" } } }),
            "spec.nodeSelector.matchLabels",
        ),
        row(
            "nodeSelector expression bad value",
            json!({ "version": "2.8.0", "nodeSelector": { "matchExpressions": [
                { "key": "pool", "operator": "In", "values": ["a b"] } ] } }),
            "spec.nodeSelector.matchExpressions[0].values[0]",
        ),
        // upgradePolicy.drain.podSelectorLabel
        row(
            "podSelectorLabel without parentheses",
            pod_selector("app in train"),
            "spec.upgradePolicy.drain.podSelectorLabel",
        ),
        row(
            "podSelectorLabel key with two slashes",
            pod_selector("a/b/c=x"),
            "spec.upgradePolicy.drain.podSelectorLabel",
        ),
        row(
            "podSelectorLabel key with an uppercase prefix",
            pod_selector("Example.com/app=x"),
            "spec.upgradePolicy.drain.podSelectorLabel",
        ),
        row(
            "podSelectorLabel with a semicolon",
            pod_selector("app=x;y"),
            "spec.upgradePolicy.drain.podSelectorLabel",
        ),
        row(
            "podSelectorLabel value of 64 characters",
            pod_selector(&format!("app={v64}")),
            "spec.upgradePolicy.drain.podSelectorLabel",
        ),
        row(
            "podSelectorLabel key name of 64 characters",
            pod_selector(&format!("!{n64}")),
            "spec.upgradePolicy.drain.podSelectorLabel",
        ),
        row(
            "podSelectorLabel key prefix of 254 characters",
            pod_selector(&format!("{p254}/app=x")),
            "spec.upgradePolicy.drain.podSelectorLabel",
        ),
        row(
            "podSelectorLabel in-list value of 64 characters",
            pod_selector(&format!("tier in (a, {v64})")),
            "spec.upgradePolicy.drain.podSelectorLabel",
        ),
        row(
            "podSelectorLabel of 1025 characters",
            pod_selector(&vec!["a"; POD_SELECTOR_MAX_LENGTH / 2 + 1].join(",")),
            "spec.upgradePolicy.drain.podSelectorLabel",
        ),
        // installer.image
        row(
            "image with a space",
            image("ghcr.io/x/y:tag with space"),
            "spec.installer.image",
        ),
        row(
            "image with a newline",
            image("ghcr.io/x/y:1\n"),
            "spec.installer.image",
        ),
        row(
            "image with an uppercase repository",
            image("ghcr.io/Tenstorrent/agent:1"),
            "spec.installer.image",
        ),
        row(
            "image with a short digest",
            image("ghcr.io/x/y@sha256:abc"),
            "spec.installer.image",
        ),
        row(
            "image with an unknown digest algorithm",
            image(&format!("ghcr.io/x/y@md5:{digest}")),
            "spec.installer.image",
        ),
        row(
            "image given as a URL",
            image("https://ghcr.io/x/y"),
            "spec.installer.image",
        ),
        row(
            "image tag of 129 characters",
            image(&format!("ghcr.io/x/y:{}", "t".repeat(129))),
            "spec.installer.image",
        ),
        row(
            "image of 513 characters",
            image(&format!("ghcr.io/{}", "a".repeat(IMAGE_MAX_LENGTH + 1 - 8))),
            "spec.installer.image",
        ),
        // installer.sourceCommit: a full commit only
        row(
            "abbreviated sourceCommit",
            spec(json!({ "installer": { "sourceCommit": "0123456" } })),
            "spec.installer.sourceCommit",
        ),
        row(
            "sourceCommit that is a tag name",
            spec(json!({ "installer": { "sourceCommit": "ttkmd-2.8.0" } })),
            "spec.installer.sourceCommit",
        ),
        row(
            "sourceCommit of 41 hex digits",
            spec(json!({ "installer": { "sourceCommit": "a".repeat(41) } })),
            "spec.installer.sourceCommit",
        ),
        // installer.signingSecret: a Secret's name
        row(
            "signingSecret in upper case",
            spec(json!({ "installer": { "signingSecret": "Module-Signing" } })),
            "spec.installer.signingSecret",
        ),
        row(
            "signingSecret given as namespace/name",
            spec(json!({ "installer": { "signingSecret": "kube-system/module-signing" } })),
            "spec.installer.signingSecret",
        ),
        row(
            "signingSecret of 254 characters",
            spec(json!({ "installer": { "signingSecret": "s".repeat(254) } })),
            "spec.installer.signingSecret",
        ),
        // installer.sourceRepository: https or ssh only, no control characters
        row(
            "sourceRepository over http://",
            repo("http://github.com/tenstorrent/tt-kmd.git"),
            "spec.installer.sourceRepository",
        ),
        row(
            "sourceRepository over git://",
            repo("git://github.com/tenstorrent/tt-kmd.git"),
            "spec.installer.sourceRepository",
        ),
        row(
            "sourceRepository over file://",
            repo("file:///srv/git/tt-kmd.git"),
            "spec.installer.sourceRepository",
        ),
        row(
            "sourceRepository with a trailing newline",
            repo("https://github.com/tenstorrent/tt-kmd.git\n"),
            "spec.installer.sourceRepository",
        ),
        row(
            "sourceRepository with a newline inside",
            repo("https://github.com/tenstorrent\n/tt-kmd.git"),
            "spec.installer.sourceRepository",
        ),
        row(
            "sourceRepository with a control character",
            repo("https://github.com/tenstorrent/tt-kmd\u{7}.git"),
            "spec.installer.sourceRepository",
        ),
        row(
            "sourceRepository with a space",
            repo("https://github.com/tenstorrent/tt kmd.git"),
            "spec.installer.sourceRepository",
        ),
        row(
            "sourceRepository scp-like with an option as user",
            repo("-oProxyCommand=x@host:path"),
            "spec.installer.sourceRepository",
        ),
        row(
            "sourceRepository ssh:// with an option as host",
            repo("ssh://-oProxyCommand=x/path"),
            "spec.installer.sourceRepository",
        ),
        row(
            "sourceRepository not a URL",
            repo("not a url"),
            "spec.installer.sourceRepository",
        ),
        row(
            "sourceRepository of 2049 characters",
            repo(&format!(
                "https://git.example.internal/{}",
                "a".repeat(SOURCE_REPOSITORY_MAX_LENGTH + 1 - 29)
            )),
            "spec.installer.sourceRepository",
        ),
        // upgradePolicy.maxUnavailable
        row(
            "maxUnavailable of 1000%",
            spec(json!({ "upgradePolicy": { "maxUnavailable": "1000%" } })),
            "spec.upgradePolicy.maxUnavailable",
        ),
    ]
}

/// Policies at the edge of every limit: accepted, and their DaemonSet is valid.
fn edge_valid_policies(env: &TestEnv) -> Vec<(String, String, Value)> {
    let v63 = "v".repeat(LABEL_VALUE_MAX_LENGTH);
    let n63 = "n".repeat(LABEL_NAME_MAX_LENGTH);
    let p253 = dns_prefix(LABEL_PREFIX_MAX_LENGTH);
    let key = |i: usize| {
        // Distinct keys of exactly LABEL_KEY_MAX_LENGTH characters.
        let name = format!("{i:03}{}", &n63[3..]);
        let k = format!("{p253}/{name}");
        assert_eq!(k.len(), LABEL_KEY_MAX_LENGTH);
        k
    };
    let labels: serde_json::Map<String, Value> = (0..MATCH_LABELS_MAX)
        .map(|i| (key(i), json!(v63)))
        .collect();
    let values: Vec<String> = (0..SELECTOR_VALUES_MAX)
        .map(|i| format!("{i:03}{}", &v63[3..]))
        .collect();
    let exprs: Vec<Value> = (0..MATCH_EXPRESSIONS_MAX)
        .map(|i| match i {
            0 => json!({ "key": key(100 + i), "operator": "Exists" }),
            1 => json!({ "key": key(100 + i), "operator": "DoesNotExist", "values": [] }),
            _ if i % 2 == 0 => json!({ "key": key(100 + i), "operator": "In", "values": values }),
            _ => json!({ "key": key(100 + i), "operator": "NotIn", "values": values }),
        })
        .collect();
    // A selector of exactly POD_SELECTOR_MAX_LENGTH characters, keys and values at their limits.
    let mut selector = format!("{p253}/{n63}={v63},!{n63},{n63} notin ({v63}, ,x)");
    while selector.len() + 2 <= POD_SELECTOR_MAX_LENGTH {
        selector.push_str(",a");
    }
    if selector.len() < POD_SELECTOR_MAX_LENGTH {
        selector.push(' ');
    }
    assert_eq!(selector.len(), POD_SELECTOR_MAX_LENGTH);
    let digest = "0123456789abcdef".repeat(4);
    vec![
        (
            "name of 63 characters".into(),
            name_of_length(env, POLICY_NAME_MAX_LENGTH),
            spec(json!({})),
        ),
        (
            "version with 9 digits per part".into(),
            env.name("v999"),
            spec(json!({ "version": "999999999.999999999.999999999" })),
        ),
        (
            "64 matchLabels with keys and values at their limits".into(),
            env.name("labels"),
            affinity(json!({ "matchLabels": labels })),
        ),
        (
            "32 expressions of 128 values, keys and values at their limits".into(),
            env.name("exprs"),
            affinity(json!({ "matchExpressions": exprs })),
        ),
        (
            "empty label values".into(),
            env.name("empty"),
            affinity(json!({ "matchLabels": { "pool": "" }, "matchExpressions": [
                { "key": "tier", "operator": "In", "values": [""] } ] })),
        ),
        (
            "deprecated nodeSelector at the limits".into(),
            env.name("alias"),
            json!({ "version": "2.8.0", "nodeSelector": { "matchLabels": { key(0): v63 } } }),
        ),
        (
            "podSelectorLabel of 1024 characters".into(),
            env.name("podsel"),
            pod_selector(&selector),
        ),
        (
            "image with registry port, tag and digest; scp-like repository".into(),
            env.name("img"),
            spec(json!({ "installer": {
                "image": format!("registry.example.internal:5000/tt/agent_x/b:v1.2.3-rc.1@sha256:{digest}"),
                "sourceRepository": "git@github.com:tenstorrent/tt-kmd.git" } })),
        ),
        (
            "sourceCommit of 40 hex digits, upper case too".into(),
            env.name("pin"),
            spec(
                json!({ "installer": { "sourceCommit": "0123456789ABCDEF0123456789abcdef01234567" } }),
            ),
        ),
        (
            "signingSecret, a DNS subdomain of 253 characters".into(),
            env.name("sign"),
            spec(json!({ "installer": { "signingSecret": format!("mok.{}", "s".repeat(249)) } })),
        ),
        (
            "sourceCommit of 64 hex digits (SHA-256 repository)".into(),
            env.name("pin256"),
            spec(json!({ "installer": { "sourceCommit": digest } })),
        ),
        (
            "empty image (the chart's); ssh:// repository with user and port".into(),
            env.name("ssh"),
            spec(json!({ "installer": {
                "image": "",
                "sourceRepository": "ssh://git@git.example.internal:2222/srv/tt-kmd.git" } })),
        ),
        (
            "https repository with port; maxUnavailable 100%".into(),
            env.name("https"),
            spec(
                json!({ "installer": { "sourceRepository": "https://git.example.internal:8443/mirrors/tt-kmd.git" },
                "upgradePolicy": { "maxUnavailable": "100%" } }),
            ),
        ),
    ]
}

/// Every policy (or `spec:` fragment) in the docs' YAML blocks, completed with
/// a version and `nodeAffinity: {}` where the fragment leaves them out.
fn docs_examples() -> Vec<(String, Value)> {
    const FIELDS: [&str; 7] = [
        "version",
        "nodeAffinity",
        "nodeSelector",
        "paused",
        "upgradePolicy",
        "installer",
        "moduleParameters",
    ];
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/docs");
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("docs/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    files.push(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md").into());
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).expect("readable");
        let mut block: Option<String> = None;
        for line in text.lines() {
            match (&mut block, line.trim_start()) {
                (None, l) if l == "```yaml" || l == "```yml" => block = Some(String::new()),
                (Some(b), "```") => {
                    for doc in serde_yaml::Deserializer::from_str(b) {
                        let Ok(v) = serde_json::to_value(
                            serde_yaml::Value::deserialize(doc).unwrap_or_default(),
                        ) else {
                            continue;
                        };
                        let kind_ok = v["kind"].is_null() || v["kind"] == "TenstorrentDriverPolicy";
                        let Some(spec) = v["spec"].as_object().filter(|s| {
                            kind_ok
                                && !s.is_empty()
                                && s.keys().all(|k| FIELDS.contains(&k.as_str()))
                        }) else {
                            continue;
                        };
                        let mut spec = Value::Object(spec.clone());
                        if spec["version"].is_null() {
                            spec["version"] = json!("2.8.0");
                        }
                        if spec["nodeAffinity"].is_null() && spec["nodeSelector"].is_null() {
                            spec["nodeAffinity"] = json!({});
                        }
                        let file = f.file_name().unwrap_or_default().to_string_lossy();
                        out.push((format!("{file} example {}", out.len()), spec));
                    }
                    block = None;
                }
                (Some(b), _) => {
                    b.push_str(line);
                    b.push('\n');
                }
                _ => {}
            }
        }
    }
    out
}

fn render_context() -> RenderContext {
    RenderContext::defaults("default")
}

fn shorten(s: &str) -> String {
    let one_line = s.replace('\n', " ");
    if one_line.chars().count() > 220 {
        format!("{}…", one_line.chars().take(220).collect::<String>())
    } else {
        one_line
    }
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn malformed_policies_are_refused_naming_the_field() {
    let env = TestEnv::new("validation-refused").await;
    ensure_crd(&env.client).await;
    let rows = malformed_policies(&env);
    assert!(rows.len() >= 40, "the table has {} rows", rows.len());
    let mut failures = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        let name = r.name.clone().unwrap_or_else(|| env.name(&format!("r{i}")));
        match create(&env, &name, &r.spec).await {
            Ok(_) => failures.push(format!("{}: accepted", r.what)),
            Err(kube::Error::Api(status)) => {
                println!(
                    "refused {:>2} {:<50} {} → {}",
                    i,
                    r.what,
                    status.code,
                    shorten(&status.message)
                );
                if status.code != 422 {
                    failures.push(format!("{}: {} {}", r.what, status.code, status.message));
                } else if !status.message.contains(r.field) {
                    failures.push(format!(
                        "{}: the message does not name {}: {}",
                        r.what,
                        r.field,
                        shorten(&status.message)
                    ));
                }
            }
            Err(e) => failures.push(format!("{}: {e}", r.what)),
        }
    }
    delete_policies(&env).await;
    println!(
        "{} malformed policies, {} refused with the field named",
        rows.len(),
        rows.len() - failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn edge_valid_policies_and_docs_examples_are_accepted_and_render_a_valid_daemonset() {
    let env = TestEnv::new("validation-edge").await;
    ensure_crd(&env.client).await;
    let typed: Api<TenstorrentDriverPolicy> = Api::all(env.client.clone());
    let daemonsets: Api<DaemonSet> = Api::namespaced(env.client.clone(), "default");
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let mut failures = Vec::new();
    let mut edge = edge_valid_policies(&env);
    let docs = docs_examples();
    assert!(
        docs.len() >= 8,
        "found {} policy examples in docs/",
        docs.len()
    );
    for (i, (what, spec)) in docs.into_iter().enumerate() {
        edge.push((what, env.name(&format!("doc{i}")), spec));
    }
    for (what, name, spec) in &edge {
        if let Err(e) = create(&env, name, spec).await {
            failures.push(format!(
                "{what} ({name}): refused: {}",
                shorten(&e.to_string())
            ));
            continue;
        }
        let policy = match typed.get(name).await {
            Ok(p) => p,
            Err(e) => {
                failures.push(format!("{what}: reading it back: {e}"));
                continue;
            }
        };
        let (ds, _) = render_daemonset(&policy, &render_context());
        match daemonsets.create(&dry_run, &ds).await {
            Ok(_) => println!(
                "accepted {what:<60} ({} characters of JSON)",
                spec.to_string().len()
            ),
            Err(e) => failures.push(format!(
                "{what}: its DaemonSet {} is refused: {}",
                ds.metadata.name.unwrap_or_default(),
                shorten(&e.to_string())
            )),
        }
    }
    delete_policies(&env).await;
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
