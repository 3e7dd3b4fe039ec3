//! The prepare step on a fake host root: a new agent whose target differs
//! from the loaded module builds and verifies the target into the cache at
//! low priority and reports it (label kmd-prepared) before it waits for the
//! go-ahead, leaving the loaded module alone, so the swap after the go-ahead
//! is a cache hit; a build failure is reported before any go-ahead is asked
//! for. And the next-kernel preflight: every other installed kernel with a
//! build tree gets the target built and cached too; a failure only warns.

mod common;

use std::fs;

use ttdrv_agent::agent::{BUILD_NICE, next_kernels};
use ttdrv_agent::cache::Cache;
use ttdrv_agent::fake::{FakeBuilder, FakeKernel};
use ttdrv_agent::node::fake::{FAKE_POLICY, FakeNode, go_ahead_node, node_with, upgrading_record};
use ttdrv_agent::pod::FakePause;
use ttdrv_agent::{Config, ModuleSource, Outcome};
use ttdrv_api::labels;
use ttdrv_core::reason::BUILD_FAILED;

use common::host::{
    KVER, TestHost as Host, WAITING, assert_outcome, assert_untouched, run_logged as run, run_polls,
};

const NEXT: &str = "6.12.0-1-amd64";

/// 2.7.0 loaded (refcnt 0), nothing cached.
fn with_2_7_loaded() -> Host {
    Host::with_loaded("2.7.0", 0)
}

/// Nothing loaded, nothing cached, no bundled tt-smi.
fn empty() -> Host {
    Host::without_tt_smi()
}

/// Installs another kernel's build tree (a kernel not yet booted).
fn install_kernel(h: &Host, kver: &str, with_headers: bool) {
    let dir = if with_headers {
        format!("/lib/modules/{kver}/build")
    } else {
        format!("/lib/modules/{kver}/kernel")
    };
    fs::create_dir_all(h.p(&dir)).expect("kernel dir");
}

/// Nothing loaded, the next kernel installed, and a builder failing for it.
fn next_kernel_failing() -> (Host, FakeKernel, FakeBuilder) {
    let h = empty();
    install_kernel(&h, NEXT, true);
    let kernel = FakeKernel::new(h.root());
    let builder = FakeBuilder {
        failing_kernels: vec![NEXT.to_string()],
        ..FakeBuilder::default()
    };
    (h, kernel, builder)
}

fn cached(h: &Host, kver: &str, version: &str) -> bool {
    Cache::new(&h.hr())
        .lookup(kver, version, ttdrv_agent::cache::SignedBy::Nobody)
        .expect("cache readable")
        .is_some()
}

fn label(node: &FakeNode, key: &str) -> Option<Option<String>> {
    node.labels().get(key).cloned()
}

#[test]
fn the_target_is_prepared_before_the_go_ahead_and_the_swap_is_a_cache_hit() {
    let h = with_2_7_loaded();
    let kernel = FakeKernel::new(h.root());
    let builder = FakeBuilder::default();
    let waiting = FakeNode::with(node_with(
        Some(&upgrading_record(FAKE_POLICY, "2.8.0")),
        None,
    ));
    let r = run_polls(&h.config("2.8.0"), &kernel, &builder, &waiting, 3);
    assert_outcome!(r, Ok(Outcome::Stopped { waiting }) if waiting.contains(WAITING));
    // Built once, for the running kernel, at the lowest CPU priority.
    assert_eq!(builder.runs(), vec![(KVER.to_string(), BUILD_NICE)]);
    assert!(
        cached(&h, KVER, "2.8.0"),
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
    let r = run_polls(&h.config("2.8.0"), &kernel, &builder, &go, 3);
    assert_outcome!(r, Ok(Outcome::Installed { source: ModuleSource::Cache, previous: Some(p), .. }) if p == "2.7.0");
    assert_eq!(builder.builds(), vec!["2.8.0".to_string()], "built again");
    assert_eq!(kernel.loads(), vec!["2.8.0".to_string()]);
    assert_eq!(h.loaded().as_deref(), Some("2.8.0"));
}

#[test]
fn a_build_failure_is_reported_before_any_go_ahead_is_asked_for() {
    let h = with_2_7_loaded();
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
    // Failed before waiting: the Node was read once (is the node's cycle
    // open already? it sets the build's priority), never waited on; nothing
    // was prepared.
    assert!(node.gets() <= 1, "read the Node {} times", node.gets());
    assert!(pause.pauses().is_empty(), "waited: {:?}", pause.pauses());
    assert_eq!(label(&node, labels::KMD_PREPARED), None);
    assert!(!cached(&h, KVER, "2.8.0"));
    assert_untouched(&h, &kernel);
    // The loaded module is still reported as it is.
    assert_eq!(
        label(&node, labels::KMD_VERSION),
        Some(Some("2.7.0".to_string()))
    );
}

#[test]
fn the_next_kernel_is_built_and_cached_and_only_the_running_one_loaded() {
    let h = empty();
    install_kernel(&h, NEXT, true);
    // A kernel directory without a build tree is not a build target.
    install_kernel(&h, "6.0.0-0-amd64", false);
    assert_eq!(next_kernels(&h.hr(), KVER), vec![NEXT.to_string()]);
    let kernel = FakeKernel::new(h.root());
    let builder = FakeBuilder::default();
    let node = FakeNode::default();
    let r = run_polls(&h.config("2.8.0"), &kernel, &builder, &node, 3);
    assert_outcome!(r, Ok(Outcome::Installed { .. }));
    assert_eq!(
        builder.runs(),
        vec![
            (KVER.to_string(), BUILD_NICE),
            (NEXT.to_string(), BUILD_NICE)
        ]
    );
    assert!(cached(&h, KVER, "2.8.0"));
    assert!(
        cached(&h, NEXT, "2.8.0"),
        "the next kernel's module is cached"
    );
    assert_eq!(kernel.loads(), vec!["2.8.0".to_string()]);
    // No warning: the label is removed.
    assert_eq!(label(&node, labels::KMD_NEXT_KERNEL_FAILED), Some(None));

    // Run again (pod restart): both are cache hits, nothing is built.
    let r = run_polls(&h.config("2.8.0"), &kernel, &builder, &node, 3);
    assert_outcome!(r, Ok(Outcome::AlreadyCurrent { .. }));
    assert_eq!(builder.runs().len(), 2, "{:?}", builder.runs());
}

#[test]
fn a_next_kernel_that_does_not_build_only_warns() {
    let (h, kernel, builder) = next_kernel_failing();
    let node = FakeNode::default();
    let r = run_polls(&h.config("2.8.0"), &kernel, &builder, &node, 3);
    assert_outcome!(r, Ok(Outcome::Installed { version, .. }) if version == "2.8.0");
    assert_eq!(h.loaded().as_deref(), Some("2.8.0"));
    assert!(!cached(&h, NEXT, "2.8.0"));
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
    // It would fail for the next kernel: off, nothing is tried or reported.
    let (h, kernel, builder) = next_kernel_failing();
    let node = FakeNode::default();
    let config = Config {
        next_kernels: false,
        signing: None,
        ..h.config("2.8.0")
    };
    let r = run_polls(&config, &kernel, &builder, &node, 3);
    assert_outcome!(r, Ok(Outcome::Installed { .. }));
    assert_eq!(builder.runs(), vec![(KVER.to_string(), BUILD_NICE)]);
    assert!(!cached(&h, NEXT, "2.8.0"));
    // An earlier warning goes: it no longer says anything true.
    assert_eq!(label(&node, labels::KMD_NEXT_KERNEL_FAILED), Some(None));
}

#[test]
fn a_build_inside_the_window_runs_at_normal_priority() {
    // The go-ahead is on the node when the pod starts (build-ahead off, or
    // the pod came after the cordon): the node waits for this build.
    let h = with_2_7_loaded();
    let kernel = FakeKernel::new(h.root());
    let builder = FakeBuilder::default();
    let go = FakeNode::with(go_ahead_node(FAKE_POLICY, "2.8.0"));
    let r = run_polls(&h.config("2.8.0"), &kernel, &builder, &go, 3);
    assert_outcome!(
        r,
        Ok(Outcome::Installed {
            source: ModuleSource::Build,
            ..
        })
    );
    let runs = builder.runs();
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_ne!(runs[0].1, BUILD_NICE, "built at nice 19 inside the window");
}
