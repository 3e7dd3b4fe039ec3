//! PolicyManager: the root actor. Watches poke it with `Kick`; it coalesces the
//! pokes, works out which policy owns which node, starts and stops one
//! supervised PolicySupervisor per policy, and asks each to reconcile.
//!
//! A poke names what changed: one node (its Node or a pod bound to it) or the
//! whole fleet (a policy, DaemonSet or PDB). Node pokes become targeted passes
//! that look at those nodes only, so a node's cycle costs the same at 10 or
//! 1000 nodes; a periodic tick (and any change of which policy owns which node)
//! runs a full pass, which drives timeouts and eviction retries without polling
//! the API.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use kube::runtime::reflector::ObjectRef;
use ttdrv_api::labels;

use super::messages::{PassScope, Reconcile, RefusalChanged};
use super::supervisor::SupervisorPorts;
use super::supervisor::{PolicySupervisor, supervisor};
use crate::runtime::context::Context;
use crate::runtime::policy_actor::RunPass;
use crate::workers::evictor::Evictor;
use crate::workers::labeler::{Labeler, PatchNode};
use crate::workers::renderer::DaemonSetRenderer;
use ttdrv_core::selection::{Assignment, Refused, assign, claim_of};

/// Coalescing window for watch events: long enough to batch a burst, short
/// enough to add nothing visible to a node's cycle.
const DEBOUNCE: Duration = Duration::from_millis(2);

pub struct PolicyManager {
    ctx: Arc<Context>,
    supervisors: HashMap<String, Addr<PolicySupervisor>>,
    in_flight: HashSet<String>,
    /// Changes seen since the last run.
    changed: PassScope,
    /// Per policy: changes not yet handed to its supervisor (it was busy).
    waiting: HashMap<String, PassScope>,
    last_assignment: Option<Arc<Assignment>>,
    ticks: u64,
    scheduled: bool,
    labeler: Addr<Labeler>,
    evictor: Addr<Evictor>,
    renderer: Addr<DaemonSetRenderer>,
    /// Policies the cluster refuses (see [`RefusalChanged`]).
    refused: Refused,
}

impl PolicyManager {
    pub fn new(ctx: Arc<Context>) -> Self {
        let labeler = Labeler::new(ctx.clone()).start();
        let evictor = Evictor::new(ctx.clone()).start();
        let renderer = DaemonSetRenderer::new(ctx.clone()).start();
        Self {
            ctx,
            supervisors: HashMap::new(),
            in_flight: HashSet::new(),
            changed: PassScope {
                full: true,
                ..Default::default()
            },
            waiting: HashMap::new(),
            last_assignment: None,
            ticks: 0,
            scheduled: false,
            labeler,
            evictor,
            renderer,
            refused: Refused::new(),
        }
    }

    fn run(&mut self, actx: &mut actix::Context<Self>) {
        self.scheduled = false;
        let policies = self.ctx.stores.policies.state();
        let mut changed = std::mem::take(&mut self.changed);
        let assignment = self.assignment(&policies, &mut changed);
        if changed.full || changed.tick {
            self.export_fleet_versions(&self.ctx.stores.nodes.state());
        }
        let live: HashSet<String> = policies
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        for name in &live {
            if !self.supervisors.contains_key(name) {
                let (ctx, n, ports) = (
                    self.ctx.clone(),
                    name.clone(),
                    SupervisorPorts::of(
                        &self.labeler,
                        &self.evictor,
                        &self.renderer,
                        actx.address().recipient(),
                    ),
                );
                let addr = actix::Supervisor::start(move |_| supervisor(ctx, n, ports));
                tracing::info!(policy = name, "policy supervisor started");
                self.supervisors.insert(name.clone(), addr);
                self.waiting.insert(
                    name.clone(),
                    PassScope {
                        full: true,
                        ..Default::default()
                    },
                );
            }
        }
        let gone: Vec<String> = self
            .supervisors
            .keys()
            .filter(|n| !live.contains(*n))
            .cloned()
            .collect();
        for name in &gone {
            self.supervisors.remove(name);
            self.refused.remove(name);
            self.waiting.remove(name);
            self.ctx.metrics.forget_policy(name);
            tracing::info!(policy = name, "policy gone; supervisor stopped");
        }
        // With a policy selector this controller sees only its shard, so a claim
        // of an unseen policy may belong to another shard: release only claims
        // of policies seen deleted. Without one, any claim of an unknown policy.
        let known: HashSet<String> = live.iter().cloned().collect();
        if !changed.full {
            // Claims only change hands on full passes.
        } else if self.ctx.config.policy_selector.is_none() {
            self.release_orphans(|owner| !known.contains(owner));
        } else if !gone.is_empty() {
            self.release_orphans(|owner| gone.iter().any(|g| g == owner));
        }
        for (name, addr) in self.supervisors.clone() {
            // A targeted pass concerns only this policy's nodes; a node that
            // left the policy changed the assignment, which made `changed` full.
            let owned = assignment.owned.get(&name).map_or(&[][..], Vec::as_slice);
            let mine = PassScope {
                full: changed.full,
                tick: changed.tick,
                nodes: changed
                    .nodes
                    .iter()
                    .filter(|n| owned.binary_search(n).is_ok())
                    .cloned()
                    .collect(),
            };
            let scope = self.waiting.entry(name.clone()).or_default();
            scope.merge(&mine);
            if self.in_flight.contains(&name) || scope.is_empty() {
                continue;
            }
            let scope = self.waiting.remove(&name).unwrap_or_default();
            self.in_flight.insert(name.clone());
            let msg = RunPass(Reconcile {
                assignment: assignment.clone(),
                scope,
            });
            let n = name.clone();
            actx.spawn(addr.send(msg).into_actor(self).map(move |res, act, actx| {
                act.in_flight.remove(&n);
                if let Err(e) = res {
                    tracing::warn!(policy = n, error = %e, "supervisor unreachable");
                }
                // What came in while the pass ran has coalesced already:
                // the next pass starts now, without another window.
                if act.waiting.get(&n).is_some_and(|s| !s.is_empty()) {
                    act.schedule(actx, Duration::ZERO);
                }
            }));
        }
    }

    /// Which policy owns which node. When only some nodes changed and each
    /// still has the same owner and losers, the last assignment stands: that
    /// costs O(changed nodes × policies) instead of O(nodes × policies) per
    /// watch event. Any other change recomputes it, and a different result
    /// makes the run a full one (claims, NodeActors and rollout budgets of
    /// whole policies depend on it).
    fn assignment(
        &mut self,
        policies: &[Arc<ttdrv_api::TenstorrentDriverPolicy>],
        changed: &mut PassScope,
    ) -> Arc<Assignment> {
        if !changed.full
            && let Some(last) = &self.last_assignment
        {
            let unchanged = changed.nodes.iter().all(|n| {
                let node = self.ctx.stores.nodes.get(&ObjectRef::new(n));
                claim_of(
                    policies.iter().map(|p| p.as_ref()),
                    node.as_deref(),
                    &self.refused,
                    self.ctx.eligibility(),
                ) == last.claim(n)
            });
            if unchanged {
                return last.clone();
            }
        }
        let nodes = self.ctx.stores.nodes.state();
        let assignment = Arc::new(assign(
            policies.iter().map(|p| p.as_ref()),
            nodes.iter().map(|n| n.as_ref()),
            &self.refused,
            self.ctx.eligibility(),
        ));
        if self.last_assignment.as_deref() != Some(assignment.as_ref()) {
            changed.full = true;
            changed.nodes.clear();
        }
        self.last_assignment = Some(assignment.clone());
        assignment
    }

    /// Claims of deleted policies are removed (and any cordon they left undone).
    fn release_orphans(&self, orphaned: impl Fn(&str) -> bool) {
        let gates = self.ctx.config.gates();
        for node in self.ctx.stores.nodes.state() {
            let Some(owner) = node
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(labels::CLAIM))
            else {
                continue;
            };
            if !orphaned(owner) {
                continue;
            }
            let patch = crate::node_patch::release_patch(&node, owner, &gates);
            let name = node.metadata.name.clone().unwrap_or_default();
            self.labeler.do_send(PatchNode {
                node: name,
                patch,
                action: "releasing node of a deleted policy",
            });
        }
    }

    /// `ttdriver_nodes_by_kmd_version`: loaded versions across Tenstorrent nodes.
    fn export_fleet_versions(&self, nodes: &[Arc<k8s_openapi::api::core::v1::Node>]) {
        let mut counts: std::collections::BTreeMap<(String, String), i64> = Default::default();
        for node in nodes {
            let Some(l) = node.metadata.labels.as_ref() else {
                continue;
            };
            // Tenstorrent nodes: the PCI label, unless the chart says the
            // cluster has no NFD (then every node reporting a version).
            if self.ctx.eligibility().require_tenstorrent_label
                && l.get(labels::TT_PCI_PRESENT).map(String::as_str) != Some("true")
            {
                continue;
            }
            if let Some(v) = l.get(labels::KMD_VERSION) {
                let mode = l.get(labels::INSTALL_MODE).cloned().unwrap_or_default();
                *counts.entry((v.clone(), mode)).or_default() += 1;
            }
        }
        let counts: Vec<(String, String, i64)> =
            counts.into_iter().map(|((v, m), n)| (v, m, n)).collect();
        self.ctx.metrics.set_nodes_by_kmd_version(&counts);
    }

    fn schedule(&mut self, actx: &mut actix::Context<Self>, after: Duration) {
        if !self.scheduled {
            self.scheduled = true;
            actx.run_later(after, |act, actx| act.run(actx));
        }
    }
}

impl Actor for PolicyManager {
    type Context = actix::Context<Self>;

    fn started(&mut self, actx: &mut Self::Context) {
        actx.set_mailbox_capacity(1024);
        let every = Duration::from_millis(self.ctx.config.resync_ms.max(1));
        // Every tick looks at nodes mid-cycle (deadlines, eviction retries);
        // every full_every-th tick at everything, a safety net behind the
        // watches.
        let full_every = (self.ctx.config.full_resync_ms / self.ctx.config.resync_ms.max(1)).max(1);
        actx.run_interval(every, move |act, actx| {
            act.ticks += 1;
            act.changed.tick = true;
            if act.ticks % full_every == 0 {
                act.changed.full = true;
                act.changed.nodes.clear();
            }
            act.schedule(actx, Duration::ZERO)
        });
        self.schedule(actx, Duration::ZERO);
    }
}

/// What a watch event concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every node of every policy.
    All,
    /// One node: its Node object or a pod bound to it changed.
    Node(String),
}

/// Something changed in a watched resource.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct Kick(pub Scope);

impl Handler<Kick> for PolicyManager {
    type Result = ();

    fn handle(&mut self, Kick(scope): Kick, actx: &mut Self::Context) {
        match scope {
            Scope::All => {
                self.changed.full = true;
                self.changed.nodes.clear();
            }
            Scope::Node(n) if !self.changed.full => {
                self.changed.nodes.insert(n);
            }
            Scope::Node(_) => {}
        }
        // Coalesce bursts of watch events into one pass.
        self.schedule(actx, DEBOUNCE);
    }
}

impl Handler<RefusalChanged> for PolicyManager {
    type Result = ();

    fn handle(&mut self, msg: RefusalChanged, actx: &mut Self::Context) {
        let changed = if msg.refused {
            self.refused.insert(msg.policy)
        } else {
            self.refused.remove(&msg.policy)
        };
        if changed {
            self.changed.full = true;
            self.changed.nodes.clear();
            self.schedule(actx, DEBOUNCE);
        }
    }
}
