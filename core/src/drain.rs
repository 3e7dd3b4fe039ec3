//! Which pods a node's drain evicts, and which it must leave alone. Pure: the
//! Evictor carries the plan out, `kubectl tt driver plan` prints it.
//!
//! Pass 1 ("device"): pods that use the Tenstorrent device — a hostPath under
//! /dev/tenstorrent, a `tenstorrent.com/*` extended resource, or a DRA claim.
//! Pass 2 ("full", when `drain.fullNode`): every other pod, limited by
//! `podSelectorLabel`. Both passes skip DaemonSet and mirror pods (they would come
//! straight back; sibling DaemonSets are stopped by the deploy gates instead) and
//! finished pods; bare pods only with `force`; pass 2 skips emptyDir pods unless
//! `deleteEmptyDir`.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Pod, PodSpec};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use ttdrv_api::labels;
use ttdrv_api::{DrainPolicy, PodSelector};

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for PodRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl PodRef {
    pub fn of(pod: &Pod) -> Self {
        Self {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
        }
    }

    /// A DaemonSet's `namespace/name` (the key of [`DaemonSets`]).
    pub fn of_daemon_set(ds: &DaemonSet) -> Self {
        Self {
            namespace: ds.metadata.namespace.clone().unwrap_or_default(),
            name: ds.metadata.name.clone().unwrap_or_default(),
        }
    }
}

/// Who controls a pod, as far as the drain cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Controller {
    /// No controller owner reference: a bare pod.
    None,
    DaemonSet,
    /// A ReplicaSet, StatefulSet, Job, ...: evicted, it comes back elsewhere.
    Other,
}

/// What the drain and the rollout read of a pod, kept instead of the Pod: a
/// few hundred bytes where the cached Pod object cost kilobytes (the
/// controller caches one per pod of the cluster).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodFacts {
    pub pod: PodRef,
    /// Sorted by key: matched by `podSelectorLabel` and PDB selectors. A boxed
    /// slice, not a map: a map's smallest node is ~0.5 KiB.
    pub labels: Box<[(String, String)]>,
    pub controller: Controller,
    /// Uses the Tenstorrent device ([`uses_device`]).
    pub device: bool,
    /// Uses it through /dev/tenstorrent or a DRA claim, not only through
    /// extended resources.
    pub device_direct: bool,
    /// The `tenstorrent.com/*` extended resources it asks for, sorted.
    pub resources: Box<[String]>,
    pub empty_dir: bool,
    /// A static pod's mirror.
    pub mirror: bool,
    /// Succeeded or Failed.
    pub finished: bool,
    /// Has a deletion timestamp.
    pub deleting: bool,
    /// One of our installer pods (label `driver.tenstorrent.com/policy`).
    pub installer: bool,
    /// The DaemonSet that controls it (its namespace is the pod's): whether
    /// a deploy gate stands it down is read from that DaemonSet's template
    /// ([`DaemonSetFacts`]), not from the pod, whose required node affinity
    /// the DaemonSet controller replaces with its node's name.
    pub daemon_set: Option<Box<str>>,
    /// The pod's UID: the agent names a holder by it when it cannot name
    /// the pod.
    pub uid: Box<str>,
    /// A container of it waits in CrashLoopBackOff.
    pub crash_looping: bool,
    /// A DaemonSet's pod: when it was created, and since when it is Ready
    /// (None: not Ready), Unix seconds: what the scheduling-surface check
    /// reads of a device publisher ([`crate::surface`]). None for every
    /// other pod, so no readiness flip of a workload costs a pass.
    pub daemon_run: Option<(i64, Option<i64>)>,
    /// A validation pod of ours (label [`labels::VALIDATION_CYCLE`]): its
    /// run. Boxed: absent on every other pod of the cluster.
    pub validation: Option<Box<ValidationRun>>,
}

/// A validation pod's run (`upgradePolicy.validation.podTemplateName`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidationRun {
    /// The cycle it checks (its label).
    pub cycle: i64,
    /// The policy that runs it.
    pub policy: String,
    /// Created at (Unix seconds).
    pub created: i64,
    pub outcome: RunOutcome,
}

/// How far a validation pod got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunOutcome {
    Running,
    Succeeded,
    /// Failed, with what its containers said (reason, exit code, message).
    Failed(String),
}

impl ValidationRun {
    fn of(pod: &Pod) -> Option<Self> {
        let labels = pod.metadata.labels.as_ref()?;
        let cycle = labels.get(labels::VALIDATION_CYCLE)?.parse().ok()?;
        let policy = labels.get(labels::VALIDATION_POLICY)?.clone();
        let status = pod.status.as_ref();
        let outcome = match status.and_then(|s| s.phase.as_deref()) {
            Some("Succeeded") => RunOutcome::Succeeded,
            Some("Failed") => {
                let said: Vec<String> = status
                    .and_then(|s| s.container_statuses.as_ref())
                    .into_iter()
                    .flatten()
                    .filter_map(|c| {
                        let t = c.state.as_ref()?.terminated.as_ref()?;
                        Some(format!(
                            "{}: exit code {}{}{}",
                            c.name,
                            t.exit_code,
                            t.reason
                                .as_deref()
                                .map(|r| format!(", {r}"))
                                .unwrap_or_default(),
                            t.message
                                .as_deref()
                                .map(|m| format!(": {}", m.trim()))
                                .unwrap_or_default()
                        ))
                    })
                    .collect();
                let why = status
                    .and_then(|s| s.message.clone().or_else(|| s.reason.clone()))
                    .into_iter()
                    .chain(said)
                    .collect::<Vec<_>>()
                    .join("; ");
                RunOutcome::Failed(if why.is_empty() {
                    "phase Failed".into()
                } else {
                    why
                })
            }
            _ => RunOutcome::Running,
        };
        Some(Self {
            cycle,
            policy,
            created: pod
                .metadata
                .creation_timestamp
                .as_ref()
                .map_or(0, |t| t.0.as_second()),
            outcome,
        })
    }
}

impl PodFacts {
    pub fn of(pod: &Pod) -> Self {
        let labels: Box<[(String, String)]> = pod
            .metadata
            .labels
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let owner = pod
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true));
        let controller = owner.map_or(Controller::None, |o| {
            if o.kind == "DaemonSet" {
                Controller::DaemonSet
            } else {
                Controller::Other
            }
        });
        let daemon_set = owner
            .filter(|o| o.kind == "DaemonSet")
            .map(|o| o.name.clone().into_boxed_str());
        let use_ = device_use(pod);
        let daemon_run = daemon_set.as_ref().map(|_| {
            let created = pod
                .metadata
                .creation_timestamp
                .as_ref()
                .map_or(0, |t| t.0.as_second());
            let ready_since = pod
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready" && c.status == "True"))
                .map(|c| {
                    c.last_transition_time
                        .as_ref()
                        .map_or(created, |t| t.0.as_second())
                });
            (created, ready_since)
        });
        Self {
            pod: PodRef::of(pod),
            installer: labels.iter().any(|(k, _)| k == labels::CLAIM),
            labels,
            controller,
            device: use_.direct || !use_.resources.is_empty(),
            device_direct: use_.direct,
            resources: use_.resources.into_boxed_slice(),
            empty_dir: pod
                .spec
                .as_ref()
                .is_some_and(|s| s.volumes.iter().flatten().any(|v| v.empty_dir.is_some())),
            mirror: pod
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror")),
            finished: matches!(
                pod.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded") | Some("Failed")
            ),
            deleting: pod.metadata.deletion_timestamp.is_some(),
            validation: ValidationRun::of(pod).map(Box::new),
            daemon_set,
            uid: pod
                .metadata
                .uid
                .clone()
                .unwrap_or_default()
                .into_boxed_str(),
            daemon_run,
            crash_looping: pod
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .into_iter()
                .flatten()
                .any(|c| {
                    c.state
                        .as_ref()
                        .and_then(|s| s.waiting.as_ref())
                        .and_then(|w| w.reason.as_deref())
                        == Some("CrashLoopBackOff")
                }),
        }
    }

    /// Runs on the node's passthrough functions only (a VM): every device
    /// resource it asks for is one of `vfio_resources` (the binder's, on its
    /// node), and it opens nothing of tt-kmd's directly.
    pub fn passthrough_only(&self, vfio_resources: &[String]) -> bool {
        !self.device_direct
            && !self.resources.is_empty()
            && self.resources.iter().all(|r| vfio_resources.contains(r))
    }

    /// The labels as selectors read them.
    pub fn label_map(&self) -> BTreeMap<String, String> {
        self.labels.iter().cloned().collect()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrainPass {
    Device,
    Full,
}

impl DrainPass {
    pub fn as_str(self) -> &'static str {
        match self {
            DrainPass::Device => "device",
            DrainPass::Full => "full",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SkipReason {
    DaemonSet,
    Mirror,
    Finished,
    /// No controller and `force` is off.
    Bare,
    /// Has emptyDir volumes and `deleteEmptyDir` is off.
    EmptyDir,
    /// Does not match `podSelectorLabel`.
    NotSelected,
    /// `fullNode` is off and the pod does not use the device.
    FullNodeOff,
    /// In a namespace drains leave alone: by default the operator's own (the
    /// controller among its pods), as the Go operator's drain did. Evicting
    /// the controller from the node it drains would stall the rollout on a
    /// one-node cluster, where its replacement cannot schedule on the
    /// cordoned node.
    ExemptNamespace,
    /// Runs on vfio-pci functions only (VM passthrough): tt-kmd does not
    /// serve them, and its swap does not touch them.
    Passthrough,
}

impl SkipReason {
    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::DaemonSet => "DaemonSet pod",
            SkipReason::Mirror => "static (mirror) pod",
            SkipReason::Finished => "finished",
            SkipReason::Bare => "bare pod (no controller; set drain.force to evict)",
            SkipReason::EmptyDir => "uses emptyDir (set drain.deleteEmptyDir to evict)",
            SkipReason::NotSelected => "not matched by podSelectorLabel",
            SkipReason::FullNodeOff => "drain.fullNode is off",
            SkipReason::ExemptNamespace => {
                "its namespace is never drained (the operator's; --drain-exempt-namespaces)"
            }
            SkipReason::Passthrough => {
                "uses only vfio-pci (passthrough) functions, which tt-kmd does not serve"
            }
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct DrainPlan {
    /// Pass 1: device users to evict.
    pub device: Vec<PodRef>,
    /// Pass 2: other pods to evict.
    pub full: Vec<PodRef>,
    /// Pods the drain leaves in place, with why. Device users among them are
    /// reported loudly: the agent will refuse to unload while they run.
    pub skipped: Vec<(PodRef, SkipReason, bool)>,
}

impl DrainPlan {
    pub fn is_empty(&self) -> bool {
        self.device.is_empty() && self.full.is_empty()
    }
    /// Pods still to go, pass 1 first.
    pub fn remaining(&self) -> impl Iterator<Item = (&PodRef, DrainPass)> {
        self.device
            .iter()
            .map(|p| (p, DrainPass::Device))
            .chain(self.full.iter().map(|p| (p, DrainPass::Full)))
    }
    /// Skipped pods that hold the device (the upgrade will be refused while they run).
    pub fn skipped_device_users(&self) -> impl Iterator<Item = &PodRef> {
        self.skipped
            .iter()
            .filter(|(_, _, dev)| *dev)
            .map(|(p, _, _)| p)
    }
    /// Skipped pods worth telling the operator about: not the DaemonSet,
    /// mirror and finished pods every drain leaves, as `ns/name (why)`.
    pub fn reportable_skips(&self) -> Vec<String> {
        self.skipped
            .iter()
            .filter(|(_, why, _)| {
                !matches!(
                    why,
                    SkipReason::DaemonSet
                        | SkipReason::Finished
                        | SkipReason::Mirror
                        | SkipReason::ExemptNamespace
                )
            })
            .map(|(p, why, _)| format!("{p} ({})", why.as_str()))
            .collect()
    }

    /// Pods on the node use the device (evicted or not): such nodes go last.
    pub fn has_device_users(&self) -> bool {
        !self.device.is_empty() || self.skipped_device_users().next().is_some()
    }
}

/// The drain's progress, computed from the pods on the node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DrainProgress {
    /// Pods still to evict or still terminating, as `ns/name`.
    pub remaining: Vec<String>,
    /// `ns/name`s of PodDisruptionBudgets currently refusing those evictions.
    pub blocking_pdbs: Vec<String>,
}

/// A pod still to evict whose eviction a PodDisruptionBudget refuses now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockedEviction {
    /// `ns/name` of the pod.
    pub pod: String,
    /// `ns/name` of the budget.
    pub pdb: String,
}

/// A drain's next move on one node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DrainStep {
    pub progress: DrainProgress,
    /// Pods to evict now, pass 1 first.
    pub evict: Vec<(PodRef, DrainPass)>,
    /// Each remaining pod a budget refuses, with that budget: the node's
    /// message names both (kept apart from [`DrainProgress`], which the
    /// firmware cycle shares and builds by field).
    pub blocked: Vec<BlockedEviction>,
}

/// Sequences a drain from its plan and the pods still on the node: a planned
/// pod remains until it is gone from the node; pass 2 opens only once pass 1's
/// device users are gone; a pod already terminating is not evicted again; each
/// PodDisruptionBudget refusing a remaining pod is named once.
pub fn sequence<'a>(
    plan: &DrainPlan,
    on_node: impl IntoIterator<Item = &'a PodFacts>,
    pdbs: &[&PodDisruptionBudget],
) -> DrainStep {
    let by_ref: std::collections::HashMap<&PodRef, &PodFacts> =
        on_node.into_iter().map(|p| (&p.pod, p)).collect();
    let device_left = plan.device.iter().any(|p| by_ref.contains_key(p));
    let mut step = DrainStep::default();
    for (p, pass) in plan.remaining() {
        let Some(pod) = by_ref.get(p) else { continue };
        step.progress.remaining.push(p.to_string());
        for pdb in blocking_pdbs(pod, pdbs.iter().copied()) {
            let id = format!(
                "{}/{}",
                pdb.metadata.namespace.as_deref().unwrap_or(""),
                pdb.metadata.name.as_deref().unwrap_or("")
            );
            if !step.progress.blocking_pdbs.contains(&id) {
                step.progress.blocking_pdbs.push(id.clone());
            }
            step.blocked.push(BlockedEviction {
                pod: p.to_string(),
                pdb: id,
            });
        }
        let pass_open = pass == DrainPass::Device || !device_left;
        if !pod.deleting && pass_open {
            step.evict.push((p.clone(), pass));
        }
    }
    step
}

/// What the drain reads of a DaemonSet, kept instead of the DaemonSet (the
/// controller watches every DaemonSet of the cluster): the deploy gates its
/// pod template follows and whether its pods hold the device.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DaemonSetFacts {
    /// The label keys its template's required node affinity asks, in every
    /// term, not to be "false" (`<key> NotIn ["false"]`), sorted: labelling
    /// a node `<key>=false` makes the DaemonSet controller remove the pod.
    pub gate_keys: Box<[String]>,
    /// Its pods hold the device ([`holds_device`]): privileged or with the
    /// host's /dev on Tenstorrent nodes, or by the pod device-use rules
    /// ([`device_use`]: a hostPath under /dev/tenstorrent, a DRA claim).
    pub holds_device: bool,
}

/// DaemonSet facts by `namespace/name`.
pub type DaemonSets = std::collections::HashMap<PodRef, DaemonSetFacts>;

impl DaemonSetFacts {
    pub fn of(ds: &DaemonSet) -> Self {
        let tpl = ds.spec.as_ref().map(|s| &s.template);
        let spec = tpl.and_then(|t| t.spec.as_ref());
        Self {
            gate_keys: spec.map(gate_keys).unwrap_or_default().into_boxed_slice(),
            holds_device: spec.is_some_and(holds_device),
        }
    }
}

/// The keys every required node-affinity term of `spec` asks not to be
/// "false", sorted, once each.
pub fn gate_keys(spec: &PodSpec) -> Vec<String> {
    let terms = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|r| r.node_selector_terms.as_slice())
        .unwrap_or_default();
    let in_term = |t: &k8s_openapi::api::core::v1::NodeSelectorTerm| -> BTreeSet<String> {
        t.match_expressions
            .iter()
            .flatten()
            .filter(|e| e.operator == "NotIn" && e.values.iter().flatten().any(|v| v == "false"))
            .map(|e| e.key.clone())
            .collect()
    };
    let mut it = terms.iter().map(in_term);
    let Some(first) = it.next() else {
        return vec![];
    };
    it.fold(first, |acc, t| acc.intersection(&t).cloned().collect())
        .into_iter()
        .collect()
}

/// Pods of `spec` hold the device: by the device-use rules of
/// [`device_use`] (a hostPath under /dev/tenstorrent, a DRA claim, the
/// extended resources), or privileged or with the host's whole /dev while
/// the template runs on Tenstorrent nodes only ([`targets_tenstorrent`]):
/// the telemetry collector and the fabric-manager agent reach the device
/// that way. A privileged DaemonSet of every node (kube-proxy, the CNI, a
/// CSI node plugin) is not taken for a holder; if one does open the
/// device, the agent's own holder check refuses the swap and names it.
pub fn holds_device(spec: &PodSpec) -> bool {
    let privileged = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .any(|c| {
            c.security_context
                .as_ref()
                .and_then(|s| s.privileged)
                .unwrap_or(false)
        });
    let dev = spec.volumes.iter().flatten().any(|v| {
        v.host_path
            .as_ref()
            .is_some_and(|h| h.path.trim_end_matches('/') == "/dev")
    });
    let u = device_use_spec(spec);
    u.direct || !u.resources.is_empty() || ((privileged || dev) && targets_tenstorrent(spec))
}

/// The template selects Tenstorrent nodes: a node selector or a node
/// affinity term on a Tenstorrent label (NFD's PCI vendor label
/// [`labels::TT_PCI_PRESENT`], any `tenstorrent.com` key), or it follows a
/// Tenstorrent deploy gate.
pub fn targets_tenstorrent(spec: &PodSpec) -> bool {
    let tenstorrent = |k: &str| k.contains("tenstorrent.com") || k.contains("1e52");
    let selector = spec
        .node_selector
        .iter()
        .flatten()
        .any(|(k, _)| tenstorrent(k));
    let affinity = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref());
    let required = affinity
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|r| r.node_selector_terms.as_slice())
        .unwrap_or_default()
        .iter()
        .flat_map(|t| t.match_expressions.iter().flatten())
        .any(|e| tenstorrent(&e.key));
    selector || required
}

impl PodFacts {
    /// The DaemonSet that controls the pod, as `namespace/name`.
    pub fn daemon_set_ref(&self) -> Option<PodRef> {
        self.daemon_set.as_deref().map(|name| PodRef {
            namespace: self.pod.namespace.clone(),
            name: name.to_string(),
        })
    }
}

/// The pod's DaemonSet's facts, when it is a DaemonSet's pod the index knows.
pub fn daemon_set_of<'a>(
    pod: &PodFacts,
    daemon_sets: &'a DaemonSets,
) -> Option<&'a DaemonSetFacts> {
    daemon_sets.get(&pod.daemon_set_ref()?)
}

/// A DaemonSet pod whose DaemonSet's template follows one of the configured
/// deploy gates (`gates`): closing the gates removes it from the node.
pub fn stood_down(pod: &PodFacts, daemon_sets: &DaemonSets, gates: &[String]) -> bool {
    daemon_set_of(pod, daemon_sets).is_some_and(|d| d.gate_keys.iter().any(|k| gates.contains(k)))
}

/// What would keep a node's cycle from finishing by itself once it drains.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Blocker {
    /// The PodDisruptionBudget (`ns/name`) allows no disruption: evicting
    /// `pod` is refused, and the node fails when the drain times out.
    Pdb { pdb: String, pod: PodRef },
    /// `pod` uses the device and the drain leaves it in place: the swap
    /// waits for it until the upgrade timeout.
    DeviceUserLeft { pod: PodRef },
    /// The drain is off (`drain.enable: false`) and `pod` uses the device.
    DrainOff { pod: PodRef },
}

impl Blocker {
    /// The blocker as `kubectl tt driver plan` prints it.
    pub fn describe(&self, drain: &DrainPolicy) -> String {
        match self {
            Blocker::Pdb { pdb, pod } => format!(
                "PodDisruptionBudget {pdb} allows no disruption: evicting {pod} is refused, so the node \
                 fails when the drain times out ({}s)",
                drain.timeout_seconds
            ),
            Blocker::DeviceUserLeft { pod } => format!(
                "{pod} uses the device and the drain leaves it in place: the module swap \
                 waits for it and the node fails at the upgrade timeout"
            ),
            Blocker::DrainOff { pod } => {
                format!("drain is disabled and {pod} uses the device: the module swap waits for it")
            }
        }
    }
}

/// The blockers of a node's cycle from its drain plan and pods, as the
/// controller's drain would meet them: each PDB that [`sequence`] names for
/// a pod still to evict; device users the drain leaves (but not finished pods
/// or DaemonSet pods that follow a configured deploy gate, which the gates
/// remove). A DaemonSet pod holds the device when its DaemonSet's template
/// does ([`DaemonSetFacts::holds_device`]: privileged, say).
pub fn blockers(
    plan: &DrainPlan,
    pods: &[&PodFacts],
    pdbs: &[&PodDisruptionBudget],
    drain: &DrainPolicy,
    daemon_sets: &DaemonSets,
    gates: &[String],
) -> Vec<Blocker> {
    if !drain.enable {
        let passthrough = |f: &PodFacts| {
            plan.skipped
                .iter()
                .any(|(r, why, _)| *why == SkipReason::Passthrough && *r == f.pod)
        };
        return pods
            .iter()
            .filter(|f| f.device && !f.installer && !passthrough(f))
            .map(|f| Blocker::DrainOff { pod: f.pod.clone() })
            .collect();
    }
    let by_ref: std::collections::HashMap<&PodRef, &PodFacts> =
        pods.iter().map(|f| (&f.pod, *f)).collect();
    let mut out = vec![];
    for (r, _) in plan.remaining() {
        let Some(pod) = by_ref.get(r) else { continue };
        for pdb in sequence(plan, [*pod], pdbs).progress.blocking_pdbs {
            out.push(Blocker::Pdb {
                pdb,
                pod: r.clone(),
            });
        }
    }
    for (r, why, device) in &plan.skipped {
        let pod = by_ref.get(r);
        let daemon = *why == SkipReason::DaemonSet;
        let gated = daemon && pod.is_some_and(|p| stood_down(p, daemon_sets, gates));
        let holds = daemon
            && pod
                .and_then(|p| daemon_set_of(p, daemon_sets))
                .is_some_and(|d| d.holds_device);
        if (*device || holds) && !gated && *why != SkipReason::Finished {
            out.push(Blocker::DeviceUserLeft { pod: r.clone() });
        }
    }
    out
}

/// True when the pod uses the Tenstorrent device.
pub fn uses_device(pod: &Pod) -> bool {
    let u = device_use(pod);
    u.direct || !u.resources.is_empty()
}

/// How a pod uses the Tenstorrent device.
#[derive(Debug, Default)]
pub struct DeviceUse {
    /// A hostPath under /dev/tenstorrent, or a DRA claim.
    pub direct: bool,
    /// `tenstorrent.com/*` extended resources, sorted, once each.
    pub resources: Vec<String>,
}

pub fn device_use(pod: &Pod) -> DeviceUse {
    pod.spec.as_ref().map(device_use_spec).unwrap_or_default()
}

/// [`device_use`] of a pod spec (a pod's, or a DaemonSet's template's).
pub fn device_use_spec(spec: &PodSpec) -> DeviceUse {
    let host_path = spec.volumes.iter().flatten().any(|v| {
        v.host_path
            .as_ref()
            .is_some_and(|h| h.path.trim_end_matches('/').starts_with(labels::DEVICE_DIR))
    });
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    let resources: std::collections::BTreeSet<&String> = containers
        .filter_map(|c| c.resources.as_ref())
        .flat_map(|r| r.limits.iter().chain(r.requests.iter()).flatten())
        .map(|(k, _)| k)
        .filter(|k| k.starts_with(labels::RESOURCE_PREFIX))
        .collect();
    let dra = spec.resource_claims.as_ref().is_some_and(|c| !c.is_empty());
    DeviceUse {
        direct: host_path || dra,
        resources: resources.into_iter().cloned().collect(),
    }
}

/// Plans the drain of one node from the pods bound to it. Our own installer pods
/// (label `driver.tenstorrent.com/policy`) are never part of a drain, no
/// pod of an `exempt` namespace is evicted by either pass, and neither is a
/// pod that runs only on the node's passthrough functions (`vfio_resources`,
/// [`crate::node::vfio_resources`]): the swap does not touch them.
pub fn plan_drain<'a>(
    pods: impl IntoIterator<Item = &'a PodFacts>,
    drain: &DrainPolicy,
    selector: &PodSelector,
    exempt: &[String],
    vfio_resources: &[String],
) -> DrainPlan {
    let mut plan = DrainPlan::default();
    let mut sorted: Vec<&PodFacts> = pods.into_iter().filter(|p| !p.installer).collect();
    sorted.sort_by(|a, b| a.pod.cmp(&b.pod));
    for pod in sorted {
        let r = pod.pod.clone();
        let passthrough = pod.passthrough_only(vfio_resources);
        let device = pod.device && !passthrough;
        let skip = |plan: &mut DrainPlan, why| plan.skipped.push((r.clone(), why, device));
        if pod.finished {
            skip(&mut plan, SkipReason::Finished);
        } else if passthrough {
            skip(&mut plan, SkipReason::Passthrough);
        } else if exempt.contains(&r.namespace) {
            skip(&mut plan, SkipReason::ExemptNamespace);
        } else if pod.mirror {
            skip(&mut plan, SkipReason::Mirror);
        } else if pod.controller == Controller::DaemonSet {
            skip(&mut plan, SkipReason::DaemonSet);
        } else if pod.controller == Controller::None && !drain.force {
            skip(&mut plan, SkipReason::Bare);
        } else if device {
            plan.device.push(r);
        } else if !drain.full_node {
            skip(&mut plan, SkipReason::FullNodeOff);
        } else if !selector.matches(&pod.label_map()) {
            skip(&mut plan, SkipReason::NotSelected);
        } else if pod.empty_dir && !drain.delete_empty_dir {
            skip(&mut plan, SkipReason::EmptyDir);
        } else {
            plan.full.push(r);
        }
    }
    plan
}

/// PodDisruptionBudgets that currently forbid evicting `pod`.
pub fn blocking_pdbs<'a>(
    pod: &PodFacts,
    pdbs: impl IntoIterator<Item = &'a PodDisruptionBudget>,
) -> Vec<&'a PodDisruptionBudget> {
    let ns = Some(pod.pod.namespace.as_str());
    let pod_labels = pod.label_map();
    pdbs.into_iter()
        .filter(|pdb| pdb.metadata.namespace.as_deref() == ns)
        .filter(|pdb| {
            pdb.status
                .as_ref()
                .is_some_and(|s| s.disruptions_allowed < 1)
        })
        .filter(|pdb| {
            let Some(sel) = pdb.spec.as_ref().and_then(|s| s.selector.as_ref()) else {
                return false;
            };
            let term = ttdrv_api::NodeSelectorTerm {
                match_labels: sel.match_labels.clone(),
                match_expressions: sel.match_expressions.as_ref().map(|es| {
                    es.iter()
                        .filter_map(|e| {
                            let operator = match e.operator.as_str() {
                                "In" => ttdrv_api::SelectorOperator::In,
                                "NotIn" => ttdrv_api::SelectorOperator::NotIn,
                                "Exists" => ttdrv_api::SelectorOperator::Exists,
                                "DoesNotExist" => ttdrv_api::SelectorOperator::DoesNotExist,
                                _ => return None,
                            };
                            Some(ttdrv_api::SelectorRequirement {
                                key: e.key.clone(),
                                operator,
                                values: e.values.clone(),
                            })
                        })
                        .collect()
                }),
            };
            // An empty selector in policy/v1 matches every pod of the namespace.
            term.matches(&pod_labels)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        Container, EmptyDirVolumeSource, HostPathVolumeSource, PodSpec, PodStatus,
        ResourceRequirements, Volume,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
    use std::collections::BTreeMap;

    #[derive(Default)]
    struct P {
        name: &'static str,
        owner: Option<&'static str>,
        host_dev: bool,
        resource: bool,
        empty_dir: bool,
        labels: &'static [(&'static str, &'static str)],
        phase: Option<&'static str>,
        installer: bool,
    }

    fn pod(p: P) -> Pod {
        let mut labels: BTreeMap<String, String> = p
            .labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        if p.installer {
            labels.insert(labels::CLAIM.into(), "fleet".into());
        }
        let mut volumes = vec![];
        if p.host_dev {
            volumes.push(Volume {
                name: "dev".into(),
                host_path: Some(HostPathVolumeSource {
                    path: "/dev/tenstorrent".into(),
                    type_: None,
                }),
                ..Default::default()
            });
        }
        if p.empty_dir {
            volumes.push(Volume {
                name: "scratch".into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Default::default()
            });
        }
        let resources = p.resource.then(|| ResourceRequirements {
            limits: Some(BTreeMap::from([(
                "tenstorrent.com/n150".into(),
                Quantity("1".into()),
            )])),
            ..Default::default()
        });
        Pod {
            metadata: ObjectMeta {
                name: Some(p.name.into()),
                namespace: Some("ml".into()),
                labels: Some(labels),
                owner_references: p.owner.map(|kind| {
                    vec![OwnerReference {
                        kind: kind.into(),
                        name: "o".into(),
                        controller: Some(true),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "c".into(),
                    resources,
                    ..Default::default()
                }],
                volumes: Some(volumes),
                ..Default::default()
            }),
            status: p.phase.map(|ph| PodStatus {
                phase: Some(ph.into()),
                ..Default::default()
            }),
        }
    }

    fn names(v: &[PodRef]) -> Vec<&str> {
        v.iter().map(|p| p.name.as_str()).collect()
    }

    fn fixture() -> Vec<PodFacts> {
        [
            pod(P {
                name: "train",
                owner: Some("ReplicaSet"),
                host_dev: true,
                ..Default::default()
            }),
            pod(P {
                name: "infer",
                owner: Some("ReplicaSet"),
                resource: true,
                ..Default::default()
            }),
            pod(P {
                name: "web",
                owner: Some("ReplicaSet"),
                labels: &[("app", "web")],
                ..Default::default()
            }),
            pod(P {
                name: "cache",
                owner: Some("StatefulSet"),
                empty_dir: true,
                ..Default::default()
            }),
            pod(P {
                name: "bare",
                ..Default::default()
            }),
            pod(P {
                name: "bare-dev",
                host_dev: true,
                ..Default::default()
            }),
            pod(P {
                name: "telemetry",
                owner: Some("DaemonSet"),
                host_dev: true,
                ..Default::default()
            }),
            pod(P {
                name: "done",
                owner: Some("Job"),
                phase: Some("Succeeded"),
                ..Default::default()
            }),
            pod(P {
                name: "ttdrv-x",
                owner: Some("DaemonSet"),
                installer: true,
                ..Default::default()
            }),
        ]
        .iter()
        .map(PodFacts::of)
        .collect()
    }

    #[test]
    fn facts_keep_what_the_drain_reads() {
        let mut p = pod(P {
            name: "web",
            owner: Some("ReplicaSet"),
            empty_dir: true,
            labels: &[("b", "2"), ("a", "1")],
            ..Default::default()
        });
        p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        let f = PodFacts::of(&p);
        assert_eq!(f.pod.to_string(), "ml/web");
        assert_eq!(
            f.labels.as_ref(),
            [("a".into(), "1".into()), ("b".into(), "2".into())]
        );
        assert_eq!(f.controller, Controller::Other);
        assert!(f.empty_dir && f.deleting && !f.device && !f.finished && !f.mirror);
        let f = PodFacts::of(&pod(P {
            name: "ttdrv-x",
            owner: Some("DaemonSet"),
            host_dev: true,
            installer: true,
            phase: Some("Failed"),
            ..Default::default()
        }));
        assert_eq!(f.controller, Controller::DaemonSet);
        assert!(f.installer && f.device && f.finished && !f.deleting);
        assert_eq!(
            PodFacts::of(&pod(P::default())).controller,
            Controller::None
        );
    }

    #[test]
    fn default_policy_evicts_device_users_first_then_the_rest() {
        let plan = plan_drain(
            &fixture(),
            &DrainPolicy::default(),
            &PodSelector::default(),
            &[],
            &[],
        );
        assert_eq!(names(&plan.device), ["infer", "train"]);
        assert_eq!(names(&plan.full), ["cache", "web"]);
        let skipped: Vec<_> = plan
            .skipped
            .iter()
            .map(|(p, r, d)| (p.name.as_str(), *r, *d))
            .collect();
        assert_eq!(
            skipped,
            [
                ("bare", SkipReason::Bare, false),
                ("bare-dev", SkipReason::Bare, true),
                ("done", SkipReason::Finished, false),
                ("telemetry", SkipReason::DaemonSet, true),
            ]
        );
        assert_eq!(
            plan.skipped_device_users()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>(),
            ["bare-dev", "telemetry"]
        );
    }

    #[test]
    fn exempt_namespaces_are_never_drained() {
        let drain = DrainPolicy {
            force: true,
            ..Default::default()
        };
        let exempting = |ns: &str| {
            plan_drain(
                &fixture(),
                &drain,
                &PodSelector::default(),
                &[ns.into()],
                &[],
            )
        };
        // The fixture's pods all run in "ml": as the operator's namespace,
        // neither pass evicts any of them, device users included.
        let plan = exempting("ml");
        assert!(plan.is_empty(), "{plan:?}");
        assert!(
            plan.skipped
                .iter()
                .all(|(_, r, _)| matches!(r, SkipReason::ExemptNamespace | SkipReason::Finished))
        );
        assert!(plan.reportable_skips().is_empty(), "not reported");
        // Another operator namespace changes nothing.
        let other = exempting("tt-system");
        assert_eq!(
            other,
            plan_drain(&fixture(), &drain, &PodSelector::default(), &[], &[])
        );
        assert_eq!(names(&other.device), ["bare-dev", "infer", "train"]);
    }

    #[test]
    fn pods_on_passthrough_functions_only_are_never_drained() {
        // A VM on the node's vfio-pci functions, a job on tt-kmd's, one on
        // both, and one that opens /dev/tenstorrent beside a vfio resource.
        let with = |name: &'static str, resources: &[&str], host_dev: bool| {
            let mut p = pod(P {
                name,
                owner: Some("ReplicaSet"),
                resource: true,
                host_dev,
                ..Default::default()
            });
            let limits = resources
                .iter()
                .map(|r| (r.to_string(), Quantity("1".into())))
                .collect();
            if let Some(spec) = p.spec.as_mut() {
                spec.containers[0].resources = Some(ResourceRequirements {
                    limits: Some(limits),
                    ..Default::default()
                });
            }
            PodFacts::of(&p)
        };
        let pods = [
            with("vm", &["tenstorrent.com/wh-vfio"], false),
            with("job", &["tenstorrent.com/n150"], false),
            with(
                "both",
                &["tenstorrent.com/n150", "tenstorrent.com/wh-vfio"],
                false,
            ),
            with("dev", &["tenstorrent.com/wh-vfio"], true),
        ];
        let vfio = ["tenstorrent.com/wh-vfio".to_string()];
        let full = DrainPolicy {
            full_node: true,
            ..Default::default()
        };
        let plan = plan_drain(&pods, &full, &PodSelector::default(), &[], &vfio);
        assert_eq!(names(&plan.device), ["both", "dev", "job"]);
        assert!(
            plan.full.is_empty(),
            "not even a full-node drain evicts the VM"
        );
        assert_eq!(
            plan.skipped,
            [(
                PodRef::of(&pod(P {
                    name: "vm",
                    ..Default::default()
                })),
                SkipReason::Passthrough,
                false
            )]
        );
        assert!(
            plan.reportable_skips()[0].contains("vfio-pci"),
            "{:?}",
            plan.reportable_skips()
        );
        // Without the binder's report on the node, the same pod is a device user.
        let plan = plan_drain(&pods, &full, &PodSelector::default(), &[], &[]);
        assert_eq!(names(&plan.device), ["both", "dev", "job", "vm"]);
        // Drain off: the VM blocks nothing.
        let off = DrainPolicy {
            enable: false,
            ..Default::default()
        };
        let plan = plan_drain(&pods, &off, &PodSelector::default(), &[], &vfio);
        let refs: Vec<&PodFacts> = pods.iter().collect();
        let blocked: Vec<String> = blockers(&plan, &refs, &[], &off, &DaemonSets::new(), &[])
            .iter()
            .map(|b| b.describe(&off))
            .collect();
        assert_eq!(blocked.len(), 3, "{blocked:?}");
        assert!(blocked.iter().all(|b| !b.contains("/vm ")), "{blocked:?}");
    }

    #[test]
    fn force_evicts_bare_pods() {
        let drain = DrainPolicy {
            force: true,
            ..Default::default()
        };
        let plan = plan_drain(&fixture(), &drain, &PodSelector::default(), &[], &[]);
        assert_eq!(names(&plan.device), ["bare-dev", "infer", "train"]);
        assert_eq!(names(&plan.full), ["bare", "cache", "web"]);
    }

    #[test]
    fn selector_limits_pass_two_only() {
        let sel = PodSelector::parse("app=web").expect("valid");
        let plan = plan_drain(&fixture(), &DrainPolicy::default(), &sel, &[], &[]);
        assert_eq!(
            names(&plan.device),
            ["infer", "train"],
            "pass 1 ignores the selector"
        );
        assert_eq!(names(&plan.full), ["web"]);
    }

    #[test]
    fn full_node_off_and_empty_dir_off() {
        let drain = DrainPolicy {
            full_node: false,
            ..Default::default()
        };
        let plan = plan_drain(&fixture(), &drain, &PodSelector::default(), &[], &[]);
        assert_eq!(names(&plan.device), ["infer", "train"]);
        assert!(plan.full.is_empty());
        let drain = DrainPolicy {
            delete_empty_dir: false,
            ..Default::default()
        };
        let plan = plan_drain(&fixture(), &drain, &PodSelector::default(), &[], &[]);
        assert_eq!(names(&plan.full), ["web"]);
        assert!(
            plan.skipped
                .iter()
                .any(|(p, r, _)| p.name == "cache" && *r == SkipReason::EmptyDir)
        );
    }

    #[test]
    fn pdb_with_no_disruptions_blocks_matching_pod() {
        use k8s_openapi::api::policy::v1::{PodDisruptionBudgetSpec, PodDisruptionBudgetStatus};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
        let pdb = |allowed: i32, app: &str| PodDisruptionBudget {
            metadata: ObjectMeta {
                name: Some(format!("pdb-{app}-{allowed}")),
                namespace: Some("ml".into()),
                ..Default::default()
            },
            spec: Some(PodDisruptionBudgetSpec {
                selector: Some(LabelSelector {
                    match_labels: Some(BTreeMap::from([("app".into(), app.into())])),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: Some(PodDisruptionBudgetStatus {
                disruptions_allowed: allowed,
                ..Default::default()
            }),
        };
        let pdbs = vec![pdb(0, "web"), pdb(1, "web"), pdb(0, "db")];
        let web = &fixture()[2];
        let blocking: Vec<_> = blocking_pdbs(web, &pdbs)
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        assert_eq!(blocking, ["pdb-web-0"]);
    }
}
