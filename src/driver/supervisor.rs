//! PolicySupervisor (one per policy): keeps the policy's DaemonSet, node claims
//! and NodeActors in line with the nodes it owns, asks its RolloutActor which
//! nodes may start, feeds the NodeActors of the nodes in the pass's scope (and
//! of nodes just granted a slot) a fresh observation, and writes the policy's
//! status in the background when (and only when) it changed.
//!
//! A full pass looks at every owned node; a targeted pass only at the nodes a
//! watch event named, so its cost does not grow with the fleet.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;
use kube::runtime::reflector::ObjectRef;
use ttdrv_api::{NodeState, TenstorrentDriverPolicy, TenstorrentDriverPolicyStatus};
use ttdrv_core::machine::NodeRecord;
use ttdrv_core::promotion::{self, Canary, Gate};
use ttdrv_core::reason;
use ttdrv_core::rollout::Plan;
use ttdrv_core::selection::Assignment;

use super::messages::{Reconcile, RefusalChanged};
use super::node::NodeActor;
use super::node::validation_pod::ValidationPods;
use super::node::{NodePorts, StopNode};
use super::rollout::RolloutActor;
use crate::Result;
use crate::policy_decisions::{Effect, Facts, Log, PolicyMemo, Refused, decide};
use crate::runtime::context::Context;

pub struct PolicySupervisor {
    ctx: Arc<Context>,
    name: String,
    /// Behind `Arc`s so a pass borrows them without copying N entries; only
    /// full passes and the end of a pass change them.
    nodes: Arc<HashMap<String, Addr<NodeActor>>>,
    records: Arc<HashMap<String, NodeRecord>>,
    /// Nodes with pods that use the device (listed last, drained last).
    device_users: HashSet<String>,
    rollout: Addr<RolloutActor>,
    /// The NodeActors' port to the validation pods.
    validation_pods: Addr<ValidationPods>,
    ports: SupervisorPorts,
    last_status: Option<TenstorrentDriverPolicyStatus>,
    status_in_flight: bool,
    /// A full pass has rebuilt the records and the rollout's view of every
    /// node; until then every pass is a full one.
    primed: bool,
    /// The policy-level decisions' memory of earlier passes.
    memo: PolicyMemo,
    /// `spec.promoteAfter`'s gate as the last pass that stepped every node
    /// saw it: a change makes the next pass a full one.
    promotion: Option<Gate>,
    /// The last check of the validation PodTemplate, shared with the passes.
    template_check: Arc<std::sync::Mutex<Option<pass::CheckedTemplate>>>,
    /// Build-ahead's candidates, kept between passes.
    prepare: Arc<std::sync::Mutex<pass::PrepareBook>>,
}

impl PolicySupervisor {
    pub fn new(ctx: Arc<Context>, name: String, ports: SupervisorPorts) -> Self {
        let validation_pods = ValidationPods::new(ctx.clone()).start();
        Self {
            ctx,
            name,
            nodes: Arc::default(),
            records: Arc::default(),
            device_users: HashSet::new(),
            rollout: RolloutActor::default().start(),
            validation_pods,
            ports,
            last_status: None,
            status_in_flight: false,
            primed: false,
            memo: PolicyMemo::default(),
            promotion: None,
            template_check: Arc::default(),
            prepare: Arc::default(),
        }
    }
}

impl Actor for PolicySupervisor {
    type Context = actix::Context<Self>;

    fn stopped(&mut self, _: &mut Self::Context) {
        for addr in self.nodes.values() {
            addr.do_send(StopNode);
        }
    }
}

impl Supervised for PolicySupervisor {
    fn restarting(&mut self, _: &mut Self::Context) {
        // Reload everything from the cluster on the next (full) pass.
        self.records = Arc::default();
        self.device_users.clear();
        self.last_status = None;
        self.status_in_flight = false;
        self.primed = false;
        self.promotion = None;
        // A refusal is found again by the next pass if it still stands.
        let (memo, effects) = decide(&self.memo, &Facts::Restarted);
        self.memo = memo;
        self.carry_out(None, effects);
        self.ctx.metrics.inc_actor_restart("policy_supervisor");
    }
}

impl Handler<Reconcile> for PolicySupervisor {
    type Result = AtomicResponse<Self, Result<()>>;

    fn handle(&mut self, msg: Reconcile, _: &mut Self::Context) -> Self::Result {
        let started = Instant::now();
        let ctx = self.ctx.clone();
        let name = self.name.clone();
        let Some(policy) = ctx.stores.policies.get(&ObjectRef::new(&name)) else {
            return AtomicResponse::new(Box::pin(async { Ok(()) }.into_actor(self)));
        };
        // The canary's status is not watched for: each pass (the periodic
        // tick included, every resync interval) reads it from the cache, and
        // a changed gate steps every node, its waiting ones included.
        let gate = promotion::of(
            &policy,
            |c| {
                ctx.stores
                    .policies
                    .get(&ObjectRef::new(c))
                    .map(|p| Canary::of(&p))
            },
            now_secs(),
        );
        let full = msg.scope.full || !self.primed || gate != self.promotion;
        let assignment = msg.assignment;
        let conflicts = assignment.conflicts.get(&name).cloned().unwrap_or_default();
        let owned: &[String] = assignment.owned.get(&name).map_or(&[], Vec::as_slice);

        let (targets, strays): (Vec<String>, Vec<String>) = if full {
            self.sync_node_actors(owned);
            (owned.to_vec(), vec![])
        } else {
            let mut nodes = msg.scope.nodes;
            if msg.scope.tick {
                // Deadlines and eviction retries concern nodes mid-cycle only.
                nodes.extend(
                    self.records
                        .iter()
                        .filter(|(_, r)| r.state.is_in_progress())
                        .map(|(n, _)| n.clone()),
                );
            }
            nodes.into_iter().partition(|n| owns(owned, n))
        };
        let pass = ReconcilePass {
            ctx: ctx.clone(),
            policy: policy.clone(),
            assignment: assignment.clone(),
            full,
            actors: self.nodes.clone(),
            records: self.records.clone(),
            rollout: self.rollout.clone(),
            ports: self.ports.clone(),
            apply: self.memo.apply(policy.metadata.generation, Instant::now()),
            refusal: self.memo.refusal.clone(),
            promotion: gate.as_ref().and_then(Gate::hold),
            template_check: self.template_check.clone(),
            prepare: self.prepare.clone(),
        };
        let (memo, effects) = decide(
            &self.memo,
            &Facts::PassStarts {
                generation: policy.metadata.generation,
                uses_deprecated_node_selector: policy.spec.uses_deprecated_node_selector(),
                go_builder_image: policy
                    .spec
                    .installer
                    .image
                    .as_deref()
                    .filter(|i| ttdrv_api::images::is_go_builder(i))
                    .map(|i| (i, self.ctx.config.installer_image.as_str())),
                conflicts: &conflicts,
            },
        );
        self.memo = memo;
        self.carry_out(Some(&policy), effects);

        let fut = async move { pass.run(targets, strays).await };
        AtomicResponse::new(Box::pin(fut.into_actor(self).map(
            move |res, act, actx| {
                let res = res.map(|out| {
                    if full && out.err.is_none() {
                        act.promotion = gate;
                    }
                    act.absorb(&out, full, &assignment);
                    // Blocked only while it holds something back: a policy
                    // with no node waiting does not page for its canary.
                    act.ctx.metrics.set_policy_promotion_blocked(
                        &act.name,
                        act.promotion_blocked(),
                    );
                    let plan = out.plan;
                    act.export_metrics(&out.stepped, full, &plan);
                    act.policy_decisions(&policy, &plan, out.refused.as_ref());
                    act.write_status_if_due(&policy, &conflicts, &plan, actx);
                    out.err
                });
                let err = match &res {
                    Ok(e) => e.as_ref(),
                    Err(e) => Some(e),
                };
                let m = &act.ctx.metrics;
                m.observe_reconcile(&act.name, started.elapsed().as_secs_f64(), err.is_none());
                match err {
                    None => m.set_last_successful_reconcile(&act.name),
                    // Logged at warn when the write failed; each pass it
                    // stays held back is only counted.
                    Some(e @ crate::Error::WriteHeld { .. }) => {
                        m.inc_error(&act.name, e.metric_label());
                        tracing::debug!(policy = act.name, error = %e, full, "reconcile waits for a write's backoff");
                    }
                    Some(e) => {
                        m.inc_error(&act.name, e.metric_label());
                        tracing::warn!(policy = act.name, error = %e, full, "reconcile failed; will retry");
                    }
                }
                match res {
                    Ok(None) => Ok(()),
                    Ok(Some(e)) | Err(e) => Err(e),
                }
            },
        )))
    }
}

impl PolicySupervisor {
    /// `spec.promoteAfter`'s canary is halted or missing while nodes of this
    /// policy wait in Pending: a person must act on the canary.
    fn promotion_blocked(&self) -> bool {
        self.promotion.as_ref().is_some_and(Gate::is_blocked)
            && self.records.values().any(|r| r.state == NodeState::Pending)
    }

    /// NodeActors follow the set of owned nodes (full passes only: ownership
    /// changes always start one).
    fn sync_node_actors(&mut self, owned: &[String]) {
        let gone: Vec<String> = self
            .nodes
            .keys()
            .filter(|n| !owns(owned, n))
            .cloned()
            .collect();
        let missing = owned.iter().any(|n| !self.nodes.contains_key(n));
        if gone.is_empty() && !missing {
            return;
        }
        let ports = NodePorts {
            patch: self.ports.patch.clone(),
            evict: self.ports.evict.clone(),
            replace_pod: self.ports.replace_pod.clone(),
            release: self.rollout.clone().recipient(),
            run_validation: self.validation_pods.clone().recipient(),
            delete_validation: self.validation_pods.clone().recipient(),
        };
        let nodes = Arc::make_mut(&mut self.nodes);
        for n in owned {
            if !nodes.contains_key(n) {
                let (c, node, pol, ports) = (
                    self.ctx.clone(),
                    n.clone(),
                    self.name.clone(),
                    ports.clone(),
                );
                let addr = actix::Supervisor::start(move |_| NodeActor::new(c, node, pol, ports));
                nodes.insert(n.clone(), addr);
            }
        }
        for n in gone {
            if let Some(a) = nodes.remove(&n) {
                a.do_send(StopNode);
            }
            Arc::make_mut(&mut self.records).remove(&n);
            self.device_users.remove(&n);
            self.ctx.metrics.forget_node(&self.name, &n);
        }
    }

    /// Takes in what a pass learnt. The records the NodeActors returned are kept
    /// even when something failed: the next pass must see the nodes as they
    /// are, not as they were.
    fn absorb(&mut self, out: &PassOut, full: bool, assignment: &Assignment) {
        let records = Arc::make_mut(&mut self.records);
        for (n, r) in &out.updates {
            records.insert(n.clone(), r.clone());
        }
        if full {
            let owned: &[String] = assignment.owned.get(&self.name).map_or(&[], Vec::as_slice);
            records.retain(|n, _| owns(owned, n));
            self.primed = true;
        }
        for (n, device) in &out.device_users {
            if *device {
                self.device_users.insert(n.clone());
            } else {
                self.device_users.remove(n);
            }
        }
    }

    /// Per-node series for the nodes stepped in this pass (all on a full pass);
    /// the per-state counts from every record.
    fn export_metrics(&self, stepped: &[String], full: bool, plan: &Plan) {
        let (m, cr) = (&self.ctx.metrics, self.name.as_str());
        let gates = self.ctx.config.gates();
        let set_node = |n: &str, r: &NodeRecord| {
            m.set_node_state(cr, n, r.state);
            m.set_node_state_since(cr, n, r.since as f64);
            if let Some(node) = self.ctx.stores.nodes.get(&ObjectRef::new(n)) {
                for g in &gates {
                    m.set_deploy_gate_closed(cr, n, g, node_label(&node, g) == Some("false"));
                }
            }
        };
        if full {
            self.records.iter().for_each(|(n, r)| set_node(n, r));
        } else {
            for n in stepped {
                if let Some(r) = self.records.get(n) {
                    set_node(n, r);
                }
            }
        }
        let mut counts: BTreeMap<NodeState, i64> = NodeState::ALL.iter().map(|s| (*s, 0)).collect();
        let mut host = 0;
        for r in self.records.values() {
            if r.reason.as_deref() == Some(reason::HOST_MANAGED) {
                host += 1;
            } else {
                *counts.entry(r.state).or_default() += 1;
            }
        }
        let counts: Vec<(NodeState, i64)> = counts.into_iter().collect();
        m.set_policy_nodes(cr, &counts);
        m.set_policy_host_managed(cr, host);
        m.set_rollout_budget(cr, plan.max_unavailable as i64, plan.unavailable as i64);
        m.set_rollout_health(
            cr,
            plan.in_progress as i64,
            plan.braked.is_some(),
            plan.not_ready as i64,
        );
        m.set_policy_paused(cr, self.paused());
        m.set_rollout_held(cr, plan.held);
        let version = self
            .ctx
            .stores
            .policies
            .get(&ObjectRef::new(&self.name))
            .map(|p| (p.spec.version.clone(), p.spec.parameter_values()));
        let (mut prepared, mut next_failed) = (0, 0);
        for n in self.records.keys() {
            let Some(node) = self.ctx.stores.nodes.get(&ObjectRef::new(n)) else {
                continue;
            };
            if version.as_ref().is_some_and(|(v, params)| {
                ttdrv_core::prepare::is_prepared(&node, ttdrv_core::node::Target::new(v, params))
            }) {
                prepared += 1;
            }
            if ttdrv_core::prepare::next_kernel_failed(&node).is_some() {
                next_failed += 1;
            }
        }
        m.set_policy_prepare(cr, prepared, next_failed);
    }

    /// The policy-level decisions on what the pass found, carried out.
    fn policy_decisions(
        &mut self,
        policy: &TenstorrentDriverPolicy,
        plan: &Plan,
        refused: Option<&Refused>,
    ) {
        let next_kernel_failed = self
            .records
            .keys()
            .filter_map(|n| {
                let node = self.ctx.stores.nodes.get(&ObjectRef::new(n))?;
                let kver = ttdrv_core::prepare::next_kernel_failed(&node)?;
                Some((n.clone(), kver.to_string()))
            })
            .collect();
        let facts = Facts::PassEnded {
            generation: policy.metadata.generation,
            refused,
            braked: plan.braked.as_deref(),
            brake_percent: self.ctx.config.not_ready_brake_percent,
            waiting_on: &plan.waiting_on,
            version: &policy.spec.version,
            next_kernel_failed,
            now: Instant::now(),
        };
        let (memo, effects) = decide(&self.memo, &facts);
        self.memo = memo;
        self.carry_out(Some(policy), effects);
    }

    /// Events (about `policy`), log lines and messages the decisions ask for.
    fn carry_out(&self, policy: Option<&TenstorrentDriverPolicy>, effects: Vec<Effect>) {
        let name = self.name.as_str();
        for effect in effects {
            match effect {
                Effect::Event {
                    warning,
                    reason,
                    action,
                    note,
                } => {
                    if let Some(p) = policy {
                        self.ctx.event(p, warning, reason, action, note);
                    }
                }
                Effect::RefusalChanged { refused } => {
                    self.ports.refusals.do_send(RefusalChanged {
                        policy: name.to_string(),
                        refused,
                    });
                }
                Effect::CountRefused => self.ctx.metrics.inc_error(name, "refused"),
                Effect::Log(Log::Accepted) => {
                    tracing::info!(policy = name, "the cluster accepts the policy again");
                }
                Effect::Log(Log::BackingOff {
                    attempts,
                    retry_in_s,
                    message,
                }) => tracing::warn!(
                    policy = name,
                    attempts,
                    retry_in_s,
                    message,
                    "the cluster refuses the policy; backing off"
                ),
                Effect::Log(Log::Brake { braked, note }) => {
                    tracing::warn!(policy = name, braked, note, "fleet-health brake");
                }
                Effect::Log(Log::NextKernelFailed { node, kernel }) => {
                    tracing::warn!(policy = name, node, kernel, "next-kernel build failed");
                }
            }
        }
    }

    fn paused(&self) -> bool {
        self.ctx
            .stores
            .policies
            .get(&ObjectRef::new(&self.name))
            .is_some_and(|p| p.spec.paused)
    }
}

mod marks;
mod pass;
mod ports;
mod status_write;
#[cfg(test)]
mod tests;

use pass::{PassOut, ReconcilePass};
pub use ports::SupervisorPorts;
use ports::{node_label, now_secs, owns};
