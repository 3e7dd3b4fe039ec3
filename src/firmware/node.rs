//! One node's actor under a firmware policy: it steps the node's firmware
//! cycle (the pure [`ttdrv_core::firmware::step`]) on what the policy's pass
//! observed, takes the node's claim when a cycle starts (one disruption at a
//! time, within the budget), persists the record with its cordon, uncordon or
//! hand-over in one patch, and carries out the rest: evictions, the flash
//! Job, Events and metrics. Stopping it gives its claim back.
//!
//! It remembers the flash Job it created ([`OwnJobMemory`]) until its cache
//! shows it: the step waits for a Job of its own that the watch has not
//! brought yet, and takes any other named Job missing from the cache as gone
//! (never created again by itself). A new actor (the controller restarted, or
//! the policy re-created) remembers nothing: a controller steps only once its
//! caches have listed, so for it a missing Job is really missing.

use std::sync::Arc;

use actix::prelude::*;
use ttdrv_api::firmware::{FirmwareNodeState, TenstorrentFirmwarePolicy, reason};
use ttdrv_core::drain::{DrainPass, PodRef};
use ttdrv_core::event::EventReason;
use ttdrv_core::firmware::job::{JobDefaults, flash_job};
use ttdrv_core::firmware::{Command, Desired, FirmwareCycle, FlashJob, FwRecord, OwnJob};
use ttdrv_core::slots::gate;

use super::jobs::{CreateFlashJob, JobCreate};
use super::seen::Seen;
use crate::runtime::claims::{Budget, Holder, Refused};
use crate::runtime::context::Context;
use crate::workers::{Evict, PatchNode};

/// Where a firmware node actor sends its work: the shared Labeler (every
/// Node write), Evictor and flash Job writer. Recipients, so tests put
/// recording fakes in their place, as the driver's node actor does.
#[derive(Clone)]
pub(crate) struct FwNodePorts {
    pub(crate) patch: Recipient<PatchNode>,
    pub(crate) evict: Recipient<Evict>,
    pub(crate) create_job: Recipient<CreateFlashJob>,
}

struct Ports {
    ctx: Arc<Context>,
    to: FwNodePorts,
}

pub(crate) struct NodeActor {
    ports: Arc<Ports>,
    node: String,
    policy: String,
    /// The flash Job this actor named and created (or failed to), until its
    /// cache shows it. Taken while a step runs.
    own_job: Option<OwnJobMemory>,
}

/// What a node actor did about one flash Job.
#[derive(Clone, Debug, PartialEq, Eq)]
struct OwnJobMemory {
    /// The policy object it was done for: a policy deleted and re-created
    /// under the same name is another one (its Jobs went with the old).
    policy_uid: Option<String>,
    job: String,
    what: OwnJob,
}

impl OwnJobMemory {
    /// What the step is told about the Job `prev` names, as `seen` shows
    /// it; the memory is forgotten once the cache shows the Job (or the
    /// record names another, or the policy object changed).
    fn observe(
        mem: &mut Option<Self>,
        policy_uid: Option<&str>,
        prev: &FwRecord,
        seen: &FlashJob,
    ) -> OwnJob {
        let Some(m) = mem.as_ref() else {
            return OwnJob::NotMine;
        };
        let same = m.policy_uid.as_deref() == policy_uid && prev.job.as_deref() == Some(&m.job);
        if !same || *seen != FlashJob::Missing {
            *mem = None;
            return OwnJob::NotMine;
        }
        m.what
    }
}

impl NodeActor {
    pub(crate) fn new(ctx: Arc<Context>, to: FwNodePorts, node: &str, policy: &str) -> Self {
        Self {
            ports: Arc::new(Ports { ctx, to }),
            node: node.into(),
            policy: policy.into(),
            own_job: None,
        }
    }
}

impl Actor for NodeActor {
    type Context = actix::Context<Self>;

    /// The node left the policy (or the policy went): its claim goes back.
    /// A record still mid-cycle on the Node keeps the driver away all the
    /// same ([`ttdrv_core::claim::firmware_cycle`]).
    fn stopped(&mut self, _: &mut Self::Context) {
        self.ports
            .ctx
            .claims
            .release(&self.node, &Holder::firmware(self.policy.clone()));
    }
}

/// Restarted by its Supervisor after a write error that retrying cannot fix
/// ([`Stepped::restart`]): the policy's pass then reads the node's record
/// from the Node again, not from its memory of the last write. What it
/// knows of its own flash Job stays: forgetting a Job it created that the
/// cache has not shown yet would take it for a vanished one.
impl Supervised for NodeActor {
    fn restarting(&mut self, _: &mut Self::Context) {
        self.ports.ctx.metrics.inc_actor_restart("firmware_node");
    }
}

/// Step the node on this observation (with its slot, if granted).
#[derive(Message)]
#[rtype(result = "Stepped")]
pub(crate) struct StepNode {
    pub(crate) policy: Arc<TenstorrentFirmwarePolicy>,
    pub(crate) desired: Desired,
    pub(crate) seen: Seen,
    pub(crate) budget: Arc<Budget>,
}

pub(crate) struct Stepped {
    /// The node's record after the step (the one before it if its write failed).
    pub(crate) record: FwRecord,
    /// The record written, if one was.
    pub(crate) written: Option<FwRecord>,
    /// Writes that failed (the policy's pass is then not a good one).
    pub(crate) errors: u32,
    /// The observation, given back for the status entry.
    pub(crate) seen: Seen,
    /// A write failed in a way retrying cannot fix (not a conflict, a
    /// throttle, a server error or a held write): the actor restarts, and
    /// the pass forgets the record it remembers for the node.
    pub(crate) restart: bool,
}

impl Handler<StepNode> for NodeActor {
    type Result = AtomicResponse<Self, Stepped>;

    fn handle(&mut self, msg: StepNode, _: &mut Self::Context) -> Self::Result {
        let ports = self.ports.clone();
        // Atomic: no other step of this node runs until it is given back.
        let mut own_job = self.own_job.take();
        let fut = async move {
            let StepNode {
                policy,
                desired,
                mut seen,
                budget,
            } = msg;
            let mut faults = Faults::default();
            let (record, written) = step_node(
                &ports,
                &policy,
                &desired,
                &mut seen,
                &budget,
                &mut own_job,
                &mut faults,
            )
            .await;
            let out = Stepped {
                record,
                written,
                errors: faults.errors,
                seen,
                restart: faults.restart,
            };
            (out, own_job)
        };
        AtomicResponse::new(Box::pin(fut.into_actor(self).map(
            |(out, own_job), act, actx| {
                act.own_job = own_job;
                if out.restart {
                    actx.stop();
                }
                out
            },
        )))
    }
}

/// What went wrong in a step: failed writes, and whether one calls for a
/// restart ([`Stepped::restart`]).
#[derive(Default)]
struct Faults {
    errors: u32,
    restart: bool,
}

async fn step_node(
    ports: &Ports,
    p: &TenstorrentFirmwarePolicy,
    desired: &Desired,
    s: &mut Seen,
    budget: &Budget,
    own_job: &mut Option<OwnJobMemory>,
    faults: &mut Faults,
) -> (FwRecord, Option<FwRecord>) {
    let ctx = &ports.ctx;
    let policy = desired.policy.clone();
    let node = s.node.metadata.name.clone().unwrap_or_default();
    let holder = Holder::firmware(policy.clone());
    let policy_uid = p.metadata.uid.clone();
    s.view.obs.own_job =
        OwnJobMemory::observe(own_job, policy_uid.as_deref(), &s.prev, &s.view.obs.job);
    // The Job a CreateJob of this step creates: the one its record names.
    let named = |next: &ttdrv_core::firmware::Step, what: OwnJob| {
        next.record.job.clone().map(|job| OwnJobMemory {
            policy_uid: policy_uid.clone(),
            job,
            what,
        })
    };
    // One disruption at a time, within the budget: the start takes the
    // node's slot in the same instant ([`ttdrv_core::slots::gate`]).
    let take = |h, b: Option<&Budget>| ctx.claims.take_within(&node, h, b);
    let (next, refused) =
        gate::<FirmwareCycle>(take, &policy, &s.prev, &mut s.view.obs, desired, budget);
    if let Some(Refused::OverBudget { out, cap }) = refused {
        tracing::info!(
            policy,
            node,
            out,
            cap,
            "flash cycle start deferred: a cycle started since the plan took the last place"
        );
    }
    let mut written = None;
    let write = next.record != s.prev
        || !next.commands.is_empty()
        || s.persisted.as_ref() != Some(&next.record);
    if write {
        let starts = !s.prev.state.is_in_progress() && next.record.state.is_in_progress();
        // A hand-over was decided on this version of the Node too (the
        // driver's record waiting for it).
        let hands_over = next
            .commands
            .iter()
            .any(|c| matches!(c, Command::HandOver(_)));
        let gates = ctx.config.gates();
        let patch = super::patch::node_patch(
            &s.node,
            &next,
            &desired.version,
            &gates,
            starts || hands_over,
        );
        let sent = ports
            .to
            .patch
            .send(PatchNode {
                node: node.clone(),
                patch,
                action: "persisting firmware state",
            })
            .await;
        match sent {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                if next.commands.contains(&Command::CreateJob) {
                    // The record may name the Job all the same (a write
                    // that failed on its way back): not created by us.
                    *own_job = named(&next, OwnJob::NotCreated);
                }
                tracing::warn!(policy, node, error = %e, "firmware record not written; retried next pass");
                ctx.metrics.inc_fw_error(&policy, "node_patch");
                faults.errors += 1;
                faults.restart = !e.is_transient();
                if starts {
                    // The cycle did not start: its claim goes back.
                    ctx.claims.release(&node, &holder);
                }
                return (s.prev.clone(), None);
            }
            Err(e) => {
                if next.commands.contains(&Command::CreateJob) {
                    *own_job = named(&next, OwnJob::NotCreated);
                }
                tracing::warn!(policy, node, error = %e, "labeler unavailable");
                faults.errors += 1;
                return (s.prev.clone(), None);
            }
        }
        written = Some(next.record.clone());
    }
    if !next.record.state.is_in_progress() {
        ctx.claims.release(&node, &holder);
    }
    for c in &next.commands {
        match c {
            Command::Evict if !s.view.evictions.is_empty() => {
                evict(ports, &policy, &node, &s.view.evictions).await;
            }
            // The node's DRA plugin pods from before the flash, through the
            // Eviction API as any drain (their DaemonSet starts fresh ones).
            Command::RestartPublishers(pods) if !pods.is_empty() => {
                let pods: Vec<(PodRef, DrainPass)> = pods
                    .iter()
                    .map(|p| (p.clone(), DrainPass::Device))
                    .collect();
                evict(ports, &policy, &node, &pods).await;
            }
            Command::CreateJob => {
                let created = match next.record.job.as_deref() {
                    Some(name) => {
                        create_job(
                            ports,
                            p,
                            &node,
                            name,
                            next.record.attempt,
                            &mut faults.errors,
                        )
                        .await
                    }
                    None => {
                        tracing::error!(
                            policy,
                            node,
                            "a flash Job to create that the record does not name: not created"
                        );
                        false
                    }
                };
                let what = if created {
                    OwnJob::CreatedUnseen { at: s.view.obs.now }
                } else {
                    OwnJob::NotCreated
                };
                *own_job = named(&next, what);
            }
            _ => {}
        }
    }
    report(ctx, p, &node, &s.prev, &next.record);
    (next.record, written)
}

/// The drain's next evictions, through the Evictor, counted as the firmware
/// policy's (`ttfw_*`).
async fn evict(ports: &Ports, policy: &str, node: &str, pods: &[(PodRef, DrainPass)]) {
    let ctx = &ports.ctx;
    let sent = ports
        .to
        .evict
        .send(Evict {
            policy: policy.to_string(),
            pods: pods.to_vec(),
            firmware: true,
        })
        .await;
    if let Ok(out) = sent {
        ctx.metrics.inc_fw_evicted(policy, out.evicted.len());
        ctx.metrics
            .inc_fw_drain_blocked(policy, "pdb", out.blocked.len());
        for e in &out.errors {
            tracing::warn!(policy, node, error = e, "eviction failed; will retry");
            ctx.metrics.inc_fw_error(policy, "evict");
        }
    }
}

/// Creates the flash Job `name` (the one the record names); true when it
/// exists now (created, or there already).
async fn create_job(
    ports: &Ports,
    p: &TenstorrentFirmwarePolicy,
    node: &str,
    name: &str,
    attempt: u32,
    errors: &mut u32,
) -> bool {
    let ctx = &ports.ctx;
    let defaults = JobDefaults {
        namespace: ctx.config.namespace.clone(),
        image: ctx.config.flasher_image.clone(),
        pull_policy: ctx.config.flasher_pull_policy.clone(),
        simulate_dir: ctx.config.flasher_simulate_dir.clone(),
    };
    let job = flash_job(p, node, attempt, &defaults);
    let cr = p.metadata.name.as_deref().unwrap_or_default();
    if job.metadata.name.as_deref() != Some(name) {
        // Both come from the same policy object, so this is a bug: never
        // a Job the record does not name.
        tracing::warn!(
            node,
            job = job.metadata.name.as_deref().unwrap_or_default(),
            named = name,
            "the flash Job differs from the one the record names; created next pass"
        );
        *errors += 1;
        return false;
    }
    match ports.to.create_job.send(CreateFlashJob { job }).await {
        Ok(Ok(how)) => {
            if how == JobCreate::Created {
                ctx.metrics.inc_flash_job_created(cr, true);
                tracing::info!(node, job = name, "flash Job created");
            }
            true
        }
        Ok(Err(e @ crate::Error::WriteHeld { .. })) => {
            // Its last create failed and its backoff has not passed: not
            // sent, not another failure.
            tracing::debug!(node, job = name, error = %e, "flash Job create held back");
            false
        }
        Ok(Err(e)) => {
            ctx.metrics.inc_flash_job_created(cr, false);
            ctx.metrics.inc_fw_error(cr, "job_create");
            *errors += 1;
            tracing::warn!(node, job = name, error = %e, "creating the flash Job; retried next pass");
            false
        }
        Err(e) => {
            *errors += 1;
            tracing::warn!(node, job = name, error = %e, "flash Job writer unavailable");
            false
        }
    }
}

/// A step of one node, for what it tells people.
#[derive(Clone, Copy)]
struct Reported<'a> {
    ctx: &'a Context,
    p: &'a TenstorrentFirmwarePolicy,
    node: &'a str,
    prev: &'a FwRecord,
    next: &'a FwRecord,
}

/// What a step tells people: its transition, if the state changed, and the
/// scheduling surface check (whose end is a change of reason within
/// Uncordoning).
fn report(
    ctx: &Context,
    p: &TenstorrentFirmwarePolicy,
    node: &str,
    prev: &FwRecord,
    next: &FwRecord,
) {
    let r = Reported {
        ctx,
        p,
        node,
        prev,
        next,
    };
    if next.state != prev.state {
        r.transition();
    }
    r.scheduling_surface();
}

impl Reported<'_> {
    fn transition(&self) {
        let (ctx, p, node, prev, next) = (self.ctx, self.p, self.node, self.prev, self.next);
        use FirmwareNodeState::*;
        let name = p.metadata.name.as_deref().unwrap_or_default();
        tracing::info!(
            policy = name,
            node,
            from = prev.state.as_str(),
            to = next.state.as_str(),
            reason = next.reason.as_deref().unwrap_or(""),
            "firmware node transition"
        );
        let m = &ctx.metrics;
        if prev.state == Flashing && next.state != Flashing {
            let ok = matches!(next.state, Uncordoning | Done);
            m.observe_flash(name, ok, (next.since - prev.since) as f64);
        }
        if next.reason.as_deref() == Some(reason::CORDON_HANDED_OVER) && prev.state == Flashing {
            m.inc_fw_cordon_handed_over(name);
        }
        if next.state == Failed && next.reason.as_deref() == Some(reason::DRAIN_TIMEOUT) {
            m.inc_fw_drain_blocked(name, "drain_timeout", 1);
        }
        let msg = next.message.clone().unwrap_or_default();
        let (warning, ev, note) = match next.state {
            _ if next.reason.as_deref() == Some(reason::TAKEN_OVER) => (
                next.state == Failed,
                EventReason::FirmwareTakenOver,
                format!("node {node}: {msg}"),
            ),
            Cordoning | Flashing if !prev.state.is_in_progress() => (
                false,
                EventReason::FirmwareFlashStarted,
                format!("node {node}: firmware cycle to {} started", next.target),
            ),
            Done if next.reason.as_deref() == Some(reason::CORDON_HANDED_OVER) => (
                false,
                EventReason::FirmwareFlashed,
                format!(
                    "node {node}: every card reads back {}; {msg}",
                    next.current.as_deref().unwrap_or(&next.target)
                ),
            ),
            Done if prev.state.is_in_progress() => (
                false,
                EventReason::FirmwareFlashed,
                format!(
                    "node {node}: every card reads back {} and the node is back in service",
                    next.current.as_deref().unwrap_or(&next.target)
                ),
            ),
            Failed => (
                true,
                EventReason::FirmwareFlashFailed,
                format!("node {node}: {msg}"),
            ),
            _ => return,
        };
        ctx.event(p, warning, ev, "Flash", note);
    }

    /// The check of the scheduling surface after a flash: one Event when it
    /// starts, and its time once the surface is whole (the node goes on to
    /// its uncordon).
    fn scheduling_surface(&self) {
        let (ctx, p, node, prev, next) = (self.ctx, self.p, self.node, self.prev, self.next);
        use FirmwareNodeState::*;
        let name = p.metadata.name.as_deref().unwrap_or_default();
        let checking = |r: &FwRecord| r.reason.as_deref() == Some(reason::REFRESHING_DEVICES);
        if checking(prev)
            && !checking(next)
            && matches!(next.state, Uncordoning | Done)
            && let Some(since) = prev.surface_since
        {
            ctx.metrics
                .observe_fw_scheduling_surface(name, (next.since - since) as f64);
        }
        if checking(next) && !checking(prev) {
            let msg = next.message.clone().unwrap_or_default();
            ctx.event(
                p,
                false,
                EventReason::RefreshingDevices,
                "Flash",
                format!("node {node}: {msg}"),
            );
        }
    }
}

#[cfg(test)]
mod tests;
