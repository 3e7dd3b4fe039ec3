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
use ttdrv_agent::node::{FAKE_POLICY, FakeNode, go_ahead_node};
use ttdrv_agent::pod::FakePause;
use ttdrv_agent::{Agent, Config, HostRoot, ModuleSource, Outcome};

use common::host::assert_matches;

const HINT: &str = "run hack/agent-deps.sh (installs git, make, gcc, kmod, linux-headers-amd64)";

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

fn modinfo_version(ko: &Path) -> String {
    let out = Command::new("modinfo")
        .args(["-F", "version"])
        .arg(ko)
        .output()
        .unwrap_or_else(|e| panic!("cannot run modinfo ({e}): {HINT}"));
    common::stdout_of("modinfo", out)
}

#[test]
fn real_git_and_make_build_the_stub_module_into_the_cache() {
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

    let smi = tempfile::tempdir().expect("tempdir");
    let config = |target: &str| Config {
        host_root: root.path().to_path_buf(),
        target_version: target.to_string(),
        force_unload: false,
        unload_timeout: Duration::from_secs(2),
        source_repository: repo.path().display().to_string(),
        tt_smi_path: smi.path().join("absent"),
        tt_smi_version: None,
        kbuild_link_dir: None,
        policy: Some(FAKE_POLICY.to_string()),
        go_ahead_poll: Duration::from_millis(1),
        swap_without_go_ahead: false,
        next_kernels: true,
        module_parameters: Default::default(),
        status_file: None,
    };
    let builder = GitMakeBuilder::new(repo.path().display().to_string());
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
