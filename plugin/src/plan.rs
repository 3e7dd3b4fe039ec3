//! `plan`: what a rollout of a policy (at its version, or another) would do now,
//! computed with the controller's own decision functions and changing nothing.
//!
//! - which nodes the policy owns ([`selection::assign`]) and which it would skip;
//! - which of them need a cordon/drain/upgrade cycle: those the state machine
//!   ([`machine::step`]) keeps in Pending waiting for a slot;
//! - the order and waves of node cycles ([`rollout::plan`] applied until every
//!   node had its turn, as the controller's RolloutActor does over time);
//! - per node, what each drain pass would evict ([`plan_drain`]), the pods left
//!   in place, and what would block: PodDisruptionBudgets that allow no disruption
//!   (named as the drain names them, [`drain::sequence`]) and device users the
//!   drain does not remove;
//! - an estimated duration: waves × the observed per-node figure, else the
//!   model's prediction for the policy's build-ahead setting;
//! - build-ahead (`upgradePolicy.prepare`): which nodes hold the target in their
//!   cache already, and the duration predicted with and without build-ahead
//!   ([`eta::predict`]) from the given per-part costs.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use serde::Serialize;
use ttdrv_api::{NodeState, PodSelector, TenstorrentDriverPolicy, labels};
use ttdrv_core::drain::{PodFacts, SkipReason};
use ttdrv_core::machine::{self, Desired, NodeRecord, Observation};
use ttdrv_core::node::{self, label};
use ttdrv_core::observe::{self, NodeFacts, PolicyFacts};
use ttdrv_core::rollout::{self, Candidate};
use ttdrv_core::{reason, selection};

use crate::eta::{self, PerNode};

use crate::view::record_of;

pub struct Inputs<'a> {
    pub policy: &'a TenstorrentDriverPolicy,
    /// Every policy in the cluster (ownership of shared nodes goes to the oldest).
    pub policies: &'a [TenstorrentDriverPolicy],
    pub nodes: &'a [Node],
    pub pods: &'a [Pod],
    pub pdbs: &'a [PodDisruptionBudget],
    /// The operator's namespace (`--namespace`): the controller's default
    /// drain exemption, so its pods are never drained.
    pub operator_namespace: &'a str,
    /// Version to plan for; default the policy's `spec.version`.
    pub version: Option<&'a str>,
    /// Per-part costs for the build-ahead prediction (`--build-seconds` etc.).
    pub costs: eta::Costs,
    /// Now (Unix seconds): whether a maintenance window or a soak holds the
    /// rollout at this moment.
    pub now: i64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LeftPod {
    pub pod: String,
    pub why: String,
    pub uses_device: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlannedNode {
    /// 1-based position in the rollout.
    pub order: usize,
    /// 1-based wave (nodes of one wave run at the same time); absent when the
    /// rollout would stall before reaching the node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wave: Option<usize>,
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current_version: Option<String>,
    /// State of a cycle already under way.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_state: Option<NodeState>,
    /// NotReady, or cordoned by someone else: starts first, costs no extra slot,
    /// and stays cordoned afterwards.
    pub already_unavailable: bool,
    /// Why, when `already_unavailable` (who cordoned it, as far as the node tells).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unavailable_because: Option<String>,
    /// Pods on the node use the device: such nodes go last.
    pub has_device_pods: bool,
    /// The target is loaded, or its agent built and verified it into the
    /// node's cache ahead (the cycle loads it, no build inside).
    pub prepared: bool,
    /// Pass 1: device users evicted.
    pub evict_device: Vec<String>,
    /// Pass 2: other pods evicted (`drain.fullNode`).
    pub evict_other: Vec<String>,
    pub left: Vec<LeftPod>,
    pub blockers: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeNote {
    pub name: String,
    /// `HostManaged`, `SkipLabel`, `Conflict`, `NotTenstorrent`, `UpToDate`, `FirstInstall`.
    pub kind: String,
    pub detail: String,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Estimate {
    pub per_node: PerNode,
    /// Nodes that go through a cordon/drain/upgrade cycle.
    pub node_cycles: usize,
    pub slots: usize,
    pub waves: usize,
    /// `upgradePolicy.soakSeconds` between waves, counted in `seconds`:
    /// (waves - 1) × soak.
    pub soak_seconds: i64,
    pub seconds: i64,
}

/// Build-ahead: what is prepared and what it saves.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BuildAhead {
    /// `upgradePolicy.prepare.enabled`: with it off, `withoutBuildAhead` applies.
    pub enabled: bool,
    /// `upgradePolicy.prepare.maxConcurrent`.
    pub max_concurrent: usize,
    /// The version the agents prepare now (`status.desiredVersion`); a plan for
    /// another finds nothing prepared but what is loaded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preparing_version: Option<String>,
    /// Nodes with a cycle that are prepared for the target.
    pub prepared: usize,
    pub costs: eta::Costs,
    #[serde(flatten)]
    pub prediction: eta::Prediction,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutPlan {
    pub policy: String,
    pub target_version: String,
    pub spec_version: String,
    pub paused: bool,
    pub drain_enabled: bool,
    pub max_unavailable: usize,
    /// Nodes with a cycle, in rollout order.
    pub nodes: Vec<PlannedNode>,
    /// Owned nodes that need no cordon or drain.
    pub without_drain: Vec<NodeNote>,
    /// Nodes the policy selects but leaves alone.
    pub skipped: Vec<NodeNote>,
    /// Why the rollout would not run to the end by itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub halted: Option<String>,
    /// Why no node starts right now (a closed maintenance window, with when
    /// the next opens; a soak), as the controller would say.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held: Option<String>,
    pub estimate: Estimate,
    pub build_ahead: BuildAhead,
}

/// A node the controller's state machine ([`machine::step`]) takes from
/// Pending without a maxUnavailable slot ([`machine::Step::needs_slot`]
/// false): left alone (`HostManaged`), or installed without cordon or drain
/// (`UpToDate`, `FirstInstall`). `None`: it waits for a slot, i.e. goes
/// through a cordon/drain/upgrade cycle.
fn without_cycle(node: &Node, observed: &Observation, want: &Desired) -> Option<NodeNote> {
    let (policy, target) = (want.policy.as_str(), want.version.as_str());
    let obs = Observation {
        // Readiness and build-ahead decide when a node starts, not whether it
        // needs a cycle: rollout::plan and eta account for them.
        ready: true,
        prepared: true,
        slot: false,
        ..observed.clone()
    };
    let of = obs
        .loaded
        .as_deref()
        .map(|v| format!(" of {v}"))
        .unwrap_or_default();
    let mut next = machine::step(&NodeRecord::new(policy, target, 0), &obs, want);
    if next.needs_slot {
        // A slot for a pod replaced in place (a new installer template) is no
        // cordon or drain; anything else with one is a cycle.
        let with_slot = Observation { slot: true, ..obs };
        next = machine::step(&NodeRecord::new(policy, target, 0), &with_slot, want);
        if !(next.record.no_drain && next.record.bounded) {
            return None;
        }
    }
    let next = next.record;
    let (kind, detail) = match (next.state, next.no_drain, next.reason.as_deref()) {
        (NodeState::Done, _, Some(reason::HOST_MANAGED)) => (
            reason::HOST_MANAGED,
            format!("host (DKMS) install{of}; left alone"),
        ),
        (NodeState::Done, _, Some(reason::VFIO_PASSTHROUGH)) => (
            reason::VFIO_PASSTHROUGH,
            "every Tenstorrent function on vfio-pci (VM passthrough); left alone".to_string(),
        ),
        (NodeState::Done, _, Some(reason::UP_TO_DATE))
        | (NodeState::Upgrading, true, Some(reason::RESTART)) => (
            reason::UP_TO_DATE,
            format!(
                "already runs {target} (at most an in-place installer restart, maxUnavailable at a time)"
            ),
        ),
        (NodeState::Upgrading, true, Some(reason::INSTALL)) => (
            reason::INSTALL,
            "no module loaded yet: installed without cordon or drain".to_string(),
        ),
        _ => return None,
    };
    Some(NodeNote {
        name: node.metadata.name.clone().unwrap_or_default(),
        kind: kind.into(),
        detail,
    })
}

pub fn build(inp: &Inputs<'_>) -> RolloutPlan {
    let policy = inp.policy;
    let name = policy.metadata.name.clone().unwrap_or_default();
    let spec = &policy.spec;
    let target = inp.version.unwrap_or(&spec.version).to_string();
    let drain = &spec.upgrade_policy.drain;
    // Agents build ahead the version the controller acts on; a plan for another
    // version can count on nothing but what is loaded.
    let preparing_version = policy
        .status
        .as_ref()
        .and_then(|s| s.desired_version.clone());
    let ahead_for_target = preparing_version.as_deref() == Some(target.as_str());
    let status_prepared: BTreeMap<&str, &str> = policy
        .status
        .iter()
        .flat_map(|s| s.nodes.iter())
        .filter_map(|n| Some((n.name.as_str(), n.prepared_version.as_deref()?)))
        .collect();
    let selector = PodSelector::parse(&drain.pod_selector_label).unwrap_or_default();
    // The policy as the machine reads it, for the version planned and as the
    // rollout runs (not paused, its DaemonSet accepted); deadlines play no
    // part in leaving Pending.
    let want = Desired {
        version: target.clone(),
        paused: false,
        refused: false,
        unmanage: false,
        prepare: false,
        ..Desired::of(policy, 0)
    };

    let assignment = selection::assign(
        inp.policies.iter(),
        inp.nodes.iter(),
        &Default::default(),
        // The controller's default; a chart with requireTenstorrentLabel=false is not seen here.
        Default::default(),
    );
    let owned: BTreeSet<String> = assignment
        .owned
        .get(&name)
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .collect();
    let max = spec.upgrade_policy.max_unavailable_for(owned.len());

    let mut skipped = Vec::new();
    for (node, owner) in assignment.conflicts.get(&name).into_iter().flatten() {
        skipped.push(NodeNote {
            name: node.clone(),
            kind: "Conflict".into(),
            detail: format!("also matched by older policy {owner}, which owns it"),
        });
    }
    let empty = BTreeMap::new();
    let mut by_name: BTreeMap<String, &Node> = BTreeMap::new();
    for node in inp.nodes {
        let n = node.metadata.name.clone().unwrap_or_default();
        by_name.insert(n.clone(), node);
        let selected = spec
            .selector()
            .is_some_and(|s| s.matches(node.metadata.labels.as_ref().unwrap_or(&empty)));
        if !selected || selection::eligible(node) || node.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let (kind, detail) = if label(node, labels::TT_PCI_PRESENT) != Some("true") {
            (
                "NotTenstorrent",
                format!("no {}=true label", labels::TT_PCI_PRESENT),
            )
        } else {
            (
                "SkipLabel",
                format!("labelled {} (opted out)", labels::SKIP),
            )
        };
        skipped.push(NodeNote {
            name: n,
            kind: kind.into(),
            detail,
        });
    }

    let mut pods_by_node: BTreeMap<&str, Vec<PodFacts>> = BTreeMap::new();
    for pod in inp.pods {
        if let Some(n) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref())
            && owned.contains(n)
        {
            pods_by_node.entry(n).or_default().push(PodFacts::of(pod));
        }
    }

    let pdbs: Vec<&PodDisruptionBudget> = inp.pdbs.iter().collect();
    // The policy as the controller's pass observes it. The plugin does not
    // render the installer template, so it cannot tell a current installer
    // pod from a stale one: none is looked at (`Missing`); with the target
    // loaded either needs no drain, and with another loaded neither changes
    // the cycle.
    let exempt = [inp.operator_namespace.to_string()];
    let policy_facts = PolicyFacts {
        desired: &want,
        drain,
        namespace: "",
        drain_exempt: &exempt,
        template_hash: "",
        selector: Some(&selector),
        gates: &[],
        now: 0,
        prepare_deadline_seconds: i64::MAX,
    };
    let mut without_drain = Vec::new();
    let mut cycles: BTreeMap<String, PlannedNode> = BTreeMap::new();
    let mut candidates = Vec::new();
    let mut failed = Vec::new();
    // (the plan reads no installer pods)
    let no_baselines = std::collections::HashMap::new();
    for n in &owned {
        let Some(node) = by_name.get(n) else { continue };
        let facts = pods_by_node.get(n.as_str()).map_or(&[][..], Vec::as_slice);
        let pods: Vec<&PodFacts> = facts.iter().collect();
        let on_node = node::record(node).ok().flatten();
        let node_facts = NodeFacts {
            node,
            on_node: on_node.as_ref(),
            pods: &pods,
            installers: &[],
            live: None,
            restart_baselines: &no_baselines,
        };
        // As if the node were granted a slot now: its drain is planned.
        let view = observe::observe(&policy_facts, &node_facts, true, || pdbs.clone());
        let rec = view.persisted.as_ref();
        let loaded = view.obs.loaded.clone();
        let in_flight = rec
            .filter(|r| r.state.is_in_progress() && r.occupies_slot())
            .map(|r| r.state);
        let is_failed = rec.is_some_and(|r| r.state.is_failed());
        let prepared = node::is_loaded(
            loaded.as_deref(),
            view.obs.parameters.as_ref(),
            want.target(),
        ) || (ahead_for_target
            && (ttdrv_core::prepare::is_prepared(node, want.target())
                || status_prepared.get(n.as_str()) == Some(&target.as_str())));
        // The controller's slot facts; a Failed node is planned as if retried.
        let facts = view.candidate(n, rec);
        let bystander = Candidate {
            wants_slot: false,
            in_progress: false,
            failed: false,
            has_device_pods: false,
            // Waves and order as once built: the time builds take is in the
            // duration model (eta), and the order does not change with them.
            prepared: true,
            ..facts.clone()
        };
        if in_flight.is_none()
            && !is_failed
            && let Some(note) = without_cycle(node, &view.obs, &want)
        {
            if matches!(
                note.kind.as_str(),
                reason::HOST_MANAGED | reason::VFIO_PASSTHROUGH
            ) {
                skipped.push(note);
            } else {
                without_drain.push(note);
            }
            // Nodes without a cycle still count against maxUnavailable when
            // they are unavailable, as in the controller.
            candidates.push(bystander);
            continue;
        }
        if is_failed {
            failed.push(n.clone());
        }
        let forecast = observe::forecast(&policy_facts, &node_facts, &pdbs);
        let dp = &forecast.plan;
        let blockers = forecast
            .blockers
            .iter()
            .map(|b| b.describe(drain))
            .collect();
        let (mut evict_device, mut evict_other, mut left) = (vec![], vec![], vec![]);
        if drain.enable {
            evict_device = dp.device.iter().map(ToString::to_string).collect();
            evict_other = dp.full.iter().map(ToString::to_string).collect();
            for (r, why, device) in &dp.skipped {
                let interesting = *device
                    || !matches!(
                        why,
                        SkipReason::DaemonSet | SkipReason::Mirror | SkipReason::Finished
                    );
                if interesting {
                    left.push(LeftPod {
                        pod: r.to_string(),
                        why: why.as_str().into(),
                        uses_device: *device,
                    });
                }
            }
        } else {
            for f in pods.iter().filter(|f| f.device && !f.installer) {
                left.push(LeftPod {
                    pod: f.pod.to_string(),
                    why: "drain.enable is off".into(),
                    uses_device: true,
                });
            }
        }
        candidates.push(Candidate {
            wants_slot: in_flight.is_none(),
            in_progress: in_flight.is_some(),
            failed: false,
            prepared: true,
            ..facts
        });
        cycles.insert(
            n.clone(),
            PlannedNode {
                order: 0,
                wave: None,
                name: n.clone(),
                current_version: loaded,
                in_state: in_flight.or(is_failed.then_some(NodeState::Failed)),
                already_unavailable: view.externally_unavailable,
                unavailable_because: view.unavailable_because.clone(),
                has_device_pods: view.has_device_pods,
                prepared,
                evict_device,
                evict_other,
                left,
                blockers,
            },
        );
    }

    // Waves: grant slots as the RolloutActor would, finish the wave, repeat.
    let mut ordered: Vec<(String, Option<usize>)> = Vec::new();
    let mut halted = None;
    let mut wave = 0;
    loop {
        // The controller's brake default: the plugin cannot read its flags.
        let limits = rollout::Limits {
            max_unavailable: max,
            brake_percent: rollout::DEFAULT_BRAKE_PERCENT,
        };
        let p = rollout::plan(&candidates, &Default::default(), limits);
        let running: Vec<String> = candidates
            .iter()
            .filter(|c| c.in_progress)
            .map(|c| c.name.clone())
            .collect();
        if p.granted.is_empty() && running.is_empty() {
            if candidates.iter().any(|c| c.wants_slot) {
                halted = Some(format!(
                    "the rollout would stall: {}",
                    p.blocked.unwrap_or_else(|| "no slot frees up".into())
                ));
            }
            break;
        }
        wave += 1;
        let mut wave_nodes: Vec<String> = running;
        wave_nodes.sort();
        wave_nodes.extend(p.granted.iter().cloned());
        for c in candidates.iter_mut() {
            if wave_nodes.contains(&c.name) {
                c.wants_slot = false;
                c.in_progress = false;
                // A node someone else cordoned stays cordoned, NotReady stays NotReady.
            }
        }
        ordered.extend(wave_nodes.into_iter().map(|n| (n, Some(wave))));
    }
    let mut rest: Vec<&Candidate> = candidates.iter().filter(|c| c.wants_slot).collect();
    rest.sort_by_key(|c| rollout::order_key(c));
    ordered.extend(rest.into_iter().map(|c| (c.name.clone(), None)));
    if !failed.is_empty() {
        halted = Some(halted_by_failures(&name, &failed));
    }
    let nodes: Vec<PlannedNode> = ordered
        .into_iter()
        .enumerate()
        .filter_map(|(i, (n, w))| {
            let mut pn = cycles.remove(&n)?;
            pn.order = i + 1;
            pn.wave = w;
            Some(pn)
        })
        .collect();

    let named: Vec<(String, NodeRecord)> = owned
        .iter()
        .filter_map(|n| Some((n.clone(), by_name.get(n).and_then(|nd| record_of(nd))?)))
        .collect();
    let records: Vec<&NodeRecord> = named.iter().map(|(_, r)| r).collect();
    let prepare = &spec.upgrade_policy.prepare;
    let max_concurrent = prepare.max_concurrent.max(1) as usize;
    let mut by_wave: BTreeMap<usize, Vec<bool>> = BTreeMap::new();
    for n in &nodes {
        if let Some(w) = n.wave {
            by_wave.entry(w).or_default().push(n.prepared);
        }
    }
    let waves_prepared: Vec<Vec<bool>> = by_wave.into_values().collect();
    let prediction = eta::predict(&waves_prepared, inp.costs, max_concurrent);
    // The same per-node figure `watch` uses (eta::estimate_per_node).
    let per_node = eta::estimate_per_node(
        &eta::observed_durations(&name, None, records.iter().copied()),
        None,
        inp.costs,
        prepare.enabled,
    );
    let waves = nodes.iter().filter_map(|n| n.wave).max().unwrap_or(0);
    // Observed cycles: the simulated waves × the observed figure. Nothing
    // observed: the model's prediction for the policy's build-ahead setting,
    // the line marked "← applies" (it counts the first build, which a
    // per-node figure cannot). Nothing simulated: nodes / slots.
    let mut seconds = match (waves > 0, per_node.basis) {
        (true, eta::Basis::Model) if prepare.enabled => prediction.with_build_ahead,
        (true, eta::Basis::Model) => prediction.without_build_ahead,
        (true, _) => waves as i64 * per_node.seconds,
        (false, _) => eta::rollout_seconds(per_node.seconds, nodes.len(), max),
    };
    if seconds == 0 && without_drain.iter().any(|n| n.kind == reason::INSTALL) {
        seconds = per_node.seconds;
    }
    // After each wave the next waits out the soak of the node upgraded last.
    let soak = spec.upgrade_policy.soak_seconds.max(0);
    let soak_seconds = waves.saturating_sub(1) as i64 * soak;
    seconds += soak_seconds;
    let held = match ttdrv_core::window::parse(&spec.upgrade_policy.maintenance_windows) {
        Err(e) => Some(format!("the controller refuses the policy: spec.{e}")),
        Ok(windows) => rollout::hold(
            &windows,
            named.iter().map(|(n, r)| (n, r)),
            &target,
            soak,
            inp.now,
        )
        .map(|h| h.why),
    };
    skipped.sort_by(|a, b| (&a.kind, &a.name).cmp(&(&b.kind, &b.name)));
    let build_ahead = BuildAhead {
        enabled: prepare.enabled,
        max_concurrent,
        preparing_version,
        prepared: nodes.iter().filter(|n| n.prepared).count(),
        costs: inp.costs,
        prediction,
    };
    RolloutPlan {
        policy: name,
        target_version: target,
        spec_version: spec.version.clone(),
        paused: spec.paused,
        drain_enabled: drain.enable,
        max_unavailable: max,
        estimate: Estimate {
            per_node,
            node_cycles: nodes.len(),
            slots: max,
            waves,
            soak_seconds,
            seconds,
        },
        nodes,
        without_drain,
        skipped,
        halted,
        held,
        build_ahead,
    }
}

/// Why a plan is halted by Failed nodes, with the command that retries them:
/// the node named when there is one.
fn halted_by_failures(policy: &str, failed: &[String]) -> String {
    let node = match failed {
        [one] => one.as_str(),
        _ => "<node>",
    };
    format!(
        "halted now: node(s) {} Failed; nothing starts until they are retried \
         (kubectl tt driver retry {policy} {node}); the order assumes they are",
        failed.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_retry_command_names_the_one_failed_node() {
        let one = halted_by_failures("prod", &["gpu-c".to_string()]);
        assert!(one.contains("kubectl tt driver retry prod gpu-c)"), "{one}");
        let two = halted_by_failures("prod", &["a".to_string(), "b".to_string()]);
        assert!(two.contains("retry prod <node>"), "{two}");
        assert!(two.contains("node(s) a, b Failed"), "{two}");
    }
}
