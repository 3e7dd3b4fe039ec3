//! What the registry holds: [`Metrics`], and per group of families the
//! handles of its families. Each group's own module registers them (names,
//! help, labels, buckets) and defines the [`Metrics`] methods that update
//! them; mod.rs creates the whole. The handles are declared here, not in
//! their group's module, because [`Metrics`] names every group and every
//! group names [`Metrics`]: declared here, this file is a leaf that the
//! groups and mod.rs import, and no module imports one that imports it back.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{SystemTime, UNIX_EPOCH};

use super::family::{Families, Family};

/// Now, in Unix seconds (0 before the epoch).
pub(super) fn now_unix_seconds() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// A gauge's value of a flag: 1 or 0.
pub(super) fn bool_value(b: bool) -> f64 {
    if b { 1.0 } else { 0.0 }
}

/// The controller's metrics: a private registry plus every collector.
pub struct Metrics {
    pub(super) families: Families,
    pub(super) replica: ReplicaMetrics,
    pub(super) node: NodeMetrics,
    pub(super) policy: PolicyMetrics,
    pub(super) fleet: FleetMetrics,
    pub(super) drain: DrainMetrics,
    pub(super) daemonset: DaemonSetMetrics,
    pub(super) reconcile: ReconcileMetrics,
    pub(super) actors: ActorMetrics,
    pub(super) firmware: FirmwareMetrics,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// `ttdriver_build_info`, `ttdriver_leader`, `ttdriver_cache_objects` and
/// `ttdriver_api_writes_failing`, and whether this replica leads.
pub(super) struct ReplicaMetrics {
    pub(super) build_info: Arc<Family>,
    pub(super) leader: Arc<Family>,
    pub(super) cache_objects: Arc<Family>,
    pub(super) writes_failing: Arc<Family>,
    pub(super) is_leader: AtomicBool,
}

/// The `ttdriver_node_*` and `ttdriver_phase_duration_seconds` families.
pub(super) struct NodeMetrics {
    pub(super) node_state: Arc<Family>,
    pub(super) node_state_since: Arc<Family>,
    pub(super) node_deploy_gate_closed: Arc<Family>,
    pub(super) node_transitions: Arc<Family>,
    pub(super) phase_duration: Arc<Family>,
    pub(super) node_upgrade_duration: Arc<Family>,
    pub(super) node_failures: Arc<Family>,
    pub(super) node_rollbacks: Arc<Family>,
    pub(super) scheduling_surface: Arc<Family>,
}

/// The `ttdriver_policy_*` and `ttdriver_rollout_*` families.
pub(super) struct PolicyMetrics {
    pub(super) policy_nodes: Arc<Family>,
    pub(super) policy_paused: Arc<Family>,
    pub(super) policy_rollout_held: Arc<Family>,
    pub(super) policy_promotion_blocked: Arc<Family>,
    pub(super) policy_desired_version: Arc<Family>,
    pub(super) rollout_max_unavailable: Arc<Family>,
    pub(super) rollout_unavailable: Arc<Family>,
    pub(super) rollout_in_progress: Arc<Family>,
    pub(super) rollout_braked: Arc<Family>,
    pub(super) rollout_not_ready: Arc<Family>,
    pub(super) prepared: Arc<Family>,
    pub(super) next_kernel_failed: Arc<Family>,
}

/// `ttdriver_nodes_by_kmd_version`.
pub(super) struct FleetMetrics {
    pub(super) nodes_by_kmd_version: Arc<Family>,
}

/// `ttdriver_pods_evicted_total` and `ttdriver_drain_blocked_total`.
pub(super) struct DrainMetrics {
    pub(super) pods_evicted: Arc<Family>,
    pub(super) drain_blocked: Arc<Family>,
}

/// `ttdriver_daemonset_operations_total`.
pub(super) struct DaemonSetMetrics {
    pub(super) operations: Arc<Family>,
}

/// The `ttdriver_reconcile_*`, `ttdriver_last_successful_reconcile_*`,
/// `ttdriver_errors_total` and `ttdriver_watch_restarts_total` families.
pub(super) struct ReconcileMetrics {
    pub(super) watch_restarts: Arc<Family>,
    pub(super) errors: Arc<Family>,
    pub(super) last_successful_reconcile: Arc<Family>,
    pub(super) reconcile_total: Arc<Family>,
    pub(super) reconcile_duration: Arc<Family>,
    pub(super) nodes_examined: Arc<Family>,
    pub(super) api_requests: Arc<Family>,
}

/// `ttdriver_actor_restarts_total` and `ttdriver_actor_mailbox_full_total`.
pub(super) struct ActorMetrics {
    pub(super) actor_restarts: Arc<Family>,
    pub(super) actor_mailbox_full: Arc<Family>,
}

/// The `ttfw_*` families of the firmware policies.
pub(super) struct FirmwareMetrics {
    pub(super) policy_nodes: Arc<Family>,
    pub(super) desired_version: Arc<Family>,
    pub(super) nodes_by_fw_version: Arc<Family>,
    pub(super) jobs_created: Arc<Family>,
    pub(super) jobs_finished: Arc<Family>,
    pub(super) flash_duration: Arc<Family>,
    pub(super) in_flight: Arc<Family>,
    pub(super) drain_blocked: Arc<Family>,
    pub(super) pods_evicted: Arc<Family>,
    pub(super) handed_over: Arc<Family>,
    pub(super) scheduling_surface: Arc<Family>,
    pub(super) errors: Arc<Family>,
    pub(super) last_reconcile: Arc<Family>,
}
