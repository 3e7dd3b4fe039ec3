//! NodeActor (one per node a policy owns): owns that node's upgrade record, runs
//! the state machine on each observation and carries out its commands. A
//! disruptive cycle starts only on an observation that carries a slot (granted
//! by its policy's RolloutActor in the pass's plan); the actor gives the slot
//! back when the cycle ends, or at once when its step did not use it. The record is persisted
//! on the Node in the same merge patch as any cordon, uncordon or gate change,
//! before pods are evicted or replaced.

use std::sync::Arc;

use actix::prelude::*;
use ttdrv_api::{NodeState, TenstorrentDriverPolicy};
use ttdrv_core::drain::{DrainPass, PodRef};
use ttdrv_core::event::EventReason;
use ttdrv_core::machine::{Command, Desired, NodeRecord, Observation, step};
use ttdrv_core::reason;

use super::evictor::Evict;
use super::labeler::PatchNode;
use super::renderer::ReplaceInstallerPod;
use super::rollout::ReleaseSlot;
use crate::claims::{Holder, Refused};
use crate::context::Context;
use crate::node_patch::record_patch;
use crate::{Error, Result};

/// Where a NodeActor sends its work: the shared Labeler, Evictor and
/// DaemonSetRenderer, and its policy's RolloutActor. Recipients, so tests put
/// recording fakes in their place.
#[derive(Clone)]
pub struct NodePorts {
    pub patch: Recipient<PatchNode>,
    pub evict: Recipient<Evict>,
    pub replace_pod: Recipient<ReplaceInstallerPod>,
    pub release: Recipient<ReleaseSlot>,
}

pub struct NodeActor {
    ctx: Arc<Context>,
    node: String,
    policy: String,
    /// Authoritative once we have written it; the cache may lag behind.
    record: Option<NodeRecord>,
    /// The installer pod this actor last deleted: until the cache shows the
    /// deletion, the pod still looks current-but-stale and is not deleted twice.
    deleted_installer: Option<PodRef>,
    ports: NodePorts,
}

impl NodeActor {
    pub fn new(ctx: Arc<Context>, node: String, policy: String, ports: NodePorts) -> Self {
        Self {
            ctx,
            node,
            policy,
            record: None,
            deleted_installer: None,
            ports,
        }
    }
}

impl Actor for NodeActor {
    type Context = actix::Context<Self>;

    /// The node left the policy (or the policy went) while this actor may
    /// hold its claim: give it back, or no firmware cycle could start there
    /// until a restart. A record still mid-cycle on the Node keeps the
    /// firmware away all the same ([`ttdrv_core::claim::driver_cycle`]).
    fn stopped(&mut self, _: &mut Self::Context) {
        self.ctx
            .claims
            .release(&self.node, &Holder::Driver(self.policy.clone()));
    }
}

impl Supervised for NodeActor {
    fn restarting(&mut self, _: &mut Self::Context) {
        // Forget what we held in memory: the next observation reloads the record
        // persisted on the Node.
        self.record = None;
        self.deleted_installer = None;
        self.ctx.metrics.inc_actor_restart("node");
    }
}

#[derive(Message)]
#[rtype(result = "()")]
pub struct StopNode;

impl Handler<StopNode> for NodeActor {
    type Result = ();
    fn handle(&mut self, _: StopNode, ctx: &mut Self::Context) {
        ctx.stop();
    }
}

/// A fresh observation of the node; replies with the record after the step.
#[derive(Message)]
#[rtype(result = "Result<NodeRecord>")]
pub struct Observe {
    pub policy: Arc<TenstorrentDriverPolicy>,
    pub obs: Observation,
    pub desired: Desired,
    /// Record as persisted on the Node (used when this actor has none yet).
    pub persisted: Option<NodeRecord>,
    /// Pods the drain would evict now (not yet terminating), pass 1 first.
    pub evictions: Vec<(PodRef, DrainPass)>,
    /// The node's installer pod, if any.
    pub installer_pod: Option<PodRef>,
    /// Pods the drain leaves in place, with why (reported when the drain ends).
    pub skipped: Vec<String>,
    pub gates: Vec<String>,
    /// The budget a start that takes the node out of service is checked
    /// against when it takes the node's claim.
    pub budget: Arc<crate::claims::Budget>,
}

impl Handler<Observe> for NodeActor {
    type Result = AtomicResponse<Self, Result<NodeRecord>>;

    fn handle(&mut self, msg: Observe, _: &mut Self::Context) -> Self::Result {
        let now = msg.obs.now;
        let had_record = self.record.is_some();
        let prev = self
            .record
            .clone()
            .or(msg.persisted.clone())
            .filter(|r| r.policy == self.policy)
            .unwrap_or_else(|| NodeRecord::new(&self.policy, &msg.desired.version, now));
        let (ctx, node, ports) = (self.ctx.clone(), self.node.clone(), self.ports.clone());
        let policy_name = self.policy.clone();
        let already_deleted = self.deleted_installer.clone();
        let fut = async move {
            let mut obs = msg.obs.clone();
            let first = prev.clone();
            let mut prev = prev;
            let mut next = step(&prev, &obs, &msg.desired);
            // One disruption at a time: a cycle starts only with the node's
            // claim, taken in the same instant as the decision; a firmware
            // cycle that took it first makes this step a wait.
            // A start that takes the node out of service is checked against
            // the budget in the same instant: a firmware cycle started since
            // the plan may have taken the last place.
            let holder = Holder::Driver(policy_name.clone());
            if starts_cycle(&prev, &next.record) {
                let budget = Some(msg.budget.as_ref()).filter(|_| next.record.occupies_slot());
                match ctx.claims.take_within(&node, holder.clone(), budget) {
                    Ok(()) => {}
                    Err(Refused::Held(other)) => {
                        obs.held_by = Some(other);
                        next = step(&prev, &obs, &msg.desired);
                    }
                    Err(Refused::OverBudget { out, cap }) => {
                        tracing::info!(
                            policy = policy_name,
                            node,
                            out,
                            cap,
                            "cycle start deferred: a cycle started since the plan took the last place"
                        );
                        obs.slot = false;
                        next = step(&prev, &obs, &msg.desired);
                    }
                }
            }
            let mut deleted = None;
            let mut hop = 0;
            loop {
                let node_cmds = next.commands.iter().any(|c| {
                    matches!(
                        c,
                        Command::Cordon
                            | Command::Uncordon
                            | Command::CloseGates
                            | Command::OpenGates
                            | Command::Vacate
                    )
                });
                // Compare with the cache's copy only before this actor has written
                // anything: afterwards the cache may simply lag behind our write.
                let unpersisted =
                    hop == 0 && !had_record && msg.persisted.as_ref() != Some(&next.record);
                // A Done node that a new version sends back to Pending is not
                // written: the Pending record follows from the Done one and the
                // policy, a restarted controller derives it again, and the status
                // shows it. At rollout start that saves one patch per node (1000
                // patches, and seconds before the first cordon, at 1000 nodes);
                // the record is written with the cordon that starts the cycle.
                // Except a node waiting for the firmware: the firmware policy
                // reads that record to hand its cordon over
                // ([`ttdrv_core::claim::handover_to`]).
                let derivable = next.commands.is_empty()
                    && next.record.state == NodeState::Pending
                    && next.record.reason.as_deref()
                        != Some(ttdrv_core::reason::WAITING_FOR_FIRMWARE)
                    && prev.state == NodeState::Done
                    && msg
                        .persisted
                        .as_ref()
                        .is_some_and(|p| p.state == NodeState::Done);
                // A vacated node is left alone: its Unmanaged record follows
                // from its `unmanaged` mark and is never written.
                let derivable = derivable
                    || (next.commands.is_empty() && next.record.state == NodeState::Unmanaged);
                let mut written = None;
                if (next.record != prev || node_cmds || unpersisted) && !derivable {
                    let patch = record_patch(&node, &next.record, &next.commands, &msg.gates)?;
                    let stored = ports
                        .patch
                        .send(PatchNode {
                            node: node.clone(),
                            patch,
                            action: "persisting upgrade state",
                        })
                        .await??;
                    written = Some(stored);
                }
                for c in &next.commands {
                    match c {
                        Command::Evict if !msg.evictions.is_empty() => {
                            let out = ports
                                .evict
                                .send(Evict {
                                    policy: policy_name.clone(),
                                    pods: msg.evictions.clone(),
                                    firmware: false,
                                })
                                .await?;
                            if !out.held.is_empty() {
                                tracing::debug!(node, pods = ?out.held, "evictions held back by their backoff");
                            }
                            for e in &out.errors {
                                tracing::warn!(node, error = e, "eviction failed; will retry");
                                ctx.metrics.inc_error(&policy_name, "evict");
                            }
                        }
                        Command::DeleteInstallerPod => {
                            let pod = msg
                                .installer_pod
                                .as_ref()
                                .filter(|p| already_deleted.as_ref() != Some(*p));
                            if let Some(p) = pod {
                                ports
                                    .replace_pod
                                    .send(ReplaceInstallerPod {
                                        namespace: p.namespace.clone(),
                                        name: p.name.clone(),
                                    })
                                    .await??;
                                tracing::info!(node, pod = %p, "installer pod deleted for replacement");
                                deleted = Some(p.clone());
                            }
                        }
                        Command::RunValidationPod => {
                            let (Some(template), Some(cycle)) =
                                (msg.desired.validation_pod.as_deref(), next.record.started)
                            else {
                                continue;
                            };
                            // A failure is logged and retried at the next
                            // pass; the machine fails the node if no pod
                            // comes within the upgrade timeout.
                            match crate::validation_pod::run(
                                ctx.client.clone(),
                                template,
                                &msg.policy,
                                &node,
                                cycle,
                                &ctx.config.namespace,
                            )
                            .await
                            {
                                Ok(pod) => tracing::info!(node, pod, "validation pod created"),
                                Err(e) => {
                                    tracing::warn!(node, error = %e, "cannot create the validation pod; will retry");
                                    ctx.metrics.inc_error(&policy_name, e.metric_label());
                                }
                            }
                        }
                        Command::DeleteValidationPod => {
                            let Some((ns, name)) = msg
                                .obs
                                .validation_pod
                                .as_ref()
                                .and_then(|v| v.pod.split_once('/'))
                            else {
                                continue;
                            };
                            let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
                                kube::Api::namespaced(ctx.client.clone(), ns);
                            if let Err(e) = pods.delete(name, &Default::default()).await {
                                // Best effort: it is owned by the policy and
                                // goes with it.
                                tracing::warn!(node, pod = name, error = %e, "cannot delete the validation pod");
                            }
                        }
                        _ => {}
                    }
                }
                let not_ready = Some(ttdrv_core::reason::NODE_NOT_READY);
                if next.record.reason.as_deref() == not_ready
                    && prev.reason.as_deref() != not_ready
                    && next.record.state == prev.state
                {
                    tracing::warn!(
                        policy = policy_name,
                        node,
                        state = next.record.state.as_str(),
                        "node not Ready mid-cycle; it keeps its slot"
                    );
                    ctx.event(
                        msg.policy.as_ref(),
                        true,
                        EventReason::NodeNotReady,
                        "Upgrade",
                        format!(
                            "node {node}: not Ready while {}; it keeps its slot and the cycle goes on when it is back",
                            next.record.state.as_str()
                        ),
                    );
                }
                // One Event when a budget starts blocking the drain (the
                // status message says it on every pass).
                if let Some(note) = ttdrv_core::event::drain_blocked_message(
                    &node,
                    &prev,
                    &next.record,
                    msg.desired.drain_timeout_seconds,
                    now,
                ) {
                    tracing::warn!(policy = policy_name, node, "{note}");
                    ctx.event(
                        msg.policy.as_ref(),
                        true,
                        EventReason::DrainBlocked,
                        "Drain",
                        note,
                    );
                }
                if next.record.state != prev.state {
                    report_transition(&ctx, &msg.policy, &node, &prev, &next.record).await;
                    if prev.state == NodeState::Draining && !msg.skipped.is_empty() {
                        let note = format!(
                            "node {node}: drain left these pods in place: {}",
                            msg.skipped.join(", ")
                        );
                        ctx.event(
                            msg.policy.as_ref(),
                            true,
                            EventReason::PodsNotEvicted,
                            "Drain",
                            note,
                        );
                    }
                }
                // Cordoning and Uncordoning wait only for our own write to show.
                // The API server's reply to it is that write, fresher than the
                // cache: step on it now instead of a watch round trip later.
                let Some(stored) = written else { break };
                let waits_on_own_write = matches!(
                    next.record.state,
                    NodeState::Cordoning | NodeState::Uncordoning
                );
                if !waits_on_own_write || hop == MAX_HOPS {
                    break;
                }
                obs = ttdrv_core::observe::restate(obs, &stored, &msg.gates);
                let after = step(&next.record, &obs, &msg.desired);
                if after.record == next.record && after.commands.is_empty() {
                    break;
                }
                hop += 1;
                prev = std::mem::replace(&mut next, after).record;
            }
            // The cycle ended (Done, Failed, back to Pending), or the step did
            // not use the slot it was granted: the slot goes back. Idempotent,
            // so also sent when the slot was never held here.
            if !next.record.occupies_slot() && (first.occupies_slot() || obs.slot) {
                ports.release.do_send(ReleaseSlot { node: node.clone() });
            }
            if !next.record.state.is_in_progress() {
                ctx.claims.release(&node, &holder);
            }
            Ok::<_, Error>((next.record, deleted))
        };
        AtomicResponse::new(Box::pin(fut.into_actor(self).map(|res, act, actx| {
            let res = res.map(|(record, deleted)| {
                if deleted.is_some() {
                    act.deleted_installer = deleted;
                }
                record
            });
            match &res {
                Ok(r) => act.record = Some(r.clone()),
                // An error that retrying cannot fix: stop, so the Supervisor
                // restarts this actor and it reloads the record from the Node.
                Err(e) if !e.is_transient() => actx.stop(),
                Err(_) => {}
            }
            res
        })))
    }
}

/// The step takes the node out of service for a cycle of ours.
fn starts_cycle(prev: &NodeRecord, next: &NodeRecord) -> bool {
    !prev.state.is_in_progress()
        && matches!(
            next.state,
            NodeState::Cordoning
                | NodeState::Draining
                | NodeState::Upgrading
                | NodeState::Unloading
        )
}

/// Steps chained on the API server's replies within one observation.
const MAX_HOPS: usize = 2;

async fn report_transition(
    ctx: &Context,
    policy: &TenstorrentDriverPolicy,
    node: &str,
    prev: &NodeRecord,
    next: &NodeRecord,
) {
    let cr = policy.metadata.name.clone().unwrap_or_default();
    let m = &ctx.metrics;
    m.observe_transition(
        &cr,
        prev.state,
        next.state,
        (next.since - prev.since).max(0) as f64,
    );
    tracing::info!(
        policy = cr,
        node,
        from = prev.state.as_str(),
        to = next.state.as_str(),
        reason = next.reason.as_deref().unwrap_or(""),
        "node transition"
    );
    match next.state {
        NodeState::Cordoning => {
            ctx.event(
                policy,
                false,
                EventReason::NodeUpgradeStarted,
                "Cordon",
                format!("node {node}: cordoned to upgrade tt-kmd to {}", next.target),
            );
        }
        NodeState::Done
            if next.reason.as_deref() == Some(reason::VFIO_PASSTHROUGH)
                && prev.reason != next.reason =>
        {
            ctx.event(
                policy,
                false,
                EventReason::NodePassthrough,
                "Skip",
                format!(
                    "node {node}: {}",
                    next.message.as_deref().unwrap_or(reason::VFIO_PASSTHROUGH)
                ),
            );
        }
        NodeState::Done if prev.state.is_in_progress() => {
            if let Some(start) = prev.started {
                m.observe_node_upgrade(&cr, (next.since - start).max(0) as f64);
            }
            ctx.event(
                policy,
                false,
                EventReason::NodeUpgraded,
                "Upgrade",
                ttdrv_core::event::node_upgraded_message(node, prev, &next.target),
            );
        }
        NodeState::Draining
            if next.reason.as_deref() == Some(reason::DRAIN_AGAIN)
                && prev.state != NodeState::Draining =>
        {
            ctx.event(
                policy,
                true,
                EventReason::NodeDrainedAgain,
                "Drain",
                format!(
                    "node {node}: {}",
                    next.message.as_deref().unwrap_or(reason::DRAIN_AGAIN)
                ),
            );
        }
        NodeState::Uncordoning if next.halts_rollout() && !prev.halts_rollout() => {
            m.inc_rollback(&cr);
            ctx.event(
                policy,
                true,
                EventReason::NodeRolledBack,
                "Rollback",
                format!(
                    "node {node}: {}",
                    next.message.as_deref().unwrap_or(reason::VALIDATION_FAILED)
                ),
            );
        }
        NodeState::Failed => {
            let reason = next.reason.as_deref().unwrap_or("Other");
            m.inc_failure(&cr, reason);
            ctx.event(
                policy,
                true,
                EventReason::NodeUpgradeFailed,
                "Upgrade",
                format!("node {node}: {}", next.message.as_deref().unwrap_or(reason)),
            );
        }
        NodeState::Unloading | NodeState::Unmanaged | NodeState::UnloadFailed => {
            report_vacate(ctx, policy, node, next);
        }
        _ => {}
    }
}

/// Events and the failure count of the vacate cycle (`spec.unmanage`).
fn report_vacate(ctx: &Context, policy: &TenstorrentDriverPolicy, node: &str, next: &NodeRecord) {
    let cr = policy.metadata.name.clone().unwrap_or_default();
    let reason = next.reason.as_deref().unwrap_or("Other");
    let (warning, event, note) = match next.state {
        NodeState::Unloading => (
            false,
            EventReason::NodeUnloading,
            format!("node {node}: drained; the installer unloads tt-kmd"),
        ),
        NodeState::Unmanaged => (
            false,
            EventReason::NodeUnmanaged,
            format!("node {node}: vacated ({reason}); left alone from now on"),
        ),
        _ => {
            ctx.metrics.inc_failure(&cr, reason);
            (
                true,
                EventReason::NodeUnloadFailed,
                format!("node {node}: {}", next.message.as_deref().unwrap_or(reason)),
            )
        }
    };
    ctx.event(policy, warning, event, "Unmanage", note);
}

#[cfg(test)]
mod tests;
