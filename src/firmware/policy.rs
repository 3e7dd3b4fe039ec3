//! The firmware policy kind: one firmware policy's pass, run by the generic
//! [`PolicyActor`] (one per policy under [`super::FirmwareManager`]), which
//! runs the passes one at a time and writes the status they build. A pass observes the nodes the policy selects
//! (and those another firmware policy owns, reported as conflicts), plans the
//! `maxParallel` budget, hands each node its observation and slot to the
//! node's [`NodeActor`], and builds the policy's status.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use ttdrv_api::PodSelector;
use ttdrv_api::firmware::{
    FirmwareNodeState, FirmwareNodeStatus, TenstorrentFirmwarePolicy,
    TenstorrentFirmwarePolicyStatus, job_name_for, reason,
};
use ttdrv_core::firmware::job::state as job_state;
use ttdrv_core::firmware::observe::{Selected, drain_policy, observe, record_of, selects};
use ttdrv_core::firmware::{Desired, FwRecord, takeover};
use ttdrv_core::rollout::{Candidate, Limits, plan};

use super::clock::now_secs;
use super::node::{NodeActor, StepNode};
use super::seen::Seen;
use super::shared::Shared;
use super::status::{candidate, conditions, is_conflict, node_status, summary};
use crate::runtime::claims::Budget;
use crate::runtime::context::Context;
use crate::runtime::policy_actor::{self, PassEnd, PolicyActor, PolicyKind, StatusOut};
use crate::runtime::write_backoff::WriteTarget;

/// What a firmware policy's passes remember between them, besides what
/// every kind's do (node actors, the grant set, the status last written).
#[derive(Default)]
pub(crate) struct FwMemory {
    /// Node → the record last written: fresher than the cache.
    live: HashMap<String, FwRecord>,
}

type Memory = policy_actor::Memory<FirmwareKind>;

/// The firmware policy kind, as the generic [`PolicyActor`] runs it.
pub(crate) struct FirmwareKind {
    pub(crate) shared: Arc<Shared>,
}

/// One firmware policy's actor.
pub(crate) type FwPolicyActor = PolicyActor<FirmwareKind>;

impl PolicyKind for FirmwareKind {
    const ACTOR: &'static str = "firmware_policy";
    const KIND: &'static str = "firmware";
    const STATUS_IN_BACKGROUND: bool = false;
    type Trigger = ();
    type Memory = FwMemory;
    type Status = TenstorrentFirmwarePolicyStatus;
    type WriteNote = ();
    type Node = NodeActor;

    fn context(&self) -> &Arc<Context> {
        &self.shared.ctx
    }

    fn merge(_: &mut (), _: ()) {}

    fn pass(
        self: Arc<Self>,
        name: String,
        _: (),
        mut memory: Memory,
    ) -> impl Future<Output = PassEnd<Self>> + 'static {
        let policy = self.shared.stores.policies.get(&ObjectRef::new(&name));
        async move {
            let status = match policy.filter(|p| p.metadata.deletion_timestamp.is_none()) {
                Some(p) => Some(pass(&self.shared, p, &mut memory).await),
                None => None,
            };
            PassEnd {
                memory,
                status,
                result: Ok(()),
            }
        }
    }

    fn status_target(name: &str) -> WriteTarget {
        WriteTarget::FirmwarePolicyStatus(name.to_string())
    }

    fn write_status(
        self: Arc<Self>,
        name: String,
        status: &Self::Status,
        _: &(),
    ) -> impl Future<Output = crate::Result<()>> + 'static {
        let api: Api<TenstorrentFirmwarePolicy> = Api::all(self.shared.ctx.client.clone());
        let patch = serde_json::json!({ "status": status });
        async move {
            api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(|_| ())
                .map_err(crate::Error::kube(format!(
                    "writing the status of firmware policy {name}"
                )))
        }
    }

    fn count_status_error(&self, name: &str) {
        self.shared.ctx.metrics.inc_fw_error(name, "status");
    }
}

async fn pass(
    shared: &Shared,
    p: Arc<TenstorrentFirmwarePolicy>,
    memory: &mut Memory,
) -> StatusOut<FirmwareKind> {
    let ctx = &shared.ctx;
    let name = p.metadata.name.clone().unwrap_or_default();
    let spec = &p.spec;
    let mut desired = Desired::of(&p);
    desired.surface_timeout_seconds = ctx.config.scheduling_surface_timeout_seconds;
    let (owned, conflicts) = observe_nodes(shared, &p, &desired, memory).await;
    desired.halted = spec.upgrade_policy.halt_on_failure
        && owned
            .iter()
            .any(|s| s.prev.state == FirmwareNodeState::Failed);
    let candidates: Vec<Candidate> = owned.iter().map(|s| candidate(s, &desired)).collect();
    let (granted, budget) = grant(shared, &p, &desired, &candidates, &mut memory.held);
    let (mut statuses, errors) = step_all(
        shared,
        &p,
        &desired,
        owned,
        &granted,
        Arc::new(budget),
        memory,
    )
    .await;
    statuses.extend(conflicts.iter().map(|(n, other)| conflict_status(n, other)));
    statuses.sort_by(|a, b| a.name.cmp(&b.name));
    // Another policy's nodes are counted by that policy.
    let states: Vec<FirmwareNodeState> = statuses
        .iter()
        .filter(|n| !is_conflict(n))
        .map(|n| n.state)
        .collect();
    ctx.metrics
        .set_firmware_policy(&name, &spec.version, &states, errors == 0);
    status(&p, statuses, &conflicts)
}

/// The nodes the policy owns, each as this pass sees it, and those it
/// selects that another policy owns (node, owner).
async fn observe_nodes(
    shared: &Shared,
    p: &TenstorrentFirmwarePolicy,
    desired: &Desired,
    memory: &mut Memory,
) -> (Vec<Seen>, Vec<(String, String)>) {
    let ctx = &shared.ctx;
    let name = p.metadata.name.clone().unwrap_or_default();
    let drain = drain_policy(p);
    let shape = DrainShape {
        selector: PodSelector::parse(&drain.pod_selector_label).ok(),
        exempt: ctx.config.drain_exempt_namespaces(),
        pdbs: ctx.stores.pdbs.state(),
        drain,
        surface: ctx.config.surface(),
    };
    let mut owned: Vec<Seen> = vec![];
    let mut conflicts: Vec<(String, String)> = vec![];
    for node in ctx.stores.nodes.state() {
        let Some(node_name) = node.metadata.name.clone() else {
            continue;
        };
        match selects(p, &node, ctx.eligibility()) {
            Selected::No => continue,
            Selected::Conflict(other) => {
                conflicts.push((node_name, other));
                continue;
            }
            Selected::Owned => {}
        }
        let persisted = record_of(&name, &node);
        if persisted.is_some() && memory.kind.live.get(&node_name) == persisted.as_ref() {
            memory.kind.live.remove(&node_name);
        }
        let rec = memory
            .kind
            .live
            .get(&node_name)
            .cloned()
            .or(persisted.clone());
        owned.push(see_node(shared, p, desired, &shape, node, rec, persisted).await);
    }
    (owned, conflicts)
}

/// What a pass drains by, read once for all its nodes.
struct DrainShape {
    drain: ttdrv_api::DrainPolicy,
    selector: Option<PodSelector>,
    exempt: Vec<String>,
    pdbs: Vec<Arc<k8s_openapi::api::policy::v1::PodDisruptionBudget>>,
    surface: ttdrv_core::surface::SurfaceConfig,
}

/// One owned node: its observation, and the record it steps from (ours, or
/// one taken over from the Go firmware controller).
async fn see_node(
    shared: &Shared,
    p: &TenstorrentFirmwarePolicy,
    desired: &Desired,
    shape: &DrainShape,
    node: Arc<k8s_openapi::api::core::v1::Node>,
    rec: Option<FwRecord>,
    persisted: Option<FwRecord>,
) -> Seen {
    let ctx = &shared.ctx;
    let name = p.metadata.name.clone().unwrap_or_default();
    let node_name = node.metadata.name.clone().unwrap_or_default();
    // The machine reads the flash Job only while Flashing and on a
    // takeover: only then is it looked up (its pods are an API list, and a
    // finished Job is kept a day). The Job the record names; by its
    // deterministic name on a takeover, or for a record of an earlier
    // controller version that named none.
    let job = if rec
        .as_ref()
        .is_none_or(|r| r.state == FirmwareNodeState::Flashing)
    {
        let job_name = rec.as_ref().and_then(|r| r.job.clone()).unwrap_or_else(|| {
            let attempt = rec.as_ref().map_or(0, |r| r.attempt);
            job_name_for(&name, &node_name, &p.spec.version, attempt)
        });
        job(shared, &job_name).await
    } else {
        ttdrv_core::firmware::FlashJob::Missing
    };
    let draining = rec.as_ref().is_some_and(|r| {
        matches!(
            r.state,
            FirmwareNodeState::Cordoning | FirmwareNodeState::Draining
        )
    });
    let pods = ctx.stores.pods.on_node(&node_name);
    let facts: Vec<&ttdrv_core::drain::PodFacts> = pods.facts.iter().map(Arc::as_ref).collect();
    // The same deploy gates as the driver's cycles close (one list,
    // `controller.deployGates`), read against the cluster's DaemonSets.
    let (gate_keys, daemon_sets) = (ctx.config.gates(), ctx.stores.all_daemon_sets.snapshot());
    let mut view = observe(
        &name,
        &node,
        &facts,
        &shape.drain,
        shape.selector.as_ref(),
        &shape.exempt,
        draining,
        || shape.pdbs.iter().map(Arc::as_ref).collect(),
        ttdrv_core::firmware::observe::Gates {
            keys: &gate_keys,
            daemon_sets: &daemon_sets,
        },
        job,
        now_secs(),
    );
    // What the scheduler sees of the cards: checked before the uncordon,
    // with the driver's rules ([`ttdrv_core::surface`]); read where the
    // machine reads it (a start, the uncordon, a retry), not on a node Done
    // at the policy's version.
    if rec
        .as_ref()
        .is_none_or(|r| r.state != FirmwareNodeState::Done || r.target != desired.version)
    {
        view.obs.surface = ttdrv_core::node::surface(
            &shape.surface,
            &node,
            &facts,
            ctx.stores.slices.devices_on(&node_name),
            ttdrv_core::surface::stack_pods(&facts, &daemon_sets, &gate_keys),
        );
    }
    let prev = rec.unwrap_or_else(|| takeover(desired, &view.obs));
    if ctx.config.combine_firmware_and_driver && prev.state == FirmwareNodeState::Flashing {
        view.obs.driver_waiting = ttdrv_core::claim::handover_to(
            &node,
            |p| ctx.stores.policies.get(&ObjectRef::new(p)),
            &desired.readback,
        );
    }
    Seen {
        node,
        prev,
        persisted,
        view,
    }
}

/// The `maxParallel` budget, under the driver rollout's rules: the nodes
/// granted a slot this pass (added to `held`), and what a start must stay
/// within when it takes its claim.
fn grant(
    shared: &Shared,
    p: &TenstorrentFirmwarePolicy,
    desired: &Desired,
    candidates: &[Candidate],
    held: &mut BTreeSet<String>,
) -> (BTreeSet<String>, Budget) {
    held.retain(|n| {
        candidates
            .iter()
            .any(|c| &c.name == n && ((c.wants_slot && c.ready) || c.in_progress))
    });
    let limits = Limits {
        max_unavailable: usize::try_from(p.spec.upgrade_policy.max_parallel)
            .unwrap_or(1)
            .max(1),
        brake_percent: shared.ctx.config.not_ready_brake_percent,
    };
    let granted: BTreeSet<String> = if desired.paused || !desired.auto_upgrade {
        BTreeSet::new()
    } else {
        plan(candidates.iter(), held, limits)
            .granted
            .into_iter()
            .collect()
    };
    held.extend(granted.iter().cloned());
    let budget = Budget {
        fleet: Arc::new(candidates.iter().map(|c| c.name.clone()).collect()),
        cap: limits.max_unavailable,
        out: candidates
            .iter()
            .filter(|c| c.in_progress || c.unavailable || c.failed)
            .map(|c| c.name.clone())
            .collect(),
    };
    (granted, budget)
}

/// Every owned node steps at once, each in its own actor (a first pass
/// writes a record on every node: one after the other, that took seconds at
/// 100 nodes, while a driver wave could start on nodes this flash would have
/// shared its cordon with). Starts stay within the budget: each takes its
/// claim under the registry's lock. Returns the nodes' status entries and
/// the failed writes.
async fn step_all(
    shared: &Shared,
    p: &Arc<TenstorrentFirmwarePolicy>,
    desired: &Desired,
    owned: Vec<Seen>,
    granted: &BTreeSet<String>,
    budget: Arc<Budget>,
    memory: &mut Memory,
) -> (Vec<FirmwareNodeStatus>, u32) {
    let name = p.metadata.name.clone().unwrap_or_default();
    let owned_names: BTreeSet<String> = owned
        .iter()
        .filter_map(|s| s.node.metadata.name.clone())
        .collect();
    // Node actors of nodes no longer this policy's stop (giving their
    // claims back); each owned node gets one.
    memory.nodes.retain(|n| owned_names.contains(n));
    memory.kind.live.retain(|n, _| owned_names.contains(n));
    let mut calls = Vec::new();
    for mut s in owned {
        let node_name = s.node.metadata.name.clone().unwrap_or_default();
        s.view.obs.slot = granted.contains(&node_name);
        let addr = memory.nodes.get_or_start(&node_name, || {
            let (ctx, ports) = (shared.ctx.clone(), shared.node_ports());
            let (node, policy) = (node_name.clone(), name.clone());
            actix::Supervisor::start(move |_| NodeActor::new(ctx, ports, &node, &policy))
        });
        let slot = s.view.obs.slot;
        let msg = StepNode {
            policy: p.clone(),
            desired: desired.clone(),
            seen: s,
            budget: budget.clone(),
        };
        calls.push(async move { (node_name, slot, addr.send(msg).await) });
    }
    let mut statuses = vec![];
    let mut errors = 0;
    for (node_name, slot, stepped) in futures::future::join_all(calls).await {
        let Ok(out) = stepped else {
            tracing::warn!(
                policy = name,
                node = node_name,
                "firmware node actor unavailable"
            );
            errors += 1;
            continue;
        };
        errors += out.errors;
        if let Some(r) = &out.written {
            memory.kind.live.insert(node_name.clone(), r.clone());
        }
        if out.restart {
            // Its actor restarts: the next pass reads the Node's record.
            memory.kind.live.remove(&node_name);
        }
        let next = out.record;
        // The slot goes back when the cycle ends, or the step did not use it
        // (a node still waiting with its slot keeps it).
        let keeps_slot = next.occupies_slot() || (next.state == FirmwareNodeState::Pending && slot);
        if !keeps_slot {
            memory.held.remove(&node_name);
        }
        statuses.push(node_status(&node_name, &next, &out.seen));
    }
    (statuses, errors)
}

/// The status entry of a node another policy owns, as the Go operator
/// writes it.
fn conflict_status(node: &str, owner: &str) -> FirmwareNodeStatus {
    FirmwareNodeStatus {
        name: node.to_string(),
        state: FirmwareNodeState::Pending,
        reason: Some(reason::NODE_CONFLICT.into()),
        current_version: None,
        last_flash_job: None,
        message: Some(format!(
            "Conflict: node owned by a different TenstorrentFirmwarePolicy CR ({owner})"
        )),
        last_transition_time: None,
    }
}

/// The flash Job `name` as the cache shows it, and its pods when it exists.
async fn job(shared: &Shared, name: &str) -> ttdrv_core::firmware::FlashJob {
    let ns = &shared.ctx.config.namespace;
    let job = shared.stores.jobs.get(&ObjectRef::new(name).within(ns));
    let mut pods: Vec<Pod> = vec![];
    if job.is_some() {
        let api: Api<Pod> = Api::namespaced(shared.ctx.client.clone(), ns);
        let lp = ListParams::default().labels(&format!("job-name={name}"));
        match api.list(&lp).await {
            Ok(l) => pods = l.items,
            Err(e) => tracing::warn!(job = name, error = %e, "listing the flash Job's pods"),
        }
    }
    let refs: Vec<&Pod> = pods.iter().collect();
    job_state(job.as_deref(), &refs)
}

/// The policy's status from its nodes' entries; whether the cached object
/// already shows it.
fn status(
    p: &TenstorrentFirmwarePolicy,
    nodes: Vec<FirmwareNodeStatus>,
    conflicts: &[(String, String)],
) -> StatusOut<FirmwareKind> {
    let old = p.status.clone().unwrap_or_default();
    let summary = summary(&nodes);
    let mut st = TenstorrentFirmwarePolicyStatus {
        unreadable: None,
        observed_generation: p.metadata.generation,
        desired_version: Some(p.spec.version.clone()),
        conditions: conditions(p, &summary, conflicts, &old.conditions),
        summary,
        nodes,
    };
    // Keep each node's transition time while its state stays.
    for n in &mut st.nodes {
        if let Some(o) = old
            .nodes
            .iter()
            .find(|o| o.name == n.name && o.state == n.state)
        {
            n.last_transition_time = o
                .last_transition_time
                .clone()
                .or(n.last_transition_time.clone());
        }
    }
    StatusOut {
        on_object: old == st,
        status: st,
        note: (),
    }
}
