//! NodeActor (one per node a policy owns): owns that node's upgrade record, runs
//! the state machine on each observation and carries out its commands. A
//! disruptive cycle starts only on an observation that carries a slot (granted
//! by its policy's RolloutActor in the pass's plan); the actor gives the slot
//! back when the cycle ends, or at once when its step did not use it. The record is persisted
//! on the Node in the same merge patch as any cordon, uncordon or gate change,
//! before pods are evicted or replaced.
//!
//! What to write for a step is decided in `writes`, without I/O; what a step
//! reports, in `report`; the validation pod goes through the
//! [`validation_pod`] port.

mod report;
pub mod validation_pod;
mod writes;

use std::sync::Arc;

use actix::prelude::*;
use k8s_openapi::api::core::v1::Node;
use ttdrv_api::{NodeState, TenstorrentDriverPolicy};
use ttdrv_core::drain::{DrainPass, PodRef};
use ttdrv_core::machine::own_write::through_own_write;
use ttdrv_core::machine::{Desired, DriverCycle, NodeRecord, Observation, Step, step};
use ttdrv_core::slots::gate;

use super::rollout::ReleaseSlot;
use crate::node_patch::record_patch;
use crate::runtime::claims::{Budget, Holder, Refused};
use crate::runtime::context::Context;
use crate::workers::evictor::Evict;
use crate::workers::labeler::PatchNode;
use crate::workers::renderer::ReplaceInstallerPod;
use crate::{Error, Result};
use report::StepReport;
use validation_pod::{DeleteValidationPod, RunValidationPod};
use writes::{Known, PortCall, Writes};

/// Where a NodeActor sends its work: the shared Labeler, Evictor and
/// DaemonSetRenderer, and its policy's RolloutActor and ValidationPods.
/// Recipients, so tests put recording fakes in their place.
#[derive(Clone)]
pub struct NodePorts {
    pub patch: Recipient<PatchNode>,
    pub evict: Recipient<Evict>,
    pub replace_pod: Recipient<ReplaceInstallerPod>,
    pub release: Recipient<ReleaseSlot>,
    pub run_validation: Recipient<RunValidationPod>,
    pub delete_validation: Recipient<DeleteValidationPod>,
    /// Where the actor posts the record each step ends with.
    pub board: RecordBoard,
}

/// The record each of a policy's NodeActors ended its last step with, until
/// the policy takes it in. A pass waits only for the steps of nodes out of
/// service; the others (build-ahead's pod replacements, nodes waiting) end
/// after it, and their records reach the policy's memory through here, at
/// the start or end of a later pass. Each actor posts in the order of its
/// steps, so an entry is always its node's latest record, whatever order
/// the replies come back in.
#[derive(Clone, Debug, Default)]
pub struct RecordBoard(Arc<std::sync::Mutex<std::collections::HashMap<String, NodeRecord>>>);

impl RecordBoard {
    fn post(&self, node: &str, record: &NodeRecord) {
        if let Ok(mut b) = self.0.lock() {
            b.insert(node.to_string(), record.clone());
        }
    }

    /// Every record posted since the last take.
    pub fn take(&self) -> std::collections::HashMap<String, NodeRecord> {
        self.0
            .lock()
            .map(|mut b| std::mem::take(&mut *b))
            .unwrap_or_default()
    }
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
            .release(&self.node, &Holder::driver(self.policy.clone()));
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
    pub budget: Arc<crate::runtime::claims::Budget>,
}

impl Handler<Observe> for NodeActor {
    type Result = AtomicResponse<Self, Result<NodeRecord>>;

    fn handle(&mut self, msg: Observe, _: &mut Self::Context) -> Self::Result {
        let prev = self.previous_record(&msg);
        let job = ObserveJob {
            ctx: self.ctx.clone(),
            node: self.node.clone(),
            policy: self.policy.clone(),
            ports: self.ports.clone(),
            had_record: self.record.is_some(),
            already_deleted: self.deleted_installer.clone(),
            msg,
        };
        AtomicResponse::new(Box::pin(
            job.run(prev)
                .into_actor(self)
                .map(|res, act, actx| act.absorb(res, actx)),
        ))
    }
}

impl NodeActor {
    /// The record the step starts from: ours, else the one persisted on the
    /// Node if it is of this policy, else a new one.
    fn previous_record(&self, msg: &Observe) -> NodeRecord {
        self.record
            .clone()
            .or(msg.persisted.clone())
            .filter(|r| r.policy == self.policy)
            .unwrap_or_else(|| NodeRecord::new(&self.policy, &msg.desired.version, msg.obs.now))
    }

    /// Keeps what an observation's job ended with: the record, and the
    /// installer pod it deleted.
    fn absorb(
        &mut self,
        res: Result<(NodeRecord, Option<PodRef>)>,
        actx: &mut actix::Context<Self>,
    ) -> Result<NodeRecord> {
        let res = res.map(|(record, deleted)| {
            if deleted.is_some() {
                self.deleted_installer = deleted;
            }
            record
        });
        match &res {
            Ok(r) => {
                self.ports.board.post(&self.node, r);
                self.record = Some(r.clone());
            }
            // An error that retrying cannot fix: stop, so the Supervisor
            // restarts this actor and it reloads the record from the Node.
            Err(e) if !e.is_transient() => actx.stop(),
            Err(_) => {}
        }
        res
    }
}

/// One observation carried out. It owns what it needs, so its future does
/// not borrow the actor across awaits.
struct ObserveJob {
    ctx: Arc<Context>,
    node: String,
    policy: String,
    ports: NodePorts,
    /// The actor held a record before this observation: it has written one.
    had_record: bool,
    /// The installer pod the actor last deleted.
    already_deleted: Option<PodRef>,
    msg: Observe,
}

impl ObserveJob {
    /// Steps, writes what the step decided, reports it, and steps again on
    /// the API server's reply where the step waits only for our own write;
    /// then gives back what the node no longer needs. Returns the record and
    /// the installer pod deleted, if any.
    async fn run(self, prev: NodeRecord) -> Result<(NodeRecord, Option<PodRef>)> {
        let mut obs = self.msg.obs.clone();
        let first = prev.clone();
        let mut prev = prev;
        let (mut next, mut folded) = through_own_write(
            self.step_with_claim(&prev, &mut obs),
            &obs,
            &self.msg.desired,
        );
        let mut deleted = None;
        let mut hop = 0;
        loop {
            let writes = writes::decide(&next, &self.known(&prev, hop == 0));
            let written = self.carry_out(&writes, &next, &mut deleted).await?;
            // A state folded into this write is reported as it was passed.
            let report = self.report();
            match folded.take() {
                Some(mid) => {
                    report.step(&prev, &mid).await;
                    report.step(&mid, &next.record).await;
                }
                None => report.step(&prev, &next.record).await,
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
            obs = ttdrv_core::observe::restate(obs, &stored, &self.msg.gates);
            let after = step(&next.record, &obs, &self.msg.desired);
            if after.record == next.record && after.commands.is_empty() {
                break;
            }
            let (after, mid) = through_own_write(after, &obs, &self.msg.desired);
            folded = mid;
            hop += 1;
            prev = std::mem::replace(&mut next, after).record;
        }
        self.give_back(&first, &next.record, obs.slot);
        Ok((next.record, deleted))
    }

    fn holder(&self) -> Holder {
        Holder::driver(self.policy.clone())
    }

    /// The step. One disruption at a time: a cycle starts only with the
    /// node's claim, taken in the same instant as the decision; a firmware
    /// cycle that took it first makes this step a wait. A start that takes
    /// the node out of service is checked against the budget in the same
    /// instant: a firmware cycle started since the plan may have taken the
    /// last place. `obs` is left as the step saw it.
    fn step_with_claim(&self, prev: &NodeRecord, obs: &mut Observation) -> Step {
        let take = |h, b: Option<&Budget>| self.ctx.claims.take_within(&self.node, h, b);
        let (next, refused) = gate::<DriverCycle>(
            take,
            &self.policy,
            prev,
            obs,
            &self.msg.desired,
            &self.msg.budget,
        );
        if let Some(Refused::OverBudget { out, cap }) = refused {
            tracing::info!(
                policy = self.policy.as_str(),
                node = self.node.as_str(),
                out,
                cap,
                "cycle start deferred: a cycle started since the plan took the last place"
            );
        }
        next
    }

    /// What the write decision looks at; `first_hop`: no step of this
    /// observation has been carried out yet.
    fn known<'a>(&'a self, prev: &'a NodeRecord, first_hop: bool) -> Known<'a> {
        let msg = &self.msg;
        Known {
            prev,
            persisted: msg.persisted.as_ref(),
            nothing_written: first_hop && !self.had_record,
            evictions: &msg.evictions,
            installer_pod: msg.installer_pod.as_ref(),
            already_deleted: self.already_deleted.as_ref(),
            validation_template: msg.desired.validation_pod.as_deref(),
            validation_pod: msg.obs.validation_pod.as_ref().map(|v| v.pod.as_str()),
        }
    }

    /// Carries out `writes` in order: the record patch (with the step's node
    /// commands) first, then the port calls. Returns the Node as the API
    /// server stored it, if patched; `deleted` gets the installer pod deleted.
    async fn carry_out(
        &self,
        writes: &Writes,
        next: &Step,
        deleted: &mut Option<PodRef>,
    ) -> Result<Option<Node>> {
        let mut written = None;
        if writes.patch_record {
            let patch = record_patch(&self.node, &next.record, &next.commands, &self.msg.gates)?;
            let stored = self
                .ports
                .patch
                .send(PatchNode {
                    node: self.node.clone(),
                    patch,
                    action: "persisting upgrade state",
                })
                .await??;
            written = Some(stored);
        }
        for call in &writes.calls {
            match call {
                PortCall::Evict(pods) => self.evict(pods.clone()).await?,
                PortCall::ReplaceInstallerPod(pod) => {
                    self.replace_installer_pod(pod).await?;
                    *deleted = Some(pod.clone());
                }
                PortCall::RunValidationPod { template, cycle } => {
                    self.run_validation_pod(template, *cycle).await;
                }
                PortCall::DeleteValidationPod { namespace, name } => {
                    self.delete_validation_pod(namespace, name).await;
                }
            }
        }
        Ok(written)
    }

    async fn evict(&self, pods: Vec<(PodRef, DrainPass)>) -> Result<()> {
        let out = self
            .ports
            .evict
            .send(Evict {
                policy: self.policy.clone(),
                pods,
                firmware: false,
            })
            .await?;
        let node = self.node.as_str();
        if !out.held.is_empty() {
            tracing::debug!(node, pods = ?out.held, "evictions held back by their backoff");
        }
        for e in &out.errors {
            tracing::warn!(node, error = e, "eviction failed; will retry");
            self.ctx.metrics.inc_error(&self.policy, "evict");
        }
        Ok(())
    }

    async fn replace_installer_pod(&self, pod: &PodRef) -> Result<()> {
        self.ports
            .replace_pod
            .send(ReplaceInstallerPod {
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
            })
            .await??;
        let node = self.node.as_str();
        tracing::info!(node, pod = %pod, "installer pod deleted for replacement");
        Ok(())
    }

    /// A failure is logged and retried at the next pass; the machine fails
    /// the node if no pod comes within the upgrade timeout.
    async fn run_validation_pod(&self, template: &str, cycle: i64) {
        let run = RunValidationPod {
            policy: self.msg.policy.clone(),
            template: template.to_string(),
            node: self.node.clone(),
            cycle,
        };
        let created =
            (self.ports.run_validation.send(run).await).unwrap_or_else(|e| Err(Error::from(e)));
        let node = self.node.as_str();
        match created {
            Ok(pod) => tracing::info!(node, pod, "validation pod created"),
            Err(e) => {
                tracing::warn!(node, error = %e, "cannot create the validation pod; will retry");
                self.ctx.metrics.inc_error(&self.policy, e.metric_label());
            }
        }
    }

    /// Best effort: the pod is owned by the policy and goes with it.
    async fn delete_validation_pod(&self, namespace: &str, name: &str) {
        let delete = DeleteValidationPod {
            namespace: namespace.to_string(),
            name: name.to_string(),
        };
        let deleted = (self.ports.delete_validation.send(delete).await)
            .unwrap_or_else(|e| Err(Error::from(e)));
        if let Err(e) = deleted {
            let node = self.node.as_str();
            tracing::warn!(node, pod = name, error = %e, "cannot delete the validation pod");
        }
    }

    fn report(&self) -> StepReport<'_> {
        StepReport {
            ctx: &self.ctx,
            policy: &self.msg.policy,
            policy_name: &self.policy,
            node: &self.node,
            drain_timeout_seconds: self.msg.desired.drain_timeout_seconds,
            now: self.msg.obs.now,
            skipped: &self.msg.skipped,
            ungated_holders: self.msg.obs.ungated_holders.as_deref(),
        }
    }

    /// The slot and the claim, when the step no longer needs them.
    fn give_back(&self, first: &NodeRecord, next: &NodeRecord, granted: bool) {
        let releases = writes::releases(first, next, granted);
        if releases.slot {
            self.ports.release.do_send(ReleaseSlot {
                node: self.node.clone(),
            });
        }
        if releases.claim {
            self.ctx.claims.release(&self.node, &self.holder());
        }
    }
}

/// Steps chained on the API server's replies within one observation.
const MAX_HOPS: usize = 2;

#[cfg(test)]
mod tests;
