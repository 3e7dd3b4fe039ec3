//! The actor system (actix on the tokio runtime):
//!
//! ```text
//! watches ──Kick──▶ PolicyManager ──Reconcile──▶ PolicySupervisor (one per policy)
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

pub mod evictor;
pub mod labeler;
pub mod manager;
pub mod messages;
pub mod node;
pub mod renderer;
pub mod rollout;
pub mod supervisor;

pub use evictor::{Evict, EvictOutcome, Evictor};
pub use labeler::{Labeler, PatchNode};
pub use manager::{Kick, PolicyManager, Scope};
pub use messages::{PassScope, Reconcile, RefusalChanged};
pub use node::{NodeActor, Observe};
pub use renderer::{DaemonSetRenderer, Ensure, ReplaceInstallerPod};
pub use rollout::{PlanRollout, ReleaseSlot, RolloutActor};
pub use supervisor::PolicySupervisor;
