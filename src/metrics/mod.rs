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

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use ttdrv_api::NodeState;

mod family;

use family::{Families, Family, Value};

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
    families: Families,
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
        let mut families = Families::new();

        let build_info = families.gauge(
            "ttdriver_build_info",
            "Always 1; the version label carries the controller's build version.",
            &["version"],
        );
        let leader = families.gauge(
            "ttdriver_leader",
            "1 if this controller replica holds the leader lease and drives rollouts, else 0.",
            &[],
        );
        let node_state = families.gauge(
            "ttdriver_node_state",
            "Upgrade state of a node: one series per state, the current one 1 and the others 0.",
            &["cr", "node", "state"],
        );
        let node_state_since = families.gauge(
            "ttdriver_node_state_since_timestamp_seconds",
            "Unix time at which the node entered its current upgrade state.",
            &["cr", "node"],
        );
        let node_deploy_gate_closed = families.gauge(
            "ttdriver_node_deploy_gate_closed",
            "1 while the controller holds the deploy-gate label of the node at \"false\", else 0.",
            &["cr", "node", "gate"],
        );
        let node_transitions = families.counter(
            "ttdriver_node_transitions_total",
            "Node upgrade state transitions, by from and to state.",
            &["cr", "from", "to"],
        );
        let phase_duration = families.histogram(
            "ttdriver_phase_duration_seconds",
            "Time a node spent in one upgrade state, observed when it leaves that state.",
            &["cr", "phase"],
            PHASE_BUCKETS,
        );
        let node_upgrade_duration = families.histogram(
            "ttdriver_node_upgrade_duration_seconds",
            "Time of a whole node upgrade, from the start of Cordoning to Done.",
            &["cr"],
            NODE_UPGRADE_BUCKETS,
        );
        let node_failures = families.counter(
            "ttdriver_node_failures_total",
            "Nodes that entered Failed, by reason (DrainTimeout, UpgradeTimeout, AgentFailed, EvictionError, PatchError, Other).",
            &["cr", "reason"],
        );
        let policy_nodes = families.gauge(
            "ttdriver_policy_nodes",
            "Nodes matched by the policy, by upgrade state; state=\"HostManaged\" counts nodes with a host (DKMS) install.",
            &["cr", "state"],
        );
        let policy_paused = families.gauge(
            "ttdriver_policy_paused",
            "1 if the policy has spec.paused=true, else 0.",
            &["cr"],
        );
        let policy_desired_version = families.gauge(
            "ttdriver_policy_desired_version",
            "Always 1; the version label carries the policy's spec.version.",
            &["cr", "version"],
        );
        let nodes_by_kmd_version = families.gauge(
            "ttdriver_nodes_by_kmd_version",
            "Nodes by loaded tt-kmd version and install mode, from the node labels.",
            &["version", "install_mode"],
        );
        let pods_evicted = families.counter(
            "ttdriver_pods_evicted_total",
            "Pods evicted while draining, by pass (device: pods using /dev/tenstorrent; full: every other pod).",
            &["cr", "pass"],
        );
        let drain_blocked = families.counter(
            "ttdriver_drain_blocked_total",
            "Evictions refused (PodDisruptionBudget or error) while draining, by pass.",
            &["cr", "pass"],
        );
        let errors = families.counter(
            "ttdriver_errors_total",
            "Errors of the controller, by stage.",
            &["cr", "stage"],
        );
        let last_successful_reconcile = families.gauge(
            "ttdriver_last_successful_reconcile_timestamp_seconds",
            "Unix time of the last reconcile of the policy that ended without error.",
            &["cr"],
        );
        let reconcile_total = families.counter(
            "ttdriver_reconcile_total",
            "Reconcile passes of a policy, by result (ok or error).",
            &["cr", "result"],
        );
        let reconcile_duration = families.histogram(
            "ttdriver_reconcile_duration_seconds",
            "Duration of one reconcile pass of a policy.",
            &["cr"],
            RECONCILE_BUCKETS,
        );
        let rollout_max_unavailable = families.gauge(
            "ttdriver_rollout_max_unavailable",
            "The policy's maxUnavailable, resolved to a number of nodes.",
            &["cr"],
        );
        let rollout_unavailable = families.gauge(
            "ttdriver_rollout_unavailable_nodes",
            "Nodes of the policy currently out of service because of the rollout (Cordoning to Uncordoning, and Failed).",
            &["cr"],
        );
        let actor_restarts = families.counter(
            "ttdriver_actor_restarts_total",
            "Restarts of a supervised actor, by actor kind.",
            &["actor"],
        );
        let actor_mailbox_full = families.counter(
            "ttdriver_actor_mailbox_full_total",
            "Messages refused because the actor's mailbox was full, by actor kind.",
            &["actor"],
        );

        build_info.set(&[build_version], 1.0);
        leader.set(&[], 0.0);

        Metrics {
            families,
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
        (CONTENT_TYPE, self.families.encode())
    }

    /// Creates the fixed-label counters of a policy at zero the first time the
    /// policy is seen, so dashboards and `rate()` see them before the first event.
    fn ensure_cr(&self, cr: &str) {
        if !self.families.first_sight(cr) {
            return;
        }
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
        self.families.remove_matching(&[("cr", cr), ("node", node)]);
    }

    /// Removes every series labelled with `cr`.
    pub fn forget_policy(&self, cr: &str) {
        self.families.remove_matching(&[("cr", cr)]);
        self.families.forget_cr(cr);
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
            self.families
                .drop_policy_series(&[&self.nodes_by_kmd_version]);
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
mod tests;
#[cfg(test)]
mod text_parser;
