//! Unit tests of [`Metrics`]: what a scrape shows after each kind of update,
//! series removal (node, policy, lost lease), escaping, concurrency, and a
//! byte-for-byte golden snapshot of the whole /metrics text.

use std::collections::BTreeSet;
use std::sync::Arc;

use ttdrv_api::NodeState;

use super::registry::{bool_value, now_unix_seconds};
use super::text_parser::{Sample, parse, select, value};
use super::*;

/// The one sample `name{labels}` of the scrape `s` has the value `want`.
fn assert_value(s: &[Sample], name: &str, labels: &[(&str, &str)], want: f64) {
    assert_eq!(value(s, name, labels), Some(want), "{name} {labels:?}");
}

fn scrape(m: &Metrics) -> Vec<Sample> {
    let (ct, body) = m.encode();
    assert_eq!(ct, "text/plain; version=0.0.4; charset=utf-8");
    parse(&String::from_utf8(body).expect("utf-8")).0
}

/// The text of a scrape, with the one wall-clock value
/// (`ttdriver_last_successful_reconcile_timestamp_seconds`) checked to be
/// about now and then replaced by `<now>`, and the process's figures
/// (`process_*`, which change by themselves) by `<process>`, so the text is
/// reproducible.
fn render_stable(m: &Metrics) -> String {
    let (_, body) = m.encode();
    let text = String::from_utf8(body).expect("utf-8");
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        match line.strip_prefix("ttdriver_last_successful_reconcile_timestamp_seconds{") {
            Some(_) => {
                let (series, v) = line.trim_end().rsplit_once(' ').expect("sample line");
                let v: f64 = v.parse().expect("timestamp");
                assert!((v - now_unix_seconds()).abs() < 60.0, "{line}");
                out.push_str(series);
                out.push_str(" <now>\n");
            }
            None if line.starts_with("process_") => {
                let (series, _) = line.trim_end().rsplit_once(' ').expect("sample line");
                out.push_str(series);
                out.push_str(" <process>\n");
            }
            None => out.push_str(line),
        }
    }
    out
}

/// Compares `got` with `tests/golden/<file>`; `UPDATE_GOLDEN=1 cargo test` rewrites it.
fn assert_golden(file: &str, got: &str) {
    let path = format!("{}/tests/golden/{file}", env!("CARGO_MANIFEST_DIR"));
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, got).expect("write golden");
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e} (UPDATE_GOLDEN=1 to create)"));
    assert!(got == want, "/metrics output differs from {path}:\n{got}");
}

/// Golden snapshot of the whole /metrics text after a fixed sequence of calls
/// that reaches every family and every public method, then after losing the
/// lease. Guards names, labels, help texts, ordering, escaping and number
/// formatting byte for byte.
#[test]
fn golden_metrics_text() {
    use NodeState::*;
    let m = Metrics::new("0.1.0-golden");
    m.set_leader(true);
    m.set_cache_objects("Node", 1000);
    m.set_cache_objects("Pod", 10000);
    m.set_cache_objects("InstallerPod", 1000);
    m.set_node_state("fleet", "n1", Upgrading);
    m.set_node_state("fleet", "n2", Pending);
    m.set_node_state("fleet", "n2", Cordoning);
    m.set_node_state("gone", "n1", Draining);
    m.set_node_state_since("fleet", "n1", 1_700_000_000.5);
    m.set_node_state_since("ab", "c", 1.0);
    m.set_node_state_since("a", "bc", 2.0);
    m.set_node_state_since("gone", "n1", 3.0);
    let gate = "tenstorrent.com/deploy.tt-telemetry";
    m.set_deploy_gate_closed("fleet", "n1", gate, true);
    m.set_deploy_gate_closed("fleet", "n2", gate, false);
    m.set_deploy_gate_closed("fleet", "n3", gate, true);
    m.observe_transition("fleet", Pending, Cordoning, 0.25);
    m.observe_transition("fleet", Cordoning, Draining, 3.0);
    m.observe_transition("fleet", Draining, Upgrading, 42.0);
    m.observe_transition("fleet", Draining, Upgrading, 7000.0);
    m.observe_transition("fleet", Upgrading, Failed, f64::NAN);
    m.observe_transition("fleet", Failed, Pending, -1.0);
    m.observe_transition("gone", Pending, Cordoning, 1.0);
    m.observe_node_upgrade("fleet", 400.0);
    m.observe_node_upgrade("fleet", 9000.0);
    m.observe_node_upgrade("fleet", -5.0);
    m.inc_failure("fleet", "DrainTimeout");
    m.inc_failure("fleet", "something the kernel said");
    m.inc_rollback("fleet");
    m.set_policy_nodes(
        "fleet",
        &[(Done, 3), (Pending, 1), (Pending, 1), (Upgrading, 1)],
    );
    m.set_policy_host_managed("fleet", 2);
    m.set_policy_prepare("fleet", 4, 1);
    m.set_policy_nodes("gone", &[(Draining, 1)]);
    m.set_policy_paused("fleet", false);
    m.set_policy_paused("paused", true);
    m.set_rollout_held("fleet", Some("Soaking"));
    m.set_policy_promotion_blocked("fleet", false);
    m.set_policy_promotion_blocked("prod", true);
    m.set_rollout_held("prod", Some("WaitingForPromotion"));
    m.set_desired_version("fleet", "2.7.0");
    m.set_desired_version("fleet", "2.8.0");
    m.set_desired_version("fleet1", "12.8.0");
    m.set_desired_version("gone", "2.8.0");
    m.set_nodes_by_kmd_version(&[("2.7.0".into(), "container".into(), 1)]);
    m.set_nodes_by_kmd_version(&[
        ("2.8.0".into(), "container".into(), 2),
        ("2.8.0".into(), "container".into(), 1),
        ("2.8.0".into(), "host".into(), 2),
        ("".into(), "none".into(), 1),
    ]);
    m.inc_evicted("fleet", "pass1");
    m.inc_evicted("fleet", "pass1");
    m.inc_evicted("fleet", "pass2");
    m.inc_drain_blocked("fleet", "pass2");
    m.inc_daemonset_operation("fleet", "create", true);
    m.inc_daemonset_operation("fleet", "update", false);
    m.set_nodes_by_kmd_version(&[
        ("2.8.0".into(), "container".into(), 2),
        ("2.8.0".into(), "container".into(), 1),
        ("2.8.0".into(), "host".into(), 2),
        ("2.8.0".into(), "".into(), 1),
        ("".into(), "none".into(), 1),
    ]);
    m.inc_error("fleet", "render");
    m.inc_error("fleet", "we\"ird\\name\nx");
    m.inc_error("gone", "kube_api");
    m.set_last_successful_reconcile("fleet");
    m.set_last_successful_reconcile("gone");
    m.observe_reconcile("fleet", 0.03, true);
    m.observe_reconcile("fleet", 0.2, false);
    m.observe_reconcile("fleet", 120.0, true);
    m.observe_reconcile("fleet", -1.0, true);
    m.set_rollout_budget("fleet", 2, 1);
    m.set_rollout_budget("gone", 1, 1);
    m.inc_actor_restart("node");
    m.inc_actor_restart("node");
    m.inc_actor_restart("policy_supervisor");
    m.inc_mailbox_full("evictor");
    m.forget_node("fleet", "n3");
    m.forget_policy("gone");
    assert_golden("metrics.txt", &render_stable(&m));

    m.set_leader(false);
    assert_golden("metrics-lease-lost.txt", &render_stable(&m));
}

#[test]
fn metrics_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync + 'static>() {}
    assert_send_sync::<Metrics>();
    assert_send_sync::<Arc<Metrics>>();
}

#[test]
fn content_type_is_text_format_0_0_4_utf8() {
    let m = Metrics::new("1.2.3");
    let (ct, body) = m.encode();
    assert_eq!(ct, "text/plain; version=0.0.4; charset=utf-8");
    assert!(!body.is_empty());
    assert_eq!(CONTENT_TYPE, ct);
}

#[test]
fn build_info_and_leader() {
    let m = Metrics::new("0.1.0-abc");
    let s = scrape(&m);
    assert_value(&s, "ttdriver_build_info", &[("version", "0.1.0-abc")], 1.0);
    assert_value(&s, "ttdriver_leader", &[], 0.0);
    assert_eq!(m.build_version(), "0.1.0-abc");
    m.set_leader(true);
    assert_eq!(value(&scrape(&m), "ttdriver_leader", &[]), Some(1.0));
}

#[test]
fn every_state_is_emitted_with_exactly_one_set() {
    let m = Metrics::new("t");
    for current in NodeState::ALL {
        m.set_node_state("fleet", "node-1", current);
        m.set_node_state("fleet", "node-2", NodeState::Pending);
        let s = scrape(&m);
        let series = select(
            &s,
            "ttdriver_node_state",
            &[("cr", "fleet"), ("node", "node-1")],
        );
        assert_eq!(series.len(), NodeState::ALL.len());
        for st in NodeState::ALL {
            let v = value(
                &s,
                "ttdriver_node_state",
                &[("cr", "fleet"), ("node", "node-1"), ("state", st.as_str())],
            );
            assert_eq!(
                v,
                Some(bool_value(st == current)),
                "state {st:?} while {current:?}"
            );
        }
        let ones: Vec<_> = series.iter().filter(|s| s.value == 1.0).collect();
        assert_eq!(ones.len(), 1);
        assert_eq!(ones[0].labels["state"], current.as_str());
        // node-2 is unaffected.
        assert_value(
            &s,
            "ttdriver_node_state",
            &[("cr", "fleet"), ("node", "node-2"), ("state", "Pending")],
            1.0,
        );
    }
}

#[test]
fn forget_node_removes_only_that_nodes_series() {
    let m = Metrics::new("t");
    for (cr, node) in [("a", "n1"), ("a", "n2"), ("b", "n1")] {
        m.set_node_state(cr, node, NodeState::Draining);
        m.set_node_state_since(cr, node, 1000.0);
        m.set_deploy_gate_closed(cr, node, "tenstorrent.com/deploy.tt-telemetry", true);
    }
    m.set_policy_nodes("a", &[(NodeState::Draining, 2)]);
    m.forget_node("a", "n1");
    let s = scrape(&m);
    for name in [
        "ttdriver_node_state",
        "ttdriver_node_state_since_timestamp_seconds",
        "ttdriver_node_deploy_gate_closed",
    ] {
        assert!(
            select(&s, name, &[("cr", "a"), ("node", "n1")]).is_empty(),
            "{name} of a/n1 left"
        );
        assert!(
            !select(&s, name, &[("cr", "a"), ("node", "n2")]).is_empty(),
            "{name} of a/n2 gone"
        );
        assert!(
            !select(&s, name, &[("cr", "b"), ("node", "n1")]).is_empty(),
            "{name} of b/n1 gone"
        );
    }
    // Per-policy series stay.
    assert_value(
        &s,
        "ttdriver_policy_nodes",
        &[("cr", "a"), ("state", "Draining")],
        2.0,
    );
}

#[test]
fn forget_policy_removes_every_series_of_the_cr() {
    let m = Metrics::new("t");
    for cr in ["gone", "kept"] {
        m.set_node_state(cr, "n1", NodeState::Upgrading);
        m.set_node_state_since(cr, "n1", 5.0);
        m.set_deploy_gate_closed(cr, "n1", "g", true);
        m.observe_transition(cr, NodeState::Draining, NodeState::Upgrading, 12.0);
        m.observe_node_upgrade(cr, 100.0);
        m.inc_failure(cr, "DrainTimeout");
        m.set_policy_nodes(cr, &[(NodeState::Upgrading, 1)]);
        m.set_policy_host_managed(cr, 3);
        m.set_policy_prepare(cr, 2, 0);
        m.set_policy_paused(cr, false);
        m.set_policy_promotion_blocked(cr, true);
        m.set_desired_version(cr, "2.8.0");
        m.inc_evicted(cr, "pass1");
        m.inc_drain_blocked(cr, "pass2");
        m.inc_error(cr, "patch");
        m.set_last_successful_reconcile(cr);
        m.observe_reconcile(cr, 0.2, true);
        m.set_rollout_budget(cr, 1, 1);
    }
    m.inc_actor_restart("node");
    m.set_nodes_by_kmd_version(&[("2.8.0".into(), "container".into(), 2)]);
    m.forget_policy("gone");
    let s = scrape(&m);
    let left: Vec<_> = s
        .iter()
        .filter(|x| x.labels.get("cr").map(String::as_str) == Some("gone"))
        .collect();
    assert!(left.is_empty(), "series of a deleted policy left: {left:?}");
    let kept: BTreeSet<_> = s
        .iter()
        .filter(|x| x.labels.get("cr").map(String::as_str) == Some("kept"))
        .map(|x| x.name.clone())
        .collect();
    assert!(kept.len() >= 18, "kept policy lost series: {kept:?}");
    assert_value(
        &s,
        "ttdriver_actor_restarts_total",
        &[("actor", "node")],
        1.0,
    );
    assert_value(
        &s,
        "ttdriver_nodes_by_kmd_version",
        &[("version", "2.8.0"), ("install_mode", "container")],
        2.0,
    );

    // The policy comes back: its zeroed counters come back too.
    m.set_policy_nodes("gone", &[]);
    let s = scrape(&m);
    assert_value(
        &s,
        "ttdriver_node_failures_total",
        &[("cr", "gone"), ("reason", "DrainTimeout")],
        0.0,
    );
}

#[test]
fn legacy_metric_names_and_labels() {
    let m = Metrics::new("t");
    m.set_policy_nodes("p", &[(NodeState::Done, 3), (NodeState::Pending, 1)]);
    m.set_policy_host_managed("p", 2);
    m.set_desired_version("p", "2.8.0");
    m.set_nodes_by_kmd_version(&[
        ("2.7.0".into(), "container".into(), 1),
        ("2.8.0".into(), "host".into(), 2),
    ]);
    m.inc_evicted(
        "p",
        crate::metrics::pass_label(ttdrv_core::drain::DrainPass::Device),
    );
    m.inc_drain_blocked(
        "p",
        crate::metrics::pass_label(ttdrv_core::drain::DrainPass::Full),
    );
    m.inc_daemonset_operation("p", "create", true);
    m.inc_error("p", "render");
    m.set_last_successful_reconcile("p");
    let s = scrape(&m);
    let expect: &[(&str, &[&str])] = &[
        ("ttdriver_policy_nodes", &["cr", "state"]),
        (
            "ttdriver_nodes_by_kmd_version",
            &["install_mode", "version"],
        ),
        ("ttdriver_policy_desired_version", &["cr", "version"]),
        ("ttdriver_pods_evicted_total", &["cr", "pass"]),
        ("ttdriver_drain_blocked_total", &["cr", "pass"]),
        ("ttdriver_errors_total", &["cr", "stage"]),
        (
            "ttdriver_daemonset_operations_total",
            &["cr", "operation", "result"],
        ),
        (
            "ttdriver_last_successful_reconcile_timestamp_seconds",
            &["cr"],
        ),
    ];
    for (name, labels) in expect {
        let found = select(&s, name, &[]);
        assert!(!found.is_empty(), "{name} missing");
        for f in found {
            let got: Vec<_> = f.labels.keys().map(String::as_str).collect();
            assert_eq!(&got, labels, "{name}");
        }
    }
    // Every state (the vacate ones too), missing ones as 0, plus HostManaged.
    assert_eq!(
        select(&s, "ttdriver_policy_nodes", &[("cr", "p")]).len(),
        NodeState::ALL.len() + 1
    );
    assert_value(
        &s,
        "ttdriver_policy_nodes",
        &[("cr", "p"), ("state", "Done")],
        3.0,
    );
    assert_value(
        &s,
        "ttdriver_policy_nodes",
        &[("cr", "p"), ("state", "Failed")],
        0.0,
    );
    assert_value(
        &s,
        "ttdriver_policy_nodes",
        &[("cr", "p"), ("state", "HostManaged")],
        2.0,
    );
    assert_value(
        &s,
        "ttdriver_pods_evicted_total",
        &[("cr", "p"), ("pass", "pass1")],
        1.0,
    );
    assert_value(
        &s,
        "ttdriver_pods_evicted_total",
        &[("cr", "p"), ("pass", "pass2")],
        0.0,
    );
    assert_value(
        &s,
        "ttdriver_drain_blocked_total",
        &[("cr", "p"), ("pass", "pass2")],
        1.0,
    );
    // The Go operator's pass values only.
    assert!(
        select(&s, "ttdriver_pods_evicted_total", &[])
            .iter()
            .all(|f| ["pass1", "pass2"].contains(&f.labels["pass"].as_str()))
    );
    assert_value(
        &s,
        "ttdriver_daemonset_operations_total",
        &[("cr", "p"), ("operation", "create"), ("result", "success")],
        1.0,
    );
    assert_value(
        &s,
        "ttdriver_daemonset_operations_total",
        &[("cr", "p"), ("operation", "update"), ("result", "error")],
        0.0,
    );
    let ts = value(
        &s,
        "ttdriver_last_successful_reconcile_timestamp_seconds",
        &[("cr", "p")],
    )
    .expect("ts");
    assert!((ts - now_unix_seconds()).abs() < 60.0);
}

#[test]
fn desired_version_keeps_one_series_per_policy() {
    let m = Metrics::new("t");
    m.set_desired_version("prod", "12.8.0");
    m.set_desired_version("prod1", "2.8.0");
    m.set_desired_version("prod", "2.7.0");
    let s = scrape(&m);
    let series = select(&s, "ttdriver_policy_desired_version", &[]);
    assert_eq!(series.len(), 2, "{series:?}");
    assert_value(
        &s,
        "ttdriver_policy_desired_version",
        &[("cr", "prod"), ("version", "2.7.0")],
        1.0,
    );
    assert_value(
        &s,
        "ttdriver_policy_desired_version",
        &[("cr", "prod1"), ("version", "2.8.0")],
        1.0,
    );
}

#[test]
fn label_values_that_concatenate_alike_stay_apart() {
    let m = Metrics::new("t");
    m.set_node_state_since("ab", "c", 1.0);
    m.set_node_state_since("a", "bc", 2.0);
    let s = scrape(&m);
    assert_value(
        &s,
        "ttdriver_node_state_since_timestamp_seconds",
        &[("cr", "ab"), ("node", "c")],
        1.0,
    );
    assert_value(
        &s,
        "ttdriver_node_state_since_timestamp_seconds",
        &[("cr", "a"), ("node", "bc")],
        2.0,
    );
}

#[test]
fn label_values_are_escaped() {
    let m = Metrics::new("t");
    let odd = "we\"ird\\name\nx";
    m.inc_error("p", odd);
    let s = scrape(&m);
    assert_value(
        &s,
        "ttdriver_errors_total",
        &[("cr", "p"), ("stage", odd)],
        1.0,
    );
}

#[test]
fn kmd_versions_replace_the_whole_set() {
    let m = Metrics::new("t");
    m.set_nodes_by_kmd_version(&[("2.7.0".into(), "container".into(), 3)]);
    m.set_nodes_by_kmd_version(&[
        ("2.8.0".into(), "container".into(), 2),
        ("2.8.0".into(), "host".into(), 1),
    ]);
    let s = scrape(&m);
    assert_eq!(select(&s, "ttdriver_nodes_by_kmd_version", &[]).len(), 2);
    assert_eq!(
        value(&s, "ttdriver_nodes_by_kmd_version", &[("version", "2.7.0")]),
        None
    );
    assert_value(
        &s,
        "ttdriver_nodes_by_kmd_version",
        &[("version", "2.8.0"), ("install_mode", "host")],
        1.0,
    );
    m.set_nodes_by_kmd_version(&[("2.8.0".into(), String::new(), 4)]);
    assert_eq!(
        value(
            &scrape(&m),
            "ttdriver_nodes_by_kmd_version",
            &[("version", "2.8.0"), ("install_mode", "unknown")]
        ),
        Some(4.0),
        "not labelled: unknown, as the Go operator had it"
    );
    m.set_nodes_by_kmd_version(&[]);
    assert!(select(&scrape(&m), "ttdriver_nodes_by_kmd_version", &[]).is_empty());
}

#[test]
fn failure_reasons_are_bounded() {
    let m = Metrics::new("t");
    m.inc_failure("p", "DrainTimeout");
    m.inc_failure("p", "something the kernel said");
    m.inc_failure("p", "");
    let s = scrape(&m);
    let series = select(&s, "ttdriver_node_failures_total", &[("cr", "p")]);
    assert_eq!(
        series.len(),
        FAILURE_REASONS.len() + 1,
        "the documented reasons, and Other for anything else"
    );
    assert_value(
        &s,
        "ttdriver_node_failures_total",
        &[("cr", "p"), ("reason", "DrainTimeout")],
        1.0,
    );
    assert_value(
        &s,
        "ttdriver_node_failures_total",
        &[("cr", "p"), ("reason", "Other")],
        2.0,
    );
    assert_eq!(
        value(
            &s,
            "ttdriver_node_failures_total",
            &[("cr", "p"), ("reason", "UpgradeTimeout")]
        ),
        Some(0.0),
        "every failure reason is exported from the start"
    );
    assert_eq!(failure_reason("DrainTimeout"), "DrainTimeout");
    assert_eq!(failure_reason("patcherror"), "Other");
}

#[test]
fn transitions_and_histograms() {
    let m = Metrics::new("t");
    m.observe_transition("p", NodeState::Draining, NodeState::Upgrading, 42.0);
    m.observe_transition("p", NodeState::Draining, NodeState::Upgrading, 7000.0);
    m.observe_transition("p", NodeState::Upgrading, NodeState::Failed, 0.5);
    m.observe_transition("p", NodeState::Pending, NodeState::Cordoning, f64::NAN);
    m.observe_node_upgrade("p", 400.0);
    m.observe_reconcile("p", 0.03, true);
    m.observe_reconcile("p", 0.2, false);
    let (body, types) = {
        let (_, b) = m.encode();
        let text = String::from_utf8(b).expect("utf-8");
        let (s, t) = parse(&text);
        (s, t)
    };
    let s = body;
    assert_eq!(types["ttdriver_node_transitions_total"], "counter");
    assert_eq!(types["ttdriver_phase_duration_seconds"], "histogram");
    assert_value(
        &s,
        "ttdriver_node_transitions_total",
        &[("cr", "p"), ("from", "Draining"), ("to", "Upgrading")],
        2.0,
    );
    assert_eq!(
        value(
            &s,
            "ttdriver_node_transitions_total",
            &[("cr", "p"), ("from", "Pending"), ("to", "Cordoning")]
        ),
        Some(1.0),
        "a transition with an unknown duration is still counted"
    );
    let drain = [("cr", "p"), ("phase", "Draining")];
    assert_eq!(
        value(&s, "ttdriver_phase_duration_seconds_count", &drain),
        Some(2.0)
    );
    assert_eq!(
        value(&s, "ttdriver_phase_duration_seconds_sum", &drain),
        Some(7042.0)
    );
    let b = |le: &str| {
        value(
            &s,
            "ttdriver_phase_duration_seconds_bucket",
            &[("cr", "p"), ("phase", "Draining"), ("le", le)],
        )
    };
    assert_eq!(b("30"), Some(0.0));
    assert_eq!(b("60"), Some(1.0));
    assert_eq!(b("3600"), Some(1.0));
    assert_eq!(b("+Inf"), Some(2.0));
    assert_eq!(
        select(&s, "ttdriver_phase_duration_seconds_bucket", &drain).len(),
        PHASE_BUCKETS.len() + 1
    );
    assert_value(
        &s,
        "ttdriver_phase_duration_seconds_count",
        &[("cr", "p"), ("phase", "Upgrading")],
        1.0,
    );
    assert_eq!(
        value(
            &s,
            "ttdriver_phase_duration_seconds_count",
            &[("cr", "p"), ("phase", "Pending")]
        ),
        None,
        "NaN is not observed"
    );
    assert_value(
        &s,
        "ttdriver_node_upgrade_duration_seconds_count",
        &[("cr", "p")],
        1.0,
    );
    assert_value(
        &s,
        "ttdriver_reconcile_total",
        &[("cr", "p"), ("result", "ok")],
        1.0,
    );
    assert_value(
        &s,
        "ttdriver_reconcile_total",
        &[("cr", "p"), ("result", "error")],
        1.0,
    );
    assert_value(
        &s,
        "ttdriver_reconcile_duration_seconds_count",
        &[("cr", "p")],
        2.0,
    );
    assert_value(
        &s,
        "ttdriver_reconcile_duration_seconds_bucket",
        &[("cr", "p"), ("le", "0.05")],
        1.0,
    );
}

#[test]
fn budget_gates_actors() {
    let m = Metrics::new("t");
    m.set_rollout_budget("p", 1, 2);
    m.set_deploy_gate_closed("p", "n", "g", true);
    m.set_deploy_gate_closed("p", "n", "g", false);
    m.inc_actor_restart("node");
    m.inc_actor_restart("node");
    m.inc_mailbox_full("evictor");
    m.set_policy_paused("p", true);
    let s = scrape(&m);
    assert_value(&s, "ttdriver_rollout_max_unavailable", &[("cr", "p")], 1.0);
    assert_value(
        &s,
        "ttdriver_rollout_unavailable_nodes",
        &[("cr", "p")],
        2.0,
    );
    assert_value(
        &s,
        "ttdriver_node_deploy_gate_closed",
        &[("cr", "p"), ("node", "n"), ("gate", "g")],
        0.0,
    );
    assert_value(
        &s,
        "ttdriver_actor_restarts_total",
        &[("actor", "node")],
        2.0,
    );
    assert_value(
        &s,
        "ttdriver_actor_mailbox_full_total",
        &[("actor", "evictor")],
        1.0,
    );
    assert_value(&s, "ttdriver_policy_paused", &[("cr", "p")], 1.0);
}

#[test]
fn losing_the_lease_drops_policy_series() {
    let m = Metrics::new("t");
    m.set_leader(true);
    m.set_node_state("p", "n", NodeState::Done);
    m.set_nodes_by_kmd_version(&[("2.8.0".into(), "container".into(), 1)]);
    m.inc_actor_restart("node");
    m.set_leader(false);
    let s = scrape(&m);
    assert!(s.iter().all(|x| !x.labels.contains_key("cr")), "{s:?}");
    assert!(select(&s, "ttdriver_nodes_by_kmd_version", &[]).is_empty());
    assert_value(&s, "ttdriver_leader", &[], 0.0);
    assert_value(
        &s,
        "ttdriver_actor_restarts_total",
        &[("actor", "node")],
        1.0,
    );
    assert_value(&s, "ttdriver_build_info", &[("version", "t")], 1.0);
    // Starting as a follower drops nothing.
    let m = Metrics::new("t");
    m.set_node_state("p", "n", NodeState::Done);
    m.set_leader(false);
    assert!(!select(&scrape(&m), "ttdriver_node_state", &[]).is_empty());
}

#[test]
fn shared_across_threads() {
    let m = Arc::new(Metrics::new("t"));
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let m = m.clone();
            std::thread::spawn(move || {
                for _ in 0..100 {
                    m.inc_evicted("p", "device");
                    m.set_node_state("p", &format!("n{i}"), NodeState::Upgrading);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("thread");
    }
    let s = scrape(&m);
    assert_value(
        &s,
        "ttdriver_pods_evicted_total",
        &[("cr", "p"), ("pass", "device")],
        400.0,
    );
    assert_eq!(
        select(&s, "ttdriver_node_state", &[("state", "Upgrading")]).len(),
        4
    );
}

#[test]
fn a_scrape_never_sees_a_half_updated_node_state() {
    let m = Arc::new(Metrics::new("t"));
    m.set_node_state("p", "n", NodeState::Pending);
    let writer = {
        let m = m.clone();
        std::thread::spawn(move || {
            for i in 0..3000 {
                m.set_node_state("p", "n", NodeState::ALL[i % NodeState::ALL.len()]);
            }
        })
    };
    while !writer.is_finished() {
        let s = scrape(&m);
        let ones = select(&s, "ttdriver_node_state", &[("node", "n")])
            .iter()
            .filter(|x| x.value == 1.0)
            .count();
        assert_eq!(ones, 1);
    }
    writer.join().expect("writer");
}

#[test]
fn help_and_type_for_every_family() {
    let m = Metrics::new("t");
    m.set_node_state("p", "n", NodeState::Pending);
    let (_, body) = m.encode();
    let text = String::from_utf8(body).expect("utf-8");
    let (samples, types) = parse(&text);
    for s in &samples {
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suf| {
                s.name
                    .strip_suffix(suf)
                    .filter(|b| types.get(*b).map(String::as_str) == Some("histogram"))
            })
            .unwrap_or(&s.name);
        let t = types
            .get(base)
            .unwrap_or_else(|| panic!("no TYPE for {}", s.name));
        assert_eq!(t == "counter", base.ends_with("_total"), "{base} is a {t}");
        assert!(
            text.contains(&format!("# HELP {base} ")),
            "no HELP for {base}"
        );
    }
}
