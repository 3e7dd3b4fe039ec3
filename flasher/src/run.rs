//! One flash run: readback, heal, skip or flash, readback; and the fetch.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use ttdrv_api::firmware::flasher::Report;
use ttdrv_api::firmware::reason;

use crate::decide::{self, Plan, Switches};
use crate::host::{Host, Output};

/// How long the heal waits after the reset before reading back again.
pub const HEAL_WAIT: Duration = Duration::from_secs(5);

/// What one flash run is asked to do (the Job's environment).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlashConfig {
    /// `TT_FW_BUNDLE_PATH`.
    pub bundle: PathBuf,
    /// What every card must read back (`TT_FW_READBACK`).
    pub target: String,
    pub switches: Switches,
    /// `TT_CONTINUE_ON_READBACK_FAILURE`.
    pub continue_on_readback_failure: bool,
}

fn log_output(what: &str, o: &Output) {
    // tt-smi prints its errors on stdout: show both streams.
    tracing::warn!(status = %o.status, stdout = %o.stdout.trim_end(), stderr = %o.stderr.trim_end(), "{what} failed");
}

/// `tt-smi -s`: each card's version, or why not.
pub fn readback(host: &mut dyn Host) -> Result<Vec<String>, String> {
    let o = host.tt_smi(&["-s"]);
    if !o.ok {
        log_output("tt-smi -s", &o);
        let first = o
            .stdout
            .lines()
            .chain(o.stderr.lines())
            .map(decide::plain)
            .find(|l| !l.is_empty())
            .unwrap_or_else(|| "no output".to_string());
        return Err(format!("tt-smi -s failed ({}): {first}", o.status));
    }
    decide::parse_snapshot(&o.stdout).map_err(|e| {
        log_output("reading tt-smi -s's snapshot", &o);
        e.to_string()
    })
}

fn failure(before: Vec<String>, after: Vec<String>, why: &str, message: String) -> Report {
    tracing::error!(reason = why, "{message}");
    Report {
        before,
        after,
        skipped: false,
        reason: Some(why.to_string()),
        message: Some(decide::bounded(message)),
    }
}

/// The readback before the flash, with one heal cycle (reset, wait, read
/// again) when it fails. `Ok(None)`: it failed and the run goes on.
fn readback_before(cfg: &FlashConfig, host: &mut dyn Host) -> Result<Option<Vec<String>>, String> {
    let first = match readback(host) {
        Ok(v) => return Ok(Some(v)),
        Err(e) => e,
    };
    let heal = decide::heal_for(
        host.pci_devices()
            .iter()
            .map(|(v, s)| (v.as_str(), s.as_str())),
    );
    let args = heal.tt_smi_args();
    tracing::warn!(error = %first, ?heal, "readback before the flash failed: resetting the cards (tt-smi {}) and reading back again", args.join(" "));
    let o = host.tt_smi(args);
    if o.ok {
        tracing::info!(output = %o.stdout.trim_end(), "tt-smi {} done", args.join(" "));
    } else {
        log_output(&format!("tt-smi {}", args.join(" ")), &o);
    }
    host.sleep(HEAL_WAIT);
    match readback(host) {
        Ok(v) => Ok(Some(v)),
        Err(e) if cfg.continue_on_readback_failure => {
            tracing::warn!(error = %e, "readback before the flash still fails after the reset; flashing anyway (continue on readback failure)");
            Ok(None)
        }
        Err(e) => Err(format!(
            "readback before the flash failed, and again after tt-smi {}: {e} (set continueOnReadbackFailure to flash anyway)",
            args.join(" ")
        )),
    }
}

/// The flash run. Never panics on what the host says; the report's
/// `reason` is set exactly when the run failed.
pub fn flash(cfg: &FlashConfig, host: &mut dyn Host) -> Report {
    let before = match readback_before(cfg, host) {
        Ok(b) => b,
        Err(m) => return failure(vec![], vec![], reason::FLASH_JOB_FAILED, m),
    };
    if let Some(b) = &before {
        tracing::info!(cards = ?b, target = %cfg.target, "firmware before the flash");
    }
    let before_list = before.clone().unwrap_or_default();
    let args = match decide::plan(before.as_deref(), &cfg.target, &cfg.switches) {
        Plan::Skip => {
            tracing::info!(target = %cfg.target, "every card already reads the target: nothing to write");
            return Report {
                after: before_list.clone(),
                before: before_list,
                skipped: true,
                reason: None,
                message: None,
            };
        }
        Plan::Flash { args } => args,
    };
    if !cfg.bundle.is_file() {
        return failure(
            before_list,
            vec![],
            reason::FLASH_JOB_FAILED,
            format!(
                "the firmware bundle {} is not there (did the fetch run?)",
                cfg.bundle.display()
            ),
        );
    }
    let mut cmd = vec![
        "--no-color".to_string(),
        "flash".to_string(),
        cfg.bundle.display().to_string(),
    ];
    cmd.extend(args);
    tracing::info!(args = %cmd.join(" "), "running tt-flash");
    let o = host.tt_flash(&cmd);
    if let Err(m) = decide::flash_outcome(o.ok, &o.status, &o.stdout) {
        return failure(before_list, vec![], reason::FLASH_JOB_FAILED, m);
    }
    let after = match readback(host) {
        Ok(a) => a,
        Err(e) => {
            return failure(
                before_list,
                vec![],
                reason::FLASH_JOB_FAILED,
                format!("tt-flash succeeded but the readback after it failed: {e}"),
            );
        }
    };
    tracing::info!(cards = ?after, "firmware after the flash");
    if let Err(m) = decide::check_after(&after, &cfg.target) {
        return failure(before_list, after, reason::READBACK_MISMATCH, m);
    }
    Report {
        before: before_list,
        after,
        skipped: false,
        reason: None,
        message: None,
    }
}

/// Downloads `url` to `path` with curl (`-fsSL --retry 3`), through
/// `<path>.part` so a half download is never taken for the bundle.
pub fn fetch(curl: &Path, url: &str, path: &Path) -> Result<(), String> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let mut part = path.as_os_str().to_owned();
    part.push(".part");
    let part = PathBuf::from(part);
    tracing::info!(url, path = %path.display(), "downloading the firmware bundle");
    let o = Command::new(curl)
        .args(["-fsSL", "--retry", "3", "-o"])
        .arg(&part)
        .arg(url)
        .output()
        .map_err(|e| format!("could not run {}: {e}", curl.display()))?;
    if !o.status.success() {
        let _ = std::fs::remove_file(&part);
        let err = String::from_utf8_lossy(&o.stderr);
        return Err(format!(
            "download of {url} failed ({}): {}",
            o.status,
            err.trim()
        ));
    }
    std::fs::rename(&part, path)
        .map_err(|e| format!("cannot move {} to {}: {e}", part.display(), path.display()))?;
    let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    tracing::info!(path = %path.display(), bytes = size, "firmware bundle downloaded");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// A scripted host: canned answers, and what was asked.
    #[derive(Default)]
    struct Fake {
        snapshots: VecDeque<Output>,
        flash: Output,
        devices: Vec<(String, String)>,
        calls: Vec<String>,
        slept: Duration,
    }

    fn snap(versions: &[&str]) -> Output {
        let devs: Vec<_> = versions
            .iter()
            .map(|v| serde_json::json!({"firmwares": {"fw_bundle_version": v}}))
            .collect();
        Output {
            ok: true,
            status: "exit status: 0".into(),
            stdout: serde_json::json!({"device_info": devs}).to_string(),
            stderr: String::new(),
        }
    }

    fn broken() -> Output {
        Output {
            ok: false,
            status: "exit status: 1".into(),
            stdout: "Error: chip timeout\n".into(),
            stderr: String::new(),
        }
    }

    fn ok() -> Output {
        Output {
            ok: true,
            status: "exit status: 0".into(),
            ..Default::default()
        }
    }

    impl Host for Fake {
        fn tt_smi(&mut self, args: &[&str]) -> Output {
            self.calls.push(format!("tt-smi {}", args.join(" ")));
            if args == ["-s"] {
                self.snapshots.pop_front().unwrap_or_else(broken)
            } else {
                ok()
            }
        }
        fn tt_flash(&mut self, args: &[String]) -> Output {
            self.calls.push(format!("tt-flash {}", args.join(" ")));
            self.flash.clone()
        }
        fn pci_devices(&self) -> Vec<(String, String)> {
            self.devices.clone()
        }
        fn sleep(&mut self, d: Duration) {
            self.slept += d;
        }
    }

    const T: &str = "19.8.0.0";

    fn cfg(dir: &Path) -> FlashConfig {
        let bundle = dir.join("fw.fwbundle");
        std::fs::write(&bundle, b"bundle").expect("write");
        FlashConfig {
            bundle,
            target: T.into(),
            switches: Switches::default(),
            continue_on_readback_failure: false,
        }
    }

    fn strs(xs: &[&str]) -> Vec<String> {
        xs.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn flashes_then_reads_back() {
        let d = tempfile::tempdir().expect("tempdir");
        let c = cfg(d.path());
        let mut h = Fake {
            snapshots: [snap(&["19.7.0.0"]), snap(&[T])].into(),
            flash: ok(),
            ..Default::default()
        };
        let r = flash(&c, &mut h);
        assert_eq!(r.reason, None, "{r:?}");
        assert_eq!(
            (r.before, r.after, r.skipped),
            (strs(&["19.7.0.0"]), strs(&[T]), false)
        );
        assert_eq!(
            h.calls,
            [
                "tt-smi -s".to_string(),
                format!("tt-flash --no-color flash {}", c.bundle.display()),
                "tt-smi -s".to_string()
            ]
        );
    }

    #[test]
    fn skips_up_to_date_cards() {
        let d = tempfile::tempdir().expect("tempdir");
        let mut h = Fake {
            snapshots: [snap(&[T, T])].into(),
            ..Default::default()
        };
        let r = flash(&cfg(d.path()), &mut h);
        assert!(
            r.skipped && r.reason.is_none() && r.after == strs(&[T, T]),
            "{r:?}"
        );
        assert_eq!(h.calls, ["tt-smi -s"]);
    }

    #[test]
    fn heals_a_galaxy_with_the_galaxy_reset() {
        let d = tempfile::tempdir().expect("tempdir");
        let mut h = Fake {
            snapshots: [broken(), snap(&["19.7.0.0"]), snap(&[T])].into(),
            flash: ok(),
            devices: vec![("0x1e52".into(), "0x0047".into())],
            ..Default::default()
        };
        let r = flash(&cfg(d.path()), &mut h);
        assert!(r.reason.is_none(), "{r:?}");
        assert_eq!(
            &h.calls[..3],
            ["tt-smi -s", "tt-smi -glx_reset", "tt-smi -s"]
        );
        assert_eq!(h.slept, HEAL_WAIT);
    }

    #[test]
    fn aborts_when_the_heal_does_not_help() {
        let d = tempfile::tempdir().expect("tempdir");
        let mut h = Fake {
            devices: vec![("0x1e52".into(), "0x0040".into())],
            ..Default::default()
        };
        let r = flash(&cfg(d.path()), &mut h);
        assert_eq!(r.reason.as_deref(), Some(reason::FLASH_JOB_FAILED));
        let m = r.message.unwrap_or_default();
        assert!(m.contains("tt-smi -r") && m.contains("chip timeout"), "{m}");
        assert_eq!(h.calls, ["tt-smi -s", "tt-smi -r", "tt-smi -s"]);
    }

    #[test]
    fn continues_on_readback_failure_when_told() {
        let d = tempfile::tempdir().expect("tempdir");
        let mut c = cfg(d.path());
        c.continue_on_readback_failure = true;
        c.switches.homogenize = true;
        let mut h = Fake {
            snapshots: [broken(), broken(), snap(&[T])].into(),
            flash: ok(),
            ..Default::default()
        };
        let r = flash(&c, &mut h);
        assert!(r.reason.is_none() && r.before.is_empty(), "{r:?}");
        // No versions known: nothing to homogenize, no --force.
        assert!(h.calls[3].ends_with("fw.fwbundle"), "{:?}", h.calls);
    }

    #[test]
    fn homogenize_and_force_write_pass_force() {
        let d = tempfile::tempdir().expect("tempdir");
        let mut c = cfg(d.path());
        c.switches.homogenize = true;
        let mut h = Fake {
            snapshots: [snap(&["19.9.0.0", T]), snap(&[T, T])].into(),
            flash: ok(),
            ..Default::default()
        };
        assert!(flash(&c, &mut h).reason.is_none());
        assert!(h.calls[1].ends_with(" --force"), "{:?}", h.calls);

        let mut c = cfg(d.path());
        c.switches.force_write = true;
        c.switches.flash_args = strs(&["--skip-missing-fw"]);
        let mut h = Fake {
            snapshots: [snap(&[T]), snap(&[T])].into(),
            flash: ok(),
            ..Default::default()
        };
        let r = flash(&c, &mut h);
        assert!(!r.skipped && r.reason.is_none(), "{r:?}");
        assert!(
            h.calls[1].ends_with(" --skip-missing-fw --force"),
            "{:?}",
            h.calls
        );
    }

    #[test]
    fn flash_failures() {
        let d = tempfile::tempdir().expect("tempdir");
        let mut h = Fake {
            snapshots: [snap(&["19.7.0.0"])].into(),
            flash: broken(),
            ..Default::default()
        };
        let r = flash(&cfg(d.path()), &mut h);
        assert_eq!(r.reason.as_deref(), Some(reason::FLASH_JOB_FAILED));
        assert_eq!(r.before, strs(&["19.7.0.0"]));

        let mut h = Fake {
            snapshots: [snap(&["19.7.0.0"]), snap(&[T])].into(),
            flash: Output {
                stdout: "Config space reset not completed for device 1\n".into(),
                ..ok()
            },
            ..Default::default()
        };
        let r = flash(&cfg(d.path()), &mut h);
        assert_eq!(r.reason.as_deref(), Some(reason::FLASH_JOB_FAILED));
        assert!(r.message.unwrap_or_default().contains("device 1"));
    }

    #[test]
    fn mismatch_after_the_flash() {
        let d = tempfile::tempdir().expect("tempdir");
        let mut h = Fake {
            snapshots: [snap(&["19.7.0.0", "19.7.0.0"]), snap(&[T, "19.7.0.0"])].into(),
            flash: ok(),
            ..Default::default()
        };
        let r = flash(&cfg(d.path()), &mut h);
        assert_eq!(r.reason.as_deref(), Some(reason::READBACK_MISMATCH));
        assert_eq!(r.after, strs(&[T, "19.7.0.0"]));
        assert!(
            r.message
                .unwrap_or_default()
                .contains("card 1 reads 19.7.0.0")
        );

        // No readback at all after the flash.
        let mut h = Fake {
            snapshots: [snap(&["19.7.0.0"])].into(),
            flash: ok(),
            ..Default::default()
        };
        let r = flash(&cfg(d.path()), &mut h);
        assert_eq!(r.reason.as_deref(), Some(reason::FLASH_JOB_FAILED));
        assert!(r.message.unwrap_or_default().contains("readback after"));
    }

    #[test]
    fn missing_bundle_is_a_failure_before_tt_flash() {
        let d = tempfile::tempdir().expect("tempdir");
        let mut c = cfg(d.path());
        c.bundle = d.path().join("absent");
        let mut h = Fake {
            snapshots: [snap(&["19.7.0.0"])].into(),
            ..Default::default()
        };
        let r = flash(&c, &mut h);
        assert_eq!(r.reason.as_deref(), Some(reason::FLASH_JOB_FAILED));
        assert!(!h.calls.iter().any(|c| c.starts_with("tt-flash")));
    }

    #[test]
    fn fetch_reports_curl_failures() {
        let d = tempfile::tempdir().expect("tempdir");
        let target = d.path().join("sub/fw.fwbundle");
        // /bin/false as curl: fails, leaves nothing behind.
        let e = fetch(
            Path::new("/bin/false"),
            "https://example.invalid/x",
            &target,
        )
        .expect_err("fails");
        assert!(
            e.contains("download of https://example.invalid/x failed"),
            "{e}"
        );
        assert!(!target.exists());
        let e = fetch(Path::new("/nonexistent/curl"), "https://x", &target).expect_err("fails");
        assert!(e.contains("could not run"), "{e}");
    }
}
