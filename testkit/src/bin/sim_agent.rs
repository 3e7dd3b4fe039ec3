//! Plays the node agent on kwok-simulated nodes (for the demo and benchmarks),
//! and the graceful stop of workloads that ask for one
//! ([`ttdrv_testkit::sim_workload`]).
use std::time::Duration;

use clap::Parser;

#[derive(Parser)]
#[command(about = "Simulated tt-kmd node agent for kwok clusters")]
struct Args {
    /// Namespace of the installer DaemonSets.
    #[arg(long, default_value = ttdrv_api::labels::DEFAULT_NAMESPACE)]
    namespace: String,
    /// Simulated time before the agent acts on a new pod (with no build or
    /// load time given, the whole swap), in milliseconds.
    #[arg(long, default_value_t = 1000)]
    work_ms: u64,
    /// Simulated build of a target the node has not cached, before the
    /// go-ahead is asked for, in milliseconds.
    #[arg(long, default_value_t = 0)]
    build_ms: u64,
    /// Simulated unload + load after the go-ahead, in milliseconds.
    #[arg(long, default_value_t = 0)]
    load_ms: u64,
    /// Simulated flash (a firmware policy's flash Job pod), in
    /// milliseconds; default: `--work-ms`.
    #[arg(long)]
    flash_ms: Option<u64>,
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt().with_env_filter("info").init();
    let args = Args::parse();
    let client = ttdrv_testkit::client().await;
    let workloads = ttdrv_testkit::sim_workload::run(client.clone());
    let agent = ttdrv_testkit::sim_agent::run(
        client,
        ttdrv_testkit::SimAgentConfig {
            namespace: args.namespace,
            work: Duration::from_millis(args.work_ms),
            build: Duration::from_millis(args.build_ms),
            load: Duration::from_millis(args.load_ms),
            flash: args.flash_ms.map(Duration::from_millis),
            ..Default::default()
        },
    );
    futures::join!(workloads, agent);
}
