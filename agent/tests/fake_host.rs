//! The agent's run sequence on a fake host root, one test per branch.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ttdrv_agent::build::GitMakeBuilder;
use ttdrv_agent::fake::{FAKE_BOOT_ID, FakeBuilder, FakeKernel, add_holder, set_loaded};
use ttdrv_agent::node::fake::FakeNode;
use ttdrv_agent::{AgentError, ModuleSource, Outcome, Rollback};
use ttdrv_api::labels;

use common::host::{
    KVER, POD_UID, TT_SMI, TT_SMI_VERSION, TestHost as Host, add_busy_holders, assert_failure,
    assert_installed_over_nothing, assert_matches, assert_untouched, go_ahead, run,
};

/// The node's labels after every patch of the run.
fn labels_of(node: &FakeNode) -> BTreeMap<String, Option<String>> {
    node.labels()
}

fn label(v: &str) -> Option<String> {
    Some(v.to_string())
}

/// Every file, directory and symlink under `dir` with its content, mode and
/// link target, for byte-for-byte comparison.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (u32, Vec<u8>)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).expect("read_dir") {
            let e = e.expect("entry");
            let path = e.path();
            let meta = fs::symlink_metadata(&path).expect("metadata");
            let rel = path.strip_prefix(dir).expect("prefix").to_path_buf();
            let content = if meta.file_type().is_symlink() {
                fs::read_link(&path)
                    .expect("link")
                    .into_os_string()
                    .into_encoded_bytes()
            } else if meta.is_dir() {
                stack.push(path.clone());
                Vec::new()
            } else {
                fs::read(&path).expect("read")
            };
            out.insert(rel, (meta.permissions().mode(), content));
        }
    }
    out
}

#[test]
fn host_mode_labels_and_leaves_the_host_byte_for_byte_unchanged() {
    for signal in ["dkms-dir", "dkms-conf"] {
        let h = Host::new();
        match signal {
            "dkms-dir" => {
                fs::create_dir_all(h.p("/var/lib/dkms/tenstorrent/2.7.0")).expect("mkdir")
            }
            _ => {
                fs::create_dir_all(h.p("/usr/src/tenstorrent-2.7.0")).expect("mkdir");
                fs::write(
                    h.p("/usr/src/tenstorrent-2.7.0/dkms.conf"),
                    "PACKAGE_NAME=tenstorrent\n",
                )
                .expect("write");
            }
        }
        set_loaded(h.root(), "2.7.0", 1).expect("loaded");
        add_holder(h.root(), 77, "python3", "0::/\n").expect("holder");
        let before = snapshot(h.root());

        let kernel = FakeKernel::new(h.root());
        let builder = FakeBuilder::default();
        let node = FakeNode::default();
        let mut config = h.config("2.8.0");
        config.force_unload = true;
        let outcome = run(&config, &kernel, &builder, &node).expect("host mode succeeds");

        assert_matches!(&outcome, Outcome::HostManaged { loaded: Some(v), .. } if v == "2.7.0");
        assert_eq!(snapshot(h.root()), before, "{signal}: host tree changed");
        assert!(kernel.loads().is_empty() && kernel.unloads() == 0 && kernel.killed().is_empty());
        assert!(builder.builds().is_empty());
        assert_eq!(node.calls().len(), 1, "one report: {:?}", node.calls());
        let l = labels_of(&node);
        assert_eq!(l.get(labels::INSTALL_MODE), Some(&label("host")));
        assert_eq!(l.get(labels::KMD_VERSION), Some(&label("2.7.0")));
        assert_eq!(l.get(labels::KMD_BOOT_ID), Some(&label(FAKE_BOOT_ID)));
        assert!(!l.contains_key(labels::TT_SMI_VERSION));
    }
}

#[test]
fn matching_version_only_installs_tt_smi_and_labels() {
    let h = Host::with_loaded("2.8.0", 3);
    let kernel = FakeKernel::new(h.root());
    let builder = FakeBuilder::default();
    let node = FakeNode::default();
    let outcome = run(&h.config("2.8.0"), &kernel, &builder, &node).expect("match");
    assert_eq!(
        outcome,
        Outcome::AlreadyCurrent {
            version: "2.8.0".into()
        }
    );
    assert!(kernel.loads().is_empty() && kernel.unloads() == 0);
    assert!(builder.builds().is_empty());
    let smi = h.p("/usr/local/bin/tt-smi");
    assert_eq!(fs::read(&smi).expect("tt-smi"), TT_SMI);
    assert_eq!(
        fs::metadata(&smi).expect("meta").permissions().mode() & 0o777,
        0o755
    );
    let l = labels_of(&node);
    assert_eq!(l.get(labels::INSTALL_MODE), Some(&label("container")));
    assert_eq!(l.get(labels::KMD_VERSION), Some(&label("2.8.0")));
    assert_eq!(l.get(labels::KMD_BOOT_ID), Some(&label(FAKE_BOOT_ID)));
    assert_eq!(l.get(labels::TT_SMI_VERSION), Some(&label(TT_SMI_VERSION)));
}

#[test]
fn suffixed_version_does_not_match() {
    let h = Host::with_loaded("2.8.0-rc1", 0);
    h.cache_module("2.8.0", "2.8.0");
    let kernel = FakeKernel::new(h.root());
    let outcome = h
        .run_with("2.8.0", &kernel, &go_ahead("2.8.0"))
        .expect("upgrade");
    assert!(
        matches!(outcome, Outcome::Installed { ref previous, .. } if previous.as_deref() == Some("2.8.0-rc1"))
    );
    assert_eq!(h.loaded().as_deref(), Some("2.8.0"));
}

#[test]
fn mismatch_with_refcnt_zero_unloads_and_loads_from_cache() {
    let h = Host::with_loaded("2.7.0", 0);
    h.cache_module("2.8.0", "2.8.0");
    let kernel = FakeKernel::new(h.root());
    let builder = FakeBuilder::default();
    let node = go_ahead("2.8.0");
    let outcome = run(&h.config("2.8.0"), &kernel, &builder, &node).expect("upgrade");
    assert_eq!(
        outcome,
        Outcome::Installed {
            version: "2.8.0".into(),
            previous: Some("2.7.0".into()),
            source: ModuleSource::Cache,
            killed: vec![],
        }
    );
    assert_eq!(kernel.unloads(), 1);
    assert_eq!(kernel.loads(), vec!["2.8.0".to_string()]);
    assert!(builder.builds().is_empty(), "cache hit must not build");
    assert_eq!(h.loaded().as_deref(), Some("2.8.0"));
    assert_eq!(
        labels_of(&node).get(labels::KMD_VERSION),
        Some(&label("2.8.0"))
    );
}

#[test]
fn fresh_node_without_module_loads_target() {
    let h = Host::new();
    let kernel = FakeKernel::new(h.root());
    let builder = FakeBuilder::default();
    let outcome =
        run(&h.config("2.7.0"), &kernel, &builder, &FakeNode::default()).expect("install");
    assert_installed_over_nothing(&h, &kernel, &outcome, ModuleSource::Build, "2.7.0", 0);
}

#[test]
fn busy_device_without_force_fails_listing_holders_and_touches_nothing() {
    let h = Host::with_loaded("2.7.0", 0);
    add_busy_holders(h.root());
    h.cache_module("2.8.0", "2.8.0");
    let kernel = FakeKernel::new(h.root());
    let builder = FakeBuilder::default();
    let node = FakeNode {
        pods: HashMap::from([(POD_UID.to_string(), "ml/train-0".to_string())]),
        ..go_ahead("2.8.0")
    };
    let err = run(&h.config("2.8.0"), &kernel, &builder, &node).expect_err("busy");
    let msg = err.to_string();
    assert_matches!(&err, AgentError::Busy { refcnt: 2, holders, .. } if holders.len() == 2);
    for needle in [
        "pid 4242 (python3) in pod ml/train-0",
        "container 0123456789ab",
        "pid 4343 (tt-smi)",
        "refcnt 2",
        "forceUnload",
    ] {
        assert!(msg.contains(needle), "message lacks {needle:?}: {msg}");
    }
    assert_eq!(h.loaded().as_deref(), Some("2.7.0"));
    assert_eq!(kernel.unloads(), 0);
    assert!(kernel.loads().is_empty() && kernel.killed().is_empty());
    assert!(builder.builds().is_empty());
    assert_eq!(
        node.calls().len(),
        1,
        "only the report of what the host runs: {:?}",
        node.calls()
    );
    assert_eq!(
        labels_of(&node).get(labels::KMD_VERSION),
        Some(&label("2.7.0"))
    );
}

#[test]
fn force_unload_kills_holders_then_upgrades() {
    let h = Host::with_loaded("2.7.0", 0);
    add_holder(h.root(), 4242, "python3", "0::/\n").expect("holder");
    add_holder(h.root(), 4343, "tt-smi", "0::/\n").expect("holder");
    let kernel = FakeKernel::new(h.root());
    let builder = FakeBuilder::default();
    let mut config = h.config("2.8.0");
    config.force_unload = true;
    let outcome = run(&config, &kernel, &builder, &go_ahead("2.8.0")).expect("forced upgrade");
    let Outcome::Installed {
        killed, previous, ..
    } = outcome
    else {
        panic!("expected Installed, got {outcome:?}");
    };
    assert_eq!(
        killed.iter().map(|h| h.pid).collect::<Vec<_>>(),
        vec![4242, 4343]
    );
    assert_eq!(previous.as_deref(), Some("2.7.0"));
    assert_eq!(kernel.killed(), vec![4242, 4343]);
    assert!(!h.p("/proc/4242").exists());
    assert_eq!(h.loaded().as_deref(), Some("2.8.0"));
}

#[test]
fn force_unload_gives_up_after_the_timeout() {
    let h = Host::with_loaded("2.7.0", 0);
    add_holder(h.root(), 4242, "stubborn", "0::/\n").expect("holder");
    let mut kernel = FakeKernel::new(h.root());
    kernel.unkillable = true;
    let mut config = h.config("2.8.0");
    config.force_unload = true;
    config.unload_timeout = Duration::from_millis(300);
    let err = run(
        &config,
        &kernel,
        &FakeBuilder::default(),
        &go_ahead("2.8.0"),
    )
    .expect_err("timeout");
    assert_matches!(err, AgentError::UnloadTimeout { refcnt: 1, .. });
    assert!(err.to_string().contains("pid 4242 (stubborn)"), "{err}");
    assert_eq!(h.loaded().as_deref(), Some("2.7.0"));
}

#[test]
fn cache_miss_builds_and_stores_atomically() {
    let h = Host::with_loaded("2.7.0", 0);
    let kernel = FakeKernel::new(h.root());
    let builder = FakeBuilder::default();
    let outcome = run(&h.config("2.8.0"), &kernel, &builder, &go_ahead("2.8.0")).expect("build");
    assert_matches!(
        outcome,
        Outcome::Installed {
            source: ModuleSource::Build,
            ..
        }
    );
    assert_eq!(builder.builds(), vec!["2.8.0".to_string()]);
    let dir = h.p(&format!("/var/cache/tt-kmd/{KVER}/2.8.0"));
    let names: Vec<String> = fs::read_dir(&dir)
        .expect("cache dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    let mut names = names;
    names.sort();
    assert_eq!(
        names,
        vec![
            "tenstorrent.ko".to_string(),
            "tenstorrent.ko.json".to_string()
        ],
        "the module and its record, no temporary files left"
    );
    assert_eq!(
        ttdrv_agent::modinfo::module_version(&dir.join("tenstorrent.ko"))
            .expect("modinfo")
            .as_deref(),
        Some("2.8.0")
    );
    // A second node-level run of the same version (after a reboot) hits the cache.
    fs::remove_dir_all(h.p("/sys/module/tenstorrent")).expect("simulate reboot");
    let builder2 = FakeBuilder::default();
    let again = run(&h.config("2.8.0"), &kernel, &builder2, &FakeNode::default()).expect("cached");
    assert_matches!(
        again,
        Outcome::Installed {
            source: ModuleSource::Cache,
            ..
        }
    );
    assert!(builder2.builds().is_empty());
}

#[test]
fn cached_module_of_wrong_version_is_discarded_and_rebuilt() {
    let h = Host::new();
    h.cache_module("2.8.0", "2.7.0");
    let kernel = FakeKernel::new(h.root());
    let builder = FakeBuilder::default();
    let outcome =
        run(&h.config("2.8.0"), &kernel, &builder, &FakeNode::default()).expect("rebuild");
    assert_matches!(
        outcome,
        Outcome::Installed {
            source: ModuleSource::Build,
            ..
        }
    );
    assert_eq!(builder.builds(), vec!["2.8.0".to_string()]);
    assert_eq!(h.loaded().as_deref(), Some("2.8.0"));
}

#[test]
fn build_of_wrong_version_is_refused() {
    let h = Host::new();
    let kernel = FakeKernel::new(h.root());
    let builder = FakeBuilder {
        wrong_version: Some("2.7.0".into()),
        ..FakeBuilder::default()
    };
    let err =
        run(&h.config("2.8.0"), &kernel, &builder, &FakeNode::default()).expect_err("wrong build");
    assert_matches!(err, AgentError::BuiltWrongVersion { .. });
    assert!(
        !h.p(&format!("/var/cache/tt-kmd/{KVER}/2.8.0/tenstorrent.ko"))
            .exists()
    );
    assert!(kernel.loads().is_empty());
}

#[test]
fn readback_mismatch_fails() {
    let h = Host::new();
    h.cache_module("2.8.0", "2.8.0");
    let mut kernel = FakeKernel::new(h.root());
    kernel.report_version = Some("2.8.1".into());
    let node = FakeNode::default();
    let err = h.run_with("2.8.0", &kernel, &node).expect_err("mismatch");
    assert_matches!(&err, AgentError::ReadbackMismatch { expected, found: Some(f) } if expected == "2.8.0" && f == "2.8.1");
    assert!(err.to_string().contains("2.8.1"));
    assert_eq!(
        labels_of(&node).get(labels::KMD_VERSION),
        Some(&None),
        "the target is not claimed; nothing was loaded at the start"
    );
}

#[test]
fn failed_load_rolls_back_to_the_cached_previous_version() {
    let h = Host::with_loaded("2.7.0", 0);
    h.cache_module("2.7.0", "2.7.0");
    h.cache_module("2.8.0", "2.8.0");
    let kernel = FakeKernel::new(h.root()).failing("2.8.0");
    let err = h
        .run_with("2.8.0", &kernel, &go_ahead("2.8.0"))
        .expect_err("load fails");
    assert_matches!(&err, AgentError::LoadFailed { rollback, .. } if matches!(rollback.as_ref(), Rollback::Restored { previous } if previous == "2.7.0"));
    let msg = err.to_string();
    assert!(
        msg.contains("loading tenstorrent 2.8.0")
            && msg.contains("rolled back")
            && msg.contains("2.7.0"),
        "{msg}"
    );
    // The refused cached module is evicted and rebuilt once, then the
    // previous version goes back.
    assert_eq!(
        kernel.loads(),
        vec![
            "2.8.0".to_string(),
            "2.8.0".to_string(),
            "2.7.0".to_string()
        ]
    );
    assert_eq!(h.loaded().as_deref(), Some("2.7.0"));
}

#[test]
fn failed_load_without_cached_previous_says_so() {
    let h = Host::with_loaded("2.7.0", 0);
    h.cache_module("2.8.0", "2.8.0");
    let kernel = FakeKernel::new(h.root()).failing("2.8.0");
    let err = h
        .run_with("2.8.0", &kernel, &go_ahead("2.8.0"))
        .expect_err("load fails");
    assert_matches!(&err, AgentError::LoadFailed { rollback, .. } if matches!(rollback.as_ref(), Rollback::NotCached { .. }));
    assert!(
        err.to_string().contains("could not roll back to 2.7.0"),
        "{err}"
    );
    assert!(
        err.to_string().contains("no tenstorrent module loaded now"),
        "{err}"
    );
    assert_eq!(h.loaded(), None);
}

#[test]
fn missing_headers_name_the_directory_and_package() {
    let h = Host::with_loaded("2.7.0", 0);
    fs::remove_dir_all(h.p(&format!("/lib/modules/{KVER}"))).expect("rm headers");
    let kernel = FakeKernel::new(h.root());
    let err = h
        .run_with("2.8.0", &kernel, &FakeNode::default())
        .expect_err("no headers");
    let msg = err.to_string();
    assert_matches!(err, AgentError::HeadersMissing { .. });
    assert!(msg.contains(&format!("lib/modules/{KVER}/build")), "{msg}");
    assert!(msg.contains(&format!("linux-headers-{KVER}")), "{msg}");
    assert_eq!(h.loaded().as_deref(), Some("2.7.0"), "old module kept");
    assert_eq!(kernel.unloads(), 0);
}

fn fixture_repo(dest: &Path) {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/stub-module/make-repo.sh");
    let status = std::process::Command::new("bash")
        .arg(&script)
        .arg(dest)
        .status()
        .expect("run make-repo.sh (needs bash and git: run hack/agent-deps.sh)");
    assert!(status.success(), "make-repo.sh failed");
}

#[test]
fn missing_tag_names_tag_and_repository() {
    let h = Host::new();
    let repo = tempfile::tempdir().expect("tempdir");
    fixture_repo(repo.path());
    let repo_url = repo.path().display().to_string();
    let builder = GitMakeBuilder::new(&repo_url);
    let kernel = FakeKernel::new(h.root());
    let err = run(&h.config("9.9.9"), &kernel, &builder, &FakeNode::default()).expect_err("no tag");
    assert_matches!(&err, AgentError::MissingTag { tag, repo } if tag == "ttkmd-9.9.9" && *repo == repo_url);
    let msg = err.to_string();
    assert!(
        msg.contains("ttkmd-9.9.9") && msg.contains(&repo_url),
        "{msg}"
    );
}

#[test]
fn unwritable_cache_fails_before_unloading() {
    let h = Host::with_loaded("2.7.0", 0);
    // A file where the cache directory should be: not writable even for root.
    fs::create_dir_all(h.p("/var/cache")).expect("mkdir");
    fs::write(h.p("/var/cache/tt-kmd"), b"not a directory").expect("write");
    let kernel = FakeKernel::new(h.root());
    let err = h
        .run_with("2.8.0", &kernel, &FakeNode::default())
        .expect_err("cache");
    assert_matches!(err, AgentError::CacheWrite { .. } | AgentError::HostFs(_));
    assert!(err.to_string().contains("var/cache/tt-kmd"), "{err}");
    assert_eq!(h.loaded().as_deref(), Some("2.7.0"));
    assert_eq!(kernel.unloads(), 0);
}

#[test]
fn missing_tt_smi_is_skipped_without_label() {
    let h = Host::with_loaded("2.8.0", 0);
    let mut config = h.config("2.8.0");
    config.tt_smi_path = h.pod().join("absent");
    let node = FakeNode::default();
    h.run_config(&config, &node).expect("ok");
    assert!(!h.p("/usr/local/bin/tt-smi").exists());
    let l = labels_of(&node);
    assert!(!l.contains_key(labels::TT_SMI_VERSION));
    assert_eq!(l.get(labels::KMD_VERSION), Some(&label("2.8.0")));
}

#[test]
fn label_failure_is_an_error() {
    let h = Host::with_loaded("2.8.0", 0);
    let node = FakeNode {
        fail: true,
        ..FakeNode::default()
    };
    let err = run(
        &h.config("2.8.0"),
        &FakeKernel::new(h.root()),
        &FakeBuilder::default(),
        &node,
    )
    .expect_err("label");
    assert_matches!(err, AgentError::Label { .. });
}

#[test]
fn invalid_target_version_is_rejected() {
    let h = Host::new();
    let err = run(
        &h.config("../2.8.0"),
        &FakeKernel::new(h.root()),
        &FakeBuilder::default(),
        &FakeNode::default(),
    )
    .expect_err("invalid");
    assert_matches!(err, AgentError::InvalidVersion(_));
}

fn agent_bin(h: &Host, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_ttdrv-agent"))
        .env_remove("TT_KMD_VERSION")
        .env_remove("NODE_NAME")
        .env("TTDRV_STATUS_FILE", h.pod().join("waiting"))
        .env("TTDRV_TERMINATION_LOG", h.pod().join("termination-log"))
        .arg("--host-root")
        .arg(h.root())
        .args(args)
        .output()
        .expect("run ttdrv-agent")
}

#[test]
fn ready_requires_exact_version() {
    let h = Host::new();
    let ready = || {
        agent_bin(&h, &["ready", "--version", "2.8.0"])
            .status
            .success()
    };
    assert!(!ready(), "nothing loaded");
    set_loaded(h.root(), "2.8.0-rc1", 0).expect("loaded");
    assert!(!ready(), "suffix");
    set_loaded(h.root(), "2.8.0", 0).expect("loaded");
    assert!(ready());
    assert!(
        !agent_bin(&h, &["ready", "--version", "2.7.0"])
            .status
            .success()
    );
}

#[test]
fn status_reports_what_it_sees() {
    let h = Host::with_loaded("2.7.0", 0);
    add_holder(h.root(), 4242, "python3", "0::/\n").expect("holder");
    h.cache_module("2.7.0", "2.7.0");
    h.cache_module("2.8.0", "2.8.0");
    let out = agent_bin(&h, &["status", "--version", "2.8.0"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["kernel_release"], KVER);
    assert_eq!(v["install_mode"], "container");
    assert_eq!(v["module"]["version"], "2.7.0");
    assert_eq!(v["module"]["refcnt"], 1);
    assert_eq!(v["ready"], false);
    assert_eq!(v["target_version"], "2.8.0");
    assert_eq!(v["holders"][0]["pid"], 4242);
    assert_eq!(v["holders"][0]["comm"], "python3");
    assert_eq!(v["holders"][0]["devices"][0], "/dev/tenstorrent/0");
    assert_eq!(v["cache"].as_array().map(Vec::len), Some(2));
    assert_eq!(
        v["cache"][1]["path"],
        format!("/var/cache/tt-kmd/{KVER}/2.8.0/tenstorrent.ko")
    );
    assert_eq!(v["cache"][1]["module_version"], "2.8.0");
    assert_eq!(v["tt_smi"]["installed"], false);
}

#[test]
fn run_idles_until_sigterm() {
    use std::io::{BufRead, BufReader};
    let h = Host::with_loaded("2.8.0", 0);
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ttdrv-agent"))
        .env_remove("NODE_NAME")
        .env_remove("TT_FORCE_UNLOAD")
        .env("TTDRV_STATUS_FILE", h.pod().join("waiting"))
        .env("TTDRV_TERMINATION_LOG", h.pod().join("termination-log"))
        .env("RUST_LOG", "info")
        .arg("--host-root")
        .arg(h.root())
        .args(["run", "--version", "2.8.0", "--tt-smi-path"])
        .arg(h.pod().join("tt-smi"))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn ttdrv-agent");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("idling until SIGTERM") {
                let _ = tx.send(());
            }
        }
    });
    if rx.recv_timeout(Duration::from_secs(30)).is_err() {
        let _ = child.kill();
        panic!("agent did not reach the idle state");
    }
    assert!(
        child.try_wait().expect("try_wait").is_none(),
        "agent exited instead of idling"
    );
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            assert!(status.success(), "exit after SIGTERM: {status}");
            break;
        }
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("agent ignored SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(h.p("/usr/local/bin/tt-smi").is_file());
}

#[test]
fn force_unload_env_accepts_booleans_and_empty_means_off() {
    let h = Host::with_loaded("2.7.0", 1);
    fs::remove_dir_all(h.p(&format!("/lib/modules/{KVER}"))).expect("rm headers");
    // Busy means force was off; missing headers means it went on past the check.
    // Run by hand (no NODE_NAME), so the operator is the second key.
    for (value, forced) in [
        ("true", true),
        ("1", true),
        ("false", false),
        ("", false),
        ("0", false),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ttdrv-agent"))
            .env_remove("NODE_NAME")
            .env("TT_FORCE_UNLOAD", value)
            .env("TT_KMD_VERSION", "2.8.0")
            .env("TTDRV_STATUS_FILE", h.pod().join("waiting"))
            .env("TTDRV_TERMINATION_LOG", h.pod().join("termination-log"))
            .arg("--host-root")
            .arg(h.root())
            .args(["run", "--once", "--swap-without-go-ahead"])
            .output()
            .expect("run ttdrv-agent");
        assert!(!out.status.success());
        let log = String::from_utf8_lossy(&out.stderr);
        let busy = log.contains("force-unload is off");
        assert_eq!(busy, !forced, "TT_FORCE_UNLOAD={value:?}: {log}");
        if forced {
            assert!(log.contains("linux-headers-"), "{log}");
        }
    }
}

/// After a container install the devices are usable by every user, as DKMS
/// leaves them: the udev rule is in the host's /etc/udev/rules.d, the existing
/// /dev/tenstorrent/* nodes are 0666, and the pre-5.x /opt/tt venv is gone. A
/// host-managed node is not touched (see the byte-for-byte test above).
#[test]
fn container_install_opens_the_devices_and_removes_the_old_venv() {
    let h = Host::new();
    fs::create_dir_all(h.p("/dev/tenstorrent")).expect("mkdir");
    fs::write(h.p("/dev/tenstorrent/0"), "").expect("device");
    fs::set_permissions(h.p("/dev/tenstorrent/0"), fs::Permissions::from_mode(0o600))
        .expect("chmod");
    fs::create_dir_all(h.p("/opt/tt/bin")).expect("mkdir");
    fs::write(h.p("/opt/tt/pyvenv.cfg"), "home = /usr/bin\n").expect("venv");
    let kernel = FakeKernel::new(h.root());
    let builder = FakeBuilder::default();
    run(&h.config("2.7.0"), &kernel, &builder, &FakeNode::default()).expect("install");
    let rule = fs::read_to_string(h.p(ttdrv_agent::devices::UDEV_RULE_PATH)).expect("rule");
    assert!(
        rule.contains(r#"SUBSYSTEM=="tenstorrent", MODE="0666""#),
        "{rule}"
    );
    assert_eq!(
        fs::metadata(h.p("/dev/tenstorrent/0"))
            .expect("stat")
            .permissions()
            .mode()
            & 0o777,
        0o666
    );
    assert!(!h.p("/opt/tt").exists());
}

/// `--kbuild-link-dir ''` skips the linking (as documented) instead of being
/// refused by the argument parser; timeouts are bounded, not overflowed.
#[test]
fn empty_kbuild_link_dir_skips_and_timeouts_are_bounded() {
    let h = Host::with_loaded("2.8.0", 0);
    let out = agent_bin(
        &h,
        &[
            "run",
            "--once",
            "--version",
            "2.8.0",
            "--kbuild-link-dir",
            "",
            "--tt-smi-path",
            "/nonexistent",
        ],
    );
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert!(log.contains("kbuild_link_dir=(skipped)"), "{log}");

    for (flag, value) in [
        ("--unload-timeout-seconds", "18446744073709551615"),
        ("--go-ahead-poll-ms", "18446744073709551615"),
    ] {
        let out = agent_bin(&h, &["run", "--once", "--version", "2.8.0", flag, value]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag}: {err}");
        assert!(
            err.contains(flag) && !err.contains("panicked"),
            "{flag}: {err}"
        );
    }
}

fn git(repo: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(repo)
        .args([
            "-c",
            "user.name=ttdrv-test",
            "-c",
            "user.email=ttdrv-test@localhost",
            "-c",
            "commit.gpgsign=false",
            "-c",
            "tag.gpgsign=false",
        ])
        .args(args)
        .output()
        .expect("git");
    common::stdout_of(&format!("git {args:?}"), out)
}

/// A real repository whose tag is moved after the pin was taken: the clone
/// is refused naming both commits, before any build; with the tag back where
/// the pin says, the build goes on past the check (to make, which fails on
/// the empty fake headers).
#[test]
fn a_moved_tag_is_refused_against_the_pinned_commit() {
    let h = Host::with_loaded("2.7.0", 0);
    let repo = tempfile::tempdir().expect("tempdir");
    fixture_repo(repo.path());
    let repo_url = repo.path().display().to_string();
    let pinned = git(repo.path(), &["rev-parse", "ttkmd-2.8.0^{commit}"]);

    let builder = GitMakeBuilder::new(&repo_url).pinned(Some(pinned.clone()));
    let kernel = FakeKernel::new(h.root());
    let err = run(&h.config("2.8.0"), &kernel, &builder, &FakeNode::default())
        .expect_err("no headers to build with");
    assert!(
        matches!(err, AgentError::Make { .. }),
        "past the pin: {err:?}"
    );

    // Someone moves the tag to a commit of their own.
    fs::write(repo.path().join("tenstorrent.c"), "/* not tt-kmd */\n").expect("write");
    git(repo.path(), &["commit", "-qam", "moved"]);
    git(repo.path(), &["tag", "-f", "ttkmd-2.8.0"]);
    let moved = git(repo.path(), &["rev-parse", "ttkmd-2.8.0^{commit}"]);
    assert_ne!(moved, pinned);

    let before = snapshot(h.root());
    let err =
        run(&h.config("2.8.0"), &kernel, &builder, &FakeNode::default()).expect_err("moved tag");
    assert_matches!(&err, AgentError::SourceCommitMismatch { expected, found, .. } if *expected == pinned && *found == moved);
    assert_eq!(err.reason(), Some("BuildFailed"));
    let msg = err.to_string();
    assert!(
        msg.contains("ttkmd-2.8.0") && msg.contains(&repo_url) && msg.contains("moved"),
        "{msg}"
    );
    assert_eq!(snapshot(h.root()), before, "nothing written to the host");
    assert!(kernel.loads().is_empty());
    assert_eq!(h.loaded().as_deref(), Some("2.7.0"));
}

#[test]
fn source_commits_must_be_full_object_names() {
    use ttdrv_agent::build::validate_commit;
    let sha1 = "0123456789abcdef0123456789abcdef01234567";
    assert_eq!(validate_commit(sha1).expect("sha1"), sha1);
    assert_eq!(
        validate_commit(&sha1.to_uppercase()).expect("upper"),
        sha1,
        "normalised to lowercase"
    );
    assert!(
        validate_commit(&"a".repeat(64)).is_ok(),
        "sha256 repositories"
    );
    for bad in [
        "",
        "0123456",
        "ttkmd-2.8.0",
        &format!("{sha1}0"),
        &"g".repeat(40),
    ] {
        let err = validate_commit(bad).expect_err(bad);
        assert!(err.to_string().contains("TT_KMD_SOURCE_COMMIT"), "{err}");
    }
}

/// gpg with a home of its own; returns the armored public key of a new
/// signing key and its fingerprint.
fn gpg_key(home: &Path, name: &str) -> (Vec<u8>, String) {
    let gpg = |args: &[&str]| {
        let out = std::process::Command::new("gpg")
            .env("GNUPGHOME", home)
            .args([
                "--batch",
                "--quiet",
                "--pinentry-mode",
                "loopback",
                "--passphrase",
                "",
            ])
            .args(args)
            .output()
            .expect("gpg (install gnupg)");
        assert!(
            out.status.success(),
            "gpg {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    let uid = format!("{name} <{name}@localhost>");
    gpg(&["--quick-gen-key", &uid, "ed25519", "sign", "never"]);
    let listing =
        String::from_utf8_lossy(&gpg(&["--with-colons", "--list-keys", &uid])).into_owned();
    let fpr = listing
        .lines()
        .find_map(|l| l.strip_prefix("fpr:"))
        .and_then(|l| l.split(':').find(|f| f.len() == 40))
        .expect("fingerprint")
        .to_string();
    (gpg(&["--armor", "--export", &fpr]), fpr)
}

/// Signed tags: a tag signed by a configured key builds (to make, which
/// fails on the fake headers), the same tag checked against another key, and
/// an unsigned tag, are refused before any build.
#[test]
fn tags_must_be_signed_by_a_configured_key() {
    let h = Host::new();
    let repo = tempfile::tempdir().expect("tempdir");
    fixture_repo(repo.path());
    let gnupg = tempfile::tempdir().expect("tempdir");
    fs::set_permissions(gnupg.path(), fs::Permissions::from_mode(0o700)).expect("chmod");
    let (release_key, fpr) = gpg_key(gnupg.path(), "release");
    let (other_key, _) = gpg_key(gnupg.path(), "other");
    let keys = tempfile::tempdir().expect("tempdir");
    fs::write(keys.path().join("release.asc"), &release_key).expect("key");
    fs::write(keys.path().join("other.asc"), &other_key).expect("key");
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(repo.path())
        .env("GNUPGHOME", gnupg.path())
        .args([
            "-c",
            "user.name=release",
            "-c",
            "user.email=release@localhost",
        ])
        .args([
            "tag",
            "-f",
            "-s",
            "-u",
            &fpr,
            "-m",
            "tt-kmd 2.8.0",
            "ttkmd-2.8.0",
            "ttkmd-2.8.0",
        ])
        .output()
        .expect("git tag -s");
    common::stdout_of("git tag -s", out);
    let repo_url = repo.path().display().to_string();
    let kernel = FakeKernel::new(h.root());
    let build = |key: &str, version: &str| {
        let builder = GitMakeBuilder::new(&repo_url).signed_by(Some(keys.path().join(key)));
        run(&h.config(version), &kernel, &builder, &FakeNode::default())
    };

    let err = build("release.asc", "2.8.0").expect_err("no headers to build with");
    assert!(
        matches!(err, AgentError::Make { .. }),
        "signature accepted: {err:?}"
    );

    let before = snapshot(h.root());
    let err = build("other.asc", "2.8.0").expect_err("another key");
    assert_matches!(err, AgentError::TagSignature { .. });
    assert_eq!(err.reason(), Some("BuildFailed"));
    assert!(err.to_string().contains("ttkmd-2.8.0"), "{err}");
    let err = build("release.asc", "2.7.0").expect_err("unsigned tag");
    assert_matches!(err, AgentError::TagSignature { .. });
    assert_eq!(snapshot(h.root()), before, "nothing written to the host");
    assert!(kernel.loads().is_empty());
}

/// A cached 2.8.0 whose `.modinfo` says `depends:crc7`, on a merged-/usr
/// host (`/lib` a link to `usr/lib`) whose modules.dep lists crc7 when `listed`.
fn host_with_dependency(listed: bool) -> Host {
    let h = Host::with_loaded("2.7.0", 0);
    let root = h.root();
    // merged /usr: move lib/ to usr/lib and link it
    fs::create_dir_all(root.join("usr")).expect("mkdir usr");
    fs::rename(root.join("lib"), root.join("usr/lib")).expect("move lib");
    std::os::unix::fs::symlink("usr/lib", root.join("lib")).expect("link lib");
    let tree = root.join(format!("usr/lib/modules/{KVER}"));
    fs::create_dir_all(tree.join("kernel/lib")).expect("mkdir tree");
    fs::write(tree.join("kernel/lib/crc7.ko"), b"crc7").expect("crc7.ko");
    let dep = if listed { "kernel/lib/crc7.ko:\n" } else { "" };
    fs::write(tree.join("modules.dep"), dep).expect("modules.dep");
    fs::write(tree.join("modules.builtin"), "kernel/lib/crc16.ko\n").expect("builtin");
    let bytes = ttdrv_agent::modinfo::fake_module_bytes(&[
        "version=2.8.0",
        "depends=crc7,crc16",
        &format!("vermagic={KVER} SMP preempt mod_unload modversions"),
    ]);
    ttdrv_agent::fake::plant_cached_bytes(root, KVER, "2.8.0", &bytes).expect("plant");
    h
}

#[test]
fn a_dependency_is_loaded_from_the_hosts_modules_first() {
    let h = host_with_dependency(true);
    let kernel = FakeKernel::new(h.root());
    let builder = FakeBuilder::default();
    let node = go_ahead("2.8.0");
    run(&h.config("2.8.0"), &kernel, &builder, &node).expect("upgrade");
    // crc16 is built in: only crc7 is loaded, and before tenstorrent.
    assert_eq!(
        kernel.loads(),
        vec!["dependency:crc7".to_string(), "2.8.0".to_string()]
    );
    assert_eq!(h.loaded().as_deref(), Some("2.8.0"));
}

#[test]
fn without_its_dependency_the_module_is_not_loaded_and_the_old_one_stays() {
    let h = host_with_dependency(false);
    let kernel = FakeKernel::new(h.root());
    let builder = FakeBuilder::default();
    let node = go_ahead("2.8.0");
    let err = run(&h.config("2.8.0"), &kernel, &builder, &node).expect_err("no crc7 anywhere");
    assert_matches!(&err, AgentError::DependencyMissing { dependency, .. } if dependency == "crc7");
    let dep = format!("/usr/lib/modules/{KVER}/modules.dep");
    assert_failure(&err, ttdrv_core::reason::LOAD_FAILED, &[&dep]);
    // Found before the swap: nothing unloaded, nothing loaded.
    assert_untouched(&h, &kernel);
}

#[test]
fn a_kernel_module_tree_behind_a_merged_usr_link_is_still_read() {
    let h = host_with_dependency(true);
    let tree = format!("/usr/lib/modules/{KVER}");
    assert_eq!(h.hr().modules_tree(KVER), tree);
    fs::write(
        h.root().join(format!("usr/lib/modules/{KVER}/modules.dep")),
        "updates/dkms/tenstorrent.ko:\n",
    )
    .expect("modules.dep");
    let found = h.hr().modules_tree_install();
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with(&format!("{tree}/updates/dkms/tenstorrent.ko (")),
        "{found:?}"
    );
}

/// A host that enforces module signatures (sig_enforce=Y), 2.7.0 loaded,
/// 2.8.0 cached: signed when `signed`.
fn enforcing_host(signed: bool) -> Host {
    let h = Host::with_loaded("2.7.0", 0);
    let params = h.p("/sys/module/module/parameters");
    fs::create_dir_all(&params).expect("mkdir");
    fs::write(params.join("sig_enforce"), "Y\n").expect("sig_enforce");
    let mut bytes = ttdrv_agent::modinfo::fake_module_bytes(&[
        "version=2.8.0",
        &format!("vermagic={KVER} SMP preempt mod_unload modversions"),
    ]);
    if signed {
        bytes.extend_from_slice(b"PKCS#7 signature stand-in");
        bytes.extend_from_slice(ttdrv_agent::signing::SIGNATURE_MAGIC);
    }
    ttdrv_agent::fake::plant_cached_bytes(h.root(), KVER, "2.8.0", &bytes).expect("plant");
    h
}

#[test]
fn an_unsigned_module_on_an_enforcing_host_fails_before_the_go_ahead() {
    let h = enforcing_host(false);
    let kernel = FakeKernel::new(h.root());
    let builder = FakeBuilder::default();
    // No go-ahead on the node: the refusal comes during build-ahead.
    let node = FakeNode::default();
    let err = run(&h.config("2.8.0"), &kernel, &builder, &node).expect_err("unsigned");
    assert_matches!(err, AgentError::UnsignedModule { .. });
    let parts = ["sig_enforce=Y", "nothing was unloaded"];
    assert_failure(&err, ttdrv_core::reason::LOAD_FAILED, &parts);
    assert_untouched(&h, &kernel);
}

#[test]
fn a_signed_module_on_an_enforcing_host_is_swapped() {
    let h = enforcing_host(true);
    let kernel = FakeKernel::new(h.root());
    let builder = FakeBuilder::default();
    let node = go_ahead("2.8.0");
    run(&h.config("2.8.0"), &kernel, &builder, &node).expect("signed module swapped");
    assert_eq!(kernel.loads(), vec!["2.8.0".to_string()]);
    assert_eq!(h.loaded().as_deref(), Some("2.8.0"));
}

/// The Secret of the signing tests, as the controller names it.
const SIGNING_SECRET: &str = "tt-k8s-driver-manager-system/module-signing";

/// A signing key pair in the agent pod's filesystem (where the Secret is
/// mounted): a PEM key stand-in and a DER-shaped certificate `cert`. Only
/// the agent reads them (for the fingerprint); the fake sign-file does not.
fn signing_pair(h: &Host, name: &str, cert: &[u8]) -> ttdrv_agent::signing::SigningKey {
    let dir = h.pod().join(name);
    fs::create_dir_all(&dir).expect("mkdir");
    fs::write(
        dir.join("tls.key"),
        "-----BEGIN PRIVATE KEY-----\nstand-in\n-----END PRIVATE KEY-----\n",
    )
    .expect("key");
    fs::write(dir.join("tls.crt"), cert).expect("cert");
    ttdrv_agent::signing::SigningKey::new(
        dir.join("tls.key"),
        dir.join("tls.crt"),
        Some(SIGNING_SECRET),
    )
}

/// A DER-shaped certificate stand-in (a SEQUENCE with a long-form length).
fn der_cert(fill: u8) -> Vec<u8> {
    let mut c = vec![0x30, 0x82, 0x00, 0x10];
    c.extend_from_slice(&[fill; 16]);
    c
}

/// The kernel's sign-file in the fake headers: records its arguments and
/// appends a signature stand-in to the module, as the real one does. The
/// headers' configuration names sha512, which the agent must pass.
fn plant_sign_file(h: &Host) -> PathBuf {
    let build = h.p(&format!("/lib/modules/{KVER}/build"));
    fs::create_dir_all(build.join("scripts")).expect("mkdir");
    fs::write(
        build.join(".config"),
        "CONFIG_MODULE_SIG=y\nCONFIG_MODULE_SIG_HASH=\"sha512\"\n",
    )
    .expect(".config");
    let tool = build.join("scripts/sign-file");
    fs::write(
        &tool,
        "#!/bin/sh\necho \"$@\" >> \"$(dirname \"$0\")/sign-file.args\"\nprintf 'PKCS#7 stand-in~Module signature appended~\\n' >> \"$4\"\n",
    )
    .expect("sign-file");
    fs::set_permissions(&tool, fs::Permissions::from_mode(0o755)).expect("chmod");
    build.join("scripts/sign-file.args")
}

/// The agent's configuration for 2.8.0, signing with key pair 1.
fn signed_config(h: &Host) -> ttdrv_agent::Config {
    ttdrv_agent::Config {
        signing: Some(signing_pair(h, "signing", &der_cert(1))),
        ..h.config("2.8.0")
    }
}

/// A host that enforces signatures and has sign-file; [`signed_config`].
fn enforcing_with_key(h: &Host) -> ttdrv_agent::Config {
    enforce_signatures(h);
    plant_sign_file(h);
    signed_config(h)
}

fn enforce_signatures(h: &Host) {
    let params = h.p("/sys/module/module/parameters");
    fs::create_dir_all(&params).expect("mkdir");
    fs::write(params.join("sig_enforce"), "Y\n").expect("sig_enforce");
}

/// The record of the cached 2.8.0.
fn cached_record(h: &Host) -> ttdrv_agent::cache::Record {
    let rec = h.p(&format!(
        "/var/cache/tt-kmd/{KVER}/2.8.0/tenstorrent.ko.json"
    ));
    serde_json::from_slice(&fs::read(rec).expect("record")).expect("record json")
}

#[test]
fn signing_without_its_key_fails_before_the_build_and_the_unload() {
    let h = Host::with_loaded("2.7.0", 0);
    plant_sign_file(&h);
    // The optional Secret volume of a missing Secret: an empty directory.
    let missing = ttdrv_agent::signing::SigningKey::new(
        h.pod().join("signing/tls.key"),
        h.pod().join("signing/tls.crt"),
        Some(SIGNING_SECRET),
    );
    let kernel = FakeKernel::new(h.root());
    let builder = FakeBuilder::default();
    // Even with the go-ahead there: nothing is unloaded.
    let node = go_ahead("2.8.0");
    let config = ttdrv_agent::Config {
        signing: Some(missing),
        ..h.config("2.8.0")
    };
    let err = run(&config, &kernel, &builder, &node).expect_err("no key");
    assert_matches!(err, AgentError::SigningKey { .. });
    assert_failure(
        &err,
        ttdrv_core::reason::BUILD_FAILED,
        &[
            &format!("Secret {SIGNING_SECRET}"),
            "signing/tls.key does not exist",
        ],
    );
    assert!(builder.builds().is_empty(), "built without a key");
    assert!(!h.p("/var/cache/tt-kmd").exists(), "cached");
    assert_untouched(&h, &kernel);

    // A key that is not PEM (sign-file reads no other form) is refused too.
    let pair = signing_pair(&h, "der-key", &der_cert(1));
    fs::write(&pair.key, [0x30, 0x82, 0x01, 0x02]).expect("DER key");
    let config = ttdrv_agent::Config {
        signing: Some(pair),
        ..h.config("2.8.0")
    };
    let msg = run(&config, &kernel, &builder, &node)
        .expect_err("DER key")
        .to_string();
    assert!(msg.contains("is not PEM"), "{msg}");
    assert!(builder.builds().is_empty());
    assert_untouched(&h, &kernel);
}

#[test]
fn signing_without_the_kernels_sign_file_fails_before_the_build_and_the_unload() {
    let h = Host::with_loaded("2.7.0", 0);
    let kernel = FakeKernel::new(h.root());
    let builder = FakeBuilder::default();
    let node = go_ahead("2.8.0");
    let config = signed_config(&h);
    let err = run(&config, &kernel, &builder, &node).expect_err("no sign-file");
    assert_matches!(err, AgentError::SignFileMissing { .. });
    assert_failure(
        &err,
        ttdrv_core::reason::BUILD_FAILED,
        &[&format!("headers for {KVER}"), "scripts/sign-file"],
    );
    assert!(builder.builds().is_empty(), "built without a sign-file");
    assert!(!h.p("/var/cache/tt-kmd").exists(), "cached");
    assert_untouched(&h, &kernel);
}

#[test]
fn the_cache_serves_only_modules_signed_with_the_configured_certificate() {
    let h = Host::new();
    enforce_signatures(&h);
    let args = plant_sign_file(&h);
    let a = signing_pair(&h, "a", &der_cert(0xa));
    let b = signing_pair(&h, "b", &der_cert(0xb));
    let fp = |k: &ttdrv_agent::signing::SigningKey| k.load().expect("pair").fingerprint;
    let builder = FakeBuilder::default();
    let node = FakeNode::default();
    let install = |signing: Option<&ttdrv_agent::signing::SigningKey>| {
        // Nothing loaded each time: a first install, no go-ahead needed.
        let _ = fs::remove_dir_all(h.p("/sys/module/tenstorrent"));
        let kernel = FakeKernel::new(h.root());
        let config = ttdrv_agent::Config {
            signing: signing.cloned(),
            ..h.config("2.8.0")
        };
        run(&config, &kernel, &builder, &node)
    };
    // Installs signing with `key`: the module comes from `from`, after
    // `builds` builds in all.
    let installs = |key, from: ModuleSource, builds: usize| {
        let outcome = install(key).expect("installed");
        assert_matches!(&outcome, Outcome::Installed { source, .. } if *source == from);
        assert_eq!(builder.builds().len(), builds);
    };

    // Signed with A, loaded where signatures are enforced.
    installs(Some(&a), ModuleSource::Build, 1);
    let ko = h.p(&format!("/var/cache/tt-kmd/{KVER}/2.8.0/tenstorrent.ko"));
    let built = format!("sha512 {} {} ", a.key.display(), a.cert.display());
    let calls = fs::read_to_string(&args).expect("sign-file ran");
    assert!(
        calls.starts_with(&built) && calls.trim_end().ends_with("/tenstorrent.ko"),
        "the headers' hash, key, certificate, the built module: {calls}"
    );
    assert!(
        fs::read(&ko)
            .expect("cached")
            .ends_with(ttdrv_agent::signing::SIGNATURE_MAGIC)
    );
    assert_eq!(cached_record(&h).signer, Some(fp(&a)));
    // `status` says the same of the entry, for the certificate it is given.
    let entry = |cert: Option<&Path>| {
        let s = ttdrv_agent::status::collect(&h.hr(), Some("2.8.0"), None, cert);
        assert!(s.errors.is_empty(), "{:?}", s.errors);
        let e = s.cache.into_iter().next().expect("one cache entry");
        (e.signer, e.verified, e.problem.unwrap_or_default())
    };
    assert_eq!(entry(Some(&a.cert)), (Some(fp(&a)), true, String::new()));
    let (_, verified, problem) = entry(Some(&b.cert));
    assert!(
        !verified && problem.contains("not the configured certificate"),
        "{problem}"
    );
    let (_, verified, problem) = entry(None);
    assert!(
        !verified && problem.contains("signing is not configured"),
        "{problem}"
    );

    installs(Some(&a), ModuleSource::Cache, 1);

    // Another certificate: the module signed with A is not loaded, but
    // rebuilt and signed with B.
    installs(Some(&b), ModuleSource::Build, 2);
    assert_eq!(cached_record(&h).signer, Some(fp(&b)));

    // Signing off: built unsigned (nothing appended), which this host refuses.
    let err = install(None).expect_err("unsigned on an enforcing host");
    assert!(matches!(err, AgentError::UnsignedModule { .. }), "{err}");
    assert_eq!(builder.builds().len(), 3);
    assert_eq!(cached_record(&h).signer, None);
    assert!(
        !fs::read(&ko)
            .expect("cached")
            .ends_with(ttdrv_agent::signing::SIGNATURE_MAGIC),
        "signed without signing configured"
    );
    assert_eq!(fs::read_to_string(&args).expect("args").lines().count(), 2);

    // Signing on again: the unsigned module is not served.
    installs(Some(&a), ModuleSource::Build, 4);
    assert_eq!(cached_record(&h).signer, Some(fp(&a)));
}

#[test]
fn a_key_the_host_does_not_trust_is_named_and_not_rebuilt_for() {
    let h = Host::new();
    let config = enforcing_with_key(&h);
    let builder = FakeBuilder::default();
    let node = FakeNode::default();
    run(&config, &FakeKernel::new(h.root()), &builder, &node).expect("installed");
    fs::remove_dir_all(h.p("/sys/module/tenstorrent")).expect("unloaded");

    // A host whose MOK list lacks the certificate: the cached module is
    // refused, and a rebuild (same key) would be too.
    let kernel = FakeKernel::new(h.root()).rejecting_keys();
    let err = run(&config, &kernel, &builder, &node).expect_err("key rejected");
    assert_matches!(err, AgentError::LoadFailed { .. });
    assert_failure(
        &err,
        ttdrv_core::reason::LOAD_FAILED,
        &[
            "Key was rejected by service",
            "not enrolled on this host",
            "mokutil --import",
        ],
    );
    assert_eq!(builder.builds().len(), 1, "rebuilt for a rejected key");
    assert_eq!(kernel.loads(), vec!["2.8.0".to_string()]);
}

#[test]
fn a_key_the_host_does_not_trust_fails_before_the_unload_when_a_module_is_loaded() {
    let h = Host::with_loaded("2.7.0", 0);
    let config = enforcing_with_key(&h);
    let builder = FakeBuilder::default();
    // The go-ahead is there: only the probe keeps the old module loaded.
    let node = go_ahead("2.8.0");
    let kernel = FakeKernel::new(h.root()).rejecting_keys();
    let err = run(&config, &kernel, &builder, &node).expect_err("key not trusted");
    assert_matches!(err, AgentError::KeyNotTrusted { .. });
    assert_failure(
        &err,
        ttdrv_core::reason::LOAD_FAILED,
        &[
            "nothing was unloaded",
            "not enrolled on this host",
            "sig_enforce=Y",
        ],
    );
    assert_eq!(kernel.probes(), 1);
    assert_untouched(&h, &kernel);

    // A kernel that trusts the key: the probe finds the name taken, and the
    // swap goes on.
    let kernel = FakeKernel::new(h.root());
    run(&config, &kernel, &builder, &node).expect("swapped");
    assert_eq!(kernel.probes(), 1);
    assert_eq!(kernel.unloads(), 1);
    assert_eq!(h.loaded().as_deref(), Some("2.8.0"));

    // Not enforced: no probe.
    fs::remove_file(h.p("/sys/module/module/parameters/sig_enforce")).expect("rm");
    set_loaded(h.root(), "2.7.0", 0).expect("loaded");
    let kernel = FakeKernel::new(h.root());
    run(&config, &kernel, &builder, &node).expect("swapped");
    assert_eq!(kernel.probes(), 0);
}

#[test]
fn the_binary_reads_the_signing_env_and_names_a_missing_secret_in_its_termination_message() {
    let h = Host::with_loaded("2.7.0", 0);
    // As the controller renders it, with the Secret missing (the optional
    // volume is an empty directory).
    let mount = h.pod().join("signing");
    fs::create_dir_all(&mount).expect("mkdir");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ttdrv-agent"))
        .env_remove("NODE_NAME")
        .env("TTDRV_STATUS_FILE", h.pod().join("waiting"))
        .env("TTDRV_TERMINATION_LOG", h.pod().join("termination-log"))
        .env(labels::env::SIGNING_KEY, mount.join("tls.key"))
        .env(labels::env::SIGNING_CERT, mount.join("tls.crt"))
        .env(labels::env::SIGNING_SECRET, SIGNING_SECRET)
        .args(["--host-root"])
        .arg(h.root())
        .args(["run", "--once", "--version", "2.8.0"])
        .output()
        .expect("run ttdrv-agent");
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{log}");
    assert!(
        log.contains(&format!("signing=\"Secret {SIGNING_SECRET}\"")),
        "{log}"
    );
    let message = fs::read_to_string(h.pod().join("termination-log")).expect("termination log");
    assert!(
        message.starts_with(&format!(
            "BuildFailed: module signing is configured (Secret {SIGNING_SECRET}) but {}",
            mount.join("tls.key").display()
        )) && message.contains("does not exist"),
        "{message}"
    );
    assert_eq!(h.loaded().as_deref(), Some("2.7.0"));

    // One of the pair alone is a usage error.
    let out = agent_bin(
        &h,
        &[
            "run",
            "--once",
            "--version",
            "2.8.0",
            "--signing-key",
            "/etc/ttdrv/signing/tls.key",
        ],
    );
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{log}");
    assert!(log.contains("set both or neither"), "{log}");
}
