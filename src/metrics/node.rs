//! Metrics of the per-node upgrade state machine, as the node actors and the
//! policy supervisor see it: the current state of each node and since when,
//! its deploy gates, the transitions between states, the time spent in each
//! state and in a whole upgrade, and why nodes failed.
//!
//! Every family here carries `cr`; the per-node ones also carry `node` and go
//! away with [`Metrics::forget_node`].

use ttdrv_api::NodeState;

use super::family::Families;
use super::registry::{Metrics, NodeMetrics, bool_value};

/// `reason` label values of `ttdriver_node_failures_total`; anything else is
/// reported as `Other`.
pub use ttdrv_core::reason::FAILURES as FAILURE_REASONS;

/// The `reason` label of a failure: one of [`FAILURE_REASONS`] (the state
/// machine writes no other); anything else would be a bug, counted as
/// `Other` rather than growing the label set.
pub fn failure_reason(reason: &str) -> &'static str {
    FAILURE_REASONS
        .iter()
        .copied()
        .find(|r| *r == reason)
        .unwrap_or("Other")
}

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

impl NodeMetrics {
    /// Creates and registers the families of this group.
    pub(super) fn register(families: &mut Families) -> Self {
        NodeMetrics {
            node_state: families.gauge(
                "ttdriver_node_state",
                "Upgrade state of a node: one series per state, the current one 1 and the others 0.",
                &["cr", "node", "state"],
            ),
            node_state_since: families.gauge(
                "ttdriver_node_state_since_timestamp_seconds",
                "Unix time at which the node entered its current upgrade state.",
                &["cr", "node"],
            ),
            node_deploy_gate_closed: families.gauge(
                "ttdriver_node_deploy_gate_closed",
                "1 while the controller holds the deploy-gate label of the node at \"false\", else 0.",
                &["cr", "node", "gate"],
            ),
            node_transitions: families.counter(
                "ttdriver_node_transitions_total",
                "Node upgrade state transitions, by from and to state.",
                &["cr", "from", "to"],
            ),
            phase_duration: families.histogram(
                "ttdriver_phase_duration_seconds",
                "Time a node spent in one upgrade state, observed when it leaves that state.",
                &["cr", "phase"],
                PHASE_BUCKETS,
            ),
            node_upgrade_duration: families.histogram(
                "ttdriver_node_upgrade_duration_seconds",
                "Time of a whole node upgrade, from the start of Cordoning to Done.",
                &["cr"],
                NODE_UPGRADE_BUCKETS,
            ),
            node_failures: families.counter(
                "ttdriver_node_failures_total",
                "Nodes that entered Failed, by reason (the reasons of Failed in docs/troubleshooting.md).",
                &["cr", "reason"],
            ),
            scheduling_surface: families.histogram(
                "ttdriver_node_scheduling_surface_seconds",
                "Time from a validated swap to the scheduler seeing every card of the node again (its DRA plugin restarted and its ResourceSlices, or extended resources, whole), observed when the node goes on to its uncordon.",
                &["cr"],
                PHASE_BUCKETS,
            ),
            node_rollbacks: families.counter(
                "ttdriver_node_rollbacks_total",
                "Nodes whose new module failed validation and whose installer loaded the previous version again (onValidationFailure: rollback).",
                &["cr"],
            ),
        }
    }

    /// Creates the failure counters of a newly seen policy at zero, one per reason.
    pub(super) fn touch_policy(&self, cr: &str) {
        for reason in FAILURE_REASONS {
            self.node_failures.touch(&[cr, reason]);
        }
        self.node_rollbacks.touch(&[cr]);
    }
}

impl Metrics {
    /// `ttdriver_node_scheduling_surface_seconds{cr}`.
    pub fn observe_scheduling_surface(&self, cr: &str, seconds: f64) {
        self.ensure_cr(cr);
        self.node.scheduling_surface.observe(&[cr], seconds);
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
        self.node.node_state.set_many(&series);
    }

    /// `ttdriver_node_state_since_timestamp_seconds{cr,node}`.
    pub fn set_node_state_since(&self, cr: &str, node: &str, unix_seconds: f64) {
        self.ensure_cr(cr);
        self.node.node_state_since.set(&[cr, node], unix_seconds);
    }

    /// `ttdriver_node_deploy_gate_closed{cr,node,gate}` 1/0.
    pub fn set_deploy_gate_closed(&self, cr: &str, node: &str, gate: &str, closed: bool) {
        self.ensure_cr(cr);
        self.node
            .node_deploy_gate_closed
            .set(&[cr, node, gate], bool_value(closed));
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
        self.node
            .node_transitions
            .add(&[cr, from.as_str(), to.as_str()], 1.0);
        if seconds_in_from >= 0.0 {
            self.node
                .phase_duration
                .observe(&[cr, from.as_str()], seconds_in_from);
        }
    }

    /// `ttdriver_node_upgrade_duration_seconds{cr}`: Cordoning start to Done.
    pub fn observe_node_upgrade(&self, cr: &str, seconds: f64) {
        self.ensure_cr(cr);
        if seconds >= 0.0 {
            self.node.node_upgrade_duration.observe(&[cr], seconds);
        }
    }

    /// `ttdriver_node_rollbacks_total{cr}`.
    pub fn inc_rollback(&self, cr: &str) {
        self.ensure_cr(cr);
        self.node.node_rollbacks.add(&[cr], 1.0);
    }

    /// `ttdriver_node_failures_total{cr,reason}`; an unknown reason counts as `Other`.
    pub fn inc_failure(&self, cr: &str, reason: &str) {
        self.ensure_cr(cr);
        self.node
            .node_failures
            .add(&[cr, failure_reason(reason)], 1.0);
    }
}
