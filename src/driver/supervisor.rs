//! The driver policy kind: one policy's pass, run by the generic
//! [`PolicyActor`] (its "PolicySupervisor"): keeps the policy's DaemonSet,
//! node claims and NodeActors in line with the nodes it owns, asks its
//! RolloutActor which nodes may start, feeds the NodeActors of the nodes in
//! the pass's scope (and of nodes just granted a slot) a fresh observation,
//! and builds the policy's status when (and only when) a write is due; the
//! actor writes it in the background.
//!
//! A full pass looks at every owned node; a targeted pass only at the nodes a
//! watch event named, so its cost does not grow with the fleet.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
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
use super::node::{NodePorts, RecordBoard, StopNode};
use super::rollout::RolloutActor;
use crate::Result;
use crate::policy_decisions::{Effect, Facts, Log, PolicyMemo, Refused, decide};
use crate::runtime::context::Context;
use crate::runtime::policy_actor::{self, PassEnd, PolicyActor, PolicyKind};
use crate::runtime::write_backoff::WriteTarget;

/// One driver policy's actor.
pub type PolicySupervisor = PolicyActor<DriverKind>;

/// Policy `name`'s actor, sending its work to `ports`.
pub fn supervisor(ctx: Arc<Context>, name: String, ports: SupervisorPorts) -> PolicySupervisor {
    PolicyActor::new(Arc::new(DriverKind::new(ctx, ports)), name)
}

/// The driver policy kind: what a policy's passes share, kept across a
/// restart.
pub struct DriverKind {
    ctx: Arc<Context>,
    rollout: Addr<RolloutActor>,
    /// The NodeActors' port to the validation pods.
    validation_pods: Addr<ValidationPods>,
    ports: SupervisorPorts,
    /// The last check of the validation PodTemplate, shared with the passes.
    template_check: Arc<std::sync::Mutex<Option<pass::CheckedTemplate>>>,
    /// The records the NodeActors' steps ended with, those no pass waited
    /// for included; kept here, not in the memory, because the NodeActors
    /// outlive a restart of the memory.
    board: RecordBoard,
}

/// What a driver policy's passes remember between them, besides what every
/// kind's do (node actors, the status last written).
#[derive(Default)]
pub struct DriverMemory {
    /// Behind an `Arc` so a pass borrows them without copying N entries;
    /// only full passes and the end of a pass change them.
    records: Arc<HashMap<String, NodeRecord>>,
    /// Nodes with pods that use the device (listed last, drained last).
    device_users: HashSet<String>,
    /// A full pass has rebuilt the records and the rollout's view of every
    /// node; until then every pass is a full one.
    primed: bool,
    /// The policy-level decisions' memory of earlier passes.
    memo: PolicyMemo,
    /// `spec.promoteAfter`'s gate as the last pass that stepped every node
    /// saw it: a change makes the next pass a full one.
    promotion: Option<Gate>,
    /// Build-ahead's candidates, kept between passes (afresh after a
    /// restart: the next pass is a full one and rebuilds them).
    prepare: Arc<std::sync::Mutex<pass::PrepareBook>>,
    /// What the agents' labels say of the owned nodes, for the metrics and
    /// the next-kernel warnings: kept between passes and re-read for the
    /// nodes a pass stepped (every node on a full pass), so a targeted pass
    /// costs O(its nodes), not a walk over every owned Node.
    agent_labels: AgentLabels,
    /// Nodes whose posted records were taken in since the metrics were last
    /// exported: their series follow the record the memory now holds.
    posted: HashSet<String>,
}

/// The agents' build-ahead labels of the owned nodes.
#[derive(Debug, Default)]
struct AgentLabels {
    /// Nodes that hold the policy's target in their cache (or loaded).
    prepared: HashSet<String>,
    /// Nodes whose installed, not running kernel cannot build the target:
    /// node -> kernel.
    next_kernel_failed: BTreeMap<String, String>,
}

type Memory = policy_actor::Memory<DriverKind>;

impl DriverKind {
    fn new(ctx: Arc<Context>, ports: SupervisorPorts) -> Self {
        let validation_pods = ValidationPods::new(ctx.clone()).start();
        Self {
            ctx,
            rollout: RolloutActor::default().start(),
            validation_pods,
            ports,
            template_check: Arc::default(),
            board: RecordBoard::default(),
        }
    }
}

impl PolicyKind for DriverKind {
    const ACTOR: &'static str = "policy_supervisor";
    const KIND: &'static str = "driver";
    /// Off every node's path.
    const STATUS_IN_BACKGROUND: bool = true;
    type Trigger = Reconcile;
    type Memory = DriverMemory;
    type Status = TenstorrentDriverPolicyStatus;
    /// Replacing an unreadable status, of that resourceVersion.
    type WriteNote = Option<Option<String>>;
    type Node = NodeActor;

    fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    fn merge(waiting: &mut Reconcile, next: Reconcile) {
        waiting.scope.merge(&next.scope);
        waiting.assignment = next.assignment;
    }

    fn pass(
        self: Arc<Self>,
        name: String,
        msg: Reconcile,
        memory: Memory,
    ) -> impl Future<Output = PassEnd<Self>> + 'static {
        self.run_pass(name, msg, memory)
    }

    fn status_target(name: &str) -> WriteTarget {
        WriteTarget::PolicyStatus(name.to_string())
    }

    fn write_status(
        self: Arc<Self>,
        name: String,
        status: &TenstorrentDriverPolicyStatus,
        replacing: &Option<Option<String>>,
    ) -> impl Future<Output = Result<()>> + 'static {
        status_write::patch_status(self.ctx.clone(), name, status, replacing.is_some())
    }

    fn status_written(&self, _: &str, memory: &mut Memory, replacing: Option<Option<String>>) {
        let facts = Facts::StatusWritten {
            replaced: replacing,
            now: Instant::now(),
        };
        memory.kind.memo = decide(&memory.kind.memo, &facts).0;
    }

    fn count_status_error(&self, name: &str) {
        self.ctx.metrics.inc_error(name, "kube_api");
    }

    /// Reload everything from the cluster on the next (full) pass; the
    /// NodeActors stay.
    fn restart(&self, name: &str, old: Option<Memory>) -> Memory {
        let mut memory = Memory::default();
        if let Some(old) = old {
            memory.nodes = old.nodes;
            memory.kind.memo = old.kind.memo;
        }
        // A refusal is found again by the next pass if it still stands.
        let (memo, effects) = decide(&memory.kind.memo, &Facts::Restarted);
        memory.kind.memo = memo;
        self.carry_out(name, None, effects);
        memory
    }

    fn stop_node(node: &Addr<NodeActor>) {
        node.do_send(StopNode);
    }
}

/// What the start of a pass settled, for its end.
struct Started {
    policy: Arc<TenstorrentDriverPolicy>,
    assignment: Arc<Assignment>,
    conflicts: Vec<(String, String)>,
    gate: Option<Gate>,
    full: bool,
    at: Instant,
}

impl DriverKind {
    fn run_pass(
        self: Arc<Self>,
        name: String,
        msg: Reconcile,
        mut memory: Memory,
    ) -> impl Future<Output = PassEnd<Self>> + 'static {
        let begun = self.begin(&name, msg, &mut memory);
        async move {
            let Some((started, pass, targets, strays)) = begun else {
                return PassEnd {
                    memory,
                    status: None,
                    result: Ok(()),
                };
            };
            let res = pass.run(targets, strays).await;
            // The pass holds the records and the NodeActors behind `Arc`s:
            // dropped first, `absorb` changes them in place instead of
            // copying every node's record (O(fleet) on every pass).
            drop(pass);
            self.end(&name, started, res, memory)
        }
    }

    /// The start of a pass, on the actor: its scope, the NodeActors of a full
    /// pass, the policy-level decisions at its start.
    fn begin(
        &self,
        name: &str,
        msg: Reconcile,
        memory: &mut Memory,
    ) -> Option<(Started, ReconcilePass, Vec<String>, Vec<String>)> {
        let at = Instant::now();
        let ctx = self.ctx.clone();
        let policy = ctx.stores.policies.get(&ObjectRef::new(name))?;
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
        self.take_posted(memory);
        let full = msg.scope.full || !memory.kind.primed || gate != memory.kind.promotion;
        let assignment = msg.assignment;
        let conflicts = assignment.conflicts.get(name).cloned().unwrap_or_default();
        let owned: &[String] = assignment.owned.get(name).map_or(&[], Vec::as_slice);

        let (targets, strays): (Vec<String>, Vec<String>) = if full {
            self.sync_node_actors(name, memory, owned);
            (owned.to_vec(), vec![])
        } else {
            let mut nodes = msg.scope.nodes;
            if msg.scope.tick {
                // Deadlines and eviction retries concern nodes mid-cycle only.
                nodes.extend(
                    memory
                        .kind
                        .records
                        .iter()
                        .filter(|(_, r)| r.state.is_in_progress())
                        .map(|(n, _)| n.clone()),
                );
            }
            nodes.into_iter().partition(|n| owns(owned, n))
        };
        let m = &mut memory.kind;
        let pass = ReconcilePass {
            ctx: ctx.clone(),
            policy: policy.clone(),
            assignment: assignment.clone(),
            full,
            actors: memory.nodes.shared(),
            records: m.records.clone(),
            rollout: self.rollout.clone(),
            ports: self.ports.clone(),
            apply: m.memo.apply(policy.metadata.generation, Instant::now()),
            refusal: m.memo.refusal.clone(),
            promotion: gate.as_ref().and_then(Gate::hold),
            template_check: self.template_check.clone(),
            prepare: m.prepare.clone(),
        };
        let (memo, effects) = decide(
            &m.memo,
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
        m.memo = memo;
        self.carry_out(name, Some(&policy), effects);
        let started = Started {
            policy,
            assignment,
            conflicts,
            gate,
            full,
            at,
        };
        Some((started, pass, targets, strays))
    }

    /// The end of a pass, back with its memory: what it learnt taken in,
    /// metrics, the policy-level decisions, the status if a write is due.
    fn end(
        &self,
        name: &str,
        started: Started,
        res: Result<PassOut>,
        mut memory: Memory,
    ) -> PassEnd<Self> {
        let Started {
            policy,
            assignment,
            conflicts,
            gate,
            full,
            at,
        } = started;
        let mut status = None;
        let res = res.map(|out| {
            let m = &mut memory.kind;
            if full && out.err.is_none() {
                m.promotion = gate;
            }
            absorb(name, m, &out, full, &assignment);
            // After the pass's own replies: an entry posted is never older.
            self.take_posted(&mut memory);
            let m = &mut memory.kind;
            let mut stepped = out.stepped;
            stepped.extend(m.posted.drain().filter(|n| m.records.contains_key(n)));
            stepped.sort_unstable();
            stepped.dedup();
            self.read_agent_labels(m, &policy, &stepped, full);
            // Blocked only while it holds something back: a policy
            // with no node waiting does not page for its canary.
            self.ctx
                .metrics
                .set_policy_promotion_blocked(name, promotion_blocked(m));
            let plan = out.plan;
            self.export_metrics(name, m, &stepped, full, &plan);
            self.policy_decisions(name, m, &policy, &plan, out.refused.as_ref());
            status = self.status_if_due(name, &memory, &policy, &conflicts, &plan);
            out.err
        });
        let err = match &res {
            Ok(e) => e.as_ref(),
            Err(e) => Some(e),
        };
        let m = &self.ctx.metrics;
        m.observe_reconcile(name, at.elapsed().as_secs_f64(), err.is_none());
        match err {
            None => m.set_last_successful_reconcile(name),
            // Logged at warn when the write failed; each pass it
            // stays held back is only counted.
            Some(e @ crate::Error::WriteHeld { .. }) => {
                m.inc_error(name, e.metric_label());
                tracing::debug!(policy = name, error = %e, full, "reconcile waits for a write's backoff");
            }
            Some(e) => {
                m.inc_error(name, e.metric_label());
                tracing::warn!(policy = name, error = %e, full, "reconcile failed; will retry");
            }
        }
        let result = match res {
            Ok(None) => Ok(()),
            Ok(Some(e)) | Err(e) => Err(e),
        };
        PassEnd {
            memory,
            status,
            result,
        }
    }
}

impl DriverKind {
    /// Takes in the records the NodeActors posted since the last pass: the
    /// steps that pass did not wait for, which may have ended since.
    fn take_posted(&self, memory: &mut Memory) {
        let posted = self.board.take();
        let actors = &memory.nodes;
        take_in_posted(&mut memory.kind, |n| actors.contains(n), posted);
    }
}

/// The posted records of nodes the policy still has an actor for (a node
/// that left it may post once more as its actor stops).
fn take_in_posted(
    m: &mut DriverMemory,
    has_actor: impl Fn(&str) -> bool,
    posted: HashMap<String, NodeRecord>,
) {
    if posted.is_empty() {
        return;
    }
    let records = Arc::make_mut(&mut m.records);
    for (n, r) in posted {
        if has_actor(&n) {
            records.insert(n.clone(), r);
            m.posted.insert(n);
        }
    }
}

/// `spec.promoteAfter`'s canary is halted or missing while nodes of this
/// policy wait in Pending: a person must act on the canary.
fn promotion_blocked(m: &DriverMemory) -> bool {
    m.promotion.as_ref().is_some_and(Gate::is_blocked)
        && m.records.values().any(|r| r.state == NodeState::Pending)
}

/// Takes in what a pass learnt. The records the NodeActors returned are kept
/// even when something failed: the next pass must see the nodes as they
/// are, not as they were.
fn absorb(name: &str, m: &mut DriverMemory, out: &PassOut, full: bool, assignment: &Assignment) {
    let records = Arc::make_mut(&mut m.records);
    for (n, r) in &out.updates {
        records.insert(n.clone(), r.clone());
    }
    if full {
        let owned: &[String] = assignment.owned.get(name).map_or(&[], Vec::as_slice);
        records.retain(|n, _| owns(owned, n));
        m.primed = true;
    }
    for (n, device) in &out.device_users {
        if *device {
            m.device_users.insert(n.clone());
        } else {
            m.device_users.remove(n);
        }
    }
}

impl DriverKind {
    /// NodeActors follow the set of owned nodes (full passes only: ownership
    /// changes always start one).
    fn sync_node_actors(&self, name: &str, memory: &mut Memory, owned: &[String]) {
        let gone: Vec<String> = memory
            .nodes
            .names()
            .filter(|n| !owns(owned, n))
            .cloned()
            .collect();
        let missing = owned.iter().any(|n| !memory.nodes.contains(n));
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
            board: self.board.clone(),
        };
        for n in owned {
            memory.nodes.get_or_start(n, || {
                let (c, node, pol, ports) =
                    (self.ctx.clone(), n.clone(), name.to_string(), ports.clone());
                actix::Supervisor::start(move |_| NodeActor::new(c, node, pol, ports))
            });
        }
        let m = &mut memory.kind;
        for n in gone {
            if let Some(a) = memory.nodes.remove(&n) {
                a.do_send(StopNode);
            }
            Arc::make_mut(&mut m.records).remove(&n);
            m.device_users.remove(&n);
            self.ctx.metrics.forget_node(name, &n);
        }
    }

    /// Per-node series for the nodes stepped in this pass (all on a full pass);
    /// the per-state counts from every record.
    fn export_metrics(
        &self,
        cr: &str,
        memory: &DriverMemory,
        stepped: &[String],
        full: bool,
        plan: &Plan,
    ) {
        let m = &self.ctx.metrics;
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
            memory.records.iter().for_each(|(n, r)| set_node(n, r));
        } else {
            for n in stepped {
                if let Some(r) = memory.records.get(n) {
                    set_node(n, r);
                }
            }
        }
        let mut counts: BTreeMap<NodeState, i64> = NodeState::ALL.iter().map(|s| (*s, 0)).collect();
        let mut host = 0;
        for r in memory.records.values() {
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
        m.set_policy_paused(cr, self.paused(cr));
        m.set_rollout_held(cr, plan.held);
        let labels = &memory.agent_labels;
        m.set_policy_prepare(
            cr,
            i64::try_from(labels.prepared.len()).unwrap_or(i64::MAX),
            i64::try_from(labels.next_kernel_failed.len()).unwrap_or(i64::MAX),
        );
    }

    /// Re-reads the agents' labels of `nodes` (every owned node on a full
    /// pass, which also forgets the nodes no longer owned).
    fn read_agent_labels(
        &self,
        memory: &mut DriverMemory,
        policy: &TenstorrentDriverPolicy,
        nodes: &[String],
        full: bool,
    ) {
        let labels = &mut memory.agent_labels;
        if full {
            *labels = AgentLabels::default();
        }
        let params = policy.spec.parameter_values();
        let target = ttdrv_core::node::Target::new(&policy.spec.version, &params);
        for n in nodes {
            let node = memory
                .records
                .contains_key(n)
                .then(|| self.ctx.stores.nodes.get(&ObjectRef::new(n)))
                .flatten();
            let prepared = node
                .as_deref()
                .is_some_and(|nd| ttdrv_core::prepare::is_prepared(nd, target));
            let failed = node
                .as_deref()
                .and_then(ttdrv_core::prepare::next_kernel_failed);
            if prepared {
                labels.prepared.insert(n.clone());
            } else {
                labels.prepared.remove(n);
            }
            match failed {
                Some(k) => {
                    labels.next_kernel_failed.insert(n.clone(), k.to_string());
                }
                None => {
                    labels.next_kernel_failed.remove(n);
                }
            }
        }
    }

    /// The policy-level decisions on what the pass found, carried out.
    fn policy_decisions(
        &self,
        name: &str,
        memory: &mut DriverMemory,
        policy: &TenstorrentDriverPolicy,
        plan: &Plan,
        refused: Option<&Refused>,
    ) {
        let next_kernel_failed = memory.agent_labels.next_kernel_failed.clone();
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
        let (memo, effects) = decide(&memory.memo, &facts);
        memory.memo = memo;
        self.carry_out(name, Some(policy), effects);
    }

    /// Events (about `policy`), log lines and messages the decisions ask for.
    fn carry_out(
        &self,
        name: &str,
        policy: Option<&TenstorrentDriverPolicy>,
        effects: Vec<Effect>,
    ) {
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

    fn paused(&self, name: &str) -> bool {
        self.ctx
            .stores
            .policies
            .get(&ObjectRef::new(name))
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
