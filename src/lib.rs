//! The Tenstorrent driver manager controller.
//!
//! Layout mirrors the architecture: pure decisions in [`upgrade`], [`render`] and
//! [`selection`]; the actors that carry them out in [`actors`]; the watches that
//! feed them in [`watch`] (and [`pod_index`]); process plumbing in [`leader`] and [`admin`].

pub mod actors;
pub mod admin;
pub mod config;
pub mod context;
pub mod error;
pub mod leader;
pub mod metrics;
pub mod pod_index;
pub mod render;
pub mod selection;
pub mod upgrade;
pub mod watch;

pub use error::{Error, Result};
