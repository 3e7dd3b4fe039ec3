//! The agent's view of the cluster: its own Node (read for the controller's
//! go-ahead, labelled with what the host runs), and pod names for the pod UIDs
//! found in holders' cgroups. Behind a trait for tests.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};
use ttdrv_api::{NodeState, labels};
use ttdrv_core::go_ahead::GoAhead;
use ttdrv_core::machine::{Cordon, NodeRecord};

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
    /// [`labels::KMD_PARAMETERS`], [`labels::KMD_HOST_OPTIONS`]).
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

/// Name of the Node a [`FakeNode`] stands for.
pub const FAKE_NODE: &str = "fake-node";

/// Records label calls; can be told to fail, to know some pods, and what its
/// Node looks like.
#[derive(Debug, Default)]
pub struct FakeNode {
    pub calls: Mutex<Vec<LabelChanges>>,
    /// Every annotation patch, in order.
    pub annotation_calls: Mutex<Vec<LabelChanges>>,
    pub pods: HashMap<String, String>,
    pub fail: bool,
    /// What successive GETs return, one each; the last one stays. Empty: the
    /// GET fails, as for a Node the API server does not have.
    pub nodes: Mutex<VecDeque<Node>>,
    pub gets: Mutex<u32>,
}

impl FakeNode {
    /// Records a write in `calls`; fails it when the fake API fails.
    fn record(
        &self,
        calls: &Mutex<Vec<LabelChanges>>,
        changes: &LabelChanges,
    ) -> Result<(), String> {
        if let Ok(mut c) = calls.lock() {
            c.push(changes.clone());
        }
        if self.fail {
            return Err("simulated API failure".to_string());
        }
        Ok(())
    }

    /// A node whose GETs return `node`.
    pub fn with(node: Node) -> Self {
        FakeNode {
            nodes: Mutex::new(VecDeque::from([node])),
            ..FakeNode::default()
        }
    }
    /// A node whose GETs return these, in turn (the last one stays).
    pub fn with_sequence(nodes: impl IntoIterator<Item = Node>) -> Self {
        FakeNode {
            nodes: Mutex::new(nodes.into_iter().collect()),
            ..FakeNode::default()
        }
    }
    /// From now on every GET returns `node`.
    pub fn set(&self, node: Node) {
        if let Ok(mut n) = self.nodes.lock() {
            *n = VecDeque::from([node]);
        }
    }
    pub fn calls(&self) -> Vec<LabelChanges> {
        self.calls.lock().map(|c| c.clone()).unwrap_or_default()
    }
    pub fn gets(&self) -> u32 {
        self.gets.lock().map(|g| *g).unwrap_or_default()
    }
    /// The annotations after every patch so far (a removal leaves `None`).
    pub fn annotations(&self) -> LabelChanges {
        let mut out = LabelChanges::new();
        for call in self
            .annotation_calls
            .lock()
            .map(|c| c.clone())
            .unwrap_or_default()
        {
            out.extend(call);
        }
        out
    }
    /// The labels after every patch so far, applied in order to no labels
    /// (a removal leaves `None`, so a test sees it was removed).
    pub fn labels(&self) -> LabelChanges {
        let mut out = LabelChanges::new();
        for call in self.calls() {
            out.extend(call);
        }
        out
    }
}

impl NodeApi for FakeNode {
    fn node_name(&self) -> &str {
        FAKE_NODE
    }
    fn get(&self) -> Result<Node, String> {
        if let Ok(mut g) = self.gets.lock() {
            *g += 1;
        }
        let mut nodes = self
            .nodes
            .lock()
            .map_err(|_| "fake node poisoned".to_string())?;
        match nodes.len() {
            0 => Err(format!("nodes \"{FAKE_NODE}\" not found")),
            1 => Ok(nodes[0].clone()),
            _ => nodes.pop_front().ok_or_else(|| "no node".to_string()),
        }
    }
    fn label(&self, labels: &LabelChanges) -> Result<(), String> {
        self.record(&self.calls, labels)
    }
    fn annotate(&self, annotations: &LabelChanges) -> Result<(), String> {
        self.record(&self.annotation_calls, annotations)
    }
    fn pod_names(&self) -> HashMap<String, String> {
        self.pods.clone()
    }
}

/// The policy the fake go-ahead names.
pub const FAKE_POLICY: &str = "fleet";
/// The cycle (start, Unix seconds) of the fake upgrade record.
pub const FAKE_CYCLE: i64 = 1_700_000_000;

/// The controller's record for a node it is upgrading to `target` under
/// `policy` (Upgrading, cycle [`FAKE_CYCLE`], cordoned and drained).
pub fn upgrading_record(policy: &str, target: &str) -> NodeRecord {
    let mut r = NodeRecord::new(policy, target, FAKE_CYCLE);
    r.state = NodeState::Upgrading;
    r.started = Some(FAKE_CYCLE);
    r.cordon = Cordon::Ours;
    r
}

/// Node [`FAKE_NODE`] carrying `record` and `go_ahead` as the controller
/// writes them.
pub fn node_with(record: Option<&NodeRecord>, go_ahead: Option<&GoAhead>) -> Node {
    let mut annotations = BTreeMap::new();
    if let Some(r) = record {
        annotations.insert(
            labels::UPGRADE_STATE.to_string(),
            serde_json::to_string(r).unwrap_or_default(),
        );
    }
    if let Some(g) = go_ahead {
        annotations.insert(
            labels::GO_AHEAD.to_string(),
            serde_json::to_string(g).unwrap_or_default(),
        );
    }
    let mut node = Node::default();
    node.metadata.name = Some(FAKE_NODE.to_string());
    node.metadata.annotations = Some(annotations);
    node
}

/// Node [`FAKE_NODE`] with a valid go-ahead to swap to `target` under `policy`.
pub fn go_ahead_node(policy: &str, target: &str) -> Node {
    let record = upgrading_record(policy, target);
    let go = GoAhead::for_cycle(FAKE_NODE, &record);
    node_with(Some(&record), go.as_ref())
}
