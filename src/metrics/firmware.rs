//! The firmware policies' metrics, with the Go operator's `ttfw_*` names and
//! labels: node states, the desired version, flash Jobs created and finished
//! (with their wall time), evictions and drain stalls, errors and the last
//! good pass per policy, and the fleet's nodes by firmware version.

use std::collections::BTreeMap;
use std::sync::Arc;

use ttdrv_api::firmware::FirmwareNodeState;

use super::family::{Families, Family, Value};
use super::registry::{FirmwareMetrics, Metrics, now_unix_seconds};

/// Buckets of `ttfw_flash_duration_seconds`: Go's (10 s doubling, 8 bounds).
pub const FLASH_BUCKETS: &[f64] = &[10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0, 1280.0];

impl FirmwareMetrics {
    pub(super) fn register(f: &mut Families) -> Self {
        FirmwareMetrics {
            policy_nodes: f.gauge(
                "ttfw_policy_nodes",
                "Nodes matched by a TenstorrentFirmwarePolicy, by per-node upgrade state.",
                &["cr", "state"],
            ),
            desired_version: f.gauge(
                "ttfw_policy_desired_version",
                "Always 1; the version label carries the TenstorrentFirmwarePolicy's spec.version.",
                &["cr", "version"],
            ),
            nodes_by_fw_version: f.gauge(
                "ttfw_nodes_by_fw_version",
                "Number of nodes labeled with this firmware version.",
                &["version"],
            ),
            jobs_created: f.counter(
                "ttfw_flash_jobs_created_total",
                "Firmware flash Job creation attempts by result.",
                &["cr", "result"],
            ),
            jobs_finished: f.counter(
                "ttfw_flash_jobs_total",
                "Firmware flash Jobs that reached a terminal state, by result.",
                &["cr", "result"],
            ),
            flash_duration: f.histogram(
                "ttfw_flash_duration_seconds",
                "Per-node firmware flash job wall time.",
                &["cr", "result"],
                FLASH_BUCKETS,
            ),
            in_flight: f.gauge(
                "ttfw_flash_jobs_in_flight",
                "Firmware flash Jobs owned by this CR that have not reached a terminal state.",
                &["cr"],
            ),
            drain_blocked: f.counter(
                "ttfw_drain_blocked_total",
                "Drain attempts that hit a PDB / drain-timeout.",
                &["cr", "reason"],
            ),
            pods_evicted: f.counter(
                "ttfw_pods_evicted_total",
                "Pods evicted to free a node for firmware flashing.",
                &["cr"],
            ),
            handed_over: f.counter(
                "ttfw_cordons_handed_over_total",
                "Flashes whose cordon was handed to a driver policy's swap (one cordon and drain for both).",
                &["cr"],
            ),
            scheduling_surface: f.histogram(
                "ttfw_scheduling_surface_seconds",
                "Time from a flash that read back to the scheduler seeing every card of the node again (the deploy gates opened, the stack back, the DRA plugin restarted, its ResourceSlices or extended resources whole), observed when the node goes on to its uncordon.",
                &["cr"],
                super::node::PHASE_BUCKETS,
            ),
            errors: f.counter(
                "ttfw_errors_total",
                "Errors during firmware reconciliation, by reconcile stage.",
                &["cr", "stage"],
            ),
            last_reconcile: f.gauge(
                "ttfw_last_successful_reconcile_timestamp_seconds",
                "Unix timestamp of the last reconcile of this TenstorrentFirmwarePolicy that completed without returning an error.",
                &["cr"],
            ),
        }
    }

    fn all(&self) -> [&Arc<Family>; 12] {
        [
            &self.policy_nodes,
            &self.desired_version,
            &self.jobs_created,
            &self.jobs_finished,
            &self.flash_duration,
            &self.in_flight,
            &self.drain_blocked,
            &self.pods_evicted,
            &self.handed_over,
            &self.scheduling_surface,
            &self.errors,
            &self.last_reconcile,
        ]
    }
}

/// `result` of a Job the controller created (`success`, `error`) or of a
/// finished flash (`success`, `failed`): the Go operator's values.
pub const FW_RESULTS: [&str; 3] = ["success", "error", "failed"];

impl Metrics {
    /// A firmware policy's pass: its nodes by state (every state, zeros
    /// too), its version, the flashes in flight; the pass's timestamp when
    /// it wrote everything it meant to.
    pub fn set_firmware_policy(
        &self,
        cr: &str,
        version: &str,
        states: &[FirmwareNodeState],
        ok: bool,
    ) {
        let fw = &self.firmware;
        let counts: Vec<(String, f64)> = FirmwareNodeState::ALL
            .iter()
            .map(|s| {
                let n = states.iter().filter(|x| *x == s).count();
                (s.as_str().to_string(), n as f64)
            })
            .collect();
        let series: Vec<(Vec<&str>, f64)> = counts
            .iter()
            .map(|(s, n)| (vec![cr, s.as_str()], *n))
            .collect();
        let refs: Vec<(&[&str], f64)> = series.iter().map(|(l, n)| (l.as_slice(), *n)).collect();
        fw.policy_nodes.set_many(&refs);
        {
            let mut m = fw.desired_version.lock();
            m.retain(|k, _| k.first().map(String::as_str) != Some(cr));
            m.insert(
                vec![cr.to_string(), version.to_string()],
                Value::Scalar(1.0),
            );
        }
        let flashing = states
            .iter()
            .filter(|s| **s == FirmwareNodeState::Flashing)
            .count();
        fw.in_flight.set(&[cr], flashing as f64);
        for r in ["success", "error"] {
            fw.jobs_created.touch(&[cr, r]);
        }
        for r in ["success", "failed"] {
            fw.jobs_finished.touch(&[cr, r]);
        }
        for r in ["pdb", "drain_timeout"] {
            fw.drain_blocked.touch(&[cr, r]);
        }
        fw.pods_evicted.touch(&[cr]);
        fw.handed_over.touch(&[cr]);
        if ok {
            fw.last_reconcile.set(&[cr], now_unix_seconds());
        }
    }

    /// `ttfw_flash_jobs_created_total{cr,result}` (`success` or `error`).
    pub fn inc_flash_job_created(&self, cr: &str, ok: bool) {
        let r = if ok { "success" } else { "error" };
        self.firmware.jobs_created.add(&[cr, r], 1.0);
    }

    /// A flash ended (`success` or `failed`) after `seconds`: counted once.
    pub fn observe_flash(&self, cr: &str, ok: bool, seconds: f64) {
        let r = if ok { "success" } else { "failed" };
        self.firmware.jobs_finished.add(&[cr, r], 1.0);
        self.firmware
            .flash_duration
            .observe(&[cr, r], seconds.max(0.0));
    }

    /// `ttfw_drain_blocked_total{cr,reason}`: `pdb` (an eviction refused)
    /// or `drain_timeout` (a node's drain deadline passed).
    pub fn inc_fw_drain_blocked(&self, cr: &str, reason: &str, n: usize) {
        self.firmware.drain_blocked.add(&[cr, reason], n as f64);
    }

    pub fn inc_fw_evicted(&self, cr: &str, n: usize) {
        self.firmware.pods_evicted.add(&[cr], n as f64);
    }

    /// A flash handed its cordon to a driver policy's swap.
    pub fn inc_fw_cordon_handed_over(&self, cr: &str) {
        self.firmware.handed_over.add(&[cr], 1.0);
    }

    /// `ttfw_scheduling_surface_seconds{cr}`: a flashed node's surface was
    /// whole after `seconds`.
    pub fn observe_fw_scheduling_surface(&self, cr: &str, seconds: f64) {
        self.firmware
            .scheduling_surface
            .observe(&[cr], seconds.max(0.0));
    }

    pub fn inc_fw_error(&self, cr: &str, stage: &str) {
        self.firmware.errors.add(&[cr, stage], 1.0);
    }

    /// `ttfw_nodes_by_fw_version{version}`; replaces the whole set.
    pub fn set_nodes_by_fw_version(&self, counts: &BTreeMap<String, i64>) {
        let series = counts
            .iter()
            .map(|(v, n)| (vec![v.clone()], Value::Scalar(*n as f64)))
            .collect();
        self.firmware.nodes_by_fw_version.replace(series);
    }

    /// Drops every series of a firmware policy that is gone.
    pub fn forget_firmware_policy(&self, cr: &str) {
        for f in self.firmware.all() {
            f.lock()
                .retain(|k, _| k.first().map(String::as_str) != Some(cr));
        }
    }
}
