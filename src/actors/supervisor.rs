//! PolicySupervisor (one per policy): keeps the policy's DaemonSet, node claims
//! and NodeActors in line with the nodes it owns, asks its RolloutActor which
//! nodes may start, feeds the NodeActors of the nodes in the pass's scope (and
//! of nodes just granted a slot) a fresh observation, and writes the policy's
//! status in the background when (and only when) it changed.
//!
//! A full pass looks at every owned node; a targeted pass only at the nodes a
//! watch event named, so its cost does not grow with the fleet.

use std::collections::{BTreeMap, HashMap, HashSet};
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
    DaemonSetRenderer, Ensure, Evictor, Labeler, NodeActor, Observe, PassScope, PatchNode,
    PlanRollout, RolloutActor,
};
use crate::context::Context;
use crate::render::daemonset_name;
use crate::selection::Assignment;
use crate::upgrade::drain::{PodRef, SkipReason, blocking_pdbs, plan_drain};
use crate::upgrade::machine::{Desired, DrainProgress, Installer, NodeRecord, Observation, reason};
use crate::upgrade::rollout::{Candidate, Plan};
use crate::{Error, Result};

pub struct PolicySupervisor {
    ctx: Arc<Context>,
    name: String,
    /// Behind `Arc`s so a pass borrows them without copying N entries; only
    /// full passes and the end of a pass change them.
    nodes: Arc<HashMap<String, Addr<NodeActor>>>,
    records: Arc<HashMap<String, NodeRecord>>,
    /// Nodes with pods that use the device (listed last, drained last).
    device_users: HashSet<String>,
    rollout: Addr<RolloutActor>,
    labeler: Addr<Labeler>,
    evictor: Addr<Evictor>,
    renderer: Addr<DaemonSetRenderer>,
    last_status: Option<TenstorrentDriverPolicyStatus>,
    last_status_write: Option<Instant>,
    status_in_flight: bool,
    /// A full pass has rebuilt the records and the rollout's view of every
    /// node; until then every pass is a full one.
    primed: bool,
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
            nodes: Arc::default(),
            records: Arc::default(),
            device_users: HashSet::new(),
            rollout: RolloutActor::default().start(),
            labeler,
            evictor,
            renderer,
            last_status: None,
            last_status_write: None,
            status_in_flight: false,
            primed: false,
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
        // Reload everything from the cluster on the next (full) pass.
        self.records = Arc::default();
        self.device_users.clear();
        self.last_status = None;
        self.status_in_flight = false;
        self.primed = false;
        self.ctx.metrics.inc_actor_restart("policy_supervisor");
    }
}

/// Re-evaluate the policy against the current caches: every node it owns
/// (`scope.full`), or only the nodes named in `scope.nodes` plus, on the
/// periodic tick, those in the middle of a cycle.
#[derive(Message, Clone)]
#[rtype(result = "Result<()>")]
pub struct Reconcile {
    pub assignment: Arc<Assignment>,
    pub scope: PassScope,
}

/// Everything the supervisor derived from the caches for one node.
struct NodeView {
    obs: Observation,
    persisted: Option<NodeRecord>,
    evictions: Vec<(PodRef, crate::upgrade::drain::Pass)>,
    installer_pod: Option<PodRef>,
    skipped: Vec<String>,
    has_device_pods: bool,
    externally_unavailable: bool,
    /// `evictions` and `obs.drain` were worked out (the node drains or starts).
    drain_planned: bool,
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

fn owns(owned: &[String], node: &str) -> bool {
    owned.binary_search_by(|n| n.as_str().cmp(node)).is_ok()
}

impl Handler<Reconcile> for PolicySupervisor {
    type Result = AtomicResponse<Self, Result<()>>;

    fn handle(&mut self, msg: Reconcile, _: &mut Self::Context) -> Self::Result {
        let started = Instant::now();
        let ctx = self.ctx.clone();
        let name = self.name.clone();
        let Some(policy) = ctx.stores.policies.get(&ObjectRef::new(&name)) else {
            return AtomicResponse::new(Box::pin(async { Ok(()) }.into_actor(self)));
        };
        let full = msg.scope.full || !self.primed;
        let assignment = msg.assignment;
        let conflicts = assignment.conflicts.get(&name).cloned().unwrap_or_default();
        let owned: &[String] = assignment.owned.get(&name).map_or(&[], Vec::as_slice);

        let (targets, strays): (Vec<String>, Vec<String>) = if full {
            self.sync_node_actors(owned);
            (owned.to_vec(), vec![])
        } else {
            let mut nodes = msg.scope.nodes;
            if msg.scope.tick {
                // Deadlines and eviction retries concern nodes mid-cycle only.
                nodes.extend(
                    self.records
                        .iter()
                        .filter(|(_, r)| r.state.is_in_progress())
                        .map(|(n, _)| n.clone()),
                );
            }
            nodes.into_iter().partition(|n| owns(owned, n))
        };
        let pass = Pass {
            ctx: ctx.clone(),
            policy: policy.clone(),
            assignment: assignment.clone(),
            full,
            actors: self.nodes.clone(),
            records: self.records.clone(),
            rollout: self.rollout.clone(),
            labeler: self.labeler.clone(),
            renderer: self.renderer.clone(),
        };
        let warn_deprecated = policy.spec.uses_deprecated_node_selector()
            && self.warned_generation != policy.metadata.generation;
        let conflicts_changed = conflicts != self.last_conflicts;

        let fut = async move {
            let res = pass
                .run(
                    targets,
                    strays,
                    &conflicts,
                    warn_deprecated,
                    conflicts_changed,
                )
                .await;
            (res, conflicts, warn_deprecated)
        };
        AtomicResponse::new(Box::pin(fut.into_actor(self).map(
            move |(res, conflicts, warned), act, actx| {
                act.last_conflicts = conflicts.clone();
                if warned {
                    act.warned_generation = policy.metadata.generation;
                }
                let res = res.map(|out| {
                    act.absorb(&out, full, &assignment);
                    let plan = out.plan;
                    act.export_metrics(&out.stepped, full, &plan);
                    act.write_status_if_due(&policy, &conflicts, &plan, actx);
                    out.err
                });
                let err = match &res {
                    Ok(e) => e.as_ref(),
                    Err(e) => Some(e),
                };
                let m = &act.ctx.metrics;
                m.observe_reconcile(&act.name, started.elapsed().as_secs_f64(), err.is_none());
                match err {
                    None => m.set_last_successful_reconcile(&act.name),
                    Some(e) => {
                        m.inc_error(&act.name, e.metric_label());
                        tracing::warn!(policy = act.name, error = %e, full, "reconcile failed; will retry");
                    }
                }
                match res {
                    Ok(None) => Ok(()),
                    Ok(Some(e)) | Err(e) => Err(e),
                }
            },
        )))
    }
}

impl PolicySupervisor {
    /// NodeActors follow the set of owned nodes (full passes only: ownership
    /// changes always start one).
    fn sync_node_actors(&mut self, owned: &[String]) {
        let gone: Vec<String> = self
            .nodes
            .keys()
            .filter(|n| !owns(owned, n))
            .cloned()
            .collect();
        let missing = owned.iter().any(|n| !self.nodes.contains_key(n));
        if gone.is_empty() && !missing {
            return;
        }
        let nodes = Arc::make_mut(&mut self.nodes);
        for n in owned {
            if !nodes.contains_key(n) {
                let (c, node, pol, l, e, r) = (
                    self.ctx.clone(),
                    n.clone(),
                    self.name.clone(),
                    self.labeler.clone(),
                    self.evictor.clone(),
                    self.renderer.clone(),
                );
                let addr = actix::Supervisor::start(move |_| NodeActor::new(c, node, pol, l, e, r));
                nodes.insert(n.clone(), addr);
            }
        }
        for n in gone {
            if let Some(a) = nodes.remove(&n) {
                a.do_send(StopNode);
            }
            Arc::make_mut(&mut self.records).remove(&n);
            self.device_users.remove(&n);
            self.ctx.metrics.forget_node(&self.name, &n);
        }
    }

    /// Takes in what a pass learnt. The records the NodeActors returned are kept
    /// even when something failed: the next pass must see the nodes as they
    /// are, not as they were.
    fn absorb(&mut self, out: &PassOut, full: bool, assignment: &Assignment) {
        let records = Arc::make_mut(&mut self.records);
        for (n, r) in &out.updates {
            records.insert(n.clone(), r.clone());
        }
        if full {
            let owned: &[String] = assignment.owned.get(&self.name).map_or(&[], Vec::as_slice);
            records.retain(|n, _| owns(owned, n));
            self.primed = true;
        }
        for (n, device) in &out.device_users {
            if *device {
                self.device_users.insert(n.clone());
            } else {
                self.device_users.remove(n);
            }
        }
    }

    /// Per-node series for the nodes stepped in this pass (all on a full pass);
    /// the per-state counts from every record.
    fn export_metrics(&self, stepped: &[String], full: bool, plan: &Plan) {
        let (m, cr) = (&self.ctx.metrics, self.name.as_str());
        let gates = self.ctx.config.gates();
        let set_node = |n: &str, r: &NodeRecord| {
            m.set_node_state(cr, n, r.state);
            m.set_node_state_since(cr, n, r.since as f64);
            if let Some(node) = self.ctx.stores.nodes.get(&ObjectRef::new(n)) {
                for g in &gates {
                    m.set_deploy_gate_closed(cr, n, g, node_label(&node, g) == Some("false"));
                }
            }
        };
        if full {
            self.records.iter().for_each(|(n, r)| set_node(n, r));
        } else {
            for n in stepped {
                if let Some(r) = self.records.get(n) {
                    set_node(n, r);
                }
            }
        }
        let mut counts: BTreeMap<NodeState, i64> = NodeState::ALL.iter().map(|s| (*s, 0)).collect();
        let mut host = 0;
        for r in self.records.values() {
            if r.reason.as_deref() == Some(reason::HOST_MANAGED) {
                host += 1;
            } else {
                *counts.entry(r.state).or_default() += 1;
            }
        }
        let counts: Vec<(NodeState, i64)> = counts.into_iter().collect();
        m.set_policy_nodes(cr, &counts);
        m.set_policy_host_managed(cr, host);
        m.set_rollout_budget(cr, plan.max_unavailable as i64, plan.unavailable as i64);
        m.set_policy_paused(cr, self.paused());
    }

    fn paused(&self) -> bool {
        self.ctx
            .stores
            .policies
            .get(&ObjectRef::new(&self.name))
            .is_some_and(|p| p.spec.paused)
    }

    /// Writes the status in the background, off every node's path: condition
    /// flips (Ready, Degraded, Paused, Conflict…) and a new generation at once,
    /// per-node progress at most once per STATUS_INTERVAL (the periodic full
    /// pass flushes the last of it). One write at a time.
    fn write_status_if_due(
        &mut self,
        policy: &Arc<TenstorrentDriverPolicy>,
        conflicts: &[(String, String)],
        plan: &Plan,
        actx: &mut actix::Context<Self>,
    ) {
        if self.status_in_flight {
            return;
        }
        let prev = self.last_status.clone().or_else(|| policy.status.clone());
        let (summary, _) = summarize(&self.records);
        let flags = condition_flags(&summary, policy.spec.paused, !conflicts.is_empty());
        let prev_flags = prev.as_ref().map(|p| {
            p.conditions
                .iter()
                .map(|c| c.status == "True")
                .collect::<Vec<_>>()
        });
        let urgent = prev_flags.as_deref() != Some(flags.as_slice())
            || prev.as_ref().map(|p| p.observed_generation) != Some(policy.metadata.generation);
        let due = self
            .last_status_write
            .is_none_or(|t| t.elapsed() >= STATUS_INTERVAL);
        if !(urgent || due) {
            return;
        }
        let status = build_status(
            policy,
            &self.records,
            &self.ctx,
            &self.device_users,
            conflicts,
            plan,
            &daemonset_name(&self.name),
            prev.as_ref(),
        );
        if prev.as_ref() == Some(&status) {
            return;
        }
        self.status_in_flight = true;
        let api: Api<TenstorrentDriverPolicy> = Api::all(self.ctx.client.clone());
        let name = self.name.clone();
        let fut = async move {
            let patch = serde_json::json!({ "status": status });
            let res = api
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await;
            (res, status)
        };
        actx.spawn(fut.into_actor(self).map(|(res, status), act, _| {
            act.status_in_flight = false;
            match res {
                Ok(_) => {
                    act.last_status = Some(status);
                    act.last_status_write = Some(Instant::now());
                }
                Err(e) => {
                    // Retried by the next pass (at the latest the periodic one).
                    act.ctx.metrics.inc_error(&act.name, "kube_api");
                    tracing::warn!(policy = act.name, error = %e, "writing status failed; will retry");
                }
            }
        }));
    }
}

/// Least time between two status writes that only carry per-node progress.
const STATUS_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// What a pass hands back to its supervisor.
struct PassOut {
    /// Records after each NodeActor's step.
    updates: Vec<(String, NodeRecord)>,
    /// Nodes stepped in this pass.
    stepped: Vec<String>,
    /// Whether each observed node has pods using the device.
    device_users: Vec<(String, bool)>,
    plan: Plan,
    /// First error of the pass (the other nodes' steps go on past it).
    err: Option<Error>,
}

/// One reconcile pass: what it needs, detached from the actor so it can run
/// as a future.
struct Pass {
    ctx: Arc<Context>,
    policy: Arc<TenstorrentDriverPolicy>,
    assignment: Arc<Assignment>,
    full: bool,
    actors: Arc<HashMap<String, Addr<NodeActor>>>,
    records: Arc<HashMap<String, NodeRecord>>,
    rollout: Addr<RolloutActor>,
    labeler: Addr<Labeler>,
    renderer: Addr<DaemonSetRenderer>,
}

/// Rounds of slot hand-over within one pass: a node reaching Done frees a
/// slot, and the next node starts in the same pass instead of waiting for the
/// watch to echo the Done back.
const MAX_ROUNDS: usize = 3;

impl Pass {
    fn name(&self) -> &str {
        self.policy.metadata.name.as_deref().unwrap_or_default()
    }

    fn owned(&self) -> &[String] {
        self.assignment
            .owned
            .get(self.name())
            .map_or(&[], Vec::as_slice)
    }

    async fn run(
        &self,
        targets: Vec<String>,
        strays: Vec<String>,
        conflicts: &[(String, String)],
        warn_deprecated: bool,
        conflicts_changed: bool,
    ) -> Result<PassOut> {
        let (ctx, policy) = (&self.ctx, &self.policy);
        let name = self.name().to_string();
        let spec = &policy.spec;
        ctx.metrics.set_desired_version(&name, &spec.version);
        self.report_policy_events(conflicts, warn_deprecated, conflicts_changed);
        self.claim(&targets).await?;
        self.release(&strays).await?;
        let hash = self.ensure_daemonset().await?;
        let selector =
            PodSelector::parse(&spec.upgrade_policy.drain.pod_selector_label).map_err(|e| {
                Error::InvalidPolicy {
                    policy: name.clone(),
                    message: e.to_string(),
                }
            })?;
        let gates = ctx.config.gates();
        let now = now_secs();
        let desired = Desired {
            policy: name.clone(),
            version: spec.version.clone(),
            drain_enabled: spec.upgrade_policy.drain.enable,
            drain_timeout_seconds: spec.upgrade_policy.drain.timeout_seconds,
            upgrade_timeout_seconds: ctx.config.upgrade_timeout_seconds,
            paused: spec.paused,
        };
        let max = spec.upgrade_policy.max_unavailable_for(self.owned().len());

        let mut updates: HashMap<String, NodeRecord> = HashMap::new();
        let mut device_users = Vec::new();
        let mut first_err = None;
        let observe = |nodes: &[String], starting: &HashSet<&str>| {
            observe_nodes(
                ctx,
                &name,
                nodes,
                &hash,
                &selector,
                policy,
                &gates,
                now,
                &self.records,
                starting,
            )
        };
        let mut views = observe(&targets, &HashSet::new());
        let mut candidates: Vec<Candidate> = views
            .iter()
            .map(|(n, v)| {
                let rec = self.records.get(n).or(v.persisted.as_ref());
                candidate(n, rec, v)
            })
            .collect();
        let mut replace = self.full;
        let mut stepped: HashSet<String> = HashSet::new();
        let mut plan;
        let mut round = 0;
        loop {
            plan = self
                .rollout
                .send(PlanRollout {
                    replace,
                    updates: std::mem::take(&mut candidates),
                    max_unavailable: max,
                })
                .await?;
            replace = false;
            // Nodes granted a slot that are not stepped yet (this pass or an
            // earlier one whose step failed) join this round.
            let queued: HashSet<&str> = views.iter().map(|(n, _)| n.as_str()).collect();
            let fresh: Vec<String> = plan
                .granted
                .iter()
                .filter(|n| !stepped.contains(*n) && !queued.contains(n.as_str()))
                .cloned()
                .collect();
            let granted: HashSet<&str> = plan.granted.iter().map(String::as_str).collect();
            // Granted nodes observed before the plan are observed again with
            // their drain plan.
            let regrant: Vec<String> = views
                .iter()
                .filter(|(n, v)| granted.contains(n.as_str()) && !v.drain_planned)
                .map(|(n, _)| n.clone())
                .collect();
            if !regrant.is_empty() {
                views.retain(|(n, _)| !regrant.contains(n));
                views.extend(observe(&regrant, &granted));
            }
            if !fresh.is_empty() {
                views.extend(observe(&fresh, &granted));
            }
            if views.is_empty() || round == MAX_ROUNDS {
                break;
            }
            round += 1;
            let mut calls = Vec::new();
            for (n, mut v) in std::mem::take(&mut views) {
                let Some(addr) = self.actors.get(&n) else {
                    continue;
                };
                stepped.insert(n.clone());
                device_users.push((n.clone(), v.has_device_pods));
                v.obs.slot = granted.contains(n.as_str());
                let after = (v.externally_unavailable, v.has_device_pods);
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
                let addr = addr.clone();
                calls.push(async move { (n, after, addr.send(msg).await) });
            }
            for (n, (unavailable, has_device_pods), res) in futures::future::join_all(calls).await {
                match res.map_err(Error::from).and_then(|r| r) {
                    Ok(rec) => {
                        candidates.push(Candidate {
                            name: n.clone(),
                            wants_slot: rec.state == NodeState::Pending,
                            in_progress: rec.occupies_slot(),
                            unavailable,
                            failed: rec.state == NodeState::Failed,
                            has_device_pods,
                        });
                        updates.insert(n, rec);
                    }
                    Err(e) => {
                        tracing::warn!(policy = name, node = n, error = %e, "node step failed; will retry");
                        first_err = first_err.or(Some(e));
                    }
                }
            }
        }
        Ok(PassOut {
            updates: updates.into_iter().collect(),
            stepped: stepped.into_iter().collect(),
            device_users,
            plan,
            err: first_err,
        })
    }

    fn report_policy_events(
        &self,
        conflicts: &[(String, String)],
        warn_deprecated: bool,
        conflicts_changed: bool,
    ) {
        let policy = self.policy.as_ref();
        if warn_deprecated {
            self.ctx.event(
                policy,
                true,
                "DeprecatedField",
                "Validate",
                "spec.nodeSelector is deprecated: rename it to spec.nodeAffinity (same shape)"
                    .into(),
            );
        }
        if conflicts_changed && !conflicts.is_empty() {
            let list: Vec<String> = conflicts
                .iter()
                .map(|(n, o)| format!("{n} (owned by {o})"))
                .collect();
            self.ctx.event(
                policy,
                true,
                "SelectorConflict",
                "Select",
                format!(
                    "nodes also matched by older policies are left to them: {}",
                    list.join(", ")
                ),
            );
        }
    }

    /// Claims the owned nodes so the DaemonSet (which requires the claim) lands
    /// there.
    async fn claim(&self, targets: &[String]) -> Result<()> {
        let name = self.name();
        let calls = targets.iter().filter_map(|n| {
            let node = self.ctx.stores.nodes.get(&ObjectRef::new(n));
            if node.as_deref().and_then(|nd| node_label(nd, labels::CLAIM)) == Some(name) {
                return None;
            }
            let patch = serde_json::json!({ "metadata": { "labels": { labels::CLAIM: name } } });
            Some(self.labeler.send(PatchNode {
                node: n.clone(),
                patch,
                action: "claiming node",
            }))
        });
        for res in futures::future::join_all(calls).await {
            res??;
        }
        Ok(())
    }

    /// Releases nodes that carry our claim but are no longer ours (all such
    /// nodes on a full pass, else the changed ones); never strands a cordon.
    async fn release(&self, strays: &[String]) -> Result<()> {
        let name = self.name();
        let ours = |nd: &Node| node_label(nd, labels::CLAIM) == Some(name);
        let nodes: Vec<Arc<Node>> = if self.full {
            self.ctx.stores.nodes.state_filter(|nd| {
                ours(nd)
                    && !owns(
                        self.owned(),
                        nd.metadata.name.as_deref().unwrap_or_default(),
                    )
            })
        } else {
            strays
                .iter()
                .filter_map(|n| self.ctx.stores.nodes.get(&ObjectRef::new(n)))
                .filter(|nd| ours(nd))
                .collect()
        };
        let gates = self.ctx.config.gates();
        for node in nodes {
            self.labeler
                .send(PatchNode {
                    node: node.metadata.name.clone().unwrap_or_default(),
                    patch: release_patch(&node, name, &gates),
                    action: "releasing node",
                })
                .await??;
        }
        Ok(())
    }

    /// The DaemonSet: rendered and applied unless paused (a paused policy leaves
    /// it as is). Returns the template hash installer pods must carry.
    async fn ensure_daemonset(&self) -> Result<String> {
        if !self.policy.spec.paused {
            return self
                .renderer
                .send(Ensure {
                    policy: self.policy.clone(),
                })
                .await?;
        }
        let ds_name = daemonset_name(self.name());
        Ok(self
            .ctx
            .stores
            .daemonsets
            .get(&ObjectRef::new(&ds_name).within(&self.ctx.config.namespace))
            .and_then(|d| {
                d.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(labels::TEMPLATE_HASH).cloned())
            })
            .unwrap_or_default())
    }
}

fn candidate(name: &str, rec: Option<&NodeRecord>, v: &NodeView) -> Candidate {
    let state = rec.map(|r| r.state).unwrap_or(NodeState::Pending);
    Candidate {
        name: name.to_string(),
        wants_slot: state == NodeState::Pending,
        in_progress: rec.is_some_and(|r| r.occupies_slot()),
        unavailable: v.externally_unavailable,
        failed: state == NodeState::Failed,
        has_device_pods: v.has_device_pods,
    }
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
    targets: &[String],
    hash: &str,
    selector: &PodSelector,
    policy: &TenstorrentDriverPolicy,
    gates: &[String],
    now: i64,
    records: &HashMap<String, NodeRecord>,
    starting: &HashSet<&str>,
) -> Vec<(String, NodeView)> {
    // Read only while a node drains.
    let pdbs = std::cell::OnceCell::new();
    let mut out = Vec::new();
    for n in targets {
        let Some(node) = ctx.stores.nodes.get(&ObjectRef::new(n)) else {
            continue;
        };
        // Shared with the cache, never deep-copied; found through the index,
        // not by scanning every pod.
        let pods: Vec<Arc<Pod>> = ctx.stores.pods_by_node.on_node(&ctx.stores.pods, n);
        let installer = pods.iter().map(Arc::as_ref).find(|p| {
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
        let plan = plan_drain(
            pods.iter().map(Arc::as_ref),
            &policy.spec.upgrade_policy.drain,
            selector,
        );
        // Either view saying Cordoning/Draining is enough: the drain plan must
        // never be missing when the NodeActor is about to leave Draining.
        // A node granted a slot now may go through Cordoning into Draining in
        // one step (on the response to its cordon), so it needs the plan too.
        let draining = starting.contains(n.as_str())
            || [records.get(n), persisted.as_ref()]
                .into_iter()
                .flatten()
                .any(|r| r.state == NodeState::Draining || r.state == NodeState::Cordoning);
        let mut drain = DrainProgress::default();
        let mut evictions = vec![];
        if draining {
            let by_ref: HashMap<PodRef, &Pod> =
                pods.iter().map(|p| (PodRef::of(p), p.as_ref())).collect();
            let pdbs = pdbs.get_or_init(|| ctx.stores.pdbs.state());
            let device_left = plan.device.iter().any(|p| by_ref.contains_key(p));
            for (p, pass) in plan.remaining() {
                drain.remaining.push(p.to_string());
                let Some(pod) = by_ref.get(p) else { continue };
                for pdb in blocking_pdbs(pod, pdbs.iter().map(Arc::as_ref)) {
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
                drain_planned: draining,
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

/// Per-state counts and the failure messages, from every record.
fn summarize(records: &HashMap<String, NodeRecord>) -> (Summary, Vec<String>) {
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
            NodeState::Failed => {
                summary.failed += 1;
                failed.push(format!("{n}: {}", r.message.as_deref().unwrap_or("")));
            }
            _ => summary.in_progress += 1,
        }
    }
    failed.sort();
    (summary, failed)
}

/// The status of each condition, in the order `build_status` lists them:
/// Ready, Progressing, Degraded, Paused, Conflict.
fn condition_flags(summary: &Summary, paused: bool, conflicts: bool) -> [bool; 5] {
    let settled = summary.pending == 0 && summary.in_progress == 0 && summary.failed == 0;
    [
        settled && !paused,
        !settled && summary.failed == 0 && !paused,
        summary.failed > 0,
        paused,
        conflicts,
    ]
}

#[allow(clippy::too_many_arguments)]
fn build_status(
    policy: &TenstorrentDriverPolicy,
    records: &HashMap<String, NodeRecord>,
    ctx: &Context,
    device_users: &HashSet<String>,
    conflicts: &[(String, String)],
    plan: &Plan,
    ds_name: &str,
    prev: Option<&TenstorrentDriverPolicyStatus>,
) -> TenstorrentDriverPolicyStatus {
    let generation = policy.metadata.generation;
    // The rollout's order: nodes without device users first, then by name.
    let mut names: Vec<&String> = records.keys().collect();
    names.sort_by(|a, b| (device_users.contains(*a), a).cmp(&(device_users.contains(*b), b)));
    let (summary, failed) = summarize(records);
    let mut entries = Vec::with_capacity(names.len());
    for n in names {
        let r = &records[n];
        let node = ctx.stores.nodes.get(&ObjectRef::new(n));
        let l = |k: &str| {
            node.as_deref()
                .and_then(|nd| node_label(nd, k))
                .map(String::from)
        };
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
    // The same flags decide whether a write is urgent (`write_status_if_due`).
    let [ready, progressing, degraded, _, conflicted] =
        condition_flags(&summary, paused, !conflicts.is_empty());
    let mut conditions = vec![
        cond(
            condition::READY,
            ready,
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
            progressing,
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
            degraded,
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
