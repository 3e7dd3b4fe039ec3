//! What a Node says, read the same way by every program: readiness, whether it
//! is out of service for a reason that is not ours, its driver labels, the
//! upgrade record we persisted on it, and an operator's retry request.

use k8s_openapi::api::core::v1::{Node, Pod};
use ttdrv_api::labels;

use crate::machine::NodeRecord;

/// Annotation an operator sets (to any new value) to retry a Failed node.
pub const RETRY_ANNOTATION: &str = "driver.tenstorrent.com/retry";

/// A label's value, if the node carries it.
pub fn label<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

/// An annotation's value, if the node carries it.
pub fn annotation<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// The kubelet reports the node Ready (`Unknown` and a missing condition are not).
pub fn ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// `spec.unschedulable`: cordoned, by anyone.
pub fn unschedulable(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

/// Out of service for a reason that is not our rollout: NotReady, or cordoned
/// when we did not cordon it.
pub fn externally_unavailable(node: &Node, cordoned_by_us: bool) -> bool {
    !ready(node) || (unschedulable(node) && !cordoned_by_us)
}

/// The upgrade record persisted on the node, if it has a readable one.
pub fn record(node: &Node) -> Result<Option<NodeRecord>, serde_json::Error> {
    annotation(node, labels::UPGRADE_STATE)
        .map(serde_json::from_str)
        .transpose()
}

/// The node's retry token (value of [`RETRY_ANNOTATION`]).
pub fn retry_token(node: &Node) -> Option<&str> {
    annotation(node, RETRY_ANNOTATION)
}

/// Merge patch that asks the controller to retry a Failed node.
pub fn retry_patch(token: &str) -> serde_json::Value {
    serde_json::json!({ "metadata": { "annotations": { RETRY_ANNOTATION: token } } })
}

/// The pod's Ready condition is True.
pub fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeSpec, NodeStatus};

    fn node(ready: &str, unschedulable: bool) -> Node {
        Node {
            spec: Some(NodeSpec {
                unschedulable: Some(unschedulable),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: ready.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn availability() {
        assert!(!externally_unavailable(&node("True", false), false));
        assert!(externally_unavailable(&node("False", false), false));
        assert!(
            externally_unavailable(&node("Unknown", false), true),
            "NotReady counts even when the cordon is ours"
        );
        assert!(externally_unavailable(&node("True", true), false));
        assert!(
            !externally_unavailable(&node("True", true), true),
            "our own cordon is not someone else's"
        );
        assert!(!ready(&Node::default()), "no condition is not Ready");
    }

    #[test]
    fn unreadable_record_is_an_error_not_a_default() {
        let mut n = Node::default();
        assert!(matches!(record(&n), Ok(None)));
        n.metadata.annotations =
            Some([(labels::UPGRADE_STATE.to_string(), "{not json".to_string())].into());
        assert!(record(&n).is_err());
    }
}
