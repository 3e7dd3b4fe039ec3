//! Per-node durations observed so far, and what they predict.
//!
//! A node's duration is its whole cycle, from the moment it left Pending
//! (`started` in the controller's per-node record) to the moment it reached Done
//! (`since` of the Done record). When the records cannot be read, the policy's
//! status gives a coarser figure: the time from the rollout's start to the last
//! node Done, spread over the nodes done so far. With neither, the model's
//! figure is used: what a cordon holds by the per-part costs ([`Costs`]).
//! `plan` and `watch` both take their per-node figure from
//! [`estimate_per_node`], so they never disagree on it.

use ttdrv_api::{ConditionType, NodeState, TenstorrentDriverPolicyStatus};
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
    /// Nothing observed: the model's figure ([`model_per_node`]).
    Model,
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
        .find(|c| c.type_ == ConditionType::Progressing.as_str() && c.status == "True")?
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

/// What one node's cycle costs by the model, nothing observed: with
/// build-ahead the cordon holds the drain and a load from the cache (the
/// build ran before it); without, the drain, the installer pod's
/// replacement, the build and the load.
pub fn model_per_node(c: Costs, build_ahead: bool) -> i64 {
    let (build, load, pod, drain) = (
        c.build.max(0),
        c.load.max(0),
        c.pod_replacement.max(0),
        c.drain.max(0),
    );
    let s = if build_ahead {
        drain + load
    } else {
        drain + pod + build + load
    };
    s.max(1)
}

/// The one per-node estimate of `plan` and `watch`: the mean of the cycles
/// observed, else the status's coarse figure, else the model's.
pub fn estimate_per_node(
    observed: &[i64],
    from_status: Option<PerNode>,
    costs: Costs,
    build_ahead: bool,
) -> PerNode {
    if !observed.is_empty() {
        return per_node(observed);
    }
    from_status.unwrap_or(PerNode {
        seconds: model_per_node(costs, build_ahead),
        samples: 0,
        basis: Basis::Model,
    })
}

/// Mean of the samples (rounded), else the model's figure without
/// build-ahead (the default costs: [`DEFAULT_PER_NODE_SECONDS`]).
pub fn per_node(samples: &[i64]) -> PerNode {
    if samples.is_empty() {
        return PerNode {
            seconds: model_per_node(Costs::default(), false),
            samples: 0,
            basis: Basis::Model,
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

/// Build-ahead prediction defaults (`plan --build-seconds` etc.). A cache-miss
/// build of the module: the spec's 30–90 s, its middle.
pub const DEFAULT_BUILD_SECONDS: u32 = 60;
/// A load from the cache (rmmod, insmod, device check): the spec's ~5 s cache hit.
pub const DEFAULT_LOAD_SECONDS: u32 = 5;
/// The installer pod's replacement: 0.13 s measured on the simulated cluster
/// (docs/benchmarks.md), plus a container start and, at worst, an image pull.
pub const DEFAULT_POD_SECONDS: u32 = 5;
/// Cordon, both eviction passes and uncordon: what is left of the per-node
/// default ([`DEFAULT_PER_NODE_SECONDS`], a cache-cold cycle) once the default
/// build, load and pod replacement are taken out, so that the figure without
/// build-ahead matches the plain estimate when nothing has been observed.
pub const DEFAULT_DRAIN_SECONDS: u32 = DEFAULT_PER_NODE_SECONDS as u32
    - DEFAULT_BUILD_SECONDS
    - DEFAULT_LOAD_SECONDS
    - DEFAULT_POD_SECONDS;

/// What one node's upgrade costs, by part, in seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Costs {
    pub build: i64,
    pub load: i64,
    pub pod_replacement: i64,
    pub drain: i64,
}

impl Default for Costs {
    fn default() -> Self {
        Self {
            build: DEFAULT_BUILD_SECONDS.into(),
            load: DEFAULT_LOAD_SECONDS.into(),
            pod_replacement: DEFAULT_POD_SECONDS.into(),
            drain: DEFAULT_DRAIN_SECONDS.into(),
        }
    }
}

/// A rollout's predicted duration with and without build-ahead.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Prediction {
    /// Build-ahead on: builds run ahead, `max_concurrent` at once, in rollout
    /// order; a wave cordons once all its nodes are prepared and holds drain +
    /// load.
    pub with_build_ahead: i64,
    /// Build-ahead on: seconds before the first cordon (the first wave's
    /// pod replacements and builds; 0 when its nodes are prepared).
    pub first_build: i64,
    /// Build-ahead on: builds, not cycles, set the pace (a wave waits for its
    /// build after the first): `max_concurrent` too low for the build time.
    pub build_bound: bool,
    /// Build-ahead off: each wave holds drain + pod replacement + build + load,
    /// without the build when all its nodes are prepared (a cache hit).
    pub without_build_ahead: i64,
    /// Build-ahead off: waves whose nodes are all prepared (no build inside).
    pub prepared_waves: usize,
}

/// The rollout's duration with and without build-ahead. `waves` holds, per
/// wave in order, whether each of its nodes is prepared (the target cached or
/// loaded). Nodes of one wave run at the same time, waves one after another.
pub fn predict(waves: &[Vec<bool>], c: Costs, max_concurrent: usize) -> Prediction {
    let (build, load, pod, drain) = (
        c.build.max(0),
        c.load.max(0),
        c.pod_replacement.max(0),
        c.drain.max(0),
    );
    let prepared_waves = waves.iter().filter(|w| w.iter().all(|p| *p)).count();
    let without_build_ahead =
        waves.len() as i64 * (drain + pod + load) + (waves.len() - prepared_waves) as i64 * build;

    // With: `max_concurrent` build slots; each unprepared node, in rollout
    // order, takes the slot that frees first (its pod is replaced, then it
    // builds); a wave starts when the previous one ended and its own nodes are
    // ready.
    let mut slots = vec![0i64; max_concurrent.max(1)];
    let mut end = 0i64;
    let mut first_build = 0;
    for (i, wave) in waves.iter().enumerate() {
        let mut ready = 0i64;
        for _ in wave.iter().filter(|p| !**p) {
            let (k, t) = slots
                .iter()
                .enumerate()
                .min_by_key(|(_, t)| **t)
                .map(|(k, t)| (k, *t))
                .unwrap_or((0, 0));
            slots[k] = t + pod + build;
            ready = ready.max(slots[k]);
        }
        let start = end.max(ready);
        if i == 0 {
            first_build = start;
        }
        end = start + drain + load;
    }
    Prediction {
        with_build_ahead: end,
        first_build,
        build_bound: end > first_build + waves.len() as i64 * (drain + load),
        without_build_ahead,
        prepared_waves,
    }
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
    fn one_estimate_observed_then_status_then_model() {
        let status = PerNode {
            seconds: 12,
            samples: 3,
            basis: Basis::Status,
        };
        let c = Costs::default();
        // Observed cycles win over the status and the model.
        let e = estimate_per_node(&[30, 40], Some(status), c, true);
        assert_eq!((e.seconds, e.basis), (35, Basis::Observed));
        // No cycle observed: the status's figure.
        assert_eq!(estimate_per_node(&[], Some(status), c, true), status);
        // Neither: what the cordon holds by the model, which depends on
        // build-ahead (drain + load) or not (the whole cycle, 90 s).
        let on = estimate_per_node(&[], None, c, true);
        assert_eq!((on.seconds, on.basis), (c.drain + c.load, Basis::Model));
        let off = estimate_per_node(&[], None, c, false);
        assert_eq!(off.seconds, DEFAULT_PER_NODE_SECONDS);
        assert_eq!(model_per_node(costs(60, 2, 1, 10), false), 73);
        assert_eq!(model_per_node(costs(0, 0, 0, 0), true), 1);
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

    fn costs(build: i64, load: i64, pod: i64, drain: i64) -> Costs {
        Costs {
            build,
            load,
            pod_replacement: pod,
            drain,
        }
    }

    #[test]
    fn default_costs_add_up_to_the_default_per_node_cycle() {
        let c = Costs::default();
        assert_eq!(
            c.drain + c.build + c.load + c.pod_replacement,
            DEFAULT_PER_NODE_SECONDS
        );
        assert_eq!((c.build, c.load, c.drain), (60, 5, 20));
    }

    #[test]
    fn build_ahead_pays_one_build_then_drain_and_load_per_wave() {
        // 100 nodes one at a time, nothing prepared, 60 s build, 2 s load,
        // 10 s drain, 1 s pod replacement, 10 building at once.
        let waves = vec![vec![false]; 100];
        let p = predict(&waves, costs(60, 2, 1, 10), 10);
        assert_eq!(p.without_build_ahead, 100 * (10 + 60 + 2 + 1));
        // First wave waits for its pod replacement and build (61 s); the
        // builds of nodes 2-10 finish with it, each later batch of 10 is done
        // long before its turn (every 12 s a node, 120 s a batch).
        assert_eq!(p.first_build, 61);
        assert_eq!(p.with_build_ahead, 61 + 100 * 12);
        assert!(!p.build_bound);
        assert_eq!(p.prepared_waves, 0);
    }

    #[test]
    fn prepared_nodes_skip_the_build_both_ways() {
        // Wave 1 prepared, wave 2 not: without, only wave 2 builds; with, wave
        // 2's build runs during wave 1's cycle and is waited for after it.
        let waves = vec![vec![true, true], vec![false, true]];
        let p = predict(&waves, costs(60, 5, 5, 20), 10);
        assert_eq!(p.without_build_ahead, 2 * 30 + 60);
        assert_eq!(p.prepared_waves, 1);
        assert_eq!(p.first_build, 0);
        // Wave 1: 0..25; wave 2 waits for its node ready at 65: 65..90.
        assert_eq!(p.with_build_ahead, 90);
        assert!(p.build_bound, "the second wave waited for its build");
        // Everything prepared: no build anywhere; with build-ahead the pod
        // replacement is not in the window either.
        let all = vec![vec![true]; 3];
        let p = predict(&all, costs(60, 5, 5, 20), 10);
        assert_eq!(p.without_build_ahead, 3 * 30);
        assert_eq!(p.with_build_ahead, 3 * 25);
        assert_eq!(p.first_build, 0);
    }

    #[test]
    fn too_few_concurrent_builds_make_the_builds_the_pace() {
        // One build at a time, 60 s each (+0 pod), cycles of 10 s: node k is
        // ready at 60k, so the rollout ends at the last build + one cycle.
        let waves = vec![vec![false]; 5];
        let p = predict(&waves, costs(60, 2, 0, 8), 1);
        assert_eq!(p.first_build, 60);
        assert_eq!(p.with_build_ahead, 5 * 60 + 10);
        assert!(p.build_bound);
        // maxConcurrent 0 is read as 1 (as the controller does).
        assert_eq!(predict(&waves, costs(60, 2, 0, 8), 0), p);
        // Two nodes per wave, 2 builds at once: the same as one at a time.
        let pairs = vec![vec![false, false]; 3];
        let p = predict(&pairs, costs(60, 2, 0, 8), 2);
        assert_eq!(p.with_build_ahead, 3 * 60 + 10);
        assert_eq!(p.without_build_ahead, 3 * 70);
    }

    #[test]
    fn no_waves_take_no_time() {
        let p = predict(&[], Costs::default(), 10);
        assert_eq!((p.with_build_ahead, p.without_build_ahead), (0, 0));
        assert!(!p.build_bound);
    }
}
