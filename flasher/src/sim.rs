//! The simulated host of `TTDRV_FLASH_SIMULATE=<dir>` (layout in the crate
//! docs): tt-smi and tt-flash are answered from files in `<dir>`, sysfs is
//! `<dir>/sys`, and nothing waits.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::bundle;
use crate::decide::{FORCE, readback_of_bundle};
use crate::host::{Host, Output};

/// Each card's `fw_bundle_version`, a JSON list of strings.
pub const CARDS: &str = "cards.json";
/// Every command the host ran, one line each (`tt-smi -s`, `tt-flash ...`).
pub const CALLS: &str = "calls.log";
/// The report, unless `--report` says otherwise.
pub const REPORT: &str = "termination-log";
/// Present: every `tt-smi -s` fails.
pub const FAIL_READBACK: &str = "fail-readback";
/// Present: `tt-smi -s` fails until a reset (`-r`/`-glx_reset`) removes it.
pub const FAIL_READBACK_UNTIL_RESET: &str = "fail-readback-until-reset";
/// Present: resets fail (exit 1), and leave everything as it was.
pub const FAIL_RESET: &str = "fail-reset";
/// Present: tt-flash fails (exit 1) and writes nothing.
pub const FAIL_FLASH: &str = "fail-flash";
/// Present: tt-flash exits 0 but prints the config-space reset failure.
pub const CONFIG_SPACE_RESET: &str = "config-space-reset";
/// Present: tt-flash succeeds but the cards keep their old version.
pub const STUCK_VERSION: &str = "stuck-version";
/// Present: `fetch` fails.
pub const FAIL_FETCH: &str = "fail-fetch";

/// A host simulated in a directory.
#[derive(Clone, Debug)]
pub struct SimHost {
    pub dir: PathBuf,
    /// The version a bundle without a readable manifest flashes
    /// (`TT_FW_VERSION`).
    pub fallback_version: Option<String>,
}

fn failed(stdout: String) -> Output {
    Output {
        ok: false,
        status: "exit status: 1".into(),
        stdout,
        stderr: String::new(),
    }
}

fn succeeded(stdout: String) -> Output {
    Output {
        ok: true,
        status: "exit status: 0".into(),
        stdout,
        stderr: String::new(),
    }
}

/// Dotted decimal, for tt-flash's "newer than the bundle" check; parts that
/// are not numbers compare as 0.
fn version_key(v: &str) -> Vec<u64> {
    v.split('.').map(|p| p.parse().unwrap_or(0)).collect()
}

impl SimHost {
    pub fn new(dir: impl Into<PathBuf>, fallback_version: Option<String>) -> Self {
        SimHost {
            dir: dir.into(),
            fallback_version,
        }
    }

    fn has(&self, name: &str) -> bool {
        self.dir.join(name).exists()
    }

    /// Appends one line to `calls.log` (best effort: the log is for tests).
    pub fn record(&self, line: &str) {
        let res = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(CALLS))
            .and_then(|mut f| writeln!(f, "{line}"));
        if let Err(e) = res {
            tracing::warn!(error = %e, "simulate: cannot append to {CALLS}");
        }
    }

    /// The cards' versions, or why they cannot be read.
    pub fn cards(&self) -> Result<Vec<String>, String> {
        let p = self.dir.join(CARDS);
        let text = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        serde_json::from_str(&text)
            .map_err(|e| format!("{}: not a JSON list of versions: {e}", p.display()))
    }

    fn write_cards(&self, cards: &[String]) -> Result<(), String> {
        let p = self.dir.join(CARDS);
        let text = serde_json::to_string(cards).map_err(|e| e.to_string())?;
        std::fs::write(&p, text + "\n").map_err(|e| format!("{}: {e}", p.display()))
    }

    fn snapshot(&self) -> Output {
        if self.has(FAIL_READBACK) || self.has(FAIL_READBACK_UNTIL_RESET) {
            // tt-smi prints its errors on stdout.
            return failed("Error: simulated tt-smi failure: chip not responding\n".into());
        }
        match self.cards() {
            Ok(cards) => {
                let devices: Vec<_> = cards
                    .iter()
                    .enumerate()
                    .map(|(i, v)| {
                        serde_json::json!({
                            "board_info": {"bus_id": format!("0000:{:02x}:00.0", i + 1)},
                            "firmwares": {"fw_bundle_version": v},
                        })
                    })
                    .collect();
                let snap =
                    serde_json::json!({"host_info": {"simulated": true}, "device_info": devices});
                succeeded(format!("{snap:#}\n"))
            }
            Err(e) => failed(format!("Error: simulated tt-smi: {e}\n")),
        }
    }

    fn reset(&self) -> Output {
        if self.has(FAIL_RESET) {
            return failed("Error: simulated reset failure\n".into());
        }
        let p = self.dir.join(FAIL_READBACK_UNTIL_RESET);
        if p.exists()
            && let Err(e) = std::fs::remove_file(&p)
        {
            return failed(format!("Error: simulated reset: {}: {e}\n", p.display()));
        }
        succeeded("Resetting devices (simulated)\nFinished reset\n".into())
    }

    /// tt-flash `[--no-color] flash <bundle> [flags]`.
    fn flash(&self, args: &[String]) -> Output {
        let mut rest = args
            .iter()
            .skip_while(|a| *a == "--no-color" || *a == "--no-tty");
        if rest.next().map(String::as_str) != Some("flash") {
            return failed(format!(
                "Error: simulated tt-flash: unknown arguments {args:?}\n"
            ));
        }
        let rest: Vec<&String> = rest.collect();
        let force = rest.iter().any(|a| *a == FORCE);
        let Some(bundle) = rest.iter().find(|a| !a.starts_with('-')) else {
            return failed("Error: one of the following arguments are required: fwbundle\n".into());
        };
        if self.has(FAIL_FLASH) {
            return failed("Stage: FLASH\nError: simulated flash failure\n".into());
        }
        let version = match std::fs::read(bundle) {
            Ok(bytes) => bundle::manifest_version(&bytes).or_else(|| self.fallback_version.clone()),
            Err(e) => return failed(format!("Opening of {bundle} failed with - {e}\n")),
        };
        let Some(version) = version else {
            return failed(format!(
                "Error: could not find version in {bundle}/manifest.json\n"
            ));
        };
        let target = readback_of_bundle(&version);
        let cards = match self.cards() {
            Ok(c) => c,
            Err(e) => return failed(format!("Error: simulated tt-flash: {e}\n")),
        };
        let mut log = format!("Stage: SETUP\nBundle version {version}\nStage: FLASH\n");
        if self.has(CONFIG_SPACE_RESET) {
            log += "Config space reset not completed for device 0\n";
            return succeeded(log);
        }
        let flashed: Vec<String> = cards
            .iter()
            .enumerate()
            .map(|(i, cur)| {
                // Without --force tt-flash leaves a card newer than the bundle alone.
                if !force && version_key(cur) > version_key(&target) {
                    log += &format!(
                        "Sim card {i}: {cur} is newer than {target}, skipped (no --force)\n"
                    );
                    cur.clone()
                } else {
                    log += &format!("Sim card {i}: {cur} -> {target}\n");
                    target.clone()
                }
            })
            .collect();
        if self.has(STUCK_VERSION) {
            log += "Stage: DONE (the simulated cards keep their version: stuck-version)\n";
            return succeeded(log);
        }
        if let Err(e) = self.write_cards(&flashed) {
            return failed(format!("{log}Error: {e}\n"));
        }
        log += "Stage: DONE\n";
        succeeded(log)
    }

    /// The `fetch` of the simulated host: a bundle whose manifest names
    /// `version`, written to `path`, without the network.
    pub fn fetch(&self, url: &str, path: &Path, version: &str) -> Result<(), String> {
        self.record(&format!("fetch {url} {}", path.display()));
        if self.has(FAIL_FETCH) {
            return Err(format!("simulated download failure of {url}"));
        }
        std::fs::write(path, bundle::with_manifest(version))
            .map_err(|e| format!("{}: {e}", path.display()))
    }
}

impl Host for SimHost {
    fn tt_smi(&mut self, args: &[&str]) -> Output {
        self.record(&format!("tt-smi {}", args.join(" ")));
        match args {
            ["-s"] => self.snapshot(),
            ["-r"] | ["-glx_reset"] => self.reset(),
            _ => failed(format!(
                "Error: simulated tt-smi: unknown arguments {args:?}\n"
            )),
        }
    }

    fn tt_flash(&mut self, args: &[String]) -> Output {
        self.record(&format!("tt-flash {}", args.join(" ")));
        let out = self.flash(args);
        print!("{}", out.stdout);
        out
    }

    fn pci_devices(&self) -> Vec<(String, String)> {
        crate::host::pci_devices(&self.dir)
    }

    fn sleep(&mut self, d: Duration) {
        tracing::debug!(?d, "simulate: not waiting");
    }
}
