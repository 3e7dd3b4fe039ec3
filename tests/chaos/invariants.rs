//! The safety invariants, checked independently of the controller: its own
//! watches on the test's nodes, installer pods and device users check every
//! event against the invariants (the cordon limits, the admin's cordon, one
//! installer pod per node, no skipped drain, no module swap without the
//! controller's go-ahead), and `final_checks` looks at the nodes once a trial
//! has settled. Kept apart from the faults so that what is checked can be read
//! on its own.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use ttdrv_api::{NodeState, TenstorrentDriverPolicy, labels};
use ttdrv_testkit::TestEnv;

use crate::common::{gate_labels, kmd, unschedulable};
use crate::{GATE, MAX_UNAVAILABLE};

#[derive(Clone, Debug, Default)]
struct NodeSeen {
    unschedulable: bool,
    gate: Option<String>,
    state: Option<String>,
    /// Unix seconds the current cycle started (entered Cordoning), from the record.
    started: Option<i64>,
    no_drain: bool,
    /// The Ready condition is True.
    ready: bool,
    /// The persisted record says the cordon is ours (`cordonedByUs`).
    cordoned_by_us: bool,
    /// The `kmd-version` label: the module the agent reports loaded.
    kmd: Option<String>,
    /// Matched by the policy: not moved out of its selector, not skip-labelled.
    in_policy: bool,
    /// A firmware cycle has the node (our firmware record mid-cycle).
    fw_cycle: bool,
    /// A firmware cycle holds the node: mid-cycle, or its cordon kept (a
    /// failed flash). Its cordon is not the driver's to undo.
    fw_holds: bool,
    /// A driver cycle has the node (its record mid-cycle, or its go-ahead).
    driver_cycle: bool,
}

#[derive(Debug, Default)]
pub(crate) struct Shared {
    /// Trial the observations belong to (for messages).
    pub(crate) trial: usize,
    pub(crate) violations: Vec<String>,
    /// Per trial: most nodes unschedulable at once (admin node excluded / included).
    pub(crate) max_ours: usize,
    pub(crate) max_total: usize,
    /// Per trial: most Ready nodes cordoned by us at once.
    pub(crate) max_ready_ours: usize,
    /// Per trial: module swaps (kmd-version a -> b) checked against the go-ahead.
    pub(crate) swaps: usize,
    /// How to replay what is running now (appended to every violation).
    pub(crate) replay: String,
    pub(crate) node_events: usize,
    pub(crate) pod_events: usize,
    pub(crate) watch_restarts: usize,
    /// Nodes the test cordoned as an administrator.
    pub(crate) admin: BTreeSet<String>,
    /// Latest view of the nodes' records (for the drain invariant).
    records: BTreeMap<String, NodeSeen>,
    /// Live device-using workload pods: name -> (node, unix seconds it was scheduled).
    device_pods: BTreeMap<String, (String, i64)>,
    /// Drain violations already reported (node, pod), reported once each.
    drain_reported: BTreeSet<(String, String)>,
    /// Suspected drain violations being confirmed against the API server.
    confirming: usize,
    /// Whether each node was in the policy at the last node event.
    in_policy: BTreeMap<String, bool>,
    /// Nodes that came back into the policy cordoned by someone else while
    /// the rollout had nodes out of service, with the nodes then unavailable:
    /// not counted by invariant 2 until no more than those are.
    returning: BTreeMap<String, BTreeSet<String>>,
}

#[derive(Clone)]
pub(crate) struct Invariants {
    pub(crate) shared: Arc<Mutex<Shared>>,
    /// For confirming a suspected drain violation with consistent reads: the
    /// node and pod watches are independent, and right after an API-server
    /// restart one may lag the other by seconds (a pod the controller evicted
    /// and saw vanish can still be in the lagging pod watch).
    pub(crate) client: kube::Client,
    pub(crate) ns: String,
    /// The policy whose go-ahead a module swap needs.
    pub(crate) policy: String,
}

impl Invariants {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn violation(&self, what: String) {
        let mut s = self.lock();
        let replay = if s.replay.is_empty() {
            String::new()
        } else {
            format!(" (replay: {})", s.replay)
        };
        let msg = format!("trial {}: {what}{replay}", s.trial);
        eprintln!("VIOLATION {msg}");
        s.violations.push(msg);
    }

    /// A node past Draining (Upgrading or Uncordoning, with a drain) must not
    /// still run a device user that was scheduled there well before its cycle
    /// started: the drain would have been skipped and the module swapped (or
    /// force-unloaded) under a running job.
    fn check_drain(&self, rv: &str) {
        let found: Vec<(String, String, String)> = {
            let mut s = self.lock();
            let mut found = vec![];
            let pods: Vec<(String, String, i64)> = s
                .device_pods
                .iter()
                .map(|(p, (n, t))| (p.clone(), n.clone(), *t))
                .collect();
            for (pod, node, scheduled) in pods {
                let Some(rec) = s.records.get(&node).cloned() else {
                    continue;
                };
                let past_drain = matches!(
                    rec.state.as_deref(),
                    Some("Upgrading") | Some("Uncordoning")
                );
                let before_cycle = rec.started.is_some_and(|st| scheduled + 2 < st);
                if past_drain
                    && !rec.no_drain
                    && before_cycle
                    && s.drain_reported.insert((node.clone(), pod.clone()))
                {
                    found.push((
                        pod.clone(),
                        node.clone(),
                        format!(
                            "drain skipped: device pod {pod} (scheduled at {scheduled}) still runs on {node}, which is {:?} in a cycle started at {:?}, at rv {rv}",
                            rec.state, rec.started
                        ),
                    ));
                }
            }
            found
        };
        for (pod, node, msg) in found {
            self.lock().confirming += 1;
            let inv = self.clone();
            tokio::spawn(async move {
                if inv.drain_skip_confirmed(&pod, &node).await {
                    inv.violation(msg);
                } else {
                    eprintln!("chaos: not confirmed by the API server (watch lag): {msg}");
                }
                inv.lock().confirming -= 1;
            });
        }
    }

    /// Consistent reads: the pod still exists, is not terminating, is bound to
    /// `node`, and the node's record is still past its drain.
    async fn drain_skip_confirmed(&self, pod: &str, node: &str) -> bool {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.ns);
        let nodes: Api<Node> = Api::all(self.client.clone());
        for _ in 0..20 {
            let (p, n) = (pods.get_opt(pod).await, nodes.get_opt(node).await);
            match (p, n) {
                (Ok(p), Ok(n)) => {
                    let runs = p.is_some_and(|p| {
                        p.metadata.deletion_timestamp.is_none()
                            && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
                    });
                    let past_drain = n.is_some_and(|n| {
                        let seen = seen(&n);
                        !seen.no_drain
                            && matches!(
                                seen.state.as_deref(),
                                Some("Upgrading") | Some("Uncordoning")
                            )
                    });
                    return runs && past_drain;
                }
                // The API server may be restarting: ask again.
                _ => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
        // Unreachable for 10 s: report what the watches saw.
        true
    }

    /// Waits (bounded) until suspected violations are confirmed or dropped.
    pub(crate) async fn settle(&self) {
        for _ in 0..60 {
            if self.lock().confirming == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    fn check_nodes(&self, nodes: &BTreeMap<String, NodeSeen>, rv: &str) {
        self.lock().records = nodes.clone();
        self.check_drain(rv);
        let admin = self.lock().admin.clone();
        let cordoned: Vec<&String> = nodes
            .iter()
            .filter(|(_, n)| n.unschedulable)
            .map(|(k, _)| k)
            .collect();
        let ours: Vec<&&String> = cordoned.iter().filter(|n| !admin.contains(**n)).collect();
        let counted = policy_unavailable(&mut self.lock(), nodes, &cordoned);
        // Ready nodes cordoned, whose record says the cordon is ours: what
        // the rollout took out of service (a NotReady node is out anyway).
        let ready_ours: Vec<&String> = nodes
            .iter()
            .filter(|(_, n)| n.ready && n.unschedulable && n.cordoned_by_us)
            .map(|(k, _)| k)
            .collect();
        {
            let mut s = self.lock();
            s.node_events += 1;
            s.max_ours = s.max_ours.max(ours.len());
            s.max_total = s.max_total.max(counted.len());
            s.max_ready_ours = s.max_ready_ours.max(ready_ours.len());
        }
        if ready_ours.len() > MAX_UNAVAILABLE {
            self.violation(format!(
                "{} Ready nodes cordoned by us (max {MAX_UNAVAILABLE}) at rv {rv}: {ready_ours:?}",
                ready_ours.len()
            ));
        }
        if ours.len() > MAX_UNAVAILABLE {
            self.violation(format!(
                "{} nodes unschedulable because of the controller (max {MAX_UNAVAILABLE}) at rv {rv}: {ours:?}",
                ours.len()
            ));
        }
        if counted.len() > MAX_UNAVAILABLE {
            self.violation(format!(
                "{} nodes unavailable counting the admin-cordoned one (max {MAX_UNAVAILABLE}) at rv {rv}: {counted:?}",
                counted.len()
            ));
        }
        // One disruption at a time, and the firmware policy's own cap
        // (`maxParallel` is MAX_UNAVAILABLE in the firmware trials).
        let in_fw: Vec<&String> = nodes
            .iter()
            .filter(|(_, n)| n.fw_cycle)
            .map(|(k, _)| k)
            .collect();
        if in_fw.len() > MAX_UNAVAILABLE {
            self.violation(format!(
                "{} nodes in firmware cycles (maxParallel {MAX_UNAVAILABLE}) at rv {rv}: {in_fw:?}",
                in_fw.len()
            ));
        }
        for (name, n) in nodes {
            if n.fw_cycle && n.driver_cycle {
                self.violation(format!(
                    "node {name} is in a firmware cycle and a driver cycle at once at rv {rv}"
                ));
            }
            if admin.contains(name) && !n.unschedulable {
                self.violation(format!(
                    "admin-cordoned node {name} was uncordoned at rv {rv}"
                ));
            }
            if n.state.as_deref() == Some("Done") {
                // A firmware cycle on the node closes the gates too (its
                // flash, like a swap, must not run under the stack's pods).
                if n.gate.as_deref() == Some("false") && !n.fw_holds {
                    self.violation(format!(
                        "node {name} is Done with deploy gate {GATE}=false at rv {rv}"
                    ));
                }
                if n.unschedulable && !admin.contains(name) && !n.fw_holds {
                    self.violation(format!("node {name} is Done but unschedulable at rv {rv}"));
                }
            }
        }
    }

    /// A module swap (the agent moved `kmd-version` from `from` to `to`) must
    /// have happened under the controller's go-ahead: on the node as it is
    /// right after the change, the agent's own decision
    /// ([`ttdrv_core::go_ahead::decide`]) must be `GoAhead`.
    pub(crate) fn check_swap(&self, n: &Node, from: &str, to: &str, rv: &str) {
        self.lock().swaps += 1;
        // The go-ahead of the policy that claims the node (a `promotion-wait`
        // canary has nodes of its own), else of the policy under test.
        let policy = n
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(labels::CLAIM))
            .unwrap_or(&self.policy);
        let swap = ttdrv_core::go_ahead::decide(
            n,
            policy,
            ttdrv_core::node::Target::version(to),
            Some(from),
            None,
        );
        if !matches!(swap, ttdrv_core::go_ahead::Swap::GoAhead(_)) {
            let name = n.metadata.name.as_deref().unwrap_or_default();
            self.violation(format!(
                "module swapped without the go-ahead on {name}: {from} -> {to} at rv {rv}; the agent's decision on that object: {swap:?}; record {:?}",
                n.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(labels::UPGRADE_STATE))
            ));
        }
    }

    fn check_pods(&self, pods: &BTreeMap<String, (String, bool)>, rv: &str) {
        self.lock().pod_events += 1;
        let mut per_node: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (name, (node, terminating)) in pods {
            if !terminating && !node.is_empty() {
                per_node.entry(node).or_default().push(name);
            }
        }
        for (node, names) in per_node {
            if names.len() > 1 {
                self.violation(format!(
                    "{} live installer pods on node {node} at rv {rv}: {names:?}",
                    names.len()
                ));
            }
        }
    }

    fn watch_error(&self, what: &str, e: &watcher::Error) {
        let mut s = self.lock();
        s.watch_restarts += 1;
        if s.watch_restarts % 10 == 1 {
            eprintln!("invariant watcher: {what} watch error ({e}); restarting with backoff");
        }
    }
}

/// The unschedulable nodes invariant 2 counts against the policy's budget:
/// those in the policy, and those still cordoned by us wherever they are.
/// A node cordoned by someone else does not count while it is out of the
/// policy (`relabel` trials), since the policy's `maxUnavailable` is over
/// its own nodes. When such a node comes back into the policy while the
/// rollout has nodes out, the overshoot is not the controller's doing: the
/// node is left out of the count until the nodes then unavailable are all
/// that is unavailable besides it no more (one finished, or another
/// started: then it counts again).
fn policy_unavailable(
    s: &mut Shared,
    nodes: &BTreeMap<String, NodeSeen>,
    cordoned: &[&String],
) -> Vec<String> {
    let base: Vec<String> = cordoned
        .iter()
        .filter(|k| {
            nodes
                .get(**k)
                .is_some_and(|n| n.in_policy || n.cordoned_by_us)
        })
        .map(|k| (*k).clone())
        .collect();
    for (name, n) in nodes {
        let was_in = s.in_policy.get(name).copied().unwrap_or(true);
        if n.in_policy && !was_in && n.unschedulable && !n.cordoned_by_us {
            let others: BTreeSet<String> = base.iter().filter(|k| *k != name).cloned().collect();
            if others.len() >= MAX_UNAVAILABLE {
                eprintln!(
                    "chaos: {name} came back into the policy cordoned by someone else while {others:?} were unavailable; counted again once those are done"
                );
                s.returning.insert(name.clone(), others);
            }
        }
    }
    s.in_policy = nodes
        .iter()
        .map(|(k, n)| (k.clone(), n.in_policy))
        .collect();
    s.returning.retain(|name, then| {
        let others: Vec<&String> = base.iter().filter(|k| *k != name).collect();
        base.contains(name)
            && others.len() >= MAX_UNAVAILABLE
            && others.iter().all(|o| then.contains(*o))
    });
    base.into_iter()
        .filter(|k| !s.returning.contains_key(k))
        .collect()
}

fn seen(n: &Node) -> NodeSeen {
    let rec = n
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(labels::UPGRADE_STATE))
        .and_then(|raw| serde_json::from_str::<serde_json::Value>(raw).ok())
        .unwrap_or_default();
    let state = rec["state"].as_str().map(String::from);
    NodeSeen {
        started: rec["started"].as_i64(),
        no_drain: rec["noDrain"].as_bool().unwrap_or(false),
        ready: ttdrv_core::node::ready(n),
        cordoned_by_us: ttdrv_core::node::record(n)
            .ok()
            .flatten()
            .is_some_and(|r| r.cordoned_by_us()),
        kmd: kmd(n),
        in_policy: {
            let l = n.metadata.labels.clone().unwrap_or_default();
            l.get(labels::TT_PCI_PRESENT).map(String::as_str) == Some("true")
                && !l.contains_key(labels::SKIP)
                && l.get(crate::OUT_LABEL).map(String::as_str) != Some(crate::OUT_VALUE)
        },
        fw_cycle: ttdrv_core::claim::firmware_record(n).is_some_and(|r| r.state.is_in_progress()),
        driver_cycle: ttdrv_core::claim::driver_cycle(n).is_some(),
        fw_holds: ttdrv_core::claim::firmware_cycle(n).is_some(),
        unschedulable: unschedulable(n),
        gate: n
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(GATE).cloned()),
        state,
    }
}

fn rv_of<K: kube::Resource>(o: &K) -> String {
    o.meta().resource_version.clone().unwrap_or_default()
}

pub(crate) fn record_state(n: &Node) -> Option<String> {
    seen(n).state
}

/// Watches this test's nodes and installer pods; every event is checked
/// against the invariants on the full, consistent state at that revision.
pub(crate) fn spawn_invariant_watchers(
    env: &TestEnv,
    ns: &str,
    inv: Invariants,
) -> Vec<tokio::task::JoinHandle<()>> {
    let nodes_api: Api<Node> = Api::all(env.client.clone());
    let cfg = watcher::Config::default().labels(&env.selector());
    let i1 = inv.clone();
    let nodes_task = tokio::spawn(async move {
        let mut state: BTreeMap<String, NodeSeen> = BTreeMap::new();
        let mut buffer: BTreeMap<String, NodeSeen> = BTreeMap::new();
        let mut stream = watcher::watcher(nodes_api, cfg).default_backoff().boxed();
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(Event::Init) => buffer.clear(),
                Ok(Event::InitApply(n)) => {
                    buffer.insert(n.metadata.name.clone().unwrap_or_default(), seen(&n));
                }
                Ok(Event::InitDone) => {
                    state = std::mem::take(&mut buffer);
                    i1.check_nodes(&state, "(relist)");
                }
                Ok(Event::Apply(n)) => {
                    let now = seen(&n);
                    let name = n.metadata.name.clone().unwrap_or_default();
                    // Only between two events of one watch: across a relist
                    // the object is not the one the change was made on.
                    if let (Some(from), Some(to)) = (
                        state.get(&name).and_then(|s| s.kmd.as_deref()),
                        now.kmd.as_deref(),
                    ) && from != to
                    {
                        i1.check_swap(&n, from, to, &rv_of(&n));
                    }
                    state.insert(name, now);
                    i1.check_nodes(&state, &rv_of(&n));
                }
                Ok(Event::Delete(n)) => {
                    state.remove(n.metadata.name.as_deref().unwrap_or_default());
                    i1.check_nodes(&state, &rv_of(&n));
                }
                Err(e) => i1.watch_error("node", &e),
            }
        }
    });
    let pods_api: Api<Pod> = Api::namespaced(env.client.clone(), ns);
    let pcfg = watcher::Config::default().labels(labels::CLAIM);
    let i2 = inv.clone();
    let i2_clone = inv;
    let pods_task = tokio::spawn(async move {
        let key = |p: &Pod| {
            (
                p.metadata.name.clone().unwrap_or_default(),
                (
                    p.spec
                        .as_ref()
                        .and_then(|s| s.node_name.clone())
                        .unwrap_or_default(),
                    p.metadata.deletion_timestamp.is_some(),
                ),
            )
        };
        let mut state: BTreeMap<String, (String, bool)> = BTreeMap::new();
        let mut buffer = BTreeMap::new();
        let mut stream = watcher::watcher(pods_api, pcfg).default_backoff().boxed();
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(Event::Init) => buffer.clear(),
                Ok(Event::InitApply(p)) => {
                    let (k, v) = key(&p);
                    buffer.insert(k, v);
                }
                Ok(Event::InitDone) => {
                    state = std::mem::take(&mut buffer);
                    i2.check_pods(&state, "(relist)");
                }
                Ok(Event::Apply(p)) => {
                    let (k, v) = key(&p);
                    state.insert(k, v);
                    i2.check_pods(&state, &rv_of(&p));
                }
                Ok(Event::Delete(p)) => {
                    state.remove(p.metadata.name.as_deref().unwrap_or_default());
                    i2.check_pods(&state, &rv_of(&p));
                }
                Err(e) => i2.watch_error("pod", &e),
            }
        }
    });
    // Device users of the workload (label app=train): where and since when.
    let dev_api: Api<Pod> = Api::namespaced(env.client.clone(), ns);
    let dcfg = watcher::Config::default().labels("app=train");
    let i3 = i2_clone;
    let dev_task = tokio::spawn(async move {
        let entry = |p: &Pod| -> Option<(String, (String, i64))> {
            if p.metadata.deletion_timestamp.is_some() {
                return None;
            }
            let node = p.spec.as_ref()?.node_name.clone()?;
            // When it was bound: PodScheduled, or its creation for a pod
            // created with spec.nodeName (never seen by the scheduler).
            let scheduled = p
                .status
                .as_ref()
                .and_then(|st| st.conditions.as_ref())
                .and_then(|cs| {
                    cs.iter()
                        .find(|c| c.type_ == "PodScheduled" && c.status == "True")
                })
                .and_then(|c| c.last_transition_time.as_ref())
                .or(p.metadata.creation_timestamp.as_ref())?
                .0
                .as_second();
            Some((p.metadata.name.clone()?, (node, scheduled)))
        };
        let mut stream = watcher::watcher(dev_api, dcfg).default_backoff().boxed();
        let mut buffer = BTreeMap::new();
        while let Some(ev) = stream.next().await {
            let rv = match &ev {
                Ok(Event::Apply(p)) | Ok(Event::Delete(p)) => rv_of(p),
                _ => "(relist)".to_string(),
            };
            match ev {
                Ok(Event::Init) => {
                    buffer.clear();
                    continue;
                }
                Ok(Event::InitApply(p)) => {
                    if let Some((k, v)) = entry(&p) {
                        buffer.insert(k, v);
                    }
                    continue;
                }
                Ok(Event::InitDone) => {
                    i3.lock().device_pods = std::mem::take(&mut buffer);
                }
                Ok(Event::Apply(p)) => {
                    let name = p.metadata.name.clone().unwrap_or_default();
                    let mut s = i3.lock();
                    match entry(&p) {
                        Some((k, v)) => s.device_pods.insert(k, v),
                        None => s.device_pods.remove(&name),
                    };
                }
                Ok(Event::Delete(p)) => {
                    let name = p.metadata.name.clone().unwrap_or_default();
                    i3.lock().device_pods.remove(&name);
                }
                Err(e) => {
                    i3.watch_error("device pod", &e);
                    continue;
                }
            }
            i3.check_drain(&rv);
        }
    });
    vec![nodes_task, pods_task, dev_task]
}

/// The end-of-trial checks on the nodes themselves. With `require_done`
/// (the kinds whose faults are no reason for a node to fail) a Failed node is
/// a violation too.
pub(crate) fn final_checks(
    nodes: &[Node],
    admin: &BTreeSet<String>,
    version: &str,
    inv: &Invariants,
    p: &TenstorrentDriverPolicy,
    require_done: bool,
) {
    let st = p.status.clone().unwrap_or_default();
    for n in nodes {
        let name = n.metadata.name.clone().unwrap_or_default();
        let entry = st.nodes.iter().find(|e| e.name == name);
        let state = entry.map(|e| e.state);
        let gates = gate_labels(n);
        match state {
            Some(NodeState::Done) => {
                if admin.contains(&name) {
                    if !unschedulable(n) {
                        inv.violation(format!("at the end, admin-cordoned {name} is schedulable"));
                    }
                } else if unschedulable(n) {
                    inv.violation(format!("at the end, Done node {name} is unschedulable"));
                }
                if gates.iter().any(|g| g.ends_with("=false")) {
                    inv.violation(format!("at the end, Done node {name} has gates {gates:?}"));
                }
                if kmd(n).as_deref() != Some(version) {
                    inv.violation(format!(
                        "at the end, Done node {name} runs {:?}, not {version}",
                        kmd(n)
                    ));
                }
            }
            Some(NodeState::Failed) => {
                let reason = entry.and_then(|e| e.reason.clone());
                eprintln!(
                    "  node {name} Failed: {reason:?} {:?}",
                    entry.and_then(|e| e.message.clone())
                );
                if reason.is_none() {
                    inv.violation(format!("at the end, {name} is Failed without a reason"));
                } else if require_done {
                    inv.violation(format!(
                        "at the end, {name} is Failed ({reason:?}: {:?}); this trial's faults are no reason to fail a node",
                        entry.and_then(|e| e.message.clone())
                    ));
                }
            }
            other => inv.violation(format!("at the end, {name} is {other:?}")),
        }
    }
}

/// After a `relabel` trial: every node is back in the policy (neither moved
/// out of its selector nor skip-labelled, and claimed by it again).
pub(crate) fn back_in_policy(nodes: &[Node], policy: &str, inv: &Invariants) {
    for n in nodes {
        let name = n.metadata.name.clone().unwrap_or_default();
        let l = n.metadata.labels.clone().unwrap_or_default();
        if l.get(crate::OUT_LABEL).map(String::as_str) == Some(crate::OUT_VALUE)
            || l.contains_key(labels::SKIP)
        {
            inv.violation(format!(
                "at the end, {name} is still out of the policy (labels {l:?})"
            ));
        }
        if l.get(labels::CLAIM).map(String::as_str) != Some(policy) {
            inv.violation(format!(
                "at the end, {name} is not claimed by {policy}: {}={:?}",
                labels::CLAIM,
                l.get(labels::CLAIM)
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(unschedulable: bool, ours: bool, in_policy: bool) -> NodeSeen {
        NodeSeen {
            unschedulable,
            cordoned_by_us: ours,
            in_policy,
            ready: true,
            ..Default::default()
        }
    }

    fn count(s: &mut Shared, nodes: &[(&str, NodeSeen)]) -> Vec<String> {
        let nodes: BTreeMap<String, NodeSeen> = nodes
            .iter()
            .map(|(k, n)| (k.to_string(), n.clone()))
            .collect();
        let cordoned: Vec<&String> = nodes
            .iter()
            .filter(|(_, n)| n.unschedulable)
            .map(|(k, _)| k)
            .collect();
        policy_unavailable(s, &nodes, &cordoned)
    }

    #[test]
    fn someone_elses_cordon_counts_only_inside_the_policy() {
        let mut s = Shared::default();
        // a: the admin's cordon; b, c: ours.
        let (b, c) = (node(true, true, true), node(true, true, true));
        assert_eq!(count(&mut s, &[("a", node(true, false, true))]), ["a"]);
        // a leaves the policy: two of ours are within the budget.
        let out = node(true, false, false);
        assert_eq!(
            count(
                &mut s,
                &[("a", out.clone()), ("b", b.clone()), ("c", c.clone())]
            ),
            ["b", "c"]
        );
        // a comes back while b and c are out: not the controller's doing.
        let back = node(true, false, true);
        assert_eq!(
            count(
                &mut s,
                &[("a", back.clone()), ("b", b.clone()), ("c", c.clone())]
            ),
            ["b", "c"]
        );
        // c finishes: a counts again.
        let done = node(false, false, true);
        assert_eq!(
            count(
                &mut s,
                &[("a", back.clone()), ("b", b.clone()), ("c", done.clone())]
            ),
            ["a", "b"]
        );
        // A node of ours out of the policy still counts.
        assert_eq!(
            count(
                &mut s,
                &[("a", back), ("b", node(true, true, false)), ("c", done)]
            ),
            ["a", "b"]
        );
    }

    #[test]
    fn a_node_started_beside_a_returned_one_counts_it_again() {
        let mut s = Shared::default();
        let ours = node(true, true, true);
        let out = node(true, false, false);
        let back = node(true, false, true);
        count(
            &mut s,
            &[("a", out), ("b", ours.clone()), ("c", ours.clone())],
        );
        assert_eq!(
            count(
                &mut s,
                &[
                    ("a", back.clone()),
                    ("b", ours.clone()),
                    ("c", ours.clone())
                ]
            ),
            ["b", "c"]
        );
        // c finishes and d starts at once: the budget is overrun again.
        assert_eq!(
            count(
                &mut s,
                &[
                    ("a", back),
                    ("b", ours.clone()),
                    ("c", node(false, false, true)),
                    ("d", ours)
                ]
            ),
            ["a", "b", "d"]
        );
    }
}
