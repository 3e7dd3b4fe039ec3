//! `ttdrv-flash`: the firmware policy's flash Job (see the crate docs).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use ttdrv_api::firmware::flasher::{self, Report};
use ttdrv_api::firmware::reason;
use ttdrv_flasher::bundle;
use ttdrv_flasher::decide::{self, Switches, env_flag};
use ttdrv_flasher::host::RealHost;
use ttdrv_flasher::run::{self, FlashConfig};
use ttdrv_flasher::sim::{self, SimHost};

/// Flashes Tenstorrent card firmware (tt-flash) and checks it with tt-smi;
/// the program of the firmware policy's flash Job.
#[derive(Debug, Parser)]
#[command(name = "ttdrv-flash", version)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
    /// Act on a host simulated in this directory (see the crate docs),
    /// never on hardware, tt-smi, tt-flash or the network.
    #[arg(long, global = true, env = flasher::ENV_SIMULATE)]
    simulate: Option<PathBuf>,
    /// Where the JSON report goes [default: /dev/termination-log, or
    /// <simulate dir>/termination-log].
    #[arg(long, global = true, env = "TTDRV_FLASH_REPORT")]
    report: Option<PathBuf>,
    /// Log as JSON lines.
    #[arg(long, global = true, env = "TTDRV_LOG_JSON")]
    log_json: bool,
    /// Log at debug level (unless RUST_LOG says otherwise).
    #[arg(short, long, global = true)]
    verbose: bool,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Readback, heal, skip or tt-flash, readback; the report as JSON.
    Flash(FlashArgs),
    /// Download the bundle (the Job's init container), with curl.
    Fetch(FetchArgs),
}

#[derive(Debug, clap::Args)]
struct FlashArgs {
    /// The firmware bundle.
    #[arg(long, env = flasher::ENV_BUNDLE_PATH)]
    bundle: Option<PathBuf>,
    /// The bundle's version (the readback's default, with .0).
    #[arg(long = "fw-version", env = flasher::ENV_VERSION)]
    version: Option<String>,
    /// What every card must read back (tt-smi's fw_bundle_version).
    #[arg(long, env = flasher::ENV_READBACK)]
    readback: Option<String>,
    /// Extra tt-flash flags, whitespace-separated (e.g. --force).
    #[arg(long, env = flasher::ENV_FLASH_ARGS, allow_hyphen_values = true)]
    flash_args: Option<String>,
    /// Write even when every card reads the target (tt-flash --force): true|false.
    #[arg(long, env = flasher::ENV_FORCE_WRITE, value_name = "BOOL")]
    force_write: Option<String>,
    /// Flash even when the readback before the flash fails: true|false.
    #[arg(long, env = flasher::ENV_CONTINUE_ON_READBACK_FAILURE, value_name = "BOOL")]
    continue_on_readback_failure: Option<String>,
    /// --force when the cards read different versions from each other: true|false.
    #[arg(long, env = flasher::ENV_HOMOGENIZE, value_name = "BOOL")]
    homogenize_firmware_versions: Option<String>,
    /// tt-smi to run.
    #[arg(long, env = "TTDRV_TT_SMI", default_value = "tt-smi")]
    tt_smi: PathBuf,
    /// tt-flash to run.
    #[arg(long, env = "TTDRV_TT_FLASH", default_value = "tt-flash")]
    tt_flash: PathBuf,
}

#[derive(Debug, clap::Args)]
struct FetchArgs {
    /// Where to download from.
    #[arg(long, env = flasher::ENV_BUNDLE_URL)]
    url: Option<String>,
    /// Where the bundle goes.
    #[arg(long, env = flasher::ENV_BUNDLE_PATH)]
    bundle: Option<PathBuf>,
    /// The bundle's version (the simulated download's manifest).
    #[arg(long = "fw-version", env = flasher::ENV_VERSION)]
    version: Option<String>,
    /// The SHA-256 the download must have (empty: not checked).
    #[arg(long, env = flasher::ENV_BUNDLE_SHA256)]
    sha256: Option<String>,
    /// curl to run.
    #[arg(long, env = "TTDRV_CURL", default_value = "curl")]
    curl: PathBuf,
}

fn init_logging(json: bool, verbose: bool) {
    use tracing_subscriber::filter::{EnvFilter, LevelFilter};
    let level = if verbose {
        LevelFilter::DEBUG
    } else {
        LevelFilter::INFO
    };
    let filter = EnvFilter::builder()
        .with_default_directive(level.into())
        .from_env_lossy();
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi);
    match json {
        true => logs.json().with_writer(std::io::stderr).init(),
        false => logs.with_writer(std::io::stderr).init(),
    }
}

fn failed(message: String) -> Report {
    tracing::error!("{message}");
    Report {
        reason: Some(reason::FLASH_JOB_FAILED.to_string()),
        message: Some(decide::bounded(message)),
        ..Default::default()
    }
}

fn flash_config(a: &FlashArgs) -> Result<FlashConfig, String> {
    let bundle = a
        .bundle
        .clone()
        .filter(|b| !b.as_os_str().is_empty())
        .ok_or_else(|| {
            format!(
                "{} is not set: no bundle to flash",
                flasher::ENV_BUNDLE_PATH
            )
        })?;
    let target = decide::target(a.readback.as_deref(), a.version.as_deref()).ok_or_else(|| {
        format!(
            "neither {} nor {} is set: nothing to read back",
            flasher::ENV_READBACK,
            flasher::ENV_VERSION
        )
    })?;
    Ok(FlashConfig {
        bundle,
        target,
        switches: Switches {
            flash_args: a
                .flash_args
                .as_deref()
                .unwrap_or_default()
                .split_whitespace()
                .map(str::to_string)
                .collect(),
            force_write: env_flag(a.force_write.as_deref()),
            homogenize: env_flag(a.homogenize_firmware_versions.as_deref()),
        },
        continue_on_readback_failure: env_flag(a.continue_on_readback_failure.as_deref()),
    })
}

fn flash(a: &FlashArgs, simulate: Option<&Path>) -> Report {
    let cfg = match flash_config(a) {
        Ok(c) => c,
        Err(m) => return failed(m),
    };
    tracing::info!(bundle = %cfg.bundle.display(), target = %cfg.target, switches = ?cfg.switches,
        continue_on_readback_failure = cfg.continue_on_readback_failure, simulate = ?simulate, "flash");
    match simulate {
        Some(dir) => run::flash(&cfg, &mut SimHost::new(dir, a.version.clone())),
        None => run::flash(
            &cfg,
            &mut RealHost {
                tt_smi: a.tt_smi.clone(),
                tt_flash: a.tt_flash.clone(),
                root: PathBuf::from("/"),
            },
        ),
    }
}

fn fetch(a: &FetchArgs, simulate: Option<&Path>) -> Report {
    let (Some(url), Some(path)) = (
        a.url.as_deref().filter(|u| !u.is_empty()),
        a.bundle.as_deref().filter(|b| !b.as_os_str().is_empty()),
    ) else {
        return failed(format!(
            "{} and {} must both be set",
            flasher::ENV_BUNDLE_URL,
            flasher::ENV_BUNDLE_PATH
        ));
    };
    let res = match simulate {
        Some(dir) => match a.version.as_deref().filter(|v| !v.is_empty()) {
            Some(v) => SimHost::new(dir, None).fetch(url, path, v),
            None => Err(format!(
                "{} is not set: the simulated bundle needs a version",
                flasher::ENV_VERSION
            )),
        },
        None => run::fetch(&a.curl, url, path),
    };
    if let Err(m) = res {
        // The download failed: no card was touched.
        return Report {
            reason: Some(reason::BUNDLE_DOWNLOAD_FAILED.to_string()),
            ..failed(m)
        };
    }
    match a.sha256.as_deref().filter(|s| !s.is_empty()) {
        None => Report::default(),
        Some(want) => match bundle::check_sha256(path, want) {
            Ok(()) => Report::default(),
            Err(m) => {
                // A bundle that is not the one asked for never reaches a card.
                let _ = std::fs::remove_file(path);
                Report {
                    reason: Some(reason::BUNDLE_CHECKSUM_MISMATCH.to_string()),
                    ..failed(m)
                }
            }
        },
    }
}

fn write_report(path: &Path, report: &Report) {
    match serde_json::to_string(report) {
        Ok(json) => {
            tracing::info!(path = %path.display(), report = %json, "report");
            if let Err(e) = std::fs::write(path, json + "\n") {
                tracing::warn!(path = %path.display(), error = %e, "cannot write the report");
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot serialize the report"),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_json, cli.verbose);
    let simulate = cli
        .simulate
        .as_deref()
        .filter(|d| !d.as_os_str().is_empty());
    let report = match &cli.command {
        Cmd::Flash(a) => flash(a, simulate),
        Cmd::Fetch(a) => fetch(a, simulate),
    };
    let path = match (&cli.report, simulate) {
        (Some(p), _) => p.clone(),
        (None, Some(dir)) => dir.join(sim::REPORT),
        (None, None) => PathBuf::from(flasher::REPORT_PATH),
    };
    write_report(&path, &report);
    match report.reason {
        None => ExitCode::SUCCESS,
        Some(_) => ExitCode::FAILURE,
    }
}
