//! The run sequence of the spec's "Each pod's entrypoint", as a function that
//! returns what it did, so tests drive it on a fake host root, and the
//! decisions it takes on the way: what the host reports ([`host_labels`]),
//! whether a loaded module may be swapped (the second key, [`swap_decision`]).

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use ttdrv_api::labels::{self, env};
use ttdrv_core::go_ahead::{self, Swap};

use crate::build::{BuildRequest, Builder};
use crate::cache::{self, Cache, SignedBy, Verified};
use crate::error::{AgentError, Result, Rollback};
use crate::holder::Holder;
use crate::holders::find_holders;
use crate::host::{HostRoot, MODULE_NAME, ModuleState, is_loaded, validate_version};
use crate::kernel::{KernelOps, ProcessKiller};
use crate::modprobe::HostOptions;
use crate::node::{LabelChanges, NodeApi};
use crate::pod::{self, Pause};
use crate::validate::{self, Inventory, SwapOutcome, SwapRecord};
use ttdrv_api::OnValidationFailure;
use ttdrv_api::module_params::{self, Values};
use ttdrv_core::node::Target;

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
    /// TTDRV_POLICY: the policy whose go-ahead may open a swap. None (or
    /// empty) fails closed: a loaded module of another version is never swapped.
    pub policy: Option<String>,
    /// How often to look for the go-ahead again while waiting for it.
    pub go_ahead_poll: Duration,
    /// Swap without the controller's go-ahead: for running by hand on a host
    /// with no controller (the operator is the second key). `main` refuses it
    /// when NODE_NAME is set.
    pub swap_without_go_ahead: bool,
    /// Where the agent notes why it waits (a path in its own filesystem, read
    /// by `ready` and `status`); None: nowhere.
    pub status_file: Option<PathBuf>,
    /// TT_KMD_NEXT_KERNELS: build and cache the target for the node's other
    /// installed kernels too (the next-kernel preflight).
    pub next_kernels: bool,
    /// TT_KMD_SIGNING_KEY and TT_KMD_SIGNING_CERT (`installer.signingSecret`):
    /// sign every module built with this key pair; None: built unsigned.
    pub signing: Option<crate::signing::SigningKey>,
    /// TT_KMD_MODULE_PARAMETERS: the policy's module parameters (canonical
    /// values, [`ttdrv_api::module_params`]); part of the target.
    pub module_parameters: Values,
    /// TT_KMD_VALIDATION_TIMEOUT_SECONDS: how long the new module has to
    /// serve every card the old one served ([`crate::validate`]).
    pub validation_timeout: Duration,
    /// TT_KMD_ON_VALIDATION_FAILURE: roll back to the previous version, or
    /// hold the new one for a person.
    pub on_validation_failure: OnValidationFailure,
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
    /// The pod was stopped while the agent waited for the go-ahead; the
    /// loaded module was left alone.
    Stopped { waiting: String },
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
            Outcome::Stopped { waiting } => format!("result=stopped-waiting waiting={waiting:?}"),
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
    /// Waiting for the go-ahead, cut short when the pod is stopped.
    pub pause: &'a dyn Pause,
}

/// How the wait for the second key ended.
enum Keyed {
    /// Go on with the module as it is now (None: nothing loaded), under the
    /// go-ahead of this cycle (None: none was needed).
    Open(Option<ModuleState>, Option<i64>),
    /// The pod is being stopped; why the agent was still waiting.
    Stopped(String),
}

/// What the run found before deciding anything.
enum Detected {
    /// DKMS manages the module: the run ends with this.
    HostManaged(Outcome),
    /// The agent manages it: the module as loaded now (None: nothing
    /// loaded), and the host's modprobe options for tenstorrent.
    Ours(Option<ModuleState>, HostOptions),
}

/// The new module and what its load needs, ready before the go-ahead.
struct Prepared {
    module: Verified,
    source: ModuleSource,
    deps: Vec<crate::deps::Dependency>,
    /// The parameters to load with, and their canonical string.
    load_values: Values,
    load_string: String,
    /// Whether tt-smi is installed (its version is labelled).
    smi: bool,
}

impl Agent<'_> {
    pub(crate) fn root(&self) -> HostRoot {
        HostRoot::new(&self.config.host_root)
    }

    /// The whole sequence; idling afterwards is the caller's business.
    pub fn run(&self) -> Result<Outcome> {
        let root = self.root();
        let (state, host_options) = match self.detect_and_report(&root)? {
            Detected::HostManaged(outcome) => return Ok(outcome),
            Detected::Ours(state, host_options) => (state, host_options),
        };

        // Said only where the agent loads: DKMS applies them on its own.
        log_host_options(&host_options);
        let target = validate_version(&self.config.target_version)?;
        let want = Target::new(&target, &self.config.module_parameters);
        let kver = step("kernel-release", || root.kernel_release())?;
        tracing::info!(
            kernel = %kver,
            target = %target,
            loaded = state.as_ref().and_then(|s| s.version.as_deref()).unwrap_or("none"),
            refcnt = state.as_ref().map_or(0, |s| s.refcnt),
            "host state"
        );
        let state = self.apply_runtime_parameters(&root, &target, want, state)?;
        if at_target(state.as_ref(), want) {
            return self.finish_current(&root, &kver, &target, None);
        }

        // Refuse early, before any build, when the swap would be allowed now
        // but the device is in use.
        if let Some(s) = &state
            && s.refcnt > 0
            && !self.config.force_unload
            && self.may_swap(&root, want, Some(s)).is_ok()
        {
            return Err(self.busy_error(&root, s));
        }

        // Get the new module (and tt-smi) before touching the old one: a
        // failed build (missing headers, missing tag, unwritable cache)
        // leaves the node with the driver it had, and once the go-ahead
        // comes the swap itself is quick.
        let priority = self.build_priority(want, state.as_ref());
        let prepared = self.prepare(
            &root,
            &kver,
            &target,
            priority,
            state.is_some(),
            &host_options,
        )?;

        // The second key: a loaded module of another version is unloaded only
        // with the controller's go-ahead, read again right before the swap.
        let (state, cycle) = match self.await_second_key(&root, want)? {
            Keyed::Open(state, cycle) => (state, cycle),
            Keyed::Stopped(waiting) => return Ok(Outcome::Stopped { waiting }),
        };
        if at_target(state.as_ref(), want) {
            return self.finish_current(&root, &kver, &target, Some(prepared.smi));
        }

        // What the old module serves, kept on the host before anything is
        // unloaded: the new one is validated against it, also by an agent
        // restarted after the swap.
        let swap = state
            .as_ref()
            .map(|s| record_swap(&root, &target, s, cycle))
            .transpose()?;
        let killed = match &state {
            Some(s) => self.unload_old(&root, s)?,
            None => Vec::new(),
        };
        let previous = state.as_ref().map(|s| s.version.clone());

        // The rollback puts the previous module back as it was.
        let previous_parameters = state
            .as_ref()
            .map(|s| module_params::canonical(&s.parameters))
            .unwrap_or_default();
        let Prepared {
            module,
            source,
            deps,
            load_values,
            load_string,
            smi,
        } = prepared;
        let loaded = step("load", || {
            self.load_with_rollback(
                &root,
                &kver,
                &target,
                (module, source, &load_string),
                &deps,
                previous.as_ref().map(|v| (v, previous_parameters.as_str())),
            )
        });
        let source = match loaded {
            Ok(source) => source,
            Err(e) => {
                note_rolled_back(&root, &target, swap, &e);
                return Err(e);
            }
        };
        step("readback", || {
            readback(&root, &target, &load_values, &load_string)
        })?;
        self.validate_load(&root, &kver, &target, swap, &previous_parameters)?;

        self.device_access(&root);
        step("label-node", || self.label_container(&root, &target, smi))?;
        prune_cache(&root, &kver, &target, previous.as_ref());
        // After the swap, with the node serving again: the next kernels'
        // builds stay out of the disruptive window.
        self.prepare_next_kernels(&root, &kver, &target);
        Ok(Outcome::Installed {
            version: target,
            previous: previous.flatten(),
            source,
            killed,
        })
    }

    /// Reports what the host runs right now, before anything that can fail
    /// (a build, the network), so that a failing or crash-looping agent
    /// still tells the truth: a host whose DKMS install is gone stops being
    /// reported host-managed, and kmd-version is what sysfs shows. Then
    /// whether the host manages the module itself.
    fn detect_and_report(&self, root: &HostRoot) -> Result<Detected> {
        let signals = step("detect-host-install", || Ok(root.host_install_signals()))?;
        let state = root.module_state();
        let loaded_now = state.as_ref().ok().and_then(|s| s.as_ref());
        let host_options = crate::modprobe::host_options(root);
        step("report-host", || {
            self.report_host(root, !signals.is_empty(), loaded_now)?;
            self.report_host_options(&host_options);
            Ok(())
        })?;
        let state = step("read-module-state", || state)?;
        if !signals.is_empty() {
            tracing::info!(
                ?signals,
                "host-managed tt-kmd install detected: not touching the host"
            );
            let loaded = state.and_then(|s| s.version);
            return Ok(Detected::HostManaged(Outcome::HostManaged {
                signals,
                loaded,
            }));
        }
        Ok(Detected::Ours(state, host_options))
    }

    /// A parameter the loaded target takes at run time (tt-kmd's 0644 ones,
    /// idle_power_down_grace_ms): written in sysfs while the module serves.
    /// No reload, so no go-ahead: the controller replaces this pod in place
    /// for such a change, without cordon or drain. Returns the module state
    /// after it.
    fn apply_runtime_parameters(
        &self,
        root: &HostRoot,
        target: &str,
        want: Target<'_>,
        state: Option<ModuleState>,
    ) -> Result<Option<ModuleState>> {
        match state {
            Some(s)
                if ttdrv_core::node::takes_at_run_time(
                    s.version.as_deref(),
                    Some(&s.parameters),
                    want,
                ) =>
            {
                step("write-parameters", || {
                    self.write_runtime_parameters(root, target, &s)
                })?;
                root.module_state()
            }
            other => Ok(other),
        }
    }

    /// Ends a run that finds the target loaded: validated, device access,
    /// labels, the next kernels. `smi`: whether tt-smi was installed
    /// already this run; None installs it now.
    fn finish_current(
        &self,
        root: &HostRoot,
        kver: &str,
        target: &str,
        smi: Option<bool>,
    ) -> Result<Outcome> {
        step("rollback-verdict", || {
            self.roll_back_on_verdict(root, kver, target)
        })?;
        step("validate", || self.revalidate(root, target))?;
        self.device_access(root);
        let smi = match smi {
            Some(installed) => installed,
            None => step("install-tt-smi", || self.install_tt_smi(root))?,
        };
        step("label-node", || self.label_container(root, target, smi))?;
        self.prepare_next_kernels(root, kver, target);
        Ok(Outcome::AlreadyCurrent {
            version: target.to_string(),
        })
    }

    /// Already inside the node's disruptive window (its cycle's go-ahead is
    /// on the node: build-ahead is off, or this pod came after the cordon):
    /// the node waits for this build, so it runs at normal priority.
    /// Otherwise the node still serves: nice 19.
    fn build_priority(&self, want: Target<'_>, state: Option<&ModuleState>) -> Priority {
        let node_now = || self.node.get();
        let in_window = state.is_some()
            && !self.config.swap_without_go_ahead
            && matches!(
                swap_decision(self.config.policy.as_deref(), want, state, node_now),
                Swap::GoAhead(_)
            );
        if in_window {
            Priority::Normal
        } else {
            Priority::Low
        }
    }

    /// Everything before the go-ahead: the module (from the cache or built),
    /// its dependencies, its signature and key, the parameters to load it
    /// with, tt-smi; then the prepared label. `loaded`: a module is loaded
    /// now (one of another version, to be swapped).
    fn prepare(
        &self,
        root: &HostRoot,
        kver: &str,
        target: &str,
        priority: Priority,
        loaded: bool,
        host_options: &HostOptions,
    ) -> Result<Prepared> {
        let (module, source) = self.obtain_module(root, kver, target, priority)?;
        // What it depends on, found now: a missing one fails the node before
        // anything is unloaded.
        let deps = step("resolve-dependencies", || {
            crate::deps::resolve(root, kver, &module.file, &module.path)
        })?;
        // A host that enforces signatures would refuse it after the unload.
        step("check-signature", || {
            crate::signing::check(root, target, &module.file, &module.path)
        })?;
        // And a key it does not trust: asked of the kernel while the old
        // module is still loaded (with nothing loaded the load itself tells,
        // and there is nothing to lose).
        if loaded {
            step("check-key", || {
                crate::signing::check_key(root, self.kernel, target, &module.file, &module.path)
            })?;
        }
        if !deps.is_empty() {
            tracing::info!(dependencies = ?deps.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(), "tenstorrent needs these modules loaded first");
        }
        // A parameter the module does not have would be ignored by the
        // kernel (the load succeeds without it): refused here, before the
        // go-ahead and the unload.
        let load_values = step("check-parameters", || {
            load_parameters(
                target,
                &module,
                &self.config.module_parameters,
                host_options,
            )
        })?;
        let load_string = module_params::canonical(&load_values);
        tracing::info!(parameters = %load_string, "module parameters to load with");
        let smi = step("install-tt-smi", || self.install_tt_smi(root))?;
        // The prepare step is done: say so before waiting, so the controller
        // may start this node's disruptive cycle knowing the swap is a load
        // from the cache.
        if loaded {
            self.report_prepared(target);
        }
        Ok(Prepared {
            module,
            source,
            deps,
            load_values,
            load_string,
            smi,
        })
    }

    /// Unloads the loaded module `s`, first killing its holders when allowed;
    /// returns the holders killed.
    fn unload_old(&self, root: &HostRoot, s: &ModuleState) -> Result<Vec<Holder>> {
        let killed = step("make-unloadable", || self.make_unloadable(root))?;
        step("unload", || {
            self.kernel
                .unload(MODULE_NAME)
                .map_err(|source| AgentError::Unload {
                    loaded: loaded_name(s),
                    source,
                })
        })?;
        Ok(killed)
    }

    /// Validates the new module: against what the old one served (`swap`),
    /// or, with nothing loaded before (a first install, or the end of a swap
    /// a reboot cut after the unload), against its record if any, else the
    /// cards on the bus.
    fn validate_load(
        &self,
        root: &HostRoot,
        kver: &str,
        target: &str,
        swap: Option<SwapRecord>,
        previous_parameters: &str,
    ) -> Result<()> {
        match swap {
            Some(record) => step("validate", || {
                self.validate_swap(root, kver, record, previous_parameters)
            }),
            None => step("validate", || self.validate_first_install(root, target)),
        }
    }

    /// Ok when the module may be swapped now (with the go-ahead's cycle,
    /// if one was needed), else why not. Asks the API server only when a
    /// loaded module other than the target would be swapped.
    fn may_swap(
        &self,
        root: &HostRoot,
        target: Target<'_>,
        state: Option<&ModuleState>,
    ) -> std::result::Result<Option<i64>, String> {
        if self.config.swap_without_go_ahead {
            return Ok(None);
        }
        match swap_decision(self.config.policy.as_deref(), target, state, || {
            self.node.get()
        }) {
            Swap::Wait(why) => Err(why),
            Swap::GoAhead(go) => {
                // A swap rolled back in this cycle is not tried again under
                // its go-ahead: the controller fails the node, and a retry
                // is a new cycle.
                if let Some(r) = validate::read_record(root)
                    && let Some(why) = used_go_ahead(&r, target.version, go.cycle)
                {
                    return Err(why);
                }
                tracing::info!(
                    policy = %go.policy,
                    node = %go.node,
                    target = %go.target,
                    cycle = go.cycle,
                    "the controller's go-ahead is on the node"
                );
                Ok(Some(go.cycle))
            }
            Swap::FirstInstall | Swap::AlreadyLoaded => Ok(None),
        }
    }

    /// Waits until the loaded module may be swapped (or there is nothing to
    /// swap), reading the module and the Node again every poll. Logs and
    /// notes each distinct reason once; ends early when the pod is stopped.
    fn await_second_key(&self, root: &HostRoot, target: Target<'_>) -> Result<Keyed> {
        if self.config.swap_without_go_ahead {
            tracing::warn!(
                "--swap-without-go-ahead: a loaded module is swapped without the controller's go-ahead (run by hand)"
            );
        }
        let start = Instant::now();
        let mut said: Option<String> = None;
        loop {
            let state = root.module_state()?;
            let why = match self.may_swap(root, target, state.as_ref()) {
                Ok(cycle) => {
                    if said.is_some() {
                        self.note_waiting(None);
                        tracing::info!(
                            waited_ms = start.elapsed().as_millis() as u64,
                            "done waiting: going on with the module"
                        );
                    }
                    return Ok(Keyed::Open(state, cycle));
                }
                Err(why) => why,
            };
            if said.as_deref() != Some(why.as_str()) {
                tracing::warn!(
                    poll_ms = self.config.go_ahead_poll.as_millis() as u64,
                    "{why}; the loaded module is left alone and the pod is not Ready"
                );
                self.note_waiting(Some(&why));
                said = Some(why.clone());
            }
            if self.pause.pause(self.config.go_ahead_poll) {
                tracing::info!(
                    waited_ms = start.elapsed().as_millis() as u64,
                    "stopped while waiting for the go-ahead; the loaded module was left alone"
                );
                return Ok(Keyed::Stopped(why));
            }
        }
    }

    pub(crate) fn note_waiting(&self, why: Option<&str>) {
        if let Some(path) = &self.config.status_file
            && let Err(e) = pod::set_waiting(path, why)
        {
            tracing::warn!(path = %path.display(), error = %e, "cannot write the waiting note");
        }
    }

    /// Labels the node with what the host runs now, and annotates the
    /// module parameters in effect.
    pub(crate) fn report_host(
        &self,
        root: &HostRoot,
        host_managed: bool,
        loaded: Option<&ModuleState>,
    ) -> Result<()> {
        let version = loaded.and_then(|s| s.version.as_deref());
        let cards = version.map(|_| validate::inventory(root).device_nodes.len());
        let changes = host_labels(host_managed, version, self.boot_id(root).as_deref(), cards);
        self.apply_labels(&changes)?;
        self.report_parameters(loaded)
    }

    /// Annotates [`labels::KMD_PARAMETERS`] with the parameters of the
    /// module loaded now (removed when nothing is loaded or it shows none).
    pub(crate) fn report_parameters(&self, loaded: Option<&ModuleState>) -> Result<()> {
        let value = loaded
            .map(|s| module_params::canonical(&s.parameters))
            .filter(|v| !v.is_empty());
        self.apply_annotations(&LabelChanges::from([(
            labels::KMD_PARAMETERS.to_string(),
            value,
        )]))
    }

    /// Annotates [`labels::KMD_HOST_OPTIONS`] with the host's own options
    /// (removed when it has none). Best effort: only people read it.
    fn report_host_options(&self, host: &HostOptions) {
        let value = Some(module_params::canonical(&host.values)).filter(|v| !v.is_empty());
        let changes = LabelChanges::from([(labels::KMD_HOST_OPTIONS.to_string(), value)]);
        if let Err(e) = self.apply_annotations(&changes) {
            tracing::warn!(error = %e, "cannot report the host's module options");
        }
    }

    /// The boot ID to label; None (label removed) when unreadable.
    pub(crate) fn boot_id(&self, root: &HostRoot) -> Option<String> {
        match root.boot_id() {
            Ok(id) if valid_label_value(&id) => Some(id),
            Ok(id) => {
                tracing::warn!(boot_id = %id, "the boot ID is not a label value; removing the boot-ID label");
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "removing the boot-ID label");
                None
            }
        }
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

    /// Cache hit (verified), or build + store. Returns the verified module
    /// and its source.
    fn obtain_module(
        &self,
        root: &HostRoot,
        kver: &str,
        target: &str,
        priority: Priority,
    ) -> Result<(Verified, ModuleSource)> {
        let cache = Cache::new(root);
        // Checked before the cache and any build: a broken Secret fails the
        // node while it still serves, whatever is cached.
        let signer = self.signer()?;
        if let Some(hit) = step("cache-lookup", || {
            cache.lookup(kver, target, SignedBy::of(signer.as_ref()))
        })? {
            tracing::info!(path = %hit.path.display(), sha256 = %hit.sha256, "cache hit (verified)");
            return Ok((hit, ModuleSource::Cache));
        }
        tracing::info!(path = %cache.path(kver, target).display(), ?priority, "cache miss: building from source");
        Ok((
            self.build_and_store(root, kver, target, priority)?,
            ModuleSource::Build,
        ))
    }

    /// The signing key pair checked for use, when signing is configured.
    fn signer(&self) -> Result<Option<crate::signing::Signer>> {
        self.config
            .signing
            .as_ref()
            .map(crate::signing::SigningKey::load)
            .transpose()
    }

    /// Labels the node [`labels::KMD_PREPARED`]`=target`. Best effort: the
    /// swap does not depend on it, only the controller's scheduling does.
    fn report_prepared(&self, target: &str) {
        let changes = LabelChanges::from([(
            labels::KMD_PREPARED.to_string(),
            Some(target)
                .filter(|v| valid_label_value(v))
                .map(str::to_string),
        )]);
        if let Err(e) = self.apply_labels(&changes) {
            tracing::warn!(error = %e, "cannot report the prepared module");
        }
    }

    /// Next-kernel preflight: builds and caches `target` for every installed
    /// kernel with a build tree besides the running one, so that a reboot into
    /// it loads from the cache. A failure is a warning (label
    /// [`labels::KMD_NEXT_KERNEL_FAILED`]), never an error of this run.
    /// Returns the kernels that failed.
    pub(crate) fn prepare_next_kernels(
        &self,
        root: &HostRoot,
        running: &str,
        target: &str,
    ) -> Vec<String> {
        let kernels = if self.config.next_kernels {
            next_kernels(root, running)
        } else {
            Vec::new()
        };
        if kernels.is_empty() {
            // label_container removed the warning label with its own patch.
            return Vec::new();
        }
        let cache = Cache::new(root);
        let mut failed = Vec::new();
        for kver in kernels {
            let r = step("prepare-next-kernel", || {
                let signer = self.signer()?;
                match cache.lookup(&kver, target, SignedBy::of(signer.as_ref()))? {
                    Some(hit) => Ok(hit),
                    None => self.build_and_store(root, &kver, target, Priority::Low),
                }
            });
            match r {
                Ok(m) => {
                    tracing::info!(kernel = %kver, version = target, sha256 = %m.sha256, "next kernel prepared")
                }
                Err(e) => {
                    tracing::warn!(kernel = %kver, version = target, error = %e, "the target version does not build for an installed kernel: a reboot into it would find no module");
                    failed.push(kver);
                }
            }
        }
        let value = failed.first().map(|k| {
            if valid_label_value(k) {
                k.clone()
            } else {
                labels::NEXT_KERNEL_UNNAMED.to_string()
            }
        });
        let changes = LabelChanges::from([(labels::KMD_NEXT_KERNEL_FAILED.to_string(), value)]);
        if let Err(e) = self.apply_labels(&changes) {
            tracing::warn!(error = %e, "cannot report the next-kernel preflight");
        }
        failed
    }

    fn build_and_store(
        &self,
        root: &HostRoot,
        kver: &str,
        target: &str,
        priority: Priority,
    ) -> Result<Verified> {
        let cache = Cache::new(root);
        let headers_host = format!("/lib/modules/{kver}/build");
        // Follow the build link as the host would (absolute targets under the
        // root); if that leads nowhere, let the OS follow it, which works when
        // the pod mounts the host's /usr/src at the same path (Debian's
        // headers use absolute paths internally anyway). Only make reads there.
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
        // The key pair and the kernel's sign-file, before the clone and the
        // build: a signing that cannot happen fails at once (BuildFailed).
        let signer = self.signer()?;
        let sign_tool = signer
            .as_ref()
            .map(|s| crate::signing::sign_file(s, &headers, kver))
            .transpose()?;
        let workdir = tempfile::Builder::new()
            .prefix("ttdrv-build-")
            .tempdir()
            .map_err(|e| {
                let tmp = std::env::temp_dir();
                if crate::error::is_disk_full(&e) {
                    AgentError::DiskFull {
                        what: "creating the build directory failed".into(),
                        path: tmp,
                        free: None,
                        size: None,
                        source: e,
                    }
                } else {
                    AgentError::io("creating a build directory in", tmp, e)
                }
            })?;
        let req = BuildRequest {
            version: target,
            kernel_release: kver,
            headers: &headers,
            workdir: workdir.path(),
        };
        let built = step("build", || match priority {
            Priority::Low => build_low_priority(self.builder, &req),
            Priority::Normal => self.builder.build(&req),
        })?;
        let found = crate::modinfo::module_version(&built)?;
        if found.as_deref() != Some(target) {
            return Err(AgentError::BuiltWrongVersion {
                path: built,
                expected: target.to_string(),
                found,
            });
        }
        // Signed before it goes into the cache: the record names the
        // certificate, and only that certificate's modules are loaded.
        if let (Some(signer), Some(tool)) = (&signer, &sign_tool) {
            step("sign", || {
                crate::signing::sign(signer, tool, &headers, target, &built)
            })?;
        }
        let fingerprint = signer.as_ref().map(|s| s.fingerprint.as_str());
        step("cache-store", || {
            cache.store(kver, target, &built, fingerprint)
        })
    }

    /// With force-unload, SIGKILLs every holder and waits (bounded) for refcnt
    /// 0; holders that show up meanwhile are killed too. Returns those killed.
    pub(crate) fn make_unloadable(&self, root: &HostRoot) -> Result<Vec<Holder>> {
        // checked: a huge timeout waits "forever" instead of panicking.
        let deadline = Instant::now().checked_add(self.config.unload_timeout);
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
                    parameters: Values::new(),
                });
                return Err(self.busy_error(root, &state));
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
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

    /// Loads `module` (from `source`) with `parameters`; when the kernel
    /// refuses a module that came from the cache, evicts it, rebuilds once
    /// and loads that. When the load still fails, puts the previous version
    /// back from the cache, with the parameters it had, if it can.
    fn load_with_rollback(
        &self,
        root: &HostRoot,
        kver: &str,
        target: &str,
        (module, source, parameters): (Verified, ModuleSource, &str),
        deps: &[crate::deps::Dependency],
        // The module loaded before: its version, the parameters it had.
        previous: Option<(&Option<String>, &str)>,
    ) -> Result<ModuleSource> {
        let mut module = module;
        let mut source = source;
        let loaded = crate::deps::load(root, self.kernel, deps)
            .map_err(|e| std::io::Error::other(e.to_string()))
            .map(|()| self.kernel.load(&module.file, parameters));
        let e = match loaded {
            // A dependency would not load: the module itself is not at fault.
            Err(dep) => dep,
            Ok(loaded) => match loaded {
                Ok(()) => return Ok(source),
                // A rebuild would be signed with the same key (or none) and
                // refused the same way: not worth the node's wait.
                Err(e) if source == ModuleSource::Cache && !crate::signing::key_rejected(&e) => {
                    tracing::error!(
                        version = target,
                        path = %module.path.display(),
                        error = %e,
                        "the kernel refused the cached module; evicting it and building once more"
                    );
                    Cache::new(root).evict(kver, target)?;
                    // Inside the disruptive window: at normal priority.
                    module = step("rebuild", || {
                        self.build_and_store(root, kver, target, Priority::Normal)
                    })?;
                    source = ModuleSource::Build;
                    match self.kernel.load(&module.file, parameters) {
                        Ok(()) => return Ok(source),
                        Err(e2) => {
                            // Not loaded: never leave it cached for the next run.
                            let _ = Cache::new(root).evict(kver, target);
                            e2
                        }
                    }
                }
                Err(e) => {
                    let _ = Cache::new(root).evict(kver, target);
                    e
                }
            },
        };
        tracing::error!(version = target, error = %e, "loading the new module failed; rolling back");
        let rollback = self.restore_previous(root, kver, previous);
        let signed = crate::signing::is_signed(&module.file, &module.path).unwrap_or(false);
        Err(AgentError::LoadFailed {
            version: target.to_string(),
            path: module.path,
            error: crate::signing::explain_load_error(&e, signed),
            rollback: Box::new(rollback),
        })
    }

    /// Loads the previous version (`(version, parameters)`) again from the
    /// cache, with the parameters it had, whatever signed it; says what
    /// became of it. Nothing of tenstorrent may be loaded when called.
    fn restore_previous(
        &self,
        root: &HostRoot,
        kver: &str,
        previous: Option<(&Option<String>, &str)>,
    ) -> Rollback {
        let now = || root.loaded_version().ok().flatten();
        let previous_parameters = previous.map_or("", |(_, p)| p);
        match previous.map(|(v, _)| v) {
            None => Rollback::NothingLoadedBefore,
            Some(None) => Rollback::NotCached {
                previous: "(unversioned)".into(),
                path: PathBuf::from(cache::CACHE_DIR),
                now_loaded: now(),
            },
            Some(Some(prev)) => match validate_version(prev).ok().and_then(|p| {
                Cache::new(root)
                    .lookup(kver, &p, SignedBy::Anyone)
                    .ok()
                    .flatten()
            }) {
                None => Rollback::NotCached {
                    previous: prev.clone(),
                    path: PathBuf::from(Cache::host_path(kver, prev)),
                    now_loaded: now(),
                },
                Some(prev_module) => match self.kernel.load(&prev_module.file, previous_parameters)
                {
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
        }
    }

    /// What is wrong with what the driver serves against `before`, waiting
    /// up to the validation timeout for it to come right (cards probe and
    /// device nodes appear asynchronously); empty when it did.
    fn settle(&self, root: &HostRoot, before: &Inventory) -> Vec<String> {
        let start = Instant::now();
        loop {
            let (now, problems) = validate::check(root, before);
            if problems.is_empty() {
                tracing::info!(
                    serves = %now.describe(),
                    waited_ms = start.elapsed().as_millis() as u64,
                    "validated: the module serves every card served before"
                );
                return problems;
            }
            let left = self
                .config
                .validation_timeout
                .saturating_sub(start.elapsed());
            if left.is_zero() {
                return problems;
            }
            // Not cut short by a stop: a stopped pod's swap is validated
            // to its end (bounded by the timeout), never judged half-way.
            std::thread::sleep(left.min(VALIDATION_POLL));
        }
    }

    /// After a swap: the new module must serve what the old one did. On a
    /// failure, rolls back or holds as configured, and fails with
    /// [`AgentError::ValidationFailed`]; the swap record says what became of
    /// the swap for a restarted agent.
    fn validate_swap(
        &self,
        root: &HostRoot,
        kver: &str,
        record: SwapRecord,
        previous_parameters: &str,
    ) -> Result<()> {
        // tt-kmd 1.x may expose no tt_* attribute at all (1.27.1 has none;
        // every 2.x release has them): a swap to a 1.x release is not failed
        // for them. Any 2.x, up or down, must serve them again.
        let mut before = record.before.clone();
        let without_attributes =
            module_params::release(&record.target).is_some_and(|r| r < (2, 0, 0));
        if without_attributes && !before.telemetry.is_empty() {
            tracing::info!(
                target = %record.target,
                "tt-kmd 1.x: the cards' tt_* attributes are not required of it"
            );
            before.telemetry.clear();
        }
        let problems = self.settle(root, &before);
        if problems.is_empty() {
            validate::note_served(root, &record.target);
            keep_validated(root, record);
            return Ok(());
        }
        Err(self.failed_swap(root, kver, record, problems, previous_parameters))
    }

    /// The controller's verdict on the swap to `target` this agent
    /// validated: the scheduler did not see every card after it
    /// ([`labels::ROLLBACK_VERDICT`] names the swap's cycle). It ends as a
    /// failed validation does: rolled back, or held. Ok without a verdict for
    /// that swap.
    fn roll_back_on_verdict(&self, root: &HostRoot, kver: &str, target: &str) -> Result<()> {
        let Some(record) = validate::read_record(root) else {
            return Ok(());
        };
        let Some(cycle) = record.cycle else {
            return Ok(());
        };
        if record.outcome != SwapOutcome::Validated
            || !ttdrv_core::node::same_version(Some(&record.target), target)
        {
            return Ok(());
        }
        // Unreadable: no verdict seen now; the controller, waiting for the
        // rollback, restarts this pod again.
        let node = match self.node.get() {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the node for the controller's verdict on the swap");
                return Ok(());
            }
        };
        let verdict = ttdrv_core::node::annotation(&node, labels::ROLLBACK_VERDICT);
        if verdict != Some(cycle.to_string().as_str()) {
            return Ok(());
        }
        let problems = vec![format!(
            "the scheduler did not see every card of the node after the swap \
             (the controller's verdict on cycle {cycle}, {})",
            labels::ROLLBACK_VERDICT
        )];
        let previous_parameters = record.previous_parameters.clone();
        Err(self.failed_swap(root, kver, record, problems, &previous_parameters))
    }

    /// A swap found failed (`problems`): rolled back or held as configured,
    /// the record kept to say so to a restarted agent, the labels saying
    /// what runs now; the error to end the run with.
    fn failed_swap(
        &self,
        root: &HostRoot,
        kver: &str,
        mut record: SwapRecord,
        problems: Vec<String>,
        previous_parameters: &str,
    ) -> AgentError {
        let version = record.target.clone();
        tracing::error!(
            version = %version,
            problems = ?problems,
            on_failure = self.config.on_validation_failure.as_str(),
            "the new module failed validation"
        );
        let rollback = match (self.config.on_validation_failure, &record.previous) {
            (OnValidationFailure::Hold, _) | (_, None) => {
                record.outcome = SwapOutcome::Held;
                if record.previous.is_none() {
                    Rollback::NotCached {
                        previous: "(unversioned)".into(),
                        path: PathBuf::from(cache::CACHE_DIR),
                        now_loaded: Some(version.clone()),
                    }
                } else {
                    Rollback::Held {
                        version: version.clone(),
                    }
                }
            }
            (OnValidationFailure::Rollback, Some(prev)) => {
                let started = Instant::now();
                let rollback = self.roll_back(root, kver, &record, previous_parameters);
                tracing::warn!(
                    from = %version,
                    to = %prev,
                    rollback_ms = started.elapsed().as_millis() as u64,
                    result = %rollback,
                    "rollback after a failed validation"
                );
                record.outcome = match &rollback {
                    Rollback::Restored { previous }
                    | Rollback::RestoredDegraded { previous, .. } => SwapOutcome::RolledBack {
                        to: previous.clone(),
                    },
                    // Whatever is loaded now is not validated: held.
                    _ => SwapOutcome::Held,
                };
                rollback
            }
        };
        record.problems = problems.clone();
        if let Err(e) = validate::write_record(root, &record) {
            tracing::warn!(error = %e, "cannot keep the swap record");
        }
        // Labels say what runs now: the previous version after a rollback.
        let now = root.module_state().ok().flatten();
        if let Err(e) = self.report_host(root, false, now.as_ref()) {
            tracing::warn!(error = %e, "cannot report the module loaded after the failed validation");
        }
        if matches!(record.outcome, SwapOutcome::RolledBack { .. }) {
            self.device_access(root);
        }
        AgentError::ValidationFailed {
            version,
            problems,
            rollback: Box::new(rollback),
        }
    }

    /// Unloads the new module of `record` and loads the previous one again,
    /// then checks it serves what it served before the swap.
    fn roll_back(
        &self,
        root: &HostRoot,
        kver: &str,
        record: &SwapRecord,
        previous_parameters: &str,
    ) -> Rollback {
        let previous = record.previous.clone();
        // Without the previous version in the cache, the new one stays: a
        // node with a module that fails validation is better than one with none.
        let cached = previous.as_deref().and_then(|p| {
            Cache::new(root)
                .lookup(kver, p, SignedBy::Anyone)
                .ok()
                .flatten()
        });
        if cached.is_none() {
            let prev = previous.unwrap_or_else(|| "(unversioned)".into());
            return Rollback::NotCached {
                path: PathBuf::from(Cache::host_path(kver, &prev)),
                previous: prev,
                now_loaded: root.loaded_version().ok().flatten(),
            };
        }
        let unloaded = self.make_unloadable(root).and_then(|_| {
            self.kernel
                .unload(MODULE_NAME)
                .map_err(|source| AgentError::Unload {
                    loaded: record.target.clone(),
                    source,
                })
        });
        if let Err(e) = unloaded {
            return Rollback::Failed {
                previous: previous.unwrap_or_default(),
                error: format!("the new module could not be unloaded: {e}"),
                now_loaded: root.loaded_version().ok().flatten(),
            };
        }
        match self.restore_previous(root, kver, Some((&previous, previous_parameters))) {
            Rollback::Restored { previous } => {
                let problems = self.settle(root, &record.before);
                if problems.is_empty() {
                    Rollback::Restored { previous }
                } else {
                    Rollback::RestoredDegraded { previous, problems }
                }
            }
            other => other,
        }
    }

    /// Writes the policy's values of the parameters that differ from what
    /// the loaded module shows (all writable at run time, the caller checked)
    /// to `/sys/module/tenstorrent/parameters/<name>`, then reads them back.
    fn write_runtime_parameters(
        &self,
        root: &HostRoot,
        target: &str,
        s: &ModuleState,
    ) -> Result<()> {
        let off = module_params::mismatches(&self.config.module_parameters, Some(&s.parameters));
        let dir = root.dir(format!("/sys/module/{MODULE_NAME}/parameters"), false)?;
        for m in &off {
            dir.write_existing(&m.name, format!("{}\n", m.wanted).as_bytes())?;
            tracing::info!(
                parameter = %m.name,
                from = m.found.as_deref().unwrap_or("?"),
                to = %m.wanted,
                "module parameter written at run time (no reload)"
            );
        }
        let now = root.module_state()?;
        let still = module_params::mismatches(
            &self.config.module_parameters,
            now.as_ref().map(|n| &n.parameters),
        );
        if still.is_empty() {
            Ok(())
        } else {
            Err(AgentError::ParametersNotInEffect {
                version: target.to_string(),
                passed: module_params::canonical(&self.config.module_parameters),
                mismatches: module_params::describe(&still),
            })
        }
    }

    /// After a load with nothing loaded before: with a swap record (a swap a
    /// reboot cut after the unload), as [`Self::revalidate`]; without one,
    /// every Wormhole and Blackhole on the bus that no other driver holds
    /// must be served (a release that probes no card does not report
    /// success). Nothing to roll back to: a failure holds the module
    /// (record `Held`, so a restarted agent checks again).
    fn validate_first_install(&self, root: &HostRoot, target: &str) -> Result<()> {
        match validate::read_record(root) {
            // A swap to this version that validated, loaded afresh (after a
            // reboot): checked as a first install; the record stays.
            Some(r)
                if r.outcome == SwapOutcome::Validated
                    && ttdrv_core::node::same_version(Some(&r.target), target) => {}
            Some(r) if ttdrv_core::node::same_version(Some(&r.target), target) => {
                return self.revalidate(root, target);
            }
            // Another version's record (a swap long gone, a module unloaded
            // by hand since): no baseline for this load.
            Some(_) => {
                if let Err(e) = validate::clear_record(root) {
                    tracing::warn!(error = %e, "cannot remove the swap record");
                }
            }
            None => {}
        }
        let expected = validate::expected_on_first_install(&validate::present(root));
        let problems: Vec<String> = self
            .settle(root, &expected)
            .into_iter()
            .map(|p| p.replace("served before the swap", "present on the bus"))
            .collect();
        let now = validate::inventory(root);
        let silent: Vec<&String> = now.functions.difference(&now.telemetry).collect();
        if problems.is_empty() {
            if !silent.is_empty() {
                tracing::warn!(
                    cards = ?silent,
                    "served without tt_* attributes (no telemetry from the card's firmware at probe): \
                     tools that read them, and the by-id links, see nothing for these cards until the next load"
                );
            }
            validate::note_served(root, target);
            return Ok(());
        }
        tracing::error!(version = %target, problems = ?problems, "the first install failed validation");
        let record = SwapRecord {
            target: target.to_string(),
            previous: None,
            previous_parameters: String::new(),
            cycle: None,
            before: expected,
            outcome: SwapOutcome::Held,
            problems: problems.clone(),
        };
        if let Err(e) = validate::write_record(root, &record) {
            tracing::warn!(error = %e, "cannot keep the swap record");
        }
        Err(AgentError::ValidationFailed {
            version: target.to_string(),
            problems,
            rollback: Box::new(Rollback::NothingLoadedBefore),
        })
    }

    /// With the target already loaded: a swap to it that has not validated
    /// (an agent stopped after the load, or held after a failure) is
    /// validated now, against what the old module served; a swap record of
    /// another version is stale and removed.
    fn revalidate(&self, root: &HostRoot, target: &str) -> Result<()> {
        let Some(mut record) = validate::read_record(root) else {
            // Found at the target: what it serves now is the readiness
            // probe's baseline (a card lost later makes the pod not Ready).
            validate::note_served(root, target);
            return Ok(());
        };
        if !ttdrv_core::node::same_version(Some(&record.target), target) {
            tracing::info!(swapped_to = %record.target, "removing the swap record of another version");
            if let Err(e) = validate::clear_record(root) {
                tracing::warn!(error = %e, "cannot remove the swap record");
            }
            validate::note_served(root, target);
            return Ok(());
        }
        if record.outcome == SwapOutcome::Validated {
            validate::note_served(root, target);
            return Ok(());
        }
        tracing::info!(
            outcome = ?record.outcome,
            before = %record.before.describe(),
            "the swap to this version has not validated yet: validating it now"
        );
        let problems = self.settle(root, &record.before);
        if problems.is_empty() {
            validate::note_served(root, target);
            keep_validated(root, record);
            return Ok(());
        }
        record.outcome = SwapOutcome::Held;
        record.problems = problems.clone();
        if let Err(e) = validate::write_record(root, &record) {
            tracing::warn!(error = %e, "cannot keep the swap record");
        }
        Err(AgentError::ValidationFailed {
            version: target.to_string(),
            problems,
            rollback: Box::new(Rollback::Held {
                version: target.to_string(),
            }),
        })
    }

    /// The udev rule, device modes and the old venv (crate::devices): best
    /// effort, a failure is a warning.
    fn device_access(&self, root: &HostRoot) {
        let d = crate::devices::ensure_device_access(root);
        tracing::info!(
            rule_written = d.rule_written,
            rule_kept = ?d.rule_kept,
            udev_reloaded = ?d.udev_reloaded,
            links_retriggered = ?d.links_retriggered,
            links_missing = ?d.links_missing,
            chmodded = ?d.chmodded,
            removed = ?d.removed,
            "device access"
        );
        for w in &d.warnings {
            tracing::warn!(warning = %w, "device access step failed (the install stands)");
        }
    }

    /// Copies the bundled tt-smi to the host. Returns whether it is installed.
    /// The host's file is read and replaced through [`crate::hostfs`]: a link,
    /// FIFO or device planted at its path is refused, never followed.
    fn install_tt_smi(&self, root: &HostRoot) -> Result<bool> {
        let src = &self.config.tt_smi_path;
        if !src.is_file() {
            tracing::warn!(path = %src.display(), "bundled tt-smi not found: not installing it and not labelling its version");
            return Ok(false);
        }
        let bundled = fs::read(src).map_err(|e| AgentError::io("reading", src, e))?;
        let (dir, name) = crate::hostfs::split(Path::new(TT_SMI_HOST_PATH))?;
        let dir = root.dir(dir, true)?;
        // At most one byte more than ours is enough to tell them apart.
        let current = match dir.read_optional(name, bundled.len() as u64) {
            Ok(c) => c,
            Err(crate::hostfs::HostFsError::TooLarge { .. }) => None,
            Err(e) => return Err(e.into()),
        };
        let mode_ok = dir
            .stat(name)?
            .is_some_and(|st| st.st_mode & 0o7777 == 0o755);
        if current.as_deref() == Some(bundled.as_slice()) && mode_ok {
            tracing::info!(path = TT_SMI_HOST_PATH, "tt-smi already up to date");
            return Ok(true);
        }
        dir.write_atomic(name, &mut bundled.as_slice(), 0o755)?;
        Ok(true)
    }

    fn label_container(
        &self,
        root: &HostRoot,
        version: &str,
        tt_smi_installed: bool,
    ) -> Result<()> {
        let cards = validate::inventory(root).device_nodes.len();
        let mut changes = host_labels(
            false,
            Some(version),
            self.boot_id(root).as_deref(),
            Some(cards),
        );
        // The target is loaded: no swap is ahead, so nothing is prepared for
        // one (a label left from the last swap would let a later cycle of
        // the same version start before its agent checked anything).
        changes.insert(labels::KMD_PREPARED.into(), None);
        // No other kernel to prepare: no next-kernel warning either, said in
        // this patch rather than one more (prepare_next_kernels reports otherwise).
        if !self.config.next_kernels
            || root
                .kernel_release()
                .is_ok_and(|k| next_kernels(root, &k).is_empty())
        {
            changes.insert(labels::KMD_NEXT_KERNEL_FAILED.into(), None);
        }
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
        self.apply_labels(&changes)?;
        self.report_parameters(root.module_state()?.as_ref())
    }

    pub(crate) fn apply_annotations(&self, changes: &LabelChanges) -> Result<()> {
        self.node.annotate(changes).map_err(|r| self.node_error(r))
    }

    pub(crate) fn apply_labels(&self, changes: &LabelChanges) -> Result<()> {
        self.node.label(changes).map_err(|r| self.node_error(r))
    }

    /// A failed write of this node's labels or annotations.
    fn node_error(&self, reason: String) -> AgentError {
        AgentError::Label {
            node: self.node.node_name().to_string(),
            reason,
        }
    }
}

/// A swap that validated: its record is kept, as `Validated`, while the
/// controller may still find it failed (the scheduling surface after it)
/// and ask for its rollback; that needs a previous version and the
/// controller's cycle. Otherwise there is nothing to keep.
fn keep_validated(root: &HostRoot, mut record: SwapRecord) {
    if record.previous.is_some() && record.cycle.is_some() {
        record.outcome = SwapOutcome::Validated;
        record.problems.clear();
        if let Err(e) = validate::write_record(root, &record) {
            tracing::warn!(error = %e, "cannot keep the swap record");
        }
        return;
    }
    if let Err(e) = validate::clear_record(root) {
        tracing::warn!(error = %e, "cannot remove the swap record");
    }
}

/// How often the validation looks at the cards again while they settle.
const VALIDATION_POLL: Duration = Duration::from_millis(250);

/// Why a swap to `target` under the go-ahead of `cycle` must not run again:
/// this cycle's swap to it failed validation and was rolled back. None when
/// the record is of another swap.
pub fn used_go_ahead(record: &SwapRecord, target: &str, cycle: i64) -> Option<String> {
    let SwapOutcome::RolledBack { to } = &record.outcome else {
        return None;
    };
    (record.cycle == Some(cycle) && ttdrv_core::node::same_version(Some(&record.target), target))
        .then(|| {
            format!(
                "the swap to {target} in this cycle failed ({}) and was rolled back to {to}; \
                 this go-ahead opens no second swap: a retry of the node starts a new cycle",
                record.problems.join("; ")
            )
        })
}

/// The CPU priority of a build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Priority {
    /// [`BUILD_NICE`]: a build that runs while the node serves workloads.
    Low,
    /// A build inside the disruptive window (the node waits for it).
    Normal,
}

/// The nice value of a build that runs while the node serves workloads: the
/// lowest CPU priority. The block layer derives a best-effort I/O priority
/// from it too (BFQ/CFQ: `(nice + 20) / 5`, the lowest), so no ionice is needed.
pub const BUILD_NICE: i32 = 19;

/// Runs the build on a thread of its own at [`BUILD_NICE`]: on Linux the nice
/// value is per thread and inherited by the git and make it spawns, so the
/// agent's other work (polling for the go-ahead, the load) keeps its priority
/// and nothing needs restoring. A failure to lower it is only logged.
fn build_low_priority(builder: &dyn Builder, req: &BuildRequest<'_>) -> Result<PathBuf> {
    let dispatch = tracing::dispatcher::get_default(|d| d.clone());
    std::thread::scope(|s| {
        let worker = s.spawn(|| {
            tracing::dispatcher::with_default(&dispatch, || {
                // `None`: the calling thread (Linux keeps nice per thread).
                if let Err(e) = rustix::process::setpriority_process(None, BUILD_NICE) {
                    tracing::warn!(error = %e, "cannot lower the build's CPU priority; building at normal priority");
                }
                builder.build(req)
            })
        });
        worker.join().unwrap_or_else(|_| {
            Err(AgentError::BuildPanicked {
                version: req.version.to_string(),
            })
        })
    })
}

/// The installed kernels with a build tree (`/lib/modules/<kver>/build`)
/// other than `running`, sorted. An unreadable `/lib/modules` gives none.
pub fn next_kernels(root: &HostRoot, running: &str) -> Vec<String> {
    let Ok(entries) = fs::read_dir(root.path("/lib/modules")) else {
        return Vec::new();
    };
    let mut out: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|k| k != running && !k.starts_with('.'))
        .filter(|k| {
            let build = format!("/lib/modules/{k}/build");
            root.resolve(&build).is_dir() || root.path(&build).is_dir()
        })
        .collect();
    out.sort();
    out
}

/// The second key (pure): whether the module loaded now (`state`) may be
/// swapped for `target`. Nothing loaded, or the target loaded, needs no
/// go-ahead; otherwise the Node (read through `node`, only then) must carry
/// the controller's go-ahead for `policy`, this node, `target` and the
/// current cycle ([`go_ahead::decide`]). Without a policy, or without the
/// Node, it waits: fail closed.
pub fn swap_decision(
    policy: Option<&str>,
    target: Target<'_>,
    state: Option<&ModuleState>,
    node: impl FnOnce() -> std::result::Result<Node, String>,
) -> Swap {
    let Some(s) = state else {
        return Swap::FirstInstall;
    };
    let loaded = loaded_name(s);
    if at_target(Some(s), target) {
        return Swap::AlreadyLoaded;
    }
    let wait = |why: String| {
        Swap::Wait(format!(
            "waiting for the controller's go-ahead to {}: {why}",
            go_ahead::swap_description(&loaded, Some(&s.parameters), target)
        ))
    };
    let Some(policy) = policy.filter(|p| !p.trim().is_empty()) else {
        return wait(format!(
            "{} is not set on this pod, so no go-ahead can match (a loaded module is never swapped without one)",
            env::POLICY
        ));
    };
    match node() {
        Ok(n) => go_ahead::decide(&n, policy, target, Some(&loaded), Some(&s.parameters)),
        Err(e) => wait(e),
    }
}

/// The labels that say what the host runs now: the install mode (`host` only
/// with a DKMS signal present), the loaded version (removed when nothing is
/// loaded or it is no label value) and the boot ID it was read at (removed
/// when unknown), always together.
/// `cards`: the device nodes the loaded module serves (its
/// [`labels::KMD_CARDS`]); dropped with the version.
pub fn host_labels(
    host_managed: bool,
    loaded: Option<&str>,
    boot_id: Option<&str>,
    cards: Option<usize>,
) -> LabelChanges {
    let mode = if host_managed {
        labels::INSTALL_MODE_HOST
    } else {
        labels::INSTALL_MODE_CONTAINER
    };
    LabelChanges::from([
        (labels::INSTALL_MODE.to_string(), Some(mode.to_string())),
        (
            labels::KMD_VERSION.to_string(),
            loaded.filter(|v| valid_label_value(v)).map(str::to_string),
        ),
        (
            labels::KMD_BOOT_ID.to_string(),
            boot_id.filter(|v| valid_label_value(v)).map(str::to_string),
        ),
        (
            labels::KMD_CARDS.to_string(),
            cards.filter(|_| loaded.is_some()).map(|n| n.to_string()),
        ),
    ])
}

/// The module loaded now is the target: its version, and the policy's
/// module parameters in effect ([`is_loaded`], the one definition).
fn at_target(state: Option<&ModuleState>, target: Target<'_>) -> bool {
    state.is_some_and(|s| is_loaded(s.version.as_deref(), Some(&s.parameters), target))
}

/// Keeps on the host what the loaded module `s` serves, before the swap to
/// `target` under the go-ahead of `cycle`.
fn record_swap(
    root: &HostRoot,
    target: &str,
    s: &ModuleState,
    cycle: Option<i64>,
) -> Result<SwapRecord> {
    let record = SwapRecord {
        target: target.to_string(),
        previous: s.version.clone(),
        previous_parameters: module_params::canonical(&s.parameters),
        cycle,
        before: validate::inventory(root),
        outcome: SwapOutcome::Validating,
        problems: Vec::new(),
    };
    tracing::info!(before = %record.before.describe(), "what the loaded module serves");
    step("record-swap", || {
        validate::write_record(root, &record).map_err(AgentError::from)
    })?;
    Ok(record)
}

/// After a failed load that put the previous module back, notes the
/// rollback in the swap record: this cycle's go-ahead opens no second try.
fn note_rolled_back(root: &HostRoot, target: &str, swap: Option<SwapRecord>, e: &AgentError) {
    if let (Some(mut record), AgentError::LoadFailed { rollback, .. }) = (swap, e)
        && let Rollback::Restored { previous } = rollback.as_ref()
    {
        record.outcome = SwapOutcome::RolledBack {
            to: previous.clone(),
        };
        record.problems = vec![format!("{target} did not load")];
        if let Err(w) = validate::write_record(root, &record) {
            tracing::warn!(error = %w, "cannot keep the swap record");
        }
    }
}

/// Checks that sysfs shows `target` loaded, with the parameters it was
/// loaded with in effect.
fn readback(root: &HostRoot, target: &str, load_values: &Values, load_string: &str) -> Result<()> {
    let now = root.module_state()?;
    let found = now.as_ref().and_then(|s| s.version.clone());
    if !ttdrv_core::node::same_version(found.as_deref(), target) {
        return Err(AgentError::ReadbackMismatch {
            expected: target.to_string(),
            found,
        });
    }
    let off = module_params::mismatches(load_values, now.as_ref().map(|s| &s.parameters));
    if !off.is_empty() {
        return Err(AgentError::ParametersNotInEffect {
            version: target.to_string(),
            passed: load_string.to_string(),
            mismatches: module_params::describe(&off),
        });
    }
    Ok(())
}

/// Prunes the module cache of `kver`, keeping the target and the previous
/// version (the rollback source).
fn prune_cache(root: &HostRoot, kver: &str, target: &str, previous: Option<&Option<String>>) {
    let mut keep = vec![target];
    if let Some(Some(p)) = previous {
        keep.push(p.as_str());
    }
    for gone in Cache::new(root).prune(kver, &keep) {
        tracing::info!(path = %gone, "pruned from the module cache");
    }
}

/// Logs what the host's modprobe.d says about tenstorrent, once per run.
fn log_host_options(host: &HostOptions) {
    if !host.values.is_empty() {
        tracing::info!(
            options = %module_params::canonical(&host.values),
            files = ?host.files,
            "the host's options tenstorrent lines are adopted at every load (spec.moduleParameters win per name)"
        );
    }
    for why in &host.ignored {
        tracing::warn!(why = %why, "a host modprobe.d option for tenstorrent is not adopted");
    }
}

/// What to load the module with: the host's options, the policy's over
/// them, each checked against the parameters `module` declares (`parm:`).
/// A parameter of the policy the module lacks fails the node (the kernel
/// would load it without the setting); one of the host's is dropped with a
/// warning (its DKMS era may have had parameters this version has not).
pub fn load_parameters(
    version: &str,
    module: &Verified,
    policy: &Values,
    host: &HostOptions,
) -> Result<Values> {
    if policy.is_empty() && host.values.is_empty() {
        return Ok(Values::new());
    }
    let bytes = read_module(module)?;
    let declared =
        crate::modinfo::declared_parameters(&bytes).map_err(|reason| AgentError::ModInfo {
            path: module.path.clone(),
            reason,
        })?;
    if let Some((name, value)) = policy.iter().find(|(k, _)| !declared.contains(*k)) {
        let since = module_params::parameter(name).map_or_else(
            || "tt-kmd has no such parameter".to_string(),
            |p| format!("it exists since tt-kmd {}", p.since),
        );
        return Err(AgentError::ParameterNotDeclared {
            version: version.to_string(),
            parameter: name.clone(),
            value: value.clone(),
            since,
        });
    }
    let types = crate::modinfo::parameter_types(&bytes).unwrap_or_default();
    let mut adopted = Values::new();
    for (k, v) in &host.values {
        if !declared.contains(k) {
            tracing::warn!(parameter = %k, version, "the host's option {k}={v} is not adopted: tenstorrent {version} has no such parameter");
            continue;
        }
        // A parameter of this release that today's tt-kmd no longer has
        // (2.0.0's arc_fw_init): read as the module's own type says.
        if module_params::parameter(k).is_none() {
            let kind = types.get(k).and_then(|t| module_params::kind_of(t));
            match kind.map(|kind| module_params::normalize_as(kind, k, v)) {
                Some(Ok(v)) => {
                    adopted.insert(k.clone(), v);
                }
                Some(Err(why)) => {
                    tracing::warn!(parameter = %k, version, "the host's option is not adopted: {why}")
                }
                None => {
                    tracing::warn!(parameter = %k, version, parmtype = ?types.get(k), "the host's option {k}={v} is not adopted: tenstorrent {version} declares it with a type the agent does not read")
                }
            }
            continue;
        }
        adopted.insert(k.clone(), v.clone());
    }
    Ok(crate::modprobe::merged(&adopted, policy))
}

/// The verified module's bytes, read from its descriptor (the file that is
/// loaded), not its path.
fn read_module(module: &Verified) -> Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let io = |e| AgentError::io("reading", &module.path, e);
    let len = module.file.metadata().map_err(io)?.len();
    let mut bytes = vec![0u8; usize::try_from(len).unwrap_or(0)];
    module.file.read_exact_at(&mut bytes, 0).map_err(io)?;
    Ok(bytes)
}

fn loaded_name(s: &ModuleState) -> String {
    s.version
        .clone()
        .unwrap_or_else(|| "(unversioned)".to_string())
}

/// A label value the agent writes: present (an empty value would say
/// nothing) and valid ([`ttdrv_api::validation::is_label_value`]).
pub fn valid_label_value(v: &str) -> bool {
    !v.is_empty() && ttdrv_api::validation::is_label_value(v)
}
