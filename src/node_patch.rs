//! The merge patches the controller sends to Nodes. Each patch carries the
//! record together with the cordon or gate change it accompanies, so the two
//! are written together or not at all.

use k8s_openapi::api::core::v1::Node;
use ttdrv_api::labels;
use ttdrv_core::machine::{Command, NodeRecord};

use crate::observe::persisted_record;
use crate::{Error, Result};

/// The deploy-gate labels a cycle sets, for every kind's cycles: closed is
/// `false` (the gated DaemonSets stand down), open is no label (they come
/// back).
pub fn gate_labels(
    gates: &[String],
    open: bool,
) -> impl Iterator<Item = (&str, serde_json::Value)> {
    gates.iter().map(move |g| {
        let v = if open {
            serde_json::Value::Null
        } else {
            "false".into()
        };
        (g.as_str(), v)
    })
}

/// Persists `record` together with the node-level commands of its step
/// (cordon, uncordon, gates); the other commands act on pods, after it.
///
/// The go-ahead for a module swap travels with the record: present exactly
/// while the record says this node is in Upgrading after cordon and drain
/// (or with drain disabled), for this cycle; removed by any other record.
/// So the agent's second key can never outlive or precede the cycle.
pub fn record_patch(
    node: &str,
    record: &NodeRecord,
    commands: &[Command],
    gates: &[String],
) -> Result<serde_json::Value> {
    let rec = serde_json::to_string(record).map_err(|source| Error::Serialize {
        what: "node record",
        source,
    })?;
    let go_ahead = ttdrv_core::go_ahead::for_record(node, record)
        .map(|g| {
            serde_json::to_string(&g).map_err(|source| Error::Serialize {
                what: "go-ahead",
                source,
            })
        })
        .transpose()?;
    let mut labels_patch = serde_json::Map::new();
    // The verdict on a swap travels with the record too: present exactly
    // while the record gives it ([`NodeRecord::rollback_at`]).
    let verdict = record
        .rollback_at
        .filter(|_| record.state == ttdrv_api::NodeState::Upgrading)
        .and(record.started)
        .map(|cycle| cycle.to_string());
    let mut patch = serde_json::json!({ "metadata": { "annotations": {
        labels::UPGRADE_STATE: rec,
        labels::GO_AHEAD: go_ahead,
        labels::ROLLBACK_VERDICT: verdict,
    } } });
    for c in commands {
        match c {
            Command::Cordon => patch["spec"] = serde_json::json!({ "unschedulable": true }),
            Command::Uncordon => {
                patch["spec"] = serde_json::json!({ "unschedulable": false });
                // The marks of an inherited cordon go with it.
                for k in labels::INHERITED_CORDON_MARKS {
                    patch["metadata"]["annotations"][k] = serde_json::Value::Null;
                }
            }
            Command::CloseGates | Command::OpenGates => labels_patch.extend(
                gate_labels(gates, *c == Command::OpenGates).map(|(k, v)| (k.to_string(), v)),
            ),
            Command::Vacate => vacate(&mut patch, &mut labels_patch, &record.policy),
            Command::Evict
            | Command::RestartPublishers(_)
            | Command::DeleteInstallerPod
            | Command::RunValidationPod
            | Command::DeleteValidationPod => {}
        }
    }
    if !labels_patch.is_empty() {
        patch["metadata"]["labels"] = serde_json::Value::Object(labels_patch);
    }
    Ok(patch)
}

/// The driver labels the agent writes, removed when a node is vacated.
pub const DRIVER_LABELS: [&str; 7] = [
    labels::KMD_VERSION,
    labels::KMD_BOOT_ID,
    labels::INSTALL_MODE,
    labels::TT_SMI_VERSION,
    labels::KMD_PREPARED,
    labels::KMD_NEXT_KERNEL_FAILED,
    labels::KMD_CARDS,
];

/// The driver annotations the agent writes, removed when a node is vacated.
pub const DRIVER_ANNOTATIONS: [&str; 2] = [labels::KMD_PARAMETERS, labels::KMD_HOST_OPTIONS];

/// The end of a vacate cycle: no record, no go-ahead, none of our driver
/// labels; the `unmanaged` label keeps the node out of the policy's
/// DaemonSet and tells a restarted controller to leave it alone. (The claim
/// stays: no other policy's installer lands there while this one exists.)
fn vacate(
    patch: &mut serde_json::Value,
    labels_patch: &mut serde_json::Map<String, serde_json::Value>,
    policy: &str,
) {
    let ann = &mut patch["metadata"]["annotations"];
    ann[labels::UPGRADE_STATE] = serde_json::Value::Null;
    ann[labels::GO_AHEAD] = serde_json::Value::Null;
    ann[labels::ROLLBACK_VERDICT] = serde_json::Value::Null;
    // The agent's reports go with its labels.
    for a in DRIVER_ANNOTATIONS {
        ann[a] = serde_json::Value::Null;
    }
    for l in DRIVER_LABELS {
        labels_patch.insert(l.to_string(), serde_json::Value::Null);
    }
    labels_patch.insert(labels::UNMANAGED.to_string(), policy.into());
}

/// Removes `policy`'s `unmanaged` mark from a node it manages again.
pub fn unmark_patch() -> serde_json::Value {
    serde_json::json!({ "metadata": { "labels": { labels::UNMANAGED: null } } })
}

/// Claims a node for `policy`: the policy's DaemonSet requires the claim.
pub fn claim_patch(policy: &str) -> serde_json::Value {
    serde_json::json!({ "metadata": { "labels": { labels::CLAIM: policy } } })
}

/// Removes `policy`'s claim from a node it no longer owns, undoing our cordon
/// and gates if a cycle was cut short (node relabelled or skipped mid-upgrade).
///
/// Carries the node's `resourceVersion` as a precondition: the release was
/// decided on that version of the Node, and if another policy has claimed it
/// (and cordoned it for its own cycle) since, the API server refuses the
/// patch (409) instead of undoing the newcomer's cordon; the next pass
/// decides again on the fresh Node.
pub fn release_patch(node: &Node, policy: &str, gates: &[String]) -> serde_json::Value {
    let mut patch = serde_json::json!({ "metadata": {
        "labels": { labels::CLAIM: null },
        // The verdict goes with the cycle it names: left behind, it would
        // roll back the next policy's swap on the same agent record.
        "annotations": {
            labels::UPGRADE_STATE: null,
            labels::GO_AHEAD: null,
            labels::ROLLBACK_VERDICT: null,
        },
    } });
    if let Some(rv) = &node.metadata.resource_version {
        patch["metadata"]["resourceVersion"] = rv.as_str().into();
    }
    // Vacated by this policy: the mark goes with the policy.
    if ttdrv_core::node::label(node, labels::UNMANAGED) == Some(policy) {
        patch["metadata"]["labels"][labels::UNMANAGED] = serde_json::Value::Null;
    }
    // A cordon a firmware policy handed to this one, not yet taken up by
    // its cycle: ours to undo all the same.
    let handed_over = ttdrv_core::node::handed_over_to(node) == Some(policy)
        && ttdrv_core::node::unschedulable(node);
    let rec = persisted_record(node).filter(|r| r.policy == policy);
    if handed_over || rec.as_ref().is_some_and(NodeRecord::cordoned_by_us) {
        patch["spec"] = serde_json::json!({ "unschedulable": false });
        for k in labels::INHERITED_CORDON_MARKS {
            patch["metadata"]["annotations"][k] = serde_json::Value::Null;
        }
    }
    if let Some(rec) = rec
        && (rec.state.is_in_progress() || rec.state.is_failed())
    {
        for g in gates {
            patch["metadata"]["labels"][g] = serde_json::Value::Null;
        }
    }
    patch
}

#[cfg(test)]
mod tests {
    use super::*;
    use ttdrv_api::NodeState;
    use ttdrv_core::go_ahead::GoAhead;
    use ttdrv_core::machine::Cordon;

    const GATE: &str = "tenstorrent.com/deploy.tt-telemetry";

    #[test]
    fn cordon_and_record_travel_in_one_patch() {
        let mut r = NodeRecord::new("fleet", "2.8.0", 1);
        r.state = NodeState::Cordoning;
        let gates = vec![GATE.to_string()];
        let p =
            record_patch("n1", &r, &[Command::Cordon, Command::CloseGates], &gates).expect("patch");
        assert_eq!(p["spec"]["unschedulable"], true);
        assert_eq!(p["metadata"]["labels"][GATE], "false");
        let rec: NodeRecord = serde_json::from_str(
            p["metadata"]["annotations"][labels::UPGRADE_STATE]
                .as_str()
                .expect("string"),
        )
        .expect("record parses");
        assert_eq!(rec, r);
        let p = record_patch("n1", &r, &[Command::Uncordon, Command::OpenGates], &gates)
            .expect("patch");
        assert_eq!(p["spec"]["unschedulable"], false);
        assert!(p["metadata"]["labels"][GATE].is_null());
        // The Go operator's marks of a cordon go with the uncordon.
        let ann = p["metadata"]["annotations"]
            .as_object()
            .expect("annotations");
        for k in labels::INHERITED_CORDON_MARKS {
            assert!(ann.get(k).is_some_and(serde_json::Value::is_null), "{k}");
        }
        let p = record_patch("n1", &r, &[Command::Evict], &gates).expect("patch");
        assert!(
            p.get("spec").is_none(),
            "eviction does not touch the node spec"
        );
    }

    #[test]
    fn the_rollback_verdict_travels_with_the_record() {
        let mut r = NodeRecord::new("fleet", "2.8.0", 1);
        r.state = NodeState::Upgrading;
        r.started = Some(900);
        let verdict = |r: &NodeRecord| {
            let p = record_patch("n1", r, &[], &[]).expect("patch");
            p["metadata"]["annotations"][labels::ROLLBACK_VERDICT].clone()
        };
        assert!(verdict(&r).is_null(), "no verdict: removed");
        r.rollback_at = Some(1302);
        assert_eq!(verdict(&r), "900", "the cycle it names");
        // Any other state removes it (the cycle went on).
        r.state = NodeState::Uncordoning;
        assert!(verdict(&r).is_null());
    }

    fn node_with(r: &NodeRecord) -> Node {
        let mut n = Node::default();
        n.metadata.annotations = Some(
            [(
                labels::UPGRADE_STATE.to_string(),
                serde_json::to_string(r).expect("record"),
            )]
            .into(),
        );
        n
    }

    #[test]
    fn release_undoes_only_our_cordon_and_an_unfinished_cycle() {
        let gates = vec![GATE.to_string()];
        let mut r = NodeRecord::new("fleet", "2.8.0", 1);
        r.state = NodeState::Draining;
        for (cordon, uncordons) in [
            (Cordon::Ours, true),
            (Cordon::Theirs, false),
            (Cordon::None, false),
        ] {
            r.cordon = cordon;
            let p = release_patch(&node_with(&r), "fleet", &gates);
            assert_eq!(p.get("spec").is_some(), uncordons, "{cordon:?}");
            assert!(p["metadata"]["labels"][GATE].is_null());
            assert!(
                p["metadata"]["labels"]
                    .as_object()
                    .is_some_and(|l| l.contains_key(GATE))
            );
        }
        // A verdict on a rollback goes with the cycle it names.
        let p = release_patch(&node_with(&r), "fleet", &gates);
        let ann = &p["metadata"]["annotations"];
        assert!(
            ann.get(labels::ROLLBACK_VERDICT)
                .is_some_and(serde_json::Value::is_null),
            "{ann}"
        );
        // Another policy's record: only our claim goes.
        r.cordon = Cordon::Ours;
        let p = release_patch(&node_with(&r), "other", &gates);
        assert!(p.get("spec").is_none());
        assert!(
            !p["metadata"]["labels"]
                .as_object()
                .is_some_and(|l| l.contains_key(GATE))
        );
        // A finished cycle leaves other gates alone.
        r.state = NodeState::Done;
        r.cordon = Cordon::None;
        let p = release_patch(&node_with(&r), "fleet", &gates);
        assert!(
            !p["metadata"]["labels"]
                .as_object()
                .is_some_and(|l| l.contains_key(GATE))
        );
    }

    #[test]
    fn release_undoes_a_cordon_handed_over_and_not_yet_taken_up() {
        let r = NodeRecord::new("fleet", "2.8.0", 1);
        let mut n = node_with(&r);
        n.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
            unschedulable: Some(true),
            ..Default::default()
        });
        let ann = n.metadata.annotations.get_or_insert_with(Default::default);
        ann.insert(labels::GO_CORDONED_BY.into(), "fleet".into());
        ann.insert(labels::CORDON_HANDED_OVER_BY.into(), "fw".into());
        let p = release_patch(&n, "fleet", &[]);
        assert_eq!(p["spec"]["unschedulable"], false);
        for k in labels::INHERITED_CORDON_MARKS {
            assert!(p["metadata"]["annotations"][k].is_null(), "{k}");
        }
        // Handed to another policy: not this one's to undo.
        assert!(release_patch(&n, "other", &[]).get("spec").is_none());
    }

    #[test]
    fn vacate_clears_what_we_wrote_and_marks_the_node() {
        let gates = vec![GATE.to_string()];
        let mut r = NodeRecord::new("fleet", "2.8.0", 1);
        r.state = NodeState::Unloading;
        r.started = Some(5);
        let p = record_patch("n1", &r, &[], &gates).expect("patch");
        let go: GoAhead = serde_json::from_str(
            p["metadata"]["annotations"][labels::GO_AHEAD]
                .as_str()
                .expect("a go-ahead while Unloading"),
        )
        .expect("parses");
        assert!(go.unload && go.cycle == 5);
        r.state = NodeState::Unmanaged;
        let p = record_patch(
            "n1",
            &r,
            &[Command::Uncordon, Command::OpenGates, Command::Vacate],
            &gates,
        )
        .expect("patch");
        assert_eq!(p["spec"]["unschedulable"], false);
        let ann = p["metadata"]["annotations"]
            .as_object()
            .expect("annotations");
        for k in [
            labels::UPGRADE_STATE,
            labels::GO_AHEAD,
            labels::ROLLBACK_VERDICT,
        ]
        .iter()
        .chain(DRIVER_ANNOTATIONS.iter())
        {
            assert!(ann.get(*k).is_some_and(serde_json::Value::is_null), "{k}");
        }
        let l = p["metadata"]["labels"].as_object().expect("labels");
        for k in DRIVER_LABELS.iter().chain([&GATE]) {
            assert!(l.get(*k).is_some_and(serde_json::Value::is_null), "{k}");
        }
        assert_eq!(l.get(labels::UNMANAGED), Some(&"fleet".into()));
        assert!(!l.contains_key(labels::CLAIM), "the claim stays");
        // Deleting the policy releases the node and its mark.
        let mut n = Node::default();
        n.metadata.labels = Some([(labels::UNMANAGED.to_string(), "fleet".to_string())].into());
        let p = release_patch(&n, "fleet", &gates);
        assert!(p["metadata"]["labels"][labels::UNMANAGED].is_null());
        assert!(
            p["metadata"]["labels"]
                .as_object()
                .is_some_and(|l| l.contains_key(labels::UNMANAGED))
        );
        let p = release_patch(&n, "other", &gates);
        assert!(
            !p["metadata"]["labels"]
                .as_object()
                .is_some_and(|l| l.contains_key(labels::UNMANAGED))
        );
    }
}
