//! A fake host root for running the agent in-process: the tree `fake_host`
//! plants under a temporary directory, the agent pod's own files (a bundled
//! tt-smi, the waiting note) in a second one, the agent's configuration for
//! it, and a run that captures the agent's log. Shared by every agent test
//! that runs the agent on a fake host, so each test says only what differs.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ttdrv_agent::build::Builder;
use ttdrv_agent::fake::{FakeBuilder, FakeKernel, add_holder, fake_host, plant_cached, set_loaded};
use ttdrv_agent::node::NodeApi;
use ttdrv_agent::node::fake::{FAKE_POLICY, FakeNode, go_ahead_node};
use ttdrv_agent::pod::{FakePause, Pause};
use ttdrv_agent::{Agent, AgentError, Config, HostRoot, ModuleSource, Outcome};

/// The running kernel of every fake host.
pub const KVER: &str = "6.1.0-99-amd64";
/// The bundled tt-smi the agent installs on the host.
pub const TT_SMI: &[u8] = b"#!/bin/sh\necho tt-smi\n";
/// The tt-smi version the configuration names (and the agent labels).
pub const TT_SMI_VERSION: &str = "3.0.0";
/// What the agent's status note says while it waits for the go-ahead.
pub const WAITING: &str = "waiting for the controller's go-ahead";

pub struct TestHost {
    dir: tempfile::TempDir,
    /// The agent pod's own filesystem: bundled tt-smi, waiting note.
    pod: tempfile::TempDir,
}

impl TestHost {
    /// A fake host with nothing loaded and nothing cached, and a bundled tt-smi.
    pub fn new() -> Self {
        let h = Self::without_tt_smi();
        fs::write(h.tt_smi(), TT_SMI).expect("write tt-smi");
        h
    }
    /// As [`TestHost::new`], without a bundled tt-smi.
    pub fn without_tt_smi() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        fake_host(dir.path(), KVER).expect("fake host");
        let pod = tempfile::tempdir().expect("tempdir");
        TestHost { dir, pod }
    }
    /// `version` loaded with `refcnt` users, nothing cached.
    pub fn with_loaded(version: &str, refcnt: u32) -> Self {
        let h = Self::new();
        set_loaded(h.root(), version, refcnt).expect("loaded");
        h
    }
    pub fn root(&self) -> &Path {
        self.dir.path()
    }
    pub fn hr(&self) -> HostRoot {
        HostRoot::new(self.root())
    }
    /// A host path (`/lib/modules/...`) under the fake root.
    pub fn p(&self, host_path: &str) -> PathBuf {
        self.hr().path(host_path)
    }
    /// The agent pod's filesystem.
    pub fn pod(&self) -> &Path {
        self.pod.path()
    }
    pub fn tt_smi(&self) -> PathBuf {
        self.pod().join("tt-smi")
    }
    /// The status note the readiness probe reads.
    pub fn note(&self) -> PathBuf {
        self.pod().join("waiting")
    }
    /// The configuration of an agent installing `target` on this host for
    /// [`FAKE_POLICY`]; tests change fields with `Config { .., ..h.config(t) }`.
    pub fn config(&self, target: &str) -> Config {
        Config {
            host_root: self.root().to_path_buf(),
            target_version: target.to_string(),
            force_unload: false,
            unload_timeout: Duration::from_secs(2),
            source_repository: "unused".to_string(),
            tt_smi_path: self.tt_smi(),
            tt_smi_version: Some(TT_SMI_VERSION.to_string()),
            kbuild_link_dir: None,
            policy: Some(FAKE_POLICY.to_string()),
            go_ahead_poll: Duration::from_millis(3),
            swap_without_go_ahead: false,
            next_kernels: true,
            signing: None,
            module_parameters: Default::default(),
            status_file: Some(self.note()),
            validation_timeout: std::time::Duration::from_millis(200),
            on_validation_failure: Default::default(),
        }
    }
    /// Plants a verified cache entry for `version` whose module says
    /// `module_version`, for the running kernel.
    pub fn cache_module(&self, version: &str, module_version: &str) {
        plant_cached(self.root(), KVER, version, module_version).expect("cache module");
    }
    pub fn cache(&self, version: &str) {
        self.cache_module(version, version);
    }
    /// Runs an agent installing `target` here with `kernel` and a fake
    /// builder (see [`run`]).
    pub fn run_with(
        &self,
        target: &str,
        kernel: &FakeKernel,
        node: &dyn NodeApi,
    ) -> Result<Outcome, AgentError> {
        run(&self.config(target), kernel, &FakeBuilder::default(), node)
    }
    /// Runs an agent with `config` here, with a fresh fake kernel and builder.
    pub fn run_config(&self, config: &Config, node: &dyn NodeApi) -> Result<Outcome, AgentError> {
        run(
            config,
            &FakeKernel::new(self.root()),
            &FakeBuilder::default(),
            node,
        )
    }
    /// Runs an agent installing `target` here with a fresh fake kernel and
    /// builder (see [`run_polls`]).
    pub fn run_fresh(&self, target: &str, node: &dyn NodeApi, polls: u32) -> Run {
        let kernel = FakeKernel::new(self.root());
        run_polls(
            &self.config(target),
            &kernel,
            &FakeBuilder::default(),
            node,
            polls,
        )
    }
    /// The module version sysfs reports loaded.
    pub fn loaded(&self) -> Option<String> {
        self.hr().loaded_version().expect("sysfs")
    }
}

/// The UID of the workload pod holding the device in the busy-device tests.
pub const POD_UID: &str = "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b";

/// Two holders of the device on the host at `root`: pid 4242 (python3) in a
/// container of pod [`POD_UID`], pid 4343 (tt-smi) outside any pod.
pub fn add_busy_holders(root: &Path) {
    let cgroup = format!(
        "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/cri-containerd-0123456789abcdef0123.scope\n",
        POD_UID.replace('-', "_")
    );
    add_holder(root, 4242, "python3", &cgroup).expect("holder");
    add_holder(root, 4343, "tt-smi", "0::/user.slice/session-1.scope\n").expect("holder");
}

/// The loaded 2.7.0 was left alone: not unloaded, nothing loaded, nobody killed.
/// `err` fails the node with `reason` and its message says each of `parts`.
pub fn assert_failure(err: &AgentError, reason: &str, parts: &[&str]) {
    let msg = err.to_string();
    assert_eq!(err.reason(), Some(reason), "{msg}");
    for p in parts {
        assert!(msg.contains(p), "{p:?} not in: {msg}");
    }
}

pub fn assert_untouched(h: &TestHost, kernel: &FakeKernel) {
    assert_eq!(
        h.loaded().as_deref(),
        Some("2.7.0"),
        "the module was swapped"
    );
    assert_eq!(kernel.unloads(), 0, "unloaded");
    assert!(kernel.loads().is_empty(), "loaded: {:?}", kernel.loads());
    assert!(kernel.killed().is_empty(), "killed: {:?}", kernel.killed());
}

/// `outcome` installed `version` from `source` with no previous version
/// reported, after `unloads` unloads, and `version` is loaded now.
pub fn assert_installed_over_nothing(
    h: &TestHost,
    kernel: &FakeKernel,
    outcome: &Outcome,
    source: ModuleSource,
    version: &str,
    unloads: u32,
) {
    assert!(
        matches!(outcome, Outcome::Installed { previous: None, source: s, .. } if *s == source),
        "{outcome:?}"
    );
    assert_eq!(kernel.unloads(), unloads);
    assert_eq!(h.loaded().as_deref(), Some(version));
}

/// A node with the controller's go-ahead to swap to `target`.
pub fn go_ahead(target: &str) -> FakeNode {
    FakeNode::with(go_ahead_node(FAKE_POLICY, target))
}

/// Runs the agent in-process; a swap waiting for a go-ahead that never comes
/// ends (`Outcome::Stopped`) after three polls instead of waiting forever.
pub fn run(
    config: &Config,
    kernel: &FakeKernel,
    builder: &dyn Builder,
    node: &dyn NodeApi,
) -> Result<Outcome, AgentError> {
    run_logged(config, kernel, builder, node, &FakePause::stopping_after(3)).result
}

pub struct Run {
    pub result: Result<Outcome, AgentError>,
    /// What the agent logged (plain text).
    pub log: String,
}

/// Runs the agent in-process, capturing its log; a wait for a go-ahead ends
/// (`Outcome::Stopped`) after `polls` polls.
pub fn run_polls(
    config: &Config,
    kernel: &FakeKernel,
    builder: &dyn Builder,
    node: &dyn NodeApi,
    polls: u32,
) -> Run {
    run_logged(
        config,
        kernel,
        builder,
        node,
        &FakePause::stopping_after(polls),
    )
}

/// Runs the agent in-process with `pause`, capturing its log.
pub fn run_logged(
    config: &Config,
    kernel: &FakeKernel,
    builder: &dyn Builder,
    node: &dyn NodeApi,
    pause: &dyn Pause,
) -> Run {
    let buf = Arc::new(Mutex::new(Vec::<u8>::new()));
    let sink = Arc::clone(&buf);
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || LogSink(Arc::clone(&sink)))
        .finish();
    let result = tracing::subscriber::with_default(subscriber, || {
        Agent {
            config,
            kernel,
            killer: kernel,
            builder,
            node,
            pause,
        }
        .run()
    });
    let log = String::from_utf8_lossy(&buf.lock().expect("log")).into_owned();
    Run { result, log }
}

struct LogSink(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogSink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut v) = self.0.lock() {
            v.extend_from_slice(b);
        }
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `assert!(matches!(value, pattern))` that shows the value when it fails.
#[allow(unused_macros)]
macro_rules! assert_matches {
    ($value:expr, $($pattern:tt)+) => {
        assert!(matches!($value, $($pattern)+), "{:?}", $value)
    };
}
#[allow(unused_imports)]
pub(crate) use assert_matches;

/// Asserts that a [`Run`]'s result matches `pattern` (matched by reference),
/// showing the result and the agent's log when it does not.
#[allow(unused_macros)]
macro_rules! assert_outcome {
    ($run:expr, $($pattern:tt)+) => {{
        let run: &$crate::common::host::Run = &$run;
        assert!(
            matches!(&run.result, $($pattern)+),
            "{:?}\n{}",
            run.result,
            run.log
        )
    }};
}
#[allow(unused_imports)]
pub(crate) use assert_outcome;
