//! The firmware policy controller (TenstorrentFirmwarePolicy, `ttfwp`): per
//! policy, a pass over the nodes it selects that steps each node's firmware
//! cycle ([`ttdrv_core::firmware`]) and carries out its commands through the
//! same Labeler (every Node write, record and cordon in one patch) and
//! Evictor (the Eviction API, PDBs honoured) as the driver policy, under the
//! same rollout rules ([`ttdrv_core::rollout`]: `maxParallel` as the hard cap,
//! availability, the NotReady brake, the failure halt). A node's cycle starts
//! only with its claim ([`crate::claims`]): never while a driver cycle has it.
//!
//! Passes run every `--resync-ms` and on every change of a firmware policy or
//! a flash Job; each waits for the one before.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use actix::prelude::*;
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use ttdrv_api::PodSelector;
use ttdrv_api::firmware::{
    FirmwareNodeState, FirmwareNodeStatus, FirmwareSummary, TenstorrentFirmwarePolicy,
    TenstorrentFirmwarePolicyStatus, job_name_for, labels as fw, reason,
};
use ttdrv_core::event::EventReason;
use ttdrv_core::firmware::job::{JobDefaults, flash_job, state as job_state};
use ttdrv_core::firmware::observe::{Selected, drain_policy, observe, record_of, selects};
use ttdrv_core::firmware::{Command, Desired, FwRecord, Step, step, takeover};
use ttdrv_core::rollout::{Candidate, Limits, plan};

use crate::actors::{Evict, Evictor, Labeler, PatchNode};
use crate::claims::{Budget, Holder, Refused};
use crate::context::Context;

/// The firmware policies and the flash Jobs, as their watches keep them.
#[derive(Clone)]
pub struct FirmwareStores {
    pub policies: Store<TenstorrentFirmwarePolicy>,
    pub jobs: Store<Job>,
}

/// Starts the two watches; each change asks for a pass (`kick`). Returns the
/// caches and a future that resolves once both have listed.
pub fn start_watches(
    client: &Client,
    namespace: &str,
    policy_selector: Option<&str>,
    kick: tokio::sync::mpsc::Sender<()>,
) -> (FirmwareStores, impl std::future::Future<Output = ()>) {
    let (policies, pw) = reflector::store();
    let (jobs, jw) = reflector::store();
    let mut pcfg = watcher::Config::default();
    if let Some(sel) = policy_selector {
        // As for the driver policies: only those this controller serves.
        pcfg = pcfg.labels(sel);
    }
    let policy_stream = watcher(Api::<TenstorrentFirmwarePolicy>::all(client.clone()), pcfg)
        .default_backoff()
        .reflect(pw)
        .map(|_| ())
        .boxed();
    let job_cfg = watcher::Config::default().labels(fw::JOB_POLICY);
    let job_stream = watcher(Api::<Job>::namespaced(client.clone(), namespace), job_cfg)
        .default_backoff()
        .modify(|j| j.metadata.managed_fields = None)
        .reflect(jw)
        .map(|_| ())
        .boxed();
    tokio::spawn(async move {
        let mut both = futures::stream::select(policy_stream, job_stream);
        while both.next().await.is_some() {
            // A pass is pending already when the channel is full.
            let _ = kick.try_send(());
        }
    });
    let (p, j) = (policies.clone(), jobs.clone());
    let ready = async move {
        let _ = futures::join!(p.wait_until_ready(), j.wait_until_ready());
    };
    (FirmwareStores { policies, jobs }, ready)
}

/// What the passes remember between them.
#[derive(Default)]
struct Memory {
    /// Per policy, the nodes holding a `maxParallel` slot.
    held: HashMap<String, BTreeSet<String>>,
    /// (policy, node) → the record last written: fresher than the cache.
    live: HashMap<(String, String), FwRecord>,
    /// Per policy, the status last written.
    written: HashMap<String, TenstorrentFirmwarePolicyStatus>,
    /// Nodes whose stray record is kept for a person (logged once).
    kept: BTreeSet<String>,
}

pub struct FirmwareManager {
    ctx: Arc<Context>,
    stores: FirmwareStores,
    labeler: Addr<Labeler>,
    evictor: Addr<Evictor>,
    memory: Option<Memory>,
    kicks: Option<tokio::sync::mpsc::Receiver<()>>,
    again: bool,
}

impl FirmwareManager {
    pub fn new(
        ctx: Arc<Context>,
        stores: FirmwareStores,
        kicks: tokio::sync::mpsc::Receiver<()>,
    ) -> Self {
        Self {
            labeler: Labeler::new(ctx.clone()).start(),
            evictor: Evictor::new(ctx.clone()).start(),
            ctx,
            stores,
            memory: Some(Memory::default()),
            kicks: Some(kicks),
            again: false,
        }
    }

    fn run_pass(&mut self, actx: &mut actix::Context<Self>) {
        let Some(memory) = self.memory.take() else {
            // A pass is running: one more after it.
            self.again = true;
            return;
        };
        let pass = Pass {
            ctx: self.ctx.clone(),
            stores: self.stores.clone(),
            labeler: self.labeler.clone(),
            evictor: self.evictor.clone(),
            errors: Default::default(),
        };
        actx.spawn(async move { pass.run(memory).await }.into_actor(self).map(
            |memory, act, actx| {
                act.memory = Some(memory);
                if std::mem::take(&mut act.again) {
                    act.run_pass(actx);
                }
            },
        ));
    }
}

#[derive(Message)]
#[rtype(result = "()")]
struct Kick;

impl Handler<Kick> for FirmwareManager {
    type Result = ();
    fn handle(&mut self, _: Kick, actx: &mut Self::Context) {
        self.run_pass(actx);
    }
}

impl Actor for FirmwareManager {
    type Context = actix::Context<Self>;

    fn started(&mut self, actx: &mut Self::Context) {
        let every = std::time::Duration::from_millis(self.ctx.config.resync_ms.max(200));
        actx.run_interval(every, |act, actx| act.run_pass(actx));
        if let Some(mut kicks) = self.kicks.take() {
            let me = actx.address();
            tokio::spawn(async move {
                while kicks.recv().await.is_some() {
                    me.do_send(Kick);
                }
            });
        }
    }
}

struct Pass {
    ctx: Arc<Context>,
    stores: FirmwareStores,
    labeler: Addr<Labeler>,
    evictor: Addr<Evictor>,
    /// Writes of the current policy's pass that failed.
    errors: std::cell::Cell<u32>,
}

/// One node of a policy, as this pass sees it.
struct Seen {
    node: Arc<Node>,
    prev: FwRecord,
    persisted: Option<FwRecord>,
    view: ttdrv_core::firmware::observe::NodeView,
}

fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default()
}

fn rfc3339(secs: i64) -> Option<Time> {
    k8s_openapi::jiff::Timestamp::from_second(secs)
        .ok()
        .map(Time)
}

impl Pass {
    async fn run(self, mut memory: Memory) -> Memory {
        let policies = self.stores.policies.state();
        let names: BTreeSet<String> = policies
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        for gone in memory.written.keys().filter(|p| !names.contains(*p)) {
            self.ctx.metrics.forget_firmware_policy(gone);
        }
        memory.held.retain(|p, _| names.contains(p));
        memory.written.retain(|p, _| names.contains(p));
        let mut by_version: BTreeMap<String, i64> = BTreeMap::new();
        for n in self.ctx.stores.nodes.state() {
            if let Some(v) = ttdrv_core::node::label(&n, fw::FW_VERSION) {
                *by_version.entry(v.to_string()).or_default() += 1;
            }
        }
        self.ctx.metrics.set_nodes_by_fw_version(&by_version);
        memory.live.retain(|(p, _), _| names.contains(p));
        self.release_strays(&policies, &mut memory).await;
        for p in policies {
            if p.metadata.deletion_timestamp.is_some() {
                continue;
            }
            self.errors.set(0);
            self.policy(&p, &mut memory).await;
        }
        memory
    }

    /// Firmware records whose policy is gone (deleted), or no longer selects
    /// the node: released where nothing was written to the cards (cordon,
    /// record and our marks removed), kept with a log line where the cards
    /// may be half-written ([`ttdrv_core::firmware::stray`]). A policy this
    /// controller does not serve (`--policy-selector`) is looked up first:
    /// only a 404 makes its records strays.
    async fn release_strays(&self, served: &[Arc<TenstorrentFirmwarePolicy>], memory: &mut Memory) {
        let ctx = &self.ctx;
        let api: Api<TenstorrentFirmwarePolicy> = Api::all(ctx.client.clone());
        let mut exists: HashMap<String, bool> = HashMap::new();
        for node in ctx.stores.nodes.state() {
            let Some(rec) = ttdrv_core::claim::firmware_record(&node) else {
                continue;
            };
            let name = node.metadata.name.clone().unwrap_or_default();
            let gone = match served
                .iter()
                .find(|p| p.metadata.name.as_deref() == Some(&rec.policy))
            {
                Some(p) => selects(p, &node, ctx.eligibility()) == Selected::No,
                None if ctx.config.policy_selector.is_none() => true,
                None => {
                    if !exists.contains_key(&rec.policy) {
                        let found = match api.get_opt(&rec.policy).await {
                            Ok(p) => p.is_some(),
                            // Unknown: not a stray yet.
                            Err(_) => true,
                        };
                        exists.insert(rec.policy.clone(), found);
                    }
                    !exists[&rec.policy]
                }
            };
            if !gone {
                memory.kept.remove(&name);
                continue;
            }
            match ttdrv_core::firmware::stray(&rec, ttdrv_core::node::unschedulable(&node)) {
                ttdrv_core::firmware::Stray::Keep(why) => {
                    if memory.kept.insert(name.clone()) {
                        tracing::warn!(node = name, policy = rec.policy, "{why}");
                    }
                }
                ttdrv_core::firmware::Stray::Release { uncordon } => {
                    let patch = release_patch(&node, &rec.policy, uncordon);
                    let sent = self
                        .labeler
                        .send(PatchNode {
                            node: name.clone(),
                            patch,
                            action: "releasing a firmware record whose policy is gone",
                        })
                        .await;
                    match sent {
                        Ok(Ok(_)) => {
                            ctx.claims
                                .release(&name, &Holder::Firmware(rec.policy.clone()));
                            tracing::info!(
                                node = name,
                                policy = rec.policy,
                                uncordon,
                                "firmware record released: its policy is gone or no longer selects the node"
                            );
                        }
                        Ok(Err(e)) => {
                            tracing::warn!(node = name, error = %e, "releasing a stray firmware record")
                        }
                        Err(e) => tracing::warn!(node = name, error = %e, "labeler unavailable"),
                    }
                }
            }
        }
    }

    async fn policy(&self, p: &TenstorrentFirmwarePolicy, memory: &mut Memory) {
        let ctx = &self.ctx;
        let name = p.metadata.name.clone().unwrap_or_default();
        let spec = &p.spec;
        let now = now_secs();
        let mut desired = Desired::of(p);
        let drain = drain_policy(p);
        let selector = PodSelector::parse(&drain.pod_selector_label).ok();
        let exempt = ctx.config.drain_exempt_namespaces();
        let pdbs = ctx.stores.pdbs.state();
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
            let key = (name.clone(), node_name.clone());
            if persisted.is_some() && memory.live.get(&key) == persisted.as_ref() {
                memory.live.remove(&key);
            }
            let rec = memory.live.get(&key).cloned().or(persisted.clone());
            let attempt = rec.as_ref().map_or(0, |r| r.attempt);
            // The machine reads the flash Job only while Flashing and on a
            // takeover: only then is it looked up (its pods are an API list,
            // and a finished Job is kept a day).
            let job = if rec
                .as_ref()
                .is_none_or(|r| r.state == FirmwareNodeState::Flashing)
            {
                self.job(&name, &node_name, &spec.version, attempt).await
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
            let facts: Vec<&ttdrv_core::drain::PodFacts> =
                pods.facts.iter().map(Arc::as_ref).collect();
            let view = observe(
                &name,
                &node,
                &facts,
                &drain,
                selector.as_ref(),
                &exempt,
                draining,
                || pdbs.iter().map(Arc::as_ref).collect(),
                job,
                now,
            );
            let mut view = view;
            let prev = rec.unwrap_or_else(|| takeover(&desired, &view.obs));
            if ctx.config.combine_firmware_and_driver && prev.state == FirmwareNodeState::Flashing {
                view.obs.driver_waiting = ttdrv_core::claim::handover_to(
                    &node,
                    |p| ctx.stores.policies.get(&ObjectRef::new(p)),
                    &desired.readback,
                );
            }
            owned.push(Seen {
                node,
                prev,
                persisted,
                view,
            });
        }
        desired.halted = spec.upgrade_policy.halt_on_failure
            && owned
                .iter()
                .any(|s| s.prev.state == FirmwareNodeState::Failed);

        // The budget: maxParallel, under the driver rollout's rules.
        let candidates: Vec<Candidate> = owned.iter().map(|s| candidate(s, &desired)).collect();
        let held = memory.held.entry(name.clone()).or_default();
        held.retain(|n| {
            candidates
                .iter()
                .any(|c| &c.name == n && ((c.wants_slot && c.ready) || c.in_progress))
        });
        let limits = Limits {
            max_unavailable: usize::try_from(spec.upgrade_policy.max_parallel)
                .unwrap_or(1)
                .max(1),
            brake_percent: ctx.config.not_ready_brake_percent,
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
            fleet: candidates.iter().map(|c| c.name.clone()).collect(),
            cap: limits.max_unavailable,
            out: candidates
                .iter()
                .filter(|c| c.in_progress || c.unavailable || c.failed)
                .map(|c| c.name.clone())
                .collect(),
        };

        let mut statuses: Vec<FirmwareNodeStatus> = vec![];
        for mut s in owned {
            let node_name = s.node.metadata.name.clone().unwrap_or_default();
            s.view.obs.slot = granted.contains(&node_name);
            let next = self.step_node(p, &desired, &mut s, &budget, memory).await;
            if !next.occupies_slot()
                && let Some(h) = memory.held.get_mut(&name)
                && !(next.state == FirmwareNodeState::Pending && s.view.obs.slot)
            {
                h.remove(&node_name);
            }
            statuses.push(node_status(&node_name, &next, &s));
        }
        for (n, other) in conflicts {
            statuses.push(FirmwareNodeStatus {
                name: n,
                state: FirmwareNodeState::Pending,
                reason: Some(reason::NODE_CONFLICT.into()),
                current_version: None,
                last_flash_job: None,
                message: Some(format!(
                    "Conflict: node owned by a different TenstorrentFirmwarePolicy CR ({other})"
                )),
                last_transition_time: None,
            });
        }
        statuses.sort_by(|a, b| a.name.cmp(&b.name));
        let states: Vec<FirmwareNodeState> = statuses.iter().map(|n| n.state).collect();
        ctx.metrics
            .set_firmware_policy(&name, &spec.version, &states, self.errors.get() == 0);
        self.write_status(p, statuses, memory).await;
    }

    /// The node's flash Job for this version, and its pods when it exists.
    async fn job(
        &self,
        policy: &str,
        node: &str,
        version: &str,
        attempt: u32,
    ) -> ttdrv_core::firmware::FlashJob {
        let ns = &self.ctx.config.namespace;
        let name = job_name_for(policy, node, version, attempt);
        let job = self.stores.jobs.get(&ObjectRef::new(&name).within(ns));
        let mut pods: Vec<Pod> = vec![];
        if job.is_some() {
            let api: Api<Pod> = Api::namespaced(self.ctx.client.clone(), ns);
            let lp = ListParams::default().labels(&format!("job-name={name}"));
            match api.list(&lp).await {
                Ok(l) => pods = l.items,
                Err(e) => tracing::warn!(job = name, error = %e, "listing the flash Job's pods"),
            }
        }
        let refs: Vec<&Pod> = pods.iter().collect();
        job_state(job.as_deref(), &refs)
    }

    async fn step_node(
        &self,
        p: &TenstorrentFirmwarePolicy,
        desired: &Desired,
        s: &mut Seen,
        budget: &Budget,
        memory: &mut Memory,
    ) -> FwRecord {
        let ctx = &self.ctx;
        let policy = desired.policy.clone();
        let node = s.node.metadata.name.clone().unwrap_or_default();
        let holder = Holder::Firmware(policy.clone());
        let mut next = step(&s.prev, &s.view.obs, desired);
        if !s.prev.state.is_in_progress() && next.record.state.is_in_progress() {
            match ctx.claims.take_within(&node, holder.clone(), Some(budget)) {
                Ok(()) => {}
                Err(Refused::Held(other)) => {
                    s.view.obs.driver_cycle = Some(other.to_string());
                    next = step(&s.prev, &s.view.obs, desired);
                }
                Err(Refused::OverBudget { out, cap }) => {
                    tracing::info!(
                        policy,
                        node,
                        out,
                        cap,
                        "flash cycle start deferred: a cycle started since the plan took the last place"
                    );
                    s.view.obs.slot = false;
                    next = step(&s.prev, &s.view.obs, desired);
                }
            }
        }
        let written = next.record != s.prev
            || !next.commands.is_empty()
            || s.persisted.as_ref() != Some(&next.record);
        if written {
            let starts = !s.prev.state.is_in_progress() && next.record.state.is_in_progress();
            // A hand-over was decided on this version of the Node too (the
            // driver's record waiting for it).
            let hands_over = next
                .commands
                .iter()
                .any(|c| matches!(c, Command::HandOver(_)));
            let patch = node_patch(&s.node, &next, &desired.version, starts || hands_over);
            let sent = self
                .labeler
                .send(PatchNode {
                    node: node.clone(),
                    patch,
                    action: "persisting firmware state",
                })
                .await;
            match sent {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    tracing::warn!(policy, node, error = %e, "firmware record not written; retried next pass");
                    ctx.metrics.inc_fw_error(&policy, "node_patch");
                    self.errors.set(self.errors.get() + 1);
                    ctx.claims.release(&node, &holder);
                    return s.prev.clone();
                }
                Err(e) => {
                    tracing::warn!(policy, node, error = %e, "labeler unavailable");
                    return s.prev.clone();
                }
            }
            memory
                .live
                .insert((policy.clone(), node.clone()), next.record.clone());
        }
        if !next.record.state.is_in_progress() {
            ctx.claims.release(&node, &holder);
        }
        for c in &next.commands {
            match c {
                Command::Evict if !s.view.evictions.is_empty() => {
                    let sent = self
                        .evictor
                        .send(Evict {
                            policy: policy.clone(),
                            pods: s.view.evictions.clone(),
                            firmware: true,
                        })
                        .await;
                    if let Ok(out) = sent {
                        ctx.metrics.inc_fw_evicted(&policy, out.evicted.len());
                        ctx.metrics
                            .inc_fw_drain_blocked(&policy, "pdb", out.blocked.len());
                        for e in &out.errors {
                            tracing::warn!(policy, node, error = e, "eviction failed; will retry");
                            ctx.metrics.inc_fw_error(&policy, "evict");
                        }
                    }
                }
                Command::CreateJob => self.create_job(p, &node, next.record.attempt).await,
                _ => {}
            }
        }
        if next.record.state != s.prev.state {
            self.report(p, &node, &s.prev, &next.record);
        }
        next.record
    }

    async fn create_job(&self, p: &TenstorrentFirmwarePolicy, node: &str, attempt: u32) {
        let ctx = &self.ctx;
        let defaults = JobDefaults {
            namespace: ctx.config.namespace.clone(),
            image: ctx.config.flasher_image.clone(),
            pull_policy: ctx.config.flasher_pull_policy.clone(),
            simulate_dir: ctx.config.flasher_simulate_dir.clone(),
        };
        let job = flash_job(p, node, attempt, &defaults);
        let api: Api<Job> = Api::namespaced(ctx.client.clone(), &ctx.config.namespace);
        let cr = p.metadata.name.as_deref().unwrap_or_default();
        match api.create(&PostParams::default(), &job).await {
            Ok(_) => {
                ctx.metrics.inc_flash_job_created(cr, true);
                tracing::info!(
                    node,
                    job = job.metadata.name.as_deref().unwrap_or_default(),
                    "flash Job created"
                )
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => {
                ctx.metrics.inc_flash_job_created(cr, false);
                ctx.metrics.inc_fw_error(cr, "job_create");
                self.errors.set(self.errors.get() + 1);
                tracing::warn!(node, error = %e, "creating the flash Job; retried next pass")
            }
        }
    }

    fn report(&self, p: &TenstorrentFirmwarePolicy, node: &str, prev: &FwRecord, next: &FwRecord) {
        use FirmwareNodeState::*;
        let name = p.metadata.name.as_deref().unwrap_or_default();
        tracing::info!(
            policy = name,
            node,
            from = prev.state.as_str(),
            to = next.state.as_str(),
            reason = next.reason.as_deref().unwrap_or(""),
            "firmware node transition"
        );
        let m = &self.ctx.metrics;
        if prev.state == Flashing && next.state != Flashing {
            let ok = matches!(next.state, Uncordoning | Done);
            m.observe_flash(name, ok, (next.since - prev.since) as f64);
        }
        if next.reason.as_deref() == Some(reason::CORDON_HANDED_OVER) && prev.state == Flashing {
            m.inc_fw_cordon_handed_over(name);
        }
        if next.state == Failed && next.reason.as_deref() == Some(reason::DRAIN_TIMEOUT) {
            m.inc_fw_drain_blocked(name, "drain_timeout", 1);
        }
        let msg = next.message.clone().unwrap_or_default();
        let (warning, ev, note) = match next.state {
            _ if next.reason.as_deref() == Some(reason::TAKEN_OVER) => (
                next.state == Failed,
                EventReason::FirmwareTakenOver,
                format!("node {node}: {msg}"),
            ),
            Cordoning | Flashing if !prev.state.is_in_progress() => (
                false,
                EventReason::FirmwareFlashStarted,
                format!("node {node}: firmware cycle to {} started", next.target),
            ),
            Done if next.reason.as_deref() == Some(reason::CORDON_HANDED_OVER) => (
                false,
                EventReason::FirmwareFlashed,
                format!(
                    "node {node}: every card reads back {}; {msg}",
                    next.current.as_deref().unwrap_or(&next.target)
                ),
            ),
            Done if prev.state.is_in_progress() => (
                false,
                EventReason::FirmwareFlashed,
                format!(
                    "node {node}: every card reads back {} and the node is back in service",
                    next.current.as_deref().unwrap_or(&next.target)
                ),
            ),
            Failed => (
                true,
                EventReason::FirmwareFlashFailed,
                format!("node {node}: {msg}"),
            ),
            _ => return,
        };
        self.ctx.event(p, warning, ev, "Flash", note);
    }

    async fn write_status(
        &self,
        p: &TenstorrentFirmwarePolicy,
        nodes: Vec<FirmwareNodeStatus>,
        memory: &mut Memory,
    ) {
        let name = p.metadata.name.clone().unwrap_or_default();
        let old = p.status.clone().unwrap_or_default();
        let summary = summary(&nodes);
        let mut st = TenstorrentFirmwarePolicyStatus {
            unreadable: None,
            observed_generation: p.metadata.generation,
            desired_version: Some(p.spec.version.clone()),
            conditions: conditions(p, &summary, &old.conditions),
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
        if memory.written.get(&name) == Some(&st) && old == st {
            return;
        }
        let api: Api<TenstorrentFirmwarePolicy> = Api::all(self.ctx.client.clone());
        let patch = serde_json::json!({ "status": st });
        match api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                memory.written.insert(name, st);
            }
            Err(e) => {
                self.ctx.metrics.inc_fw_error(&name, "status");
                tracing::warn!(policy = name, error = %e, "firmware status not written")
            }
        }
    }
}

/// The node's slot facts for the rollout plan.
fn candidate(s: &Seen, want: &Desired) -> Candidate {
    let obs = &s.view.obs;
    let rec = &s.prev;
    let ours = rec.cordon == ttdrv_core::machine::Cordon::Ours;
    let at_target = obs.current.as_deref() == Some(want.readback.as_str());
    let foreign_cordon = obs.unschedulable && !ours;
    let name = s.node.metadata.name.clone().unwrap_or_default();
    Candidate {
        // A node at the target without our cordon to undo has nothing to do.
        wants_slot: rec.state == FirmwareNodeState::Pending
            && (ours || !at_target)
            && obs.driver_cycle.is_none()
            && !foreign_cordon,
        in_progress: rec.occupies_slot(),
        ready: obs.ready,
        unavailable: !obs.ready || foreign_cordon || obs.driver_cycle.is_some(),
        unavailable_because: if !obs.ready {
            Some("NotReady".into())
        } else if let Some(d) = &obs.driver_cycle {
            Some(format!("held by {d}"))
        } else if foreign_cordon {
            Some(ttdrv_core::node::foreign_cordon(&s.node))
        } else {
            None
        },
        failed: want.halted && rec.state == FirmwareNodeState::Failed,
        has_device_pods: s.view.has_device_pods,
        prepared: true,
        name,
    }
}

/// The patch of one step: the record, the state label, the owner label, and
/// the cordon or uncordon with the Go controller's cordon marks; the Go
/// annotations of a flash and of a verified readback.
fn node_patch(node: &Node, next: &Step, version: &str, precondition: bool) -> serde_json::Value {
    let r = &next.record;
    let mut ann: BTreeMap<&str, serde_json::Value> = BTreeMap::new();
    ann.insert(
        fw::RECORD,
        serde_json::to_string(r).unwrap_or_default().into(),
    );
    let mut labels: BTreeMap<&str, serde_json::Value> = BTreeMap::new();
    labels.insert(fw::UPGRADE_STATE, r.state.as_str().into());
    labels.insert(fw::OWNED_BY, r.policy.clone().into());
    let mut patch = serde_json::json!({});
    for c in &next.commands {
        match c {
            Command::Cordon => {
                patch["spec"] = serde_json::json!({ "unschedulable": true });
                ann.insert(fw::CORDONED_BY, r.policy.clone().into());
                ann.insert(
                    fw::CORDONED_AT,
                    rfc3339(now_secs())
                        .map(|t| t.0.to_string())
                        .unwrap_or_default()
                        .into(),
                );
            }
            Command::Uncordon => {
                patch["spec"] = serde_json::json!({ "unschedulable": false });
                ann.insert(fw::CORDONED_BY, serde_json::Value::Null);
                ann.insert(fw::CORDONED_AT, serde_json::Value::Null);
            }
            Command::CreateJob => {
                ann.insert(fw::DESIRED_VERSION, version.into());
                ann.insert(
                    fw::LAST_FLASH_JOB,
                    job_name_for(
                        &r.policy,
                        node.metadata.name.as_deref().unwrap_or_default(),
                        version,
                        r.attempt,
                    )
                    .into(),
                );
            }
            Command::HandOver(driver) => {
                // The cordon stays; its marks now name the driver policy,
                // whose cycle takes it up and undoes it.
                ann.insert(fw::CORDONED_BY, serde_json::Value::Null);
                ann.insert(fw::CORDONED_AT, serde_json::Value::Null);
                ann.insert(ttdrv_api::labels::GO_CORDONED_BY, driver.clone().into());
                ann.insert(
                    ttdrv_api::labels::GO_CORDONED_AT,
                    rfc3339(now_secs())
                        .map(|t| t.0.to_string())
                        .unwrap_or_default()
                        .into(),
                );
                ann.insert(
                    ttdrv_api::labels::CORDON_HANDED_OVER_BY,
                    r.policy.clone().into(),
                );
            }
            Command::Evict => {}
        }
    }
    if r.state == FirmwareNodeState::Done
        && let Some(v) = &r.current
    {
        labels.insert(fw::FW_VERSION, v.clone().into());
        ann.insert(fw::CURRENT_VERSION, v.clone().into());
    }
    patch["metadata"] = serde_json::json!({ "annotations": ann, "labels": labels });
    if precondition && let Some(rv) = &node.metadata.resource_version {
        // The cycle was decided on this version of the Node (no driver
        // cycle on it): a write since then makes the decision stale.
        patch["metadata"]["resourceVersion"] = rv.clone().into();
    }
    patch
}

/// Removes a firmware policy's record and marks from a node (and its
/// cordon), decided on this version of the Node.
fn release_patch(node: &Node, policy: &str, uncordon: bool) -> serde_json::Value {
    let null = serde_json::Value::Null;
    let mut patch = serde_json::json!({ "metadata": {
        "annotations": { fw::RECORD: null },
        "labels": { fw::UPGRADE_STATE: null },
    } });
    let ann = |k: &str| ttdrv_core::node::annotation(node, k);
    if ttdrv_core::node::label(node, fw::OWNED_BY) == Some(policy) {
        patch["metadata"]["labels"][fw::OWNED_BY] = null.clone();
    }
    if uncordon {
        patch["spec"] = serde_json::json!({ "unschedulable": false });
    }
    if uncordon || ann(fw::CORDONED_BY) == Some(policy) {
        patch["metadata"]["annotations"][fw::CORDONED_BY] = null.clone();
        patch["metadata"]["annotations"][fw::CORDONED_AT] = null;
    }
    if let Some(rv) = &node.metadata.resource_version {
        patch["metadata"]["resourceVersion"] = rv.clone().into();
    }
    patch
}

fn node_status(name: &str, r: &FwRecord, s: &Seen) -> FirmwareNodeStatus {
    FirmwareNodeStatus {
        name: name.to_string(),
        state: r.state,
        reason: r.reason.clone(),
        current_version: r.current.clone().or(s.view.obs.current.clone()),
        last_flash_job: r.job.clone().or_else(|| {
            ttdrv_core::node::annotation(&s.node, fw::LAST_FLASH_JOB).map(String::from)
        }),
        message: r.message.clone(),
        last_transition_time: rfc3339(r.since),
    }
}

/// The Go operator's counts.
pub fn summary(nodes: &[FirmwareNodeStatus]) -> FirmwareSummary {
    let mut s = FirmwareSummary {
        matched: nodes.len() as i32,
        ..Default::default()
    };
    for n in nodes {
        match n.state {
            FirmwareNodeState::Done => s.up_to_date += 1,
            FirmwareNodeState::Failed => s.failed += 1,
            st if st.is_in_progress() => s.in_progress += 1,
            _ => s.pending += 1,
        }
    }
    s
}

/// Ready and Progressing as the Go operator sets them, and Paused; each
/// keeps its transition time while its status stays.
pub fn conditions(
    p: &TenstorrentFirmwarePolicy,
    s: &FirmwareSummary,
    old: &[Condition],
) -> Vec<Condition> {
    let halted = p.spec.upgrade_policy.halt_on_failure && s.failed > 0;
    let (ready, ready_reason, ready_msg) = if s.failed > 0 {
        (
            "False",
            "NodesFailed",
            format!("{} node(s) failed", s.failed),
        )
    } else if s.in_progress > 0 || s.pending > 0 {
        (
            "False",
            "NodesPending",
            format!("{}/{} up to date", s.up_to_date, s.matched),
        )
    } else {
        (
            "True",
            "AllUpToDate",
            "All matched nodes at desired version".to_string(),
        )
    };
    let (prog, prog_reason, prog_msg) = if halted {
        (
            "False",
            "Halted",
            "a node is Failed (haltOnFailure): retry it to go on".to_string(),
        )
    } else if p.spec.paused {
        ("False", "Paused", "spec.paused".to_string())
    } else if s.in_progress > 0 || s.pending > 0 {
        (
            "True",
            "NodesUpgrading",
            format!("{} in progress", s.in_progress),
        )
    } else {
        ("False", "Idle", String::new())
    };
    let paused = if p.spec.paused {
        (
            "True",
            "Paused",
            "spec.paused: no new firmware cycle starts".to_string(),
        )
    } else {
        ("False", "Running", String::new())
    };
    let now = rfc3339(now_secs()).unwrap_or(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    [
        ("Ready", ready, ready_reason, ready_msg),
        ("Progressing", prog, prog_reason, prog_msg),
        ("Paused", paused.0, paused.1, paused.2),
    ]
    .into_iter()
    .map(|(t, status, reason, message)| {
        let since = old
            .iter()
            .find(|c| c.type_ == t && c.status == status)
            .map(|c| c.last_transition_time.clone())
            .unwrap_or_else(|| now.clone());
        Condition {
            type_: t.into(),
            status: status.into(),
            reason: reason.into(),
            message,
            observed_generation: p.metadata.generation,
            last_transition_time: since,
        }
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ttdrv_core::machine::Cordon;

    #[test]
    fn a_hand_over_keeps_the_cordon_and_names_the_driver_policy() {
        let mut rec = FwRecord::new("fw", "19.8.0", 0);
        rec.state = FirmwareNodeState::Done;
        rec.cordon = Cordon::None;
        rec.current = Some("19.8.0.0".into());
        let mut node = Node::default();
        node.metadata.resource_version = Some("7".into());
        let next = Step {
            record: rec,
            commands: vec![Command::HandOver("fleet".into())],
            needs_slot: false,
        };
        let p = node_patch(&node, &next, "19.8.0", true);
        assert!(p.get("spec").is_none(), "the cordon stays: {p}");
        let ann = &p["metadata"]["annotations"];
        assert!(ann[fw::CORDONED_BY].is_null() && ann[fw::CORDONED_AT].is_null());
        assert_eq!(ann[ttdrv_api::labels::GO_CORDONED_BY], "fleet");
        assert_eq!(ann[ttdrv_api::labels::CORDON_HANDED_OVER_BY], "fw");
        assert!(ann[ttdrv_api::labels::GO_CORDONED_AT].is_string());
        assert_eq!(p["metadata"]["labels"][fw::FW_VERSION], "19.8.0.0");
        assert_eq!(
            p["metadata"]["resourceVersion"], "7",
            "decided on this Node"
        );
    }
}
