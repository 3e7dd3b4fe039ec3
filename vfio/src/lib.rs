//! The VFIO binder of the driver manager (`ttdrv-vfio-manage`, the chart's
//! `vfioManager` DaemonSet): binds the configured Tenstorrent PCI functions to
//! `vfio-pci` for VM passthrough, keeps them there, reports what it found on
//! its Node ([`ttdrv_api::vfio`]) and can put them back on their original
//! driver on exit. The Rust replacement of the Go operator's `vfio-manage`,
//! with its flags, config file and metric names.
//!
//! Modules bottom-up; each uses only modules listed above it:
//!
//! - [`error`]: the one error type, [`VfioError`].
//! - [`config`]: the device list (`--config`), parsed and validated as Go's.
//! - [`plan`]: the pure decisions: what to bind, refuse, restore, record and report.
//! - [`sysfs`]: the host's PCI functions read and written through the agent's
//!   hostfs (no link followed but sysfs's own device links, resolved inside the host root).
//! - [`state`]: what the binder moved (original driver, identity), kept across restarts.
//! - [`metrics`]: the Prometheus families (Go's names) and the `/metrics`, `/healthz` server.
//! - [`binder`]: a pass and a restore, executing the plans.
//! - [`node`]: the report on the binder's own Node (annotation, label).

pub mod binder;
pub mod config;
pub mod error;
pub mod metrics;
pub mod node;
pub mod plan;
pub mod state;
pub mod sysfs;

pub use error::{Result, VfioError};
