//! Metrics of this controller replica as a process: its build version,
//! whether it holds the leader lease, and what its caches hold.
//!
//! These families carry no `cr` label and survive a lost lease; setting
//! the leader gauge to 0 after 1 is what makes the collector drop every
//! per-policy series (see [`Metrics::set_leader`]).

use std::sync::atomic::{AtomicBool, Ordering};

use super::family::Families;
use super::registry::{Metrics, ReplicaMetrics, bool_value};

impl ReplicaMetrics {
    /// Creates and registers the families of this group.
    pub(super) fn register(families: &mut Families, build_version: &str) -> Self {
        let group = ReplicaMetrics {
            build_info: families.gauge(
                "ttdriver_build_info",
                "Always 1; the version label carries the controller's build version.",
                &["version"],
            ),
            leader: families.gauge(
                "ttdriver_leader",
                "1 if this controller replica holds the leader lease and drives rollouts, else 0.",
                &[],
            ),
            cache_objects: families.gauge(
                "ttdriver_cache_objects",
                "Objects this replica keeps in its watch caches, by kind (Pod: the drain facts of every bound pod; InstallerPod: our installer pods, kept whole).",
                &["kind"],
            ),
            writes_failing: families.gauge(
                "ttdriver_api_writes_failing",
                "Objects whose last write by this replica failed and whose writes are held back by their backoff (1 s doubling to 2 min), by kind (node, pod, policy_status, job, firmware_policy_status).",
                &["kind"],
            ),
            is_leader: AtomicBool::new(false),
        };
        group.build_info.set(&[build_version], 1.0);
        group.leader.set(&[], 0.0);
        for kind in crate::runtime::write_backoff::KINDS {
            group.writes_failing.set(&[kind], 0.0);
        }
        group
    }
}

impl Metrics {
    /// `ttdriver_leader` 1/0.
    ///
    /// Losing the lease (true -> false) also drops every per-policy and per-node
    /// series and `ttdriver_nodes_by_kmd_version`: a replica that no longer drives
    /// the rollout must not keep exporting a frozen copy of it next to the new
    /// leader's. The new leader, or this replica once it leads again, re-creates
    /// them on its next reconcile.
    pub fn set_leader(&self, is_leader: bool) {
        let was = self.replica.is_leader.swap(is_leader, Ordering::SeqCst);
        self.replica.leader.set(&[], bool_value(is_leader));
        if was && !is_leader {
            self.families
                .drop_policy_series(&[&self.fleet.nodes_by_kmd_version]);
        }
    }

    /// `ttdriver_cache_objects{kind}`.
    pub fn set_cache_objects(&self, kind: &str, n: usize) {
        self.replica.cache_objects.set(&[kind], n as f64);
    }

    /// `ttdriver_api_writes_failing{kind}`: every kind, 0 where none fails.
    pub fn set_writes_failing(&self, failing: &std::collections::HashMap<&'static str, usize>) {
        for kind in crate::runtime::write_backoff::KINDS {
            let n = failing.get(kind).copied().unwrap_or(0);
            self.replica.writes_failing.set(&[kind], n as f64);
        }
    }

    /// The build version this instance was created with.
    pub fn build_version(&self) -> String {
        self.replica
            .build_info
            .lock()
            .keys()
            .next()
            .and_then(|k| k.first().cloned())
            .unwrap_or_default()
    }
}
