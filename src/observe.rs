//! What the caches say about one owned node, in the terms the state machine
//! and the rollout planner use: the [`Observation`] a NodeActor steps on, the
//! drain's next evictions, and the node's slot facts. Reads the reflector
//! stores only (no client), so it is tested with stores fed by hand.

use std::cell::OnceCell;
use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::runtime::reflector::ObjectRef;
use ttdrv_api::{NodeState, PodSelector, TenstorrentDriverPolicy, labels};
use ttdrv_core::drain::{self, DrainPass, PodRef};
use ttdrv_core::machine::{InstallerPod, NodeRecord, Observation};
use ttdrv_core::rollout::Candidate;
use ttdrv_core::{installer, node, prepare};

use crate::context::Stores;
use crate::pod_index::NodePods;

/// Everything a pass knows before it looks at its nodes.
pub struct ObserveInput<'a> {
    pub stores: &'a Stores,
    /// Namespace of the installer pods.
    pub namespace: &'a str,
    pub policy: &'a TenstorrentDriverPolicy,
    /// Template hash a current installer pod carries (empty: unknown yet).
    pub template_hash: &'a str,
    /// `podSelectorLabel` parsed; `None` when it does not parse (no drain
    /// can be planned then).
    pub selector: Option<&'a PodSelector>,
    pub gates: &'a [String],
    pub now: i64,
    /// Records the NodeActors handed back: fresher than the Nodes' annotations.
    pub records: &'a HashMap<String, NodeRecord>,
    /// PDBs, read once per pass and only if a node drains.
    pub pdbs: OnceCell<Vec<Arc<PodDisruptionBudget>>>,
    /// `upgradePolicy.prepare.enabled`.
    pub prepare: bool,
    /// After this long without preparing, a current installer pod no longer
    /// holds its node's cycle back (see [`ttdrv_core::prepare::gate`]).
    pub prepare_deadline_seconds: i64,
}

/// One node as a pass sees it.
#[derive(Clone, Debug)]
pub struct NodeView {
    pub obs: Observation,
    /// The record persisted on the Node for this policy, if readable.
    pub persisted: Option<NodeRecord>,
    /// Pods to evict now (pass 1 first); empty unless a drain was planned.
    pub evictions: Vec<(PodRef, DrainPass)>,
    pub installer_pod: Option<PodRef>,
    /// Pods the drain leaves in place, with why (reported when it ends).
    pub skipped: Vec<String>,
    pub has_device_pods: bool,
    /// NotReady, or cordoned by someone else.
    pub externally_unavailable: bool,
}

impl NodeView {
    /// The node's slot facts for the rollout planner.
    pub fn candidate(&self, name: &str, rec: Option<&NodeRecord>) -> Candidate {
        let state = rec.map_or(NodeState::Pending, |r| r.state);
        Candidate {
            name: name.to_string(),
            wants_slot: state == NodeState::Pending,
            in_progress: rec.is_some_and(NodeRecord::occupies_slot),
            ready: self.obs.ready,
            unavailable: self.externally_unavailable,
            failed: state.is_failed(),
            has_device_pods: self.has_device_pods,
            prepared: self.obs.prepared,
        }
    }
}

impl<'a> ObserveInput<'a> {
    fn policy_name(&self) -> &str {
        self.policy.metadata.name.as_deref().unwrap_or_default()
    }

    /// Observes `name`, or `None` when the node is not in the cache. The drain
    /// is planned when `starting` (the node was just granted a slot and may
    /// cordon and enter Draining within one step) or when either the actor's
    /// or the persisted record is in Cordoning or Draining: the plan must never
    /// be missing when a node could leave Draining.
    pub fn node(&self, name: &str, starting: bool) -> Option<NodeView> {
        let node = self.stores.nodes.get(&ObjectRef::new(name))?;
        let pods = self.stores.pods.on_node(name);
        let policy_name = self.policy_name();
        let installer = self.installer_of(&pods);
        let on_node = persisted_record(&node);
        // Another policy's cycle cut short (the node moved here): its cordon
        // was ours, and stays ours to undo.
        let inherited_cordon = on_node.as_ref().is_some_and(|r| {
            r.policy != policy_name
                && r.cordoned_by_us()
                && (r.state.is_in_progress() || r.state.is_failed())
        }) && node::unschedulable(&node)
            // The Go operator's cordon for this policy (it annotated whom it
            // cordoned for): ours now, undone when the node is Done.
            || (node::annotation(&node, labels::GO_CORDONED_BY) == Some(policy_name)
                && node::unschedulable(&node));
        let persisted = on_node.filter(|r| r.policy == policy_name);
        let live = self.records.get(name);
        let rec = live.or(persisted.as_ref());
        let plan = self.selector.map(|sel| {
            drain::plan_drain(
                pods.facts.iter().map(Arc::as_ref),
                &self.policy.spec.upgrade_policy.drain,
                sel,
            )
        });
        let draining = starting
            || [live, persisted.as_ref()]
                .into_iter()
                .flatten()
                .any(|r| matches!(r.state, NodeState::Draining | NodeState::Cordoning));
        let (progress, evictions, skipped) = if let (true, Some(plan)) = (draining, &plan) {
            let pdbs = self.pdbs.get_or_init(|| self.stores.pdbs.state());
            let pdbs: Vec<&PodDisruptionBudget> = pdbs.iter().map(Arc::as_ref).collect();
            let step = drain::sequence(plan, pods.facts.iter().map(Arc::as_ref), &pdbs);
            (Some(step.progress), step.evict, plan.reportable_skips())
        } else {
            (None, vec![], vec![])
        };
        let label = |k: &str| node::label(&node, k);
        let installer_state = installer_state(installer, self.template_hash);
        let installer_failure = installer.and_then(installer::failure);
        let installer_created = installer.and_then(installer::created);
        let prepared = self.prepared(
            &node,
            &installer_state,
            &installer_failure,
            installer_created,
        );
        let obs = Observation {
            now: self.now,
            ready: node::ready(&node),
            unschedulable: node::unschedulable(&node),
            loaded: node::loaded_version(&node).map(String::from),
            host_managed: node::host_managed(&node),
            installer: installer_state,
            gates_closed: self.gates.iter().all(|g| label(g) == Some("false")),
            gates_present: self.gates.iter().any(|g| label(g).is_some()),
            drain: progress,
            retry_token: node::retry_token(&node).map(String::from),
            slot: false,
            installer_problem: installer.and_then(installer::problem),
            installer_failure,
            inherited_cordon,
            vacated: label(labels::UNMANAGED) == Some(policy_name),
            nothing_loaded: node::reported_nothing_loaded(&node),
            installer_created,
            prepared,
            prepare_turn: false,
        };
        // A cordon of ours on a node still waiting in Pending (adopted from
        // the Go operator or another policy, or kept across a retry) puts it
        // out of service all the same: it counts, and goes first.
        let externally_unavailable = node::externally_unavailable(
            &node,
            rec.is_some_and(|r| r.cordoned_by_us() && r.state != NodeState::Pending),
        );
        Some(NodeView {
            obs,
            persisted,
            evictions,
            installer_pod: installer.map(PodRef::of),
            skipped,
            has_device_pods: plan.as_ref().map_or_else(
                || pods.facts.iter().any(|p| p.device),
                drain::DrainPlan::has_device_users,
            ),
            externally_unavailable,
        })
    }
}

impl ObserveInput<'_> {
    /// The policy's installer pod among the node's pods.
    fn installer_of<'p>(&self, pods: &'p NodePods) -> Option<&'p Pod> {
        let policy_name = self.policy_name();
        pods.installers.iter().map(Arc::as_ref).find(|p| {
            p.metadata.namespace.as_deref() == Some(self.namespace)
                && p.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(labels::CLAIM))
                    .map(String::as_str)
                    == Some(policy_name)
        })
    }

    /// Whether the node may start its cycle as far as build-ahead goes. A
    /// current installer that neither prepared nor failed within the deadline
    /// (an agent from before build-ahead) holds nothing back.
    fn prepared(
        &self,
        node: &Node,
        installer: &InstallerPod,
        failure: &Option<installer::Failure>,
        created: Option<i64>,
    ) -> bool {
        let overdue = matches!(installer, InstallerPod::Current { .. })
            && failure.is_none()
            && created.is_some_and(|c| self.now - c > self.prepare_deadline_seconds);
        prepare::gate(self.prepare, node, &self.policy.spec.version, overdue)
            == prepare::Gate::Start
    }

    /// The node's build-ahead facts from the caches alone (no drain plan),
    /// cheap enough to read for every owned node in a pass, with its place
    /// in the rollout's order (nodes without device users first). None when
    /// it has nothing to build ahead.
    pub fn prepare_candidate(&self, name: &str) -> Option<((bool, String), prepare::Candidate)> {
        let node = self.stores.nodes.get(&ObjectRef::new(name))?;
        let pods = self.stores.pods.on_node(name);
        let installer = self.installer_of(&pods);
        let state = installer_state(installer, self.template_hash);
        let failure = installer.and_then(installer::failure);
        let prepared = self.prepared(
            &node,
            &state,
            &failure,
            installer.and_then(installer::created),
        );
        let obs = Observation {
            now: self.now,
            ready: node::ready(&node),
            unschedulable: node::unschedulable(&node),
            loaded: node::loaded_version(&node).map(String::from),
            host_managed: node::host_managed(&node),
            installer: state,
            gates_closed: false,
            gates_present: false,
            drain: None,
            retry_token: None,
            slot: false,
            installer_problem: None,
            installer_failure: failure,
            inherited_cordon: false,
            installer_created: None,
            nothing_loaded: false,
            vacated: node::label(&node, labels::UNMANAGED) == Some(self.policy_name()),
            prepared,
            prepare_turn: false,
        };
        let rec = self
            .records
            .get(name)
            .cloned()
            .or_else(|| persisted_record(&node).filter(|r| r.policy == self.policy_name()));
        let state = rec.map_or(NodeState::Pending, |r| r.state);
        let c = prepare::candidate(name, &obs, state, &self.policy.spec.version)?;
        let device = pods.facts.iter().any(|p| p.device);
        Some(((device, name.to_string()), c))
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

fn installer_state(pod: Option<&Pod>, hash: &str) -> InstallerPod {
    let Some(p) = pod else {
        return InstallerPod::Missing;
    };
    let pod_hash = p
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(labels::TEMPLATE_HASH))
        .map(String::as_str);
    if pod_hash == Some(hash) && !hash.is_empty() {
        InstallerPod::Current {
            ready: p.metadata.deletion_timestamp.is_none() && node::pod_ready(p),
        }
    } else {
        InstallerPod::Stale {
            deleting: p.metadata.deletion_timestamp.is_some(),
        }
    }
}

#[cfg(test)]
mod tests;
