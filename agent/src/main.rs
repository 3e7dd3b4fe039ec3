//! `ttdrv-agent`: entrypoint (`run`), readiness probe (`ready`) and
//! diagnostics (`status`) of the driver manager's node agent.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use ttdrv_api::labels::{self, env};

use ttdrv_agent::build::GitMakeBuilder;
use ttdrv_agent::host::{HostRoot, version_matches};
use ttdrv_agent::kernel::{RealKernel, RealKiller};
use ttdrv_agent::node::{KubeNode, NoNode, NodeApi};
use ttdrv_agent::{Agent, AgentError, Config, status};

#[derive(Debug, Parser)]
#[command(
    name = "ttdrv-agent",
    version,
    about = "Loads and upgrades the tt-kmd kernel module on this node"
)]
struct Cli {
    /// Where the host's root filesystem is mounted; every host path (sys/ and
    /// proc/ included) is resolved under it. `/host` in the DaemonSet pod.
    #[arg(long, global = true, env = env::HOST_ROOT, default_value = "/")]
    host_root: PathBuf,

    /// Log as JSON lines instead of text.
    #[arg(long, global = true, env = "TTDRV_LOG_JSON")]
    log_json: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Bring the node to the target version, label it, then idle until SIGTERM.
    Run(RunArgs),
    /// Exit 0 only when the loaded module's version equals the target exactly.
    Ready {
        /// Target tt-kmd version.
        #[arg(long = "version", env = env::TT_KMD_VERSION)]
        target: String,
    },
    /// Print what the agent sees on this host as JSON.
    Status {
        /// Target tt-kmd version (optional; fills in `ready`).
        #[arg(long = "version", env = env::TT_KMD_VERSION)]
        target: Option<String>,
    },
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// Target tt-kmd version (MAJOR.MINOR.PATCH, tag ttkmd-<version>).
    #[arg(long = "version", env = env::TT_KMD_VERSION)]
    target: String,

    /// SIGKILL processes holding /dev/tenstorrent before unloading.
    /// The environment variable takes true/false (also yes/no, 1/0, on/off);
    /// empty or unset means false.
    #[arg(long, env = env::FORCE_UNLOAD, action = clap::ArgAction::SetTrue,
          value_parser = parse_bool)]
    force_unload: bool,

    /// Seconds to wait for refcnt 0 after killing holders.
    #[arg(long, env = "TTDRV_UNLOAD_TIMEOUT_SECONDS", default_value_t = 30)]
    unload_timeout_seconds: u64,

    /// Git repository (URL or local path) holding tt-kmd tags.
    #[arg(long, env = env::SOURCE_REPOSITORY, default_value = labels::DEFAULT_SOURCE_REPOSITORY)]
    source_repository: String,

    /// The bundled tt-smi binary (a path in the agent's own filesystem).
    #[arg(long, env = "TT_SMI_PATH", default_value = "/opt/tt-smi/tt-smi")]
    tt_smi_path: PathBuf,

    /// Where the host's /usr/lib/linux-kbuild-* trees are linked before a build
    /// (Debian's headers reach them by relative links); empty to skip. Skipped
    /// anyway when the host root is /.
    #[arg(long, env = "TT_KBUILD_LINK_DIR", default_value = "/usr/lib")]
    kbuild_link_dir: PathBuf,

    /// Version of the bundled tt-smi, for the node label.
    #[arg(long, env = env::TT_SMI_VERSION)]
    tt_smi_version: Option<String>,

    /// The node to label; without it labelling is skipped.
    #[arg(long, env = env::NODE_NAME)]
    node_name: Option<String>,

    /// Exit after the sequence instead of idling until SIGTERM.
    #[arg(long)]
    once: bool,
}

/// true/false, yes/no, 1/0, on/off (any case); empty is false.
fn parse_bool(s: &str) -> Result<bool, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "true" | "yes" | "1" | "on" | "y" | "t" => Ok(true),
        "false" | "no" | "0" | "off" | "n" | "f" | "" => Ok(false),
        other => Err(format!("{other:?} is not a boolean (use true or false)")),
    }
}

fn init_logs(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logs(cli.log_json);
    let root = HostRoot::new(&cli.host_root);
    match cli.command {
        Command::Run(args) => run(&cli.host_root, args),
        Command::Ready { target } => {
            let loaded = match root.loaded_version() {
                Ok(v) => v,
                Err(e) => {
                    eprintln!("not ready: {e}");
                    return ExitCode::FAILURE;
                }
            };
            if version_matches(loaded.as_deref(), &target) {
                println!("ready: tenstorrent {} loaded", target.trim());
                ExitCode::SUCCESS
            } else {
                eprintln!(
                    "not ready: loaded {}, want {}",
                    loaded.as_deref().unwrap_or("none"),
                    target.trim()
                );
                ExitCode::FAILURE
            }
        }
        Command::Status { target } => {
            let s = status::collect(&root, target.as_deref());
            match serde_json::to_string_pretty(&s) {
                Ok(json) => {
                    println!("{json}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("cannot encode status: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

fn run(host_root: &std::path::Path, args: RunArgs) -> ExitCode {
    let start = Instant::now();
    let config = Config {
        host_root: host_root.to_path_buf(),
        target_version: args.target.clone(),
        force_unload: args.force_unload,
        unload_timeout: Duration::from_secs(args.unload_timeout_seconds),
        source_repository: args.source_repository.clone(),
        tt_smi_path: args.tt_smi_path.clone(),
        tt_smi_version: args.tt_smi_version.clone(),
        kbuild_link_dir: Some(args.kbuild_link_dir.clone())
            .filter(|d| !d.as_os_str().is_empty() && host_root != std::path::Path::new("/")),
    };
    tracing::info!(
        host_root = %host_root.display(),
        target = %config.target_version,
        force_unload = config.force_unload,
        source_repository = %config.source_repository,
        node = args.node_name.as_deref().unwrap_or("(unset)"),
        "ttdrv-agent starting"
    );
    let node: Box<dyn NodeApi> = match &args.node_name {
        Some(name) if !name.is_empty() => match KubeNode::connect(name.clone()) {
            Ok(n) => Box::new(n),
            Err(reason) => {
                let e = AgentError::Label {
                    node: name.clone(),
                    reason,
                };
                tracing::error!(
                    summary = true,
                    duration_ms = start.elapsed().as_millis() as u64,
                    "summary: result=failed error={e}"
                );
                return ExitCode::FAILURE;
            }
        },
        _ => Box::new(NoNode),
    };
    let builder = GitMakeBuilder::new(&config.source_repository);
    let agent = Agent {
        config: &config,
        kernel: &RealKernel,
        killer: &RealKiller,
        builder: &builder,
        node: node.as_ref(),
    };
    let result = agent.run();
    let duration_ms = start.elapsed().as_millis() as u64;
    match result {
        Ok(outcome) => {
            tracing::info!(duration_ms, "summary: {}", outcome.summary());
            if !args.once {
                idle();
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!(duration_ms, "summary: result=failed error={e}");
            ExitCode::FAILURE
        }
    }
}

/// Blocks until SIGTERM or SIGINT.
fn idle() {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start a runtime to wait for SIGTERM; sleeping forever");
            loop {
                std::thread::park();
            }
        }
    };
    rt.block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tracing::info!("idling until SIGTERM");
                tokio::select! {
                    _ = term.recv() => tracing::info!("SIGTERM: exiting"),
                    _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: exiting"),
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot watch SIGTERM; idling forever");
                std::future::pending::<()>().await;
            }
        }
    });
}
