//! The fleet-wide view of the policy manager: Tenstorrent nodes by loaded
//! tt-kmd version and install mode, whatever policy they belong to.
//!
//! The only family without a `cr` label that a replica drops when it loses the
//! lease ([`Metrics::set_leader`] passes it to the collector explicitly).

use std::collections::BTreeMap;

use super::family::{Families, Value};
use super::registry::{FleetMetrics, Metrics};

impl FleetMetrics {
    /// Creates and registers the families of this group.
    pub(super) fn register(families: &mut Families) -> Self {
        FleetMetrics {
            nodes_by_kmd_version: families.gauge(
                "ttdriver_nodes_by_kmd_version",
                "Nodes by loaded tt-kmd version and install mode, from the node labels.",
                &["version", "install_mode"],
            ),
        }
    }
}

impl Metrics {
    /// `ttdriver_nodes_by_kmd_version{version,install_mode}`; replaces the whole set.
    pub fn set_nodes_by_kmd_version(&self, counts: &[(String, String, i64)]) {
        let mut series = BTreeMap::new();
        for (version, mode, n) in counts {
            // Not labelled: `unknown`, as the Go operator had it.
            let mode = if mode.is_empty() {
                "unknown".to_string()
            } else {
                mode.clone()
            };
            let entry = series
                .entry(vec![version.clone(), mode])
                .or_insert(Value::Scalar(0.0));
            if let Value::Scalar(x) = entry {
                *x += *n as f64;
            }
        }
        self.fleet.nodes_by_kmd_version.replace(series);
    }
}
