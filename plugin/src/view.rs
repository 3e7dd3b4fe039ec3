//! What the plugin shows, derived without I/O from the objects it read. The
//! views are also the `-o json|yaml` output, so field names are part of the
//! plugin's interface.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use serde::Serialize;
use ttdrv_api::{ConditionType, NodeState, Summary, TenstorrentDriverPolicy};
use ttdrv_core::machine::NodeRecord;
use ttdrv_core::reason;

use crate::eta::{self, PerNode};

/// The controller's persisted record on a node, if readable.
pub fn record_of(node: &Node) -> Option<NodeRecord> {
    ttdrv_core::node::record(node).ok().flatten()
}

/// Records of `policy`, by node name.
pub fn records_for(policy: &str, nodes: &[Node]) -> BTreeMap<String, NodeRecord> {
    nodes
        .iter()
        .filter_map(|n| Some((n.metadata.name.clone()?, record_of(n)?)))
        .filter(|(_, r)| r.policy == policy)
        .collect()
}

fn name_of(p: &TenstorrentDriverPolicy) -> String {
    p.metadata.name.clone().unwrap_or_default()
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConditionView {
    pub status: String,
    pub reason: String,
    pub message: String,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeRow {
    pub name: String,
    pub state: NodeState,
    /// Done because the node has a host (DKMS) install the operator leaves alone.
    pub host_managed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current_version: Option<String>,
    pub target_version: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub install_mode: Option<String>,
    /// The version its agent built and verified into the node's cache ahead
    /// of the go-ahead (status.nodes[].preparedVersion).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prepared_version: Option<String>,
    /// An installed kernel the target does not build for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_kernel_build_failed: Option<String>,
    /// RFC 3339 time the node entered its state.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seconds_in_state: Option<i64>,
    /// A Failed node whose retry was requested and not yet taken up.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub retry_requested: bool,
    /// Unix seconds when the node's current (or last) cycle started.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cycle_started: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// A drain a PodDisruptionBudget blocks (reason `EvictionBlocked`):
    /// seconds until it times out (0 once due), from the time the node entered
    /// Draining and the policy's `drain.timeoutSeconds`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drain_times_out_in: Option<i64>,
    /// What every card read back last (`firmware.tenstorrent.com/fw-version`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub firmware_version: Option<String>,
    /// The node's firmware state (`firmware.tenstorrent.com/upgrade-state`):
    /// a firmware policy's cycle, which a swap waits for or follows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub firmware_state: Option<String>,
}

impl NodeRow {
    /// The FIRMWARE cell: the cards' version, and the firmware state when a
    /// firmware cycle is not Done (`19.8.0.0 (Flashing)`).
    pub fn firmware(&self) -> Option<String> {
        let state = self.firmware_state.as_deref().filter(|s| *s != "Done");
        match (self.firmware_version.as_deref(), state) {
            (None, None) => None,
            (v, None) => v.map(String::from),
            (v, Some(s)) => Some(format!("{} ({s})", v.unwrap_or("-"))),
        }
    }

    /// The target is loaded, or built and verified into the node's cache
    /// ahead (its swap is a load, no build).
    pub fn is_prepared(&self) -> bool {
        let target = Some(self.target_version.as_str());
        self.current_version.as_deref() == target || self.prepared_version.as_deref() == target
    }

    /// The operator installs the module here (not host-managed, not vacated).
    pub fn managed(&self) -> bool {
        !self.host_managed && self.state != NodeState::Unmanaged
    }
}

/// Build-ahead progress over the nodes the operator installs on (host-managed
/// and vacated nodes are left out).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedCount {
    /// Nodes with the target loaded or in their cache.
    pub prepared: usize,
    /// Nodes with the target loaded.
    pub at_target: usize,
    pub nodes: usize,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyView {
    pub name: String,
    pub version: String,
    /// Version the controller last acted on (status.desiredVersion).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub desired_version: Option<String>,
    pub paused: bool,
    pub max_unavailable: usize,
    /// The controller has seen the latest spec (status.observedGeneration).
    pub observed: bool,
    /// Conflict condition message, when the selector overlaps an older policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conflict: Option<String>,
    pub conditions: BTreeMap<String, ConditionView>,
    pub summary: Summary,
    /// `upgradePolicy.prepare.enabled`.
    pub prepare_enabled: bool,
    pub prepared: PreparedCount,
    /// `spec.promoteAfter`: the canary this policy follows and where that
    /// stands ([`promotion_view`]); absent when it follows none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub promotion: Option<PromotionView>,
    pub nodes: Vec<NodeRow>,
}

/// Where a policy's canary promotion stands, as the controller decides it
/// ([`ttdrv_core::promotion`]) from the canary's status, read now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PromotionView {
    pub canary: String,
    pub soak_seconds: i64,
    /// `open`, `waiting` or `blocked`.
    pub state: String,
    /// What the canary misses, with the soak's count at `now`.
    pub message: String,
}

/// The promotion of `p` given its canary (`None`: not found), at `now`.
pub fn promotion_view(
    p: &TenstorrentDriverPolicy,
    canary: Option<&TenstorrentDriverPolicy>,
    now: i64,
) -> Option<PromotionView> {
    use ttdrv_core::promotion::{self, Canary, Gate};
    let after = p.spec.promote_after.as_ref()?;
    let gate = promotion::of(p, |_| canary.map(Canary::of), now)?;
    let soak = after.soak_seconds;
    let (state, message) = match &gate {
        Gate::Open => (
            "open",
            format!("{} is Ready at {}", after.policy, p.spec.version),
        ),
        Gate::Wait {
            ready_at: Some(at), ..
        } => (
            "waiting",
            format!(
                "{} Ready at {} for {}s of {soak}s",
                after.policy,
                p.spec.version,
                (now - (at - soak)).max(0)
            ),
        ),
        // The controller's words without the prefix the state already says.
        Gate::Wait { why, .. } => (
            "waiting",
            why.strip_prefix(&format!("waiting for the canary policy {}: ", after.policy))
                .map_or_else(|| why.clone(), |rest| format!("{}: {rest}", after.policy)),
        ),
        Gate::Blocked { why } => (
            "blocked",
            why.strip_prefix("promotion blocked: ")
                .unwrap_or(why)
                .to_string(),
        ),
    };
    Some(PromotionView {
        canary: after.policy.clone(),
        soak_seconds: soak,
        state: state.into(),
        message,
    })
}

/// One policy and the nodes it reports, in rollout order (the status order).
pub fn policy_view(p: &TenstorrentDriverPolicy, nodes: &[Node], now: i64) -> PolicyView {
    let name = name_of(p);
    let records = records_for(&name, nodes);
    let retry_tokens: BTreeMap<String, String> = nodes
        .iter()
        .filter_map(|n| {
            let token = ttdrv_core::node::retry_token(n)?;
            Some((n.metadata.name.clone()?, token.to_string()))
        })
        .collect();
    let status = p.status.clone().unwrap_or_default();
    let conditions: BTreeMap<String, ConditionView> = status
        .conditions
        .iter()
        .map(|c| {
            (
                c.type_.clone(),
                ConditionView {
                    status: c.status.clone(),
                    reason: c.reason.clone(),
                    message: c.message.clone(),
                },
            )
        })
        .collect();
    let conflict = conditions
        .get(ConditionType::Conflict.as_str())
        .filter(|c| c.status == "True")
        .map(|c| c.message.clone());
    let by_name: BTreeMap<&str, &Node> = nodes
        .iter()
        .filter_map(|n| Some((n.metadata.name.as_deref()?, n)))
        .collect();
    let fw_label = |node: &str, key: &str| {
        by_name
            .get(node)
            .and_then(|n| ttdrv_core::node::label(n, key))
            .map(String::from)
    };
    let rows: Vec<NodeRow> = status
        .nodes
        .iter()
        .map(|n| {
            let rec = records.get(&n.name);
            let since = n.last_transition_time.as_ref().map(|t| t.0.as_second());
            NodeRow {
                name: n.name.clone(),
                state: n.state,
                host_managed: n.reason.as_deref() == Some(reason::HOST_MANAGED),
                current_version: n.current_version.clone(),
                // A waiting node aims at the policy's version; its persisted
                // record may still be the Done of the previous rollout (the
                // controller writes it again only when the node's cycle starts).
                target_version: rec
                    .filter(|_| n.state != NodeState::Pending)
                    .map(|r| r.target.clone())
                    .unwrap_or_else(|| p.spec.version.clone()),
                install_mode: n.install_mode.clone(),
                prepared_version: n.prepared_version.clone(),
                next_kernel_build_failed: n.next_kernel_build_failed.clone(),
                since: n.last_transition_time.as_ref().map(|t| t.0.to_string()),
                seconds_in_state: since.map(|s| (now - s).max(0)),
                cycle_started: rec.and_then(|r| r.started),
                // Retried: the annotation carries a token the controller has not
                // acted on yet, or it has (the record left Failed) but the status
                // is not rewritten yet.
                retry_requested: n.state.is_failed()
                    && retry_tokens.get(&n.name).is_some_and(|t| {
                        rec.is_none_or(|r| {
                            r.retry_token.as_ref() != Some(t) || !r.state.is_failed()
                        })
                    }),
                reason: n.reason.clone(),
                message: n.message.clone(),
                drain_times_out_in: since
                    .filter(|_| {
                        n.state == NodeState::Draining
                            && n.reason.as_deref() == Some(reason::EVICTION_BLOCKED)
                    })
                    .map(|s| (s + p.spec.upgrade_policy.drain.timeout_seconds - now).max(0)),
                firmware_version: fw_label(&n.name, ttdrv_api::firmware::labels::FW_VERSION),
                firmware_state: fw_label(&n.name, ttdrv_api::firmware::labels::UPGRADE_STATE),
            }
        })
        .collect();
    let managed: Vec<&NodeRow> = rows.iter().filter(|n| n.managed()).collect();
    let prepared = PreparedCount {
        prepared: managed.iter().filter(|n| n.is_prepared()).count(),
        at_target: managed
            .iter()
            .filter(|n| n.current_version.as_deref() == Some(n.target_version.as_str()))
            .count(),
        nodes: managed.len(),
    };
    PolicyView {
        version: p.spec.version.clone(),
        prepare_enabled: p.spec.upgrade_policy.prepare.enabled,
        prepared,
        desired_version: status.desired_version.clone(),
        paused: p.spec.paused,
        max_unavailable: p
            .spec
            .upgrade_policy
            .max_unavailable_for(status.summary.matched.max(0) as usize),
        observed: status.observed_generation.is_some()
            && status.observed_generation == p.metadata.generation,
        conflict,
        conditions,
        summary: status.summary.clone(),
        promotion: None,
        nodes: rows,
        name,
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FailedNode {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Where a rollout stands, for `watch`'s exit.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "result", rename_all = "camelCase")]
pub enum Outcome {
    /// Nodes still to go, or the controller has not caught up with the spec.
    Running,
    /// Every matched node is Done (upgraded, up to date or host-managed).
    Complete,
    /// At least one node Failed (and not retried yet): the rollout is halted
    /// until it is retried.
    Failed { nodes: Vec<FailedNode> },
}

pub fn outcome(view: &PolicyView) -> Outcome {
    let failed: Vec<FailedNode> = view
        .nodes
        .iter()
        .filter(|n| n.state.is_failed() && !n.retry_requested)
        .map(|n| FailedNode {
            name: n.name.clone(),
            reason: n.reason.clone(),
            message: n.message.clone(),
        })
        .collect();
    if !failed.is_empty() {
        return Outcome::Failed { nodes: failed };
    }
    if !view.observed || view.desired_version.as_deref() != Some(view.version.as_str()) {
        return Outcome::Running;
    }
    // Vacated nodes (`spec.unmanage`) are settled as Done ones are.
    if view
        .nodes
        .iter()
        .all(|n| matches!(n.state, NodeState::Done | NodeState::Unmanaged))
    {
        Outcome::Complete
    } else {
        Outcome::Running
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Progress {
    /// Done nodes, host-managed included.
    pub done: usize,
    pub total: usize,
    pub in_progress: usize,
    pub pending: usize,
    pub failed: usize,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EtaView {
    pub per_node: PerNode,
    pub slots: usize,
    /// Seconds until the rollout ends; absent while it is halted by a failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remaining_seconds: Option<i64>,
    /// Seconds since the first node of this rollout started.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub elapsed_seconds: Option<i64>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchView {
    pub policy: PolicyView,
    pub progress: Progress,
    pub eta: EtaView,
    pub outcome: Outcome,
}

pub fn watch_view(p: &TenstorrentDriverPolicy, nodes: &[Node], now: i64) -> WatchView {
    let view = policy_view(p, nodes, now);
    let records = records_for(&view.name, nodes);
    let count = |f: &dyn Fn(&NodeRow) -> bool| view.nodes.iter().filter(|n| f(n)).count();
    let progress = Progress {
        done: count(&|n| matches!(n.state, NodeState::Done | NodeState::Unmanaged)),
        total: view.nodes.len(),
        in_progress: count(&|n| n.state.is_in_progress()),
        pending: count(&|n| n.state == NodeState::Pending),
        failed: count(&|n| n.state.is_failed()),
    };
    let slots = view.max_unavailable;
    let samples = eta::observed_durations(&view.name, Some(&view.version), records.values());
    // The per-node figure `plan` uses too, with plan's default costs.
    let per_node = eta::estimate_per_node(
        &samples,
        p.status
            .as_ref()
            .and_then(|s| eta::status_per_node(s, slots)),
        eta::Costs::default(),
        view.prepare_enabled,
    );
    let out = outcome(&view);
    let in_progress: Vec<i64> = view
        .nodes
        .iter()
        .filter(|n| n.state.is_in_progress())
        .filter_map(|n| {
            n.cycle_started
                .map(|s| now - s)
                .or(n.seconds_in_state)
                .map(|e| e.max(0))
        })
        .collect();
    // Pending nodes already at the target finish without a cycle.
    let waiting = view
        .nodes
        .iter()
        .filter(|n| n.state == NodeState::Pending)
        .filter(|n| n.current_version.as_deref() != Some(n.target_version.as_str()))
        .count();
    let remaining = match out {
        Outcome::Failed { .. } => None,
        Outcome::Complete => Some(0),
        Outcome::Running => Some(eta::remaining_seconds(
            per_node.seconds,
            slots,
            &in_progress,
            waiting,
        )),
    };
    // Elapsed since the first node of this rollout started; for a finished
    // rollout, up to its last node's completion.
    let finished_at = records
        .values()
        .filter(|r| r.target == view.version && r.state == NodeState::Done)
        .filter(|r| r.reason.as_deref() == Some(reason::UPGRADED))
        .map(|r| r.since)
        .max();
    let end = match (&out, finished_at) {
        (Outcome::Complete, Some(t)) => t,
        _ => now,
    };
    let elapsed = records
        .values()
        .filter(|r| r.target == view.version)
        .filter(|r| {
            r.state.is_in_progress()
                || r.state.is_failed()
                || (r.state == NodeState::Done && r.reason.as_deref() == Some(reason::UPGRADED))
        })
        .filter_map(|r| r.started)
        .min()
        .map(|s| (end - s).max(0));
    WatchView {
        eta: EtaView {
            per_node,
            slots,
            remaining_seconds: remaining,
            elapsed_seconds: elapsed,
        },
        progress,
        outcome: out,
        policy: view,
    }
}
