//! The Tenstorrent driver manager controller.
//!
//! Layout mirrors the architecture: decisions shared with the other programs
//! live in the `ttdrv-core` crate (the slot book and the `Cycle` trait every
//! kind's machine plugs into included); here each policy kind has its
//! actors in its own folder ([`driver`], [`firmware`]), the shared workers
//! they write through in [`workers`], and what runs them in [`runtime`].
//!
//! | module | what it holds or decides |
//! |---|---|
//! | [`driver`] | the driver policy kind: manager, its pass run by one generic policy actor per policy (its pass, marks, status), one node actor per node (its write decision, pure), rollout |
//! | [`firmware`] | the firmware policy kind (manager, its pass run by the same generic policy actor, one node actor per node) on the same workers and slot book, plus its flash Job writer |
//! | [`workers`] | the shared workers, one of each: Labeler (Node patches), Evictor, DaemonSetRenderer |
//! | [`runtime`] | what runs every kind: watches and caches (`daemon_set_index`: every DaemonSet's deploy gates), the shared context, the slot book's lock, write backoff, the generic per-policy actor (`policy_actor`: `PolicyKind`), leadership, the Go controller's exit awaited, the admin server |
//! | [`policy_decisions`] | a driver supervisor's policy-level decisions, pure: refusals, takeover, when to write status |
//! | [`refusal`] | what the cluster refuses about an accepted policy, said once |
//! | [`validation_pod`] | the user's validation pod, from its PodTemplate |
//! | [`observe`], [`status`], [`node_patch`], [`render`] | the driver kind's pure parts: caches to node facts, records to status, records to patches, policy to DaemonSet |
//! | [`config`], [`error`], [`metrics`] | settings, the one error type, metrics |

pub mod config;
pub mod driver;
pub mod error;
pub mod firmware;
pub mod metrics;
pub mod node_patch;
pub mod observe;
pub mod policy_decisions;
pub mod refusal;
pub mod render;
pub mod runtime;
pub mod status;
#[cfg(test)]
mod test_support;
pub mod validation_pod;
pub mod workers;

pub use error::{Error, Result};
