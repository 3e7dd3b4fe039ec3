//! Per-node durations observed so far, and what they predict.
//!
//! A node's duration is its whole cycle, from the moment it left Pending
//! (`started` in the controller's per-node record) to the moment it reached Done
//! (`since` of the Done record). When the records cannot be read, the policy's
//! status gives a coarser figure: the time from the rollout's start to the last
//! node Done, spread over the nodes done so far. With neither, a documented
//! default is used.

use ttdrv_api::{NodeState, TenstorrentDriverPolicyStatus, condition};
use ttdrv_core::machine::NodeRecord;
use ttdrv_core::reason;

/// Per-node estimate when nothing has been observed yet: a cache-cold build of
/// the module (~30-90 s) plus cordon, drain and uncordon.
pub const DEFAULT_PER_NODE_SECONDS: i64 = 90;

/// Where a per-node estimate comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Basis {
    /// Mean of full node cycles recorded on the nodes.
    Observed,
    /// Rollout start to last Done, from the policy's status.
    Status,
    /// Nothing observed: [`DEFAULT_PER_NODE_SECONDS`].
    Default,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PerNode {
    pub seconds: i64,
    /// Nodes the figure was observed on (0 for the default).
    pub samples: usize,
    pub basis: Basis,
}

/// Durations of completed cycles (a Done record with a start) of `policy`; only
/// those aiming at `target` when given. Nodes found up to date or host-managed
/// did no work and are not samples.
pub fn observed_durations<'a>(
    policy: &str,
    target: Option<&str>,
    records: impl IntoIterator<Item = &'a NodeRecord>,
) -> Vec<i64> {
    records
        .into_iter()
        .filter(|r| r.policy == policy && r.state == NodeState::Done)
        .filter(|r| r.reason.as_deref() == Some(reason::UPGRADED))
        .filter(|r| target.is_none_or(|t| r.target == t))
        .filter_map(|r| r.started.map(|s| (r.since - s).max(0)))
        .collect()
}

/// Coarse per-node duration from the status alone: rollout start (the Progressing
/// condition's last transition to True) to the last node Done, times the number
/// of parallel slots, over the nodes upgraded since the start.
pub fn status_per_node(status: &TenstorrentDriverPolicyStatus, slots: usize) -> Option<PerNode> {
    let start = status
        .conditions
        .iter()
        .find(|c| c.type_ == condition::PROGRESSING && c.status == "True")?
        .last_transition_time
        .0
        .as_second();
    let done: Vec<i64> = status
        .nodes
        .iter()
        .filter(|n| n.state == NodeState::Done && n.reason.as_deref() == Some(reason::UPGRADED))
        .filter_map(|n| n.last_transition_time.as_ref().map(|t| t.0.as_second()))
        .filter(|t| *t >= start)
        .collect();
    let last = *done.iter().max()?;
    let per = (last - start) * slots.max(1) as i64 / done.len() as i64;
    Some(PerNode {
        seconds: per.max(1),
        samples: done.len(),
        basis: Basis::Status,
    })
}

/// Mean of the samples (rounded), else the default.
pub fn per_node(samples: &[i64]) -> PerNode {
    if samples.is_empty() {
        return PerNode {
            seconds: DEFAULT_PER_NODE_SECONDS,
            samples: 0,
            basis: Basis::Default,
        };
    }
    let sum: i64 = samples.iter().sum();
    let n = samples.len() as i64;
    PerNode {
        seconds: ((sum + n / 2) / n).max(1),
        samples: samples.len(),
        basis: Basis::Observed,
    }
}

/// Seconds until the last node is done: nodes in progress finish after
/// `per_node - elapsed` (at least 1 s while they run); waiting nodes then take
/// the first free of `slots` parallel slots, one `per_node` each.
pub fn remaining_seconds(
    per_node: i64,
    slots: usize,
    in_progress_elapsed: &[i64],
    waiting: usize,
) -> i64 {
    let mut free_at: Vec<i64> = in_progress_elapsed
        .iter()
        .map(|e| (per_node - e).max(1))
        .collect();
    while free_at.len() < slots.max(1) {
        free_at.push(0);
    }
    for _ in 0..waiting {
        // The slot that frees up first takes the next node.
        let (i, t) = free_at
            .iter()
            .enumerate()
            .min_by_key(|(_, t)| **t)
            .map(|(i, t)| (i, *t))
            .unwrap_or((0, 0));
        free_at[i] = t + per_node;
    }
    free_at.into_iter().max().unwrap_or(0)
}

/// Estimated duration of a whole rollout of `nodes` node cycles, `slots` at a
/// time: `ceil(nodes / slots) × per_node`.
pub fn rollout_seconds(per_node: i64, nodes: usize, slots: usize) -> i64 {
    let slots = slots.max(1);
    nodes.div_ceil(slots) as i64 * per_node
}

/// `45s`, `3m05s`, `2h04m`, `3d04h`.
pub fn human(seconds: i64) -> String {
    let s = seconds.max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86400, s % 86400 / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(state: NodeState, reason: &str, started: Option<i64>, since: i64) -> NodeRecord {
        let mut r = NodeRecord::new("fleet", "2.8.0", since);
        r.state = state;
        r.reason = Some(reason.into());
        r.started = started;
        r
    }

    #[test]
    fn durations_come_from_upgraded_cycles_only() {
        let recs = [
            rec(NodeState::Done, reason::UPGRADED, Some(100), 130),
            rec(NodeState::Done, reason::UPGRADED, Some(130), 170),
            rec(NodeState::Done, reason::UP_TO_DATE, None, 100),
            rec(NodeState::Done, reason::HOST_MANAGED, None, 100),
            rec(NodeState::Draining, "Drain", Some(170), 175),
        ];
        assert_eq!(observed_durations("fleet", None, &recs), [30, 40]);
        assert!(observed_durations("other", None, &recs).is_empty());
        assert!(observed_durations("fleet", Some("2.9.0"), &recs).is_empty());
        assert_eq!(
            per_node(&[30, 40]),
            PerNode {
                seconds: 35,
                samples: 2,
                basis: Basis::Observed
            }
        );
        assert_eq!(per_node(&[]).seconds, DEFAULT_PER_NODE_SECONDS);
    }

    #[test]
    fn remaining_time_fills_slots() {
        // One slot: the running node needs 20 s more, then 3 nodes × 30 s.
        assert_eq!(remaining_seconds(30, 1, &[10], 3), 110);
        // Two slots, one running (20 s left), 3 waiting: the free slot takes
        // nodes at 0 and 30, the other at 20: ends at 60.
        assert_eq!(remaining_seconds(30, 2, &[10], 3), 60);
        // Overdue running node: counted as about to finish.
        assert_eq!(remaining_seconds(30, 1, &[45], 0), 1);
        assert_eq!(remaining_seconds(30, 1, &[], 0), 0);
    }

    #[test]
    fn whole_rollout_estimate_and_formatting() {
        assert_eq!(rollout_seconds(90, 6, 1), 540);
        assert_eq!(rollout_seconds(90, 5, 2), 270);
        assert_eq!(rollout_seconds(90, 0, 1), 0);
        assert_eq!(human(45), "45s");
        assert_eq!(human(185), "3m05s");
        assert_eq!(human(7440), "2h04m");
        assert_eq!(human(3 * 86400 + 4 * 3600), "3d04h");
    }
}
