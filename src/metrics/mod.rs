//! Prometheus metrics of the controller.
//!
//! Every metric is named `ttdriver_*`, those of the firmware policies `ttfw_*`
//! (the Go operator's, `firmware`), but the standard `process_*` ones. The names and labels of the Go operator we
//! replace (`ttdriver_policy_nodes`, `ttdriver_nodes_by_kmd_version`,
//! `ttdriver_policy_desired_version`, `ttdriver_pods_evicted_total`,
//! `ttdriver_drain_blocked_total`, `ttdriver_errors_total`,
//! `ttdriver_last_successful_reconcile_timestamp_seconds`,
//! `ttdriver_daemonset_operations_total`) are kept as they were, label values
//! too (`pass="pass1"|"pass2"`, `install_mode="unknown"` when not labelled);
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
//! Layout: `family` is that collector; each other module defines one group of
//! families and the [`Metrics`] methods that update them (`replica`: build and
//! leader; `node`: per-node upgrade states; `policy`: a policy's rollout;
//! `fleet`: tt-kmd versions across nodes; `drain`: evictions; `daemonset`:
//! writes of the installer DaemonSet; `reconcile`:
//! reconcile passes, errors and watch restarts; `actors`: actor restarts and
//! mailboxes; `process`: the standard `process_*` figures). `registry`
//! declares [`Metrics`] and each group's handles, so the groups import it
//! rather than this file (which re-exports them: no import circle). This
//! file ties the groups together: creation, encoding, and the lifecycle of a
//! policy's and a node's series.
//!
//! `Metrics` is `Send + Sync`; share it behind an `Arc`.

mod actors;
mod daemonset;
mod drain;
mod family;
mod firmware;
mod fleet;
mod node;
mod policy;
mod process;
mod reconcile;
mod registry;
mod replica;

pub use daemonset::{DAEMONSET_OPERATIONS, DAEMONSET_RESULTS};
pub use drain::{EVICTION_PASSES, pass_label};
pub use firmware::{FLASH_BUCKETS, FW_RESULTS};
pub use node::{FAILURE_REASONS, NODE_UPGRADE_BUCKETS, PHASE_BUCKETS, failure_reason};
pub use policy::HOST_MANAGED;
pub use reconcile::RECONCILE_BUCKETS;

pub use registry::Metrics;

use family::Families;
use registry::{
    ActorMetrics, DaemonSetMetrics, DrainMetrics, FirmwareMetrics, FleetMetrics, NodeMetrics,
    PolicyMetrics, ReconcileMetrics, ReplicaMetrics,
};

/// Content type of the text exposition format this module writes.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

impl Metrics {
    /// Creates and registers every metric, and sets `ttdriver_build_info{version}` to 1.
    ///
    /// Panics only if the metric definitions themselves are invalid (a bug caught
    /// by the unit tests), never because of input.
    pub fn new(build_version: &str) -> Self {
        let mut families = Families::new();
        let replica = ReplicaMetrics::register(&mut families, build_version);
        let node = NodeMetrics::register(&mut families);
        let policy = PolicyMetrics::register(&mut families);
        let fleet = FleetMetrics::register(&mut families);
        let drain = DrainMetrics::register(&mut families);
        let daemonset = DaemonSetMetrics::register(&mut families);
        let reconcile = ReconcileMetrics::register(&mut families);
        let actors = ActorMetrics::register(&mut families);
        let firmware = FirmwareMetrics::register(&mut families);
        process::register(&mut families);
        Metrics {
            families,
            replica,
            node,
            policy,
            fleet,
            drain,
            daemonset,
            reconcile,
            actors,
            firmware,
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
        self.node.touch_policy(cr);
        self.drain.touch_policy(cr);
        self.daemonset.touch_policy(cr);
        self.reconcile.touch_policy(cr);
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
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod text_parser;
