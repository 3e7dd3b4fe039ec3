//! The actor system (actix on the tokio runtime):
//!
//! ```text
//! watches ──Kick──▶ PolicyManager ──Reconcile──▶ PolicySupervisor (one per policy)
//!                                                  │  PlanRollout ▶ RolloutActor (per policy)
//!                                                  │  Observe     ▶ NodeActor (one per owned node)
//!                                                  │  Ensure      ▶ DaemonSetRenderer (shared)
//! NodeActor ── PatchNode ▶ Labeler (shared) · Evict ▶ Evictor (shared) · DeletePod ▶ DaemonSetRenderer
//! ```
//!
//! Actors only carry out what the pure modules in [`crate::upgrade`] decide.

pub mod evictor;
pub mod labeler;
pub mod manager;
pub mod node;
pub mod renderer;
pub mod rollout;
pub mod supervisor;

pub use evictor::{Evict, EvictOutcome, Evictor};
pub use labeler::{Labeler, PatchNode};
pub use manager::{Kick, PassScope, PolicyManager, Scope};
pub use node::{NodeActor, Observe};
pub use renderer::{DaemonSetRenderer, DeletePod, Ensure};
pub use rollout::{PlanRollout, RolloutActor};
pub use supervisor::{PolicySupervisor, Reconcile};

/// Retry policy for API writes: conflicts, throttling and server errors
/// (callers add `.adjust(honor_retry_after)` to wait at least the server's
/// Retry-After).
pub(crate) fn backoff() -> backon::ExponentialBuilder {
    backon::ExponentialBuilder::default()
        .with_min_delay(std::time::Duration::from_millis(100))
        .with_max_delay(std::time::Duration::from_secs(5))
        .with_max_times(6)
        .with_jitter()
}
