//! The merge patches the firmware controller sends to Nodes: a step's record
//! with its cordon, uncordon or hand-over and the Go annotations, and the
//! release of a stray record. Each carries what it was decided on (the
//! Node's `resourceVersion`) where a later write would make it stale.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use ttdrv_api::firmware::{FirmwareNodeState, job_name_for, labels as fw};
use ttdrv_core::firmware::{Command, Step};

use super::clock::{now_secs, rfc3339};

/// The patch of one step: the record, the state label, the owner label, and
/// the cordon or uncordon with the Go controller's cordon marks; the Go
/// annotations of a flash and of a verified readback.
pub(super) fn node_patch(
    node: &Node,
    next: &Step,
    version: &str,
    gates: &[String],
    precondition: bool,
) -> serde_json::Value {
    let r = &next.record;
    let mut ann: BTreeMap<&str, serde_json::Value> = BTreeMap::new();
    ann.insert(
        fw::RECORD,
        serde_json::to_string(r).unwrap_or_default().into(),
    );
    let mut labels: BTreeMap<&str, serde_json::Value> = BTreeMap::new();
    labels.insert(fw::UPGRADE_STATE, r.state.as_str().into());
    labels.insert(fw::OWNED_BY, r.policy.clone().into());
    let mut patch = serde_json::json!({});
    for c in &next.commands {
        match c {
            Command::Cordon => {
                patch["spec"] = serde_json::json!({ "unschedulable": true });
                ann.insert(fw::CORDONED_BY, r.policy.clone().into());
                ann.insert(
                    fw::CORDONED_AT,
                    rfc3339(now_secs())
                        .map(|t| t.0.to_string())
                        .unwrap_or_default()
                        .into(),
                );
            }
            Command::Uncordon => {
                patch["spec"] = serde_json::json!({ "unschedulable": false });
                ann.insert(fw::CORDONED_BY, serde_json::Value::Null);
                ann.insert(fw::CORDONED_AT, serde_json::Value::Null);
            }
            Command::CreateJob => {
                ann.insert(fw::DESIRED_VERSION, version.into());
                ann.insert(
                    fw::LAST_FLASH_JOB,
                    job_name_for(
                        &r.policy,
                        node.metadata.name.as_deref().unwrap_or_default(),
                        version,
                        r.attempt,
                    )
                    .into(),
                );
            }
            Command::HandOver(driver) => {
                // The cordon stays; its marks now name the driver policy,
                // whose cycle takes it up and undoes it.
                ann.insert(fw::CORDONED_BY, serde_json::Value::Null);
                ann.insert(fw::CORDONED_AT, serde_json::Value::Null);
                ann.insert(ttdrv_api::labels::GO_CORDONED_BY, driver.clone().into());
                ann.insert(
                    ttdrv_api::labels::GO_CORDONED_AT,
                    rfc3339(now_secs())
                        .map(|t| t.0.to_string())
                        .unwrap_or_default()
                        .into(),
                );
                ann.insert(
                    ttdrv_api::labels::CORDON_HANDED_OVER_BY,
                    r.policy.clone().into(),
                );
            }
            // The deploy gates, as the driver's cycles set them.
            Command::CloseGates => labels.extend(crate::node_patch::gate_labels(gates, false)),
            Command::OpenGates => labels.extend(crate::node_patch::gate_labels(gates, true)),
            Command::Evict | Command::RestartPublishers(_) => {}
        }
    }
    if r.state == FirmwareNodeState::Done
        && let Some(v) = &r.current
    {
        labels.insert(fw::FW_VERSION, v.clone().into());
        ann.insert(fw::CURRENT_VERSION, v.clone().into());
    }
    patch["metadata"] = serde_json::json!({ "annotations": ann, "labels": labels });
    if precondition && let Some(rv) = &node.metadata.resource_version {
        // The cycle was decided on this version of the Node (no driver
        // cycle on it): a write since then makes the decision stale.
        patch["metadata"]["resourceVersion"] = rv.clone().into();
    }
    patch
}

/// Removes a firmware policy's record and marks from a node (and its
/// cordon, with the deploy gates its drained cycle closed), decided on this
/// version of the Node.
pub(super) fn release_patch(
    node: &Node,
    policy: &str,
    uncordon: bool,
    gates: &[String],
) -> serde_json::Value {
    let null = serde_json::Value::Null;
    let mut patch = serde_json::json!({ "metadata": {
        "annotations": { fw::RECORD: null },
        "labels": { fw::UPGRADE_STATE: null },
    } });
    let ann = |k: &str| ttdrv_core::node::annotation(node, k);
    if ttdrv_core::node::label(node, fw::OWNED_BY) == Some(policy) {
        patch["metadata"]["labels"][fw::OWNED_BY] = null.clone();
    }
    if uncordon {
        patch["spec"] = serde_json::json!({ "unschedulable": false });
        for g in gates {
            if ttdrv_core::node::label(node, g) == Some("false") {
                patch["metadata"]["labels"][g.as_str()] = null.clone();
            }
        }
    }
    if uncordon || ann(fw::CORDONED_BY) == Some(policy) {
        patch["metadata"]["annotations"][fw::CORDONED_BY] = null.clone();
        patch["metadata"]["annotations"][fw::CORDONED_AT] = null;
    }
    if let Some(rv) = &node.metadata.resource_version {
        patch["metadata"]["resourceVersion"] = rv.clone().into();
    }
    patch
}

#[cfg(test)]
mod tests {
    use super::*;
    use ttdrv_core::firmware::FwRecord;
    use ttdrv_core::machine::Cordon;

    #[test]
    fn the_deploy_gates_close_with_the_cordon_and_open_with_the_uncordon() {
        let gates = vec![
            "tenstorrent.com/deploy.tt-telemetry".to_string(),
            "tenstorrent.com/deploy.tt-fabric-manager".to_string(),
        ];
        let rec = FwRecord::new("fw", "19.8.0", 0);
        let node = Node::default();
        let with = |commands| Step {
            record: rec.clone(),
            commands,
            needs_slot: false,
        };
        let p = node_patch(
            &node,
            &with(vec![Command::Cordon, Command::CloseGates]),
            "19.8.0",
            &gates,
            false,
        );
        assert_eq!(p["spec"]["unschedulable"], true);
        for g in &gates {
            assert_eq!(p["metadata"]["labels"][g.as_str()], "false", "{p}");
        }
        let p = node_patch(
            &node,
            &with(vec![Command::Uncordon, Command::OpenGates]),
            "19.8.0",
            &gates,
            false,
        );
        assert_eq!(p["spec"]["unschedulable"], false);
        for g in &gates {
            let labels = p["metadata"]["labels"]
                .as_object()
                .cloned()
                .unwrap_or_default();
            assert!(labels.get(g.as_str()).is_some_and(|v| v.is_null()), "{p}");
        }
    }

    #[test]
    fn a_hand_over_keeps_the_cordon_and_names_the_driver_policy() {
        let mut rec = FwRecord::new("fw", "19.8.0", 0);
        rec.state = FirmwareNodeState::Done;
        rec.cordon = Cordon::None;
        rec.current = Some("19.8.0.0".into());
        let mut node = Node::default();
        node.metadata.resource_version = Some("7".into());
        let next = Step {
            record: rec,
            commands: vec![Command::HandOver("fleet".into())],
            needs_slot: false,
        };
        let p = node_patch(&node, &next, "19.8.0", &[], true);
        assert!(p.get("spec").is_none(), "the cordon stays: {p}");
        let ann = &p["metadata"]["annotations"];
        assert!(ann[fw::CORDONED_BY].is_null() && ann[fw::CORDONED_AT].is_null());
        assert_eq!(ann[ttdrv_api::labels::GO_CORDONED_BY], "fleet");
        assert_eq!(ann[ttdrv_api::labels::CORDON_HANDED_OVER_BY], "fw");
        assert!(ann[ttdrv_api::labels::GO_CORDONED_AT].is_string());
        assert_eq!(p["metadata"]["labels"][fw::FW_VERSION], "19.8.0.0");
        assert_eq!(
            p["metadata"]["resourceVersion"], "7",
            "decided on this Node"
        );
    }
}
