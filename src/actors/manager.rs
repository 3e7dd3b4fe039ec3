//! PolicyManager: the root actor. Watches poke it with `Kick`; it coalesces the
//! pokes, works out which policy owns which node, starts and stops one
//! supervised PolicySupervisor per policy, and asks each to reconcile. A
//! periodic tick drives timeouts and eviction retries without polling the API.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use ttdrv_api::labels;

use super::{DaemonSetRenderer, Evictor, Labeler, PatchNode, PolicySupervisor, Reconcile};
use crate::context::Context;
use crate::selection::assign;

/// Coalescing window for watch events: long enough to batch a burst, short
/// enough to add nothing visible to a node's cycle.
const DEBOUNCE: Duration = Duration::from_millis(5);

pub struct PolicyManager {
    ctx: Arc<Context>,
    supervisors: HashMap<String, Addr<PolicySupervisor>>,
    in_flight: HashSet<String>,
    dirty: HashSet<String>,
    scheduled: bool,
    labeler: Addr<Labeler>,
    evictor: Addr<Evictor>,
    renderer: Addr<DaemonSetRenderer>,
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
            dirty: HashSet::new(),
            scheduled: false,
            labeler,
            evictor,
            renderer,
        }
    }

    fn run(&mut self, actx: &mut actix::Context<Self>) {
        self.scheduled = false;
        let policies = self.ctx.stores.policies.state();
        let nodes = self.ctx.stores.nodes.state();
        self.export_fleet_versions(&nodes);
        let assignment = Arc::new(assign(
            policies.iter().map(|p| p.as_ref()),
            nodes.iter().map(|n| n.as_ref()),
        ));
        let live: HashSet<String> = policies
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        for name in &live {
            if !self.supervisors.contains_key(name) {
                let (ctx, n, l, e, r) = (
                    self.ctx.clone(),
                    name.clone(),
                    self.labeler.clone(),
                    self.evictor.clone(),
                    self.renderer.clone(),
                );
                let addr =
                    actix::Supervisor::start(move |_| PolicySupervisor::new(ctx, n, l, e, r));
                tracing::info!(policy = name, "policy supervisor started");
                self.supervisors.insert(name.clone(), addr);
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
            self.ctx.metrics.forget_policy(name);
            tracing::info!(policy = name, "policy gone; supervisor stopped");
        }
        // With a policy selector this controller sees only its shard, so a claim
        // of an unseen policy may belong to another shard: release only claims
        // of policies seen deleted. Without one, any claim of an unknown policy.
        let known: HashSet<String> = live.iter().cloned().collect();
        if self.ctx.config.policy_selector.is_none() {
            self.release_orphans(|owner| !known.contains(owner));
        } else if !gone.is_empty() {
            self.release_orphans(|owner| gone.iter().any(|g| g == owner));
        }
        for (name, addr) in self.supervisors.clone() {
            if self.in_flight.contains(&name) {
                self.dirty.insert(name);
                continue;
            }
            self.in_flight.insert(name.clone());
            let msg = Reconcile {
                assignment: assignment.clone(),
            };
            let n = name.clone();
            actx.spawn(addr.send(msg).into_actor(self).map(move |res, act, actx| {
                act.in_flight.remove(&n);
                if let Err(e) = res {
                    tracing::warn!(policy = n, error = %e, "supervisor unreachable");
                }
                if act.dirty.remove(&n) {
                    act.schedule(actx, DEBOUNCE);
                }
            }));
        }
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
            let patch = super::supervisor::release_patch(&node, owner, &gates);
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
            if l.get(labels::TT_PCI_PRESENT).map(String::as_str) != Some("true") {
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
        let every = Duration::from_millis(self.ctx.config.resync_ms);
        actx.run_interval(every, |act, actx| act.schedule(actx, Duration::ZERO));
        self.schedule(actx, Duration::ZERO);
    }
}

/// Something changed in a watched resource.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct Kick;

impl Handler<Kick> for PolicyManager {
    type Result = ();

    fn handle(&mut self, _: Kick, actx: &mut Self::Context) {
        // Coalesce bursts of watch events into one pass.
        self.schedule(actx, DEBOUNCE);
    }
}
