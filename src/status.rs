//! The policy's `status`, built from the node records: the summary, one entry
//! per node, and the conditions (each with `observedGeneration`, keeping
//! `lastTransitionTime` while its status holds). Pure: the supervisor decides
//! when to write it.

use std::collections::{HashMap, HashSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use ttdrv_api::{
    ConditionType, NodeState, NodeStatus, Summary, TenstorrentDriverPolicy,
    TenstorrentDriverPolicyStatus,
};
use ttdrv_core::machine::NodeRecord;
use ttdrv_core::reason;

use crate::refusal::RefusalKind;

/// What the agent reported on a node (its labels), for `status.nodes[]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reported {
    pub version: Option<String>,
    pub install_mode: Option<String>,
    /// [`ttdrv_core::prepare::prepared_version`].
    pub prepared_version: Option<String>,
    /// [`ttdrv_core::prepare::next_kernel_failed`].
    pub next_kernel_build_failed: Option<String>,
    /// The module parameters in effect ([`ttdrv_core::node::loaded_parameters`]).
    pub parameters: Option<ttdrv_api::module_params::Values>,
}

/// Everything the status is made of besides the records.
pub struct StatusInput<'a> {
    pub policy: &'a TenstorrentDriverPolicy,
    pub records: &'a HashMap<String, NodeRecord>,
    /// Nodes with device users (listed last, as the rollout takes them).
    pub device_users: &'a HashSet<String>,
    /// Nodes also matched by older policies, with their owner.
    pub conflicts: &'a [(String, String)],
    /// Why the rollout cannot start more nodes now, if it cannot.
    pub blocked: Option<&'a str>,
    /// New starts are held (a soak, a closed maintenance window, a canary
    /// not promoted yet): the reason, for the Progressing condition.
    pub held: Option<&'static str>,
    /// The fleet-health brake is on: the policy's NotReady nodes.
    pub braked: Option<&'a [String]>,
    /// `spec.promoteAfter`'s canary is halted (a Failed node) or missing:
    /// the hold needs a person, Progressing turns False (`PromotionBlocked`).
    pub promotion_blocked: bool,
    /// The cluster refuses the policy (its DaemonSet apply, its drain
    /// selector) or a takeover holds it: which, and the API server's words.
    pub refused: Option<(RefusalKind, &'a str)>,
    pub daemonset: &'a str,
    pub previous: Option<&'a TenstorrentDriverPolicyStatus>,
    pub now: Timestamp,
}

/// Per-state counts and the failure messages, from every record.
pub fn summarize(records: &HashMap<String, NodeRecord>) -> (Summary, Vec<String>) {
    let mut summary = Summary {
        matched: records.len() as i32,
        ..Default::default()
    };
    let mut failed = Vec::new();
    for (n, r) in records {
        let host = r.reason.as_deref() == Some(reason::HOST_MANAGED);
        match r.state {
            NodeState::Done if host => summary.host_managed += 1,
            NodeState::Done => summary.done += 1,
            NodeState::Pending => summary.pending += 1,
            // Vacated: settled, as Done.
            NodeState::Unmanaged => summary.done += 1,
            NodeState::Failed | NodeState::UnloadFailed => {
                summary.failed_nodes += 1;
                failed.push(format!("{n}: {}", r.message.as_deref().unwrap_or("")));
            }
            NodeState::Uncordoning => {
                summary.in_progress += 1;
                summary.ready += 1;
            }
            _ => summary.in_progress += 1,
        }
    }
    // The Go operator's counts, from ours: every matched node runs the
    // installer; Done nodes are available; Uncordoning ones already have the
    // target loaded; failed is desired − available, as Go defines it.
    summary.desired = summary.matched;
    summary.available = summary.done + summary.host_managed;
    summary.ready += summary.available;
    summary.up_to_date = summary.ready;
    summary.failed = summary.desired - summary.available;
    failed.sort();
    (summary, failed)
}

/// Phases of `status.phase`, derived from the summary and `spec.paused`.
pub mod phase {
    pub const READY: &str = "Ready";
    pub const PROGRESSING: &str = "Progressing";
    pub const DEGRADED: &str = "Degraded";
    pub const PAUSED: &str = "Paused";
    /// `spec.unmanage` (the Go operator's): every node of the policy is
    /// vacated (Progressing while one is still being vacated, Degraded while
    /// one is UnloadFailed).
    pub const UNMANAGED: &str = "Unmanaged";
}

/// `status.phase`: Paused when `spec.paused`, else Degraded while a node is
/// Failed, Progressing while nodes are pending or in progress, Ready otherwise
/// (no matched node too).
pub fn phase_of(summary: &Summary, paused: bool) -> &'static str {
    if paused {
        phase::PAUSED
    } else if summary.failed_nodes > 0 {
        phase::DEGRADED
    } else if summary.pending > 0 || summary.in_progress > 0 {
        phase::PROGRESSING
    } else {
        phase::READY
    }
}

/// The status of each condition, in the order [`build`] lists them: Ready,
/// Progressing, Degraded, Paused, Conflict. A flip of any of them makes a
/// status write urgent. `promotion_blocked`: the canary of
/// `spec.promoteAfter` is halted or missing, so nothing new starts.
pub fn condition_flags(
    summary: &Summary,
    paused: bool,
    conflicts: bool,
    braked: bool,
    refused: bool,
    promotion_blocked: bool,
) -> [bool; 5] {
    let settled = summary.pending == 0 && summary.in_progress == 0 && summary.failed_nodes == 0;
    let stopped = braked || refused;
    [
        // A refused spec is not rolled out, whatever the nodes run: never Ready.
        settled && !paused && !refused,
        !settled && summary.failed_nodes == 0 && !paused && !stopped && !promotion_blocked,
        summary.failed_nodes > 0 || stopped,
        paused,
        conflicts,
    ]
}

/// The conditions [`condition_flags`] covers, in its order. (Prepared moves
/// with each node's build: written with the node progress, not at once.)
const FLAGGED: [ConditionType; 5] = [
    ConditionType::Ready,
    ConditionType::Progressing,
    ConditionType::Degraded,
    ConditionType::Paused,
    ConditionType::Conflict,
];

/// The flags of a written status, in the same order.
pub fn flags_of(status: &TenstorrentDriverPolicyStatus) -> Vec<bool> {
    FLAGGED
        .iter()
        .map(|t| {
            status
                .conditions
                .iter()
                .any(|c| c.type_ == t.as_str() && c.status == "True")
        })
        .collect()
}

/// One condition; `lastTransitionTime` is kept while its status is unchanged,
/// so the status is only rewritten when something actually changed.
fn cond(
    type_: ConditionType,
    ok: bool,
    reason: &str,
    message: String,
    input: &StatusInput<'_>,
) -> Condition {
    ttdrv_core::condition::condition(
        type_.as_str(),
        ok,
        reason,
        message,
        input.policy.metadata.generation,
        input.previous.map_or(&[], |p| p.conditions.as_slice()),
        input.now,
    )
}

/// The whole status; `reported` gives what each node's labels say.
pub fn build(
    input: &StatusInput<'_>,
    reported: impl Fn(&str) -> Reported,
) -> TenstorrentDriverPolicyStatus {
    let policy = input.policy;
    let (mut summary, failed) = summarize(input.records);
    // Counts the prepared nodes into the summary on the way.
    let entries = node_entries(input, reported, &mut summary);
    let conditions = conditions(input, &summary, &failed, &entries);
    TenstorrentDriverPolicyStatus {
        observed_generation: policy.metadata.generation,
        conditions,
        desired_version: Some(policy.spec.version.clone()),
        phase: Some(status_phase(input, &summary).to_string()),
        summary,
        daemon_set: Some(input.daemonset.to_string()),
        nodes: entries.nodes,
        unreadable: None,
    }
}

/// `status.nodes[]` in the rollout's order, and what build-ahead found on
/// the way.
struct NodeEntries<'a> {
    nodes: Vec<NodeStatus>,
    /// Nodes that will load the target and do not hold it yet.
    unprepared: Vec<&'a str>,
    /// `node (kernel)` for each node whose build for a next kernel failed.
    next_kernel_failures: Vec<String>,
}

/// One entry per node, nodes without device users first, then by name;
/// adds the nodes that hold the target to `summary.prepared`.
fn node_entries<'a>(
    input: &StatusInput<'a>,
    reported: impl Fn(&str) -> Reported,
    summary: &mut Summary,
) -> NodeEntries<'a> {
    let records: &'a HashMap<String, NodeRecord> = input.records;
    let device = input.device_users;
    // The rollout's order: nodes without device users first, then by name.
    let mut names: Vec<&'a String> = records.keys().collect();
    names.sort_by(|a, b| (device.contains(*a), a).cmp(&(device.contains(*b), b)));
    let target = input.policy.spec.version.trim();
    let wanted = input.policy.spec.parameter_values();
    // Build ahead: who holds the target, and who is still to build it.
    let mut unprepared = Vec::new();
    let mut next_kernel_failures: Vec<String> = Vec::new();
    let nodes = names
        .into_iter()
        .map(|n| {
            let r = &records[n];
            let now = reported(n);
            // Loaded counts with the policy's module parameters in effect,
            // or those the module takes at run time to write (nothing to build).
            let holds = ttdrv_core::node::keeps_module(
                now.version.as_deref(),
                now.parameters.as_ref(),
                ttdrv_core::node::Target::new(target, &wanted),
            ) || now.prepared_version.as_deref() == Some(target);
            let settled_elsewhere = r.reason.as_deref() == Some(reason::HOST_MANAGED)
                || r.state == NodeState::Unmanaged;
            if holds {
                summary.prepared += 1;
            } else if !settled_elsewhere {
                unprepared.push(n.as_str());
            }
            if let Some(k) = &now.next_kernel_build_failed {
                next_kernel_failures.push(format!("{n} ({k})"));
            }
            node_status(n, r, now)
        })
        .collect();
    NodeEntries {
        nodes,
        unprepared,
        next_kernel_failures,
    }
}

/// A node's entry: its record and what its agent reported.
fn node_status(name: &str, r: &NodeRecord, now: Reported) -> NodeStatus {
    NodeStatus {
        name: name.to_string(),
        state: r.state,
        current_version: now.version,
        install_mode: now.install_mode,
        prepared_version: now.prepared_version,
        next_kernel_build_failed: now.next_kernel_build_failed,
        module_parameters: now
            .parameters
            .as_ref()
            .map(ttdrv_api::module_params::canonical),
        reason: r.reason.clone(),
        go_reason: r
            .reason
            .as_deref()
            .and_then(reason::go_code)
            .map(String::from),
        message: r.message.clone(),
        last_transition_time: Timestamp::from_second(r.since).ok().map(Time),
    }
}

/// Every condition, in the order [`condition_flags`] lists them, then
/// Prepared and NextKernelBuildFailed.
fn conditions(
    input: &StatusInput<'_>,
    summary: &Summary,
    failed: &[String],
    entries: &NodeEntries<'_>,
) -> Vec<Condition> {
    let policy = input.policy;
    let paused = policy.spec.paused;
    let settled = summary.pending == 0 && summary.in_progress == 0 && summary.failed_nodes == 0;
    let [ready, progressing, degraded, _, conflicted] = condition_flags(
        summary,
        paused,
        !input.conflicts.is_empty(),
        input.braked.is_some(),
        input.refused.is_some(),
        input.promotion_blocked,
    );
    let (degraded_reason, degraded_message) = degraded_cause(input, summary, failed);
    let prepared = prepared_condition(policy, summary, &entries.unprepared);
    vec![
        ready_condition(input, summary, ready, settled),
        progressing_condition(input, summary, progressing, settled),
        cond(
            ConditionType::Degraded,
            degraded,
            degraded_reason,
            degraded_message,
            input,
        ),
        paused_condition(input, paused),
        conflict_condition(input, conflicted),
        cond(
            ConditionType::Prepared,
            prepared.0,
            prepared.1,
            prepared.2,
            input,
        ),
        next_kernel_condition(policy, &entries.next_kernel_failures, input),
    ]
}

fn ready_condition(
    input: &StatusInput<'_>,
    summary: &Summary,
    ready: bool,
    settled: bool,
) -> Condition {
    cond(
        ConditionType::Ready,
        ready,
        if input.refused.is_some() {
            "Refused"
        } else if settled {
            "RolloutComplete"
        } else {
            "RolloutIncomplete"
        },
        if input.refused.is_some() {
            "this spec is refused and not rolled out (see the Degraded condition); \
             nothing it changes is applied until it is fixed"
                .to_string()
        } else {
            format!(
                "{} of {} node(s) run {} ({} host-managed)",
                summary.done, summary.matched, input.policy.spec.version, summary.host_managed
            )
        },
        input,
    )
}

fn progressing_condition(
    input: &StatusInput<'_>,
    summary: &Summary,
    progressing: bool,
    settled: bool,
) -> Condition {
    let reason = if input.policy.spec.paused {
        "Paused"
    } else if settled {
        "Idle"
    } else if summary.failed_nodes > 0 {
        "Halted"
    } else if matches!(input.refused, Some((RefusalKind::Takeover, _))) {
        "TakingOver"
    } else if input.refused.is_some() {
        "Refused"
    } else if input.braked.is_some() {
        "Braked"
    } else if input.promotion_blocked {
        "PromotionBlocked"
    } else {
        // A hold's reason, else the rollout goes on.
        input.held.unwrap_or("Upgrading")
    };
    let message = input
        .blocked
        // A policy with nothing to do is not held back by its canary
        // (which may already roll out a newer version).
        .filter(|_| !(settled && input.held == Some(reason::WAITING_FOR_PROMOTION)))
        .map(String::from)
        .unwrap_or_else(|| {
            format!(
                "{} in progress, {} pending",
                summary.in_progress, summary.pending
            )
        });
    cond(
        ConditionType::Progressing,
        progressing,
        reason,
        message,
        input,
    )
}

/// The Degraded condition's reason and message: failed nodes first, then a
/// takeover, a refusal, the fleet-health brake.
fn degraded_cause(
    input: &StatusInput<'_>,
    summary: &Summary,
    failed: &[String],
) -> (&'static str, String) {
    if summary.failed_nodes > 0 {
        ("NodeFailed", failed.join("; "))
    } else if let Some((RefusalKind::Takeover, why)) = input.refused {
        (
            "DaemonSetTakeover",
            format!("{why} (nothing new starts until it is ours)"),
        )
    } else if let Some((RefusalKind::Refused, why)) = input.refused {
        (
            "PolicyRefused",
            format!(
                "the cluster refuses this policy (nothing new starts; retried with backoff): {why}"
            ),
        )
    } else if let Some(nodes) = input.braked {
        (
            "FleetNotReady",
            format!(
                "{} of {} node(s) NotReady: no node starts until they are back: {}",
                nodes.len(),
                summary.matched,
                nodes.join(", ")
            ),
        )
    } else {
        ("AsExpected", String::new())
    }
}

fn paused_condition(input: &StatusInput<'_>, paused: bool) -> Condition {
    cond(
        ConditionType::Paused,
        paused,
        if paused { "PausedBySpec" } else { "Running" },
        if paused {
            "spec.paused is true: nothing new starts; the DaemonSet is left as is".into()
        } else {
            String::new()
        },
        input,
    )
}

fn conflict_condition(input: &StatusInput<'_>, conflicted: bool) -> Condition {
    let conflicts: Vec<String> = input
        .conflicts
        .iter()
        .map(|(n, o)| format!("{n} (owned by {o})"))
        .collect();
    cond(
        ConditionType::Conflict,
        conflicted,
        if conflicts.is_empty() {
            "NoOverlap"
        } else {
            "SelectorOverlap"
        },
        if conflicts.is_empty() {
            String::new()
        } else {
            format!(
                "nodes matched by an older policy are left to it: {}",
                conflicts.join(", ")
            )
        },
        input,
    )
}

/// `status.phase`: [`phase_of`], but for a policy with `spec.unmanage`.
fn status_phase(input: &StatusInput<'_>, summary: &Summary) -> &'static str {
    let policy = input.policy;
    let paused = policy.spec.paused;
    // Unmanaged only once every node is vacated: Go's recipe (wait for
    // Unmanaged, then install DKMS) must not fire mid-vacate.
    if policy.spec.unmanage && !paused && summary.failed_nodes == 0 {
        let vacated = input
            .records
            .values()
            .all(|r| r.state == NodeState::Unmanaged);
        if vacated {
            phase::UNMANAGED
        } else {
            phase::PROGRESSING
        }
    } else {
        phase_of(summary, paused)
    }
}

/// The Prepared condition (status, reason, message): True once every node
/// that will load the target holds it (loaded, or built ahead into its
/// cache); host-managed and vacated nodes build nothing.
fn prepared_condition(
    policy: &TenstorrentDriverPolicy,
    summary: &Summary,
    unprepared: &[&str],
) -> (bool, &'static str, String) {
    let version = &policy.spec.version;
    if policy.spec.unmanage {
        return (
            false,
            "Unmanage",
            "spec.unmanage: the policy vacates its nodes and builds nothing".into(),
        );
    }
    if !policy.spec.upgrade_policy.prepare.enabled {
        return (
            false,
            "Disabled",
            "upgradePolicy.prepare.enabled is false: each node builds inside its cordon window"
                .into(),
        );
    }
    if unprepared.is_empty() {
        return (
            true,
            "AllPrepared",
            format!(
                "{} node(s) hold {version}, loaded or built ahead",
                summary.prepared
            ),
        );
    }
    const SHOWN: usize = 10;
    let mut list = unprepared
        .iter()
        .take(SHOWN)
        .copied()
        .collect::<Vec<_>>()
        .join(", ");
    if unprepared.len() > SHOWN {
        list.push_str(&format!(" and {} more", unprepared.len() - SHOWN));
    }
    (
        false,
        "Preparing",
        format!(
            "{} of {} node(s) hold {version}, loaded or built ahead; still to build: {list}",
            summary.prepared, summary.matched
        ),
    )
}

/// The NextKernelBuildFailed condition, a warning: True while some node has
/// an installed kernel, not yet running, that the target does not build for
/// (a reboot into it would find no module), naming node and kernel.
fn next_kernel_condition(
    policy: &TenstorrentDriverPolicy,
    failures: &[String],
    input: &StatusInput<'_>,
) -> Condition {
    if failures.is_empty() {
        return cond(
            ConditionType::NextKernelBuildFailed,
            false,
            "NoneReported",
            String::new(),
            input,
        );
    }
    let mut sorted = failures.to_vec();
    sorted.sort();
    cond(
        ConditionType::NextKernelBuildFailed,
        true,
        ttdrv_core::prepare::NEXT_KERNEL_BUILD_FAILED,
        format!(
            "{} does not build for a kernel installed on {} node(s); a reboot into it would find no module: {}",
            policy.spec.version,
            sorted.len(),
            sorted.join(", ")
        ),
        input,
    )
}

/// How the message of a DaemonSet takeover in progress starts (see
/// `workers::renderer`); words for people only, the decisions go by
/// [`RefusalKind::Takeover`].
pub const TAKEOVER: &str = "taking over DaemonSet ";

#[cfg(test)]
mod tests;
