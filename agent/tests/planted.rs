//! Planted host trees: links, FIFOs, devices and tampered cache entries put
//! where the agent reads or writes. Each case asserts the refusal (or the
//! eviction and rebuild) and a whole-tree hash, of the host root and of a
//! directory outside it, showing nothing changed beyond the expected files.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::Digest;
use ttdrv_agent::build::Builder;
use ttdrv_agent::cache::{Cache, RECORD_FILE};
use ttdrv_agent::fake::{
    FakeBuilder, FakeKernel, REFUSED_FIELD, plant_cached, plant_cached_bytes, set_loaded,
};
use ttdrv_agent::modinfo::fake_module_bytes;
use ttdrv_agent::{AgentError, Config, HostRoot, ModuleSource, Outcome};

use common::host::{KVER, TestHost, assert_matches, go_ahead};

struct Planted {
    host: TestHost,
    /// A directory outside the host root that links point into.
    outside: tempfile::TempDir,
}

impl Planted {
    fn new() -> Self {
        let host = TestHost::new();
        let root = host.root();
        fs::create_dir_all(root.join("etc")).expect("etc");
        fs::write(root.join("etc/passwd"), "root:x:0:0::/root:/bin/sh\n").expect("passwd");
        let outside = tempfile::tempdir().expect("tempdir");
        fs::write(outside.path().join("precious"), "outside the host root\n").expect("file");
        Planted { host, outside }
    }
    /// As [`Planted::new`], with `version` loaded by `refcnt` users.
    fn with_loaded(version: &str, refcnt: u32) -> Self {
        let h = Self::new();
        set_loaded(h.r(), version, refcnt).expect("loaded");
        h
    }
    fn r(&self) -> &Path {
        self.host.root()
    }
    fn p(&self, host_path: &str) -> PathBuf {
        self.host.p(host_path)
    }
    fn config(&self) -> Config {
        Config {
            unload_timeout: Duration::from_secs(1),
            go_ahead_poll: Duration::from_millis(1),
            ..self.host.config("2.8.0")
        }
    }
    fn run(&self, kernel: &FakeKernel, builder: &dyn Builder) -> Result<Outcome, AgentError> {
        common::host::run(&self.config(), kernel, builder, &go_ahead("2.8.0"))
    }
    /// A run with a fresh fake kernel and builder.
    fn run_fresh(&self) -> Result<Outcome, AgentError> {
        self.run(&FakeKernel::new(self.r()), &FakeBuilder::default())
    }
    /// A run with a fresh fake kernel and builder that must be refused: the
    /// trees before it, the kernel, and the error.
    fn run_refused(&self) -> ((Tree, Tree), FakeKernel, AgentError) {
        let before = self.trees();
        let kernel = FakeKernel::new(self.r());
        let err = self
            .run(&kernel, &FakeBuilder::default())
            .expect_err("refused");
        (before, kernel, err)
    }
    /// A run with a fresh fake kernel (returned) that must build 2.8.0
    /// exactly once and install it.
    fn run_rebuilding(&self) -> FakeKernel {
        let kernel = FakeKernel::new(self.r());
        let builder = FakeBuilder::default();
        let outcome = self.run(&kernel, &builder).expect("rebuilt");
        assert_matches!(
            outcome,
            Outcome::Installed {
                source: ModuleSource::Build,
                ..
            }
        );
        assert_eq!(builder.builds(), ["2.8.0"], "rebuilt exactly once");
        kernel
    }
    /// Both trees: the host root and the directory outside it.
    fn trees(&self) -> (Tree, Tree) {
        (tree(self.r()), tree(self.outside.path()))
    }
}

/// Every entry under a directory: type, mode, owner and content (link target
/// for a link), keyed by relative path.
type Tree = BTreeMap<PathBuf, String>;

fn tree(dir: &Path) -> Tree {
    let mut out = Tree::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).expect("read_dir") {
            let path = e.expect("entry").path();
            let meta = fs::symlink_metadata(&path).expect("metadata");
            let rel = path.strip_prefix(dir).expect("prefix").to_path_buf();
            let t = meta.file_type();
            let what = if t.is_symlink() {
                format!("link {}", fs::read_link(&path).expect("link").display())
            } else if t.is_dir() {
                stack.push(path.clone());
                "dir".to_string()
            } else if t.is_file() {
                let bytes = fs::read(&path).expect("read");
                format!("file {:x}", sha2::Sha256::digest(&bytes))
            } else {
                "special".to_string()
            };
            out.insert(
                rel,
                format!("{what} mode {:o} uid {}", meta.mode(), meta.uid()),
            );
        }
    }
    out
}

/// sha256 over a tree without the `expected` paths (and what is under them).
fn hash_except(t: &Tree, expected: &[&str]) -> String {
    let mut h = sha2::Sha256::new();
    for (p, v) in t {
        // An expected path, what is under it, and the directories above it
        // (created for it).
        if expected.iter().any(|e| {
            let e = Path::new(e.trim_start_matches('/'));
            p.starts_with(e) || e.starts_with(p)
        }) {
            continue;
        }
        h.update(p.as_os_str().as_encoded_bytes());
        h.update(b"\0");
        h.update(v.as_bytes());
        h.update(b"\n");
    }
    format!("{:x}", h.finalize())
}

/// Asserts that, apart from `expected`, neither tree changed.
fn assert_unchanged(before: &(Tree, Tree), after: &(Tree, Tree), expected: &[&str]) {
    let changed: Vec<&PathBuf> = after
        .0
        .iter()
        .filter(|(p, v)| before.0.get(*p) != Some(v))
        .map(|(p, _)| p)
        .chain(before.0.keys().filter(|p| !after.0.contains_key(*p)))
        .collect();
    assert_eq!(
        hash_except(&before.0, expected),
        hash_except(&after.0, expected),
        "the host root changed beyond {expected:?}: {changed:?}"
    );
    assert_eq!(
        hash_except(&before.1, &[]),
        hash_except(&after.1, &[]),
        "the directory outside the host root changed"
    );
}

fn mkfifo(path: &Path) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .expect("mkfifo");
}

fn assert_refused_link(err: &AgentError, link: &str) {
    let msg = err.to_string();
    assert!(
        msg.contains(link) && msg.contains("symbolic link"),
        "the error names the link {link}: {msg}"
    );
}

/// The run is refused naming `link`, loads nothing and changes nothing.
fn assert_link_refused_nothing_loaded_or_changed(h: &Planted, link: &str) {
    let (before, kernel, err) = h.run_refused();
    assert_refused_link(&err, link);
    assert!(kernel.loads().is_empty());
    assert_unchanged(&before, &h.trees(), &[]);
}

// ---------------------------------------------------------------------------
// Links in the cache.
// ---------------------------------------------------------------------------

/// `/var/cache/tt-kmd/<kver> -> /etc`: the module must not land in the host's /etc.
#[test]
fn cache_kernel_dir_linked_to_etc_is_refused() {
    let h = Planted::new();
    fs::create_dir_all(h.p("/var/cache/tt-kmd")).expect("mkdir");
    symlink("/etc", h.p(&format!("/var/cache/tt-kmd/{KVER}"))).expect("link");
    assert_link_refused_nothing_loaded_or_changed(&h, &format!("/var/cache/tt-kmd/{KVER}"));
}

/// An absolute link to a directory outside the host root.
#[test]
fn cache_dir_linked_outside_the_root_by_absolute_path_is_refused() {
    let h = Planted::new();
    fs::create_dir_all(h.p("/var/cache")).expect("mkdir");
    symlink(h.outside.path(), h.p("/var/cache/tt-kmd")).expect("link");
    assert_link_refused_nothing_loaded_or_changed(&h, "/var/cache/tt-kmd");
}

/// A relative link climbing out of the root with `..`.
#[test]
fn cache_dir_linked_outside_the_root_by_dotdot_is_refused() {
    let h = Planted::new();
    fs::create_dir_all(h.p("/var/cache/tt-kmd")).expect("mkdir");
    // More `..` than the root is deep, then the outside directory.
    symlink(
        format!("../../../../../../../..{}", h.outside.path().display()),
        h.p(&format!("/var/cache/tt-kmd/{KVER}")),
    )
    .expect("link");
    let (before, _, err) = h.run_refused();
    assert_refused_link(&err, &format!("/var/cache/tt-kmd/{KVER}"));
    assert_unchanged(&before, &h.trees(), &[]);
}

/// A linked version directory whose target holds a module of the wrong
/// version: the "wrong version" cleanup must not delete it.
#[test]
fn linked_version_dir_is_refused_and_its_target_kept() {
    let h = Planted::new();
    let victim = h.p("/srv/victim");
    fs::create_dir_all(&victim).expect("mkdir");
    plant_cached(h.r(), KVER, "2.7.0", "2.7.0").expect("plant");
    fs::rename(
        h.p(&format!("/var/cache/tt-kmd/{KVER}/2.7.0/tenstorrent.ko")),
        victim.join("tenstorrent.ko"),
    )
    .expect("move");
    symlink(
        "/srv/victim",
        h.p(&format!("/var/cache/tt-kmd/{KVER}/2.8.0")),
    )
    .expect("link");
    let (before, _, err) = h.run_refused();
    assert_refused_link(&err, &format!("/var/cache/tt-kmd/{KVER}/2.8.0"));
    assert!(
        victim.join("tenstorrent.ko").is_file(),
        "the target is kept"
    );
    assert_unchanged(&before, &h.trees(), &[]);
}

/// The module file itself a link to a module elsewhere on the host.
#[test]
fn cached_module_that_is_a_link_is_refused() {
    let h = Planted::new();
    let ko = plant_cached(h.r(), KVER, "2.8.0", "2.8.0").expect("plant");
    fs::rename(&ko, h.p("/srv-module.ko")).expect("move");
    symlink("/srv-module.ko", &ko).expect("link");
    let (before, kernel, err) = h.run_refused();
    assert_refused_link(
        &err,
        &format!("/var/cache/tt-kmd/{KVER}/2.8.0/tenstorrent.ko"),
    );
    assert!(kernel.loads().is_empty(), "a linked module is never loaded");
    assert_unchanged(&before, &h.trees(), &[]);
}

// ---------------------------------------------------------------------------
// tt-smi, the udev rule, the old venv, kbuild trees.
// ---------------------------------------------------------------------------

/// `/usr/local/bin/tt-smi -> /dev/zero`: refused at once, nothing read from it.
#[test]
fn tt_smi_path_linked_to_dev_zero_is_refused() {
    let h = Planted::with_loaded("2.8.0", 0);
    fs::create_dir_all(h.p("/usr/local/bin")).expect("mkdir");
    symlink("/dev/zero", h.p("/usr/local/bin/tt-smi")).expect("link");
    let (before, _, err) = h.run_refused();
    assert_refused_link(&err, "/usr/local/bin/tt-smi");
    // The udev rule is written on this path before tt-smi (expected).
    assert_unchanged(&before, &h.trees(), &["/etc/udev"]);
}

/// A FIFO at the tt-smi path: refused without waiting on it.
#[test]
fn tt_smi_path_that_is_a_fifo_is_refused_without_blocking() {
    let h = Planted::with_loaded("2.8.0", 0);
    fs::create_dir_all(h.p("/usr/local/bin")).expect("mkdir");
    mkfifo(&h.p("/usr/local/bin/tt-smi"));
    let (before, _, err) = h.run_refused();
    let msg = err.to_string();
    assert!(
        msg.contains("/usr/local/bin/tt-smi") && msg.contains("FIFO"),
        "{msg}"
    );
    assert_unchanged(&before, &h.trees(), &["/etc/udev"]);
}

/// `/usr/local/bin -> <outside>`: the copy must not land outside the root.
#[test]
fn tt_smi_directory_linked_outside_is_refused() {
    let h = Planted::with_loaded("2.8.0", 0);
    fs::create_dir_all(h.p("/usr/local")).expect("mkdir");
    symlink(h.outside.path(), h.p("/usr/local/bin")).expect("link");
    let (before, _, err) = h.run_refused();
    assert_refused_link(&err, "/usr/local/bin");
    assert!(!h.outside.path().join("tt-smi").exists());
    assert_unchanged(&before, &h.trees(), &["/etc/udev"]);
}

/// The udev rule path a link to /etc/passwd, and /opt/tt a link to a
/// virtualenv outside the root: the rule is refused (a warning, the install
/// stands), passwd and the outside venv are kept.
#[test]
fn udev_rule_and_old_venv_links_are_not_followed() {
    let h = Planted::with_loaded("2.8.0", 0);
    fs::create_dir_all(h.p("/etc/udev/rules.d")).expect("mkdir");
    symlink("/etc/passwd", h.p("/etc/udev/rules.d/50-tenstorrent.rules")).expect("link");
    fs::write(h.outside.path().join("pyvenv.cfg"), "home = /usr/bin\n").expect("venv");
    fs::create_dir_all(h.p("/opt")).expect("mkdir");
    symlink(h.outside.path(), h.p("/opt/tt")).expect("link");
    let before = h.trees();
    let got = ttdrv_agent::devices::ensure_device_access(&HostRoot::new(h.r()));
    assert!(!got.rule_written);
    assert!(got.removed.is_empty(), "{:?}", got.removed);
    assert!(
        got.warnings
            .iter()
            .any(|w| w.contains("/etc/udev/rules.d/50-tenstorrent.rules")
                && w.contains("symbolic link")),
        "{:?}",
        got.warnings
    );
    // The whole run still succeeds: device access is best effort.
    let outcome = h.run_fresh().expect("already current");
    assert_matches!(outcome, Outcome::AlreadyCurrent { .. });
    assert_unchanged(&before, &h.trees(), &["/usr/local/bin"]);
}

/// A host "kbuild tree" that is a link (to /etc) is not exposed to the build.
#[test]
fn kbuild_tree_that_is_a_link_is_not_linked() {
    let h = Planted::new();
    fs::create_dir_all(h.p("/usr/lib")).expect("mkdir");
    symlink("/etc", h.p("/usr/lib/linux-kbuild-6.1")).expect("link");
    fs::create_dir_all(h.p("/usr/lib/linux-kbuild-6.2")).expect("mkdir");
    let own = tempfile::tempdir().expect("tempdir");
    let before = h.trees();
    let made =
        ttdrv_agent::kbuild::link_host_kbuild(&HostRoot::new(h.r()), own.path()).expect("links");
    assert_eq!(made, [own.path().join("linux-kbuild-6.2")]);
    assert_unchanged(&before, &h.trees(), &[]);
}

// ---------------------------------------------------------------------------
// sysfs and /proc: FIFOs, oversized files.
// ---------------------------------------------------------------------------

/// FIFOs at sysfs refcnt and at a holder's comm: errors or "?", never a hang.
#[test]
fn fifos_in_sysfs_and_proc_never_block() {
    let h = Planted::with_loaded("2.7.0", 0);
    fs::remove_file(h.p("/sys/module/tenstorrent/refcnt")).expect("rm");
    mkfifo(&h.p("/sys/module/tenstorrent/refcnt"));
    fs::create_dir_all(h.p("/proc/4242/fd")).expect("mkdir");
    mkfifo(&h.p("/proc/4242/comm"));
    symlink("/dev/tenstorrent/0", h.p("/proc/4242/fd/3")).expect("link");
    let before = h.trees();
    let root = HostRoot::new(h.r());
    let err = root.module_state().expect_err("refused");
    assert!(
        err.to_string().contains("refcnt") && err.to_string().contains("FIFO"),
        "{err}"
    );
    let holders = ttdrv_agent::holders::find_holders(&root);
    assert_eq!(holders.len(), 1);
    assert_eq!(holders[0].comm, "?");
    let err = h.run_fresh().expect_err("refused");
    assert!(err.to_string().contains("FIFO"), "{err}");
    assert_unchanged(&before, &h.trees(), &[]);
}

/// A 1 MiB sysfs version file (a planted file, or `/dev/zero` copied): refused
/// with its size cap, not read whole.
#[test]
fn oversized_sysfs_file_is_refused() {
    let h = Planted::with_loaded("2.7.0", 0);
    fs::write(h.p("/sys/module/tenstorrent/version"), vec![b'7'; 1 << 20]).expect("big");
    let err = HostRoot::new(h.r()).module_state().expect_err("too large");
    assert!(err.to_string().contains("larger than"), "{err}");
}

/// `/sys/module/tenstorrent/version -> /dev/zero`.
#[test]
fn sysfs_file_linked_to_dev_zero_is_refused() {
    let h = Planted::with_loaded("2.7.0", 0);
    fs::remove_file(h.p("/sys/module/tenstorrent/version")).expect("rm");
    symlink("/dev/zero", h.p("/sys/module/tenstorrent/version")).expect("link");
    let err = HostRoot::new(h.r()).module_state().expect_err("refused");
    let msg = err.to_string();
    assert!(
        msg.contains("/sys/module/tenstorrent/version") && msg.contains("symbolic link"),
        "{msg}"
    );
}

// ---------------------------------------------------------------------------
// The verified cache.
// ---------------------------------------------------------------------------

fn module(version: &str, vermagic_kver: &str, extra: &[&str]) -> Vec<u8> {
    let v = format!("version={version}");
    let m = format!("vermagic={vermagic_kver} SMP preempt mod_unload modversions");
    let mut entries = vec!["license=GPL", v.as_str(), "name=tenstorrent", m.as_str()];
    entries.extend_from_slice(extra);
    fake_module_bytes(&entries)
}

fn cache_file(h: &Planted, name: &str) -> PathBuf {
    h.p(&format!("/var/cache/tt-kmd/{KVER}/2.8.0/{name}"))
}

/// Runs on a host with 2.7.0 loaded and a poisoned 2.8.0 entry: the entry is
/// evicted, the module rebuilt and loaded; only the cache entry changed.
fn assert_evicted_and_rebuilt(h: &Planted) {
    set_loaded(h.r(), "2.7.0", 0).expect("loaded");
    // tt-smi, the udev rule and the swap's record are written by a
    // successful run (expected).
    let before = h.trees();
    let kernel = h.run_rebuilding();
    assert_eq!(
        kernel.loads(),
        ["2.8.0"],
        "the poisoned module was never loaded"
    );
    assert!(
        Cache::new(&HostRoot::new(h.r()))
            .lookup(KVER, "2.8.0", ttdrv_agent::cache::SignedBy::Nobody)
            .expect("lookup")
            .is_some(),
        "the rebuilt entry verifies"
    );
    assert_unchanged(
        &before,
        &h.trees(),
        &[
            &format!("/var/cache/tt-kmd/{KVER}/2.8.0"),
            "/sys/module/tenstorrent",
            "/usr/local/bin/tt-smi",
            "/etc/udev",
            // The validated swap's record, kept for the controller's verdict.
            "/var/cache/tt-kmd/swap.json",
        ],
    );
}

/// The poisoned-cache case: a module (and record) for another kernel.
#[test]
fn cached_module_with_wrong_vermagic_is_evicted_and_rebuilt() {
    let h = Planted::new();
    plant_cached_bytes(
        h.r(),
        KVER,
        "2.8.0",
        &module("2.8.0", "5.10.0-1-amd64", &[]),
    )
    .expect("plant");
    assert_evicted_and_rebuilt(&h);
}

/// A module changed after it was recorded (hash mismatch).
#[test]
fn tampered_cached_module_is_evicted_and_rebuilt() {
    let h = Planted::new();
    let ko = plant_cached(h.r(), KVER, "2.8.0", "2.8.0").expect("plant");
    fs::write(&ko, module("2.8.0", KVER, &["evil=1"])).expect("tamper");
    assert_evicted_and_rebuilt(&h);
}

/// A module without its record (written by someone else than the agent).
#[test]
fn cached_module_without_record_is_evicted_and_rebuilt() {
    let h = Planted::new();
    plant_cached(h.r(), KVER, "2.8.0", "2.8.0").expect("plant");
    fs::remove_file(cache_file(&h, RECORD_FILE)).expect("rm record");
    assert_evicted_and_rebuilt(&h);
}

/// A module others may write (mode 0666).
#[test]
fn world_writable_cached_module_is_evicted_and_rebuilt() {
    let h = Planted::new();
    let ko = plant_cached(h.r(), KVER, "2.8.0", "2.8.0").expect("plant");
    fs::set_permissions(&ko, fs::Permissions::from_mode(0o666)).expect("chmod");
    assert_evicted_and_rebuilt(&h);
}

/// A module owned by another user.
#[test]
fn cached_module_of_another_owner_is_evicted_and_rebuilt() {
    let h = Planted::new();
    let ko = plant_cached(h.r(), KVER, "2.8.0", "2.8.0").expect("plant");
    let other = rustix::process::geteuid().as_raw().wrapping_add(1);
    std::os::unix::fs::chown(&ko, Some(other), None)
        .expect("chown (the tests run as root, as the agent does)");
    assert_evicted_and_rebuilt(&h);
}

/// A verified module the kernel refuses: evicted, rebuilt once, loaded.
#[test]
fn cached_module_the_kernel_refuses_is_evicted_and_rebuilt_once() {
    let h = Planted::new();
    let refused = format!("{REFUSED_FIELD}=1");
    plant_cached_bytes(h.r(), KVER, "2.8.0", &module("2.8.0", KVER, &[&refused])).expect("plant");
    set_loaded(h.r(), "2.7.0", 0).expect("loaded");
    let kernel = h.run_rebuilding();
    assert_eq!(kernel.loads(), ["2.8.0", "2.8.0"]);
    assert_eq!(
        HostRoot::new(h.r())
            .loaded_version()
            .expect("sysfs")
            .as_deref(),
        Some("2.8.0")
    );
}

/// A rebuilt module the kernel refuses too: the node fails with the reason,
/// after one rebuild, and nothing is left cached to retry forever.
#[test]
fn rebuilt_module_refused_again_fails_with_the_reason() {
    let h = Planted::new();
    plant_cached(h.r(), KVER, "2.8.0", "2.8.0").expect("plant");
    set_loaded(h.r(), "2.7.0", 0).expect("loaded");
    let kernel = FakeKernel::new(h.r()).failing("2.8.0");
    let builder = FakeBuilder::default();
    let err = h.run(&kernel, &builder).expect_err("refused twice");
    assert_eq!(err.reason(), Some("LoadFailed"), "{err}");
    assert_eq!(builder.builds(), ["2.8.0"], "one rebuild, no more");
    assert!(!cache_file(&h, "tenstorrent.ko").exists(), "evicted");
}

/// A build for another kernel (headers of another kernel) is refused, not cached.
#[test]
fn module_built_for_another_kernel_is_refused() {
    let h = Planted::new();
    let builder = FakeBuilder {
        wrong_kernel: Some("5.10.0-1-amd64".into()),
        ..FakeBuilder::default()
    };
    let err = h
        .run(&FakeKernel::new(h.r()), &builder)
        .expect_err("refused");
    assert_matches!(err, AgentError::BuiltForOtherKernel { .. });
    assert_eq!(err.reason(), Some("BuildFailed"));
    assert!(!cache_file(&h, "tenstorrent.ko").exists());
}

/// Pruning: kernels no longer installed go; per kernel the three highest
/// versions stay, plus the target and the previous one.
#[test]
fn cache_keeps_a_few_versions_and_prunes_removed_kernels() {
    let h = Planted::new();
    for v in ["2.1.0", "2.2.0", "2.3.0", "2.4.0", "2.5.0", "2.7.0"] {
        plant_cached(h.r(), KVER, v, v).expect("plant");
    }
    plant_cached(h.r(), "5.10.0-1-amd64", "2.7.0", "2.7.0").expect("old kernel");
    fs::create_dir_all(h.p("/lib/modules/6.0.0-1-amd64")).expect("installed");
    plant_cached(h.r(), "6.0.0-1-amd64", "2.7.0", "2.7.0").expect("other installed kernel");
    set_loaded(h.r(), "2.1.0", 0).expect("loaded");
    h.run_fresh().expect("installed");
    let left = |k: &str| -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(h.p(&format!("/var/cache/tt-kmd/{k}")))
            .map(|d| {
                d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    };
    assert_eq!(left(KVER), ["2.1.0", "2.4.0", "2.5.0", "2.7.0", "2.8.0"]);
    assert!(left("5.10.0-1-amd64").is_empty(), "removed kernel pruned");
    assert_eq!(left("6.0.0-1-amd64"), ["2.7.0"], "installed kernel kept");
}
