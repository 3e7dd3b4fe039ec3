//! The Tenstorrent driver manager controller.
//!
//! Layout mirrors the architecture: decisions shared with the other programs live
//! in the `ttdrv-core` crate; the controller's own pure parts are [`observe`]
//! (caches → what a node looks like), [`status`] (records → policy status),
//! [`node_patch`] and [`render`]; the actors that carry decisions out are in
//! [`actors`]; the watches that feed them in [`watch`] (and [`pod_index`]);
//! process plumbing in [`leader`], [`handover`] (the Go controller's exit
//! awaited) and [`admin`].
//!
//! | module | what it holds or decides |
//! |---|---|
//! | [`actors`] | the driver policy's actors (manager, supervisor, node, rollout) and the shared workers (Labeler, Evictor, DaemonSetRenderer) |
//! | [`firmware`] | the firmware policy's actors on the same workers, plus its flash Job writer |
//! | [`claims`] | one disruption at a time, in process: who holds a node, within which budget |
//! | [`policy_decisions`] | a supervisor's policy-level decisions, pure: refusals, takeover, when to write status |
//! | [`refusal`] | what the cluster refuses about an accepted policy, said once |
//! | [`validation_pod`] | the user's validation pod, from its PodTemplate |
//! | [`observe`], [`status`], [`node_patch`], [`render`] | caches to node facts, records to status, records to patches, policy to DaemonSet |
//! | [`watch`], [`pod_index`] | the watches and the per-node pod index |
//! | [`context`], [`config`], [`error`], [`metrics`], [`write_backoff`] | what every actor shares: settings, the one error type, metrics, per-object write backoff |
//! | [`leader`], [`handover`], [`admin`] | leadership, the Go controller's exit awaited, the admin server (`/ready` follows the caches) |

pub mod actors;
pub mod admin;
pub mod claims;
pub mod config;
pub mod context;
pub mod error;
pub mod firmware;
pub mod handover;
pub mod leader;
pub mod metrics;
pub mod node_patch;
pub mod observe;
pub mod pod_index;
pub mod policy_decisions;
pub mod refusal;
pub mod render;
pub mod status;
#[cfg(test)]
mod test_support;
pub mod validation_pod;
pub mod watch;
pub mod write_backoff;

pub use error::{Error, Result};
