//! What a NodeActor's step tells people: logs, Events and metrics of a
//! transition, of a node gone not Ready mid-cycle, of a drain a budget
//! blocks, and of pods a drain left in place.

use ttdrv_api::{NodeState, TenstorrentDriverPolicy};
use ttdrv_core::event::EventReason;
use ttdrv_core::machine::NodeRecord;
use ttdrv_core::reason;

use crate::runtime::context::Context;

/// Where a step is reported, and what of the observation it mentions.
pub struct StepReport<'a> {
    pub ctx: &'a Context,
    pub policy: &'a TenstorrentDriverPolicy,
    /// The policy's name as the actor knows it (for logs).
    pub policy_name: &'a str,
    pub node: &'a str,
    pub drain_timeout_seconds: i64,
    pub now: i64,
    /// Pods the drain leaves in place, with why.
    pub skipped: &'a [String],
    /// What will still hold the device after the gates and the drain, as
    /// observed before the cycle ([`ttdrv_core::device_holders::summary`]).
    pub ungated_holders: Option<&'a str>,
}

impl StepReport<'_> {
    /// Everything the step from `prev` to `next` reports.
    pub async fn step(&self, prev: &NodeRecord, next: &NodeRecord) {
        self.not_ready(prev, next);
        self.drain_blocked(prev, next);
        self.ungated_holders(prev, next);
        self.scheduling_surface(prev, next);
        if next.state != prev.state {
            report_transition(self.ctx, self.policy, self.node, prev, next).await;
            if prev.state == NodeState::Draining && !self.skipped.is_empty() {
                self.pods_not_evicted();
            }
        }
    }

    /// The check of the scheduling surface: one Event when it starts (the
    /// DRA plugin restarted), and its time once the surface is whole.
    fn scheduling_surface(&self, prev: &NodeRecord, next: &NodeRecord) {
        let (policy_name, node) = (self.policy_name, self.node);
        let checking = |r: &NodeRecord| r.reason.as_deref() == Some(reason::REFRESHING_DEVICES);
        if checking(next) && !checking(prev) {
            let msg = next.message.clone().unwrap_or_default();
            tracing::info!(policy = policy_name, node, "{msg}");
            self.ctx.event(
                self.policy,
                false,
                EventReason::RefreshingDevices,
                "Upgrade",
                format!("node {node}: {msg}"),
            );
        }
        // Whole: the node goes on to its validation pod or its uncordon
        // (not a node gone NotReady meanwhile, nor a failure).
        let went_on = next.state == NodeState::Uncordoning
            || next.reason.as_deref() == Some(reason::VALIDATING);
        if checking(prev)
            && went_on
            && let Some(since) = prev.surface_since
        {
            self.ctx
                .metrics
                .observe_scheduling_surface(policy_name, (self.now - since).max(0) as f64);
        }
    }

    fn not_ready(&self, prev: &NodeRecord, next: &NodeRecord) {
        let not_ready = Some(reason::NODE_NOT_READY);
        if next.reason.as_deref() == not_ready
            && prev.reason.as_deref() != not_ready
            && next.state == prev.state
        {
            let (policy_name, node) = (self.policy_name, self.node);
            tracing::warn!(
                policy = policy_name,
                node,
                state = next.state.as_str(),
                "node not Ready mid-cycle; it keeps its slot"
            );
            self.ctx.event(
                self.policy,
                true,
                EventReason::NodeNotReady,
                "Upgrade",
                format!(
                    "node {node}: not Ready while {}; it keeps its slot and the cycle goes on when it is back",
                    next.state.as_str()
                ),
            );
        }
    }

    /// One Event when a budget starts blocking the drain (the status
    /// message says it on every pass).
    fn drain_blocked(&self, prev: &NodeRecord, next: &NodeRecord) {
        if let Some(note) = ttdrv_core::event::drain_blocked_message(
            self.node,
            prev,
            next,
            self.drain_timeout_seconds,
            self.now,
        ) {
            let (policy_name, node) = (self.policy_name, self.node);
            tracing::warn!(policy = policy_name, node, "{note}");
            self.ctx
                .event(self.policy, true, EventReason::DrainBlocked, "Drain", note);
        }
    }

    /// One Event per node and cycle when its record first says what will
    /// still hold the device (waiting in Pending, or at the cordon when it
    /// did not wait): the record is the memory, no request is added.
    fn ungated_holders(&self, prev: &NodeRecord, next: &NodeRecord) {
        let Some(w) = self.ungated_holders else {
            return;
        };
        let says = |r: &NodeRecord| r.message.as_deref().is_some_and(|m| m.contains(w));
        if !says(next) || says(prev) {
            return;
        }
        let (policy_name, node) = (self.policy_name, self.node);
        tracing::warn!(policy = policy_name, node, "{w}");
        self.ctx.event(
            self.policy,
            true,
            EventReason::UngatedDeviceHolder,
            "Cordon",
            format!("node {node}: {w}"),
        );
    }

    fn pods_not_evicted(&self) {
        let note = format!(
            "node {}: drain left these pods in place: {}",
            self.node,
            self.skipped.join(", ")
        );
        self.ctx.event(
            self.policy,
            true,
            EventReason::PodsNotEvicted,
            "Drain",
            note,
        );
    }
}

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
