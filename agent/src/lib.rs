//! Node agent of the Tenstorrent driver manager (`ttdrv-agent`).
//!
//! It runs as the entrypoint of the per-policy DaemonSet pod on every matched
//! node: it detects a host-managed (DKMS) install, compares the loaded
//! `tenstorrent` module with `TT_KMD_VERSION`, unloads it when nothing holds
//! the device (or kills the holders with force-unload), loads the target
//! version from the host's cache or builds it from source, installs tt-smi
//! and labels its own Node. See docs/agent.md.

pub mod agent;
pub mod build;
pub mod cache;
pub mod error;
pub mod fake;
pub mod holder;
pub mod holders;
pub mod host;
pub mod kbuild;
pub mod kernel;
pub mod modinfo;
pub mod node;
pub mod status;

pub use agent::{Agent, Config, ModuleSource, Outcome};
pub use error::{AgentError, Result, Rollback};
pub use host::HostRoot;
