//! Metrics of the installer DaemonSet's writes, as the Go operator had them:
//! `ttdriver_daemonset_operations_total{cr,operation,result}`.

use super::family::Families;
use super::registry::{DaemonSetMetrics, Metrics};

/// `operation` label values: the renderer creates or updates (server-side
/// apply) the DaemonSet, or deletes one it must replace.
pub const DAEMONSET_OPERATIONS: [&str; 3] = ["create", "update", "delete"];
/// `result` label values.
pub const DAEMONSET_RESULTS: [&str; 2] = ["success", "error"];

impl DaemonSetMetrics {
    /// Creates and registers the families of this group.
    pub(super) fn register(families: &mut Families) -> Self {
        DaemonSetMetrics {
            operations: families.counter(
                "ttdriver_daemonset_operations_total",
                "Writes of the policy's installer DaemonSet, by operation (create, update, delete) and result (success, error).",
                &["cr", "operation", "result"],
            ),
        }
    }

    /// Creates the counters of a newly seen policy at zero.
    pub(super) fn touch_policy(&self, cr: &str) {
        for op in DAEMONSET_OPERATIONS {
            for result in DAEMONSET_RESULTS {
                self.operations.touch(&[cr, op, result]);
            }
        }
    }
}

impl Metrics {
    /// `ttdriver_daemonset_operations_total{cr,operation,result}`; `operation`
    /// is one of [`DAEMONSET_OPERATIONS`], `ok` gives the result.
    pub fn inc_daemonset_operation(&self, cr: &str, operation: &str, ok: bool) {
        self.ensure_cr(cr);
        let result = if ok { "success" } else { "error" };
        self.daemonset.operations.add(&[cr, operation, result], 1.0);
    }
}
