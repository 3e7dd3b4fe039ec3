//! PolicySupervisor (one per policy): keeps the policy's DaemonSet, node claims
//! and NodeActors in line with the nodes it owns, asks its RolloutActor which
//! nodes may start, feeds every NodeActor a fresh observation, and writes the
//! policy's status when (and only when) it changed.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use ttdrv_api::{
    NodeState, NodeStatus, PodSelector, Summary, TenstorrentDriverPolicy,
    TenstorrentDriverPolicyStatus, condition, labels,
};

use super::node::StopNode;
use super::{
    DaemonSetRenderer, Ensure, Evictor, Labeler, NodeActor, Observe, PatchNode, PlanRollout,
    RolloutActor,
};
use crate::context::Context;
use crate::render::daemonset_name;
use crate::selection::Assignment;
use crate::upgrade::drain::{PodRef, SkipReason, blocking_pdbs, plan_drain};
use crate::upgrade::machine::{Desired, DrainProgress, Installer, NodeRecord, Observation, reason};
use crate::upgrade::rollout::{Candidate, order_key};
use crate::{Error, Result};

pub struct PolicySupervisor {
    ctx: Arc<Context>,
    name: String,
    nodes: HashMap<String, Addr<NodeActor>>,
    records: HashMap<String, NodeRecord>,
    rollout: Addr<RolloutActor>,
    labeler: Addr<Labeler>,
    evictor: Addr<Evictor>,
    renderer: Addr<DaemonSetRenderer>,
    last_status: Option<TenstorrentDriverPolicyStatus>,
    last_status_write: Option<Instant>,
    warned_generation: Option<i64>,
    last_conflicts: Vec<(String, String)>,
}

impl PolicySupervisor {
    pub fn new(
        ctx: Arc<Context>,
        name: String,
        labeler: Addr<Labeler>,
        evictor: Addr<Evictor>,
        renderer: Addr<DaemonSetRenderer>,
    ) -> Self {
        Self {
            ctx,
            name,
            nodes: HashMap::new(),
            records: HashMap::new(),
            rollout: RolloutActor::default().start(),
            labeler,
            evictor,
            renderer,
            last_status: None,
            last_status_write: None,
            warned_generation: None,
            last_conflicts: vec![],
        }
    }
}

impl Actor for PolicySupervisor {
    type Context = actix::Context<Self>;

    fn stopped(&mut self, _: &mut Self::Context) {
        for addr in self.nodes.values() {
            addr.do_send(StopNode);
        }
    }
}

impl Supervised for PolicySupervisor {
    fn restarting(&mut self, _: &mut Self::Context) {
        // Reload everything from the cluster on the next Reconcile.
        self.records.clear();
        self.last_status = None;
        self.ctx.metrics.inc_actor_restart("policy_supervisor");
    }
}

/// Re-evaluate the policy against the current caches.
#[derive(Message, Clone)]
#[rtype(result = "Result<()>")]
pub struct Reconcile {
    pub assignment: Arc<Assignment>,
}

/// Everything the supervisor derived from the caches for one node.
struct NodeView {
    node: Arc<Node>,
    obs: Observation,
    persisted: Option<NodeRecord>,
    evictions: Vec<(PodRef, crate::upgrade::drain::Pass)>,
    installer_pod: Option<PodRef>,
    skipped: Vec<String>,
    has_device_pods: bool,
    externally_unavailable: bool,
}

fn now_secs() -> i64 {
    Timestamp::now().as_second()
}

fn node_label<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

pub fn persisted_record(node: &Node) -> Option<NodeRecord> {
    let raw = node
        .metadata
        .annotations
        .as_ref()?
        .get(labels::UPGRADE_STATE)?;
    match serde_json::from_str(raw) {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::warn!(node = node.metadata.name.as_deref().unwrap_or(""), error = %e, "ignoring unreadable upgrade record");
            None
        }
    }
}

impl Handler<Reconcile> for PolicySupervisor {
    type Result = AtomicResponse<Self, Result<()>>;

    fn handle(&mut self, msg: Reconcile, actx: &mut Self::Context) -> Self::Result {
        let started = Instant::now();
        let ctx = self.ctx.clone();
        let name = self.name.clone();
        let Some(policy) = ctx.stores.policies.get(&ObjectRef::new(&name)) else {
            return AtomicResponse::new(Box::pin(async { Ok(()) }.into_actor(self)));
        };
        let owned: Vec<String> = msg.assignment.owned.get(&name).cloned().unwrap_or_default();
        let conflicts = msg
            .assignment
            .conflicts
            .get(&name)
            .cloned()
            .unwrap_or_default();

        let owned_lookup: std::collections::HashSet<&str> =
            owned.iter().map(String::as_str).collect();
        // NodeActors follow the set of owned nodes.
        for n in &owned {
            if !self.nodes.contains_key(n) {
                let (c, node, pol, l, e, r) = (
                    ctx.clone(),
                    n.clone(),
                    name.clone(),
                    self.labeler.clone(),
                    self.evictor.clone(),
                    self.renderer.clone(),
                );
                let addr = actix::Supervisor::start(move |_| NodeActor::new(c, node, pol, l, e, r));
                self.nodes.insert(n.clone(), addr);
            }
        }
        let gone: Vec<String> = self
            .nodes
            .keys()
            .filter(|n| !owned_lookup.contains(n.as_str()))
            .cloned()
            .collect();
        for n in gone {
            if let Some(a) = self.nodes.remove(&n) {
                a.do_send(StopNode);
            }
            self.records.remove(&n);
            ctx.metrics.forget_node(&name, &n);
        }
        let actors: Vec<(String, Addr<NodeActor>)> = owned
            .iter()
            .filter_map(|n| self.nodes.get(n).map(|a| (n.clone(), a.clone())))
            .collect();
        let records = self.records.clone();
        let (rollout, labeler, renderer) = (
            self.rollout.clone(),
            self.labeler.clone(),
            self.renderer.clone(),
        );
        let prev_status = self.last_status.clone().or_else(|| policy.status.clone());
        // Per-node progress is written at most once per STATUS_INTERVAL; condition
        // flips (Ready, Degraded, Paused, Conflict…) are written at once.
        let status_due = self
            .last_status_write
            .is_none_or(|t| t.elapsed() >= STATUS_INTERVAL);
        let warn_deprecated = policy.spec.uses_deprecated_node_selector()
            && self.warned_generation != policy.metadata.generation;
        let conflicts_changed = conflicts != self.last_conflicts;
        let _ = actx;

        let fut = async move {
            let res = reconcile(
                &ctx,
                &policy,
                &owned,
                &conflicts,
                actors,
                records,
                rollout,
                labeler,
                renderer,
                prev_status,
                status_due,
                warn_deprecated,
                conflicts_changed,
            )
            .await;
            let err = match &res {
                Ok((_, _, e)) => e.as_ref(),
                Err(e) => Some(e),
            };
            ctx.metrics
                .observe_reconcile(&name, started.elapsed().as_secs_f64(), err.is_none());
            match err {
                None => ctx.metrics.set_last_successful_reconcile(&name),
                Some(e) => {
                    ctx.metrics.inc_error(&name, e.metric_label());
                    tracing::warn!(policy = name, error = %e, "reconcile failed; will retry");
                }
            }
            (res, conflicts, policy.metadata.generation, warn_deprecated)
        };
        AtomicResponse::new(Box::pin(fut.into_actor(self).map(
            |(res, conflicts, generation, warned), act, _| {
                act.last_conflicts = conflicts;
                if warned {
                    act.warned_generation = generation;
                }
                match res {
                    Ok((records, status, err)) => {
                        act.records = records;
                        if status.is_some() {
                            act.last_status = status;
                            act.last_status_write = Some(Instant::now());
                        }
                        err.map_or(Ok(()), Err)
                    }
                    Err(e) => Err(e),
                }
            },
        )))
    }
}

/// Least time between two status writes that only carry per-node progress.
const STATUS_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// Records after the pass, the status if written, and the first error of the
/// pass (node steps and status write continue past it).
type ReconcileOut = (
    HashMap<String, NodeRecord>,
    Option<TenstorrentDriverPolicyStatus>,
    Option<Error>,
);

#[allow(clippy::too_many_arguments)]
async fn reconcile(
    ctx: &Arc<Context>,
    policy: &Arc<TenstorrentDriverPolicy>,
    owned: &[String],
    conflicts: &[(String, String)],
    actors: Vec<(String, Addr<NodeActor>)>,
    mut records: HashMap<String, NodeRecord>,
    rollout: Addr<RolloutActor>,
    labeler: Addr<Labeler>,
    renderer: Addr<DaemonSetRenderer>,
    prev_status: Option<TenstorrentDriverPolicyStatus>,
    status_due: bool,
    warn_deprecated: bool,
    conflicts_changed: bool,
) -> Result<ReconcileOut> {
    let name = policy.metadata.name.clone().unwrap_or_default();
    let spec = &policy.spec;
    let paused = spec.paused;
    let owned_set: std::collections::HashSet<&str> = owned.iter().map(String::as_str).collect();
    let m = &ctx.metrics;
    m.set_policy_paused(&name, paused);
    m.set_desired_version(&name, &spec.version);
    if warn_deprecated {
        ctx.event(
            policy.as_ref(),
            true,
            "DeprecatedField",
            "Validate",
            "spec.nodeSelector is deprecated: rename it to spec.nodeAffinity (same shape)".into(),
        );
    }
    if conflicts_changed && !conflicts.is_empty() {
        let list: Vec<String> = conflicts
            .iter()
            .map(|(n, o)| format!("{n} (owned by {o})"))
            .collect();
        ctx.event(
            policy.as_ref(),
            true,
            "SelectorConflict",
            "Select",
            format!(
                "nodes also matched by older policies are left to them: {}",
                list.join(", ")
            ),
        );
    }

    // Claim the owned nodes so the DaemonSet (which requires the claim) lands there.
    for n in owned {
        let node = ctx.stores.nodes.get(&ObjectRef::new(n));
        if node.as_deref().and_then(|nd| node_label(nd, labels::CLAIM)) != Some(name.as_str()) {
            let patch = serde_json::json!({ "metadata": { "labels": { labels::CLAIM: name } } });
            labeler
                .send(PatchNode {
                    node: n.clone(),
                    patch,
                    action: "claiming node",
                })
                .await??;
        }
    }
    // Release nodes that carry our claim but are no longer ours; never strand a cordon.
    for node in ctx
        .stores
        .nodes
        .state_filter(|nd| node_label(nd, labels::CLAIM) == Some(name.as_str()))
    {
        let n = node.metadata.name.clone().unwrap_or_default();
        if owned_set.contains(n.as_str()) {
            continue;
        }
        labeler
            .send(PatchNode {
                node: n.clone(),
                patch: release_patch(&node, &name, &ctx.config.gates()),
                action: "releasing node",
            })
            .await??;
    }

    // The DaemonSet: rendered and applied unless paused (a paused policy leaves it as is).
    let ds_name = daemonset_name(&name);
    let hash = if paused {
        ctx.stores
            .daemonsets
            .get(&ObjectRef::new(&ds_name).within(&ctx.config.namespace))
            .and_then(|d| {
                d.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(labels::TEMPLATE_HASH).cloned())
            })
            .unwrap_or_default()
    } else {
        renderer
            .send(Ensure {
                policy: policy.clone(),
            })
            .await??
    };

    let selector =
        PodSelector::parse(&spec.upgrade_policy.drain.pod_selector_label).map_err(|e| {
            Error::InvalidPolicy {
                policy: name.clone(),
                message: e.to_string(),
            }
        })?;
    let gates = ctx.config.gates();
    let now = now_secs();
    let views = observe_nodes(
        ctx, &name, owned, &hash, &selector, policy, &gates, now, &records,
    );

    let candidates: Vec<Candidate> = views
        .iter()
        .map(|(n, v)| {
            let rec = records.get(n).or(v.persisted.as_ref());
            let state = rec.map(|r| r.state).unwrap_or(NodeState::Pending);
            Candidate {
                name: n.clone(),
                wants_slot: state == NodeState::Pending,
                in_progress: rec.is_some_and(|r| r.occupies_slot()),
                unavailable: v.externally_unavailable,
                failed: state == NodeState::Failed,
                has_device_pods: v.has_device_pods,
            }
        })
        .collect();
    let max = spec.upgrade_policy.max_unavailable_for(owned.len());
    let plan = rollout
        .send(PlanRollout {
            candidates: candidates.clone(),
            max_unavailable: max,
        })
        .await?;

    let desired = Desired {
        policy: name.clone(),
        version: spec.version.clone(),
        drain_enabled: spec.upgrade_policy.drain.enable,
        drain_timeout_seconds: spec.upgrade_policy.drain.timeout_seconds,
        upgrade_timeout_seconds: ctx.config.upgrade_timeout_seconds,
        paused,
    };
    let mut calls = Vec::new();
    let mut view_map: HashMap<String, NodeView> = views.into_iter().collect();
    for (n, addr) in &actors {
        let Some(mut v) = view_map.remove(n) else {
            continue;
        };
        v.obs.slot = plan.granted.contains(n);
        let msg = Observe {
            policy: policy.clone(),
            obs: v.obs,
            desired: desired.clone(),
            persisted: v.persisted,
            evictions: v.evictions,
            installer_pod: v.installer_pod,
            skipped: v.skipped,
            gates: gates.clone(),
        };
        let n = n.clone();
        let node = v.node.clone();
        calls.push(async move { (n, node, addr.send(msg).await) });
    }
    let mut first_err = None;
    let mut node_objs: BTreeMap<String, Arc<Node>> = BTreeMap::new();
    for (n, node, res) in futures::future::join_all(calls).await {
        node_objs.insert(n.clone(), node);
        match res.map_err(Error::from).and_then(|r| r) {
            Ok(rec) => {
                records.insert(n, rec);
            }
            Err(e) => {
                tracing::warn!(policy = name, node = n, error = %e, "node step failed; will retry");
                if first_err.is_none() {
                    first_err = Some(e);
                }
            }
        }
    }
    records.retain(|n, _| owned_set.contains(n.as_str()));

    // Status, metrics.
    let order: BTreeMap<String, (bool, String)> = candidates
        .iter()
        .map(|c| (c.name.clone(), order_key(c)))
        .collect();
    let status = build_status(
        policy,
        &records,
        &node_objs,
        &order,
        conflicts,
        &plan,
        &ds_name,
        prev_status.as_ref(),
    );
    export_metrics(ctx, &name, &records, &node_objs, &gates, &plan);
    let mut written = None;
    let flips = |s: Option<&TenstorrentDriverPolicyStatus>| {
        s.map(|s| {
            s.conditions
                .iter()
                .map(|c| (c.type_.clone(), c.status.clone()))
                .collect::<Vec<_>>()
        })
    };
    let urgent = flips(prev_status.as_ref()) != flips(Some(&status))
        || prev_status.as_ref().map(|p| p.observed_generation) != Some(status.observed_generation);
    if prev_status.as_ref() != Some(&status) && (status_due || urgent) {
        let api: Api<TenstorrentDriverPolicy> = Api::all(ctx.client.clone());
        let patch = serde_json::json!({ "status": status });
        match api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => written = Some(status),
            Err(e) => {
                first_err = first_err.or(Some(Error::Kube {
                    action: format!("writing status of {name}"),
                    source: e,
                }))
            }
        }
    }
    // The records the NodeActors returned are kept even when something failed:
    // the next pass must see the nodes as they are, not as they were.
    Ok((records, written, first_err))
}

/// Patch that removes our claim from a node we no longer own, undoing our cordon
/// and gates if a cycle was cut short (node relabelled or skipped mid-upgrade).
pub fn release_patch(node: &Node, policy: &str, gates: &[String]) -> serde_json::Value {
    let mut patch = serde_json::json!({ "metadata": { "labels": { labels::CLAIM: null }, "annotations": { labels::UPGRADE_STATE: null } } });
    if let Some(rec) = persisted_record(node).filter(|r| r.policy == policy) {
        if rec.cordoned_by_us {
            patch["spec"] = serde_json::json!({ "unschedulable": false });
        }
        if rec.state.is_in_progress() || rec.state == NodeState::Failed {
            for g in gates {
                patch["metadata"]["labels"][g] = serde_json::Value::Null;
            }
        }
    }
    patch
}

#[allow(clippy::too_many_arguments)]
fn observe_nodes(
    ctx: &Context,
    policy_name: &str,
    owned: &[String],
    hash: &str,
    selector: &PodSelector,
    policy: &TenstorrentDriverPolicy,
    gates: &[String],
    now: i64,
    records: &HashMap<String, NodeRecord>,
) -> Vec<(String, NodeView)> {
    // One pass over the pod cache, indexed by node: no per-node scans.
    let owned_set: std::collections::HashSet<&str> = owned.iter().map(String::as_str).collect();
    let mut by_node: HashMap<String, Vec<Arc<Pod>>> = HashMap::new();
    for pod in ctx.stores.pods.state() {
        if let Some(n) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref())
            && owned_set.contains(n)
        {
            by_node.entry(n.to_string()).or_default().push(pod.clone());
        }
    }
    let pdbs: Vec<_> = ctx
        .stores
        .pdbs
        .state()
        .iter()
        .map(|p| (**p).clone())
        .collect();
    let mut out = Vec::new();
    for n in owned {
        let Some(node) = ctx.stores.nodes.get(&ObjectRef::new(n)) else {
            continue;
        };
        let pods: Vec<Pod> = by_node
            .remove(n)
            .unwrap_or_default()
            .iter()
            .map(|p| (**p).clone())
            .collect();
        let installer = pods.iter().find(|p| {
            p.metadata.namespace.as_deref() == Some(ctx.config.namespace.as_str())
                && p.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(labels::CLAIM))
                    .map(String::as_str)
                    == Some(policy_name)
        });
        let installer_state = match installer {
            None => Installer::Missing,
            Some(p) => {
                let pod_hash = p
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(labels::TEMPLATE_HASH))
                    .map(String::as_str);
                if pod_hash == Some(hash) && !hash.is_empty() {
                    Installer::Current {
                        ready: p.metadata.deletion_timestamp.is_none() && pod_ready(p),
                    }
                } else {
                    Installer::Stale {
                        deleting: p.metadata.deletion_timestamp.is_some(),
                    }
                }
            }
        };
        let installer_problem = installer.and_then(installer_problem);
        let persisted = persisted_record(&node).filter(|r| r.policy == policy_name);
        let rec = records.get(n).or(persisted.as_ref());
        let plan = plan_drain(&pods, &policy.spec.upgrade_policy.drain, selector);
        // Either view saying Cordoning/Draining is enough: the drain plan must
        // never be missing when the NodeActor is about to leave Draining.
        let draining = [records.get(n), persisted.as_ref()]
            .into_iter()
            .flatten()
            .any(|r| r.state == NodeState::Draining || r.state == NodeState::Cordoning);
        let mut drain = DrainProgress::default();
        let mut evictions = vec![];
        if draining {
            let by_ref: HashMap<PodRef, &Pod> = pods.iter().map(|p| (PodRef::of(p), p)).collect();
            let device_left = plan.device.iter().any(|p| by_ref.contains_key(p));
            for (p, pass) in plan.remaining() {
                drain.remaining.push(p.to_string());
                let Some(pod) = by_ref.get(p) else { continue };
                for pdb in blocking_pdbs(pod, &pdbs) {
                    let id = format!(
                        "{}/{}",
                        pdb.metadata.namespace.as_deref().unwrap_or(""),
                        pdb.metadata.name.as_deref().unwrap_or("")
                    );
                    if !drain.blocking_pdbs.contains(&id) {
                        drain.blocking_pdbs.push(id);
                    }
                }
                // Pass 2 starts once pass 1's device users are gone.
                let pass_open = pass == crate::upgrade::drain::Pass::Device || !device_left;
                if pod.metadata.deletion_timestamp.is_none() && pass_open {
                    evictions.push((p.clone(), pass));
                }
            }
        }
        let label = |k: &str| node_label(&node, k);
        let gates_closed = gates.iter().all(|g| label(g) == Some("false"));
        let gates_present = gates.iter().any(|g| label(g).is_some());
        let unschedulable = node
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false);
        let cordoned_by_us = rec.is_some_and(|r| r.cordoned_by_us);
        let obs = Observation {
            now,
            unschedulable,
            loaded: label(labels::KMD_VERSION).map(String::from),
            host_managed: label(labels::INSTALL_MODE) == Some(labels::INSTALL_MODE_HOST),
            installer: installer_state,
            gates_closed,
            gates_present,
            drain,
            retry_token: node
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(RETRY_ANNOTATION))
                .cloned(),
            slot: false,
            installer_problem,
        };
        let has_device_pods = plan
            .device
            .iter()
            .chain(plan.skipped_device_users())
            .next()
            .is_some();
        let externally_unavailable = !node_ready(&node) || (unschedulable && !cordoned_by_us);
        out.push((
            n.clone(),
            NodeView {
                node,
                obs,
                persisted,
                evictions,
                installer_pod: installer.map(PodRef::of),
                skipped: if draining {
                    plan.skipped
                        .iter()
                        .filter(|(_, why, _)| {
                            !matches!(
                                why,
                                SkipReason::DaemonSet | SkipReason::Finished | SkipReason::Mirror
                            )
                        })
                        .map(|(p, why, _)| format!("{p} ({})", why.as_str()))
                        .collect()
                } else {
                    vec![]
                },
                has_device_pods,
                externally_unavailable,
            },
        ));
    }
    out
}

/// Annotation an operator sets (to any new value) to retry a Failed node.
pub const RETRY_ANNOTATION: &str = "driver.tenstorrent.com/retry";

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn installer_problem(pod: &Pod) -> Option<String> {
    let st = pod.status.as_ref()?;
    for cs in st.container_statuses.iter().flatten() {
        if let Some(t) = cs.last_state.as_ref().and_then(|s| s.terminated.as_ref()) {
            return Some(format!(
                "restarted {} time(s), last exit {}: {}",
                cs.restart_count,
                t.exit_code,
                t.message.clone().or(t.reason.clone()).unwrap_or_default()
            ));
        }
        if let Some(w) = cs.state.as_ref().and_then(|s| s.waiting.as_ref()) {
            return Some(format!("waiting: {}", w.reason.clone().unwrap_or_default()));
        }
    }
    None
}

fn cond(
    type_: &str,
    ok: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
    prev: Option<&TenstorrentDriverPolicyStatus>,
) -> Condition {
    let status = if ok { "True" } else { "False" };
    // Keep lastTransitionTime while the status is unchanged, so status is only
    // rewritten when something actually changed.
    let last = prev
        .and_then(|p| p.conditions.iter().find(|c| c.type_ == type_))
        .filter(|c| c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| {
            Time(
                Timestamp::now()
                    .round(k8s_openapi::jiff::Unit::Second)
                    .unwrap_or_else(|_| Timestamp::now()),
            )
        });
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        observed_generation: generation,
        last_transition_time: last,
    }
}

#[allow(clippy::too_many_arguments)]
fn build_status(
    policy: &TenstorrentDriverPolicy,
    records: &HashMap<String, NodeRecord>,
    nodes: &BTreeMap<String, Arc<Node>>,
    order: &BTreeMap<String, (bool, String)>,
    conflicts: &[(String, String)],
    plan: &crate::upgrade::rollout::Plan,
    ds_name: &str,
    prev: Option<&TenstorrentDriverPolicyStatus>,
) -> TenstorrentDriverPolicyStatus {
    let generation = policy.metadata.generation;
    let mut names: Vec<&String> = records.keys().collect();
    names.sort_by_key(|n| order.get(*n).cloned().unwrap_or((false, (*n).clone())));
    let mut summary = Summary {
        matched: records.len() as i32,
        ..Default::default()
    };
    let mut entries = Vec::new();
    let mut failed = Vec::new();
    for n in names {
        let r = &records[n];
        let host = r.reason.as_deref() == Some(reason::HOST_MANAGED);
        match r.state {
            NodeState::Done if host => summary.host_managed += 1,
            NodeState::Done => summary.done += 1,
            NodeState::Pending => summary.pending += 1,
            NodeState::Failed => {
                summary.failed += 1;
                failed.push(format!("{n}: {}", r.message.as_deref().unwrap_or("")));
            }
            _ => summary.in_progress += 1,
        }
        let node = nodes.get(n);
        let l = |k: &str| node.and_then(|nd| node_label(nd, k)).map(String::from);
        entries.push(NodeStatus {
            name: n.clone(),
            state: r.state,
            current_version: l(labels::KMD_VERSION),
            install_mode: l(labels::INSTALL_MODE),
            reason: r.reason.clone(),
            message: r.message.clone(),
            last_transition_time: k8s_openapi::jiff::Timestamp::from_second(r.since)
                .ok()
                .map(Time),
        });
    }
    let paused = policy.spec.paused;
    let settled = summary.pending == 0 && summary.in_progress == 0 && summary.failed == 0;
    let mut conditions = vec![
        cond(
            condition::READY,
            settled && !paused,
            if settled {
                "RolloutComplete"
            } else {
                "RolloutIncomplete"
            },
            format!(
                "{} of {} node(s) run {} ({} host-managed)",
                summary.done, summary.matched, policy.spec.version, summary.host_managed
            ),
            generation,
            prev,
        ),
        cond(
            condition::PROGRESSING,
            !settled && summary.failed == 0 && !paused,
            if paused {
                "Paused"
            } else if settled {
                "Idle"
            } else {
                "Upgrading"
            },
            plan.blocked.clone().unwrap_or_else(|| {
                format!(
                    "{} in progress, {} pending",
                    summary.in_progress, summary.pending
                )
            }),
            generation,
            prev,
        ),
        cond(
            condition::DEGRADED,
            summary.failed > 0,
            if summary.failed > 0 {
                "NodeFailed"
            } else {
                "AsExpected"
            },
            failed.join("; "),
            generation,
            prev,
        ),
        cond(
            condition::PAUSED,
            paused,
            if paused { "PausedBySpec" } else { "Running" },
            if paused {
                "spec.paused is true: nothing new starts; the DaemonSet is left as is".into()
            } else {
                String::new()
            },
            generation,
            prev,
        ),
    ];
    let conflict_msg: Vec<String> = conflicts
        .iter()
        .map(|(n, o)| format!("{n} (owned by {o})"))
        .collect();
    conditions.push(cond(
        condition::CONFLICT,
        !conflicts.is_empty(),
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
                conflict_msg.join(", ")
            )
        },
        generation,
        prev,
    ));
    TenstorrentDriverPolicyStatus {
        observed_generation: generation,
        conditions,
        desired_version: Some(policy.spec.version.clone()),
        summary,
        daemon_set: Some(ds_name.to_string()),
        nodes: entries,
    }
}

fn export_metrics(
    ctx: &Context,
    cr: &str,
    records: &HashMap<String, NodeRecord>,
    nodes: &BTreeMap<String, Arc<Node>>,
    gates: &[String],
    plan: &crate::upgrade::rollout::Plan,
) {
    let m = &ctx.metrics;
    let mut counts: BTreeMap<NodeState, i64> = NodeState::ALL.iter().map(|s| (*s, 0)).collect();
    let mut host = 0;
    for (n, r) in records {
        m.set_node_state(cr, n, r.state);
        m.set_node_state_since(cr, n, r.since as f64);
        if r.reason.as_deref() == Some(reason::HOST_MANAGED) {
            host += 1;
        } else {
            *counts.entry(r.state).or_default() += 1;
        }
        if let Some(node) = nodes.get(n) {
            for g in gates {
                m.set_deploy_gate_closed(cr, n, g, node_label(node, g) == Some("false"));
            }
        }
    }
    let counts: Vec<(NodeState, i64)> = counts.into_iter().collect();
    m.set_policy_nodes(cr, &counts);
    m.set_policy_host_managed(cr, host);
    m.set_rollout_budget(cr, plan.max_unavailable as i64, plan.unavailable as i64);
}
