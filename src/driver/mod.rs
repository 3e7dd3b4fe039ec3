//! The driver kind's actors (actix on the tokio runtime), on the shared
//! workers of [`crate::workers`]:
//!
//! ```text
//! watches ──Kick──▶ PolicyManager ──RunPass(Reconcile)──▶ PolicySupervisor (one per policy: the
//!                                                  │  generic PolicyActor running the driver kind's pass)
//!                                                  │  PlanRollout ▶ RolloutActor (per policy): grants and reserves slots
//!                                                  │  Observe     ▶ NodeActor (one per owned node), a granted slot in it
//!                                                  │  Ensure      ▶ DaemonSetRenderer (shared)
//! NodeActor ── ReleaseSlot ▶ RolloutActor (its policy's)
//!           ── PatchNode ▶ Labeler (shared) · Evict ▶ Evictor (shared)
//!           ── ReplaceInstallerPod ▶ DaemonSetRenderer (shared)
//!           ── RunValidationPod · DeleteValidationPod ▶ ValidationPods (its policy's)
//! ```
//!
//! Actors only carry out what the pure modules decide: `ttdrv_core` (state
//! machine, drain, rollout, selection) and [`crate::observe`], [`crate::status`],
//! [`crate::node_patch`], [`crate::render`].

pub mod manager;
pub mod messages;
pub mod node;
pub mod rollout;
pub mod supervisor;

pub use manager::{Kick, PolicyManager, Scope};
pub use messages::{PassScope, Reconcile, RefusalChanged};
pub use node::{NodeActor, Observe};
pub use rollout::{PlanRollout, ReleaseSlot, RolloutActor};
pub use supervisor::{DriverKind, PolicySupervisor, supervisor};
