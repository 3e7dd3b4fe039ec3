//! What the caches say about one owned node: the reflector stores read into
//! the plain facts [`ttdrv_core::observe`] decides on. Reads the stores only
//! (no client), so it is tested with stores fed by hand.

use std::cell::{OnceCell, RefCell};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::runtime::reflector::ObjectRef;
use ttdrv_core::drain::PodFacts;
use ttdrv_core::machine::NodeRecord;
pub use ttdrv_core::observe::{NodeFacts, NodeView, PolicyFacts};
use ttdrv_core::{node, observe, prepare};

use crate::runtime::context::Stores;

/// Everything a pass knows before it looks at its nodes.
pub struct ObserveInput<'a> {
    pub stores: &'a Stores,
    pub policy: PolicyFacts<'a>,
    /// Records the NodeActors handed back: fresher than the Nodes' annotations.
    pub records: &'a HashMap<String, NodeRecord>,
    /// PDBs, read once per pass and only if a node drains.
    pub pdbs: OnceCell<Vec<Arc<PodDisruptionBudget>>>,
    /// The nodes read from the caches so far, each once
    /// (`ttdriver_reconcile_nodes_examined`).
    pub examined: RefCell<HashSet<String>>,
}

impl ObserveInput<'_> {
    /// Observes `name` ([`observe::observe`]), or `None` when the node is not
    /// in the cache.
    pub fn node(&self, name: &str, starting: bool) -> Option<NodeView> {
        self.with_facts(name, |facts| {
            observe::observe(&self.policy, facts, starting, || {
                self.pdbs
                    .get_or_init(|| self.stores.pdbs.state())
                    .iter()
                    .map(Arc::as_ref)
                    .collect()
            })
        })
    }

    /// The node's build-ahead facts ([`observe::prepare_candidate`]).
    pub fn prepare_candidate(&self, name: &str) -> Option<((bool, String), prepare::Candidate)> {
        self.with_facts(name, |facts| {
            observe::prepare_candidate(&self.policy, facts)
        })?
    }

    /// `f` on what the caches hold of `name`; `None` when it holds no Node.
    fn with_facts<T>(&self, name: &str, f: impl FnOnce(&NodeFacts<'_>) -> T) -> Option<T> {
        let node = self.stores.nodes.get(&ObjectRef::new(name))?;
        if !self.examined.borrow().contains(name) {
            self.examined.borrow_mut().insert(name.to_string());
        }
        let pods = self.stores.pods.on_node(name);
        let facts: Vec<&PodFacts> = pods.facts.iter().map(Arc::as_ref).collect();
        let installers: Vec<&Pod> = pods.installers.iter().map(Arc::as_ref).collect();
        let on_node = persisted_record(&node);
        Some(f(&NodeFacts {
            node: &node,
            on_node: on_node.as_ref(),
            pods: &facts,
            installers: &installers,
            live: self.records.get(name),
            restart_baselines: &pods.restart_baselines,
            dra_devices: self.stores.slices.devices_on(name),
        }))
    }
}

/// The record persisted on the Node; an unreadable one is logged and treated
/// as absent (the node then starts from Pending, with its cordon seen afresh).
pub fn persisted_record(node: &Node) -> Option<NodeRecord> {
    match node::record(node) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(node = node.metadata.name.as_deref().unwrap_or(""), error = %e, "ignoring unreadable upgrade record");
            None
        }
    }
}

#[cfg(test)]
mod tests;
