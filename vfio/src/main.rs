//! `ttdrv-vfio-manage`: binds the configured Tenstorrent PCI functions to
//! vfio-pci on a timer and when a function appears, reports them on the
//! Node, and on SIGTERM/SIGINT can put them back. Flags and defaults are
//! the Go operator's `vfio-manage`'s, so the chart renders the same args.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use tokio::signal::unix::{SignalKind, signal};
use ttdrv_agent::HostRoot;
use ttdrv_api::vfio::VFIO_PCI_DRIVER;
use ttdrv_vfio::binder::{Binder, Options, PassOutcome};
use ttdrv_vfio::config::Config;
use ttdrv_vfio::metrics::{self, Metrics};
use ttdrv_vfio::node::NodeReporter;
use ttdrv_vfio::state::StateStore;
use ttdrv_vfio::sysfs::{DMA_ENTRY_LIMIT, Sysfs};
use ttdrv_vfio::{Result, VfioError};

/// Binds Tenstorrent PCI functions to vfio-pci for VM passthrough.
#[derive(Debug, Parser)]
#[command(name = "ttdrv-vfio-manage", version)]
struct Cli {
    /// The device list (YAML: devices: [{resourceName, vendorId, deviceId: [..], locality}]).
    #[arg(long, default_value = "/etc/tt-vfio/config.yaml")]
    config: PathBuf,
    /// How often to re-assert the binding (Go duration: 30s, 1m, 500ms).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    bind_interval: Duration,
    /// On SIGTERM/SIGINT (or after the pass with --once), put the functions
    /// the binder moved back on their original driver.
    #[arg(long)]
    restore_on_exit: bool,
    /// Address of /metrics and /healthz (Go's form, `:9401`); empty disables.
    #[arg(long, default_value = ":9401")]
    metrics_addr: String,
    /// Offer each function to this PCI driver before vfio-pci (a stub that
    /// flags it to ignore PCIe hotplug and declines); empty disables.
    #[arg(long, default_value = "")]
    hotplug_stub_driver: String,
    /// Set vfio_iommu_type1's dma_entry_limit; 0 leaves it alone.
    #[arg(long, default_value_t = 0)]
    dma_entry_limit: u64,
    /// Host directory of the binder's state (original drivers, identities);
    /// empty keeps it in memory only.
    #[arg(long, env = "TTDRV_VFIO_STATE_DIR", default_value = "/var/lib/tt-vfio")]
    state_dir: String,
    /// Allow vfio's unsafe no-IOMMU mode for functions without an IOMMU group.
    #[arg(long)]
    noiommu: bool,
    /// One pass (then the restore with --restore-on-exit), then exit; the
    /// exit status is 1 when a bind or restore failed.
    #[arg(long)]
    once: bool,
    /// Where the host's root is mounted; host paths (sys/ included) resolve under it.
    #[arg(long, env = "TTDRV_HOST_ROOT", default_value = "/")]
    host_root: PathBuf,
    /// The Node to report on.
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// Do not report on the Node (no cluster: tests, a VM).
    #[arg(long, env = "TTDRV_VFIO_NO_NODE_REPORT")]
    no_node_report: bool,
    /// Log as JSON lines.
    #[arg(long, env = "TTDRV_LOG_JSON")]
    log_json: bool,
    /// Log at debug level (unless RUST_LOG says otherwise).
    #[arg(short, long)]
    verbose: bool,
}

/// A Go duration: one or more `<number><unit>`, unit ns, us, µs, ms, s, m, h.
fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    let bad = || format!("{s:?} is not a duration like 30s, 1m30s or 500ms");
    let mut rest = s.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let value: f64 = rest[..n].parse().map_err(|_| bad())?;
        rest = &rest[n..];
        let u = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = match &rest[..u] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += value * unit;
        rest = &rest[u..];
    }
    if total <= 0.0 || !total.is_finite() {
        return Err(format!("{s:?}: the interval must be positive"));
    }
    Duration::try_from_secs_f64(total).map_err(|_| bad())
}

/// Logs on stderr at `info` unless RUST_LOG says otherwise (a directive it
/// cannot read is skipped, not fatal); JSON lines with --log-json.
fn init_logs(json: bool, verbose: bool) {
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

/// The node reporter, when there is a node to report on.
async fn reporter(cli: &Cli) -> Option<NodeReporter> {
    if cli.no_node_report {
        return None;
    }
    let Some(node) = cli.node_name.clone().filter(|n| !n.is_empty()) else {
        tracing::warn!("NODE_NAME is not set: not reporting on any node");
        return None;
    };
    match NodeReporter::connect(node).await {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::warn!(error = %e, "not reporting on the node");
            None
        }
    }
}

async fn publish(reporter: &mut Option<NodeReporter>, out: &PassOutcome) {
    if let Some(r) = reporter
        && let Err(e) = r
            .report((out.report.to_annotation(), out.board_types.clone()))
            .await
    {
        tracing::warn!(error = %e, "node report failed; retried after the next pass");
    }
}

fn run_pass(binder: &mut Binder) -> Option<PassOutcome> {
    match binder.pass() {
        Ok(out) => {
            tracing::debug!(
                bound = out.bound.len(),
                on_vfio = out.on_vfio,
                errors = out.errors,
                "pass done"
            );
            Some(out)
        }
        Err(e) => {
            tracing::error!(error = %e, "bind pass failed");
            None
        }
    }
}

fn restore(binder: &mut Binder) -> u32 {
    match binder.restore() {
        Ok(r) => r.errors,
        Err(e) => {
            tracing::error!(error = %e, "restore failed");
            1
        }
    }
}

async fn run(cli: Cli) -> Result<ExitCode> {
    let config = Config::load(&cli.config)?;
    for g in &config.devices {
        tracing::info!(resource = %g.resource_name, vendor = format!("{:04x}", g.vendor_id),
            devices = ?g.device_ids.iter().map(|d| format!("{d:04x}")).collect::<Vec<_>>(), locality = ?g.locality, "config");
    }
    let root = HostRoot::new(&cli.host_root);
    let sysfs = Sysfs::new(root.clone());
    if !sysfs.driver_exists(VFIO_PCI_DRIVER) {
        tracing::info!("vfio-pci is not registered: loaded when a function is to be bound");
    }
    if cli.dma_entry_limit > 0 {
        if root.read_small(DMA_ENTRY_LIMIT)?.is_none() {
            sysfs.modprobe("vfio_iommu_type1")?;
        }
        sysfs.write(DMA_ENTRY_LIMIT, &cli.dma_entry_limit.to_string())?;
        tracing::info!(limit = cli.dma_entry_limit, "dma_entry_limit set");
    }
    let stub = Some(cli.hotplug_stub_driver.clone()).filter(|s| !s.is_empty());
    if let Some(s) = &stub {
        // Fail fast: binding without the stub looks like the device vanishing.
        if !sysfs.driver_exists(s) {
            return Err(VfioError::DriverMissing {
                driver: s.clone(),
                hint: ": the hotplug stub is not loaded (check the hotplug-stub initContainer's log)",
            });
        }
        tracing::info!(stub = %s, "offering each function to the hotplug stub before vfio-pci");
    }
    if sysfs.noiommu_mode()? == Some(true) {
        tracing::warn!("vfio is in unsafe no-IOMMU mode (enable_unsafe_noiommu_mode=Y)");
    }
    let metrics = Arc::new(Metrics::new());
    if !cli.metrics_addr.is_empty() {
        let listener = metrics::bind(&cli.metrics_addr).await?;
        tracing::info!(addr = %cli.metrics_addr, "serving /metrics and /healthz");
        tokio::spawn(metrics::serve(listener, metrics.clone()));
    }
    let store = Some(cli.state_dir.clone())
        .filter(|s| !s.is_empty())
        .map(|d| StateStore::new(root, d));
    let options = Options {
        allow_noiommu: cli.noiommu,
        hotplug_stub: stub,
    };
    let mut binder = Binder::new(sysfs.clone(), config, options, store, metrics)?;
    let mut reporter = reporter(&cli).await;

    if cli.once {
        let out = run_pass(&mut binder);
        if let Some(o) = &out {
            publish(&mut reporter, o).await;
        }
        let mut failed = out.is_none_or(|o| o.errors > 0);
        if cli.restore_on_exit {
            failed |= restore(&mut binder) > 0;
        }
        return Ok(if failed {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        });
    }

    let mut term = signal(SignalKind::terminate()).map_err(VfioError::Signal)?;
    let mut tick = tokio::time::interval(cli.bind_interval);
    let mut poll = tokio::time::interval(Duration::from_secs(1));
    let mut count = sysfs.device_count().ok();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = poll.tick() => {
                // A new (or removed) function: pass now, not at the next tick.
                let now = sysfs.device_count().ok();
                if now == count { continue; }
                tracing::info!(before = ?count, now = ?now, "PCI functions changed");
                count = now;
            }
            _ = term.recv() => { tracing::info!("SIGTERM"); break; }
            _ = tokio::signal::ctrl_c() => { tracing::info!("SIGINT"); break; }
        }
        if let Some(o) = run_pass(&mut binder) {
            publish(&mut reporter, &o).await;
        }
    }
    if cli.restore_on_exit {
        restore(&mut binder);
    }
    tracing::info!("exited");
    Ok(ExitCode::SUCCESS)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logs(cli.log_json, cli.verbose);
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        "ttdrv-vfio-manage starting"
    );
    match run(cli).await {
        Ok(code) => code,
        Err(e) => {
            tracing::error!(error = %e, "ttdrv-vfio-manage failed");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[test]
    fn go_durations_parse() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5h"), Ok(Duration::from_secs(5400)));
        for bad in ["", "30", "s", "1d", "-1s", "0s", "1m x"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn gos_args_parse() {
        let cli = Cli::try_parse_from([
            "ttdrv-vfio-manage",
            "--config",
            "/c.yaml",
            "--bind-interval",
            "1m",
            "--restore-on-exit",
            "--metrics-addr",
            "",
            "--hotplug-stub-driver",
            "tenstorrent-simple",
            "--dma-entry-limit",
            "524288",
        ])
        .expect("Go's flags");
        assert_eq!(cli.bind_interval, Duration::from_secs(60));
        assert!(cli.restore_on_exit && cli.metrics_addr.is_empty());
        assert_eq!(cli.dma_entry_limit, 524288);
        let d = Cli::try_parse_from(["ttdrv-vfio-manage"]).expect("defaults");
        assert!(!d.verbose && !d.noiommu);
        assert_eq!(d.metrics_addr, ":9401");
        assert_eq!(d.config, PathBuf::from("/etc/tt-vfio/config.yaml"));
        assert_eq!(d.bind_interval, Duration::from_secs(30));
    }

    /// The arguments the chart renders from the Go chart's values (its
    /// golden render) are this binary's.
    #[test]
    fn the_charts_args_parse() {
        let golden = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../chart/tests/golden/go-values.yaml"
        );
        let text = std::fs::read_to_string(golden).expect("the go-values render");
        let args: Vec<String> = serde_yaml::Deserializer::from_str(&text)
            .filter_map(|d| serde_yaml::Value::deserialize(d).ok())
            .find(|d| {
                d["kind"] == "DaemonSet" && d["metadata"]["name"] == "tt-k8s-driver-manager-vfio"
            })
            .and_then(|d| {
                serde_yaml::from_value(
                    d["spec"]["template"]["spec"]["containers"][0]["args"].clone(),
                )
                .ok()
            })
            .expect("the vfio-manage DaemonSet's args");
        assert!(args.len() >= 8, "{args:?}");
        let cli = Cli::try_parse_from(
            std::iter::once("ttdrv-vfio-manage".to_string()).chain(args.clone()),
        )
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
        assert_eq!(cli.bind_interval, Duration::from_secs(60));
        assert_eq!(cli.metrics_addr, ":9402");
        assert_eq!(cli.state_dir, "/var/lib/tt-vfio");
        assert!(cli.restore_on_exit && cli.verbose && !cli.noiommu);
    }
}
