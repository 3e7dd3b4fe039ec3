//! Giving up with the cause: a busy device, a failed build or a refused load
//! ends the agent with a termination message `<Reason>: <what happened>`
//! (ttdrv_core::reason) within the 4096 bytes the kubelet keeps; other
//! errors write none. The binary runs against a fake API server and a fake
//! `make`; no test here asks the real kernel for anything.

mod common;

use std::fs;
use std::path::{Path, PathBuf};

use ttdrv_agent::error::TERMINATION_MESSAGE_MAX;
use ttdrv_agent::fake::{FakeBuilder, FakeKernel, fake_host, set_loaded};
use ttdrv_agent::node::fake::{FAKE_NODE, FAKE_POLICY, FakeNode, go_ahead_node};
use ttdrv_agent::pod::FakePause;
use ttdrv_agent::{Agent, AgentError, Config, HostRoot};
use ttdrv_core::reason;

use common::host::{POD_UID, add_busy_holders, assert_matches};

const KVER: &str = "6.1.0-99-amd64";

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_ttdrv-agent"))
}

struct Host {
    dir: tempfile::TempDir,
    scratch: tempfile::TempDir,
}

impl Host {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        fake_host(dir.path(), KVER).expect("fake host");
        Host {
            dir,
            scratch: tempfile::tempdir().expect("tempdir"),
        }
    }
    fn root(&self) -> &Path {
        self.dir.path()
    }
    fn termination_log(&self) -> PathBuf {
        self.scratch.path().join("termination-log")
    }
    fn message(&self) -> String {
        fs::read_to_string(self.termination_log()).expect("termination message written")
    }
    fn agent(&self, api: Option<&common::FakeApi>) -> std::process::Command {
        let mut c = common::agent_command(bin(), api, self.scratch.path());
        c.arg("--host-root")
            .arg(self.root())
            .args(["run", "--once", "--kbuild-link-dir"])
            .arg(self.scratch.path().join("kbuild"))
            .arg("--tt-smi-path")
            .arg(self.scratch.path().join("no-tt-smi"));
        c
    }
}

#[test]
fn a_busy_device_writes_device_busy_with_the_holders() {
    let h = Host::new();
    set_loaded(h.root(), "2.7.0", 0).expect("loaded");
    add_busy_holders(h.root());
    // The controller gave the go-ahead (drained), yet the device is held.
    let api = common::FakeApi::start(&go_ahead_node(FAKE_POLICY, "2.8.0"));
    api.add_pod(POD_UID, "ml", "train-0");
    let out = h
        .agent(Some(&api))
        .env("NODE_NAME", FAKE_NODE)
        .env("TTDRV_POLICY", FAKE_POLICY)
        .args(["--version", "2.8.0"])
        .output()
        .expect("run ttdrv-agent");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{log}");
    let msg = h.message();
    assert!(msg.starts_with("DeviceBusy: "), "{msg}");
    for needle in [
        "pid 4242 (python3) in pod ml/train-0",
        "pid 4343 (tt-smi)",
        "refcnt 2",
        "forceUnload",
    ] {
        assert!(msg.contains(needle), "lacks {needle:?}: {msg}");
    }
    assert!(msg.len() <= TERMINATION_MESSAGE_MAX);
    assert_eq!(
        reason::from_termination_message(&msg).map(|(r, _)| r),
        Some(reason::DEVICE_BUSY),
        "the controller reads the reason back"
    );
    assert_eq!(
        HostRoot::new(h.root())
            .loaded_version()
            .expect("sysfs")
            .as_deref(),
        Some("2.7.0")
    );
}

#[test]
fn a_failed_build_writes_build_failed_with_the_tail_of_its_log() {
    let h = Host::new();
    let repo = tempfile::tempdir().expect("tempdir");
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/stub-module/make-repo.sh");
    let st = std::process::Command::new("bash")
        .arg(&script)
        .arg(repo.path())
        .status()
        .expect("make-repo.sh (needs bash and git: run hack/agent-deps.sh)");
    assert!(st.success(), "make-repo.sh failed");
    // A `make` that fails after a long log: 60 lines of about 270 bytes.
    let fakebin = h.scratch.path().join("bin");
    fs::create_dir_all(&fakebin).expect("mkdir");
    let mut build_log = String::new();
    for i in 1..=60 {
        build_log.push_str(&format!("line {i:03}: {}\n", "x".repeat(260)));
    }
    build_log.push_str("tenstorrent.c:42:1: error: LAST LINE of the build log\n");
    fs::write(h.scratch.path().join("build.log"), &build_log).expect("log");
    let make = fakebin.join("make");
    fs::write(
        &make,
        format!(
            "#!/bin/sh\ncat '{}' >&2\nexit 2\n",
            h.scratch.path().join("build.log").display()
        ),
    )
    .expect("make");
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&make, fs::Permissions::from_mode(0o755)).expect("chmod");
    let path = format!(
        "{}:{}",
        fakebin.display(),
        std::env::var("PATH").unwrap_or_default()
    );

    // Nothing loaded: a first install, no Node and no go-ahead needed.
    let out = h
        .agent(None)
        .env("PATH", path)
        .args(["--version", "2.8.0", "--source-repository"])
        .arg(repo.path())
        .output()
        .expect("run ttdrv-agent");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{log}");
    let msg = h.message();
    assert!(
        msg.starts_with("BuildFailed: building tenstorrent 2.8.0 against "),
        "{msg}"
    );
    assert!(msg.len() <= TERMINATION_MESSAGE_MAX, "{} bytes", msg.len());
    assert!(
        msg.ends_with("tenstorrent.c:42:1: error: LAST LINE of the build log"),
        "the end of the build log is kept: {msg}"
    );
    assert!(msg.contains("line 060: xxx"), "{msg}");
    assert!(msg.contains("bytes cut"), "the middle is cut: {msg}");
    assert!(!msg.contains("line 001"), "{msg}");
}

#[test]
fn other_errors_write_no_termination_message() {
    let h = Host::new();
    let out = h
        .agent(None)
        .args(["--version", "../2.8.0"])
        .output()
        .expect("run ttdrv-agent");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("invalid target version"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!h.termination_log().exists(), "{}", h.message());
}

#[test]
fn a_refused_load_gives_load_failed_with_the_kernels_error() {
    let h = common::host::TestHost::with_loaded("2.7.0", 0);
    for v in ["2.7.0", "2.8.0"] {
        h.cache_module(v, v);
    }
    let kernel = FakeKernel::new(h.root()).failing("2.8.0");
    let config = Config {
        status_file: None,
        validation_timeout: std::time::Duration::from_millis(200),
        on_validation_failure: Default::default(),
        ..h.config("2.8.0")
    };
    let err = Agent {
        config: &config,
        kernel: &kernel,
        killer: &kernel,
        builder: &FakeBuilder::default(),
        node: &FakeNode::with(go_ahead_node(FAKE_POLICY, "2.8.0")),
        pause: &FakePause::stopping_after(1),
    }
    .run()
    .expect_err("load refused");
    assert_matches!(err, AgentError::LoadFailed { .. });
    let msg = err.termination_message().expect("a reason");
    assert!(
        msg.starts_with("LoadFailed: loading tenstorrent 2.8.0"),
        "{msg}"
    );
    assert!(
        msg.contains("Exec format error"),
        "the kernel's error: {msg}"
    );
    assert!(msg.contains("rolled back"), "{msg}");
}
