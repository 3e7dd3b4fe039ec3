//! Fault injection into the agent's run on a fake host root: an unwritable
//! cache directory, a disk that fills up while the built module is copied into
//! the cache, missing or malformed sysfs and /proc entries, and cached modules
//! that are wrong (other version, truncated, garbage, leftovers of a crashed
//! copy). Each must end in a clear error or a correct recovery, and the cache's
//! final path must never hold a partial module.
//!
//! The disk-full and read-only cases mount a small tmpfs over the fake host's
//! cache directory. That needs root (CI runs as root); without it the test
//! re-runs itself inside a user and mount namespace (`unshare -rm`), and fails
//! with an explanation when neither is possible.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use ttdrv_agent::build::{BuildRequest, Builder};
use ttdrv_agent::fake::{FakeBuilder, FakeKernel, plant_cached, set_loaded, write_fake_module};
use ttdrv_agent::modinfo::{fake_module_bytes, module_version};
use ttdrv_agent::node::fake::{FAKE_POLICY, FakeNode, go_ahead_node};
use ttdrv_agent::pod::FakePause;
use ttdrv_agent::{Agent, AgentError, Config, ModuleSource, Outcome};

use common::host::{KVER, TestHost as Host, assert_installed_over_nothing, assert_matches};

const IN_NS: &str = "TTDRV_FAULTS_IN_NAMESPACE";

/// What these tests add to the shared fake host: the cache's paths, a run
/// with the go-ahead on the node, and the cache invariant.
trait CacheFaults {
    fn cache_dir(&self) -> PathBuf;
    fn entry(&self, version: &str) -> PathBuf;
    fn run(
        &self,
        target: &str,
        kernel: &FakeKernel,
        builder: &dyn Builder,
    ) -> Result<Outcome, AgentError>;
    fn assert_cache_consistent(&self);
}

impl CacheFaults for Host {
    fn cache_dir(&self) -> PathBuf {
        self.p("/var/cache/tt-kmd")
    }
    fn entry(&self, version: &str) -> PathBuf {
        self.p(&format!(
            "/var/cache/tt-kmd/{KVER}/{version}/tenstorrent.ko"
        ))
    }
    fn run(
        &self,
        target: &str,
        kernel: &FakeKernel,
        builder: &dyn Builder,
    ) -> Result<Outcome, AgentError> {
        let config = Config {
            unload_timeout: Duration::from_secs(1),
            go_ahead_poll: Duration::from_millis(1),
            status_file: None,
            ..self.config(target)
        };
        Agent {
            config: &config,
            kernel,
            killer: kernel,
            builder,
            // The controller's go-ahead for the swap is on the node.
            node: &FakeNode::with(go_ahead_node(FAKE_POLICY, target)),
            pause: &FakePause::stopping_after(3),
        }
        .run()
    }

    /// The cache invariant: every `tenstorrent.ko` under the cache is a whole
    /// module of the version its directory names, and no temporary file is left.
    fn assert_cache_consistent(&self) {
        let mut stack = vec![self.cache_dir()];
        while let Some(d) = stack.pop() {
            let Ok(entries) = fs::read_dir(&d) else {
                continue;
            };
            for e in entries.flatten() {
                let path = e.path();
                let name = e.file_name().to_string_lossy().into_owned();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                assert!(
                    !name.ends_with(".tmp"),
                    "temporary file left in the cache: {}",
                    path.display()
                );
                if name == "tenstorrent.ko" {
                    let dir_version = path
                        .parent()
                        .and_then(|p| p.file_name())
                        .map(|n| n.to_string_lossy().into_owned());
                    let found = module_version(&path).unwrap_or_else(|e| {
                        panic!("partial or unreadable module at {}: {e}", path.display())
                    });
                    assert_eq!(
                        found,
                        dir_version,
                        "cache entry {} has the wrong version",
                        path.display()
                    );
                }
            }
        }
    }
}

/// Builds a (fake) module of `size` bytes: big enough to overflow a tiny disk.
struct BigBuilder {
    size: usize,
}

impl Builder for BigBuilder {
    fn build(&self, req: &BuildRequest<'_>) -> ttdrv_agent::Result<PathBuf> {
        let v = format!("version={}", req.version);
        let pad = format!("x-padding={}", "x".repeat(self.size));
        let m = format!("vermagic={} SMP mod_unload", req.kernel_release);
        let ko = req.workdir.join("tenstorrent.ko");
        fs::write(
            &ko,
            fake_module_bytes(&["license=GPL", &v, "name=tenstorrent", &pad, &m]),
        )
        .expect("write module");
        Ok(ko)
    }
}

// ---------------------------------------------------------------------------
// Mounting a small filesystem over the cache.
// ---------------------------------------------------------------------------

/// A tmpfs mounted at a path; unmounted on drop.
struct Tmpfs {
    at: PathBuf,
}

impl Tmpfs {
    fn mount(at: &Path, options: &str) -> Result<Self, String> {
        fs::create_dir_all(at).map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "tmpfs"])
            .arg(at)
            .output()
            .map_err(|e| format!("running mount: {e}"))?;
        if out.status.success() {
            Ok(Tmpfs {
                at: at.to_path_buf(),
            })
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
        }
    }
    fn remount(&self, options: &str) {
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("remount,{options}"), "tmpfs"])
            .arg(&self.at)
            .status()
            .expect("mount");
        assert!(st.success(), "remount {options} failed");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.at).status();
    }
}

/// Whether this process can mount a tmpfs (root, or inside `unshare -rm`).
fn can_mount() -> bool {
    let dir = tempfile::tempdir().expect("tempdir");
    Tmpfs::mount(&dir.path().join("m"), "size=4k").is_ok()
}

/// Runs `body` where tmpfs can be mounted: here if possible, else by re-running
/// this very test inside a new user and mount namespace.
/// [`with_mounts`] on a host with 2.7.0 loaded whose cache directory is a
/// tmpfs mounted with `options` for the duration of `body`.
fn with_cache_tmpfs(test: &str, options: &str, body: impl FnOnce(&Host, &Tmpfs)) {
    with_mounts(test, || {
        let h = Host::with_loaded("2.7.0", 0);
        let disk = Tmpfs::mount(&h.cache_dir(), options).expect("mount tmpfs");
        body(&h, &disk);
    });
}

fn with_mounts(test: &str, body: impl FnOnce()) {
    if can_mount() {
        body();
        return;
    }
    assert!(
        std::env::var_os(IN_NS).is_none(),
        "cannot mount a tmpfs even inside a user namespace"
    );
    let exe = std::env::current_exe().expect("current exe");
    let out = Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount", "--"])
        .arg(&exe)
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(IN_NS, "1")
        .output();
    match out {
        Ok(o) if o.status.success() => {
            let text = String::from_utf8_lossy(&o.stdout);
            assert!(
                text.contains("1 passed"),
                "re-run in a namespace ran nothing: {text}"
            );
        }
        Ok(o) => panic!(
            "{test} failed inside `unshare -rm`:\n{}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => panic!(
            "{test} needs to mount a tmpfs: run as root, or install util-linux's unshare with user namespaces enabled ({e})"
        ),
    }
}

// ---------------------------------------------------------------------------
// Disk full, read-only and unwritable caches.
// ---------------------------------------------------------------------------

#[test]
fn disk_full_while_caching_leaves_no_partial_module_and_recovers() {
    // 64 KiB of disk for a 200 KiB module: the copy fails part-way (ENOSPC).
    with_cache_tmpfs(
        "disk_full_while_caching_leaves_no_partial_module_and_recovers",
        "size=64k",
        |h, disk| {
            let kernel = FakeKernel::new(h.root());
            let builder = BigBuilder { size: 200 * 1024 };
            let err = h.run("2.8.0", &kernel, &builder).expect_err("disk full");
            assert_matches!(err, AgentError::DiskFull { .. });
            // The node fails with a reason (no crash loop), the cause first.
            assert_eq!(err.reason(), Some(ttdrv_core::reason::BUILD_FAILED));
            let msg = err.to_string();
            assert!(
                msg.starts_with("disk full: ")
                    && msg.contains("No space left on device")
                    && msg.contains("var/cache/tt-kmd"),
                "error names the cause and the path: {msg}"
            );
            assert!(
                !h.entry("2.8.0").exists(),
                "a partial module reached the final path"
            );
            h.assert_cache_consistent();
            // The old driver is untouched: the build happens before any unload.
            assert_eq!(h.loaded().as_deref(), Some("2.7.0"));
            assert_eq!(kernel.unloads(), 0);
            assert!(kernel.loads().is_empty());

            // Space is freed (disk grown): the next run builds, caches and loads.
            disk.remount("size=1m");
            let outcome = h.run("2.8.0", &kernel, &builder).expect("recovers");
            assert_matches!(
                outcome,
                Outcome::Installed {
                    source: ModuleSource::Build,
                    ..
                }
            );
            assert_eq!(h.loaded().as_deref(), Some("2.8.0"));
            h.assert_cache_consistent();
            assert!(fs::metadata(h.entry("2.8.0")).expect("entry").len() > 200 * 1024);
        },
    );
}

#[test]
fn disk_full_with_a_previously_cached_version_keeps_that_entry_whole() {
    with_cache_tmpfs(
        "disk_full_with_a_previously_cached_version_keeps_that_entry_whole",
        "size=64k",
        |h, _| {
            write_fake_module(&h.entry("2.7.0"), "2.7.0").expect("cache 2.7.0");
            let kernel = FakeKernel::new(h.root());
            let err = h
                .run("2.8.0", &kernel, &BigBuilder { size: 100 * 1024 })
                .expect_err("disk full");
            assert_matches!(err, AgentError::DiskFull { .. });
            assert!(!h.entry("2.8.0").exists());
            assert_eq!(
                module_version(&h.entry("2.7.0"))
                    .expect("modinfo")
                    .as_deref(),
                Some("2.7.0")
            );
            h.assert_cache_consistent();
            assert_eq!(h.loaded().as_deref(), Some("2.7.0"));
        },
    );
}

#[test]
fn read_only_cache_fails_clearly_before_unloading() {
    with_cache_tmpfs(
        "read_only_cache_fails_clearly_before_unloading",
        "size=1m,ro",
        |h, _| {
            let kernel = FakeKernel::new(h.root());
            let err = h
                .run("2.8.0", &kernel, &FakeBuilder::default())
                .expect_err("read-only");
            assert_matches!(err, AgentError::CacheWrite { .. });
            let msg = err.to_string();
            assert!(
                msg.contains("Read-only file system") && msg.contains("var/cache/tt-kmd"),
                "{msg}"
            );
            assert_eq!(h.loaded().as_deref(), Some("2.7.0"));
            assert_eq!(kernel.unloads(), 0);
        },
    );
}

#[test]
fn wrong_version_in_a_read_only_cache_is_reported_not_loaded() {
    with_cache_tmpfs(
        "wrong_version_in_a_read_only_cache_is_reported_not_loaded",
        "size=1m",
        |h, disk| {
            write_fake_module(&h.entry("2.8.0"), "2.6.0").expect("bad entry");
            disk.remount("ro");
            let kernel = FakeKernel::new(h.root());
            let builder = FakeBuilder::default();
            let err = h
                .run("2.8.0", &kernel, &builder)
                .expect_err("cannot discard");
            assert_matches!(err, AgentError::CacheWrite { .. });
            assert!(err.to_string().contains("2.8.0/tenstorrent.ko"), "{err}");
            assert!(
                kernel.loads().is_empty(),
                "the wrong module must never be loaded"
            );
            assert!(builder.builds().is_empty());
            assert_eq!(h.loaded().as_deref(), Some("2.7.0"));
        },
    );
}

#[test]
fn cache_path_blocked_by_a_file_is_a_clear_error() {
    let h = Host::with_loaded("2.7.0", 0);
    // A regular file where the kernel-release directory should be.
    fs::create_dir_all(h.cache_dir()).expect("mkdir");
    fs::write(h.p(&format!("/var/cache/tt-kmd/{KVER}")), b"oops").expect("file");
    let kernel = FakeKernel::new(h.root());
    let err = h
        .run("2.8.0", &kernel, &FakeBuilder::default())
        .expect_err("blocked");
    assert_matches!(err, AgentError::CacheWrite { .. });
    assert!(err.to_string().contains(KVER), "{err}");
    assert_eq!(h.loaded().as_deref(), Some("2.7.0"));
    assert_eq!(kernel.unloads(), 0);
}

// ---------------------------------------------------------------------------
// Bad cache contents.
// ---------------------------------------------------------------------------

fn assert_rebuilt(h: &Host, kernel: &FakeKernel, builder: &FakeBuilder, outcome: Outcome) {
    assert_matches!(
        outcome,
        Outcome::Installed {
            source: ModuleSource::Build,
            ..
        }
    );
    assert_eq!(builder.builds(), vec!["2.8.0".to_string()]);
    assert_eq!(kernel.loads(), vec!["2.8.0".to_string()]);
    assert_eq!(h.loaded().as_deref(), Some("2.8.0"));
    h.assert_cache_consistent();
}

#[test]
fn cached_module_of_another_version_is_rebuilt() {
    for found in ["2.7.0", "2.8.0-rc1", "2.8.1", ""] {
        let h = Host::with_loaded("2.7.0", 0);
        write_fake_module(&h.entry("2.8.0"), found).expect("entry");
        let kernel = FakeKernel::new(h.root());
        let builder = FakeBuilder::default();
        let outcome = h.run("2.8.0", &kernel, &builder).expect("rebuild");
        assert_rebuilt(&h, &kernel, &builder, outcome);
    }
}

#[test]
fn truncated_or_garbage_cached_module_is_rebuilt() {
    let whole = fake_module_bytes(&["license=GPL", "version=2.8.0", "name=tenstorrent"]);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("half", whole[..whole.len() / 2].to_vec()),
        ("header only", whole[..64].to_vec()),
        ("garbage", b"not an ELF file at all".to_vec()),
        ("32-bit", {
            let mut b = whole.clone();
            b[4] = 1;
            b
        }),
    ];
    for (what, bytes) in cases {
        let h = Host::with_loaded("2.7.0", 0);
        fs::create_dir_all(h.entry("2.8.0").parent().expect("dir")).expect("mkdir");
        fs::write(h.entry("2.8.0"), &bytes).expect("entry");
        let kernel = FakeKernel::new(h.root());
        let builder = FakeBuilder::default();
        let outcome = h
            .run("2.8.0", &kernel, &builder)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_rebuilt(&h, &kernel, &builder, outcome);
    }
}

#[test]
fn leftover_temporary_file_of_a_crashed_copy_is_ignored() {
    let h = Host::with_loaded("2.7.0", 0);
    let dir = h.entry("2.8.0").parent().expect("dir").to_path_buf();
    fs::create_dir_all(&dir).expect("mkdir");
    // What a copy interrupted by a crash (or power loss) leaves behind.
    let partial = fake_module_bytes(&["version=2.8.0"]);
    fs::write(dir.join(".tenstorrent.ko.AbC123.tmp"), &partial[..40]).expect("tmp");
    let kernel = FakeKernel::new(h.root());
    let builder = FakeBuilder::default();
    let outcome = h.run("2.8.0", &kernel, &builder).expect("build");
    assert_matches!(
        outcome,
        Outcome::Installed {
            source: ModuleSource::Build,
            ..
        }
    );
    assert_eq!(
        module_version(&h.entry("2.8.0"))
            .expect("modinfo")
            .as_deref(),
        Some("2.8.0")
    );
    assert_eq!(h.loaded().as_deref(), Some("2.8.0"));
}

#[test]
fn cache_entry_that_is_a_directory_is_a_clear_error_or_rebuilt() {
    let h = Host::with_loaded("2.7.0", 0);
    fs::create_dir_all(h.entry("2.8.0")).expect("dir where the module should be");
    let kernel = FakeKernel::new(h.root());
    let err = h
        .run("2.8.0", &kernel, &FakeBuilder::default())
        .expect_err("cannot replace a directory");
    assert_matches!(err, AgentError::CacheWrite { .. });
    assert!(err.to_string().contains("tenstorrent.ko"), "{err}");
    assert_eq!(h.loaded().as_deref(), Some("2.7.0"));
    assert_eq!(kernel.unloads(), 0);
}

// ---------------------------------------------------------------------------
// Missing or malformed sysfs and /proc entries.
// ---------------------------------------------------------------------------

#[test]
fn module_directory_without_version_file_is_replaced() {
    let h = Host::new();
    fs::create_dir_all(h.p("/sys/module/tenstorrent")).expect("mkdir");
    fs::write(h.p("/sys/module/tenstorrent/refcnt"), "0\n").expect("refcnt");
    plant_cached(h.root(), KVER, "2.8.0", "2.8.0").expect("cached");
    let kernel = FakeKernel::new(h.root());
    let outcome = h
        .run("2.8.0", &kernel, &FakeBuilder::default())
        .expect("replaced");
    assert_installed_over_nothing(&h, &kernel, &outcome, ModuleSource::Cache, "2.8.0", 1);
}

/// Fail closed: no refcnt (or one that is no number) means the module may be
/// in use, so it is left loaded, as for a busy device.
#[test]
fn module_directory_without_or_with_garbage_refcnt_counts_as_busy() {
    for refcnt in [
        None,
        Some("garbage\n"),
        Some("-1\n"),
        Some("99999999999999999999\n"),
    ] {
        let h = Host::new();
        fs::create_dir_all(h.p("/sys/module/tenstorrent")).expect("mkdir");
        fs::write(h.p("/sys/module/tenstorrent/version"), "2.7.0\n").expect("version");
        if let Some(r) = refcnt {
            fs::write(h.p("/sys/module/tenstorrent/refcnt"), r).expect("refcnt");
        }
        plant_cached(h.root(), KVER, "2.8.0", "2.8.0").expect("cached");
        let kernel = FakeKernel::new(h.root());
        let err = h
            .run("2.8.0", &kernel, &FakeBuilder::default())
            .expect_err("busy");
        assert!(
            matches!(err, AgentError::Busy { .. }),
            "{refcnt:?}: {err:?}"
        );
        assert_eq!(err.reason(), Some("DeviceBusy"));
        assert_eq!(kernel.unloads(), 0, "{refcnt:?}");
        assert!(kernel.loads().is_empty(), "{refcnt:?}");
        assert_eq!(h.loaded().as_deref(), Some("2.7.0"));
    }
}

#[test]
fn unreadable_sysfs_version_is_a_clear_error() {
    let h = Host::new();
    // A directory where the version file should be: reading it fails (EISDIR).
    fs::create_dir_all(h.p("/sys/module/tenstorrent/version")).expect("mkdir");
    let kernel = FakeKernel::new(h.root());
    let err = h
        .run("2.8.0", &kernel, &FakeBuilder::default())
        .expect_err("unreadable");
    let msg = err.to_string();
    assert!(msg.contains("sys/module/tenstorrent/version"), "{msg}");
    assert!(kernel.loads().is_empty() && kernel.unloads() == 0);
}

#[test]
fn missing_or_bad_kernel_release_is_a_clear_error() {
    for (content, expect) in [
        (None, "proc/sys/kernel/osrelease"),
        (Some(""), "invalid kernel release"),
        (Some("../../etc\n"), "invalid kernel release"),
        (Some("  \n"), "invalid kernel release"),
    ] {
        let h = Host::new();
        let path = h.p("/proc/sys/kernel/osrelease");
        match content {
            None => fs::remove_file(&path).expect("rm"),
            Some(c) => fs::write(&path, c).expect("write"),
        }
        let kernel = FakeKernel::new(h.root());
        let builder = FakeBuilder::default();
        let err = h
            .run("2.8.0", &kernel, &builder)
            .expect_err("no kernel release");
        assert!(err.to_string().contains(expect), "{content:?}: {err}");
        assert!(builder.builds().is_empty() && kernel.loads().is_empty());
        assert!(!h.cache_dir().exists(), "nothing written to the cache");
    }
}

#[test]
fn busy_module_without_proc_names_no_holder_but_refuses() {
    let h = Host::new();
    set_loaded(h.root(), "2.7.0", 2).expect("loaded, in use");
    // No <root>/proc/<pid> at all (e.g. the pod lacks hostPID).
    let kernel = FakeKernel::new(h.root());
    let err = h
        .run("2.8.0", &kernel, &FakeBuilder::default())
        .expect_err("busy");
    assert_matches!(err, AgentError::Busy { refcnt: 2, .. });
    assert!(
        err.to_string().contains("no process under /proc holds"),
        "{err}"
    );
    assert_eq!(h.loaded().as_deref(), Some("2.7.0"));
}

#[test]
fn holder_with_unreadable_comm_and_cgroup_is_still_listed() {
    let h = Host::with_loaded("2.7.0", 1);
    let pid_dir = h.p("/proc/4321");
    fs::create_dir_all(pid_dir.join("fd")).expect("mkdir");
    std::os::unix::fs::symlink("/dev/tenstorrent/1", pid_dir.join("fd/7")).expect("link");
    let kernel = FakeKernel::new(h.root());
    let err = h
        .run("2.8.0", &kernel, &FakeBuilder::default())
        .expect_err("busy");
    assert!(err.to_string().contains("pid 4321 (?)"), "{err}");
}

#[test]
fn missing_sysfs_module_directory_is_a_fresh_install() {
    let h = Host::new();
    let kernel = FakeKernel::new(h.root());
    let outcome = h
        .run("2.8.0", &kernel, &FakeBuilder::default())
        .expect("fresh");
    assert_matches!(
        &outcome,
        Outcome::Installed {
            previous: None,
            source: ModuleSource::Build,
            ..
        }
    );
    assert_eq!(kernel.unloads(), 0);
    h.assert_cache_consistent();
}
