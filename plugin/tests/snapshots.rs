//! Snapshot tests of the renderers: fixed objects and a fixed clock in, text out.
//! The expected text lives in `tests/snapshots/<name>.txt`; run with
//! `UPDATE_SNAPSHOTS=1` to rewrite them after an intended change, then review the diff.

use std::collections::BTreeMap;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::{
    Node, NodeCondition, NodeSpec, NodeStatus as K8sNodeStatus, Pod, PodSpec, PodStatus,
};
use k8s_openapi::api::policy::v1::{
    PodDisruptionBudget, PodDisruptionBudgetSpec, PodDisruptionBudgetStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    Condition, LabelSelector, ObjectMeta, OwnerReference, Time,
};
use k8s_openapi::jiff::Timestamp;
use kubectl_tt_driver::plan::{self, Inputs};
use kubectl_tt_driver::render;
use kubectl_tt_driver::style::Palette;
use kubectl_tt_driver::view::{self, Outcome};
use ttdrv_api::{
    NodeState, NodeStatus, Summary, TenstorrentDriverPolicy, TenstorrentDriverPolicySpec,
    TenstorrentDriverPolicyStatus, labels,
};
use ttdrv_core::machine::{Cordon, NodeRecord};

/// 2026-05-28T20:26:40Z: the fixed "now" of every snapshot.
const NOW: i64 = 1_780_000_000;

fn check(name: &str, actual: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/snapshots")
        .join(format!("{name}.txt"));
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::create_dir_all(path.parent().expect("has a parent")).expect("mkdir");
        std::fs::write(&path, actual).expect("writing snapshot");
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "missing snapshot {} ({e}); run with UPDATE_SNAPSHOTS=1",
            path.display()
        )
    });
    assert!(
        expected == actual,
        "snapshot {name} differs (UPDATE_SNAPSHOTS=1 rewrites it)\n--- expected\n{expected}\n--- actual\n{actual}"
    );
}

fn time(unix: i64) -> Time {
    Time(Timestamp::from_second(unix).expect("valid time"))
}

fn policy(name: &str, created: i64, yaml: &str) -> TenstorrentDriverPolicy {
    let spec: TenstorrentDriverPolicySpec = serde_yaml::from_str(yaml).expect("spec parses");
    let mut p = TenstorrentDriverPolicy::new(name, spec);
    p.metadata.creation_timestamp = Some(time(created));
    p.metadata.generation = Some(2);
    p
}

fn cond(t: &str, ok: bool, reason: &str, msg: &str, at: i64) -> Condition {
    Condition {
        type_: t.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.into(),
        message: msg.into(),
        observed_generation: Some(2),
        last_transition_time: time(at),
    }
}

fn entry(
    name: &str,
    state: NodeState,
    ver: &str,
    reason: Option<&str>,
    msg: Option<&str>,
    since: i64,
) -> NodeStatus {
    NodeStatus {
        name: name.into(),
        state,
        current_version: Some(ver.into()),
        install_mode: Some(
            if reason == Some("HostManaged") {
                "host"
            } else {
                "container"
            }
            .into(),
        ),
        prepared_version: None,
        next_kernel_build_failed: None,
        module_parameters: None,
        reason: reason.map(String::from),
        go_reason: None,
        message: msg.map(String::from),
        last_transition_time: Some(time(since)),
    }
}

fn record(
    state: NodeState,
    reason: &str,
    started: Option<i64>,
    since: i64,
    cordoned: bool,
) -> NodeRecord {
    let mut r = NodeRecord::new("fleet", "2.8.0", since);
    r.state = state;
    r.reason = Some(reason.into());
    r.started = started;
    r.cordon = if cordoned { Cordon::Ours } else { Cordon::None };
    r
}

struct N {
    name: &'static str,
    labels: Vec<(&'static str, &'static str)>,
    record: Option<NodeRecord>,
    unschedulable: bool,
}

fn node(n: N) -> Node {
    let mut l: BTreeMap<String, String> = n
        .labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    l.insert("kubernetes.io/hostname".into(), n.name.into());
    let annotations = n.record.map(|r| {
        BTreeMap::from([(
            labels::UPGRADE_STATE.to_string(),
            serde_json::to_string(&r).expect("record serializes"),
        )])
    });
    Node {
        metadata: ObjectMeta {
            name: Some(n.name.into()),
            labels: Some(l),
            annotations,
            ..Default::default()
        },
        spec: Some(NodeSpec {
            unschedulable: Some(n.unschedulable),
            ..Default::default()
        }),
        status: Some(K8sNodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    }
}

const TT: (&str, &str) = (labels::TT_PCI_PRESENT, "true");
const POOL: (&str, &str) = ("pool", "ml");

/// A rollout of `fleet` to 2.8.0 half way: two nodes upgraded (30 s and 40 s),
/// one host-managed, one draining for 12 s, two waiting.
fn rolling() -> (TenstorrentDriverPolicy, Vec<Node>) {
    let mut p = policy(
        "fleet",
        NOW - 86400,
        "version: \"2.8.0\"\nnodeAffinity: {matchLabels: {pool: ml}}",
    );
    let start = NOW - 100;
    p.status = Some(TenstorrentDriverPolicyStatus {
        observed_generation: Some(2),
        desired_version: Some("2.8.0".into()),
        phase: Some("Progressing".into()),
        summary: Summary {
            matched: 6,
            done: 2,
            in_progress: 1,
            pending: 2,
            failed_nodes: 0,
            host_managed: 1,
            ..Default::default()
        },
        daemon_set: Some("ttdrv-fleet".into()),
        conditions: vec![
            cond(
                "Ready",
                false,
                "RolloutIncomplete",
                "2 of 6 node(s) run 2.8.0 (1 host-managed)",
                start,
            ),
            cond(
                "Progressing",
                true,
                "Upgrading",
                "1 of at most 1 node(s) unavailable; next waiting: gpu-d",
                start,
            ),
            cond("Degraded", false, "AsExpected", "", start),
            cond("Paused", false, "Running", "", start),
            cond("Conflict", false, "NoOverlap", "", start),
        ],
        nodes: vec![
            entry(
                "gpu-a",
                NodeState::Done,
                "2.8.0",
                Some("Upgraded"),
                None,
                start + 30,
            ),
            entry(
                "gpu-b",
                NodeState::Done,
                "2.8.0",
                Some("Upgraded"),
                None,
                start + 70,
            ),
            entry(
                "gpu-h",
                NodeState::Done,
                "2.6.1",
                Some("HostManaged"),
                Some("DKMS install found; left alone"),
                start - 500,
            ),
            entry(
                "gpu-c",
                NodeState::Draining,
                "2.7.0",
                Some("Drain"),
                None,
                NOW - 12,
            ),
            entry(
                "gpu-d",
                NodeState::Pending,
                "2.7.0",
                Some("WaitingForSlot"),
                Some("waiting for a maxUnavailable slot to upgrade 2.7.0 -> 2.8.0"),
                start,
            ),
            entry(
                "gpu-e",
                NodeState::Pending,
                "2.7.0",
                Some("WaitingForSlot"),
                Some("waiting for a maxUnavailable slot to upgrade 2.7.0 -> 2.8.0"),
                start,
            ),
        ]
        .into_iter()
        .map(|mut e| {
            // gpu-d built 2.8.0 ahead; gpu-e's next kernel cannot build it.
            if e.name == "gpu-d" {
                e.prepared_version = Some("2.8.0".into());
            }
            if e.name == "gpu-e" {
                e.next_kernel_build_failed = Some("6.12.0-1-amd64".into());
            }
            e
        })
        .collect(),
        unreadable: None,
    });
    let nodes = vec![
        node(N {
            name: "gpu-a",
            labels: vec![TT, POOL],
            record: Some(record(
                NodeState::Done,
                "Upgraded",
                Some(start),
                start + 30,
                false,
            )),
            unschedulable: false,
        }),
        node(N {
            name: "gpu-b",
            labels: vec![TT, POOL],
            record: Some(record(
                NodeState::Done,
                "Upgraded",
                Some(start + 30),
                start + 70,
                false,
            )),
            unschedulable: false,
        }),
        node(N {
            name: "gpu-h",
            labels: vec![TT, POOL],
            record: Some(record(
                NodeState::Done,
                "HostManaged",
                None,
                start - 500,
                false,
            )),
            unschedulable: false,
        }),
        node(N {
            name: "gpu-c",
            labels: vec![TT, POOL],
            record: Some(record(
                NodeState::Draining,
                "Drain",
                Some(NOW - 15),
                NOW - 12,
                true,
            )),
            unschedulable: true,
        }),
        node(N {
            name: "gpu-d",
            labels: vec![TT, POOL],
            record: Some(record(
                NodeState::Pending,
                "WaitingForSlot",
                None,
                start,
                false,
            )),
            unschedulable: false,
        }),
        node(N {
            name: "gpu-e",
            labels: vec![TT, POOL],
            record: Some(record(
                NodeState::Pending,
                "WaitingForSlot",
                None,
                start,
                false,
            )),
            unschedulable: false,
        }),
    ];
    (p, nodes)
}

/// The same rollout, halted: gpu-c failed its drain.
fn failed() -> (TenstorrentDriverPolicy, Vec<Node>) {
    let (mut p, nodes) = rolling();
    if let Some(st) = p.status.as_mut() {
        st.summary.in_progress = 0;
        st.summary.failed_nodes = 1;
        st.nodes[3] = entry(
            "gpu-c",
            NodeState::Failed,
            "2.7.0",
            Some("DrainTimeout"),
            Some(
                "drain did not finish within 600s; pods still on the node: ml/web-0; blocked by PodDisruptionBudgets: ml/web",
            ),
            NOW - 5,
        );
    }
    (p, nodes)
}

#[test]
fn status_plain_and_colored() {
    let (p, nodes) = rolling();
    let other = policy(
        "canary",
        NOW - 100_000,
        "version: \"2.9.0\"\nnodeAffinity: {}\npaused: true",
    );
    let views = vec![
        view::policy_view(&other, &nodes, NOW),
        view::policy_view(&p, &nodes, NOW),
    ];
    check("status", &render::status(&views, Palette::PLAIN));
    check("status-color", &render::status(&views, Palette::COLOR));
}

#[test]
fn nodes_table() {
    let (p, nodes) = rolling();
    check(
        "nodes",
        &render::nodes(&view::policy_view(&p, &nodes, NOW), Palette::PLAIN),
    );
    let (p, nodes) = failed();
    check(
        "nodes-failed",
        &render::nodes(&view::policy_view(&p, &nodes, NOW), Palette::PLAIN),
    );
}

#[test]
fn nodes_table_with_a_firmware_policy() {
    use ttdrv_api::firmware::labels as fw;
    let (mut p, mut nodes) = rolling();
    let label = |n: &mut Node, k: &str, v: &str| {
        n.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(k.into(), v.into());
    };
    for n in nodes.iter_mut() {
        let name = n.metadata.name.clone().unwrap_or_default();
        let (version, state) = match name.as_str() {
            "gpu-d" => ("19.7.0.0", "Flashing"),
            "gpu-e" => ("19.7.0.0", "Pending"),
            _ => ("19.8.0.0", "Done"),
        };
        label(n, fw::FW_VERSION, version);
        label(n, fw::UPGRADE_STATE, state);
    }
    if let Some(st) = p.status.as_mut() {
        for e in st
            .nodes
            .iter_mut()
            .filter(|e| e.name == "gpu-d" || e.name == "gpu-e")
        {
            e.reason = Some("WaitingForFirmware".into());
        }
    }
    check(
        "nodes-firmware",
        &render::nodes(&view::policy_view(&p, &nodes, NOW), Palette::PLAIN),
    );
}

#[test]
fn watch_frames() {
    let (p, nodes) = rolling();
    let w = view::watch_view(&p, &nodes, NOW);
    assert_eq!(w.outcome, Outcome::Running);
    // Observed: 30 s and 40 s -> 35 s per node. gpu-c started 15 s ago (20 s
    // left), then gpu-d and gpu-e: 20 + 35 + 35.
    assert_eq!(w.eta.per_node.seconds, 35);
    assert_eq!(w.eta.remaining_seconds, Some(90));
    assert_eq!(w.eta.elapsed_seconds, Some(100));
    check(
        "watch-running",
        &render::watch_frame(&[w], NOW, Palette::PLAIN),
    );

    let (p, nodes) = failed();
    let w = view::watch_view(&p, &nodes, NOW);
    assert!(matches!(w.outcome, Outcome::Failed { .. }));
    check(
        "watch-failed",
        &render::watch_frame(&[w], NOW, Palette::PLAIN),
    );

    // Without readable records the status gives the estimate: the last Done
    // 70 s after the start, two nodes: 35 s each.
    let (p, _) = rolling();
    let w = view::watch_view(&p, &[], NOW);
    assert_eq!(w.eta.per_node.seconds, 35);
    assert_eq!(w.eta.per_node.basis, kubectl_tt_driver::eta::Basis::Status);
}

/// Nothing observed, no status: `watch` uses the model's figure `plan` uses
/// (eta::estimate_per_node), which depends on build-ahead, and says so.
#[test]
fn watch_without_observations_uses_plans_model() {
    use kubectl_tt_driver::eta::{self, Basis, Costs};
    let (mut p, _) = rolling();
    p.status = None;
    let w = view::watch_view(&p, &[], NOW);
    assert_eq!(w.eta.per_node.basis, Basis::Model);
    assert_eq!(
        w.eta.per_node.seconds,
        eta::model_per_node(Costs::default(), true),
        "build-ahead on (the default): drain + load"
    );
    let frame = render::watch_frame(&[w], NOW, Palette::PLAIN);
    assert!(frame.contains("25s per node (model:"), "{frame}");
    p.spec.upgrade_policy.prepare.enabled = false;
    let w = view::watch_view(&p, &[], NOW);
    assert_eq!(w.eta.per_node.seconds, eta::DEFAULT_PER_NODE_SECONDS);
}

fn pod(ns: &str, name: &str, node: &str, owner: Option<&str>, device: bool, app: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            labels: Some(BTreeMap::from([("app".to_string(), app.to_string())])),
            owner_references: owner.map(|k| {
                vec![OwnerReference {
                    kind: k.into(),
                    name: "owner".into(),
                    controller: Some(true),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            ..ttdrv_testkit::workload_pod(device)
        }),
        status: Some(PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        }),
    }
}

fn pdb(ns: &str, name: &str, app: &str, allowed: i32) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        spec: Some(PodDisruptionBudgetSpec {
            selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([("app".to_string(), app.to_string())])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: Some(PodDisruptionBudgetStatus {
            disruptions_allowed: allowed,
            ..Default::default()
        }),
    }
}

/// A fleet at 2.7.0 about to go to 2.8.0, with every kind of node and pod.
fn fleet_before_upgrade() -> (
    Vec<TenstorrentDriverPolicy>,
    Vec<Node>,
    Vec<Pod>,
    Vec<PodDisruptionBudget>,
) {
    let older = policy(
        "legacy",
        NOW - 500_000,
        "version: \"2.6.0\"\nnodeAffinity: {matchLabels: {team: legacy}}",
    );
    let fleet = policy(
        "fleet",
        NOW - 86400,
        "version: \"2.7.0\"\nnodeAffinity: {matchLabels: {pool: ml}}\nupgradePolicy: {maxUnavailable: 2}",
    );
    let k = |v: &'static str| (labels::KMD_VERSION, v);
    let host = (labels::INSTALL_MODE, labels::INSTALL_MODE_HOST);
    let plain = |name: &'static str, labels: Vec<(&'static str, &'static str)>| {
        node(N {
            name,
            labels,
            record: None,
            unschedulable: false,
        })
    };
    let nodes = vec![
        plain("w-1", vec![TT, POOL, k("2.7.0")]),
        plain("w-2", vec![TT, POOL, k("2.7.0")]),
        plain("w-3", vec![TT, POOL, k("2.7.0")]),
        plain("w-4", vec![TT, POOL, k("2.7.0")]),
        node(N {
            name: "w-5",
            labels: vec![TT, POOL, k("2.7.0")],
            record: None,
            unschedulable: true,
        }),
        plain("w-new", vec![TT, POOL]),
        plain("w-done", vec![TT, POOL, k("2.8.0")]),
        plain("w-dkms", vec![TT, POOL, k("2.6.1"), host]),
        plain("w-skip", vec![TT, POOL, k("2.7.0"), (labels::SKIP, "true")]),
        plain("w-cpu", vec![POOL]),
        plain("w-legacy", vec![TT, POOL, ("team", "legacy"), k("2.6.0")]),
    ];
    let mut installer = pod(
        "tt-system",
        "ttdrv-fleet-x1",
        "w-1",
        Some("DaemonSet"),
        true,
        "installer",
    );
    if let Some(l) = installer.metadata.labels.as_mut() {
        l.insert(labels::CLAIM.into(), "fleet".into());
    }
    let pods = vec![
        installer,
        pod("ml", "train-0", "w-2", Some("StatefulSet"), true, "train"),
        pod("ml", "web-0", "w-3", Some("ReplicaSet"), false, "web"),
        pod("ml", "scratch", "w-3", None, false, "scratch"),
        pod("ml", "debug-shell", "w-4", None, true, "debug"),
        pod("ml", "batch-1", "w-1", Some("ReplicaSet"), false, "batch"),
        pod(
            "kube-system",
            "proxy-w1",
            "w-1",
            Some("DaemonSet"),
            false,
            "proxy",
        ),
    ];
    let pdbs = vec![pdb("ml", "web", "web", 0), pdb("ml", "batch", "batch", 1)];
    (vec![older, fleet], nodes, pods, pdbs)
}

/// The plan of the fleet policy of [`fleet_before_upgrade`] (at `version`,
/// else its own).
fn plan_fleet(
    policies: &[TenstorrentDriverPolicy],
    nodes: &[Node],
    pods: &[Pod],
    pdbs: &[PodDisruptionBudget],
    version: Option<&str>,
) -> plan::RolloutPlan {
    plan::build(&Inputs {
        policy: &policies[1],
        policies,
        nodes,
        pods,
        pdbs,
        daemon_sets: &[],
        deploy_gates: &[],
        operator_namespace: "tt-k8s-driver-manager-system",
        costs: Default::default(),
        version,
        // 2026-12-05 12:00 UTC, a Saturday.
        now: 1_796_472_000,
    })
}

#[test]
fn plan_of_an_upgrade() {
    let (policies, nodes, pods, pdbs) = fleet_before_upgrade();
    let rp = plan_fleet(&policies, &nodes, &pods, &pdbs, Some("2.8.0"));
    let order: Vec<&str> = rp.nodes.iter().map(|n| n.name.as_str()).collect();
    // The admin-cordoned node first (no extra slot), then nodes without device
    // users by name, device users last.
    assert_eq!(order, ["w-5", "w-1", "w-3", "w-2", "w-4"]);
    let waves: Vec<Option<usize>> = rp.nodes.iter().map(|n| n.wave).collect();
    assert_eq!(
        waves,
        [Some(1), Some(1), Some(2), Some(3), Some(4)],
        "the admin-cordoned node keeps using one of the two slots"
    );
    // Nothing observed: the estimate is the model's build-ahead line (the
    // policy has build-ahead on), one figure for the whole plan.
    assert_eq!(
        rp.estimate.per_node.basis,
        kubectl_tt_driver::eta::Basis::Model
    );
    assert_eq!(
        rp.estimate.seconds,
        rp.build_ahead.prediction.with_build_ahead
    );
    assert_eq!(rp.estimate.seconds, 165);
    let text = render::plan(&rp, Palette::PLAIN);
    let applies = text
        .lines()
        .find(|l| l.contains("← applies"))
        .unwrap_or_default();
    assert!(applies.contains(" 2m45s = "), "{applies}");
    assert!(
        text.contains("Estimated duration: 2m45s = the model below"),
        "{text}"
    );
    check("plan", &text);
    check(
        "plan-json",
        &(serde_json::to_string_pretty(&rp).expect("serializes") + "\n"),
    );
}

#[test]
fn plan_counts_the_soak_and_says_when_the_next_window_opens() {
    let (mut policies, nodes, pods, pdbs) = fleet_before_upgrade();
    let up = &mut policies[1].spec.upgrade_policy;
    up.soak_seconds = 600;
    // Fixed now: Saturday 12:00 UTC; the window opens Saturday 22:00 Berlin.
    up.maintenance_windows = vec![ttdrv_api::MaintenanceWindow {
        days: vec![ttdrv_api::Weekday::Sat],
        start: "22:00".into(),
        end: "04:00".into(),
        time_zone: "Europe/Berlin".into(),
    }];
    let rp = plan_fleet(&policies, &nodes, &pods, &pdbs, Some("2.8.0"));
    assert_eq!(rp.estimate.waves, 4);
    assert_eq!(rp.estimate.soak_seconds, 3 * 600, "a soak between waves");
    assert_eq!(
        rp.estimate.seconds,
        rp.build_ahead.prediction.with_build_ahead + 3 * 600
    );
    let held = rp.held.as_deref().unwrap_or_default();
    assert!(held.contains("2026-12-05T21:00:00Z"), "{held}");
    let text = render::plan(&rp, Palette::PLAIN);
    assert!(text.contains("30m00s of soak"), "{text}");
    assert!(
        text.contains("Held now: outside the maintenance windows"),
        "{text}"
    );
}

#[test]
fn plan_at_the_current_version_cycles_only_nodes_off_it() {
    let (policies, nodes, pods, pdbs) = fleet_before_upgrade();
    let rp = plan_fleet(&policies, &nodes, &pods, &pdbs, None);
    // Only the node running another version (a downgrade) gets a cycle.
    let order: Vec<&str> = rp.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(order, ["w-done"]);
    let up_to_date: Vec<&str> = rp
        .without_drain
        .iter()
        .filter(|n| n.kind == "UpToDate")
        .map(|n| n.name.as_str())
        .collect();
    assert_eq!(up_to_date, ["w-1", "w-2", "w-3", "w-4", "w-5"]);
    assert_eq!(rp.estimate.seconds, 90);
}

#[test]
fn plan_predicts_the_stall_of_an_admin_cordoned_node_with_one_slot() {
    let (mut policies, nodes, pods, pdbs) = fleet_before_upgrade();
    policies[1].spec.upgrade_policy.max_unavailable =
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1);
    let rp = plan_fleet(&policies, &nodes, &pods, &pdbs, Some("2.8.0"));
    let waves: Vec<(&str, Option<usize>)> =
        rp.nodes.iter().map(|n| (n.name.as_str(), n.wave)).collect();
    assert_eq!(
        waves,
        [
            ("w-5", Some(1)),
            ("w-1", None),
            ("w-3", None),
            ("w-2", None),
            ("w-4", None)
        ]
    );
    assert!(
        rp.halted.as_deref().is_some_and(|h| h.contains("stall")),
        "{:?}",
        rp.halted
    );
}

#[test]
fn a_retried_failed_node_no_longer_ends_the_watch() {
    let (p, mut nodes) = failed();
    let w = view::watch_view(&p, &nodes, NOW);
    assert!(matches!(w.outcome, Outcome::Failed { .. }));
    nodes[3]
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert("driver.tenstorrent.com/retry".into(), "1780000000".into());
    let w = view::watch_view(&p, &nodes, NOW);
    assert_eq!(
        w.outcome,
        Outcome::Running,
        "retry requested, not yet taken up"
    );
    assert!(w.policy.nodes[3].retry_requested);
    assert!(render::watch_frame(&[w], NOW, Palette::PLAIN).contains("Failed (retrying)"));
}

#[test]
fn an_unavailable_node_without_a_cycle_still_uses_a_slot() {
    let (mut policies, mut nodes, pods, pdbs) = fleet_before_upgrade();
    policies[1].spec.upgrade_policy.max_unavailable =
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1);
    // w-5 is no longer cordoned; w-done (already at 2.8.0) is.
    for n in nodes.iter_mut() {
        let name = n.metadata.name.clone().unwrap_or_default();
        if let Some(spec) = n.spec.as_mut() {
            spec.unschedulable = Some(name == "w-done");
        }
    }
    let rp = plan_fleet(&policies, &nodes, &pods, &pdbs, Some("2.8.0"));
    assert!(rp.nodes.iter().all(|n| n.wave.is_none()), "{:?}", rp.nodes);
    assert!(
        rp.halted
            .as_deref()
            .is_some_and(|h| h.contains("at most 1") && h.contains("1 out of service")),
        "{:?}",
        rp.halted
    );
}

#[test]
fn many_ordinary_nodes_are_summarized_in_text_but_all_in_json() {
    let (policies, mut nodes, pods, pdbs) = fleet_before_upgrade();
    for i in 0..15 {
        let name: &'static str = Box::leak(format!("cpu-{i:02}").into_boxed_str());
        nodes.push(node(N {
            name,
            labels: vec![POOL],
            record: None,
            unschedulable: false,
        }));
    }
    let rp = plan_fleet(&policies, &nodes, &pods, &pdbs, Some("2.8.0"));
    assert_eq!(
        rp.skipped
            .iter()
            .filter(|n| n.kind == "NotTenstorrent")
            .count(),
        16
    );
    let text = render::plan(&rp, Palette::PLAIN);
    assert_eq!(text.matches("NotTenstorrent").count(), 10);
    assert!(text.contains("… and 6 more nodes without a Tenstorrent device"));
}

/// A node whose Tenstorrent functions are all on vfio-pci (the VFIO
/// binder's report) is skipped, as the controller skips it; a mixed node is
/// not.
#[test]
fn plan_skips_a_node_whose_functions_are_all_passed_through() {
    let (policies, mut nodes, pods, pdbs) = fleet_before_upgrade();
    let report = |drivers: &str| {
        format!(
            r#"{{"bootId":"","drivers":{drivers},"vfioResources":["tenstorrent.com/wh-vfio"]}}"#
        )
    };
    for (name, drivers) in [
        ("w-1", r#"{"vfio-pci":2}"#),
        ("w-3", r#"{"vfio-pci":1,"tenstorrent":1}"#),
    ] {
        let n = nodes
            .iter_mut()
            .find(|n| n.metadata.name.as_deref() == Some(name))
            .expect("fixture node");
        n.metadata.annotations = Some(BTreeMap::from([(
            ttdrv_api::vfio::PCI_FUNCTIONS.to_string(),
            report(drivers),
        )]));
    }
    let rp = plan_fleet(&policies, &nodes, &pods, &pdbs, Some("2.8.0"));
    let skipped: Vec<(&str, &str)> = rp
        .skipped
        .iter()
        .filter(|n| n.kind == "VfioPassthrough")
        .map(|n| (n.name.as_str(), n.detail.as_str()))
        .collect();
    assert_eq!(skipped.len(), 1, "{:?}", rp.skipped);
    assert_eq!(skipped[0].0, "w-1");
    assert!(skipped[0].1.contains("vfio-pci"), "{skipped:?}");
    let order: Vec<&str> = rp.nodes.iter().map(|n| n.name.as_str()).collect();
    assert!(
        !order.contains(&"w-1") && order.contains(&"w-3"),
        "{order:?}"
    );
}

/// The controller does not re-write the record of a Done node that a new
/// version sends back to Pending: the node still carries the Done of the
/// previous rollout. It waits for the policy's version all the same.
#[test]
fn waiting_node_with_the_previous_rollouts_record_targets_the_new_version() {
    let (p, mut nodes) = rolling();
    let mut old = record(
        NodeState::Done,
        "Upgraded",
        Some(NOW - 900),
        NOW - 880,
        false,
    );
    old.target = "2.7.0".into();
    let gpu_e = nodes
        .iter_mut()
        .find(|n| n.metadata.name.as_deref() == Some("gpu-e"))
        .expect("gpu-e in the fixture");
    gpu_e.metadata.annotations = Some(
        [(
            labels::UPGRADE_STATE.to_string(),
            serde_json::to_string(&old).expect("record serializes"),
        )]
        .into(),
    );
    let view = view::policy_view(&p, &nodes, NOW);
    let row = view
        .nodes
        .iter()
        .find(|n| n.name == "gpu-e")
        .expect("gpu-e listed");
    assert_eq!(row.state, NodeState::Pending);
    assert_eq!(row.target_version, "2.8.0");
    // Still two nodes to go after gpu-c: the same estimate as with a Pending record.
    let w = view::watch_view(&p, &nodes, NOW);
    assert_eq!(w.eta.remaining_seconds, Some(90));
}

#[test]
fn a_vacated_fleet_ends_the_watch_and_an_unload_failure_halts_it() {
    let (mut p, nodes) = rolling();
    if let Some(st) = p.status.as_mut() {
        for n in st.nodes.iter_mut() {
            n.state = NodeState::Unmanaged;
        }
    }
    let w = view::watch_view(&p, &nodes, NOW);
    assert_eq!(w.outcome, Outcome::Complete, "Unmanaged nodes are settled");
    if let Some(st) = p.status.as_mut() {
        st.nodes[0].state = NodeState::UnloadFailed;
    }
    let w = view::watch_view(&p, &nodes, NOW);
    assert!(
        matches!(w.outcome, Outcome::Failed { .. }),
        "{:?}",
        w.outcome
    );
}

/// The fleet once the controller acts on 2.8.0: w-5 and w-1 hold it built
/// ahead (the agent's label), w-3 as its status says; w-4 prepared another
/// version; w-2 has nothing yet.
fn fleet_preparing() -> (
    Vec<TenstorrentDriverPolicy>,
    Vec<Node>,
    Vec<Pod>,
    Vec<PodDisruptionBudget>,
) {
    let (mut policies, mut nodes, pods, pdbs) = fleet_before_upgrade();
    let fleet = &mut policies[1];
    fleet.spec.version = "2.8.0".into();
    let status_entry = |name: &str, prepared: Option<&str>| {
        let mut e = entry(
            name,
            NodeState::Pending,
            "2.7.0",
            Some("WaitingForPrepare"),
            None,
            NOW - 30,
        );
        e.prepared_version = prepared.map(String::from);
        e
    };
    fleet.status = Some(TenstorrentDriverPolicyStatus {
        observed_generation: Some(2),
        desired_version: Some("2.8.0".into()),
        nodes: vec![
            status_entry("w-1", None),
            status_entry("w-2", None),
            status_entry("w-3", Some("2.8.0")),
            status_entry("w-4", Some("2.7.1")),
            status_entry("w-5", None),
        ],
        ..Default::default()
    });
    for n in nodes.iter_mut() {
        if matches!(n.metadata.name.as_deref(), Some("w-1" | "w-5"))
            && let Some(l) = n.metadata.labels.as_mut()
        {
            l.insert(labels::KMD_PREPARED.into(), "2.8.0".into());
        }
    }
    (policies, nodes, pods, pdbs)
}

fn plan_of(
    (policies, nodes, pods, pdbs): &(
        Vec<TenstorrentDriverPolicy>,
        Vec<Node>,
        Vec<Pod>,
        Vec<PodDisruptionBudget>,
    ),
    version: Option<&str>,
) -> plan::RolloutPlan {
    plan::build(&Inputs {
        policy: &policies[1],
        policies,
        nodes,
        pods,
        pdbs,
        daemon_sets: &[],
        deploy_gates: &[],
        operator_namespace: "tt-k8s-driver-manager-system",
        version,
        costs: Default::default(),
        now: 1_796_472_000,
    })
}

#[test]
fn plan_shows_prepared_nodes_and_the_duration_with_and_without_build_ahead() {
    let fixture = fleet_preparing();
    let rp = plan_of(&fixture, None);
    let prepared: Vec<(&str, Option<usize>, bool)> = rp
        .nodes
        .iter()
        .map(|n| (n.name.as_str(), n.wave, n.prepared))
        .collect();
    assert_eq!(
        prepared,
        [
            ("w-5", Some(1), true),
            ("w-1", Some(1), true),
            ("w-3", Some(2), true),
            ("w-2", Some(3), false),
            ("w-4", Some(4), false),
        ]
    );
    let b = &rp.build_ahead;
    assert!(b.enabled);
    assert_eq!((b.prepared, b.max_concurrent), (3, 10));
    // Without: 4 waves × (20 drain + 5 pod + 5 load) + 2 builds of 60 (waves 1
    // and 2 prepared). With: waves 1 and 2 cordon at once (0..50); w-2 and
    // w-4 build from the start, ready at 65: wave 3 65..90, wave 4 90..115.
    assert_eq!(b.prediction.without_build_ahead, 4 * 30 + 2 * 60);
    assert_eq!(b.prediction.with_build_ahead, 115);
    assert_eq!(b.prediction.first_build, 0);
    let text = render::plan(&rp, Palette::PLAIN);
    check("plan-prepared", &text);
    // The table marks exactly the three prepared nodes.
    let yes = text
        .lines()
        .filter(|l| l.starts_with(char::is_numeric))
        .filter(|l| l.split_whitespace().nth(4) == Some("yes"))
        .count();
    assert_eq!(yes, 3, "{text}");
}

#[test]
fn a_version_the_controller_does_not_act_on_counts_only_what_is_loaded() {
    let mut fixture = fleet_preparing();
    // Even a node whose agent reported 2.9.0 prepared: the agents build ahead
    // 2.8.0 (status.desiredVersion), so 2.9.0 would be built inside cordons.
    for n in fixture.1.iter_mut() {
        if n.metadata.name.as_deref() == Some("w-1")
            && let Some(l) = n.metadata.labels.as_mut()
        {
            l.insert(labels::KMD_PREPARED.into(), "2.9.0".into());
        }
    }
    let rp = plan_of(&fixture, Some("2.9.0"));
    assert!(rp.nodes.iter().all(|n| !n.prepared), "{:?}", rp.nodes);
    assert_eq!(rp.build_ahead.prepared, 0);
    // w-done runs 2.8.0 and gets a cycle too now: 6 nodes, nothing prepared.
    assert_eq!(rp.build_ahead.prediction.prepared_waves, 0);
    let text = render::plan(&rp, Palette::PLAIN);
    assert!(
        text.contains(
            "(2.9.0 is not the version the controller acts on (2.8.0): nothing is built ahead for it)"
        ),
        "{text}"
    );
}

#[test]
fn with_build_ahead_off_the_figure_without_it_applies() {
    let mut fixture = fleet_preparing();
    fixture.0[1].spec.upgrade_policy.prepare.enabled = false;
    let rp = plan_of(&fixture, None);
    assert!(!rp.build_ahead.enabled);
    let text = render::plan(&rp, Palette::PLAIN);
    let line = |prefix: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(prefix))
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        line("without build-ahead").ends_with("← applies (build-ahead is off)"),
        "{text}"
    );
    assert!(!line("with build-ahead").contains("applies"), "{text}");
    assert!(text.contains("Build ahead: off (upgradePolicy.prepare.enabled: false)"));
    // On, the other line applies.
    let rp = plan_of(&fleet_preparing(), None);
    let text = render::plan(&rp, Palette::PLAIN);
    assert!(
        text.lines()
            .any(|l| l.trim_start().starts_with("with build-ahead") && l.ends_with("← applies")),
        "{text}"
    );
}

#[test]
fn status_counts_prepared_nodes_until_the_target_is_everywhere() {
    let (p, nodes) = rolling();
    let v = view::policy_view(&p, &nodes, NOW);
    // gpu-a, gpu-b run 2.8.0, gpu-d has it cached; gpu-c and gpu-e do not;
    // gpu-h (host-managed) is not counted.
    assert_eq!(
        v.prepared,
        view::PreparedCount {
            prepared: 3,
            at_target: 2,
            nodes: 5
        }
    );
    let text = render::status(std::slice::from_ref(&v), Palette::PLAIN);
    assert!(
        text.contains("  prepared 3/5: 2.8.0 loaded or built ahead"),
        "{text}"
    );
    // Everywhere: no line.
    let (mut p, nodes) = rolling();
    if let Some(st) = p.status.as_mut() {
        for n in st.nodes.iter_mut().filter(|n| n.name != "gpu-h") {
            n.state = NodeState::Done;
            n.current_version = Some("2.8.0".into());
        }
    }
    let v = view::policy_view(&p, &nodes, NOW);
    assert_eq!((v.prepared.prepared, v.prepared.nodes), (5, 5));
    assert!(!render::status(&[v], Palette::PLAIN).contains("prepared"));
}

/// `spec.promoteAfter`: the status shows the chain, each following policy
/// with its canary, the soak and where the promotion stands.
#[test]
fn status_shows_the_promotion_chain() {
    let canary_at = |ready_since: i64, failed: i32| {
        let mut c = policy(
            "canary",
            NOW - 100_000,
            "version: \"2.8.0\"\nnodeAffinity: {matchLabels: {pool: canary}}",
        );
        c.status = Some(TenstorrentDriverPolicyStatus {
            observed_generation: Some(2),
            desired_version: Some("2.8.0".into()),
            phase: Some("Ready".into()),
            summary: Summary {
                matched: 1,
                done: 1,
                failed_nodes: failed,
                ..Default::default()
            },
            conditions: vec![cond(
                "Ready",
                failed == 0,
                "RolloutComplete",
                "",
                ready_since,
            )],
            ..Default::default()
        });
        c
    };
    let (mut prod, nodes) = rolling();
    prod.spec.promote_after = Some(ttdrv_api::PromoteAfter {
        policy: "canary".into(),
        soak_seconds: 600,
    });
    let show = |canary: Option<&TenstorrentDriverPolicy>| {
        let mut views = vec![];
        if let Some(c) = canary {
            views.push(view::policy_view(c, &nodes, NOW));
        }
        let mut v = view::policy_view(&prod, &nodes, NOW);
        v.promotion = view::promotion_view(&prod, canary, NOW);
        views.push(v);
        views
    };
    // Soaking: Ready 120 s of 600.
    let soaking = canary_at(NOW - 120, 0);
    let views = show(Some(&soaking));
    check("status-promotion", &render::status(&views, Palette::PLAIN));
    let line = |views: &[view::PolicyView]| {
        render::status(views, Palette::PLAIN)
            .lines()
            .find(|l| l.contains("Promotion:"))
            .map(str::trim)
            .map(String::from)
            .unwrap_or_default()
    };
    assert_eq!(
        line(&views),
        "Promotion: after canary (soak 600s): waiting: canary Ready at 2.8.0 for 120s of 600s"
    );
    // Soaked: open.
    let soaked = canary_at(NOW - 6000, 0);
    assert_eq!(
        line(&show(Some(&soaked))),
        "Promotion: after canary (soak 600s): open: canary is Ready at 2.8.0"
    );
    // Halted: blocked, and why.
    let halted = canary_at(NOW - 6000, 1);
    let l = line(&show(Some(&halted)));
    assert!(
        l.starts_with("Promotion: after canary (soak 600s): blocked: the canary policy canary has 1 Failed node"),
        "{l}"
    );
    // Missing.
    let l = line(&show(None));
    assert!(
        l.contains("blocked: ") && l.contains("does not exist"),
        "{l}"
    );
    // Not there yet.
    let mut behind = canary_at(NOW - 6000, 0);
    if let Some(st) = behind.status.as_mut() {
        st.desired_version = Some("2.7.0".into());
    }
    assert_eq!(
        line(&show(Some(&behind))),
        "Promotion: after canary (soak 600s): waiting: canary: it is not at 2.8.0 yet (it rolls out 2.7.0)"
    );
    // A policy that follows no canary has no such line, nor JSON field.
    let plain = view::policy_view(&soaking, &nodes, NOW);
    assert!(plain.promotion.is_none());
    let json = serde_json::to_value(&views).expect("json");
    assert_eq!(json[1]["promotion"]["state"], "waiting", "{json}");
    assert!(json[0].get("promotion").is_none(), "{json}");
}

/// The stack's DaemonSets on a node (../shared/design/STACK.md, modelled in
/// `ttdrv_testkit::stack`): with the controller's default gates, `plan`
/// names the fabric-manager agent and the key it lacks; the telemetry
/// collector, gated, is not named; with both keys neither is.
#[test]
fn plan_names_the_daemon_sets_no_configured_gate_stands_down() {
    use ttdrv_testkit::stack::{self, FABRIC_MANAGER_GATE, TELEMETRY_GATE};
    let (policies, nodes, mut pods, pdbs) = fleet_before_upgrade();
    let daemon_sets = vec![
        stack::telemetry_collector("t", "tt-telemetry-collector"),
        stack::fabric_manager_agent("t", "tt-fabric-manager-agent"),
        stack::ungated_fabric_manager_agent("t", "old-fabric-agent"),
    ];
    let mut stack_pod = |ds: &str, node: &str| {
        let mut p = pod(
            "tt",
            &format!("{ds}-{node}"),
            node,
            Some("DaemonSet"),
            false,
            ds,
        );
        if let Some(o) = p.metadata.owner_references.as_mut() {
            o[0].name = ds.into();
        }
        pods.push(p);
    };
    stack_pod("tt-telemetry-collector", "w-1");
    stack_pod("tt-fabric-manager-agent", "w-1");
    stack_pod("old-fabric-agent", "w-3");
    // The DaemonSets live in namespace "tt", as their pods.
    let daemon_sets: Vec<_> = daemon_sets
        .into_iter()
        .map(|mut d| {
            d.metadata.namespace = Some("tt".into());
            d
        })
        .collect();
    let plan_with = |gates: &[String]| {
        plan::build(&Inputs {
            policy: &policies[1],
            policies: &policies,
            nodes: &nodes,
            pods: &pods,
            pdbs: &pdbs,
            daemon_sets: &daemon_sets,
            deploy_gates: gates,
            operator_namespace: "tt-k8s-driver-manager-system",
            costs: Default::default(),
            version: Some("2.8.0"),
            now: 1_796_472_000,
        })
    };
    let holders = |rp: &plan::RolloutPlan| -> Vec<(String, String, String, bool)> {
        rp.nodes
            .iter()
            .flat_map(|n| {
                n.ungated_holders.iter().map(|h| {
                    (
                        n.name.clone(),
                        h.daemon_set.clone(),
                        h.gate_key.clone(),
                        h.template_has_gate,
                    )
                })
            })
            .collect()
    };
    let rp = plan_with(&[TELEMETRY_GATE.to_string()]);
    assert_eq!(
        holders(&rp),
        [
            (
                "w-1".to_string(),
                "tt/tt-fabric-manager-agent".to_string(),
                FABRIC_MANAGER_GATE.to_string(),
                true
            ),
            (
                "w-3".to_string(),
                "tt/old-fabric-agent".to_string(),
                "tenstorrent.com/deploy.old-fabric-agent".to_string(),
                false
            ),
        ]
    );
    let text = render::plan(&rp, Palette::PLAIN);
    assert!(
        text.contains(&format!(
            "UNGATED: pod tt/tt-fabric-manager-agent-w-1: DaemonSet tt/tt-fabric-manager-agent holds the device \
             and follows the deploy gate {FABRIC_MANAGER_GATE}, which is not configured: add \
             {FABRIC_MANAGER_GATE} to controller.deployGates"
        )),
        "{text}"
    );
    assert!(!text.contains("UNGATED: pod tt/tt-telemetry"), "{text}");
    // The held pods block the swap too.
    let w1 = rp.nodes.iter().find(|n| n.name == "w-1").expect("w-1");
    assert!(
        w1.blockers
            .iter()
            .any(|b| b.contains("tt/tt-fabric-manager-agent-w-1")),
        "{:?}",
        w1.blockers
    );
    let json = serde_json::to_value(&rp).expect("serializes");
    let w1 = json["nodes"]
        .as_array()
        .and_then(|ns| ns.iter().find(|n| n["name"] == "w-1"))
        .expect("w-1 in JSON");
    assert_eq!(
        w1["ungatedHolders"][0]["gateKey"],
        serde_json::json!(FABRIC_MANAGER_GATE)
    );
    // Both keys configured: only the DaemonSet with no gate is left.
    let rp = plan_with(&[TELEMETRY_GATE.to_string(), FABRIC_MANAGER_GATE.to_string()]);
    assert_eq!(holders(&rp).len(), 1);
    assert_eq!(holders(&rp)[0].1, "tt/old-fabric-agent");
}

/// The DRA kubelet plugin's pod on a node (the tt-dra-driver chart's label):
/// `plan` says it is restarted after the swap and the node waits for its
/// cards; a node without one says nothing of it.
#[test]
fn plan_says_which_nodes_restart_their_dra_plugin_after_the_swap() {
    let (policies, nodes, mut pods, pdbs) = fleet_before_upgrade();
    let mut plugin = pod(
        "tt",
        "tt-dra-driver-w-1",
        "w-1",
        Some("DaemonSet"),
        false,
        "dra",
    );
    if let Some(l) = plugin.metadata.labels.as_mut() {
        l.insert("app.kubernetes.io/name".into(), "tt-dra-driver".into());
    }
    pods.push(plugin);
    let rp = plan::build(&Inputs {
        policy: &policies[1],
        policies: &policies,
        nodes: &nodes,
        pods: &pods,
        pdbs: &pdbs,
        daemon_sets: &[],
        deploy_gates: &[],
        operator_namespace: "tt-k8s-driver-manager-system",
        costs: Default::default(),
        version: Some("2.8.0"),
        now: 1_796_472_000,
    });
    let dra = |n: &str| {
        rp.nodes
            .iter()
            .find(|p| p.name == n)
            .map(|p| p.dra_plugin.clone())
    };
    assert_eq!(dra("w-1"), Some(vec!["tt/tt-dra-driver-w-1".to_string()]));
    assert!(dra("w-3").is_some_and(|d| d.is_empty()), "{:?}", dra("w-3"));
    let text = render::plan(&rp, Palette::PLAIN);
    assert!(
        text.contains("after the swap: restarts the DRA plugin (tt/tt-dra-driver-w-1) and waits until its ResourceSlices list every card"),
        "{text}"
    );
    let json = serde_json::to_value(&rp).expect("serializes");
    let w1 = json["nodes"]
        .as_array()
        .and_then(|ns| ns.iter().find(|n| n["name"] == "w-1"))
        .expect("w-1 in JSON");
    assert_eq!(w1["draPlugin"][0], "tt/tt-dra-driver-w-1");
}
