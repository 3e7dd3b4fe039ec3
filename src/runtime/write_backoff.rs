//! Per-object backoff for the controller's API writes: an object whose last
//! write failed (after the writer's own retries of transient errors) is not
//! written again until its backoff has passed, doubling from one second to two
//! minutes with each further failure, and cleared by the next success.
//!
//! Without it a write the API server keeps refusing (an admission policy, a
//! webhook that is down, RBAC) was sent again on every pass, for every node
//! it concerned: load on the API server and a log line a second, and no better
//! chance of success. controller-runtime's and kube-rs's controllers requeue a
//! failing object with a per-object backoff for the same reason.
//!
//! What is not a failure here: a conflict on a resourceVersion precondition (a
//! stale decision the next pass remakes), a 404 where the object going is the
//! point (a pod to evict or delete), a PodDisruptionBudget's 429 (the drain's
//! normal "not yet"). Holding a write back never skips a safety step: the
//! state machine does not move on without the write it asked for.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The first backoff after a failure.
pub const FIRST: Duration = Duration::from_secs(1);
/// The longest backoff: the next try of a write that keeps failing comes at
/// least this often, so a fixed cause (a relaxed admission policy) is picked
/// up within it.
pub const LONGEST: Duration = Duration::from_secs(120);

/// The object a write is for, as the key of its backoff.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum WriteTarget {
    Node(String),
    Pod {
        namespace: String,
        name: String,
    },
    PolicyStatus(String),
    /// A flash Job to create.
    Job {
        namespace: String,
        name: String,
    },
    /// A firmware policy's status.
    FirmwarePolicyStatus(String),
}

/// Every [`WriteTarget::kind`].
pub const KINDS: [&str; 5] = [
    "node",
    "pod",
    "policy_status",
    "job",
    "firmware_policy_status",
];

impl WriteTarget {
    /// Bounded label for metrics (one of [`KINDS`]).
    pub fn kind(&self) -> &'static str {
        match self {
            WriteTarget::Node(_) => "node",
            WriteTarget::Pod { .. } => "pod",
            WriteTarget::PolicyStatus(_) => "policy_status",
            WriteTarget::Job { .. } => "job",
            WriteTarget::FirmwarePolicyStatus(_) => "firmware_policy_status",
        }
    }
}

impl std::fmt::Display for WriteTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WriteTarget::Node(n) => write!(f, "node {n}"),
            WriteTarget::Pod { namespace, name } => write!(f, "pod {namespace}/{name}"),
            WriteTarget::PolicyStatus(p) => write!(f, "status of policy {p}"),
            WriteTarget::Job { namespace, name } => write!(f, "job {namespace}/{name}"),
            WriteTarget::FirmwarePolicyStatus(p) => write!(f, "status of firmware policy {p}"),
        }
    }
}

/// Why a write was not sent: the object's backoff after its last failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// Failures in a row.
    pub failures: u32,
    pub retry_at: Instant,
    /// The last failure, as the writer reported it.
    pub error: String,
}

/// The backoff after `failures` failures in a row (at least 1).
pub fn delay(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    FIRST.saturating_mul(1 << doublings).min(LONGEST)
}

#[derive(Debug, Default)]
pub struct WriteBackoff {
    held: HashMap<WriteTarget, Held>,
}

impl WriteBackoff {
    /// `Some` while `target`'s writes are held back at `now`.
    pub fn check(&self, target: &WriteTarget, now: Instant) -> Option<&Held> {
        self.held.get(target).filter(|h| now < h.retry_at)
    }

    /// A write to `target` failed at `now`: returns how long its writes are
    /// held back. Entries nobody retried for a long while (the object is
    /// gone) are dropped on the way.
    pub fn failed(&mut self, target: WriteTarget, now: Instant, error: String) -> Duration {
        self.held
            .retain(|_, h| now.saturating_duration_since(h.retry_at) < 2 * LONGEST);
        let failures = self.held.get(&target).map_or(0, |h| h.failures) + 1;
        let wait = delay(failures);
        self.held.insert(
            target,
            Held {
                failures,
                retry_at: now + wait,
                error,
            },
        );
        wait
    }

    /// A write to `target` succeeded: its backoff ends.
    pub fn succeeded(&mut self, target: &WriteTarget) {
        self.held.remove(target);
    }

    /// How many objects of each kind have a failed last write.
    pub fn failing(&self) -> HashMap<&'static str, usize> {
        let mut out = HashMap::new();
        for t in self.held.keys() {
            *out.entry(t.kind()).or_insert(0) += 1;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(n: &str) -> WriteTarget {
        WriteTarget::Node(n.into())
    }

    #[test]
    fn the_backoff_doubles_from_one_second_to_two_minutes() {
        let waits: Vec<u64> = (1..=10).map(|f| delay(f).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 64, 120, 120, 120]);
        assert_eq!(delay(0), FIRST);
        assert_eq!(delay(u32::MAX), LONGEST);
    }

    #[test]
    fn a_failed_object_is_held_until_its_backoff_passes_and_others_are_not() {
        let t0 = Instant::now();
        let mut b = WriteBackoff::default();
        assert_eq!(b.check(&node("a"), t0), None);
        assert_eq!(b.failed(node("a"), t0, "denied".into()), FIRST);
        let held = b.check(&node("a"), t0).expect("held");
        assert_eq!((held.failures, held.error.as_str()), (1, "denied"));
        assert_eq!(b.check(&node("b"), t0), None, "another node is not held");
        assert!(
            b.check(&node("a"), t0 + FIRST).is_none(),
            "free again after 1 s"
        );
        // The next failure doubles the wait; success clears it.
        assert_eq!(b.failed(node("a"), t0 + FIRST, "denied".into()), 2 * FIRST);
        assert!(b.check(&node("a"), t0 + 2 * FIRST).is_some());
        assert_eq!(b.failing().get("node"), Some(&1));
        b.succeeded(&node("a"));
        assert_eq!(b.check(&node("a"), t0 + 2 * FIRST), None);
        assert!(b.failing().is_empty());
        // And a failure after the success starts from one second again.
        assert_eq!(b.failed(node("a"), t0, "denied".into()), FIRST);
    }

    #[test]
    fn entries_nobody_retries_are_dropped() {
        let t0 = Instant::now();
        let mut b = WriteBackoff::default();
        b.failed(node("gone"), t0, "x".into());
        let pod = WriteTarget::Pod {
            namespace: "ml".into(),
            name: "p".into(),
        };
        b.failed(pod.clone(), t0 + 3 * LONGEST, "y".into());
        assert_eq!(b.failing().get("node"), None, "the node's entry expired");
        assert_eq!(b.failing().get("pod"), Some(&1));
    }
}
