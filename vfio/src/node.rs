//! The binder's report on its own Node: the [`PCI_FUNCTIONS`] annotation and
//! the [`BOARD_TYPES`] label of [`ttdrv_api::vfio`], merge-patched only when
//! they change; a failed patch is retried at the next pass.

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use ttdrv_api::vfio::{BOARD_TYPES, PCI_FUNCTIONS};

use crate::error::{Result, VfioError};

/// The annotation's value and the label's (None: no label).
pub type Report = (String, Option<String>);

/// The JSON merge patch of a report.
pub fn patch_of(report: &Report) -> serde_json::Value {
    json!({"metadata": {
        "annotations": {PCI_FUNCTIONS: report.0},
        "labels": {BOARD_TYPES: report.1},
    }})
}

pub struct NodeReporter {
    api: Api<Node>,
    node: String,
    last: Option<Report>,
}

impl NodeReporter {
    /// With the in-cluster (or kubeconfig) configuration.
    pub async fn connect(node: String) -> Result<NodeReporter> {
        let client = kube::Client::try_default()
            .await
            .map_err(|e| VfioError::Node {
                node: node.clone(),
                reason: format!("cannot configure a Kubernetes client: {e}"),
            })?;
        Ok(NodeReporter {
            api: Api::all(client),
            node,
            last: None,
        })
    }

    /// Patches the Node when the report differs from the last one sent.
    pub async fn report(&mut self, report: Report) -> Result<()> {
        if self.last.as_ref() == Some(&report) {
            return Ok(());
        }
        self.api
            .patch(
                &self.node,
                &PatchParams::default(),
                &Patch::Merge(&patch_of(&report)),
            )
            .await
            .map_err(|e| VfioError::Node {
                node: self.node.clone(),
                reason: e.to_string(),
            })?;
        tracing::info!(node = %self.node, annotation = %report.0, label = ?report.1, "reported on the node");
        self.last = Some(report);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_patch_sets_the_annotation_and_sets_or_removes_the_label() {
        let p = patch_of(&("{}".into(), Some("n150".into())));
        assert_eq!(p["metadata"]["annotations"][PCI_FUNCTIONS], "{}");
        assert_eq!(p["metadata"]["labels"][BOARD_TYPES], "n150");
        let p = patch_of(&("{}".into(), None));
        assert!(
            p["metadata"]["labels"][BOARD_TYPES].is_null(),
            "null removes the label in a merge patch"
        );
    }
}
