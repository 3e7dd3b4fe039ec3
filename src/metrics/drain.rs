//! Metrics of draining a node, as the evictor reports them: pods evicted and
//! evictions refused (PodDisruptionBudget or error), by pass.

use std::sync::Arc;

use super::Metrics;
use super::family::{Families, Family};

/// `pass` label values of the eviction counters.
pub const EVICTION_PASSES: [&str; 2] = ["device", "full"];

/// `ttdriver_pods_evicted_total` and `ttdriver_drain_blocked_total`.
pub(super) struct DrainMetrics {
    pods_evicted: Arc<Family>,
    drain_blocked: Arc<Family>,
}

impl DrainMetrics {
    /// Creates and registers the families of this group.
    pub(super) fn register(families: &mut Families) -> Self {
        DrainMetrics {
            pods_evicted: families.counter(
                "ttdriver_pods_evicted_total",
                "Pods evicted while draining, by pass (device: pods using /dev/tenstorrent; full: every other pod).",
                &["cr", "pass"],
            ),
            drain_blocked: families.counter(
                "ttdriver_drain_blocked_total",
                "Evictions refused (PodDisruptionBudget or error) while draining, by pass.",
                &["cr", "pass"],
            ),
        }
    }

    /// Creates both counters of a newly seen policy at zero, one per pass.
    pub(super) fn touch_policy(&self, cr: &str) {
        for pass in EVICTION_PASSES {
            self.pods_evicted.touch(&[cr, pass]);
            self.drain_blocked.touch(&[cr, pass]);
        }
    }
}

impl Metrics {
    /// `ttdriver_pods_evicted_total{cr,pass}` (pass is `device` or `full`).
    pub fn inc_evicted(&self, cr: &str, pass: &str) {
        self.ensure_cr(cr);
        self.drain.pods_evicted.add(&[cr, pass], 1.0);
    }

    /// `ttdriver_drain_blocked_total{cr,pass}`.
    pub fn inc_drain_blocked(&self, cr: &str, pass: &str) {
        self.ensure_cr(cr);
        self.drain.drain_blocked.add(&[cr, pass], 1.0);
    }
}
