//! `ttdrv-agent`: entrypoint (`run`), readiness probe (`ready`) and
//! diagnostics (`status`) of the driver manager's node agent.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use ttdrv_api::OnValidationFailure;
use ttdrv_api::labels::{self, env};

use ttdrv_agent::build::GitMakeBuilder;
use ttdrv_agent::host::HostRoot;
use ttdrv_agent::kernel::{RealKernel, RealKiller};
use ttdrv_agent::node::{KubeNode, NoNode, NodeApi};
use ttdrv_agent::pod::{self, Pause, Signals};
use ttdrv_agent::{Agent, AgentError, Config, Outcome, status};

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

    /// Where `run` notes why it waits for the controller's go-ahead (a path in
    /// the agent's own filesystem), read by `ready` and `status`; empty for
    /// nowhere.
    #[arg(long, global = true, env = "TTDRV_STATUS_FILE", default_value = pod::DEFAULT_STATUS_FILE)]
    status_file: PathBuf,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Bring the node to the target version, label it, then idle until SIGTERM.
    Run(Box<RunArgs>),
    /// Exit 0 only when the loaded module's version equals the target exactly
    /// and `run` is not waiting for the go-ahead.
    Ready {
        /// Target tt-kmd version.
        #[arg(long = "version", env = env::TT_KMD_VERSION)]
        target: String,
        /// The installer of a `spec.unmanage` policy: ready once nothing is loaded.
        #[arg(long, env = env::UNMANAGE, action = clap::ArgAction::SetTrue, value_parser = parse_bool)]
        unmanage: bool,
        /// The module parameters that must be in effect too (as for `run`).
        #[arg(long, env = env::MODULE_PARAMETERS, default_value = "")]
        module_parameters: String,
    },
    /// Print what the agent sees on this host as JSON.
    Status {
        /// Target tt-kmd version (optional; fills in `ready`).
        #[arg(long = "version", env = env::TT_KMD_VERSION)]
        target: Option<String>,
        /// The certificate `run` signs modules with: cache entries signed
        /// with another one (or unsigned) are reported as not verified.
        #[arg(long, env = env::SIGNING_CERT)]
        signing_cert: Option<PathBuf>,
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

    /// Next-kernel preflight: also build and cache the target for every other
    /// installed kernel with headers (true/false; unset means true).
    #[arg(long, env = env::NEXT_KERNELS, default_value_t = true,
          action = clap::ArgAction::Set, value_parser = parse_bool)]
    next_kernels: bool,

    /// The tt-kmd module parameters to load with, `name=value` separated by
    /// spaces (the canonical string of the policy's spec.moduleParameters).
    #[arg(long, env = env::MODULE_PARAMETERS, default_value = "")]
    module_parameters: String,

    /// Seconds the new module has after its load to serve every card the
    /// old one served (`upgradePolicy.validation.timeoutSeconds`).
    #[arg(long, env = env::VALIDATION_TIMEOUT, default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    validation_timeout_seconds: u64,

    /// When the new module fails validation: `rollback` (load the previous
    /// version again from the cache) or `hold` (keep it loaded for a person).
    #[arg(long, env = env::ON_VALIDATION_FAILURE, default_value = "rollback",
          value_parser = parse_on_validation_failure)]
    on_validation_failure: OnValidationFailure,

    /// Seconds to wait for refcnt 0 after killing holders (at most a day).
    #[arg(long, env = "TTDRV_UNLOAD_TIMEOUT_SECONDS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(0..=86_400))]
    unload_timeout_seconds: u64,

    /// Git repository (URL or local path) holding tt-kmd tags.
    #[arg(long, env = env::SOURCE_REPOSITORY, default_value = labels::DEFAULT_SOURCE_REPOSITORY)]
    source_repository: String,

    /// The commit the version's tag must name (full hex); a clone whose tag
    /// names another commit (a tag that moved) is refused. Unset: unpinned.
    #[arg(long, env = env::SOURCE_COMMIT)]
    source_commit: Option<String>,

    /// A file of public keys (as `gpg --import` reads) one of which must have
    /// signed the version's tag; a tag without such a signature is refused.
    /// Unset: signatures are not checked.
    #[arg(long, env = env::TAG_KEYS)]
    tag_keys: Option<PathBuf>,

    /// The private key (PEM) to sign the built module with, with the kernel's
    /// scripts/sign-file; needs --signing-cert. Unset: built unsigned.
    #[arg(long, env = env::SIGNING_KEY)]
    signing_key: Option<PathBuf>,

    /// The certificate (PEM or DER) of --signing-key.
    #[arg(long, env = env::SIGNING_CERT)]
    signing_cert: Option<PathBuf>,

    /// `<namespace>/<name>` of the Secret the signing key pair comes from
    /// (for messages only).
    #[arg(long, env = env::SIGNING_SECRET)]
    signing_secret: Option<String>,

    /// The bundled tt-smi binary (a path in the agent's own filesystem).
    #[arg(long, env = "TT_SMI_PATH", default_value = "/opt/tt-smi/tt-smi")]
    tt_smi_path: PathBuf,

    /// Where the host's /usr/lib/linux-kbuild-* trees are linked before a build
    /// (Debian's headers reach them by relative links); empty to skip. Skipped
    /// anyway when the host root is /.
    // A String: clap refuses an empty PathBuf, and empty is how to skip.
    #[arg(long, env = "TT_KBUILD_LINK_DIR", default_value = "/usr/lib")]
    kbuild_link_dir: String,

    /// Version of the bundled tt-smi, for the node label.
    #[arg(long, env = env::TT_SMI_VERSION)]
    tt_smi_version: Option<String>,

    /// The node to label and to read the go-ahead from; without it labelling
    /// is skipped and a loaded module of another version is not swapped.
    #[arg(long, env = env::NODE_NAME)]
    node_name: Option<String>,

    /// The policy whose DaemonSet runs this agent: only a go-ahead naming it
    /// lets the agent swap a loaded module. Unset: never swap one (first
    /// installs and an already loaded target still work).
    #[arg(long, env = env::POLICY)]
    policy: Option<String>,

    /// Milliseconds between looks at the Node while waiting for the go-ahead
    /// (10 ms to an hour).
    #[arg(long, env = "TTDRV_GO_AHEAD_POLL_MS", default_value_t = 5000,
          value_parser = clap::value_parser!(u64).range(10..=3_600_000))]
    go_ahead_poll_ms: u64,

    /// Where to write the termination message when giving up on a busy
    /// device, a failed build or a refused load; empty for nowhere.
    #[arg(long, env = "TTDRV_TERMINATION_LOG", default_value = pod::DEFAULT_TERMINATION_LOG)]
    termination_log: PathBuf,

    /// Swap a loaded module without the controller's go-ahead: only for
    /// running by hand on a host without a controller; refused when NODE_NAME
    /// is set.
    #[arg(long)]
    swap_without_go_ahead: bool,

    /// The installer of a `spec.unmanage` policy: install nothing; unload
    /// with the controller's unload go-ahead, remove the driver labels.
    #[arg(long, env = env::UNMANAGE, action = clap::ArgAction::SetTrue,
          value_parser = parse_bool)]
    unmanage: bool,

    /// Exit after the sequence instead of idling until SIGTERM.
    #[arg(long)]
    once: bool,
}

/// Prints the probe's answer; exit 0 when ready.
fn report(r: Result<String, String>) -> ExitCode {
    match r {
        Ok(msg) => {
            println!("{msg}");
            ExitCode::SUCCESS
        }
        Err(msg) => {
            eprintln!("{msg}");
            ExitCode::FAILURE
        }
    }
}

/// true/false, yes/no, 1/0, on/off (any case); empty is false.
fn parse_bool(s: &str) -> Result<bool, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "true" | "yes" | "1" | "on" | "y" | "t" => Ok(true),
        "false" | "no" | "0" | "off" | "n" | "f" | "" => Ok(false),
        other => Err(format!("{other:?} is not a boolean (use true or false)")),
    }
}

fn parse_on_validation_failure(s: &str) -> Result<OnValidationFailure, String> {
    OnValidationFailure::parse(s).ok_or_else(|| {
        format!("{s:?} is neither rollback nor hold (upgradePolicy.onValidationFailure)")
    })
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
    let status_file = Some(cli.status_file.clone()).filter(|p| !p.as_os_str().is_empty());
    match cli.command {
        Command::Run(args) => run(&cli.host_root, status_file, *args),
        Command::Ready { unmanage: true, .. } => report(ttdrv_agent::unload::readiness(
            &root,
            status_file.as_deref(),
        )),
        Command::Ready {
            target,
            module_parameters,
            ..
        } => report(
            ttdrv_api::module_params::parse(&module_parameters)
                .map_err(|e| format!("not ready: {}: {e}", env::MODULE_PARAMETERS))
                .and_then(|p| pod::readiness(&root, &target, &p, status_file.as_deref())),
        ),
        Command::Status {
            target,
            signing_cert,
        } => {
            let waiting = status_file.as_deref().and_then(pod::waiting);
            let cert = signing_cert.filter(|c| !c.as_os_str().is_empty());
            let s = status::collect(&root, target.as_deref(), waiting, cert.as_deref());
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

fn run(host_root: &Path, status_file: Option<PathBuf>, args: RunArgs) -> ExitCode {
    let start = Instant::now();
    let node_name = args.node_name.clone().filter(|n| !n.is_empty());
    if args.swap_without_go_ahead && node_name.is_some() {
        tracing::error!(
            "--swap-without-go-ahead is for running by hand without a controller; it is refused when NODE_NAME is set"
        );
        return ExitCode::from(2);
    }
    let config = match config_from_args(host_root, status_file, &args, start) {
        Ok(config) => config,
        Err(code) => return code,
    };
    tracing::info!(
        host_root = %host_root.display(),
        target = %config.target_version,
        force_unload = config.force_unload,
        source_repository = %config.source_repository,
        node = node_name.as_deref().unwrap_or("(unset)"),
        policy = config.policy.as_deref().unwrap_or("(unset)"),
        signing = config.signing.as_ref().map_or("(off)", |s| s.origin.as_str()),
        kbuild_link_dir = %config
            .kbuild_link_dir
            .as_deref()
            .map_or("(skipped)".into(), |d| d.display().to_string()),
        "ttdrv-agent starting"
    );
    let node = match connect_node(node_name.as_deref(), start) {
        Ok(node) => node,
        Err(code) => return code,
    };
    let commit = match source_pin(&args) {
        Ok(commit) => commit,
        Err(code) => return code,
    };
    let tag_keys = args.tag_keys.clone().filter(|k| !k.as_os_str().is_empty());
    let builder = GitMakeBuilder::new(&config.source_repository)
        .pinned(commit)
        .signed_by(tag_keys);
    let signals = Signals::new();
    let agent = Agent {
        config: &config,
        kernel: &RealKernel,
        killer: &RealKiller,
        builder: &builder,
        node: node.as_ref(),
        pause: &signals,
    };
    if args.unmanage {
        return unload(&agent, &signals, &args, start);
    }
    let result = agent.run();
    let duration_ms = start.elapsed().as_millis() as u64;
    match result {
        Ok(outcome) => {
            tracing::info!(duration_ms, "summary: {}", outcome.summary());
            if !args.once && !matches!(outcome, Outcome::Stopped { .. }) {
                idle(&signals);
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!(
                duration_ms,
                reason = e.reason().unwrap_or("-"),
                "summary: result=failed error={e}"
            );
            write_termination_message(&e, &args.termination_log);
            ExitCode::FAILURE
        }
    }
}

/// The run's configuration from its arguments; the exit code when they are
/// unusable (a lone signing key or certificate, bad module parameters), said
/// in the log.
fn config_from_args(
    host_root: &Path,
    status_file: Option<PathBuf>,
    args: &RunArgs,
    start: Instant,
) -> Result<Config, ExitCode> {
    let nonempty = |p: &Option<PathBuf>| p.clone().filter(|p| !p.as_os_str().is_empty());
    let signing = match (nonempty(&args.signing_key), nonempty(&args.signing_cert)) {
        (None, None) => None,
        (Some(key), Some(cert)) => Some(ttdrv_agent::signing::SigningKey::new(
            key,
            cert,
            args.signing_secret.as_deref(),
        )),
        _ => {
            tracing::error!(
                "{} and {} (--signing-key, --signing-cert) go together: set both or neither",
                env::SIGNING_KEY,
                env::SIGNING_CERT
            );
            return Err(ExitCode::from(2));
        }
    };
    let module_parameters = match ttdrv_api::module_params::parse(&args.module_parameters) {
        Ok(v) => v,
        Err(reason) => {
            let e = AgentError::InvalidParameters {
                value: args.module_parameters.clone(),
                reason,
            };
            tracing::error!(
                summary = true,
                duration_ms = start.elapsed().as_millis() as u64,
                "summary: result=failed error={e}"
            );
            return Err(ExitCode::from(2));
        }
    };
    Ok(Config {
        module_parameters,
        host_root: host_root.to_path_buf(),
        target_version: args.target.clone(),
        force_unload: args.force_unload,
        unload_timeout: Duration::from_secs(args.unload_timeout_seconds),
        source_repository: args.source_repository.clone(),
        tt_smi_path: args.tt_smi_path.clone(),
        tt_smi_version: args.tt_smi_version.clone(),
        kbuild_link_dir: Some(PathBuf::from(&args.kbuild_link_dir))
            .filter(|d| !d.as_os_str().is_empty() && host_root != Path::new("/")),
        policy: args.policy.clone().filter(|p| !p.is_empty()),
        go_ahead_poll: Duration::from_millis(args.go_ahead_poll_ms),
        swap_without_go_ahead: args.swap_without_go_ahead,
        status_file,
        next_kernels: args.next_kernels,
        signing,
        validation_timeout: Duration::from_secs(args.validation_timeout_seconds),
        on_validation_failure: args.on_validation_failure,
    })
}

/// The agent's own Node through the API server (NODE_NAME set), or none when
/// run by hand; the exit code when the client cannot be made, said in the
/// log.
fn connect_node(node_name: Option<&str>, start: Instant) -> Result<Box<dyn NodeApi>, ExitCode> {
    let Some(name) = node_name else {
        return Ok(Box::new(NoNode));
    };
    match KubeNode::connect(name.to_string()) {
        Ok(n) => Ok(Box::new(n)),
        Err(reason) => {
            let e = AgentError::Label {
                node: name.to_string(),
                reason,
            };
            tracing::error!(
                summary = true,
                duration_ms = start.elapsed().as_millis() as u64,
                "summary: result=failed error={e}"
            );
            Err(ExitCode::FAILURE)
        }
    }
}

/// The commit the source is pinned to (None: unpinned), logged; the exit
/// code when it is not a commit, said in the log and the termination
/// message.
fn source_pin(args: &RunArgs) -> Result<Option<String>, ExitCode> {
    let commit = match args
        .source_commit
        .as_deref()
        .filter(|c| !c.trim().is_empty())
    {
        None => None,
        Some(c) => match ttdrv_agent::build::validate_commit(c) {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::error!(summary = true, "summary: result=failed error={e}");
                write_termination_message(&e, &args.termination_log);
                return Err(ExitCode::FAILURE);
            }
        },
    };
    tracing::info!(
        source_commit = commit.as_deref().unwrap_or("(unpinned)"),
        "source pin"
    );
    Ok(commit)
}

/// The unload-only run of a `spec.unmanage` policy's installer.
fn unload(agent: &Agent<'_>, signals: &Signals, args: &RunArgs, start: Instant) -> ExitCode {
    let result = agent.run_unload();
    let duration_ms = start.elapsed().as_millis() as u64;
    match result {
        Ok(outcome) => {
            tracing::info!(duration_ms, "summary: {}", outcome.summary());
            if !args.once && !matches!(outcome, ttdrv_agent::unload::Unloaded::Stopped { .. }) {
                idle(signals);
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!(duration_ms, "summary: result=failed error={e}");
            let path = &args.termination_log;
            if !path.as_os_str().is_empty()
                && let Err(err) = pod::write_termination_message(
                    path,
                    &ttdrv_agent::unload::termination_message(&e),
                )
            {
                tracing::warn!(path = %path.display(), error = %err, "cannot write the termination message");
            }
            ExitCode::FAILURE
        }
    }
}

/// Gives the cause of giving up to the kubelet (and so to the controller),
/// for the errors that name a reason.
fn write_termination_message(e: &AgentError, path: &Path) {
    let Some(message) = e.termination_message() else {
        return;
    };
    if path.as_os_str().is_empty() {
        return;
    }
    if let Err(err) = pod::write_termination_message(path, &message) {
        tracing::warn!(path = %path.display(), error = %err, "cannot write the termination message");
    }
}

/// Blocks until SIGTERM or SIGINT (at once if one came already).
fn idle(signals: &Signals) {
    if let Err(e) = signals.watch() {
        tracing::error!(error = %e, "cannot watch SIGTERM; idling forever");
        loop {
            std::thread::park();
        }
    }
    if signals.received().is_none() {
        tracing::info!("idling until SIGTERM");
    }
    while !signals.pause(Duration::from_secs(3600)) {}
    tracing::info!("{}: exiting", signals.received().unwrap_or("signal"));
}
