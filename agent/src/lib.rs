//! Node agent of the Tenstorrent driver manager (`ttdrv-agent`).
//!
//! It runs as the entrypoint of the per-policy DaemonSet pod on every matched
//! node: it labels its own Node with what the host runs (install mode, loaded
//! version, boot ID), detects a host-managed (DKMS) install, compares the
//! loaded `tenstorrent` module with `TT_KMD_VERSION`, gets the target version
//! from the host's cache or builds it from source, installs tt-smi, and only
//! with the controller's go-ahead on the Node (the second key) unloads a
//! loaded module of another version when nothing holds the device (or kills
//! the holders with force-unload) and loads the target. When it gives up on a
//! busy device, a failed build or a refused load it says so in its
//! termination message. See docs/agent.md.
//!
//! The test fakes (`fake`, `node::fake::FakeNode`) are built only with the `fake`
//! feature, which the crate's own tests turn on (its self dev-dependency):
//! the shipped lib and binary carry none of them.
//!
//! Modules bottom-up; each uses only modules listed above it:
//!
//! - [`holder`]: a process holding /dev/tenstorrent (PID, comm, pod, container), plain data.
//! - [`kernel`]: loading/unloading the module and killing holders, behind traits.
//! - [`node`]: the agent's own Node (read for the go-ahead, labelled) and pod names, behind a trait; its fake `FakeNode` only with the `fake` feature.
//! - [`hostfs`]: host files walked from the root without following links, bounded non-blocking reads, atomic writes.
//! - [`error`]: [`AgentError`], [`Rollback`], and each error's reason and termination message; uses `holder`, `hostfs`.
//! - [`host`]: [`HostRoot`]: host paths, kernel release, boot ID, module state, version checks; uses `error`, `hostfs`.
//! - [`pod`]: the agent's own pod: pauses that SIGTERM ends, the waiting note, readiness, the termination message; uses `host`.
//! - [`holders`]: the /proc walk that finds holders; uses `holder`, `host`.
//! - [`modprobe`]: the host's own `options tenstorrent` lines in modprobe.d, adopted at every load; uses `host`, `hostfs`.
//! - [`modinfo`]: a module file's `.modinfo` version; uses `error`.
//! - [`build`]: building the module with git and make, the source pin; uses `error`, `host`.
//! - [`deps`]: the modules tt-kmd depends on, found in `modules.dep` and loaded first; uses `error`, `host`, `kernel`, `modinfo`.
//! - [`signing`]: module signatures: enforcement (sig_enforce, lockdown), whether a module is signed, whether the kernel trusts its key (a probe while the old module is loaded), signing it with the configured key pair and the kernel's sign-file; uses `error`, `host`, `hostfs`, `kernel`, `build`.
//! - [`cache`]: the verified module cache on the host (record, checks, eviction, pruning); uses `error`, `host`, `hostfs`, `modinfo`, `signing`.
//! - [`kbuild`]: linking the host's Debian kbuild trees for a build; uses `error`, `host`.
//! - [`devices`]: the udev rule, device-node modes and the old /opt/tt venv; uses `host`, `hostfs`.
//! - [`validate`]: the check after a swap (every card served before is served after, its attributes readable) and the swap record kept on the host; uses `cache`, `host`, `hostfs`.
//! - [`agent`]: the run sequence and its decisions (labels, the second key); uses all of the above.
//! - [`unload`]: `spec.unmanage`: unload only, with the unload go-ahead; uses `agent`, `pod`.
//! - [`status`]: the `status` subcommand's report; uses `agent`, `cache`, `holders`, `host`, `signing`.
//! - `fake` (feature `fake`, off by default; tests only): fake kernel, builder and host layout; uses `build`, `cache`, `deps`, `error`, `host`, `kernel`, `modinfo`.

pub mod agent;
pub mod build;
pub mod cache;
pub mod deps;
pub mod devices;
pub mod error;
#[cfg(feature = "fake")]
pub mod fake;
pub mod holder;
pub mod holders;
pub mod host;
pub mod hostfs;
pub mod kbuild;
pub mod kernel;
pub mod modinfo;
pub mod modprobe;
pub mod node;
pub mod pod;
pub mod signing;
pub mod status;
pub mod unload;
pub mod validate;

pub use agent::{Agent, Config, ModuleSource, Outcome};
pub use error::{AgentError, Result, Rollback};
pub use host::HostRoot;
