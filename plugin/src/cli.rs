//! Command line of `kubectl tt driver` (binary `kubectl-tt-driver`).

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

use crate::eta;
use crate::style::ColorChoice;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Text,
    Json,
    Yaml,
}

/// Shows and steers tt-kmd rollouts of TenstorrentDriverPolicies (ttdp).
#[derive(Debug, Parser)]
#[command(
    name = "kubectl tt driver",
    bin_name = "kubectl tt driver",
    version,
    after_help = "Without a subcommand: `status` of every policy.\n\
                  Exit codes: 0 ok; 1 error (missing policy or node, refused action, API error); \
                  2 `watch` ended with a Failed node; 3 `watch --timeout` ran out; 64 usage error \
                  (unknown flag or subcommand, bad value)."
)]
pub struct Cli {
    /// Output format: text for people, json or yaml for scripts.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text, global = true)]
    pub output: Output,
    /// Namespace of the operator (where the installer pods run). Default:
    /// $TT_OPERATOR_NAMESPACE (the Go operator's plugin's variable), else
    /// $TTDRV_NAMESPACE, else tt-k8s-driver-manager-system.
    #[arg(
        short = 'n',
        long,
        env = "TT_OPERATOR_NAMESPACE",
        default_value_t = default_namespace(|k| std::env::var(k).ok()),
        global = true
    )]
    pub namespace: String,
    /// Colors: auto (only on a terminal), always, never. NO_COLOR disables them.
    #[arg(long, value_enum, default_value_t = ColorChoice::Auto, global = true)]
    pub color: ColorChoice,
    /// kubeconfig context to use (default: the current context).
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// Path of the kubeconfig file (default: $KUBECONFIG, else ~/.kube/config,
    /// else the in-cluster service account), as kubectl's flag.
    #[arg(long, global = true, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// The process exit codes, one definition (documented in `--help` and
/// docs/kubectl-plugin.md).
pub mod exit {
    /// Done as asked.
    pub const OK: i32 = 0;
    /// Missing policy or node, refused action, API or kubeconfig error.
    pub const ERROR: i32 = 1;
    /// `watch` ended because a node is Failed.
    pub const FAILED_NODE: i32 = 2;
    /// `watch --timeout` ran out with the rollout still running.
    pub const TIMEOUT: i32 = 3;
    /// Bad command line (sysexits' EX_USAGE), distinct from a Failed node.
    pub const USAGE: i32 = 64;
}

/// The namespace without `-n` and without $TT_OPERATOR_NAMESPACE (which clap
/// reads first): $TTDRV_NAMESPACE, else the chart's default namespace.
pub fn default_namespace(env: impl Fn(&str) -> Option<String>) -> String {
    env("TTDRV_NAMESPACE")
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| ttdrv_api::labels::DEFAULT_NAMESPACE.to_string())
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// One block per policy: version, paused, conflict, summary and node states.
    Status {
        /// Only this policy.
        policy: Option<String>,
    },
    /// Per-node table of a policy: state, current and target version, install
    /// mode, time in state, reason.
    Nodes { policy: String },
    /// Live view until the rollout ends: progress bar, ETA, node states. Exits 0
    /// when every node is Done, 2 when a node Failed, 3 when --timeout runs out.
    ///
    /// It also watches the policy's Nodes and prints each node state change as
    /// the controller writes it, with its time and reason
    /// (`12:03:04 UTC  node-3  Pending → Draining  (Drain)`), states that last
    /// one write included, which the table's polls miss: off a terminal one
    /// line each, between the tables; on a terminal the last 10 under the
    /// table. Not in `-o json|yaml` output.
    Watch {
        /// Only this policy (default: all).
        policy: Option<String>,
        /// Seconds between refreshes.
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
        /// Give up (exit 3) after this many seconds.
        #[arg(long)]
        timeout: Option<f64>,
    },
    /// Dry run, read-only: the order nodes would be upgraded in, what each drain
    /// would evict, what would block, nodes skipped, which nodes hold the target
    /// built ahead, estimated duration with and without build-ahead.
    Plan {
        policy: String,
        /// Plan for this version instead of spec.version.
        #[arg(long)]
        version: Option<String>,
        /// Prediction: seconds of a cache-miss module build (the spec's 30-90 s).
        #[arg(long, value_name = "S", default_value_t = eta::DEFAULT_BUILD_SECONDS)]
        build_seconds: u32,
        /// Prediction: seconds of a load from the cache (the spec's ~5 s cache hit).
        #[arg(long, value_name = "S", default_value_t = eta::DEFAULT_LOAD_SECONDS)]
        load_seconds: u32,
        /// Prediction: seconds of an installer pod's replacement.
        #[arg(long, value_name = "S", default_value_t = eta::DEFAULT_POD_SECONDS)]
        pod_seconds: u32,
        /// Prediction: seconds of a node's cordon, drain and uncordon (default:
        /// the 90 s cache-cold cycle less the default build, load and pod
        /// replacement).
        #[arg(long, value_name = "S", default_value_t = eta::DEFAULT_DRAIN_SECONDS)]
        drain_seconds: u32,
        /// The controller's deploy gates (comma-separated label keys), which
        /// decide the DaemonSet pods that still hold the device after the
        /// gates close. Default: the controller Deployment's
        /// TTDRV_DEPLOY_GATES in --namespace, else the chart default.
        #[arg(long, value_name = "KEYS", value_delimiter = ',')]
        deploy_gates: Option<Vec<String>>,
    },
    /// Set spec.paused=true: nothing new starts.
    Pause { policy: String },
    /// Set spec.paused=false.
    Resume { policy: String },
    /// Retry a Failed node (sets its driver.tenstorrent.com/retry annotation).
    Retry { policy: String, node: String },
    /// Delete the policy's installer pods; the DaemonSet makes new ones. Safe:
    /// a new pod never swaps a loaded module without the controller's go-ahead.
    Restart {
        policy: String,
        /// Only the installer pod on this node.
        node: Option<String>,
    },
    /// Hand the policy back to the Go operator before `helm rollback`: pause
    /// it, delete our installer DaemonSet (the loaded modules stay loaded),
    /// undo our cordons (never anyone else's) and remove our node marks.
    /// Refused while a node is in a cycle, unless --wait or --force; refused
    /// while a node runs another version than the policy's, unless
    /// --accept-go-swap.
    Handback {
        policy: String,
        /// Print what would be done; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Hold new cycles and wait for the nodes in a cycle to end it
        /// instead of refusing; then pause and hand back.
        #[arg(long)]
        wait: bool,
        /// Seconds --wait waits for cycles, and the hand-back for our
        /// installer pods to be gone.
        #[arg(long, value_name = "S", default_value_t = 600)]
        timeout: u64,
        /// Hand back even with nodes mid-cycle (the Go operator then finds
        /// them as they stand).
        #[arg(long)]
        force: bool,
        /// Hand back even though nodes run another tt-kmd than the policy's
        /// version (mid-rollout): the Go controller, once rolled back, swaps
        /// the module on all of them at once, without cordon or drain, with
        /// device users running.
        #[arg(long)]
        accept_go_swap: bool,
    },
    /// Shell completion. bash, zsh, fish: a script for the `kubectl-tt-driver`
    /// binary itself. `kubectl tt driver <TAB>` is completed by kubectl (1.26+)
    /// through the `kubectl_complete-tt-driver` (krew: `kubectl_complete-tt`)
    /// executable shipped with the plugin.
    Completion {
        /// The shell to print the script for.
        shell: clap_complete::Shell,
    },
    /// Logs of the policy's installer pods (container "installer"), or of one node's.
    Logs {
        policy: String,
        node: Option<String>,
        /// Lines from the end of each log.
        #[arg(long)]
        tail: Option<i64>,
        /// Stream the log (one node only).
        #[arg(short = 'f', long)]
        follow: bool,
        /// Logs of the previous (crashed) container.
        #[arg(short = 'p', long)]
        previous: bool,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn namespace_default_falls_back_to_ttdrv_namespace_then_the_chart() {
        assert_eq!(default_namespace(|_| None), "tt-k8s-driver-manager-system");
        assert_eq!(
            default_namespace(|k| (k == "TTDRV_NAMESPACE").then(|| "mine".to_string())),
            "mine"
        );
        assert_eq!(
            default_namespace(|_| Some(String::new())),
            "tt-k8s-driver-manager-system"
        );
    }

    #[test]
    fn plan_costs_default_and_parse() {
        let cli = Cli::try_parse_from(["kubectl-tt-driver", "plan", "fleet"]).expect("parses");
        match cli.command {
            Some(Command::Plan {
                build_seconds,
                load_seconds,
                pod_seconds,
                drain_seconds,
                ..
            }) => assert_eq!(
                (build_seconds, load_seconds, pod_seconds, drain_seconds),
                (60, 5, 5, 20)
            ),
            other => panic!("{other:?}"),
        }
        let cli = Cli::try_parse_from([
            "kubectl-tt-driver",
            "plan",
            "fleet",
            "--build-seconds",
            "90",
            "--load-seconds=2",
        ])
        .expect("parses");
        assert!(matches!(
            cli.command,
            Some(Command::Plan {
                build_seconds: 90,
                load_seconds: 2,
                ..
            })
        ));
        assert!(
            Cli::try_parse_from(["kubectl-tt-driver", "plan", "fleet", "--build-seconds=-1"])
                .is_err()
        );
    }

    /// `watch --help` states the exit codes `watch` returns ([`exit`]).
    #[test]
    fn watch_help_states_the_exit_codes() {
        use clap::CommandFactory;
        let mut cmd = Cli::command();
        let help = cmd
            .find_subcommand_mut("watch")
            .expect("watch subcommand")
            .render_long_help()
            .to_string();
        // The flag's line and the next (its text, when on its own line).
        let timeout: String = help
            .lines()
            .skip_while(|l| !l.trim_start().starts_with("--timeout"))
            .take(2)
            .collect();
        assert!(
            timeout.contains(&format!("exit {}", exit::TIMEOUT)),
            "--timeout help: {timeout:?}"
        );
        assert!(help.contains(&format!("{} when a node Failed", exit::FAILED_NODE)));
        assert!(help.contains(&format!("{} when --timeout runs out", exit::TIMEOUT)));
        assert!(
            help.contains("Pending → Draining"),
            "watch --help shows a transition line: {help}"
        );
    }

    #[test]
    fn handback_parses() {
        let cli = Cli::try_parse_from([
            "kubectl-tt-driver",
            "handback",
            "fleet",
            "--dry-run",
            "--accept-go-swap",
        ])
        .expect("parses");
        match cli.command {
            Some(Command::Handback {
                policy,
                dry_run,
                wait,
                force,
                timeout,
                accept_go_swap,
            }) => assert_eq!(
                (
                    policy.as_str(),
                    dry_run,
                    wait,
                    force,
                    timeout,
                    accept_go_swap
                ),
                ("fleet", true, false, false, 600, true)
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn restart_parses() {
        let cli = Cli::try_parse_from(["kubectl-tt-driver", "restart", "fleet", "-n", "ops"])
            .expect("parses");
        assert_eq!(cli.namespace, "ops");
        match cli.command {
            Some(Command::Restart { policy, node }) => {
                assert_eq!(policy, "fleet");
                assert_eq!(node, None);
            }
            other => panic!("{other:?}"),
        }
    }
}
