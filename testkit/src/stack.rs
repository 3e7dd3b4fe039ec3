//! Simulated DaemonSets of the Tenstorrent stack around the driver, on kwok
//! nodes: the pods a driver upgrade must stand down by deploy gates, since no
//! drain evicts a DaemonSet's pod. Each models a contract stated in
//! `../shared/design/STACK.md` (read from the public tt-operator,
//! tt-telemetry and tt-fabric-manager charts); the real charts cannot be
//! reached from CI.
//!
//! Their pods run only on the test's nodes (nodeSelector on the test label),
//! and hold the device the way the real ones do: `privileged: true`, no
//! hostPath of /dev/tenstorrent (pass 1 of the drain does not see them; the
//! simulated agent counts a privileged pod as a holder).

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec};
use k8s_openapi::api::core::v1::{
    Affinity, Container, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    PodSpec, PodTemplateSpec, SecurityContext,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::Api;
use kube::api::PostParams;

use crate::cluster::{TEST_LABEL, TestEnv};

/// The telemetry chart's gate (its default, in both arms of its node
/// selection).
pub const TELEMETRY_GATE: &str = "tenstorrent.com/deploy.tt-telemetry";
/// The fabric manager's gate (0.2.29 and later; 0.2.28 ships none).
pub const FABRIC_MANAGER_GATE: &str = "tenstorrent.com/deploy.tt-fabric-manager";

fn not_false(key: &str) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: key.into(),
        operator: "NotIn".into(),
        values: Some(vec!["false".into()]),
    }
}

/// A privileged DaemonSet `name` on the test's nodes whose required node
/// affinity has one term per entry of `terms`, each `<gate> NotIn ["false"]`
/// (and the term's own extra requirements).
fn privileged_daemon_set(
    test_id: &str,
    name: &str,
    gate: Option<&str>,
    terms: Vec<Vec<NodeSelectorRequirement>>,
) -> DaemonSet {
    let labels = BTreeMap::from([("app.kubernetes.io/name".to_string(), name.to_string())]);
    let terms: Vec<NodeSelectorTerm> = terms
        .into_iter()
        .map(|mut extra| {
            if let Some(g) = gate {
                extra.insert(0, not_false(g));
            }
            NodeSelectorTerm {
                match_expressions: Some(extra),
                ..Default::default()
            }
        })
        .collect();
    let affinity = (!terms.is_empty()).then(|| Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: terms,
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    let mut meta_labels = BTreeMap::from([(TEST_LABEL.to_string(), test_id.to_string())]);
    meta_labels.extend(labels.clone());
    DaemonSet {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(meta_labels),
            ..Default::default()
        },
        spec: Some(DaemonSetSpec {
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    // On Tenstorrent nodes only, as the real charts select
                    // them (NFD's PCI vendor label).
                    node_selector: Some(BTreeMap::from([
                        (TEST_LABEL.to_string(), test_id.to_string()),
                        (
                            ttdrv_api::labels::TT_PCI_PRESENT.to_string(),
                            "true".to_string(),
                        ),
                    ])),
                    affinity,
                    containers: vec![Container {
                        name: "main".into(),
                        image: Some("busybox".into()),
                        security_context: Some(SecurityContext {
                            privileged: Some(true),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The tt-telemetry collector (STACK.md, "Who holds the device"): opens
/// `/dev/tenstorrent/*` at start-up and holds it for its pod's life through
/// `privileged: true`; stood down by `tenstorrent.com/deploy.tt-telemetry
/// NotIn ["false"]`, which the chart puts in both arms of its node-selection
/// OR (two terms here, the second with a requirement every node meets).
pub fn telemetry_collector(test_id: &str, name: &str) -> DaemonSet {
    let any_node = NodeSelectorRequirement {
        key: "kubernetes.io/hostname".into(),
        operator: "Exists".into(),
        values: None,
    };
    privileged_daemon_set(
        test_id,
        name,
        Some(TELEMETRY_GATE),
        vec![vec![], vec![any_node]],
    )
}

/// The tt-fabric-manager 0.2.29+ per-node agent (STACK.md): reads the local
/// card topology, holding the device for its pod's life through
/// `privileged: true`; stood down by `tenstorrent.com/deploy.tt-fabric-manager
/// NotIn ["false"]` (the gate 0.2.29 ships, which the driver manager's
/// default `deployGates` lacks).
pub fn fabric_manager_agent(test_id: &str, name: &str) -> DaemonSet {
    privileged_daemon_set(test_id, name, Some(FABRIC_MANAGER_GATE), vec![vec![]])
}

/// The tt-fabric-manager 0.2.28 (and earlier) agent: the same holder, with no
/// gate at all (STACK.md: "on 0.2.28 and earlier no gate ships").
pub fn ungated_fabric_manager_agent(test_id: &str, name: &str) -> DaemonSet {
    privileged_daemon_set(test_id, name, None, vec![])
}

/// Creates `ds` in `namespace`.
pub async fn create(env: &TestEnv, namespace: &str, ds: &DaemonSet) {
    let api: Api<DaemonSet> = Api::namespaced(env.client.clone(), namespace);
    if let Err(e) = api.create(&PostParams::default(), ds).await {
        panic!(
            "creating DaemonSet {}: {e}",
            ds.metadata.name.as_deref().unwrap_or_default()
        );
    }
}
