//! The real build path: real git clones the stub module's fixture repository
//! and real make builds it against Debian's kernel headers. Fails (never
//! skips) when the headers or tools are missing: run hack/agent-deps.sh.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ttdrv_agent::build::GitMakeBuilder;
use ttdrv_agent::fake::{FakeKernel, set_loaded};
use ttdrv_agent::node::fake::{FAKE_POLICY, FakeNode, go_ahead_node};
use ttdrv_agent::pod::FakePause;
use ttdrv_agent::{Agent, Config, HostRoot, ModuleSource, Outcome};

use common::host::assert_matches;

const HINT: &str =
    "run hack/agent-deps.sh (installs git, make, gcc, kmod, linux-headers-amd64, openssl)";

/// A kernel release whose headers are installed: /lib/modules/<kver>/build.
fn installed_headers() -> (String, PathBuf) {
    let mut found: Vec<(String, PathBuf)> = fs::read_dir("/lib/modules")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let kver = e.file_name().into_string().ok()?;
            let build = e.path().join("build");
            build.join("Makefile").is_file().then_some((kver, build))
        })
        .collect();
    found.sort();
    match found.pop() {
        Some(f) => f,
        None => panic!("no kernel headers under /lib/modules/*/build: {HINT}"),
    }
}

/// `modinfo -F <field>` of a module file (empty when it has no such field).
fn modinfo(ko: &Path, field: &str) -> String {
    let out = Command::new("modinfo")
        .args(["-F", field])
        .arg(ko)
        .output()
        .unwrap_or_else(|e| panic!("cannot run modinfo ({e}): {HINT}"));
    common::stdout_of("modinfo", out)
}

fn modinfo_version(ko: &Path) -> String {
    modinfo(ko, "version")
}

/// A host root whose running kernel is this machine's (its real headers,
/// modules.dep and crc7), and the stub module's fixture repository.
struct RealHost {
    kver: String,
    root: tempfile::TempDir,
    repo: tempfile::TempDir,
    smi: tempfile::TempDir,
}

impl RealHost {
    fn hr(&self) -> HostRoot {
        HostRoot::new(self.root.path())
    }

    fn config(&self, target: &str) -> Config {
        Config {
            host_root: self.root.path().to_path_buf(),
            target_version: target.to_string(),
            force_unload: false,
            unload_timeout: Duration::from_secs(2),
            source_repository: self.repo.path().display().to_string(),
            tt_smi_path: self.smi.path().join("absent"),
            tt_smi_version: None,
            kbuild_link_dir: None,
            policy: Some(FAKE_POLICY.to_string()),
            go_ahead_poll: Duration::from_millis(1),
            swap_without_go_ahead: false,
            next_kernels: true,
            signing: None,
            module_parameters: Default::default(),
            status_file: None,
            validation_timeout: std::time::Duration::from_millis(200),
            on_validation_failure: Default::default(),
        }
    }

    fn builder(&self) -> GitMakeBuilder {
        GitMakeBuilder::new(self.repo.path().display().to_string())
    }

    fn cached(&self, version: &str) -> PathBuf {
        self.hr().path(format!(
            "/var/cache/tt-kmd/{}/{version}/tenstorrent.ko",
            self.kver
        ))
    }
}

fn real_host() -> RealHost {
    let (kver, headers) = installed_headers();
    let root = tempfile::tempdir().expect("tempdir");
    let hr = HostRoot::new(root.path());
    fs::create_dir_all(hr.path("/proc/sys/kernel")).expect("mkdir");
    fs::write(hr.path("/proc/sys/kernel/osrelease"), format!("{kver}\n")).expect("osrelease");
    fs::create_dir_all(hr.path(format!("/lib/modules/{kver}"))).expect("mkdir");
    std::os::unix::fs::symlink(&headers, hr.path(format!("/lib/modules/{kver}/build")))
        .expect("symlink");
    // The stub depends on crc7 (as tt-kmd on hwmon where CONFIG_HWMON=m): the
    // host's real modules.dep and crc7.ko, for the agent to find it there.
    let host_tree = format!("/lib/modules/{kver}");
    let dep = fs::read_to_string(format!("{host_tree}/modules.dep")).expect("host modules.dep");
    let crc7 = dep
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(f, _)| f)
        .find(|f| {
            f.ends_with("/crc7.ko") || f.ends_with("/crc7.ko.xz") || f.ends_with("/crc7.ko.zst")
        })
        .expect("crc7 in the host's modules.dep (CONFIG_CRC7=m)")
        .to_string();
    fs::write(hr.path(format!("{host_tree}/modules.dep")), &dep).expect("modules.dep");
    let crc7_at = hr.path(format!("{host_tree}/{crc7}"));
    fs::create_dir_all(crc7_at.parent().expect("parent")).expect("mkdir");
    fs::copy(format!("{host_tree}/{crc7}"), &crc7_at).expect("copy crc7");

    let repo = tempfile::tempdir().expect("tempdir");
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/stub-module/make-repo.sh");
    let st = Command::new("bash")
        .arg(&script)
        .arg(repo.path())
        .status()
        .expect("make-repo.sh");
    assert!(st.success(), "make-repo.sh failed: {HINT}");
    RealHost {
        kver,
        root,
        repo,
        smi: tempfile::tempdir().expect("tempdir"),
    }
}

#[test]
fn real_git_and_make_build_the_stub_module_into_the_cache() {
    let host = real_host();
    let (kver, root, hr) = (&host.kver, &host.root, host.hr());
    let config = |target: &str| host.config(target);
    let builder = host.builder();
    let kernel = FakeKernel::new(root.path());
    let node = FakeNode::default();
    let pause = FakePause::stopping_after(3);
    let run = |target: &str| {
        let c = config(target);
        // The controller's go-ahead for this target is on the node.
        node.set(go_ahead_node(FAKE_POLICY, target));
        Agent {
            config: &c,
            kernel: &kernel,
            killer: &kernel,
            builder: &builder,
            node: &node,
            pause: &pause,
        }
        .run()
    };

    set_loaded(root.path(), "2.7.0", 0).expect("loaded");
    let start = Instant::now();
    let outcome = run("2.8.0").unwrap_or_else(|e| panic!("real build failed: {e}\n{HINT}"));
    eprintln!("real build of 2.8.0 took {:?}", start.elapsed());
    assert_matches!(
        outcome,
        Outcome::Installed {
            source: ModuleSource::Build,
            ..
        }
    );

    assert_eq!(
        kernel.loads(),
        vec!["dependency:crc7".to_string(), "2.8.0".to_string()],
        "crc7 is loaded from the host's tree before the module"
    );
    let cached = hr.path(format!("/var/cache/tt-kmd/{kver}/2.8.0/tenstorrent.ko"));
    assert_eq!(modinfo_version(&cached), "2.8.0");
    // Without signing configured nothing is appended (`make modules` does
    // not sign; only modules_install would, under CONFIG_MODULE_SIG_ALL).
    assert_eq!(modinfo(&cached, "sig_id"), "", "signed without a key");
    let file = fs::File::open(&cached).expect("open");
    assert!(!ttdrv_agent::signing::is_signed(&file, &cached).expect("read"));
    assert_eq!(
        ttdrv_agent::modinfo::module_version(&cached)
            .expect("parse")
            .as_deref(),
        Some("2.8.0"),
        "our .modinfo reader agrees with modinfo on a real module"
    );
    assert_eq!(
        ttdrv_agent::modinfo::modinfo_field(&cached, "name")
            .expect("parse")
            .as_deref(),
        Some("tenstorrent")
    );

    // Downgrade builds 2.7.0; going back to 2.8.0 comes from the cache.
    let outcome = run("2.7.0").unwrap_or_else(|e| panic!("real build of 2.7.0 failed: {e}"));
    assert_matches!(
        outcome,
        Outcome::Installed {
            source: ModuleSource::Build,
            ..
        }
    );
    assert_eq!(
        modinfo_version(&hr.path(format!("/var/cache/tt-kmd/{kver}/2.7.0/tenstorrent.ko"))),
        "2.7.0"
    );
    let outcome = run("2.8.0").expect("cache hit");
    assert_matches!(
        outcome,
        Outcome::Installed {
            source: ModuleSource::Cache,
            ..
        }
    );
}

/// `openssl` with `args`; its stdout.
fn openssl(args: &[&str]) -> String {
    let out = Command::new("openssl")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run openssl ({e}): {HINT}"));
    common::stdout_of("openssl", out)
}

#[test]
fn the_built_module_is_signed_with_the_configured_key_pair() {
    let host = real_host();
    let keys = tempfile::tempdir().expect("tempdir");
    let (key, cert) = (keys.path().join("tls.key"), keys.path().join("tls.crt"));
    const CN: &str = "ttdrv test module signing";
    // As docs/security.md says to make one (a MOK key pair, the
    // certificate in DER as mokutil wants it).
    openssl(&[
        "req",
        "-new",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        &format!("/CN={CN}"),
        "-addext",
        "extendedKeyUsage=codeSigning",
        "-outform",
        "DER",
        "-keyout",
        &key.display().to_string(),
        "-out",
        &cert.display().to_string(),
    ]);
    let signing = ttdrv_agent::signing::SigningKey::new(key.clone(), cert.clone(), None);
    let config = Config {
        signing: Some(signing.clone()),
        ..host.config("2.8.0")
    };
    let kernel = FakeKernel::new(host.root.path());
    let node = FakeNode::default();
    let pause = FakePause::stopping_after(3);
    let agent = |config: &Config| {
        let _ = fs::remove_dir_all(host.hr().path("/sys/module/tenstorrent"));
        Agent {
            config,
            kernel: &kernel,
            killer: &kernel,
            builder: &host.builder(),
            node: &node,
            pause: &pause,
        }
        .run()
    };
    let outcome = agent(&config).unwrap_or_else(|e| panic!("signed build failed: {e}\n{HINT}"));
    assert_matches!(
        outcome,
        Outcome::Installed {
            source: ModuleSource::Build,
            ..
        }
    );
    let cached = host.cached("2.8.0");
    assert_eq!(modinfo_version(&cached), "2.8.0");
    assert_eq!(modinfo(&cached, "sig_id"), "PKCS#7");
    assert_eq!(modinfo(&cached, "signer"), CN);
    // The hash the headers were configured with (Debian: sha256).
    let config_text = fs::read_to_string(format!("/lib/modules/{}/build/.config", host.kver))
        .expect("the headers' .config");
    let want_hash = config_text
        .lines()
        .find_map(|l| l.strip_prefix("CONFIG_MODULE_SIG_HASH="))
        .map_or("sha256", |h| h.trim_matches('"'))
        .to_string();
    assert_eq!(modinfo(&cached, "sig_hashalgo"), want_hash);
    // Our reader sees it too, and the enforcement check would pass it.
    let file = fs::File::open(&cached).expect("open");
    assert!(ttdrv_agent::signing::is_signed(&file, &cached).expect("read"));

    // The record names the certificate by the fingerprint openssl gives.
    let record: ttdrv_agent::cache::Record = serde_json::from_slice(
        &fs::read(cached.with_file_name("tenstorrent.ko.json")).expect("record"),
    )
    .expect("record json");
    let openssl_fp = openssl(&[
        "x509",
        "-inform",
        "DER",
        "-in",
        &cert.display().to_string(),
        "-noout",
        "-fingerprint",
        "-sha256",
    ]);
    let hex: String = openssl_fp
        .rsplit('=')
        .next()
        .unwrap_or_default()
        .chars()
        .filter(|c| *c != ':')
        .collect::<String>()
        .to_lowercase();
    assert_eq!(record.signer, Some(format!("sha256:{hex}")));

    // The same certificate in PEM (as `kubectl create secret tls` wants
    // it): the same fingerprint, so the cached module is served as it is.
    let pem = keys.path().join("tls.pem");
    openssl(&[
        "x509",
        "-inform",
        "DER",
        "-in",
        &cert.display().to_string(),
        "-out",
        &pem.display().to_string(),
    ]);
    let config = Config {
        signing: Some(ttdrv_agent::signing::SigningKey::new(
            key.clone(),
            pem,
            None,
        )),
        ..host.config("2.8.0")
    };
    let outcome = agent(&config).expect("from the cache");
    assert_matches!(
        outcome,
        Outcome::Installed {
            source: ModuleSource::Cache,
            ..
        }
    );

    // A key that is not the certificate's: the kernel's sign-file refuses it.
    let other = keys.path().join("other.key");
    openssl(&[
        "genpkey",
        "-algorithm",
        "RSA",
        "-out",
        &other.display().to_string(),
    ]);
    let config = Config {
        signing: Some(ttdrv_agent::signing::SigningKey::new(other, cert, None)),
        ..host.config("2.7.0")
    };
    let err = agent(&config).expect_err("mismatched key");
    assert!(matches!(err, ttdrv_agent::AgentError::Sign { .. }), "{err}");
    assert_eq!(err.reason(), Some(ttdrv_core::reason::BUILD_FAILED));
    assert!(
        !host.cached("2.7.0").exists(),
        "an unsigned module was cached"
    );
}

/// A tmpfs of `size` bytes mounted at `at` (this test runs as root, as CI
/// does), unmounted when dropped.
struct Tmpfs {
    at: PathBuf,
}

impl Tmpfs {
    fn mount(at: &Path, size: u64) -> Self {
        fs::create_dir_all(at).expect("mkdir");
        let st = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0755"),
                "tmpfs",
            ])
            .arg(at)
            .status()
            .expect("mount");
        assert!(
            st.success(),
            "mounting a tmpfs at {} failed: the full-disk test needs root",
            at.display()
        );
        Tmpfs {
            at: at.to_path_buf(),
        }
    }

    /// Grows (or shrinks) it in place, its files kept.
    fn resize(&self, size: u64) {
        let st = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.at)
            .status()
            .expect("mount -o remount");
        assert!(st.success(), "remounting {}", self.at.display());
    }

    /// Every regular file under it (temporary files included).
    fn files(&self) -> Vec<PathBuf> {
        fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
            for e in fs::read_dir(dir).expect("read_dir").flatten() {
                let p = e.path();
                if p.is_dir() {
                    walk(&p, out);
                } else {
                    out.push(p);
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.at, &mut out);
        out
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.at).status();
    }
}

/// The cache's filesystem fills during a build (issue 35, fault 4): the
/// node's /var/cache/tt-kmd is a small tmpfs. The agent gives up with
/// `BuildFailed` and a message that leads with "disk full" and says how
/// much room is left; nothing partial stays in the cache (neither a module
/// without its record nor a temporary file), the loaded module is not
/// touched, and a retry once there is room builds and installs.
#[test]
fn a_full_cache_disk_fails_the_build_cleanly_and_a_retry_with_room_installs() {
    const PAGE: u64 = 4096;
    let host = real_host();
    let (root, hr) = (&host.root, host.hr());
    let builder = host.builder();
    let kernel = FakeKernel::new(root.path());
    let node = FakeNode::default();
    let pause = FakePause::stopping_after(3);
    let run = || {
        let c = host.config("2.8.0");
        node.set(go_ahead_node(FAKE_POLICY, "2.8.0"));
        Agent {
            config: &c,
            kernel: &kernel,
            killer: &kernel,
            builder: &builder,
            node: &node,
            pause: &pause,
        }
        .run()
    };
    let loaded = || {
        fs::read_to_string(hr.path("/sys/module/tenstorrent/version"))
            .expect("loaded version")
            .trim()
            .to_string()
    };
    let cache_dir = hr.path("/var/cache/tt-kmd");
    let expect_disk_full =
        |what: &str, err: ttdrv_agent::AgentError, tmpfs: &Tmpfs, loads: usize| {
            assert!(
                matches!(err, ttdrv_agent::AgentError::DiskFull { .. }),
                "{what}: {err}"
            );
            assert_eq!(
                err.reason(),
                Some(ttdrv_core::reason::BUILD_FAILED),
                "{what}"
            );
            let m = err.termination_message().expect("a termination message");
            assert!(
                m.starts_with("BuildFailed: disk full: storing the ")
                    && m.contains("-byte module tenstorrent 2.8.0 in the cache failed")
                    && m.contains("No space left on device")
                    && m.contains(&format!(
                        "the filesystem holding /var/cache/tt-kmd/{}/2.8.0 has ",
                        host.kver
                    ))
                    && m.ends_with("Free space there, then retry"),
                "{what}: {m}"
            );
            assert_eq!(
                tmpfs.files(),
                Vec::<PathBuf>::new(),
                "{what}: left in the cache"
            );
            assert_eq!(loaded(), "2.7.0", "{what}: the loaded module was touched");
            assert_eq!(
                kernel.loads()[loads..],
                [] as [String; 0],
                "{what}: something was loaded"
            );
            eprintln!("{what}: {m}");
        };

    // 1. No room for the module at all: a one-page cache.
    set_loaded(root.path(), "2.7.0", 0).expect("loaded");
    let tmpfs = Tmpfs::mount(&cache_dir, PAGE);
    let err = run().expect_err("a module stored in a one-page cache");
    expect_disk_full("one page", err, &tmpfs, 0);

    // The room to learn the module's size: it installs.
    tmpfs.resize(64 << 20);
    let outcome = run().unwrap_or_else(|e| panic!("build with room: {e}\n{HINT}"));
    assert_matches!(
        outcome,
        Outcome::Installed {
            source: ModuleSource::Build,
            ..
        }
    );
    let size = fs::metadata(host.cached("2.8.0")).expect("cached").len();
    drop(tmpfs);

    // 2. Room for the module but not for its record (the record is written
    // last): the module written is taken back.
    set_loaded(root.path(), "2.7.0", 0).expect("loaded");
    let loads = kernel.loads().len();
    let tmpfs = Tmpfs::mount(&cache_dir, size.div_ceil(PAGE) * PAGE);
    let err = run().expect_err("a record stored in a cache the module filled");
    expect_disk_full("room for the module only", err, &tmpfs, loads);

    // 3. Room again: the retry builds, stores and installs.
    tmpfs.resize(64 << 20);
    let outcome = run().unwrap_or_else(|e| panic!("retry with room: {e}"));
    assert_matches!(
        outcome,
        Outcome::Installed {
            source: ModuleSource::Build,
            ..
        }
    );
    assert_eq!(loaded(), "2.8.0");
    assert_eq!(modinfo_version(&host.cached("2.8.0")), "2.8.0");
}
