//! Plays the node agent on kwok-simulated nodes (for the demo and benchmarks).
use std::time::Duration;

use clap::Parser;

#[derive(Parser)]
#[command(about = "Simulated tt-kmd node agent for kwok clusters")]
struct Args {
    /// Namespace of the installer DaemonSets.
    #[arg(long, default_value = ttdrv_api::labels::DEFAULT_NAMESPACE)]
    namespace: String,
    /// Simulated per-node work (unload + build + load), in milliseconds.
    #[arg(long, default_value_t = 1000)]
    work_ms: u64,
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt().with_env_filter("info").init();
    let args = Args::parse();
    let client = ttdrv_testkit::client().await;
    ttdrv_testkit::sim_agent::run(
        client,
        ttdrv_testkit::SimAgentConfig {
            namespace: args.namespace,
            work: Duration::from_millis(args.work_ms),
        },
    )
    .await;
}
