//! The run sequence of the spec's "Each pod's entrypoint", as a function that
//! returns what it did, so tests drive it on a fake host root.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ttdrv_api::labels;

use crate::build::{BuildRequest, Builder};
use crate::cache::{self, Cache};
use crate::error::{AgentError, Result, Rollback};
use crate::holder::Holder;
use crate::holders::find_holders;
use crate::host::{HostRoot, MODULE_NAME, ModuleState, validate_version, version_matches};
use crate::kernel::{KernelOps, ProcessKiller};
use crate::node::{LabelChanges, NodeApi};

/// Where tt-smi is installed on the host.
pub const TT_SMI_HOST_PATH: &str = "/usr/local/bin/tt-smi";

#[derive(Debug, Clone)]
pub struct Config {
    pub host_root: PathBuf,
    /// TT_KMD_VERSION.
    pub target_version: String,
    /// TT_FORCE_UNLOAD: SIGKILL holders of the device before unloading.
    pub force_unload: bool,
    /// How long to wait for refcnt 0 after killing holders.
    pub unload_timeout: Duration,
    /// TT_KMD_SOURCE_REPOSITORY (used by the real builder).
    pub source_repository: String,
    /// Bundled tt-smi binary, a path in the agent's own filesystem.
    pub tt_smi_path: PathBuf,
    /// TT_SMI_VERSION.
    pub tt_smi_version: Option<String>,
    /// Where the host's Debian kbuild trees are linked into the agent's own
    /// filesystem before a build (its `/usr/lib`); None when the agent runs
    /// on the host itself. See [`crate::kbuild`].
    pub kbuild_link_dir: Option<PathBuf>,
}

/// Where the loaded module came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModuleSource {
    Cache,
    Build,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// DKMS manages the module: labelled, nothing written to the host.
    HostManaged {
        signals: Vec<String>,
        loaded: Option<String>,
    },
    /// The target version was loaded already.
    AlreadyCurrent { version: String },
    /// The target version was loaded by this run.
    Installed {
        version: String,
        previous: Option<String>,
        source: ModuleSource,
        killed: Vec<Holder>,
    },
}

impl Outcome {
    pub fn summary(&self) -> String {
        match self {
            Outcome::HostManaged { signals, loaded } => format!(
                "result=host-managed loaded={} signals={}",
                loaded.as_deref().unwrap_or("none"),
                signals.join(",")
            ),
            Outcome::AlreadyCurrent { version } => {
                format!("result=already-current version={version}")
            }
            Outcome::Installed {
                version,
                previous,
                source,
                killed,
            } => format!(
                "result=installed version={version} previous={} source={} killed_pids={}",
                previous.as_deref().unwrap_or("none"),
                match source {
                    ModuleSource::Cache => "cache",
                    ModuleSource::Build => "build",
                },
                if killed.is_empty() {
                    "none".to_string()
                } else {
                    killed
                        .iter()
                        .map(|h| h.pid.to_string())
                        .collect::<Vec<_>>()
                        .join(",")
                }
            ),
        }
    }
}

/// Runs `f` as a named step and logs its duration and result.
pub fn step<T>(name: &'static str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let start = Instant::now();
    let r = f();
    let duration_ms = start.elapsed().as_millis() as u64;
    match &r {
        Ok(_) => tracing::info!(step = name, duration_ms, "step done"),
        Err(e) => tracing::error!(step = name, duration_ms, error = %e, "step failed"),
    }
    r
}

pub struct Agent<'a> {
    pub config: &'a Config,
    pub kernel: &'a dyn KernelOps,
    pub killer: &'a dyn ProcessKiller,
    pub builder: &'a dyn Builder,
    pub node: &'a dyn NodeApi,
}

impl Agent<'_> {
    fn root(&self) -> HostRoot {
        HostRoot::new(&self.config.host_root)
    }

    /// The whole sequence; idling afterwards is the caller's business.
    pub fn run(&self) -> Result<Outcome> {
        let root = self.root();

        let signals = step("detect-host-install", || Ok(root.host_install_signals()))?;
        if !signals.is_empty() {
            return self.run_host_managed(&root, signals);
        }

        let target = validate_version(&self.config.target_version)?;
        let kver = step("kernel-release", || root.kernel_release())?;
        let state = step("read-module-state", || root.module_state())?;
        tracing::info!(
            kernel = %kver,
            target = %target,
            loaded = state.as_ref().and_then(|s| s.version.as_deref()).unwrap_or("none"),
            refcnt = state.as_ref().map_or(0, |s| s.refcnt),
            "host state"
        );

        if version_matches(state.as_ref().and_then(|s| s.version.as_deref()), &target) {
            self.device_access(&root);
            let smi = step("install-tt-smi", || self.install_tt_smi(&root))?;
            step("label-node", || self.label_container(&target, smi))?;
            return Ok(Outcome::AlreadyCurrent { version: target });
        }

        // Refuse early, before any build, when the device is in use.
        if let Some(s) = &state
            && s.refcnt > 0
            && !self.config.force_unload
        {
            return Err(self.busy_error(&root, s));
        }

        // Get the new module before touching the old one: a failed build
        // (missing headers, missing tag, unwritable cache) leaves the node
        // with the driver it had.
        let (ko, source) = self.obtain_module(&root, &kver, &target)?;

        let mut killed = Vec::new();
        let previous = match &state {
            Some(s) => {
                killed = step("make-unloadable", || self.make_unloadable(&root))?;
                step("unload", || {
                    self.kernel
                        .unload(MODULE_NAME)
                        .map_err(|source| AgentError::Unload {
                            loaded: loaded_name(s),
                            source,
                        })
                })?;
                Some(s.version.clone())
            }
            None => None,
        };

        step("load", || {
            self.load_with_rollback(&root, &kver, &target, &ko, previous.as_ref())
        })?;

        step("readback", || {
            let found = root.loaded_version()?;
            if version_matches(found.as_deref(), &target) {
                Ok(())
            } else {
                Err(AgentError::ReadbackMismatch {
                    expected: target.clone(),
                    found,
                })
            }
        })?;

        self.device_access(&root);
        let smi = step("install-tt-smi", || self.install_tt_smi(&root))?;
        step("label-node", || self.label_container(&target, smi))?;
        Ok(Outcome::Installed {
            version: target,
            previous: previous.flatten(),
            source,
            killed,
        })
    }

    fn run_host_managed(&self, root: &HostRoot, signals: Vec<String>) -> Result<Outcome> {
        tracing::info!(
            ?signals,
            "host-managed tt-kmd install detected: not touching the host"
        );
        let loaded = root.loaded_version()?;
        let mut changes = LabelChanges::new();
        changes.insert(
            labels::INSTALL_MODE.into(),
            Some(labels::INSTALL_MODE_HOST.into()),
        );
        changes.insert(
            labels::KMD_VERSION.into(),
            loaded.clone().filter(|v| valid_label_value(v)),
        );
        step("label-node", || self.apply_labels(&changes))?;
        Ok(Outcome::HostManaged { signals, loaded })
    }

    fn busy_error(&self, root: &HostRoot, s: &ModuleState) -> AgentError {
        AgentError::Busy {
            loaded: loaded_name(s),
            refcnt: s.refcnt,
            holders: self.holders_with_pods(root),
        }
    }

    /// Holders, with pod names filled in when the API server knows their UIDs.
    pub fn holders_with_pods(&self, root: &HostRoot) -> Vec<Holder> {
        let mut holders = find_holders(root);
        if holders.iter().any(|h| h.pod_uid.is_some()) {
            let pods = self.node.pod_names();
            for h in &mut holders {
                h.pod = h.pod_uid.as_ref().and_then(|u| pods.get(u).cloned());
            }
        }
        holders
    }

    /// Cache hit, or build + store. Returns the cached path and its source.
    fn obtain_module(
        &self,
        root: &HostRoot,
        kver: &str,
        target: &str,
    ) -> Result<(PathBuf, ModuleSource)> {
        let cache = Cache::new(root);
        if let Some(hit) = step("cache-lookup", || cache.lookup(kver, target))? {
            tracing::info!(path = %hit.display(), "cache hit");
            return Ok((hit, ModuleSource::Cache));
        }
        tracing::info!(path = %cache.path(kver, target).display(), "cache miss: building from source");
        let headers_host = format!("/lib/modules/{kver}/build");
        // Follow the build link as the host would (absolute targets under the
        // root); if that leads nowhere, let the OS follow it, which works when
        // the pod mounts the host's /usr/src at the same path (Debian's
        // headers use absolute paths internally anyway).
        let headers = match root.resolve(&headers_host) {
            h if h.is_dir() => h,
            _ => root.path(&headers_host),
        };
        if !headers.is_dir() {
            return Err(AgentError::HeadersMissing {
                kver: kver.to_string(),
                dir: root.path(&headers_host),
            });
        }
        if let Some(dir) = &self.config.kbuild_link_dir {
            for link in crate::kbuild::link_host_kbuild(root, dir)? {
                tracing::info!(link = %link.display(), "host kbuild tree linked for the build");
            }
        }
        let workdir = tempfile::Builder::new()
            .prefix("ttdrv-build-")
            .tempdir()
            .map_err(|e| {
                AgentError::io("creating a build directory in", std::env::temp_dir(), e)
            })?;
        let built = step("build", || {
            self.builder.build(&BuildRequest {
                version: target,
                kernel_release: kver,
                headers: &headers,
                workdir: workdir.path(),
            })
        })?;
        let found = crate::modinfo::module_version(&built)?;
        if found.as_deref() != Some(target) {
            return Err(AgentError::BuiltWrongVersion {
                path: built,
                expected: target.to_string(),
                found,
            });
        }
        let stored = step("cache-store", || cache.store(kver, target, &built))?;
        Ok((stored, ModuleSource::Build))
    }

    /// With force-unload, SIGKILLs every holder and waits (bounded) for refcnt
    /// 0; holders that show up meanwhile are killed too. Returns those killed.
    fn make_unloadable(&self, root: &HostRoot) -> Result<Vec<Holder>> {
        let deadline = Instant::now() + self.config.unload_timeout;
        let start = Instant::now();
        let mut killed: Vec<Holder> = Vec::new();
        let mut seen: HashSet<u32> = HashSet::new();
        loop {
            let refcnt = root.module_refcnt()?;
            if refcnt == 0 {
                return Ok(killed);
            }
            if !self.config.force_unload {
                let state = root.module_state()?.unwrap_or(ModuleState {
                    version: None,
                    refcnt,
                });
                return Err(self.busy_error(root, &state));
            }
            if Instant::now() >= deadline {
                return Err(AgentError::UnloadTimeout {
                    refcnt,
                    waited_ms: start.elapsed().as_millis(),
                    holders: self.holders_with_pods(root),
                });
            }
            for h in self.holders_with_pods(root) {
                if seen.insert(h.pid) {
                    tracing::warn!(pid = h.pid, comm = %h.comm, pod = h.pod.as_deref().or(h.pod_uid.as_deref()).unwrap_or("-"), "force-unload: sending SIGKILL to device holder");
                    self.killer.kill(h.pid).map_err(|source| AgentError::Kill {
                        pid: h.pid,
                        comm: h.comm.clone(),
                        source,
                    })?;
                    killed.push(h);
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn load_with_rollback(
        &self,
        root: &HostRoot,
        kver: &str,
        target: &str,
        ko: &Path,
        previous: Option<&Option<String>>,
    ) -> Result<()> {
        let Err(e) = self.kernel.load(ko) else {
            return Ok(());
        };
        tracing::error!(version = target, error = %e, "loading the new module failed; rolling back");
        let now = || root.loaded_version().ok().flatten();
        let rollback = match previous {
            None => Rollback::NothingLoadedBefore,
            Some(None) => Rollback::NotCached {
                previous: "(unversioned)".into(),
                path: PathBuf::from(cache::CACHE_DIR),
                now_loaded: now(),
            },
            Some(Some(prev)) => match validate_version(prev)
                .ok()
                .and_then(|p| Cache::new(root).lookup(kver, &p).ok().flatten())
            {
                None => Rollback::NotCached {
                    previous: prev.clone(),
                    path: PathBuf::from(Cache::host_path(kver, prev)),
                    now_loaded: now(),
                },
                Some(path) => match self.kernel.load(&path) {
                    Ok(()) => Rollback::Restored {
                        previous: prev.clone(),
                    },
                    Err(e2) => Rollback::Failed {
                        previous: prev.clone(),
                        error: e2.to_string(),
                        now_loaded: now(),
                    },
                },
            },
        };
        Err(AgentError::LoadFailed {
            version: target.to_string(),
            path: ko.to_path_buf(),
            error: e.to_string(),
            rollback: Box::new(rollback),
        })
    }

    /// The udev rule, device modes and the old venv (crate::devices): best
    /// effort, a failure is a warning.
    fn device_access(&self, root: &HostRoot) {
        let d = crate::devices::ensure_device_access(root);
        tracing::info!(
            rule_written = d.rule_written,
            udev_reloaded = ?d.udev_reloaded,
            chmodded = ?d.chmodded,
            removed = ?d.removed,
            "device access"
        );
        for w in &d.warnings {
            tracing::warn!(warning = %w, "device access step failed (the install stands)");
        }
    }

    /// Copies the bundled tt-smi to the host. Returns whether it is installed.
    fn install_tt_smi(&self, root: &HostRoot) -> Result<bool> {
        let src = &self.config.tt_smi_path;
        if !src.is_file() {
            tracing::warn!(path = %src.display(), "bundled tt-smi not found: not installing it and not labelling its version");
            return Ok(false);
        }
        let dest = root.path(TT_SMI_HOST_PATH);
        if let (Ok(a), Ok(b)) = (fs::read(src), fs::read(&dest)) {
            use std::os::unix::fs::PermissionsExt;
            let mode_ok =
                fs::metadata(&dest).is_ok_and(|m| m.permissions().mode() & 0o777 == 0o755);
            if a == b && mode_ok {
                tracing::info!(path = TT_SMI_HOST_PATH, "tt-smi already up to date");
                return Ok(true);
            }
        }
        cache::atomic_copy(src, &dest, 0o755).map_err(|(path, source)| AgentError::Io {
            op: "installing tt-smi at",
            path,
            source,
        })?;
        Ok(true)
    }

    fn label_container(&self, version: &str, tt_smi_installed: bool) -> Result<()> {
        let mut changes = LabelChanges::new();
        changes.insert(
            labels::INSTALL_MODE.into(),
            Some(labels::INSTALL_MODE_CONTAINER.into()),
        );
        changes.insert(labels::KMD_VERSION.into(), Some(version.to_string()));
        if tt_smi_installed {
            match &self.config.tt_smi_version {
                Some(v) if valid_label_value(v) => {
                    changes.insert(labels::TT_SMI_VERSION.into(), Some(v.clone()));
                }
                Some(v) => {
                    tracing::warn!(version = %v, "TT_SMI_VERSION is not a valid label value; not labelling it")
                }
                None => tracing::warn!("TT_SMI_VERSION not set; not labelling the tt-smi version"),
            }
        }
        self.apply_labels(&changes)
    }

    fn apply_labels(&self, changes: &LabelChanges) -> Result<()> {
        self.node
            .label(changes)
            .map_err(|reason| AgentError::Label {
                node: self.node.node_name().to_string(),
                reason,
            })
    }
}

fn loaded_name(s: &ModuleState) -> String {
    s.version
        .clone()
        .unwrap_or_else(|| "(unversioned)".to_string())
}

/// A Kubernetes label value: at most 63 characters of `[A-Za-z0-9._-]`,
/// beginning and ending with an alphanumeric.
pub fn valid_label_value(v: &str) -> bool {
    v.len() <= 63
        && !v.is_empty()
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        && v.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && v.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
}
