//! The second key on a fake host root: a loaded module of another version is
//! swapped only with the controller's go-ahead for this node, policy, target
//! and cycle; without it the module stays, the agent is not Ready and says
//! why. Also what the agent reports first (install mode, loaded version, boot
//! ID), and the binary waiting against a fake API server until SIGTERM.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use ttdrv_agent::fake::{FAKE_BOOT_ID, FakeBuilder, FakeKernel, add_holder};
use ttdrv_agent::node::fake::{
    FAKE_CYCLE, FAKE_NODE, FAKE_POLICY, FakeNode, go_ahead_node, node_with, upgrading_record,
};
use ttdrv_agent::pod::{self, FakePause};
use ttdrv_agent::{AgentError, Config, ModuleSource, Outcome};
use ttdrv_api::{NodeState, labels};
use ttdrv_core::go_ahead::GoAhead;

use common::host::{
    KVER, Run, TestHost as Host, WAITING, assert_matches, assert_outcome, assert_untouched,
    run_logged as run, run_polls,
};

/// What the readiness probe answers for `target`.
fn ready(h: &Host, target: &str) -> Result<String, String> {
    pod::readiness(&h.hr(), target, &Default::default(), Some(&h.note()))
}

/// A host with 2.7.0 loaded (refcnt 0) and 2.8.0 in the cache.
fn host_with_2_7_loaded() -> Host {
    let h = Host::with_loaded("2.7.0", 0);
    h.cache("2.8.0");
    h
}

fn stopped_waiting(r: &Run) -> String {
    match &r.result {
        Ok(Outcome::Stopped { waiting }) => waiting.clone(),
        other => panic!("expected to wait until stopped, got {other:?}\n{}", r.log),
    }
}

/// A holder (pid 4242) on `h`, and an agent configuration with force-unload.
fn held_with_force_unload(h: &Host) -> Config {
    add_holder(h.root(), 4242, "python3", "0::/\n").expect("holder");
    Config {
        force_unload: true,
        ..h.config("2.8.0")
    }
}

#[test]
fn no_go_ahead_leaves_the_loaded_module_alone_and_the_pod_not_ready() {
    let h = host_with_2_7_loaded();
    // A holder and force-unload: still nobody is killed without the go-ahead.
    let config = held_with_force_unload(&h);
    let kernel = FakeKernel::new(h.root());
    // The controller's record says Upgrading, but it wrote no go-ahead (yet).
    let node = FakeNode::with(node_with(
        Some(&upgrading_record(FAKE_POLICY, "2.8.0")),
        None,
    ));
    let pause = FakePause::stopping_after(5);
    let r = run(&config, &kernel, &FakeBuilder::default(), &node, &pause);

    let why = stopped_waiting(&r);
    assert!(why.contains(WAITING), "{why}");
    assert_untouched(&h, &kernel);
    assert!(h.p("/proc/4242").exists(), "the holder is alive");
    // Waited: polled every go_ahead_poll, reading the Node each time.
    assert_eq!(pause.pauses(), vec![config.go_ahead_poll; 5]);
    assert!(node.gets() >= 5, "gets: {}", node.gets());
    // Said why, once for the one reason, not at every poll.
    assert_eq!(r.log.matches(WAITING).count(), 1, "{}", r.log);
    assert!(r.log.contains("none on the node yet"), "{}", r.log);
    // Not Ready, and the probe says why.
    let not_ready = ready(&h, "2.8.0").expect_err("not ready while waiting");
    assert!(not_ready.contains(WAITING), "{not_ready}");
    assert_eq!(pod::waiting(&h.note()).as_deref(), Some(why.as_str()));
}

#[test]
fn a_valid_go_ahead_swaps() {
    let h = host_with_2_7_loaded();
    let kernel = FakeKernel::new(h.root());
    let node = FakeNode::with(go_ahead_node(FAKE_POLICY, "2.8.0"));
    let pause = FakePause::stopping_after(5);
    let r = run(
        &h.config("2.8.0"),
        &kernel,
        &FakeBuilder::default(),
        &node,
        &pause,
    );
    assert_eq!(
        r.result.as_ref().ok(),
        Some(&Outcome::Installed {
            version: "2.8.0".into(),
            previous: Some("2.7.0".into()),
            source: ModuleSource::Cache,
            killed: vec![],
        }),
        "{:?}\n{}",
        r.result,
        r.log
    );
    assert_eq!(kernel.unloads(), 1);
    assert_eq!(kernel.loads(), vec!["2.8.0".to_string()]);
    assert_eq!(h.loaded().as_deref(), Some("2.8.0"));
    assert!(pause.pauses().is_empty(), "no waiting with a go-ahead");
    assert!(!r.log.contains(WAITING), "{}", r.log);
    assert!(ready(&h, "2.8.0").is_ok(), "{:?}", ready(&h, "2.8.0"));
}

#[test]
fn a_go_ahead_arriving_while_waiting_swaps_then() {
    let h = host_with_2_7_loaded();
    let config = held_with_force_unload(&h);
    let kernel = FakeKernel::new(h.root());
    let record = upgrading_record(FAKE_POLICY, "2.8.0");
    let none = node_with(Some(&record), None);
    let node = FakeNode::with_sequence([
        none.clone(),
        none.clone(),
        none,
        go_ahead_node(FAKE_POLICY, "2.8.0"),
    ]);
    let pause = FakePause::stopping_after(100);
    let r = run(&config, &kernel, &FakeBuilder::default(), &node, &pause);
    assert_outcome!(r, Ok(Outcome::Installed { killed, .. }) if killed.len() == 1);
    // The wait lasted until the 4th read of the Node: one before the build
    // (its priority), then two polls without.
    assert_eq!(node.gets(), 4);
    assert_eq!(pause.pauses().len(), 2, "{:?}", pause.pauses());
    // The holder was killed only after the go-ahead: force-unload waited too.
    assert_eq!(kernel.killed(), vec![4242]);
    assert_eq!(h.loaded().as_deref(), Some("2.8.0"));
    assert_eq!(r.log.matches(WAITING).count(), 1, "{}", r.log);
    let kill = r.log.find("SIGKILL").expect("kill logged");
    let go = r
        .log
        .find("go-ahead is on the node")
        .expect("go-ahead logged");
    assert!(go < kill, "the kill came before the go-ahead:\n{}", r.log);
    assert_eq!(pod::waiting(&h.note()), None, "the waiting note is gone");
    assert!(ready(&h, "2.8.0").is_ok());
}

#[test]
fn a_go_ahead_for_another_node_policy_target_or_cycle_opens_nothing() {
    let record = upgrading_record(FAKE_POLICY, "2.8.0");
    let go = GoAhead::for_cycle(FAKE_NODE, &record).expect("cycle");
    let mut draining = record.clone();
    draining.state = NodeState::Draining;
    let cases: Vec<(&str, Node)> = vec![
        (
            "copied from another node",
            node_with(
                Some(&record),
                Some(&GoAhead {
                    node: "other-node".into(),
                    ..go.clone()
                }),
            ),
        ),
        (
            "stale cycle",
            node_with(
                Some(&record),
                Some(&GoAhead {
                    cycle: FAKE_CYCLE - 3600,
                    ..go.clone()
                }),
            ),
        ),
        (
            "another policy",
            node_with(
                Some(&record),
                Some(&GoAhead {
                    policy: "other".into(),
                    ..go.clone()
                }),
            ),
        ),
        (
            "another target",
            node_with(
                Some(&record),
                Some(&GoAhead {
                    target: "2.9.0".into(),
                    ..go.clone()
                }),
            ),
        ),
        (
            "record still Draining",
            node_with(Some(&draining), Some(&go)),
        ),
        ("no record", node_with(None, Some(&go))),
    ];
    for (name, n) in cases {
        let h = host_with_2_7_loaded();
        let kernel = FakeKernel::new(h.root());
        let r = run_polls(
            &h.config("2.8.0"),
            &kernel,
            &FakeBuilder::default(),
            &FakeNode::with(n),
            2,
        );
        let why = stopped_waiting(&r);
        assert!(why.contains(WAITING), "{name}: {why}");
        assert_untouched(&h, &kernel);
        assert!(ready(&h, "2.8.0").is_err(), "{name}: ready");
    }
}

#[test]
fn without_a_policy_a_loaded_module_is_never_swapped() {
    let h = host_with_2_7_loaded();
    let mut config = h.config("2.8.0");
    config.policy = None;
    let kernel = FakeKernel::new(h.root());
    let node = FakeNode::with(go_ahead_node(FAKE_POLICY, "2.8.0"));
    let r = run_polls(&config, &kernel, &FakeBuilder::default(), &node, 2);
    let why = stopped_waiting(&r);
    assert!(why.contains("TTDRV_POLICY is not set"), "{why}");
    assert_untouched(&h, &kernel);

    // A first install and an already loaded target still work without one.
    let h = Host::new();
    h.cache("2.8.0");
    let mut config = h.config("2.8.0");
    config.policy = None;
    let kernel = FakeKernel::new(h.root());
    let r = run_polls(
        &config,
        &kernel,
        &FakeBuilder::default(),
        &FakeNode::default(),
        2,
    );
    assert_outcome!(r, Ok(Outcome::Installed { previous: None, .. }));
    let r = run_polls(
        &config,
        &kernel,
        &FakeBuilder::default(),
        &FakeNode::default(),
        2,
    );
    assert_outcome!(r, Ok(Outcome::AlreadyCurrent { .. }));
}

#[test]
fn nothing_loaded_installs_without_asking_for_a_go_ahead() {
    let h = Host::new();
    let kernel = FakeKernel::new(h.root());
    let builder = FakeBuilder::default();
    // No Node at all: a GET would fail.
    let node = FakeNode::default();
    let pause = FakePause::stopping_after(1);
    let r = run(&h.config("2.8.0"), &kernel, &builder, &node, &pause);
    assert_outcome!(
        r,
        Ok(Outcome::Installed {
            previous: None,
            source: ModuleSource::Build,
            ..
        })
    );
    assert_eq!(node.gets(), 0, "asked the API server for a go-ahead");
    assert!(pause.pauses().is_empty());
    assert_eq!(h.loaded().as_deref(), Some("2.8.0"));
}

#[test]
fn a_busy_device_without_a_go_ahead_waits_and_with_one_fails_before_building() {
    let h = host_with_2_7_loaded();
    fs::remove_dir_all(h.p(&format!("/var/cache/tt-kmd/{KVER}"))).expect("empty cache");
    add_holder(h.root(), 4242, "python3", "0::/\n").expect("holder");
    let kernel = FakeKernel::new(h.root());
    let builder = FakeBuilder::default();
    // Workloads still run before the drain: waiting is expected, no failure.
    let node = FakeNode::with(node_with(None, None));
    let r = run_polls(&h.config("2.8.0"), &kernel, &builder, &node, 2);
    stopped_waiting(&r);
    assert_untouched(&h, &kernel);
    // With the go-ahead a holder left after the drain is a failure, found
    // before any build.
    let builder = FakeBuilder::default();
    let node = FakeNode::with(go_ahead_node(FAKE_POLICY, "2.8.0"));
    let r = run_polls(&h.config("2.8.0"), &kernel, &builder, &node, 2);
    let err = r.result.expect_err("busy");
    assert_matches!(err, AgentError::Busy { .. });
    assert!(builder.builds().is_empty(), "built before refusing");
    assert_untouched(&h, &kernel);
    let msg = err.termination_message().expect("a reason");
    assert!(
        msg.starts_with("DeviceBusy: ") && msg.contains("pid 4242 (python3)"),
        "{msg}"
    );
}

// ---------------------------------------------------------------------------
// What the agent reports first.
// ---------------------------------------------------------------------------

fn label(v: &str) -> Option<String> {
    Some(v.to_string())
}

#[test]
fn a_removed_dkms_install_is_reported_as_container_even_when_the_run_fails() {
    let h = Host::with_loaded("2.7.0", 0);
    fs::create_dir_all(h.p("/var/lib/dkms/tenstorrent/2.7.0")).expect("dkms");
    let kernel = FakeKernel::new(h.root());
    let node = FakeNode::default();
    let r = run_polls(
        &h.config("2.8.0"),
        &kernel,
        &FakeBuilder::default(),
        &node,
        1,
    );
    assert_outcome!(r, Ok(Outcome::HostManaged { .. }));
    assert_eq!(
        node.labels().get(labels::INSTALL_MODE),
        Some(&label("host"))
    );

    // DKMS is removed from the host; this run then fails (no kernel headers
    // to build with), yet the node is no longer reported host-managed.
    fs::remove_dir_all(h.p("/var/lib/dkms")).expect("remove dkms");
    fs::remove_dir_all(h.p(&format!("/lib/modules/{KVER}"))).expect("rm headers");
    let r = run_polls(
        &h.config("2.8.0"),
        &kernel,
        &FakeBuilder::default(),
        &node,
        1,
    );
    let err = r.result.expect_err("no headers");
    assert_matches!(err, AgentError::HeadersMissing { .. });
    let l = node.labels();
    assert_eq!(l.get(labels::INSTALL_MODE), Some(&label("container")));
    assert_eq!(l.get(labels::KMD_VERSION), Some(&label("2.7.0")));
    assert_eq!(l.get(labels::KMD_BOOT_ID), Some(&label(FAKE_BOOT_ID)));
    assert_eq!(h.loaded().as_deref(), Some("2.7.0"));
}

#[test]
fn every_report_of_the_version_carries_the_boot_id() {
    // Nothing loaded and the run fails: kmd-version is removed, with the boot ID.
    let h = Host::new();
    fs::remove_dir_all(h.p(&format!("/lib/modules/{KVER}"))).expect("rm headers");
    let node = FakeNode::default();
    let r = h.run_fresh("2.8.0", &node, 1);
    assert!(r.result.is_err());
    let calls = node.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].get(labels::KMD_VERSION), Some(&None));
    assert_eq!(
        calls[0].get(labels::KMD_BOOT_ID),
        Some(&label(FAKE_BOOT_ID))
    );

    // A successful install: each patch that names kmd-version names the boot ID.
    let h = Host::new();
    let node = FakeNode::default();
    let r = h.run_fresh("2.8.0", &node, 1);
    assert!(r.result.is_ok(), "{:?}", r.result);
    let calls = node.calls();
    assert_eq!(calls.len(), 2, "the report, then the result: {calls:?}");
    for c in &calls {
        assert!(c.contains_key(labels::KMD_VERSION), "{c:?}");
        assert_eq!(
            c.get(labels::KMD_BOOT_ID),
            Some(&label(FAKE_BOOT_ID)),
            "{c:?}"
        );
    }
    assert_eq!(calls[1].get(labels::KMD_VERSION), Some(&label("2.8.0")));

    // After a reboot the boot ID differs, and the next report says so.
    fs::write(
        h.p("/proc/sys/kernel/random/boot_id"),
        "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d\n",
    )
    .expect("boot id");
    fs::remove_dir_all(h.p("/sys/module/tenstorrent")).expect("reboot unloads");
    h.run_fresh("2.8.0", &node, 1).result.expect("reinstall");
    assert_eq!(
        node.labels().get(labels::KMD_BOOT_ID),
        Some(&label("0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"))
    );
}

// ---------------------------------------------------------------------------
// The binary, against a fake API server.
// ---------------------------------------------------------------------------

/// Kills the child when a test fails before it ends it.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Collects a child's stderr lines; `wait_for` blocks until one contains a text.
struct Lines(Arc<Mutex<Vec<String>>>);

impl Lines {
    fn collect(stderr: std::process::ChildStderr) -> Self {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let l = Arc::clone(&lines);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Ok(mut v) = l.lock() {
                    v.push(line);
                }
            }
        });
        Lines(lines)
    }
    fn text(&self) -> String {
        self.0.lock().map(|v| v.join("\n")).unwrap_or_default()
    }
    fn wait_for(&self, needle: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.text().contains(needle) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

#[test]
fn the_agent_binary_waits_not_ready_and_sigterm_ends_the_wait_at_once() {
    let h = host_with_2_7_loaded();
    let scratch = tempfile::tempdir().expect("tempdir");
    // The Node still says host-managed from before; the controller's record
    // says Upgrading, without a go-ahead.
    let mut node = node_with(Some(&upgrading_record(FAKE_POLICY, "2.8.0")), None);
    node.metadata.labels = Some(BTreeMap::from([
        (labels::INSTALL_MODE.to_string(), "host".to_string()),
        (labels::KMD_VERSION.to_string(), "2.6.0".to_string()),
    ]));
    let api = common::FakeApi::start(&node);
    let bin = Path::new(env!("CARGO_BIN_EXE_ttdrv-agent"));
    let child = common::agent_command(bin, Some(&api), scratch.path())
        .env("NODE_NAME", FAKE_NODE)
        .env("TTDRV_POLICY", FAKE_POLICY)
        // A long poll: SIGTERM must end the wait, not the next poll.
        .env("TTDRV_GO_AHEAD_POLL_MS", "600000")
        .arg("--host-root")
        .arg(h.root())
        .args(["run", "--version", "2.8.0", "--tt-smi-path"])
        .arg(h.tt_smi())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn ttdrv-agent");
    let mut guard = KillOnDrop(child);
    let child = &mut guard.0;
    let lines = Lines::collect(child.stderr.take().expect("stderr"));
    if !lines.wait_for(WAITING, Duration::from_secs(30)) {
        panic!("the agent did not say it waits:\n{}", lines.text());
    }
    assert!(child.try_wait().expect("try_wait").is_none(), "exited");

    // Not Ready, with the reason; `status` says it too.
    let agent = |command: &str| {
        common::agent_command(bin, None, scratch.path())
            .arg("--host-root")
            .arg(h.root())
            .args([command, "--version", "2.8.0"])
            .output()
            .unwrap_or_else(|e| panic!("{command}: {e}"))
    };
    let ready = agent("ready");
    assert!(!ready.status.success(), "Ready while waiting");
    let said = String::from_utf8_lossy(&ready.stderr);
    assert!(said.contains(WAITING), "{said}");
    let status = agent("status");
    let v: serde_json::Value = serde_json::from_slice(&status.stdout).expect("json");
    assert!(
        v["waiting"].as_str().is_some_and(|w| w.contains(WAITING)),
        "{v}"
    );
    assert_eq!(v["ready"], false);

    // What the host runs was reported first: no longer host-managed.
    let l = api.labels();
    assert_eq!(
        l.get(labels::INSTALL_MODE).map(String::as_str),
        Some("container")
    );
    assert_eq!(
        l.get(labels::KMD_VERSION).map(String::as_str),
        Some("2.7.0")
    );
    assert_eq!(
        l.get(labels::KMD_BOOT_ID).map(String::as_str),
        Some(FAKE_BOOT_ID)
    );
    assert!(api.gets() >= 1, "the Node was never read");

    let sent = Instant::now();
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break s;
        }
        if sent.elapsed() > Duration::from_secs(5) {
            panic!("SIGTERM did not end the wait:\n{}", lines.text());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}\n{}", lines.text());
    std::thread::sleep(Duration::from_millis(100));
    let log = lines.text();
    assert!(log.contains("result=stopped-waiting"), "{log}");
    assert_eq!(
        log.matches(WAITING).count(),
        2,
        "the reason, then the summary: {log}"
    );
    assert!(!log.contains("step=unload"), "{log}");
    assert_eq!(h.loaded().as_deref(), Some("2.7.0"));
}
