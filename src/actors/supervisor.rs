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
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use ttdrv_api::{NodeState, TenstorrentDriverPolicy, TenstorrentDriverPolicyStatus, labels};
use ttdrv_core::machine::NodeRecord;
use ttdrv_core::reason;
use ttdrv_core::rollout::Plan;
use ttdrv_core::selection::Assignment;

use super::manager::RefusalChanged;
use super::node::{NodePorts, StopNode};
use super::{
    DaemonSetRenderer, Ensure, Evict, Evictor, Labeler, NodeActor, PassScope, PatchNode,
    ReplaceInstallerPod, RolloutActor,
};
use crate::Result;
use crate::context::Context;
use crate::refusal::Refusal;
use crate::render::daemonset_name;
use crate::status::{self, Reported, StatusInput};

/// Where a PolicySupervisor (and the NodeActors it starts) send their work:
/// the shared Labeler, Evictor and DaemonSetRenderer. Recipients, so tests
/// put recording fakes in their place.
#[derive(Clone)]
pub struct SupervisorPorts {
    pub patch: Recipient<PatchNode>,
    pub evict: Recipient<Evict>,
    pub ensure: Recipient<Ensure>,
    pub replace_pod: Recipient<ReplaceInstallerPod>,
    /// The PolicyManager, told when the cluster starts or stops refusing
    /// the policy (ownership of nodes depends on it).
    pub refusals: Recipient<RefusalChanged>,
}

impl SupervisorPorts {
    pub fn of(
        labeler: &Addr<Labeler>,
        evictor: &Addr<Evictor>,
        renderer: &Addr<DaemonSetRenderer>,
        refusals: Recipient<RefusalChanged>,
    ) -> Self {
        Self {
            patch: labeler.clone().recipient(),
            evict: evictor.clone().recipient(),
            ensure: renderer.clone().recipient(),
            replace_pod: renderer.clone().recipient(),
            refusals,
        }
    }
}

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
    ports: SupervisorPorts,
    last_status: Option<TenstorrentDriverPolicyStatus>,
    last_status_write: Option<Instant>,
    /// `resourceVersion` of the policy whose unreadable status (not ours:
    /// the Go operator's, or garbage) was last replaced by ours.
    replaced_unreadable: Option<String>,
    status_in_flight: bool,
    /// A full pass has rebuilt the records and the rollout's view of every
    /// node; until then every pass is a full one.
    primed: bool,
    warned_generation: Option<i64>,
    /// The fleet-health brake held the last pass.
    braked: bool,
    /// What the cluster refuses about this policy, while it does.
    refusal: Option<Refusal>,
    last_conflicts: Vec<(String, String)>,
    /// Next-kernel warnings announced with an Event (node -> kernel).
    next_kernel_warned: BTreeMap<String, String>,
}

impl PolicySupervisor {
    pub fn new(ctx: Arc<Context>, name: String, ports: SupervisorPorts) -> Self {
        Self {
            ctx,
            name,
            nodes: Arc::default(),
            records: Arc::default(),
            device_users: HashSet::new(),
            rollout: RolloutActor::default().start(),
            ports,
            last_status: None,
            last_status_write: None,
            replaced_unreadable: None,
            status_in_flight: false,
            primed: false,
            warned_generation: None,
            braked: false,
            refusal: None,
            last_conflicts: vec![],
            next_kernel_warned: BTreeMap::new(),
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
        if self.refusal.take().is_some() {
            // Found again by the next pass if it still stands.
            self.ports.refusals.do_send(RefusalChanged {
                policy: self.name.clone(),
                refused: false,
            });
        }
        self.ctx.metrics.inc_actor_restart("policy_supervisor");
    }
}

/// Re-evaluate the policy against the current caches: every node it owns
/// (`scope.full`), or only the nodes named in `scope.nodes` plus, on the
/// periodic tick, those in the middle of a cycle.
#[derive(Message, Clone)]
#[rtype(result = "Result<()>")]
pub struct Reconcile {
    pub assignment: Arc<Assignment>,
    pub scope: PassScope,
}

fn now_secs() -> i64 {
    Timestamp::now().as_second()
}

fn node_label<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    ttdrv_core::node::label(node, key)
}

fn owns(owned: &[String], node: &str) -> bool {
    owned.binary_search_by(|n| n.as_str().cmp(node)).is_ok()
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
        let full = msg.scope.full || !self.primed;
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
            apply: Refusal::next(
                self.refusal.as_ref(),
                policy.metadata.generation,
                Instant::now(),
            ),
            refusal: self.refusal.clone(),
        };
        let warn_deprecated = policy.spec.uses_deprecated_node_selector()
            && self.warned_generation != policy.metadata.generation;
        let conflicts_changed = conflicts != self.last_conflicts;

        let fut = async move {
            let res = pass
                .run(
                    targets,
                    strays,
                    &conflicts,
                    warn_deprecated,
                    conflicts_changed,
                )
                .await;
            (res, conflicts, warn_deprecated)
        };
        AtomicResponse::new(Box::pin(fut.into_actor(self).map(
            move |(res, conflicts, warned), act, actx| {
                act.last_conflicts = conflicts.clone();
                if warned {
                    act.warned_generation = policy.metadata.generation;
                }
                let res = res.map(|out| {
                    act.absorb(&out, full, &assignment);
                    let plan = out.plan;
                    act.export_metrics(&out.stepped, full, &plan);
                    act.report_brake(&policy, &plan);
                    act.report_next_kernels(&policy);
                    act.absorb_refusal(&policy, out.refused.as_ref());
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
            acquire: self.rollout.clone().recipient(),
            release: self.rollout.clone().recipient(),
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
        let version = self
            .ctx
            .stores
            .policies
            .get(&ObjectRef::new(&self.name))
            .map(|p| p.spec.version.clone());
        let (mut prepared, mut next_failed) = (0, 0);
        for n in self.records.keys() {
            let Some(node) = self.ctx.stores.nodes.get(&ObjectRef::new(n)) else {
                continue;
            };
            if version
                .as_deref()
                .is_some_and(|v| ttdrv_core::prepare::is_prepared(&node, v))
            {
                prepared += 1;
            }
            if ttdrv_core::prepare::next_kernel_failed(&node).is_some() {
                next_failed += 1;
            }
        }
        m.set_policy_prepare(cr, prepared, next_failed);
    }

    /// Keeps the policy's refusal in step with the pass: a refused attempt
    /// moves the backoff on (Event and log line only for a new error), an
    /// accepted apply ends it.
    fn absorb_refusal(&mut self, policy: &TenstorrentDriverPolicy, refused: Option<&Refused>) {
        let generation = policy.metadata.generation;
        match refused {
            None => {
                if let Some(ended) = self.refusal.take() {
                    self.ports.refusals.do_send(RefusalChanged {
                        policy: self.name.clone(),
                        refused: false,
                    });
                    tracing::info!(policy = self.name, "the cluster accepts the policy again");
                    let (reason, note) = if ended.message.starts_with(status::TAKEOVER) {
                        (
                            "DaemonSetTakenOver",
                            "the installer DaemonSet was re-created as this controller's: the takeover is over",
                        )
                    } else {
                        (
                            "PolicyApplied",
                            "the installer DaemonSet was applied: the refusal is over",
                        )
                    };
                    self.ctx.event(policy, false, reason, "Apply", note.into());
                }
            }
            Some(r)
                if !r.attempted
                    && self
                        .refusal
                        .as_ref()
                        .is_some_and(|s| s.message == r.message && s.generation == generation) => {}
            Some(r) => {
                let next = Refusal::refused(
                    self.refusal.as_ref(),
                    generation,
                    &r.message,
                    Instant::now(),
                );
                // A takeover has its own Event (DaemonSetTakeover, from the
                // renderer): it is not a refusal to report.
                let takeover = next.message.starts_with(status::TAKEOVER);
                if next.is_news(self.refusal.as_ref()) && !takeover {
                    self.ctx
                        .event(policy, true, "PolicyRefused", "Apply", next.message.clone());
                }
                if r.attempted || next.is_news(self.refusal.as_ref()) {
                    let wait = next.retry_at.saturating_duration_since(Instant::now());
                    tracing::warn!(
                        policy = self.name,
                        attempts = next.attempts,
                        retry_in_s = wait.as_secs(),
                        message = next.message,
                        "the cluster refuses the policy; backing off"
                    );
                }
                if !takeover {
                    self.ctx.metrics.inc_error(&self.name, "refused");
                }
                if self.refusal.is_none() {
                    self.ports.refusals.do_send(RefusalChanged {
                        policy: self.name.clone(),
                        refused: true,
                    });
                }
                self.refusal = Some(next);
            }
        }
    }

    /// A Warning Event (NextKernelBuildFailed) for each node whose agent
    /// newly reports an installed kernel the policy's version does not build
    /// for: before anyone reboots into it.
    fn report_next_kernels(&mut self, policy: &TenstorrentDriverPolicy) {
        let now: BTreeMap<String, String> = self
            .records
            .keys()
            .filter_map(|n| {
                let node = self.ctx.stores.nodes.get(&ObjectRef::new(n))?;
                let kver = ttdrv_core::prepare::next_kernel_failed(&node)?;
                Some((n.clone(), kver.to_string()))
            })
            .collect();
        for (node, kver) in
            ttdrv_core::prepare::new_next_kernel_warnings(&self.next_kernel_warned, &now)
        {
            let note = format!(
                "node {node}: tt-kmd {} does not build for its installed kernel {kver}; a reboot into that kernel would find no module (the installer's log has the build error)",
                policy.spec.version
            );
            tracing::warn!(
                policy = self.name,
                node,
                kernel = kver,
                "next-kernel build failed"
            );
            self.ctx.event(
                policy,
                true,
                ttdrv_core::prepare::NEXT_KERNEL_BUILD_FAILED,
                "Prepare",
                note,
            );
        }
        self.next_kernel_warned = now;
    }

    /// An Event when the fleet-health brake engages or lets go.
    fn report_brake(&mut self, policy: &TenstorrentDriverPolicy, plan: &Plan) {
        let braked = plan.braked.is_some();
        if braked == self.braked {
            return;
        }
        self.braked = braked;
        let (warning, reason, note) = match &plan.braked {
            Some(nodes) => (
                true,
                "FleetNotReady",
                format!(
                    "rollout held: {} node(s) NotReady (more than {}% of the policy's nodes): {}",
                    nodes.len(),
                    self.ctx.config.not_ready_brake_percent,
                    nodes.join(", ")
                ),
            ),
            None => (
                false,
                "FleetReady",
                "enough nodes are Ready again: the rollout goes on".to_string(),
            ),
        };
        tracing::warn!(policy = self.name, braked, note, "fleet-health brake");
        self.ctx.event(policy, warning, reason, "Rollout", note);
    }

    fn paused(&self) -> bool {
        self.ctx
            .stores
            .policies
            .get(&ObjectRef::new(&self.name))
            .is_some_and(|p| p.spec.paused)
    }

    /// Writes the status in the background, off every node's path: condition
    /// flips (Ready, Degraded, Paused, Conflict…) and a new generation at once,
    /// per-node progress at most once per STATUS_INTERVAL (the periodic full
    /// pass flushes the last of it). One write at a time.
    fn write_status_if_due(
        &mut self,
        policy: &Arc<TenstorrentDriverPolicy>,
        conflicts: &[(String, String)],
        plan: &Plan,
        actx: &mut actix::Context<Self>,
    ) {
        if self.status_in_flight {
            return;
        }
        // A status we cannot read (another operator's, garbage) is replaced
        // as a whole by ours, at once, with an Event; once per version of the
        // policy, so a watch that lags behind our write does not repeat it.
        let unreadable = policy
            .status
            .as_ref()
            .and_then(|s| s.unreadable.clone())
            .filter(|_| self.replaced_unreadable != policy.metadata.resource_version);
        let prev = if unreadable.is_some() {
            None
        } else {
            self.last_status.clone().or_else(|| policy.status.clone())
        };
        let (summary, _) = status::summarize(&self.records);
        let flags = status::condition_flags(
            &summary,
            policy.spec.paused,
            !conflicts.is_empty(),
            plan.braked.is_some() || self.refusal.is_some(),
        );
        let urgent = prev.as_ref().map(status::flags_of).as_deref() != Some(flags.as_slice())
            || prev.as_ref().map(|p| p.observed_generation) != Some(policy.metadata.generation);
        let due = self
            .last_status_write
            .is_none_or(|t| t.elapsed() >= STATUS_INTERVAL);
        if !(urgent || due || unreadable.is_some()) {
            return;
        }
        let ds_name = daemonset_name(&self.name);
        let input = StatusInput {
            policy,
            records: &self.records,
            device_users: &self.device_users,
            conflicts,
            blocked: plan.blocked.as_deref(),
            braked: plan.braked.as_deref(),
            refused: self.refusal.as_ref().map(|r| r.message.as_str()),
            daemonset: &ds_name,
            previous: prev.as_ref(),
            now: Timestamp::now(),
        };
        let nodes = &self.ctx.stores.nodes;
        let status = status::build(&input, |n| {
            let node = nodes.get(&ObjectRef::new(n));
            let l = |k: &str| {
                node.as_deref()
                    .and_then(|nd| node_label(nd, k))
                    .map(String::from)
            };
            Reported {
                version: node
                    .as_deref()
                    .and_then(ttdrv_core::node::loaded_version)
                    .map(String::from),
                install_mode: l(labels::INSTALL_MODE),
                prepared_version: node
                    .as_deref()
                    .and_then(ttdrv_core::prepare::prepared_version)
                    .map(String::from),
                next_kernel_build_failed: node
                    .as_deref()
                    .and_then(ttdrv_core::prepare::next_kernel_failed)
                    .map(String::from),
            }
        });
        if prev.as_ref() == Some(&status) {
            return;
        }
        self.status_in_flight = true;
        let api: Api<TenstorrentDriverPolicy> = Api::all(self.ctx.client.clone());
        let name = self.name.clone();
        let replacing = unreadable
            .as_ref()
            .map(|_| policy.metadata.resource_version.clone());
        if let Some(why) = &unreadable {
            tracing::warn!(
                policy = name,
                why,
                "replacing a status this controller cannot read"
            );
            self.ctx.event(
                policy.as_ref(),
                true,
                "UnreadableStatusReplaced",
                "Status",
                format!(
                    "the policy's status was not written by this controller and does not parse ({}): replaced by ours",
                    crate::refusal::shorten(why)
                ),
            );
        }
        let fut = async move {
            let res = if replacing.is_some() {
                // A merge patch would keep the foreign fields: replace the
                // whole status (JSON patch: `add` replaces an existing member).
                let ops: json_patch::Patch = serde_json::from_value(serde_json::json!([
                    { "op": "add", "path": "/status", "value": status }
                ]))
                .expect("a JSON patch");
                api.patch_status(&name, &PatchParams::default(), &Patch::Json::<()>(ops))
                    .await
            } else {
                let patch = serde_json::json!({ "status": status });
                api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
            };
            (res, status, replacing)
        };
        actx.spawn(fut.into_actor(self).map(|(res, status, replacing), act, _| {
            act.status_in_flight = false;
            match res {
                Ok(_) => {
                    if let Some(rv) = replacing {
                        act.replaced_unreadable = rv;
                    }
                    act.last_status = Some(status);
                    act.last_status_write = Some(Instant::now());
                }
                Err(e) => {
                    // Retried by the next pass (at the latest the periodic one).
                    act.ctx.metrics.inc_error(&act.name, "kube_api");
                    tracing::warn!(policy = act.name, error = %e, "writing status failed; will retry");
                }
            }
        }));
    }
}

/// Least time between two status writes that only carry per-node progress.
const STATUS_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

mod pass;
#[cfg(test)]
mod tests;

use pass::{PassOut, ReconcilePass, Refused};
