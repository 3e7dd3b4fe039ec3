//! The binary in simulate mode, end to end: what the controller's tests
//! will run.

use std::path::Path;
use std::process::Command;

use ttdrv_api::firmware::flasher::Report;
use ttdrv_flasher::bundle;

const BIN: &str = env!("CARGO_BIN_EXE_ttdrv-flash");

struct Sim {
    dir: tempfile::TempDir,
}

impl Sim {
    fn new(cards: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join("cards.json"),
            serde_json::to_string(cards).expect("json"),
        )
        .expect("cards");
        std::fs::write(
            dir.path().join("fw.fwbundle"),
            bundle::with_manifest("19.8.0"),
        )
        .expect("bundle");
        Sim { dir }
    }

    fn path(&self, name: &str) -> std::path::PathBuf {
        self.dir.path().join(name)
    }

    fn touch(&self, name: &str) {
        std::fs::write(self.path(name), "").expect("touch");
    }

    fn cmd(&self, sub: &str, env: &[(&str, &str)]) -> Command {
        let mut c = Command::new(BIN);
        c.arg(sub)
            .env_clear()
            .env("TTDRV_FLASH_SIMULATE", self.dir.path())
            .env("TT_FW_BUNDLE_PATH", self.path("fw.fwbundle"))
            .env("TT_FW_VERSION", "19.8.0")
            .env("TT_FW_READBACK", "19.8.0.0");
        for (k, v) in env {
            c.env(k, v);
        }
        c
    }

    /// Exit success, the report, the calls.
    fn flash(&self, env: &[(&str, &str)]) -> (bool, Report, Vec<String>) {
        let _ = std::fs::remove_file(self.path("calls.log"));
        let out = self.cmd("flash", env).output().expect("runs");
        let report = read_report(&self.path("termination-log"));
        let calls = std::fs::read_to_string(self.path("calls.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect();
        (out.status.success(), report, calls)
    }

    fn cards(&self) -> Vec<String> {
        serde_json::from_str(&std::fs::read_to_string(self.path("cards.json")).expect("cards"))
            .expect("json")
    }
}

fn read_report(p: &Path) -> Report {
    serde_json::from_str(&std::fs::read_to_string(p).expect("report written")).expect("report json")
}

#[test]
fn flashes_skips_then_forces() {
    let s = Sim::new(&["19.7.0.0", "19.7.0.0"]);
    let (ok, r, calls) = s.flash(&[]);
    assert!(ok, "{r:?}");
    assert_eq!(r.before, ["19.7.0.0", "19.7.0.0"]);
    assert_eq!(r.after, ["19.8.0.0", "19.8.0.0"]);
    assert!(!r.skipped && r.reason.is_none());
    assert_eq!(calls.len(), 3, "{calls:?}");
    assert!(
        calls[1].starts_with("tt-flash --no-color flash ") && calls[1].ends_with("fw.fwbundle")
    );
    assert_eq!(s.cards(), ["19.8.0.0", "19.8.0.0"]);

    // Again: every card reads the target.
    let (ok, r, calls) = s.flash(&[]);
    assert!(
        ok && r.skipped && r.after == ["19.8.0.0", "19.8.0.0"],
        "{r:?}"
    );
    assert_eq!(calls, ["tt-smi -s"]);

    // Force write: flashed anyway, with --force.
    let (ok, r, calls) = s.flash(&[("TT_FORCE_WRITE", "true")]);
    assert!(ok && !r.skipped, "{r:?}");
    assert!(calls[1].ends_with(" --force"), "{calls:?}");
}

#[test]
fn homogenize_rewrites_a_newer_card() {
    let s = Sim::new(&["19.9.0.0", "19.7.0.0"]);
    // Without it the simulated tt-flash leaves the newer card alone: mismatch.
    let (ok, r, _) = s.flash(&[]);
    assert!(!ok);
    assert_eq!(r.reason.as_deref(), Some("ReadbackMismatch"));
    assert_eq!(r.after, ["19.9.0.0", "19.8.0.0"]);
    assert!(
        r.message
            .unwrap_or_default()
            .contains("card 0 reads 19.9.0.0")
    );

    let (ok, r, calls) = s.flash(&[("TT_HOMOGENIZE_FIRMWARE_VERSIONS", "true")]);
    assert!(ok, "{r:?}");
    assert!(calls[1].ends_with(" --force"), "{calls:?}");
    assert_eq!(s.cards(), ["19.8.0.0", "19.8.0.0"]);
}

#[test]
fn failures_leave_a_report() {
    let s = Sim::new(&["19.7.0.0"]);
    s.touch("fail-flash");
    let (ok, r, _) = s.flash(&[]);
    assert!(!ok);
    assert_eq!(r.reason.as_deref(), Some("FlashJobFailed"));
    assert_eq!(r.before, ["19.7.0.0"]);
    std::fs::remove_file(s.path("fail-flash")).expect("rm");

    s.touch("config-space-reset");
    let (ok, r, _) = s.flash(&[]);
    assert!(
        !ok && r.reason.as_deref() == Some("FlashJobFailed"),
        "{r:?}"
    );
    assert!(r.message.unwrap_or_default().contains("Config space reset"));
    std::fs::remove_file(s.path("config-space-reset")).expect("rm");

    s.touch("stuck-version");
    let (ok, r, _) = s.flash(&[]);
    assert!(
        !ok && r.reason.as_deref() == Some("ReadbackMismatch"),
        "{r:?}"
    );
    assert_eq!(r.after, ["19.7.0.0"]);
}

#[test]
fn heal_and_readback_failures() {
    let s = Sim::new(&["19.7.0.0"]);
    // A Galaxy board: the heal is tt-smi -glx_reset, and it helps.
    let dev = s.path("sys/bus/pci/devices/0000:01:00.0");
    std::fs::create_dir_all(&dev).expect("mkdir");
    std::fs::write(dev.join("vendor"), "0x1e52\n").expect("vendor");
    std::fs::write(dev.join("subsystem_device"), "0x0047\n").expect("sub");
    s.touch("fail-readback-until-reset");
    let (ok, r, calls) = s.flash(&[]);
    assert!(ok, "{r:?}");
    assert_eq!(&calls[..3], ["tt-smi -s", "tt-smi -glx_reset", "tt-smi -s"]);

    // Readback never works: abort before tt-flash...
    let s = Sim::new(&["19.7.0.0"]);
    s.touch("fail-readback");
    let (ok, r, calls) = s.flash(&[]);
    assert!(
        !ok && r.reason.as_deref() == Some("FlashJobFailed"),
        "{r:?}"
    );
    assert_eq!(calls, ["tt-smi -s", "tt-smi -r", "tt-smi -s"]);
    // ...unless told to go on; then the readback after the flash fails too.
    let (ok, r, calls) = s.flash(&[("TT_CONTINUE_ON_READBACK_FAILURE", "true")]);
    assert!(
        !ok && r.reason.as_deref() == Some("FlashJobFailed"),
        "{r:?}"
    );
    assert!(calls.iter().any(|c| c.starts_with("tt-flash")), "{calls:?}");
    assert!(r.message.unwrap_or_default().contains("readback after"));
}

#[test]
fn missing_environment_is_a_reported_failure() {
    let s = Sim::new(&["19.7.0.0"]);
    let out = Command::new(BIN)
        .arg("flash")
        .env_clear()
        .env("TTDRV_FLASH_SIMULATE", s.dir.path())
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let r = read_report(&s.path("termination-log"));
    assert_eq!(r.reason.as_deref(), Some("FlashJobFailed"));
    assert!(r.message.unwrap_or_default().contains("TT_FW_BUNDLE_PATH"));
}

#[test]
fn simulated_fetch_writes_a_bundle_the_flash_reads() {
    let s = Sim::new(&["19.7.0.0"]);
    let bundle = s.path("dl/fw_pack-19.9.1.fwbundle");
    std::fs::create_dir_all(s.path("dl")).expect("mkdir");
    let url = "https://example.invalid/fw_pack-19.9.1.fwbundle";
    let env = [
        ("TT_FW_BUNDLE_URL", url),
        ("TT_FW_BUNDLE_PATH", bundle.to_str().expect("utf-8")),
        ("TT_FW_VERSION", "19.9.1"),
        ("TT_FW_READBACK", "19.9.1.0"),
    ];
    let out = s.cmd("fetch", &env).output().expect("runs");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        bundle::manifest_version(&std::fs::read(&bundle).expect("bundle")).as_deref(),
        Some("19.9.1")
    );
    let (ok, r, _) = s.flash(&env);
    assert!(ok && r.after == ["19.9.1.0"], "{r:?}");

    s.touch("fail-fetch");
    let out = s.cmd("fetch", &env).output().expect("runs");
    assert!(!out.status.success());
    let r = read_report(&s.path("termination-log"));
    assert!(r.message.clone().unwrap_or_default().contains(url), "{r:?}");
}

#[test]
fn a_bundle_with_another_sha256_is_refused_and_removed() {
    let s = Sim::new(&["19.7.0.0"]);
    let bundle = s.path("dl/fw_pack-19.9.1.fwbundle");
    std::fs::create_dir_all(s.path("dl")).expect("mkdir");
    let path = bundle.to_str().expect("utf-8");
    let base = [
        (
            "TT_FW_BUNDLE_URL",
            "https://example.invalid/fw_pack-19.9.1.fwbundle",
        ),
        ("TT_FW_BUNDLE_PATH", path),
        ("TT_FW_VERSION", "19.9.1"),
    ];
    // The simulated download's digest, as an operator would pin it.
    let out = s.cmd("fetch", &base).output().expect("runs");
    assert!(out.status.success(), "{out:?}");
    let bytes = std::fs::read(&bundle).expect("bundle");
    let sum = {
        use sha2::Digest;
        sha2::Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    let pinned = [
        base[0],
        base[1],
        base[2],
        ("TT_FW_BUNDLE_SHA256", sum.as_str()),
    ];
    let out = s.cmd("fetch", &pinned).output().expect("runs");
    assert!(out.status.success(), "the right digest: {out:?}");
    assert!(bundle.exists());
    let wrong = "f".repeat(64);
    let bad = [
        base[0],
        base[1],
        base[2],
        ("TT_FW_BUNDLE_SHA256", wrong.as_str()),
    ];
    let out = s.cmd("fetch", &bad).output().expect("runs");
    assert!(!out.status.success());
    let r = read_report(&s.path("termination-log"));
    assert_eq!(r.reason.as_deref(), Some("BundleChecksumMismatch"), "{r:?}");
    assert!(r.message.unwrap_or_default().contains(&sum));
    assert!(
        !bundle.exists(),
        "a refused bundle is not left for the flash"
    );
}

#[test]
fn report_goes_where_told() {
    let s = Sim::new(&["19.8.0.0"]);
    let elsewhere = s.path("elsewhere.json");
    let out = s
        .cmd("flash", &[])
        .arg("--report")
        .arg(&elsewhere)
        .output()
        .expect("runs");
    assert!(out.status.success());
    assert!(read_report(&elsewhere).skipped);
    assert!(!s.path("termination-log").exists());
}
