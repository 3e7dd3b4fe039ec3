//! Prometheus metrics of the controller.
//!
//! Every metric is named `ttdriver_*`. The names and labels of the Go operator we
//! replace (`ttdriver_policy_nodes`, `ttdriver_nodes_by_kmd_version`,
//! `ttdriver_policy_desired_version`, `ttdriver_pods_evicted_total`,
//! `ttdriver_drain_blocked_total`, `ttdriver_errors_total`,
//! `ttdriver_last_successful_reconcile_timestamp_seconds`) are kept as they were;
//! docs/metrics.md lists all of them, with example queries.
//!
//! The families are kept in our own small collector rather than in the crate's
//! `*Vec` types, for two reasons:
//! - deleting a node or a policy must drop every series carrying that `cr` (and
//!   `node`) label, whatever the other labels are; the `*Vec` types can only
//!   remove one fully specified label set;
//! - the `*Vec` types key a series by a hash of its label values concatenated
//!   without a separator, so `{cr="prod",version="12.8.0"}` and
//!   `{cr="prod1",version="2.8.0"}` would share one series. Here a series is keyed
//!   by the list of its label values.
//!
//! Registration, text encoding and escaping are the `prometheus` crate's.
//!
//! `Metrics` is `Send + Sync`; share it behind an `Arc`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use prometheus::core::{Collector, Desc};
use prometheus::proto;
use prometheus::{Encoder, Registry, TextEncoder};
use ttdrv_api::NodeState;

/// Content type of the text exposition format this module writes.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `reason` label values of `ttdriver_node_failures_total`; anything else is
/// reported as `Other`.
pub const FAILURE_REASONS: [&str; 6] = [
    "DrainTimeout",
    "UpgradeTimeout",
    "AgentFailed",
    "EvictionError",
    "PatchError",
    "Other",
];

/// `pass` label values of the eviction counters.
pub const EVICTION_PASSES: [&str; 2] = ["device", "full"];

/// `state` label value of `ttdriver_policy_nodes` for host-managed (DKMS) nodes.
pub const HOST_MANAGED: &str = "HostManaged";

/// Buckets for the time a node spends in one phase: one second to an hour.
pub const PHASE_BUCKETS: &[f64] = &[
    1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 180.0, 300.0, 450.0, 600.0, 900.0, 1200.0,
    1800.0, 2700.0, 3600.0,
];

/// Buckets for a whole node cycle (Cordoning start to Done): ten seconds to two hours.
pub const NODE_UPGRADE_BUCKETS: &[f64] = &[
    10.0, 30.0, 60.0, 120.0, 180.0, 300.0, 450.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0,
    5400.0, 7200.0,
];

/// Buckets for one reconcile pass: five milliseconds to a minute.
pub const RECONCILE_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

#[derive(Clone, Copy, Debug)]
enum Kind {
    Gauge,
    Counter,
    Histogram(&'static [f64]),
}

#[derive(Clone, Debug)]
enum Value {
    Scalar(f64),
    /// Per-bucket (not cumulative) counts, one per bound, plus the overflow.
    Histogram {
        counts: Vec<u64>,
        sum: f64,
        count: u64,
    },
}

/// One metric family: a name, fixed label names and the live series.
#[derive(Debug)]
struct Family {
    desc: Desc,
    labels: &'static [&'static str],
    kind: Kind,
    series: Mutex<BTreeMap<Vec<String>, Value>>,
}

impl Family {
    fn new(name: &str, help: &str, labels: &'static [&'static str], kind: Kind) -> Arc<Self> {
        let desc = Desc::new(
            name.to_string(),
            help.to_string(),
            labels.iter().map(|l| l.to_string()).collect(),
            Default::default(),
        )
        .unwrap_or_else(|e| panic!("metric {name}: invalid descriptor: {e}"));
        Arc::new(Family {
            desc,
            labels,
            kind,
            series: Mutex::new(BTreeMap::new()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<Vec<String>, Value>> {
        // A panic while holding the lock leaves the map consistent (every update
        // is a single insert or remove), so a poisoned lock is still usable.
        self.series.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn key(&self, values: &[&str]) -> Option<Vec<String>> {
        if values.len() != self.labels.len() {
            debug_assert!(
                false,
                "{}: {} label values for {:?}",
                self.desc.fq_name,
                values.len(),
                self.labels
            );
            tracing::warn!(metric = %self.desc.fq_name, ?values, "wrong number of label values; sample dropped");
            return None;
        }
        Some(values.iter().map(|v| v.to_string()).collect())
    }

    fn zero(&self) -> Value {
        match self.kind {
            Kind::Gauge | Kind::Counter => Value::Scalar(0.0),
            Kind::Histogram(bounds) => Value::Histogram {
                counts: vec![0; bounds.len() + 1],
                sum: 0.0,
                count: 0,
            },
        }
    }

    /// Sets several series of the family under one lock, so a scrape never sees
    /// half of the update (e.g. two node states at 1).
    fn set_many(&self, series: &[(&[&str], f64)]) {
        let keyed: Option<Vec<(Vec<String>, f64)>> = series
            .iter()
            .map(|(values, v)| self.key(values).map(|k| (k, *v)))
            .collect();
        let Some(keyed) = keyed else { return };
        let mut map = self.lock();
        for (k, v) in keyed {
            map.insert(k, Value::Scalar(v));
        }
    }

    fn set(&self, values: &[&str], v: f64) {
        if let Some(k) = self.key(values) {
            self.lock().insert(k, Value::Scalar(v));
        }
    }

    fn add(&self, values: &[&str], v: f64) {
        let Some(k) = self.key(values) else { return };
        let zero = self.zero();
        if let Value::Scalar(x) = self.lock().entry(k).or_insert(zero) {
            *x += v;
        }
    }

    /// Creates the series at zero if it does not exist yet, so that counters
    /// are visible (and `rate()` sees their first increment) before anything
    /// happened.
    fn touch(&self, values: &[&str]) {
        let Some(k) = self.key(values) else { return };
        let zero = self.zero();
        self.lock().entry(k).or_insert(zero);
    }

    fn observe(&self, values: &[&str], v: f64) {
        let Kind::Histogram(bounds) = self.kind else {
            return;
        };
        if !v.is_finite() {
            return;
        }
        let Some(k) = self.key(values) else { return };
        let zero = self.zero();
        if let Value::Histogram { counts, sum, count } = self.lock().entry(k).or_insert(zero) {
            let i = bounds.iter().position(|b| v <= *b).unwrap_or(bounds.len());
            if let Some(c) = counts.get_mut(i) {
                *c += 1;
            }
            *sum += v;
            *count += 1;
        }
    }

    fn label_index(&self, name: &str) -> Option<usize> {
        self.labels.iter().position(|l| *l == name)
    }

    /// Removes every series whose labels match all of `(name, value)`. A family
    /// lacking one of the labels is left alone.
    fn remove_matching(&self, matchers: &[(&str, &str)]) {
        let idx: Option<Vec<(usize, &str)>> = matchers
            .iter()
            .map(|(n, v)| self.label_index(n).map(|i| (i, *v)))
            .collect();
        let Some(idx) = idx else { return };
        self.lock().retain(|k, _| {
            !idx.iter()
                .all(|(i, v)| k.get(*i).map(String::as_str) == Some(*v))
        });
    }

    fn retain(&self, keep: impl Fn(&[String]) -> bool) {
        self.lock().retain(|k, _| keep(k));
    }

    fn replace(&self, series: BTreeMap<Vec<String>, Value>) {
        *self.lock() = series;
    }

    fn to_proto(&self) -> proto::MetricFamily {
        let series = self.lock();
        let mut metrics = Vec::with_capacity(series.len());
        for (key, value) in series.iter() {
            let mut m = proto::Metric::default();
            m.set_label(
                self.labels
                    .iter()
                    .zip(key)
                    .map(|(n, v)| {
                        let mut lp = proto::LabelPair::default();
                        lp.set_name(n.to_string());
                        lp.set_value(v.clone());
                        lp
                    })
                    .collect(),
            );
            match (self.kind, value) {
                (Kind::Gauge, Value::Scalar(v)) => {
                    let mut g = proto::Gauge::default();
                    g.set_value(*v);
                    m.set_gauge(g);
                }
                (Kind::Counter, Value::Scalar(v)) => {
                    let mut c = proto::Counter::default();
                    c.set_value(*v);
                    m.set_counter(c);
                }
                (Kind::Histogram(bounds), Value::Histogram { counts, sum, count }) => {
                    let mut h = proto::Histogram::default();
                    let mut cumulative = 0;
                    let mut buckets = Vec::with_capacity(bounds.len());
                    for (b, c) in bounds.iter().zip(counts) {
                        cumulative += c;
                        let mut bucket = proto::Bucket::default();
                        bucket.set_upper_bound(*b);
                        bucket.set_cumulative_count(cumulative);
                        buckets.push(bucket);
                    }
                    h.set_bucket(buckets);
                    h.set_sample_sum(*sum);
                    h.set_sample_count(*count);
                    m.set_histogram(h);
                }
                _ => continue,
            }
            metrics.push(m);
        }
        let mut mf = proto::MetricFamily::default();
        mf.set_name(self.desc.fq_name.clone());
        mf.set_help(self.desc.help.clone());
        mf.set_field_type(match self.kind {
            Kind::Gauge => proto::MetricType::GAUGE,
            Kind::Counter => proto::MetricType::COUNTER,
            Kind::Histogram(_) => proto::MetricType::HISTOGRAM,
        });
        mf.set_metric(metrics);
        mf
    }
}

/// Registers one family in the registry; the registry and `Metrics` share it.
struct FamilyCollector(Arc<Family>);

impl Collector for FamilyCollector {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.0.desc]
    }

    fn collect(&self) -> Vec<proto::MetricFamily> {
        vec![self.0.to_proto()]
    }
}

fn now_unix_seconds() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn bool_value(b: bool) -> f64 {
    if b { 1.0 } else { 0.0 }
}

/// Maps a failure reason onto the bounded set of `FAILURE_REASONS`.
pub fn failure_reason(reason: &str) -> &'static str {
    FAILURE_REASONS
        .iter()
        .copied()
        .find(|r| *r == reason)
        .unwrap_or("Other")
}

/// The controller's metrics: a private registry plus every collector.
pub struct Metrics {
    registry: Registry,
    all: Vec<Arc<Family>>,
    /// Policies whose fixed-label counters have been created at zero.
    known_crs: Mutex<BTreeSet<String>>,
    is_leader: AtomicBool,

    build_info: Arc<Family>,
    leader: Arc<Family>,
    node_state: Arc<Family>,
    node_state_since: Arc<Family>,
    node_deploy_gate_closed: Arc<Family>,
    node_transitions: Arc<Family>,
    phase_duration: Arc<Family>,
    node_upgrade_duration: Arc<Family>,
    node_failures: Arc<Family>,
    policy_nodes: Arc<Family>,
    policy_paused: Arc<Family>,
    policy_desired_version: Arc<Family>,
    nodes_by_kmd_version: Arc<Family>,
    pods_evicted: Arc<Family>,
    drain_blocked: Arc<Family>,
    errors: Arc<Family>,
    last_successful_reconcile: Arc<Family>,
    reconcile_total: Arc<Family>,
    reconcile_duration: Arc<Family>,
    rollout_max_unavailable: Arc<Family>,
    rollout_unavailable: Arc<Family>,
    actor_restarts: Arc<Family>,
    actor_mailbox_full: Arc<Family>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// Creates and registers every metric, and sets `ttdriver_build_info{version}` to 1.
    ///
    /// Panics only if the metric definitions themselves are invalid (a bug caught
    /// by the unit tests), never because of input.
    pub fn new(build_version: &str) -> Self {
        use Kind::*;
        let g = |name, help, labels| Family::new(name, help, labels, Gauge);
        let c = |name, help, labels| Family::new(name, help, labels, Counter);
        let h = |name, help, labels, buckets| Family::new(name, help, labels, Histogram(buckets));

        let build_info = g(
            "ttdriver_build_info",
            "Always 1; the version label carries the controller's build version.",
            &["version"],
        );
        let leader = g(
            "ttdriver_leader",
            "1 if this controller replica holds the leader lease and drives rollouts, else 0.",
            &[],
        );
        let node_state = g(
            "ttdriver_node_state",
            "Upgrade state of a node: one series per state, the current one 1 and the others 0.",
            &["cr", "node", "state"],
        );
        let node_state_since = g(
            "ttdriver_node_state_since_timestamp_seconds",
            "Unix time at which the node entered its current upgrade state.",
            &["cr", "node"],
        );
        let node_deploy_gate_closed = g(
            "ttdriver_node_deploy_gate_closed",
            "1 while the controller holds the deploy-gate label of the node at \"false\", else 0.",
            &["cr", "node", "gate"],
        );
        let node_transitions = c(
            "ttdriver_node_transitions_total",
            "Node upgrade state transitions, by from and to state.",
            &["cr", "from", "to"],
        );
        let phase_duration = h(
            "ttdriver_phase_duration_seconds",
            "Time a node spent in one upgrade state, observed when it leaves that state.",
            &["cr", "phase"],
            PHASE_BUCKETS,
        );
        let node_upgrade_duration = h(
            "ttdriver_node_upgrade_duration_seconds",
            "Time of a whole node upgrade, from the start of Cordoning to Done.",
            &["cr"],
            NODE_UPGRADE_BUCKETS,
        );
        let node_failures = c(
            "ttdriver_node_failures_total",
            "Nodes that entered Failed, by reason (DrainTimeout, UpgradeTimeout, AgentFailed, EvictionError, PatchError, Other).",
            &["cr", "reason"],
        );
        let policy_nodes = g(
            "ttdriver_policy_nodes",
            "Nodes matched by the policy, by upgrade state; state=\"HostManaged\" counts nodes with a host (DKMS) install.",
            &["cr", "state"],
        );
        let policy_paused = g(
            "ttdriver_policy_paused",
            "1 if the policy has spec.paused=true, else 0.",
            &["cr"],
        );
        let policy_desired_version = g(
            "ttdriver_policy_desired_version",
            "Always 1; the version label carries the policy's spec.version.",
            &["cr", "version"],
        );
        let nodes_by_kmd_version = g(
            "ttdriver_nodes_by_kmd_version",
            "Nodes by loaded tt-kmd version and install mode, from the node labels.",
            &["version", "install_mode"],
        );
        let pods_evicted = c(
            "ttdriver_pods_evicted_total",
            "Pods evicted while draining, by pass (device: pods using /dev/tenstorrent; full: every other pod).",
            &["cr", "pass"],
        );
        let drain_blocked = c(
            "ttdriver_drain_blocked_total",
            "Evictions refused (PodDisruptionBudget or error) while draining, by pass.",
            &["cr", "pass"],
        );
        let errors = c(
            "ttdriver_errors_total",
            "Errors of the controller, by stage.",
            &["cr", "stage"],
        );
        let last_successful_reconcile = g(
            "ttdriver_last_successful_reconcile_timestamp_seconds",
            "Unix time of the last reconcile of the policy that ended without error.",
            &["cr"],
        );
        let reconcile_total = c(
            "ttdriver_reconcile_total",
            "Reconcile passes of a policy, by result (ok or error).",
            &["cr", "result"],
        );
        let reconcile_duration = h(
            "ttdriver_reconcile_duration_seconds",
            "Duration of one reconcile pass of a policy.",
            &["cr"],
            RECONCILE_BUCKETS,
        );
        let rollout_max_unavailable = g(
            "ttdriver_rollout_max_unavailable",
            "The policy's maxUnavailable, resolved to a number of nodes.",
            &["cr"],
        );
        let rollout_unavailable = g(
            "ttdriver_rollout_unavailable_nodes",
            "Nodes of the policy currently out of service because of the rollout (Cordoning to Uncordoning, and Failed).",
            &["cr"],
        );
        let actor_restarts = c(
            "ttdriver_actor_restarts_total",
            "Restarts of a supervised actor, by actor kind.",
            &["actor"],
        );
        let actor_mailbox_full = c(
            "ttdriver_actor_mailbox_full_total",
            "Messages refused because the actor's mailbox was full, by actor kind.",
            &["actor"],
        );

        let all = vec![
            build_info.clone(),
            leader.clone(),
            node_state.clone(),
            node_state_since.clone(),
            node_deploy_gate_closed.clone(),
            node_transitions.clone(),
            phase_duration.clone(),
            node_upgrade_duration.clone(),
            node_failures.clone(),
            policy_nodes.clone(),
            policy_paused.clone(),
            policy_desired_version.clone(),
            nodes_by_kmd_version.clone(),
            pods_evicted.clone(),
            drain_blocked.clone(),
            errors.clone(),
            last_successful_reconcile.clone(),
            reconcile_total.clone(),
            reconcile_duration.clone(),
            rollout_max_unavailable.clone(),
            rollout_unavailable.clone(),
            actor_restarts.clone(),
            actor_mailbox_full.clone(),
        ];
        let registry = Registry::new();
        for f in &all {
            let name = f.desc.fq_name.clone();
            registry
                .register(Box::new(FamilyCollector(f.clone())))
                .unwrap_or_else(|e| panic!("registering metric {name}: {e}"));
        }

        build_info.set(&[build_version], 1.0);
        leader.set(&[], 0.0);

        Metrics {
            registry,
            all,
            known_crs: Mutex::new(BTreeSet::new()),
            is_leader: AtomicBool::new(false),
            build_info,
            leader,
            node_state,
            node_state_since,
            node_deploy_gate_closed,
            node_transitions,
            phase_duration,
            node_upgrade_duration,
            node_failures,
            policy_nodes,
            policy_paused,
            policy_desired_version,
            nodes_by_kmd_version,
            pods_evicted,
            drain_blocked,
            errors,
            last_successful_reconcile,
            reconcile_total,
            reconcile_duration,
            rollout_max_unavailable,
            rollout_unavailable,
            actor_restarts,
            actor_mailbox_full,
        }
    }

    /// The text exposition of every metric, with its content type
    /// (`text/plain; version=0.0.4; charset=utf-8`).
    pub fn encode(&self) -> (&'static str, Vec<u8>) {
        let mut buf = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            // Only reachable through an inconsistent family, which the unit tests rule out.
            tracing::error!(error = %e, "encoding metrics failed");
        }
        (CONTENT_TYPE, buf)
    }

    /// Creates the fixed-label counters of a policy at zero the first time the
    /// policy is seen, so dashboards and `rate()` see them before the first event.
    fn ensure_cr(&self, cr: &str) {
        let mut known = self.known_crs.lock().unwrap_or_else(|e| e.into_inner());
        if known.contains(cr) {
            return;
        }
        known.insert(cr.to_string());
        drop(known);
        for reason in FAILURE_REASONS {
            self.node_failures.touch(&[cr, reason]);
        }
        for pass in EVICTION_PASSES {
            self.pods_evicted.touch(&[cr, pass]);
            self.drain_blocked.touch(&[cr, pass]);
        }
        for result in ["ok", "error"] {
            self.reconcile_total.touch(&[cr, result]);
        }
    }

    /// `ttdriver_node_state{cr,node,state}`: all seven states, the current one 1.
    pub fn set_node_state(&self, cr: &str, node: &str, state: NodeState) {
        self.ensure_cr(cr);
        let labels = NodeState::ALL.map(|s| [cr, node, s.as_str()]);
        let series: Vec<(&[&str], f64)> = NodeState::ALL
            .iter()
            .zip(&labels)
            .map(|(s, l)| (&l[..], bool_value(*s == state)))
            .collect();
        self.node_state.set_many(&series);
    }

    /// Removes every per-node series (state, state-since, deploy gates) of `node` under `cr`.
    pub fn forget_node(&self, cr: &str, node: &str) {
        for f in &self.all {
            f.remove_matching(&[("cr", cr), ("node", node)]);
        }
    }

    /// Removes every series labelled with `cr`.
    pub fn forget_policy(&self, cr: &str) {
        for f in &self.all {
            f.remove_matching(&[("cr", cr)]);
        }
        self.known_crs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(cr);
    }

    /// Counts a transition (`ttdriver_node_transitions_total{cr,from,to}`) and
    /// observes the time spent in `from` (`ttdriver_phase_duration_seconds{cr,phase=from}`).
    pub fn observe_transition(
        &self,
        cr: &str,
        from: NodeState,
        to: NodeState,
        seconds_in_from: f64,
    ) {
        self.ensure_cr(cr);
        self.node_transitions
            .add(&[cr, from.as_str(), to.as_str()], 1.0);
        if seconds_in_from >= 0.0 {
            self.phase_duration
                .observe(&[cr, from.as_str()], seconds_in_from);
        }
    }

    /// `ttdriver_node_upgrade_duration_seconds{cr}`: Cordoning start to Done.
    pub fn observe_node_upgrade(&self, cr: &str, seconds: f64) {
        self.ensure_cr(cr);
        if seconds >= 0.0 {
            self.node_upgrade_duration.observe(&[cr], seconds);
        }
    }

    /// `ttdriver_node_failures_total{cr,reason}`; an unknown reason counts as `Other`.
    pub fn inc_failure(&self, cr: &str, reason: &str) {
        self.ensure_cr(cr);
        self.node_failures.add(&[cr, failure_reason(reason)], 1.0);
    }

    /// `ttdriver_policy_nodes{cr,state}`: every NodeState is emitted, states
    /// missing from `counts` as 0. The `HostManaged` series is set separately by
    /// [`Metrics::set_policy_host_managed`].
    pub fn set_policy_nodes(&self, cr: &str, counts: &[(NodeState, i64)]) {
        self.ensure_cr(cr);
        let labels = NodeState::ALL.map(|s| [cr, s.as_str()]);
        let series: Vec<(&[&str], f64)> = NodeState::ALL
            .iter()
            .zip(&labels)
            .map(|(s, l)| {
                let n: i64 = counts
                    .iter()
                    .filter(|(state, _)| state == s)
                    .map(|(_, n)| *n)
                    .sum();
                (&l[..], n as f64)
            })
            .collect();
        self.policy_nodes.set_many(&series);
    }

    /// `ttdriver_policy_nodes{cr,state="HostManaged"}`.
    pub fn set_policy_host_managed(&self, cr: &str, n: i64) {
        self.ensure_cr(cr);
        self.policy_nodes.set(&[cr, HOST_MANAGED], n as f64);
    }

    /// `ttdriver_policy_paused{cr}` 1/0 (lets the stalled-rollout alert skip paused policies).
    pub fn set_policy_paused(&self, cr: &str, paused: bool) {
        self.ensure_cr(cr);
        self.policy_paused.set(&[cr], bool_value(paused));
    }

    /// `ttdriver_policy_desired_version{cr,version}` = 1; the series of any other
    /// version of this policy is removed.
    pub fn set_desired_version(&self, cr: &str, version: &str) {
        self.ensure_cr(cr);
        let mut map = self.policy_desired_version.lock();
        map.retain(|k, _| {
            !(k.first().map(String::as_str) == Some(cr)
                && k.get(1).map(String::as_str) != Some(version))
        });
        map.insert(
            vec![cr.to_string(), version.to_string()],
            Value::Scalar(1.0),
        );
    }

    /// `ttdriver_nodes_by_kmd_version{version,install_mode}`; replaces the whole set.
    pub fn set_nodes_by_kmd_version(&self, counts: &[(String, String, i64)]) {
        let mut series = BTreeMap::new();
        for (version, mode, n) in counts {
            let entry = series
                .entry(vec![version.clone(), mode.clone()])
                .or_insert(Value::Scalar(0.0));
            if let Value::Scalar(x) = entry {
                *x += *n as f64;
            }
        }
        self.nodes_by_kmd_version.replace(series);
    }

    /// `ttdriver_pods_evicted_total{cr,pass}` (pass is `device` or `full`).
    pub fn inc_evicted(&self, cr: &str, pass: &str) {
        self.ensure_cr(cr);
        self.pods_evicted.add(&[cr, pass], 1.0);
    }

    /// `ttdriver_drain_blocked_total{cr,pass}`.
    pub fn inc_drain_blocked(&self, cr: &str, pass: &str) {
        self.ensure_cr(cr);
        self.drain_blocked.add(&[cr, pass], 1.0);
    }

    /// `ttdriver_errors_total{cr,stage}`.
    pub fn inc_error(&self, cr: &str, stage: &str) {
        self.ensure_cr(cr);
        self.errors.add(&[cr, stage], 1.0);
    }

    /// `ttdriver_last_successful_reconcile_timestamp_seconds{cr}` = now.
    pub fn set_last_successful_reconcile(&self, cr: &str) {
        self.ensure_cr(cr);
        self.last_successful_reconcile
            .set(&[cr], now_unix_seconds());
    }

    /// `ttdriver_reconcile_total{cr,result}` and `ttdriver_reconcile_duration_seconds{cr}`.
    pub fn observe_reconcile(&self, cr: &str, seconds: f64, ok: bool) {
        self.ensure_cr(cr);
        self.reconcile_total
            .add(&[cr, if ok { "ok" } else { "error" }], 1.0);
        if seconds >= 0.0 {
            self.reconcile_duration.observe(&[cr], seconds);
        }
    }

    /// `ttdriver_rollout_max_unavailable{cr}` and `ttdriver_rollout_unavailable_nodes{cr}`.
    pub fn set_rollout_budget(&self, cr: &str, max_unavailable: i64, unavailable: i64) {
        self.ensure_cr(cr);
        self.rollout_max_unavailable
            .set(&[cr], max_unavailable as f64);
        self.rollout_unavailable.set(&[cr], unavailable as f64);
    }

    /// `ttdriver_node_deploy_gate_closed{cr,node,gate}` 1/0.
    pub fn set_deploy_gate_closed(&self, cr: &str, node: &str, gate: &str, closed: bool) {
        self.ensure_cr(cr);
        self.node_deploy_gate_closed
            .set(&[cr, node, gate], bool_value(closed));
    }

    /// `ttdriver_node_state_since_timestamp_seconds{cr,node}`.
    pub fn set_node_state_since(&self, cr: &str, node: &str, unix_seconds: f64) {
        self.ensure_cr(cr);
        self.node_state_since.set(&[cr, node], unix_seconds);
    }

    /// `ttdriver_actor_restarts_total{actor}`.
    pub fn inc_actor_restart(&self, actor: &str) {
        self.actor_restarts.add(&[actor], 1.0);
    }

    /// `ttdriver_actor_mailbox_full_total{actor}`.
    pub fn inc_mailbox_full(&self, actor: &str) {
        self.actor_mailbox_full.add(&[actor], 1.0);
    }

    /// `ttdriver_leader` 1/0.
    ///
    /// Losing the lease (true -> false) also drops every per-policy and per-node
    /// series and `ttdriver_nodes_by_kmd_version`: a replica that no longer drives
    /// the rollout must not keep exporting a frozen copy of it next to the new
    /// leader's. The new leader, or this replica once it leads again, re-creates
    /// them on its next reconcile.
    pub fn set_leader(&self, is_leader: bool) {
        let was = self.is_leader.swap(is_leader, Ordering::SeqCst);
        self.leader.set(&[], bool_value(is_leader));
        if was && !is_leader {
            for f in &self.all {
                if f.label_index("cr").is_some() {
                    f.retain(|_| false);
                }
            }
            self.nodes_by_kmd_version.retain(|_| false);
            self.known_crs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clear();
        }
    }

    /// The build version this instance was created with.
    pub fn build_version(&self) -> String {
        self.build_info
            .lock()
            .keys()
            .next()
            .and_then(|k| k.first().cloned())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// One sample of the text exposition.
    #[derive(Debug, Clone, PartialEq)]
    struct Sample {
        name: String,
        labels: BTreeMap<String, String>,
        value: f64,
    }

    /// A strict enough parser of the text format (0.0.4) for these tests:
    /// `name{l="v",...} value`, with `\\`, `\"` and `\n` escapes in values.
    fn parse(text: &str) -> (Vec<Sample>, HashMap<String, String>) {
        let mut samples = Vec::new();
        let mut types = HashMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (n, t) = rest.split_once(' ').expect("TYPE line has a type");
                types.insert(n.to_string(), t.to_string());
                continue;
            }
            if line.starts_with('#') || line.is_empty() {
                continue;
            }
            let chars: Vec<char> = line.chars().collect();
            let mut i = 0;
            let mut name = String::new();
            while i < chars.len() && chars[i] != '{' && chars[i] != ' ' {
                name.push(chars[i]);
                i += 1;
            }
            let mut labels = BTreeMap::new();
            if chars.get(i) == Some(&'{') {
                i += 1;
                loop {
                    if chars.get(i) == Some(&'}') {
                        i += 1;
                        break;
                    }
                    let mut lname = String::new();
                    while chars[i] != '=' {
                        lname.push(chars[i]);
                        i += 1;
                    }
                    i += 1;
                    assert_eq!(chars[i], '"', "in {line}");
                    i += 1;
                    let mut val = String::new();
                    loop {
                        match chars[i] {
                            '\\' => {
                                i += 1;
                                val.push(if chars[i] == 'n' { '\n' } else { chars[i] });
                            }
                            '"' => {
                                i += 1;
                                break;
                            }
                            c => val.push(c),
                        }
                        i += 1;
                    }
                    labels.insert(lname, val);
                    if chars.get(i) == Some(&',') {
                        i += 1;
                    }
                }
            }
            let rest: String = chars[i..].iter().collect();
            let value: f64 = match rest.trim() {
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                v => v.parse().unwrap_or_else(|_| panic!("bad value in {line}")),
            };
            samples.push(Sample {
                name,
                labels,
                value,
            });
        }
        (samples, types)
    }

    fn scrape(m: &Metrics) -> Vec<Sample> {
        let (ct, body) = m.encode();
        assert_eq!(ct, "text/plain; version=0.0.4; charset=utf-8");
        parse(&String::from_utf8(body).expect("utf-8")).0
    }

    fn select<'a>(samples: &'a [Sample], name: &str, labels: &[(&str, &str)]) -> Vec<&'a Sample> {
        samples
            .iter()
            .filter(|s| s.name == name)
            .filter(|s| {
                labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .collect()
    }

    fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let found = select(samples, name, labels);
        assert!(found.len() <= 1, "{name} {labels:?} matches {found:?}");
        found.first().map(|s| s.value)
    }

    /// The text of a scrape, with the one wall-clock value
    /// (`ttdriver_last_successful_reconcile_timestamp_seconds`) checked to be
    /// about now and then replaced by `<now>`, so the text is reproducible.
    fn render_stable(m: &Metrics) -> String {
        let (_, body) = m.encode();
        let text = String::from_utf8(body).expect("utf-8");
        let mut out = String::with_capacity(text.len());
        for line in text.split_inclusive('\n') {
            match line.strip_prefix("ttdriver_last_successful_reconcile_timestamp_seconds{") {
                Some(_) => {
                    let (series, v) = line.trim_end().rsplit_once(' ').expect("sample line");
                    let v: f64 = v.parse().expect("timestamp");
                    assert!((v - now_unix_seconds()).abs() < 60.0, "{line}");
                    out.push_str(series);
                    out.push_str(" <now>\n");
                }
                None => out.push_str(line),
            }
        }
        out
    }

    /// Compares `got` with `tests/golden/<file>`; `UPDATE_GOLDEN=1 cargo test` rewrites it.
    fn assert_golden(file: &str, got: &str) {
        let path = format!("{}/tests/golden/{file}", env!("CARGO_MANIFEST_DIR"));
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            std::fs::write(&path, got).expect("write golden");
        }
        let want = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{path}: {e} (UPDATE_GOLDEN=1 to create)"));
        assert!(got == want, "/metrics output differs from {path}:\n{got}");
    }

    /// Golden snapshot of the whole /metrics text after a fixed sequence of calls
    /// that reaches every family and every public method, then after losing the
    /// lease. Guards names, labels, help texts, ordering, escaping and number
    /// formatting byte for byte.
    #[test]
    fn golden_metrics_text() {
        use NodeState::*;
        let m = Metrics::new("0.1.0-golden");
        m.set_leader(true);
        m.set_node_state("fleet", "n1", Upgrading);
        m.set_node_state("fleet", "n2", Pending);
        m.set_node_state("fleet", "n2", Cordoning);
        m.set_node_state("gone", "n1", Draining);
        m.set_node_state_since("fleet", "n1", 1_700_000_000.5);
        m.set_node_state_since("ab", "c", 1.0);
        m.set_node_state_since("a", "bc", 2.0);
        m.set_node_state_since("gone", "n1", 3.0);
        let gate = "tenstorrent.com/deploy.tt-telemetry";
        m.set_deploy_gate_closed("fleet", "n1", gate, true);
        m.set_deploy_gate_closed("fleet", "n2", gate, false);
        m.set_deploy_gate_closed("fleet", "n3", gate, true);
        m.observe_transition("fleet", Pending, Cordoning, 0.25);
        m.observe_transition("fleet", Cordoning, Draining, 3.0);
        m.observe_transition("fleet", Draining, Upgrading, 42.0);
        m.observe_transition("fleet", Draining, Upgrading, 7000.0);
        m.observe_transition("fleet", Upgrading, Failed, f64::NAN);
        m.observe_transition("fleet", Failed, Pending, -1.0);
        m.observe_transition("gone", Pending, Cordoning, 1.0);
        m.observe_node_upgrade("fleet", 400.0);
        m.observe_node_upgrade("fleet", 9000.0);
        m.observe_node_upgrade("fleet", -5.0);
        m.inc_failure("fleet", "DrainTimeout");
        m.inc_failure("fleet", "something the kernel said");
        m.set_policy_nodes(
            "fleet",
            &[(Done, 3), (Pending, 1), (Pending, 1), (Upgrading, 1)],
        );
        m.set_policy_host_managed("fleet", 2);
        m.set_policy_nodes("gone", &[(Draining, 1)]);
        m.set_policy_paused("fleet", false);
        m.set_policy_paused("paused", true);
        m.set_desired_version("fleet", "2.7.0");
        m.set_desired_version("fleet", "2.8.0");
        m.set_desired_version("fleet1", "12.8.0");
        m.set_desired_version("gone", "2.8.0");
        m.set_nodes_by_kmd_version(&[("2.7.0".into(), "container".into(), 1)]);
        m.set_nodes_by_kmd_version(&[
            ("2.8.0".into(), "container".into(), 2),
            ("2.8.0".into(), "container".into(), 1),
            ("2.8.0".into(), "host".into(), 2),
            ("".into(), "none".into(), 1),
        ]);
        m.inc_evicted("fleet", "device");
        m.inc_evicted("fleet", "device");
        m.inc_evicted("fleet", "full");
        m.inc_drain_blocked("fleet", "full");
        m.inc_error("fleet", "render");
        m.inc_error("fleet", "we\"ird\\name\nx");
        m.inc_error("gone", "kube_api");
        m.set_last_successful_reconcile("fleet");
        m.set_last_successful_reconcile("gone");
        m.observe_reconcile("fleet", 0.03, true);
        m.observe_reconcile("fleet", 0.2, false);
        m.observe_reconcile("fleet", 120.0, true);
        m.observe_reconcile("fleet", -1.0, true);
        m.set_rollout_budget("fleet", 2, 1);
        m.set_rollout_budget("gone", 1, 1);
        m.inc_actor_restart("node");
        m.inc_actor_restart("node");
        m.inc_actor_restart("policy_supervisor");
        m.inc_mailbox_full("evictor");
        m.forget_node("fleet", "n3");
        m.forget_policy("gone");
        assert_golden("metrics.txt", &render_stable(&m));

        m.set_leader(false);
        assert_golden("metrics-lease-lost.txt", &render_stable(&m));
    }

    #[test]
    fn metrics_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync + 'static>() {}
        assert_send_sync::<Metrics>();
        assert_send_sync::<Arc<Metrics>>();
    }

    #[test]
    fn content_type_is_text_format_0_0_4_utf8() {
        let m = Metrics::new("1.2.3");
        let (ct, body) = m.encode();
        assert_eq!(ct, "text/plain; version=0.0.4; charset=utf-8");
        assert!(!body.is_empty());
        assert_eq!(CONTENT_TYPE, ct);
    }

    #[test]
    fn build_info_and_leader() {
        let m = Metrics::new("0.1.0-abc");
        let s = scrape(&m);
        assert_eq!(
            value(&s, "ttdriver_build_info", &[("version", "0.1.0-abc")]),
            Some(1.0)
        );
        assert_eq!(value(&s, "ttdriver_leader", &[]), Some(0.0));
        assert_eq!(m.build_version(), "0.1.0-abc");
        m.set_leader(true);
        assert_eq!(value(&scrape(&m), "ttdriver_leader", &[]), Some(1.0));
    }

    #[test]
    fn every_state_is_emitted_with_exactly_one_set() {
        let m = Metrics::new("t");
        for current in NodeState::ALL {
            m.set_node_state("fleet", "node-1", current);
            m.set_node_state("fleet", "node-2", NodeState::Pending);
            let s = scrape(&m);
            let series = select(
                &s,
                "ttdriver_node_state",
                &[("cr", "fleet"), ("node", "node-1")],
            );
            assert_eq!(series.len(), NodeState::ALL.len());
            for st in NodeState::ALL {
                let v = value(
                    &s,
                    "ttdriver_node_state",
                    &[("cr", "fleet"), ("node", "node-1"), ("state", st.as_str())],
                );
                assert_eq!(
                    v,
                    Some(bool_value(st == current)),
                    "state {st:?} while {current:?}"
                );
            }
            let ones: Vec<_> = series.iter().filter(|s| s.value == 1.0).collect();
            assert_eq!(ones.len(), 1);
            assert_eq!(ones[0].labels["state"], current.as_str());
            // node-2 is unaffected.
            assert_eq!(
                value(
                    &s,
                    "ttdriver_node_state",
                    &[("cr", "fleet"), ("node", "node-2"), ("state", "Pending")]
                ),
                Some(1.0)
            );
        }
    }

    #[test]
    fn forget_node_removes_only_that_nodes_series() {
        let m = Metrics::new("t");
        for (cr, node) in [("a", "n1"), ("a", "n2"), ("b", "n1")] {
            m.set_node_state(cr, node, NodeState::Draining);
            m.set_node_state_since(cr, node, 1000.0);
            m.set_deploy_gate_closed(cr, node, "tenstorrent.com/deploy.tt-telemetry", true);
        }
        m.set_policy_nodes("a", &[(NodeState::Draining, 2)]);
        m.forget_node("a", "n1");
        let s = scrape(&m);
        for name in [
            "ttdriver_node_state",
            "ttdriver_node_state_since_timestamp_seconds",
            "ttdriver_node_deploy_gate_closed",
        ] {
            assert!(
                select(&s, name, &[("cr", "a"), ("node", "n1")]).is_empty(),
                "{name} of a/n1 left"
            );
            assert!(
                !select(&s, name, &[("cr", "a"), ("node", "n2")]).is_empty(),
                "{name} of a/n2 gone"
            );
            assert!(
                !select(&s, name, &[("cr", "b"), ("node", "n1")]).is_empty(),
                "{name} of b/n1 gone"
            );
        }
        // Per-policy series stay.
        assert_eq!(
            value(
                &s,
                "ttdriver_policy_nodes",
                &[("cr", "a"), ("state", "Draining")]
            ),
            Some(2.0)
        );
    }

    #[test]
    fn forget_policy_removes_every_series_of_the_cr() {
        let m = Metrics::new("t");
        for cr in ["gone", "kept"] {
            m.set_node_state(cr, "n1", NodeState::Upgrading);
            m.set_node_state_since(cr, "n1", 5.0);
            m.set_deploy_gate_closed(cr, "n1", "g", true);
            m.observe_transition(cr, NodeState::Draining, NodeState::Upgrading, 12.0);
            m.observe_node_upgrade(cr, 100.0);
            m.inc_failure(cr, "DrainTimeout");
            m.set_policy_nodes(cr, &[(NodeState::Upgrading, 1)]);
            m.set_policy_host_managed(cr, 3);
            m.set_policy_paused(cr, false);
            m.set_desired_version(cr, "2.8.0");
            m.inc_evicted(cr, "device");
            m.inc_drain_blocked(cr, "full");
            m.inc_error(cr, "patch");
            m.set_last_successful_reconcile(cr);
            m.observe_reconcile(cr, 0.2, true);
            m.set_rollout_budget(cr, 1, 1);
        }
        m.inc_actor_restart("node");
        m.set_nodes_by_kmd_version(&[("2.8.0".into(), "container".into(), 2)]);
        m.forget_policy("gone");
        let s = scrape(&m);
        let left: Vec<_> = s
            .iter()
            .filter(|x| x.labels.get("cr").map(String::as_str) == Some("gone"))
            .collect();
        assert!(left.is_empty(), "series of a deleted policy left: {left:?}");
        let kept: BTreeSet<_> = s
            .iter()
            .filter(|x| x.labels.get("cr").map(String::as_str) == Some("kept"))
            .map(|x| x.name.clone())
            .collect();
        assert!(kept.len() >= 18, "kept policy lost series: {kept:?}");
        assert_eq!(
            value(&s, "ttdriver_actor_restarts_total", &[("actor", "node")]),
            Some(1.0)
        );
        assert_eq!(
            value(
                &s,
                "ttdriver_nodes_by_kmd_version",
                &[("version", "2.8.0"), ("install_mode", "container")]
            ),
            Some(2.0)
        );

        // The policy comes back: its zeroed counters come back too.
        m.set_policy_nodes("gone", &[]);
        let s = scrape(&m);
        assert_eq!(
            value(
                &s,
                "ttdriver_node_failures_total",
                &[("cr", "gone"), ("reason", "DrainTimeout")]
            ),
            Some(0.0)
        );
    }

    #[test]
    fn legacy_metric_names_and_labels() {
        let m = Metrics::new("t");
        m.set_policy_nodes("p", &[(NodeState::Done, 3), (NodeState::Pending, 1)]);
        m.set_policy_host_managed("p", 2);
        m.set_desired_version("p", "2.8.0");
        m.set_nodes_by_kmd_version(&[
            ("2.7.0".into(), "container".into(), 1),
            ("2.8.0".into(), "host".into(), 2),
        ]);
        m.inc_evicted("p", "device");
        m.inc_drain_blocked("p", "full");
        m.inc_error("p", "render");
        m.set_last_successful_reconcile("p");
        let s = scrape(&m);
        let expect: &[(&str, &[&str])] = &[
            ("ttdriver_policy_nodes", &["cr", "state"]),
            (
                "ttdriver_nodes_by_kmd_version",
                &["install_mode", "version"],
            ),
            ("ttdriver_policy_desired_version", &["cr", "version"]),
            ("ttdriver_pods_evicted_total", &["cr", "pass"]),
            ("ttdriver_drain_blocked_total", &["cr", "pass"]),
            ("ttdriver_errors_total", &["cr", "stage"]),
            (
                "ttdriver_last_successful_reconcile_timestamp_seconds",
                &["cr"],
            ),
        ];
        for (name, labels) in expect {
            let found = select(&s, name, &[]);
            assert!(!found.is_empty(), "{name} missing");
            for f in found {
                let got: Vec<_> = f.labels.keys().map(String::as_str).collect();
                assert_eq!(&got, labels, "{name}");
            }
        }
        // Every state, missing ones as 0, plus HostManaged.
        assert_eq!(select(&s, "ttdriver_policy_nodes", &[("cr", "p")]).len(), 8);
        assert_eq!(
            value(
                &s,
                "ttdriver_policy_nodes",
                &[("cr", "p"), ("state", "Done")]
            ),
            Some(3.0)
        );
        assert_eq!(
            value(
                &s,
                "ttdriver_policy_nodes",
                &[("cr", "p"), ("state", "Failed")]
            ),
            Some(0.0)
        );
        assert_eq!(
            value(
                &s,
                "ttdriver_policy_nodes",
                &[("cr", "p"), ("state", "HostManaged")]
            ),
            Some(2.0)
        );
        assert_eq!(
            value(
                &s,
                "ttdriver_pods_evicted_total",
                &[("cr", "p"), ("pass", "device")]
            ),
            Some(1.0)
        );
        assert_eq!(
            value(
                &s,
                "ttdriver_pods_evicted_total",
                &[("cr", "p"), ("pass", "full")]
            ),
            Some(0.0)
        );
        let ts = value(
            &s,
            "ttdriver_last_successful_reconcile_timestamp_seconds",
            &[("cr", "p")],
        )
        .expect("ts");
        assert!((ts - now_unix_seconds()).abs() < 60.0);
    }

    #[test]
    fn desired_version_keeps_one_series_per_policy() {
        let m = Metrics::new("t");
        m.set_desired_version("prod", "12.8.0");
        m.set_desired_version("prod1", "2.8.0");
        m.set_desired_version("prod", "2.7.0");
        let s = scrape(&m);
        let series = select(&s, "ttdriver_policy_desired_version", &[]);
        assert_eq!(series.len(), 2, "{series:?}");
        assert_eq!(
            value(
                &s,
                "ttdriver_policy_desired_version",
                &[("cr", "prod"), ("version", "2.7.0")]
            ),
            Some(1.0)
        );
        assert_eq!(
            value(
                &s,
                "ttdriver_policy_desired_version",
                &[("cr", "prod1"), ("version", "2.8.0")]
            ),
            Some(1.0)
        );
    }

    #[test]
    fn label_values_that_concatenate_alike_stay_apart() {
        let m = Metrics::new("t");
        m.set_node_state_since("ab", "c", 1.0);
        m.set_node_state_since("a", "bc", 2.0);
        let s = scrape(&m);
        assert_eq!(
            value(
                &s,
                "ttdriver_node_state_since_timestamp_seconds",
                &[("cr", "ab"), ("node", "c")]
            ),
            Some(1.0)
        );
        assert_eq!(
            value(
                &s,
                "ttdriver_node_state_since_timestamp_seconds",
                &[("cr", "a"), ("node", "bc")]
            ),
            Some(2.0)
        );
    }

    #[test]
    fn label_values_are_escaped() {
        let m = Metrics::new("t");
        let odd = "we\"ird\\name\nx";
        m.inc_error("p", odd);
        let s = scrape(&m);
        assert_eq!(
            value(&s, "ttdriver_errors_total", &[("cr", "p"), ("stage", odd)]),
            Some(1.0)
        );
    }

    #[test]
    fn kmd_versions_replace_the_whole_set() {
        let m = Metrics::new("t");
        m.set_nodes_by_kmd_version(&[("2.7.0".into(), "container".into(), 3)]);
        m.set_nodes_by_kmd_version(&[
            ("2.8.0".into(), "container".into(), 2),
            ("2.8.0".into(), "host".into(), 1),
        ]);
        let s = scrape(&m);
        assert_eq!(select(&s, "ttdriver_nodes_by_kmd_version", &[]).len(), 2);
        assert_eq!(
            value(&s, "ttdriver_nodes_by_kmd_version", &[("version", "2.7.0")]),
            None
        );
        assert_eq!(
            value(
                &s,
                "ttdriver_nodes_by_kmd_version",
                &[("version", "2.8.0"), ("install_mode", "host")]
            ),
            Some(1.0)
        );
        m.set_nodes_by_kmd_version(&[]);
        assert!(select(&scrape(&m), "ttdriver_nodes_by_kmd_version", &[]).is_empty());
    }

    #[test]
    fn failure_reasons_are_bounded() {
        let m = Metrics::new("t");
        m.inc_failure("p", "DrainTimeout");
        m.inc_failure("p", "something the kernel said");
        m.inc_failure("p", "");
        let s = scrape(&m);
        let series = select(&s, "ttdriver_node_failures_total", &[("cr", "p")]);
        assert_eq!(series.len(), FAILURE_REASONS.len());
        assert_eq!(
            value(
                &s,
                "ttdriver_node_failures_total",
                &[("cr", "p"), ("reason", "DrainTimeout")]
            ),
            Some(1.0)
        );
        assert_eq!(
            value(
                &s,
                "ttdriver_node_failures_total",
                &[("cr", "p"), ("reason", "Other")]
            ),
            Some(2.0)
        );
        assert_eq!(
            value(
                &s,
                "ttdriver_node_failures_total",
                &[("cr", "p"), ("reason", "AgentFailed")]
            ),
            Some(0.0)
        );
        assert_eq!(failure_reason("PatchError"), "PatchError");
        assert_eq!(failure_reason("patcherror"), "Other");
    }

    #[test]
    fn transitions_and_histograms() {
        let m = Metrics::new("t");
        m.observe_transition("p", NodeState::Draining, NodeState::Upgrading, 42.0);
        m.observe_transition("p", NodeState::Draining, NodeState::Upgrading, 7000.0);
        m.observe_transition("p", NodeState::Upgrading, NodeState::Failed, 0.5);
        m.observe_transition("p", NodeState::Pending, NodeState::Cordoning, f64::NAN);
        m.observe_node_upgrade("p", 400.0);
        m.observe_reconcile("p", 0.03, true);
        m.observe_reconcile("p", 0.2, false);
        let (body, types) = {
            let (_, b) = m.encode();
            let text = String::from_utf8(b).expect("utf-8");
            let (s, t) = parse(&text);
            (s, t)
        };
        let s = body;
        assert_eq!(types["ttdriver_node_transitions_total"], "counter");
        assert_eq!(types["ttdriver_phase_duration_seconds"], "histogram");
        assert_eq!(
            value(
                &s,
                "ttdriver_node_transitions_total",
                &[("cr", "p"), ("from", "Draining"), ("to", "Upgrading")]
            ),
            Some(2.0)
        );
        assert_eq!(
            value(
                &s,
                "ttdriver_node_transitions_total",
                &[("cr", "p"), ("from", "Pending"), ("to", "Cordoning")]
            ),
            Some(1.0),
            "a transition with an unknown duration is still counted"
        );
        let drain = [("cr", "p"), ("phase", "Draining")];
        assert_eq!(
            value(&s, "ttdriver_phase_duration_seconds_count", &drain),
            Some(2.0)
        );
        assert_eq!(
            value(&s, "ttdriver_phase_duration_seconds_sum", &drain),
            Some(7042.0)
        );
        let b = |le: &str| {
            value(
                &s,
                "ttdriver_phase_duration_seconds_bucket",
                &[("cr", "p"), ("phase", "Draining"), ("le", le)],
            )
        };
        assert_eq!(b("30"), Some(0.0));
        assert_eq!(b("60"), Some(1.0));
        assert_eq!(b("3600"), Some(1.0));
        assert_eq!(b("+Inf"), Some(2.0));
        assert_eq!(
            select(&s, "ttdriver_phase_duration_seconds_bucket", &drain).len(),
            PHASE_BUCKETS.len() + 1
        );
        assert_eq!(
            value(
                &s,
                "ttdriver_phase_duration_seconds_count",
                &[("cr", "p"), ("phase", "Upgrading")]
            ),
            Some(1.0)
        );
        assert_eq!(
            value(
                &s,
                "ttdriver_phase_duration_seconds_count",
                &[("cr", "p"), ("phase", "Pending")]
            ),
            None,
            "NaN is not observed"
        );
        assert_eq!(
            value(
                &s,
                "ttdriver_node_upgrade_duration_seconds_count",
                &[("cr", "p")]
            ),
            Some(1.0)
        );
        assert_eq!(
            value(
                &s,
                "ttdriver_reconcile_total",
                &[("cr", "p"), ("result", "ok")]
            ),
            Some(1.0)
        );
        assert_eq!(
            value(
                &s,
                "ttdriver_reconcile_total",
                &[("cr", "p"), ("result", "error")]
            ),
            Some(1.0)
        );
        assert_eq!(
            value(
                &s,
                "ttdriver_reconcile_duration_seconds_count",
                &[("cr", "p")]
            ),
            Some(2.0)
        );
        assert_eq!(
            value(
                &s,
                "ttdriver_reconcile_duration_seconds_bucket",
                &[("cr", "p"), ("le", "0.05")]
            ),
            Some(1.0)
        );
    }

    #[test]
    fn budget_gates_actors() {
        let m = Metrics::new("t");
        m.set_rollout_budget("p", 1, 2);
        m.set_deploy_gate_closed("p", "n", "g", true);
        m.set_deploy_gate_closed("p", "n", "g", false);
        m.inc_actor_restart("node");
        m.inc_actor_restart("node");
        m.inc_mailbox_full("evictor");
        m.set_policy_paused("p", true);
        let s = scrape(&m);
        assert_eq!(
            value(&s, "ttdriver_rollout_max_unavailable", &[("cr", "p")]),
            Some(1.0)
        );
        assert_eq!(
            value(&s, "ttdriver_rollout_unavailable_nodes", &[("cr", "p")]),
            Some(2.0)
        );
        assert_eq!(
            value(
                &s,
                "ttdriver_node_deploy_gate_closed",
                &[("cr", "p"), ("node", "n"), ("gate", "g")]
            ),
            Some(0.0)
        );
        assert_eq!(
            value(&s, "ttdriver_actor_restarts_total", &[("actor", "node")]),
            Some(2.0)
        );
        assert_eq!(
            value(
                &s,
                "ttdriver_actor_mailbox_full_total",
                &[("actor", "evictor")]
            ),
            Some(1.0)
        );
        assert_eq!(
            value(&s, "ttdriver_policy_paused", &[("cr", "p")]),
            Some(1.0)
        );
    }

    #[test]
    fn losing_the_lease_drops_policy_series() {
        let m = Metrics::new("t");
        m.set_leader(true);
        m.set_node_state("p", "n", NodeState::Done);
        m.set_nodes_by_kmd_version(&[("2.8.0".into(), "container".into(), 1)]);
        m.inc_actor_restart("node");
        m.set_leader(false);
        let s = scrape(&m);
        assert!(s.iter().all(|x| !x.labels.contains_key("cr")), "{s:?}");
        assert!(select(&s, "ttdriver_nodes_by_kmd_version", &[]).is_empty());
        assert_eq!(value(&s, "ttdriver_leader", &[]), Some(0.0));
        assert_eq!(
            value(&s, "ttdriver_actor_restarts_total", &[("actor", "node")]),
            Some(1.0)
        );
        assert_eq!(
            value(&s, "ttdriver_build_info", &[("version", "t")]),
            Some(1.0)
        );
        // Starting as a follower drops nothing.
        let m = Metrics::new("t");
        m.set_node_state("p", "n", NodeState::Done);
        m.set_leader(false);
        assert!(!select(&scrape(&m), "ttdriver_node_state", &[]).is_empty());
    }

    #[test]
    fn shared_across_threads() {
        let m = Arc::new(Metrics::new("t"));
        let handles: Vec<_> = (0..4)
            .map(|i| {
                let m = m.clone();
                std::thread::spawn(move || {
                    for _ in 0..100 {
                        m.inc_evicted("p", "device");
                        m.set_node_state("p", &format!("n{i}"), NodeState::Upgrading);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().expect("thread");
        }
        let s = scrape(&m);
        assert_eq!(
            value(
                &s,
                "ttdriver_pods_evicted_total",
                &[("cr", "p"), ("pass", "device")]
            ),
            Some(400.0)
        );
        assert_eq!(
            select(&s, "ttdriver_node_state", &[("state", "Upgrading")]).len(),
            4
        );
    }

    #[test]
    fn a_scrape_never_sees_a_half_updated_node_state() {
        let m = Arc::new(Metrics::new("t"));
        m.set_node_state("p", "n", NodeState::Pending);
        let writer = {
            let m = m.clone();
            std::thread::spawn(move || {
                for i in 0..3000 {
                    m.set_node_state("p", "n", NodeState::ALL[i % NodeState::ALL.len()]);
                }
            })
        };
        while !writer.is_finished() {
            let s = scrape(&m);
            let ones = select(&s, "ttdriver_node_state", &[("node", "n")])
                .iter()
                .filter(|x| x.value == 1.0)
                .count();
            assert_eq!(ones, 1);
        }
        writer.join().expect("writer");
    }

    #[test]
    fn help_and_type_for_every_family() {
        let m = Metrics::new("t");
        m.set_node_state("p", "n", NodeState::Pending);
        let (_, body) = m.encode();
        let text = String::from_utf8(body).expect("utf-8");
        let (samples, types) = parse(&text);
        for s in &samples {
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suf| {
                    s.name
                        .strip_suffix(suf)
                        .filter(|b| types.get(*b).map(String::as_str) == Some("histogram"))
                })
                .unwrap_or(&s.name);
            let t = types
                .get(base)
                .unwrap_or_else(|| panic!("no TYPE for {}", s.name));
            assert_eq!(t == "counter", base.ends_with("_total"), "{base} is a {t}");
            assert!(
                text.contains(&format!("# HELP {base} ")),
                "no HELP for {base}"
            );
        }
    }
}
