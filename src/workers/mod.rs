//! The shared workers every policy kind sends its API writes through, one
//! of each per controller: the [`labeler::Labeler`] (Node patches, under
//! per-object write backoff), the [`evictor::Evictor`] (evictions) and the
//! [`renderer::DaemonSetRenderer`] (installer DaemonSets and their pods).
//! Kinds reach them through ports (actix recipients), so tests put fakes in
//! their place.

pub mod evictor;
pub mod labeler;
pub mod renderer;

pub use evictor::{Evict, EvictOutcome, Evictor};
pub use labeler::{Labeler, PatchNode};
pub use renderer::{DaemonSetRenderer, Ensure, ReplaceInstallerPod};
