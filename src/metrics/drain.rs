//! Metrics of draining a node, as the evictor reports them: pods evicted and
//! evictions refused (PodDisruptionBudget or error), by pass.

use super::family::Families;
use super::registry::{DrainMetrics, Metrics};

use ttdrv_core::drain::DrainPass;

/// `pass` label values of the eviction counters, the Go operator's:
/// `pass1` is the device-user pass, `pass2` the rest of the node.
pub const EVICTION_PASSES: [&str; 2] = ["pass1", "pass2"];

/// The `pass` label of a drain pass (the Go operator's values, not
/// [`DrainPass::as_str`]).
pub fn pass_label(pass: DrainPass) -> &'static str {
    match pass {
        DrainPass::Device => EVICTION_PASSES[0],
        DrainPass::Full => EVICTION_PASSES[1],
    }
}

impl DrainMetrics {
    /// Creates and registers the families of this group.
    pub(super) fn register(families: &mut Families) -> Self {
        DrainMetrics {
            pods_evicted: families.counter(
                "ttdriver_pods_evicted_total",
                "Pods evicted while draining, by pass (pass1: pods using /dev/tenstorrent; pass2: every other pod).",
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
    /// `ttdriver_pods_evicted_total{cr,pass}` (pass is `pass1` or `pass2`, see [`pass_label`]).
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
