//! The observation of one node, built from reflector stores fed by hand.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    Container, HostPathVolumeSource, Node, Pod, PodCondition, PodSpec, PodStatus, Volume,
};
use k8s_openapi::api::policy::v1::{
    PodDisruptionBudget, PodDisruptionBudgetSpec, PodDisruptionBudgetStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use ttdrv_api::{
    NodeState, PodSelector, TenstorrentDriverPolicy, TenstorrentDriverPolicySpec, labels,
};
use ttdrv_core::drain::DrainPass;
use ttdrv_core::machine::{Cordon, Desired, InstallerPod, NodeRecord};

use super::*;
use crate::runtime::context::Stores;
use crate::runtime::pod_index::PodCache;

const NS: &str = "tt-system";
const HASH: &str = "h1";
const GATE: &str = "tenstorrent.com/deploy.tt-telemetry";

use crate::test_support::fed;

fn stores(nodes: Vec<Node>, pods: Vec<Pod>, pdbs: Vec<PodDisruptionBudget>) -> Stores {
    Stores {
        policies: fed(vec![]),
        nodes: fed(nodes),
        pods: Arc::new(PodCache::listed(NS, pods)),
        daemonsets: fed(vec![]),
        all_daemon_sets: Default::default(),
        pdbs: fed(pdbs),
        slices: std::sync::Arc::new(crate::runtime::slice_index::SliceIndex::new(
            "tenstorrent.com",
        )),
    }
}

fn policy() -> TenstorrentDriverPolicy {
    let mut p = TenstorrentDriverPolicy::new(
        "fleet",
        serde_json::from_value::<TenstorrentDriverPolicySpec>(serde_json::json!({
            "version": "2.8.0",
            "nodeAffinity": { "nodeSelectorTerms": [ { "matchLabels": { "pool": "a" } } ] },
            "upgradePolicy": { "drain": { "fullNode": true } }
        }))
        .expect("spec"),
    );
    p.metadata.name = Some("fleet".into());
    p
}

use ttdrv_core::fixtures::{meta, node};

/// The Ready, cordoned node n1 carrying the record `record(state, cordon)`.
fn cordoned_n1(state: NodeState, cordon: Cordon) -> Node {
    with_record(node("n1", "True", true, &[]), &record(state, cordon))
}

fn with_record(mut n: Node, r: &NodeRecord) -> Node {
    n.metadata.annotations = Some(
        [(
            labels::UPGRADE_STATE.to_string(),
            serde_json::to_string(r).expect("record"),
        )]
        .into(),
    );
    n
}

fn owned_by(kind: &str) -> Option<Vec<OwnerReference>> {
    Some(vec![OwnerReference {
        kind: kind.into(),
        name: "x".into(),
        controller: Some(true),
        ..Default::default()
    }])
}

fn pod(name: &str, node: &str, device: bool, app: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ml".into()),
            labels: Some([("app".to_string(), app.to_string())].into()),
            owner_references: owned_by("ReplicaSet"),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            containers: vec![Container::default()],
            volumes: device.then(|| {
                vec![Volume {
                    name: "dev".into(),
                    host_path: Some(HostPathVolumeSource {
                        path: "/dev/tenstorrent".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        }),
        status: None,
    }
}

fn installer(node: &str, hash: &str, ready: bool) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(format!("ttdrv-fleet-{node}")),
            namespace: Some(NS.into()),
            labels: Some([(labels::CLAIM.to_string(), "fleet".to_string())].into()),
            annotations: Some([(labels::TEMPLATE_HASH.to_string(), hash.to_string())].into()),
            owner_references: owned_by("DaemonSet"),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            ..Default::default()
        }),
        status: Some(PodStatus {
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    }
}

fn pdb(name: &str, app: &str, allowed: i32) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: meta(name, "ml"),
        spec: Some(PodDisruptionBudgetSpec {
            selector: Some(LabelSelector {
                match_labels: Some([("app".to_string(), app.to_string())].into()),
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

fn record(state: NodeState, cordon: Cordon) -> NodeRecord {
    let mut r = NodeRecord::new("fleet", "2.8.0", 10);
    r.state = state;
    r.cordon = cordon;
    r
}

/// Observes `name` in `s` with the given actor records.
fn observe(
    s: &Stores,
    records: &HashMap<String, NodeRecord>,
    name: &str,
    starting: bool,
) -> Option<NodeView> {
    let policy = policy();
    let selector = PodSelector::parse("").expect("empty selector");
    let gates = vec![GATE.to_string()];
    let daemon_sets = s.all_daemon_sets.snapshot();
    let desired = Desired {
        prepare: false,
        ..Desired::of(&policy, 600)
    };
    let input = ObserveInput {
        stores: s,
        policy: PolicyFacts {
            desired: &desired,
            drain: &policy.spec.upgrade_policy.drain,
            namespace: NS,
            drain_exempt: &[],
            template_hash: HASH,
            selector: Some(&selector),
            gates: &gates,
            daemon_sets: &daemon_sets,
            now: 100,
            prepare_deadline_seconds: 900,
            surface: &Default::default(),
        },
        records,
        pdbs: Default::default(),
        examined: Default::default(),
    };
    input.node(name, starting)
}

#[test]
fn labels_installer_and_gates() {
    let s = stores(
        vec![node(
            "n1",
            "True",
            false,
            &[
                (labels::KMD_VERSION, "2.7.0"),
                (labels::INSTALL_MODE, labels::INSTALL_MODE_HOST),
                (GATE, "false"),
            ],
        )],
        vec![installer("n1", HASH, true)],
        vec![],
    );
    let v = observe(&s, &HashMap::new(), "n1", false).expect("node in cache");
    assert_eq!(v.obs.loaded.as_deref(), Some("2.7.0"));
    assert!(v.obs.host_managed);
    assert!(v.obs.gates_closed && v.obs.gates_present);
    assert_eq!(v.obs.installer, InstallerPod::Current { ready: true });
    assert!(v.obs.drain.is_none(), "a Pending node gets no drain plan");
    assert!(v.evictions.is_empty());
    assert!(observe(&s, &HashMap::new(), "absent", false).is_none());
}

#[test]
fn installer_with_another_hash_is_stale_and_unknown_hash_is_never_current() {
    let s = stores(
        vec![node("n1", "True", false, &[])],
        vec![installer("n1", "old", true)],
        vec![],
    );
    let v = observe(&s, &HashMap::new(), "n1", false).expect("node");
    assert_eq!(v.obs.installer, InstallerPod::Stale { deleting: false });
    let s = stores(vec![node("n2", "True", false, &[])], vec![], vec![]);
    let v = observe(&s, &HashMap::new(), "n2", false).expect("node");
    assert_eq!(v.obs.installer, InstallerPod::Missing);
}

#[test]
fn availability_rules() {
    let cases = [
        // (ready, unschedulable, cordon in record, externally unavailable)
        ("True", false, Cordon::None, false),
        ("False", false, Cordon::None, true),
        ("Unknown", false, Cordon::Ours, true),
        ("True", true, Cordon::None, true),
        ("True", true, Cordon::Theirs, true),
        ("True", true, Cordon::Ours, false),
    ];
    for (ready, unsched, cordon, want) in cases {
        let n = with_record(
            node("n1", ready, unsched, &[]),
            &record(NodeState::Upgrading, cordon),
        );
        let s = stores(vec![n], vec![], vec![]);
        let v = observe(&s, &HashMap::new(), "n1", false).expect("node");
        assert_eq!(
            v.externally_unavailable, want,
            "ready={ready} unschedulable={unsched} cordon={cordon:?}"
        );
    }
}

#[test]
fn the_actors_record_wins_over_a_lagging_annotation() {
    // The cache still shows Pending; the actor already moved to Draining.
    let n = cordoned_n1(NodeState::Pending, Cordon::None);
    let s = stores(vec![n], vec![pod("w", "n1", true, "w")], vec![]);
    let records: HashMap<String, NodeRecord> =
        [("n1".to_string(), record(NodeState::Draining, Cordon::Ours))].into();
    let v = observe(&s, &records, "n1", false).expect("node");
    assert!(v.obs.drain.is_some(), "the live record drains: plan it");
    assert!(
        !v.externally_unavailable,
        "the live record says the cordon is ours"
    );
}

#[test]
fn drain_plan_for_granted_or_draining_nodes_only() {
    let mk = |state| cordoned_n1(state, Cordon::Ours);
    for (state, starting, planned) in [
        (NodeState::Pending, false, false),
        (NodeState::Pending, true, true),
        (NodeState::Cordoning, false, true),
        (NodeState::Draining, false, true),
        (NodeState::Upgrading, false, false),
        (NodeState::Done, false, false),
    ] {
        let s = stores(vec![mk(state)], vec![pod("w", "n1", true, "w")], vec![]);
        let v = observe(&s, &HashMap::new(), "n1", starting).expect("node");
        assert_eq!(
            v.obs.drain.is_some(),
            planned,
            "{state:?} starting={starting}"
        );
        assert!(
            v.has_device_pods,
            "device use is known with or without a plan"
        );
    }
}

#[test]
fn pass_two_waits_for_pass_one_and_pdbs_are_named_once() {
    let n = cordoned_n1(NodeState::Draining, Cordon::Ours);
    let pods = vec![
        pod("dev", "n1", true, "train"),
        pod("web-1", "n1", false, "web"),
        pod("web-2", "n1", false, "web"),
    ];
    let pdbs = vec![pdb("web", "web", 0), pdb("train", "train", 1)];
    let s = stores(vec![n.clone()], pods.clone(), pdbs.clone());
    let v = observe(&s, &HashMap::new(), "n1", false).expect("node");
    let evict: Vec<String> = v.evictions.iter().map(|(p, _)| p.to_string()).collect();
    assert_eq!(
        evict,
        ["ml/dev"],
        "pass 2 waits while a device user is on the node"
    );
    let blocked: Vec<(String, String)> = v
        .obs
        .drain_blocked
        .iter()
        .map(|b| (b.pod.clone(), b.pdb.clone()))
        .collect();
    let pair = |pod: &str| (pod.to_string(), "ml/web".to_string());
    assert_eq!(
        blocked,
        [pair("ml/web-1"), pair("ml/web-2")],
        "each blocked pod with its budget, for the node's message"
    );
    let drain = v.obs.drain.expect("plan");
    assert_eq!(drain.remaining, ["ml/dev", "ml/web-1", "ml/web-2"]);
    assert_eq!(drain.blocking_pdbs, ["ml/web"], "one entry per PDB");
    // The device user is gone: pass 2 opens.
    let s = stores(vec![n], pods[1..].to_vec(), pdbs);
    let v = observe(&s, &HashMap::new(), "n1", false).expect("node");
    let evict: Vec<(String, DrainPass)> = v
        .evictions
        .iter()
        .map(|(p, pass)| (p.to_string(), *pass))
        .collect();
    assert_eq!(
        evict,
        [
            ("ml/web-1".to_string(), DrainPass::Full),
            ("ml/web-2".to_string(), DrainPass::Full)
        ]
    );
}

#[test]
fn record_of_another_policy_is_not_ours() {
    let mut r = record(NodeState::Draining, Cordon::Ours);
    r.policy = "other".into();
    let s = stores(
        vec![with_record(node("n1", "True", true, &[]), &r)],
        vec![],
        vec![],
    );
    let v = observe(&s, &HashMap::new(), "n1", false).expect("node");
    assert!(v.persisted.is_none());
    assert!(
        v.externally_unavailable,
        "another policy's cordon is not ours to count as ours"
    );
}

#[test]
fn candidate_facts() {
    let s = stores(vec![node("n1", "False", false, &[])], vec![], vec![]);
    let v = observe(&s, &HashMap::new(), "n1", false).expect("node");
    let c = v.candidate("n1", None);
    assert!(c.wants_slot && c.unavailable && !c.in_progress && !c.failed);
    let r = record(NodeState::Draining, Cordon::Ours);
    let c = v.candidate("n1", Some(&r));
    assert!(!c.wants_slot && c.in_progress);
}

#[test]
fn a_go_operator_cordon_for_this_policy_is_inherited() {
    let go = |by: &str, unschedulable: bool| {
        let mut n = node("n1", "True", unschedulable, &[]);
        n.metadata.annotations = Some(
            [
                (labels::GO_CORDONED_BY.to_string(), by.to_string()),
                (
                    labels::GO_CORDONED_AT.to_string(),
                    "2026-01-01T00:00:00Z".to_string(),
                ),
            ]
            .into(),
        );
        n
    };
    for (by, unschedulable, inherited) in [
        ("fleet", true, true),
        // Uncordoned since: nothing to inherit.
        ("fleet", false, false),
        // The Go operator's cordon for another policy is not ours.
        ("other", true, false),
    ] {
        let s = stores(vec![go(by, unschedulable)], vec![], vec![]);
        let v = observe(&s, &HashMap::new(), "n1", false).expect("node");
        assert_eq!(v.obs.inherited_cordon, inherited, "{by} {unschedulable}");
    }
}

#[test]
fn a_pending_node_cordoned_by_us_counts_as_unavailable() {
    let n = cordoned_n1(NodeState::Pending, Cordon::Ours);
    let s = stores(vec![n], vec![], vec![]);
    let v = observe(&s, &HashMap::new(), "n1", false).expect("node");
    assert!(v.externally_unavailable);
}
