//! A fake of the agent's own Node for tests: records label and annotation
//! patches, serves a scripted sequence of Nodes; and Nodes carrying the
//! controller's upgrade record and go-ahead. Behind the `fake` feature.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Node;
use ttdrv_api::{NodeState, labels};
use ttdrv_core::go_ahead::GoAhead;
use ttdrv_core::machine::{Cordon, NodeRecord};

use super::{LabelChanges, NodeApi};

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
