//! One node as a policy sees it, from plain facts (the Node, its pods, its
//! installer pods, the PDBs): the [`Observation`] the state machine steps on,
//! the drain's next evictions and the node's slot facts. Shared by the
//! controller's pass, the NodeActor and the kubectl plugin, each feeding it
//! from where it reads the cluster (reflector stores, API replies, a list).

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use ttdrv_api::{DrainPolicy, NodeState, PodSelector, labels};

use crate::drain::{self, DrainPass, PodFacts, PodRef};
use crate::machine::{Desired, InstallerPod, NodeRecord, Observation};
use crate::rollout::Candidate;
use crate::{device_holders, installer, node, prepare};

/// What is known of the policy before any of its nodes is looked at.
#[derive(Clone, Copy, Debug)]
pub struct PolicyFacts<'a> {
    /// Policy name, target version and `prepare` ([`Desired::of`]).
    pub desired: &'a Desired,
    /// `spec.upgradePolicy.drain`.
    pub drain: &'a DrainPolicy,
    /// The operator's namespace: its installer pods run there.
    pub namespace: &'a str,
    /// Namespaces no drain evicts from ([`drain::plan_drain`]): by default
    /// the operator's.
    pub drain_exempt: &'a [String],
    /// Template hash a current installer pod carries (empty: unknown yet).
    pub template_hash: &'a str,
    /// `podSelectorLabel` parsed; `None` when it does not parse (no drain
    /// can be planned then).
    pub selector: Option<&'a PodSelector>,
    pub gates: &'a [String],
    /// Every DaemonSet's gates and device use, by `namespace/name`: which
    /// DaemonSet pods the gates stand down ([`drain::stood_down`]).
    pub daemon_sets: &'a drain::DaemonSets,
    pub now: i64,
    /// After this long without preparing, a current installer pod no longer
    /// holds its node's cycle back (see [`prepare::gate`]).
    pub prepare_deadline_seconds: i64,
    /// Who publishes the cards to the scheduler ([`crate::surface`]).
    pub surface: &'a crate::surface::SurfaceConfig,
}

/// What is known of one node.
#[derive(Clone, Copy, Debug)]
pub struct NodeFacts<'a> {
    pub node: &'a Node,
    /// The record persisted on the Node, whichever policy wrote it (`None`
    /// when absent or unreadable: [`node::record`]).
    pub on_node: Option<&'a NodeRecord>,
    /// Every pod bound to the node (installer pods included).
    pub pods: &'a [&'a PodFacts],
    /// Installer pods bound to the node, whole (any policy's: the policy's
    /// own is picked by namespace and claim label).
    pub installers: &'a [&'a Pod],
    /// The record the node's actor holds: fresher than `on_node`.
    pub live: Option<&'a NodeRecord>,
    /// Installer pods' restart baselines, by pod UID, as the pod cache kept
    /// them when each pod's current sandbox appeared; a pod not in it counts
    /// as seen for the first time now ([`installer::baseline`]).
    pub restart_baselines: &'a HashMap<String, installer::SandboxBaseline>,
    /// Devices the node's ResourceSlices of the DRA driver list
    /// ([`crate::surface::slice_devices`]); None without any slice.
    pub dra_devices: Option<u32>,
}

/// Whether `pod` (an installer of the node in `n`) has failed for good,
/// counting its restarts in its current sandbox.
fn installer_failure(n: &NodeFacts<'_>, pod: &Pod) -> Option<installer::Failure> {
    let known = pod
        .metadata
        .uid
        .as_deref()
        .and_then(|uid| n.restart_baselines.get(uid));
    installer::failure(pod, installer::baseline(pod, known).as_ref())
}

/// One node as a pass sees it.
#[derive(Clone, Debug)]
pub struct NodeView {
    pub obs: Observation,
    /// The record persisted on the Node for this policy, if readable.
    pub persisted: Option<NodeRecord>,
    /// Pods to evict now (pass 1 first); empty unless a drain was planned.
    pub evictions: Vec<(PodRef, DrainPass)>,
    pub installer_pod: Option<PodRef>,
    /// Pods the drain leaves in place, with why (reported when it ends).
    pub skipped: Vec<String>,
    pub has_device_pods: bool,
    /// NotReady, or cordoned by someone else.
    pub externally_unavailable: bool,
    /// Why, when `externally_unavailable`.
    pub unavailable_because: Option<String>,
    /// Its cards read back older than `spec.minFirmwareVersion`: it waits
    /// for the firmware policy, not for a slot.
    pub waits_on_firmware: bool,
}

impl NodeView {
    /// The node's slot facts for the rollout planner; `rec` is the node's
    /// current record (the live one, else the persisted one).
    pub fn candidate(&self, name: &str, rec: Option<&NodeRecord>) -> Candidate {
        let state = rec.map_or(NodeState::Pending, |r| r.state);
        Candidate {
            name: name.to_string(),
            // A node a firmware cycle holds waits for it, not for a slot:
            // it holds back no node after it.
            wants_slot: state == NodeState::Pending
                && self.obs.held_by.is_none()
                && !self.waits_on_firmware,
            in_progress: rec.is_some_and(NodeRecord::occupies_slot),
            ready: self.obs.ready,
            unavailable: self.externally_unavailable,
            unavailable_because: self.unavailable_because.clone(),
            failed: rec.is_some_and(NodeRecord::halts_rollout),
            has_device_pods: self.has_device_pods,
            prepared: self.obs.prepared,
        }
    }
}

/// The DaemonSets the flash that handed `policy` this node's cordon stood
/// down (its record keeps them with the hand-over); empty otherwise.
fn handed_over_stood_down(node: &k8s_openapi::api::core::v1::Node, policy: &str) -> Vec<String> {
    if node::handed_over_to(node) != Some(policy) {
        return vec![];
    }
    node::firmware_record(node).map_or_else(Vec::new, |r| r.stood_down)
}

/// Observes one node. The drain is planned when `starting` (the node was just
/// granted a slot and may cordon and enter Draining within one step) or when
/// either the live or the persisted record is in Cordoning or Draining: the
/// plan must never be missing when a node could leave Draining. `pdbs` is
/// called only then (a pass reads them once, and only if a node drains).
pub fn observe<'p>(
    p: &PolicyFacts<'_>,
    n: &NodeFacts<'_>,
    starting: bool,
    pdbs: impl FnOnce() -> Vec<&'p PodDisruptionBudget>,
) -> NodeView {
    let node = n.node;
    let policy_name = p.desired.policy.as_str();
    let installer = installer_of(p, n.installers);
    // Another policy's cycle cut short (the node moved here): its cordon
    // was ours, and stays ours to undo.
    let inherited_cordon = n.on_node.is_some_and(|r| {
        r.policy != policy_name
            && r.cordoned_by_us()
            && (r.state.is_in_progress() || r.state.is_failed())
    }) && node::unschedulable(node)
        // The Go operator's cordon for this policy (it annotated whom it
        // cordoned for): ours now, undone when the node is Done.
        || (node::annotation(node, labels::GO_CORDONED_BY) == Some(policy_name)
            && node::unschedulable(node));
    let persisted = n.on_node.filter(|r| r.policy == policy_name).cloned();
    let live = n.live;
    let rec = live.or(persisted.as_ref());
    let pods = || n.pods.iter().copied();
    let vfio = node::vfio_resources(node);
    let plan = p
        .selector
        .map(|sel| drain::plan_drain(pods(), p.drain, sel, p.drain_exempt, &vfio));
    let draining = starting
        || [live, persisted.as_ref()]
            .into_iter()
            .flatten()
            .any(|r| matches!(r.state, NodeState::Draining | NodeState::Cordoning));
    let (progress, evictions, skipped, blocked) = if let (true, Some(plan)) = (draining, &plan) {
        let pdbs = pdbs();
        let step = drain::sequence(plan, pods(), &pdbs);
        (
            Some(step.progress),
            step.evict,
            plan.reportable_skips(),
            step.blocked,
        )
    } else {
        (None, vec![], vec![], vec![])
    };
    let upgrading = [live, persisted.as_ref()]
        .into_iter()
        .flatten()
        .any(|r| r.state == NodeState::Upgrading);
    let label = |k: &str| node::label(node, k);
    let installer_state = installer_state(installer, p.template_hash);
    let installer_failure = installer
        .and_then(|i| installer_failure(n, i))
        .map(|f| explain_busy(p, n, f));
    let installer_created = installer.and_then(installer::created);
    let prepared = prepared(
        p,
        node,
        &installer_state,
        &installer_failure,
        installer_created,
    );
    let obs = Observation {
        gates_closed: p.gates.iter().all(|g| label(g) == Some("false")),
        gates_present: p.gates.iter().any(|g| label(g).is_some()),
        drain: progress,
        drain_blocked: blocked,
        retry_token: node::retry_token(node).map(String::from),
        installer_problem: installer.and_then(installer::problem),
        inherited_cordon,
        handed_over_stood_down: handed_over_stood_down(node, policy_name),
        rollback_verdict: node::annotation(node, labels::ROLLBACK_VERDICT)
            .and_then(|v| v.parse().ok()),
        nothing_loaded: node::reported_nothing_loaded(node),
        rebooted_unreported: node::driver_labels_stale(node),
        installer_created,
        held_by: crate::claim::firmware_cycle(node),
        firmware_version: node::label(node, ttdrv_api::firmware::labels::FW_VERSION)
            .map(String::from),
        firmware_first: crate::claim::firmware_first(node),
        device_pods_crash_looping: pods()
            .filter(|p| p.device && !p.installer && p.crash_looping && p.validation.is_none())
            .map(|p| format!("{}/{}", p.pod.namespace, p.pod.name))
            .collect(),
        // This cycle's validation pod (an earlier cycle's never counts).
        validation_pod: rec.and_then(|r| r.started).and_then(|cycle| {
            pods().find_map(|p| {
                let run = p.validation.as_deref()?;
                (run.cycle == cycle && run.policy == policy_name && !p.deleting).then(|| {
                    crate::machine::ValidationPod {
                        pod: format!("{}/{}", p.pod.namespace, p.pod.name),
                        created: run.created,
                        outcome: run.outcome.clone(),
                    }
                })
            })
        }),
        // Cheap (the node's pods, in memory): read while the node has not
        // started its cycle, so its Pending and Cordoning messages say it.
        ungated_holders: rec
            .is_none_or(|r| r.state == NodeState::Pending)
            .then(|| {
                device_holders::summary(&device_holders::ungated_holders(
                    n.pods,
                    p.daemon_sets,
                    p.gates,
                    p.drain_exempt,
                ))
            })
            .flatten(),
        surface: surface_if_read(p, n, starting || upgrading),
        ..node_observation(p, node, installer_state, installer_failure, prepared)
    };
    // A cordon of ours on a node still waiting in Pending (adopted from
    // the Go operator or another policy, or kept across a retry) puts it
    // out of service all the same: it counts, and goes first.
    // A firmware cycle has the node out of service even without a cordon
    // (a flash with drain disabled): it counts against maxUnavailable.
    let unavailable_because = node::out_of_service_because(
        node,
        rec.is_some_and(|r| r.cordoned_by_us() && r.state != NodeState::Pending),
    )
    .or_else(|| obs.held_by.as_ref().map(|h| format!("held by {h}")));
    let waits_on_firmware = crate::machine::firmware_too_old(&obs, p.desired).is_some()
        || (rec.is_none_or(|r| r.state == NodeState::Pending)
            && crate::machine::defers_to_firmware(
                rec.is_some_and(NodeRecord::cordoned_by_us),
                &obs,
                p.desired,
            )
            .is_some());
    NodeView {
        obs,
        persisted,
        evictions,
        installer_pod: installer.map(PodRef::of),
        skipped,
        has_device_pods: plan.as_ref().map_or_else(
            || pods().any(|p| p.device && !p.passthrough_only(&vfio)),
            drain::DrainPlan::has_device_users,
        ),
        externally_unavailable: unavailable_because.is_some(),
        unavailable_because,
        waits_on_firmware,
    }
}

/// The node's scheduling surface where the machine reads it (`read`: a
/// start remembers the stack it stands down, an Upgrading node checks the
/// surface); elsewhere empty, so a settled fleet's pass does not pay for it
/// per node.
fn surface_if_read(p: &PolicyFacts<'_>, n: &NodeFacts<'_>, read: bool) -> crate::surface::Surface {
    if !read {
        return crate::surface::Surface::default();
    }
    crate::node::surface(
        p.surface,
        n.node,
        n.pods,
        n.dra_devices,
        crate::surface::stack_pods(n.pods, p.daemon_sets, p.gates),
    )
}

/// What a node's cordon and drain would meet if it started now: the drain's
/// plan over both passes and what would block it ([`drain::blockers`]), from
/// the same facts [`observe`] reads. For `kubectl tt driver plan`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Forecast {
    pub plan: drain::DrainPlan,
    pub blockers: Vec<drain::Blocker>,
    /// DaemonSet pods that will still hold the device after the gates and
    /// the drain ([`device_holders::ungated_holders`]).
    pub ungated: Vec<device_holders::UngatedHolder>,
}

pub fn forecast(p: &PolicyFacts<'_>, n: &NodeFacts<'_>, pdbs: &[&PodDisruptionBudget]) -> Forecast {
    let Some(selector) = p.selector else {
        return Forecast::default();
    };
    let vfio = node::vfio_resources(n.node);
    let plan = drain::plan_drain(
        n.pods.iter().copied(),
        p.drain,
        selector,
        p.drain_exempt,
        &vfio,
    );
    let blockers = drain::blockers(&plan, n.pods, pdbs, p.drain, p.daemon_sets, p.gates);
    let ungated = device_holders::ungated_holders(n.pods, p.daemon_sets, p.gates, p.drain_exempt);
    Forecast {
        plan,
        blockers,
        ungated,
    }
}

/// A `DeviceBusy` refusal whose holders are DaemonSet pods of the node says
/// which DaemonSets, and the gate each lacks ([`device_holders::explain_busy`]).
fn explain_busy(
    p: &PolicyFacts<'_>,
    n: &NodeFacts<'_>,
    mut f: installer::Failure,
) -> installer::Failure {
    if f.reason == crate::reason::DEVICE_BUSY
        && let Some(note) = device_holders::explain_busy(&f.message, n.pods, p.daemon_sets, p.gates)
    {
        f.message = format!("{} ({note})", f.message);
    }
    f
}

/// Whether `node`, which `policy` no longer owns, is still out of service
/// because of it: its record of `policy` there holds a slot, or its cordon is
/// still on. Until its release lands it counts against the policy's budget.
pub fn held_by(policy: &str, node: &Node) -> bool {
    let Ok(Some(rec)) = node::record(node) else {
        return false;
    };
    rec.policy == policy
        && (rec.occupies_slot() || (rec.cordoned_by_us() && node::unschedulable(node)))
}

/// The rollout facts of a node `policy` no longer owns: a cycle of ours while
/// [`held_by`] it, else nothing (a changed stray the budget must forget).
pub fn stray_candidate(policy: &str, node: &Node) -> Candidate {
    let held = held_by(policy, node);
    Candidate {
        name: node.metadata.name.clone().unwrap_or_default(),
        wants_slot: false,
        in_progress: held,
        ready: node::ready(node),
        unavailable: held,
        // Ours: never named as someone else's.
        unavailable_because: None,
        failed: false,
        has_device_pods: false,
        prepared: true,
    }
}

/// The node's build-ahead facts (no drain plan), cheap enough to read for
/// every owned node in a pass, with its place in the rollout's order (nodes
/// without device users first). `None` when it has nothing to build ahead.
pub fn prepare_candidate(
    p: &PolicyFacts<'_>,
    n: &NodeFacts<'_>,
) -> Option<((bool, String), prepare::Candidate)> {
    let node = n.node;
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let policy_name = p.desired.policy.as_str();
    let installer = installer_of(p, n.installers);
    let state = installer_state(installer, p.template_hash);
    let failure = installer.and_then(|i| installer_failure(n, i));
    let prepared = prepared(
        p,
        node,
        &state,
        &failure,
        installer.and_then(installer::created),
    );
    let obs = node_observation(p, node, state, failure, prepared);
    let rec = n.live.or(n.on_node.filter(|r| r.policy == policy_name));
    let state = rec.map_or(NodeState::Pending, |r| r.state);
    let c = prepare::candidate(name, &obs, state, p.desired.target())?;
    let vfio = node::vfio_resources(node);
    let device = n
        .pods
        .iter()
        .any(|p| p.device && !p.passthrough_only(&vfio));
    Some(((device, name.to_string()), c))
}

/// What the node and its installer pod alone say (`installer`, its failure,
/// `prepared`); the rest as for a node with nothing else known: no drain
/// plan, gates, retry token, slot, installer problem, inherited cordon or
/// prepare turn. [`observe`] fills in the rest for the machine.
fn node_observation(
    p: &PolicyFacts<'_>,
    node: &Node,
    installer: InstallerPod,
    installer_failure: Option<installer::Failure>,
    prepared: bool,
) -> Observation {
    Observation {
        now: p.now,
        node: node.metadata.name.clone().unwrap_or_default(),
        ready: node::ready(node),
        unschedulable: node::unschedulable(node),
        loaded: node::loaded_version(node).map(String::from),
        parameters: node::loaded_parameters(node),
        host_managed: node::host_managed(node),
        passthrough: node::passthrough(node),
        installer,
        installer_failure,
        vacated: node::label(node, labels::UNMANAGED) == Some(p.desired.policy.as_str()),
        prepared,
        ..Observation::default()
    }
}

/// The policy's installer pod among the node's installer pods.
pub fn installer_of<'p>(p: &PolicyFacts<'_>, installers: &[&'p Pod]) -> Option<&'p Pod> {
    installers.iter().copied().find(|pod| {
        pod.metadata.namespace.as_deref() == Some(p.namespace)
            && pod
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(labels::CLAIM))
                .map(String::as_str)
                == Some(p.desired.policy.as_str())
    })
}

/// Whether the node may start its cycle as far as build-ahead goes. A current
/// installer that neither prepared nor failed within the deadline (an agent
/// from before build-ahead) holds nothing back.
fn prepared(
    p: &PolicyFacts<'_>,
    node: &Node,
    installer: &InstallerPod,
    failure: &Option<installer::Failure>,
    created: Option<i64>,
) -> bool {
    let overdue = matches!(installer, InstallerPod::Current { .. })
        && failure.is_none()
        && created.is_some_and(|c| p.now - c > p.prepare_deadline_seconds);
    prepare::gate(p.desired.prepare, node, p.desired.target(), overdue) == prepare::Gate::Start
}

/// What the installer pod is to the current template (`hash`, empty when not
/// known yet: then no pod is current).
pub fn installer_state(pod: Option<&Pod>, hash: &str) -> InstallerPod {
    let Some(p) = pod else {
        return InstallerPod::Missing;
    };
    let pod_hash = p
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(labels::TEMPLATE_HASH))
        .map(String::as_str);
    if pod_hash == Some(hash) && !hash.is_empty() {
        InstallerPod::Current {
            ready: p.metadata.deletion_timestamp.is_none() && node::pod_ready(p),
        }
    } else {
        InstallerPod::Stale {
            deleting: p.metadata.deletion_timestamp.is_some(),
        }
    }
}

/// The facts of a Node as stored by the API server (a patch's reply) laid
/// over an observation: what a NodeActor steps on again before the cache
/// shows its own write.
pub fn restate(mut obs: Observation, node: &Node, gates: &[String]) -> Observation {
    let label = |k: &str| node::label(node, k);
    obs.unschedulable = node::unschedulable(node);
    obs.gates_closed = gates.iter().all(|g| label(g) == Some("false"));
    obs.gates_present = gates.iter().any(|g| label(g).is_some());
    obs.loaded = node::loaded_version(node).map(String::from);
    obs.parameters = node::loaded_parameters(node);
    obs.host_managed = node::host_managed(node);
    obs.passthrough = node::passthrough(node);
    obs.nothing_loaded = node::reported_nothing_loaded(node);
    obs.rebooted_unreported = node::driver_labels_stale(node);
    obs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::Cordon;

    fn with_record(policy: &str, state: NodeState, cordon: Cordon, cordoned: bool) -> Node {
        let mut n = crate::fixtures::node("n1", "True", cordoned, &[]);
        let mut rec = NodeRecord::new(policy, "2.8.0", 1);
        rec.state = state;
        rec.cordon = cordon;
        let json = serde_json::to_string(&rec).expect("record");
        n.metadata.annotations = Some([(labels::UPGRADE_STATE.to_string(), json)].into());
        n
    }

    #[test]
    fn a_stray_holds_a_slot_while_our_cycle_or_our_cordon_is_on_it() {
        use NodeState::*;
        let cases = [
            (with_record("fleet", Draining, Cordon::Ours, true), true),
            (with_record("fleet", Upgrading, Cordon::None, false), true),
            (with_record("fleet", Failed, Cordon::Ours, true), true),
            // Failed, our cordon already undone: nothing of ours left.
            (with_record("fleet", Failed, Cordon::Ours, false), false),
            // Someone else's cordon is not ours to count.
            (with_record("fleet", Failed, Cordon::Theirs, true), false),
            (with_record("fleet", Done, Cordon::None, false), false),
            (with_record("other", Draining, Cordon::Ours, true), false),
            (crate::fixtures::node("n1", "True", true, &[]), false),
        ];
        for (i, (node, held)) in cases.iter().enumerate() {
            assert_eq!(held_by("fleet", node), *held, "case {i}");
            let c = stray_candidate("fleet", node);
            assert_eq!(
                (c.in_progress, c.unavailable, c.wants_slot),
                (*held, *held, false)
            );
        }
    }
}
