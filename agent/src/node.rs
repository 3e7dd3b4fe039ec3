//! The agent's view of the cluster: its own Node (read for the controller's
//! go-ahead, labelled with what the host runs), and pod names for the pod UIDs
//! found in holders' cgroups. Behind a trait for tests.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};

/// Labels to set (`Some`) or remove (`None`).
pub type LabelChanges = BTreeMap<String, Option<String>>;

pub trait NodeApi {
    /// Name of the node patched, for logs and errors.
    fn node_name(&self) -> &str;
    /// This node as the API server has it now (one attempt: the caller polls).
    fn get(&self) -> Result<Node, String>;
    /// Merge-patches the labels of this node only.
    fn label(&self, labels: &LabelChanges) -> Result<(), String>;
    /// Merge-patches the annotations of this node only (the agent's own:
    /// [`ttdrv_api::labels::KMD_PARAMETERS`], [`ttdrv_api::labels::KMD_HOST_OPTIONS`]).
    fn annotate(&self, annotations: &LabelChanges) -> Result<(), String>;
    /// `uid -> namespace/name` of the pods on this node; best effort.
    fn pod_names(&self) -> HashMap<String, String>;
}

/// Used when NODE_NAME is not set (e.g. running by hand on a host or in the
/// VM test): labelling is logged and skipped.
#[derive(Debug, Default)]
pub struct NoNode;

impl NodeApi for NoNode {
    fn node_name(&self) -> &str {
        "(none)"
    }
    fn get(&self) -> Result<Node, String> {
        Err("NODE_NAME is not set, so there is no Node to read a go-ahead from".to_string())
    }
    fn label(&self, labels: &LabelChanges) -> Result<(), String> {
        tracing::warn!(?labels, "NODE_NAME not set: not labelling any node");
        Ok(())
    }
    fn annotate(&self, annotations: &LabelChanges) -> Result<(), String> {
        tracing::warn!(?annotations, "NODE_NAME not set: not annotating any node");
        Ok(())
    }
    fn pod_names(&self) -> HashMap<String, String> {
        HashMap::new()
    }
}

/// Patches the Node named NODE_NAME through the API server, retrying with
/// exponential backoff. Owns a small tokio runtime so the agent stays synchronous.
pub struct KubeNode {
    rt: tokio::runtime::Runtime,
    client: kube::Client,
    node: String,
}

impl KubeNode {
    /// Connects with the in-cluster (or kubeconfig) configuration.
    pub fn connect(node: String) -> Result<Self, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start a tokio runtime: {e}"))?;
        let client = rt
            .block_on(kube::Client::try_default())
            .map_err(|e| format!("cannot configure a Kubernetes client: {e}"))?;
        Ok(KubeNode { rt, client, node })
    }

    fn backoff() -> ExponentialBuilder {
        ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(200))
            .with_max_delay(Duration::from_secs(5))
            .with_max_times(6)
    }
}

impl NodeApi for KubeNode {
    fn node_name(&self) -> &str {
        &self.node
    }

    fn get(&self) -> Result<Node, String> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        self.rt
            .block_on(nodes.get(&self.node))
            .map_err(|e| format!("cannot read Node {}: {e}", self.node))
    }

    fn label(&self, labels: &LabelChanges) -> Result<(), String> {
        self.patch(serde_json::json!({ "metadata": { "labels": labels } }))
    }

    fn annotate(&self, annotations: &LabelChanges) -> Result<(), String> {
        self.patch(serde_json::json!({ "metadata": { "annotations": annotations } }))
    }

    fn pod_names(&self) -> HashMap<String, String> {
        self.list_pod_names()
    }
}

impl KubeNode {
    /// Merge-patches this node, with retries.
    fn patch(&self, patch: serde_json::Value) -> Result<(), String> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node = self.node.as_str();
        let attempt = || async {
            nodes
                .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(|_| ())
        };
        self.rt
            .block_on(
                attempt
                    .retry(Self::backoff())
                    .sleep(tokio::time::sleep)
                    .notify(|e, after| {
                        tracing::warn!(error = %e, retry_in_ms = after.as_millis() as u64, "patching the node failed; retrying");
                    }),
            )
            .map_err(|e| e.to_string())
    }

    fn list_pod_names(&self) -> HashMap<String, String> {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let params = ListParams::default().fields(&format!("spec.nodeName={}", self.node));
        match self.rt.block_on(pods.list(&params)) {
            Ok(list) => list
                .items
                .into_iter()
                .filter_map(|p| {
                    let uid = p.metadata.uid?;
                    let name = p.metadata.name?;
                    let ns = p.metadata.namespace.unwrap_or_default();
                    Some((uid, format!("{ns}/{name}")))
                })
                .collect(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot list this node's pods to name device holders");
                HashMap::new()
            }
        }
    }
}

// Test fakes, kept out of the shipped lib and binary (and not re-exported
// here: the fake uses this module, so a re-export would be an import circle).
#[cfg(feature = "fake")]
pub mod fake;
