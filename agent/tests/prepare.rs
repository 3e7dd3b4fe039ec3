//! The prepare step on a fake host root: a new agent whose target differs
//! from the loaded module builds and verifies the target into the cache at
//! low priority and reports it (label kmd-prepared) before it waits for the
//! go-ahead, leaving the loaded module alone, so the swap after the go-ahead
//! is a cache hit; a build failure is reported before any go-ahead is asked
//! for. And the next-kernel preflight: every other installed kernel with a
//! build tree gets the target built and cached too; a failure only warns.

use std::fs;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ttdrv_agent::agent::{BUILD_NICE, next_kernels};
use ttdrv_agent::cache::Cache;
use ttdrv_agent::fake::{FakeBuilder, FakeKernel, fake_host, set_loaded};
use ttdrv_agent::node::{FAKE_POLICY, FakeNode, go_ahead_node, node_with, upgrading_record};
use ttdrv_agent::pod::FakePause;
use ttdrv_agent::{Agent, AgentError, Config, HostRoot, ModuleSource, Outcome};
use ttdrv_api::labels;
use ttdrv_core::reason::BUILD_FAILED;

const KVER: &str = "6.1.0-99-amd64";
const NEXT: &str = "6.12.0-1-amd64";
const WAITING: &str = "waiting for the controller's go-ahead";

struct Host {
    dir: tempfile::TempDir,
    pod: tempfile::TempDir,
}

impl Host {
    /// 2.7.0 loaded (refcnt 0), nothing cached.
    fn with_2_7_loaded() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        fake_host(dir.path(), KVER).expect("fake host");
        set_loaded(dir.path(), "2.7.0", 0).expect("loaded");
        let pod = tempfile::tempdir().expect("tempdir");
        fs::write(pod.path().join("tt-smi"), b"#!/bin/sh\n").expect("tt-smi");
        Host { dir, pod }
    }
    /// Nothing loaded, nothing cached.
    fn empty() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        fake_host(dir.path(), KVER).expect("fake host");
        let pod = tempfile::tempdir().expect("tempdir");
        Host { dir, pod }
    }
    fn root(&self) -> &Path {
        self.dir.path()
    }
    fn hr(&self) -> HostRoot {
        HostRoot::new(self.root())
    }
    /// Installs another kernel's build tree (a kernel not yet booted).
    fn install_kernel(&self, kver: &str, with_headers: bool) {
        let dir = if with_headers {
            format!("/lib/modules/{kver}/build")
        } else {
            format!("/lib/modules/{kver}/kernel")
        };
        fs::create_dir_all(self.hr().path(dir)).expect("kernel dir");
    }
    fn config(&self, target: &str) -> Config {
        Config {
            host_root: self.root().to_path_buf(),
            target_version: target.to_string(),
            force_unload: false,
            unload_timeout: Duration::from_secs(2),
            source_repository: "unused".to_string(),
            tt_smi_path: self.pod.path().join("tt-smi"),
            tt_smi_version: Some("3.0.0".to_string()),
            kbuild_link_dir: None,
            policy: Some(FAKE_POLICY.to_string()),
            go_ahead_poll: Duration::from_millis(3),
            swap_without_go_ahead: false,
            next_kernels: true,
            status_file: Some(self.pod.path().join("waiting")),
        }
    }
    fn cached(&self, kver: &str, version: &str) -> bool {
        Cache::new(&self.hr())
            .lookup(kver, version)
            .expect("cache readable")
            .is_some()
    }
    fn loaded(&self) -> Option<String> {
        self.hr().loaded_version().expect("sysfs")
    }
}

struct Run {
    result: Result<Outcome, AgentError>,
    log: String,
}

fn run(
    config: &Config,
    kernel: &FakeKernel,
    builder: &FakeBuilder,
    node: &FakeNode,
    pause: &FakePause,
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

fn label(node: &FakeNode, key: &str) -> Option<Option<String>> {
    node.labels().get(key).cloned()
}

fn assert_untouched(h: &Host, kernel: &FakeKernel) {
    assert_eq!(
        h.loaded().as_deref(),
        Some("2.7.0"),
        "the module was swapped"
    );
    assert_eq!(kernel.unloads(), 0, "unloaded");
    assert!(kernel.loads().is_empty(), "loaded: {:?}", kernel.loads());
}

#[test]
fn the_target_is_prepared_before_the_go_ahead_and_the_swap_is_a_cache_hit() {
    let h = Host::with_2_7_loaded();
    let kernel = FakeKernel::new(h.root());
    let builder = FakeBuilder::default();
    let waiting = FakeNode::with(node_with(
        Some(&upgrading_record(FAKE_POLICY, "2.8.0")),
        None,
    ));
    let r = run(
        &h.config("2.8.0"),
        &kernel,
        &builder,
        &waiting,
        &FakePause::stopping_after(3),
    );
    assert!(
        matches!(&r.result, Ok(Outcome::Stopped { waiting }) if waiting.contains(WAITING)),
        "{:?}\n{}",
        r.result,
        r.log
    );
    // Built once, for the running kernel, at the lowest CPU priority.
    assert_eq!(builder.runs(), vec![(KVER.to_string(), BUILD_NICE)]);
    assert!(
        h.cached(KVER, "2.8.0"),
        "the verified module is in the cache"
    );
    assert_eq!(
        label(&waiting, labels::KMD_PREPARED),
        Some(Some("2.8.0".to_string()))
    );
    // Prepared, then waited: the loaded module was never touched.
    let stored = r
        .log
        .find("step=\"cache-store\"")
        .or_else(|| r.log.find("step=cache-store"));
    let stored = stored.unwrap_or_else(|| panic!("cache-store not logged:\n{}", r.log));
    let waited = r.log.find(WAITING).expect("waiting logged");
    assert!(stored < waited, "{}", r.log);
    assert_untouched(&h, &kernel);

    // The pod is replaced, and the go-ahead comes: the swap loads from the
    // cache without building again.
    let go = FakeNode::with(go_ahead_node(FAKE_POLICY, "2.8.0"));
    let r = run(
        &h.config("2.8.0"),
        &kernel,
        &builder,
        &go,
        &FakePause::stopping_after(3),
    );
    assert!(
        matches!(
            &r.result,
            Ok(Outcome::Installed { source: ModuleSource::Cache, previous: Some(p), .. }) if p == "2.7.0"
        ),
        "{:?}\n{}",
        r.result,
        r.log
    );
    assert_eq!(builder.builds(), vec!["2.8.0".to_string()], "built again");
    assert_eq!(kernel.loads(), vec!["2.8.0".to_string()]);
    assert_eq!(h.loaded().as_deref(), Some("2.8.0"));
}

#[test]
fn a_build_failure_is_reported_before_any_go_ahead_is_asked_for() {
    let h = Host::with_2_7_loaded();
    let kernel = FakeKernel::new(h.root());
    let builder = FakeBuilder {
        failing_kernels: vec![KVER.to_string()],
        ..FakeBuilder::default()
    };
    let node = FakeNode::with(node_with(None, None));
    let pause = FakePause::stopping_after(3);
    let r = run(&h.config("2.8.0"), &kernel, &builder, &node, &pause);
    let err = r.result.expect_err("the build fails");
    assert_eq!(err.reason(), Some(BUILD_FAILED), "{err:?}");
    let message = err.termination_message().expect("a termination message");
    assert!(message.starts_with("BuildFailed: "), "{message}");
    // Failed before waiting: the controller was never asked for the
    // go-ahead (so it has no reason to cordon), nothing was prepared.
    assert_eq!(node.gets(), 0, "read the Node for a go-ahead");
    assert!(pause.pauses().is_empty(), "waited: {:?}", pause.pauses());
    assert_eq!(label(&node, labels::KMD_PREPARED), None);
    assert!(!h.cached(KVER, "2.8.0"));
    assert_untouched(&h, &kernel);
    // The loaded module is still reported as it is.
    assert_eq!(
        label(&node, labels::KMD_VERSION),
        Some(Some("2.7.0".to_string()))
    );
}

#[test]
fn the_next_kernel_is_built_and_cached_and_only_the_running_one_loaded() {
    let h = Host::empty();
    h.install_kernel(NEXT, true);
    // A kernel directory without a build tree is not a build target.
    h.install_kernel("6.0.0-0-amd64", false);
    assert_eq!(next_kernels(&h.hr(), KVER), vec![NEXT.to_string()]);
    let kernel = FakeKernel::new(h.root());
    let builder = FakeBuilder::default();
    let node = FakeNode::default();
    let r = run(
        &h.config("2.8.0"),
        &kernel,
        &builder,
        &node,
        &FakePause::stopping_after(3),
    );
    assert!(
        matches!(&r.result, Ok(Outcome::Installed { .. })),
        "{:?}\n{}",
        r.result,
        r.log
    );
    assert_eq!(
        builder.runs(),
        vec![
            (KVER.to_string(), BUILD_NICE),
            (NEXT.to_string(), BUILD_NICE)
        ]
    );
    assert!(h.cached(KVER, "2.8.0"));
    assert!(
        h.cached(NEXT, "2.8.0"),
        "the next kernel's module is cached"
    );
    assert_eq!(kernel.loads(), vec!["2.8.0".to_string()]);
    // No warning: the label is removed.
    assert_eq!(label(&node, labels::KMD_NEXT_KERNEL_FAILED), Some(None));

    // Run again (pod restart): both are cache hits, nothing is built.
    let r = run(
        &h.config("2.8.0"),
        &kernel,
        &builder,
        &node,
        &FakePause::stopping_after(3),
    );
    assert!(
        matches!(&r.result, Ok(Outcome::AlreadyCurrent { .. })),
        "{:?}",
        r.result
    );
    assert_eq!(builder.runs().len(), 2, "{:?}", builder.runs());
}

#[test]
fn a_next_kernel_that_does_not_build_only_warns() {
    let h = Host::empty();
    h.install_kernel(NEXT, true);
    let kernel = FakeKernel::new(h.root());
    let builder = FakeBuilder {
        failing_kernels: vec![NEXT.to_string()],
        ..FakeBuilder::default()
    };
    let node = FakeNode::default();
    let r = run(
        &h.config("2.8.0"),
        &kernel,
        &builder,
        &node,
        &FakePause::stopping_after(3),
    );
    assert!(
        matches!(&r.result, Ok(Outcome::Installed { version, .. }) if version == "2.8.0"),
        "{:?}\n{}",
        r.result,
        r.log
    );
    assert_eq!(h.loaded().as_deref(), Some("2.8.0"));
    assert!(!h.cached(NEXT, "2.8.0"));
    assert_eq!(
        label(&node, labels::KMD_NEXT_KERNEL_FAILED),
        Some(Some(NEXT.to_string()))
    );
    assert!(
        r.log.contains("a reboot into it would find no module"),
        "{}",
        r.log
    );
}

#[test]
fn the_next_kernel_preflight_can_be_turned_off() {
    let h = Host::empty();
    h.install_kernel(NEXT, true);
    let kernel = FakeKernel::new(h.root());
    // It would fail for the next kernel: off, nothing is tried or reported.
    let builder = FakeBuilder {
        failing_kernels: vec![NEXT.to_string()],
        ..FakeBuilder::default()
    };
    let node = FakeNode::default();
    let config = Config {
        next_kernels: false,
        ..h.config("2.8.0")
    };
    let r = run(
        &config,
        &kernel,
        &builder,
        &node,
        &FakePause::stopping_after(3),
    );
    assert!(
        matches!(&r.result, Ok(Outcome::Installed { .. })),
        "{:?}\n{}",
        r.result,
        r.log
    );
    assert_eq!(builder.runs(), vec![(KVER.to_string(), BUILD_NICE)]);
    assert!(!h.cached(NEXT, "2.8.0"));
    // An earlier warning goes: it no longer says anything true.
    assert_eq!(label(&node, labels::KMD_NEXT_KERNEL_FAILED), Some(None));
}
