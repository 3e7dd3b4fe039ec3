//! The Tenstorrent driver manager controller.
//!
//! Layout mirrors the architecture: decisions shared with the other programs live
//! in the `ttdrv-core` crate; the controller's own pure parts are [`observe`]
//! (caches → what a node looks like), [`status`] (records → policy status),
//! [`node_patch`] and [`render`]; the actors that carry decisions out are in
//! [`actors`]; the watches that feed them in [`watch`] (and [`pod_index`]);
//! process plumbing in [`leader`], [`handover`] (the Go controller's exit
//! awaited) and [`admin`].

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
