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

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use serde::Serialize;
use ttdrv_api::{NodeState, PodSelector, TenstorrentDriverPolicy, labels};
use ttdrv_core::device_holders;
use ttdrv_core::drain::{DaemonSetFacts, DaemonSets, PodFacts, PodRef, SkipReason};
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
    /// Every DaemonSet: which deploy gates their templates follow, and
    /// whether their pods hold the device.
    pub daemon_sets: &'a [DaemonSet],
    /// The controller's `deployGates`.
    pub deploy_gates: &'a [String],
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
    /// DaemonSet pods that will still hold the device after the gates
    /// close and the drain runs, each with the gate its DaemonSet lacks.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ungated_holders: Vec<UngatedHolder>,
    /// The DRA kubelet plugin's pods on the node (`namespace/name`, the
    /// tt-dra-driver chart's label): restarted after the swap, and the node
    /// waits until its ResourceSlices list every card before its uncordon.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub dra_plugin: Vec<String>,
}

/// A DaemonSet whose pod on the node no gate and no drain stands down.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UngatedHolder {
    /// `namespace/name`.
    pub daemon_set: String,
    /// Its pod on the node, `namespace/name`.
    pub pod: String,
    /// The key to add to `controller.deployGates` (for a DaemonSet with no
    /// gate: the key to give it).
    pub gate_key: String,
    /// Whether its template follows that key already (only the
    /// configuration lacks it).
    pub template_has_gate: bool,
    pub message: String,
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
    let selector = PodSelector::parse(&drain.pod_selector_label).unwrap_or_default();
    let want = desired_for(policy, &target);

    let assignment = selection::assign(
        inp.policies.iter(),
        inp.nodes.iter(),
        &Default::default(),
        // The controller's default; a chart with requireTenstorrentLabel=false is not seen here.
        Default::default(),
    );
    let owned = owned_by(&assignment, &name);
    let max = spec.upgrade_policy.max_unavailable_for(owned.len());
    let by_name = nodes_by_name(inp.nodes);

    // The policy as the controller's pass observes it. The plugin does not
    // render the installer template, so it cannot tell a current installer
    // pod from a stale one: none is looked at (`Missing`); with the target
    // loaded either needs no drain, and with another loaded neither changes
    // the cycle.
    let exempt = [inp.operator_namespace.to_string()];
    let daemon_sets: DaemonSets = inp
        .daemon_sets
        .iter()
        .map(|d| (PodRef::of_daemon_set(d), DaemonSetFacts::of(d)))
        .collect();
    let surface = ttdrv_core::surface::SurfaceConfig::default();
    let survey = Survey {
        policy_facts: PolicyFacts {
            desired: &want,
            drain,
            namespace: "",
            drain_exempt: &exempt,
            template_hash: "",
            selector: Some(&selector),
            gates: inp.deploy_gates,
            daemon_sets: &daemon_sets,
            now: 0,
            prepare_deadline_seconds: i64::MAX,
            surface: &surface,
        },
        pdbs: inp.pdbs.iter().collect(),
        pods_by_node: pods_on_owned_nodes(inp.pods, &owned),
        target: &target,
        ahead_for_target: preparing_version.as_deref() == Some(target.as_str()),
        status_prepared: prepared_in_status(policy),
        // (the plan reads no installer pods)
        no_baselines: std::collections::HashMap::new(),
    };
    let mut skipped = skipped_by_selection(inp, &assignment, &name);
    let mut sorted = survey.sort_owned(&owned, &by_name);
    skipped.append(&mut sorted.skipped);

    let (ordered, mut halted) = schedule_waves(&mut sorted.candidates, max);
    if !sorted.failed.is_empty() {
        halted = Some(halted_by_failures(&name, &sorted.failed));
    }
    let nodes = number_in_order(ordered, sorted.cycles);

    let named: Vec<(String, NodeRecord)> = owned
        .iter()
        .filter_map(|n| Some((n.clone(), by_name.get(n).and_then(|nd| record_of(nd))?)))
        .collect();
    let prepare = &spec.upgrade_policy.prepare;
    let max_concurrent = prepare.max_concurrent.max(1) as usize;
    let prediction = eta::predict(&prepared_by_wave(&nodes), inp.costs, max_concurrent);
    let estimate = estimate(inp, &named, &prediction, &nodes, &sorted.without_drain, max);
    let soak = spec.upgrade_policy.soak_seconds.max(0);
    let held = held_now(policy, &named, &target, soak, inp.now);
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
        estimate,
        nodes,
        without_drain: sorted.without_drain,
        skipped,
        halted,
        held,
        build_ahead,
    }
}

/// The policy as the machine reads it, for the version planned and as the
/// rollout runs (not paused, its DaemonSet accepted); deadlines play no
/// part in leaving Pending.
fn desired_for(policy: &TenstorrentDriverPolicy, target: &str) -> Desired {
    Desired {
        version: target.to_string(),
        paused: false,
        refused: false,
        unmanage: false,
        prepare: false,
        ..Desired::of(policy, 0)
    }
}

/// The nodes the policy owns.
fn owned_by(assignment: &selection::Assignment, name: &str) -> BTreeSet<String> {
    assignment
        .owned
        .get(name)
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .collect()
}

fn nodes_by_name(nodes: &[Node]) -> BTreeMap<String, &Node> {
    nodes
        .iter()
        .map(|node| (node.metadata.name.clone().unwrap_or_default(), node))
        .collect()
}

/// Per node, the version its agent reports prepared in the policy's status.
fn prepared_in_status(policy: &TenstorrentDriverPolicy) -> BTreeMap<&str, &str> {
    policy
        .status
        .iter()
        .flat_map(|s| s.nodes.iter())
        .filter_map(|n| Some((n.name.as_str(), n.prepared_version.as_deref()?)))
        .collect()
}

/// Nodes the policy selects but does not own: matched by an older policy
/// (`Conflict`), without the Tenstorrent label, or opted out.
fn skipped_by_selection(
    inp: &Inputs<'_>,
    assignment: &selection::Assignment,
    name: &str,
) -> Vec<NodeNote> {
    let mut skipped = Vec::new();
    for (node, owner) in assignment.conflicts.get(name).into_iter().flatten() {
        skipped.push(NodeNote {
            name: node.clone(),
            kind: "Conflict".into(),
            detail: format!("also matched by older policy {owner}, which owns it"),
        });
    }
    let empty = BTreeMap::new();
    for node in inp.nodes {
        let n = node.metadata.name.clone().unwrap_or_default();
        let selected = inp
            .policy
            .spec
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
    skipped
}

/// The pods bound to each owned node, as the drain sees them.
fn pods_on_owned_nodes<'a>(
    pods: &[Pod],
    owned: &'a BTreeSet<String>,
) -> BTreeMap<&'a str, Vec<PodFacts>> {
    let mut pods_by_node: BTreeMap<&str, Vec<PodFacts>> = BTreeMap::new();
    for pod in pods {
        if let Some(n) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref())
            && let Some(n) = owned.get(n)
        {
            pods_by_node.entry(n).or_default().push(PodFacts::of(pod));
        }
    }
    pods_by_node
}

/// What the plan reads to look at each owned node as the controller would.
struct Survey<'a> {
    policy_facts: PolicyFacts<'a>,
    pdbs: Vec<&'a PodDisruptionBudget>,
    pods_by_node: BTreeMap<&'a str, Vec<PodFacts>>,
    target: &'a str,
    /// The agents prepare the planned version (a plan for another counts on
    /// nothing but what is loaded).
    ahead_for_target: bool,
    status_prepared: BTreeMap<&'a str, &'a str>,
    no_baselines: std::collections::HashMap<String, ttdrv_core::installer::SandboxBaseline>,
}

/// The owned nodes sorted into those with a cycle and those without.
#[derive(Default)]
struct Sorted {
    without_drain: Vec<NodeNote>,
    /// Owned nodes left alone (host-managed, VFIO passthrough).
    skipped: Vec<NodeNote>,
    cycles: BTreeMap<String, PlannedNode>,
    /// Every owned node's slot facts, for the waves.
    candidates: Vec<Candidate>,
    failed: Vec<String>,
}

/// One owned node: no cycle (with its note), or a cycle.
enum Owned {
    WithoutCycle(NodeNote),
    Cycle { planned: PlannedNode, failed: bool },
}

impl Survey<'_> {
    fn sort_owned(&self, owned: &BTreeSet<String>, by_name: &BTreeMap<String, &Node>) -> Sorted {
        let mut sorted = Sorted::default();
        for n in owned {
            let Some(node) = by_name.get(n) else { continue };
            let (candidate, owned) = self.plan_node(n, node);
            sorted.candidates.push(candidate);
            match owned {
                Owned::WithoutCycle(note) => {
                    if matches!(
                        note.kind.as_str(),
                        reason::HOST_MANAGED | reason::VFIO_PASSTHROUGH
                    ) {
                        sorted.skipped.push(note);
                    } else {
                        sorted.without_drain.push(note);
                    }
                }
                Owned::Cycle { planned, failed } => {
                    if failed {
                        sorted.failed.push(n.clone());
                    }
                    sorted.cycles.insert(n.clone(), planned);
                }
            }
        }
        sorted
    }

    /// One owned node's slot facts for the waves, and whether it goes
    /// through a cycle.
    fn plan_node(&self, n: &str, node: &Node) -> (Candidate, Owned) {
        let facts = self.pods_by_node.get(n).map_or(&[][..], Vec::as_slice);
        let pods: Vec<&PodFacts> = facts.iter().collect();
        let on_node = node::record(node).ok().flatten();
        let node_facts = NodeFacts {
            node,
            on_node: on_node.as_ref(),
            pods: &pods,
            installers: &[],
            live: None,
            restart_baselines: &self.no_baselines,
            // The plan previews the cycle up to the swap: the scheduling
            // surface is read after it.
            dra_devices: None,
        };
        let want = self.policy_facts.desired;
        // As if the node were granted a slot now: its drain is planned.
        let view = observe::observe(&self.policy_facts, &node_facts, true, || self.pdbs.clone());
        let rec = view.persisted.as_ref();
        let loaded = view.obs.loaded.clone();
        let in_flight = rec
            .filter(|r| r.state.is_in_progress() && r.occupies_slot())
            .map(|r| r.state);
        let is_failed = rec.is_some_and(|r| r.state.is_failed());
        let prepared = self.is_prepared(n, node, loaded.as_deref(), &view.obs);
        // The controller's slot facts; a Failed node is planned as if retried.
        let facts = view.candidate(n, rec);
        if in_flight.is_none()
            && !is_failed
            && let Some(note) = without_cycle(node, &view.obs, want)
        {
            // Nodes without a cycle still count against maxUnavailable when
            // they are unavailable, as in the controller.
            let bystander = Candidate {
                wants_slot: false,
                in_progress: false,
                failed: false,
                has_device_pods: false,
                // Waves and order as once built: the time builds take is in the
                // duration model (eta), and the order does not change with them.
                prepared: true,
                ..facts
            };
            return (bystander, Owned::WithoutCycle(note));
        }
        let forecast = observe::forecast(&self.policy_facts, &node_facts, &self.pdbs);
        let blockers = forecast
            .blockers
            .iter()
            .map(|b| b.describe(self.policy_facts.drain))
            .collect();
        let (evict_device, evict_other, left) =
            drain_passes(self.policy_facts.drain, &forecast.plan, &pods);
        let candidate = Candidate {
            wants_slot: in_flight.is_none(),
            in_progress: in_flight.is_some(),
            failed: false,
            prepared: true,
            ..facts
        };
        let planned = PlannedNode {
            order: 0,
            wave: None,
            name: n.to_string(),
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
            ungated_holders: forecast
                .ungated
                .iter()
                .map(|h| UngatedHolder {
                    daemon_set: h.daemon_set.to_string(),
                    pod: h.pod.to_string(),
                    gate_key: h.key(),
                    template_has_gate: h.lacks != device_holders::Lacks::NoGate,
                    message: h.describe(),
                })
                .collect(),
            dra_plugin: view
                .obs
                .surface
                .plugin_pods
                .iter()
                .map(|p| p.pod.to_string())
                .collect(),
        };
        (
            candidate,
            Owned::Cycle {
                planned,
                failed: is_failed,
            },
        )
    }

    /// The target is loaded, or (when the agents prepare it) built into the
    /// node's cache ahead, as the node or the policy's status says.
    fn is_prepared(&self, n: &str, node: &Node, loaded: Option<&str>, obs: &Observation) -> bool {
        let want = self.policy_facts.desired;
        node::is_loaded(loaded, obs.parameters.as_ref(), want.target())
            || (self.ahead_for_target
                && (ttdrv_core::prepare::is_prepared(node, want.target())
                    || self.status_prepared.get(n) == Some(&self.target)))
    }
}

/// What each drain pass would evict (device users, then the rest), and the
/// pods worth naming that stay in place.
fn drain_passes(
    drain: &ttdrv_api::DrainPolicy,
    dp: &ttdrv_core::drain::DrainPlan,
    pods: &[&PodFacts],
) -> (Vec<String>, Vec<String>, Vec<LeftPod>) {
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
    (evict_device, evict_other, left)
}

/// Waves: grant slots as the RolloutActor would, finish the wave, repeat.
/// The nodes in rollout order with their wave (`None`: never reached), and
/// why the rollout would stall.
fn schedule_waves(
    candidates: &mut [Candidate],
    max: usize,
) -> (Vec<(String, Option<usize>)>, Option<String>) {
    let mut ordered: Vec<(String, Option<usize>)> = Vec::new();
    let mut halted = None;
    let mut wave = 0;
    loop {
        // The controller's brake default: the plugin cannot read its flags.
        let limits = rollout::Limits {
            max_unavailable: max,
            brake_percent: rollout::DEFAULT_BRAKE_PERCENT,
        };
        let p = rollout::plan(candidates.iter(), &Default::default(), limits);
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
    (ordered, halted)
}

/// The planned nodes in rollout order, numbered, with their wave.
fn number_in_order(
    ordered: Vec<(String, Option<usize>)>,
    mut cycles: BTreeMap<String, PlannedNode>,
) -> Vec<PlannedNode> {
    ordered
        .into_iter()
        .enumerate()
        .filter_map(|(i, (n, w))| {
            let mut pn = cycles.remove(&n)?;
            pn.order = i + 1;
            pn.wave = w;
            Some(pn)
        })
        .collect()
}

/// Per wave, whether each of its nodes is prepared.
fn prepared_by_wave(nodes: &[PlannedNode]) -> Vec<Vec<bool>> {
    let mut by_wave: BTreeMap<usize, Vec<bool>> = BTreeMap::new();
    for n in nodes {
        if let Some(w) = n.wave {
            by_wave.entry(w).or_default().push(n.prepared);
        }
    }
    by_wave.into_values().collect()
}

/// How long the rollout takes.
fn estimate(
    inp: &Inputs<'_>,
    named: &[(String, NodeRecord)],
    prediction: &eta::Prediction,
    nodes: &[PlannedNode],
    without_drain: &[NodeNote],
    max: usize,
) -> Estimate {
    let spec = &inp.policy.spec;
    let name = inp.policy.metadata.name.as_deref().unwrap_or_default();
    let prepare = &spec.upgrade_policy.prepare;
    // The same per-node figure `watch` uses (eta::estimate_per_node).
    let per_node = eta::estimate_per_node(
        &eta::observed_durations(name, None, named.iter().map(|(_, r)| r)),
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
    Estimate {
        per_node,
        node_cycles: nodes.len(),
        slots: max,
        waves,
        soak_seconds,
        seconds,
    }
}

/// Why no node starts right now (a closed maintenance window, a soak), as
/// the controller would say.
fn held_now(
    policy: &TenstorrentDriverPolicy,
    named: &[(String, NodeRecord)],
    target: &str,
    soak: i64,
    now: i64,
) -> Option<String> {
    match ttdrv_core::window::parse(&policy.spec.upgrade_policy.maintenance_windows) {
        Err(e) => Some(format!("the controller refuses the policy: spec.{e}")),
        Ok(windows) => rollout::hold(
            &windows,
            named.iter().map(|(n, r)| (n, r)),
            target,
            soak,
            now,
        )
        .map(|h| h.why),
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
