//! `ttdrv-controller`: the operator process.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use actix::Actor as _;
use actix::AsyncContext as _;
use anyhow::Context as _;
use clap::Parser;
use ttdrv_controller::config::Config;
use ttdrv_controller::driver::PolicyManager;
use ttdrv_controller::firmware;
use ttdrv_controller::metrics::Metrics;
use ttdrv_controller::runtime::context::Context;
use ttdrv_controller::runtime::leader::LeaderElector;
use ttdrv_controller::runtime::{admin, watch};

fn main() -> anyhow::Result<()> {
    let config = Config::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,kube=warn"));
    if config.log_format == "json" {
        tracing_subscriber::fmt()
            .json()
            .with_ansi(false)
            .with_env_filter(filter)
            .init();
    } else {
        // The log goes to stderr: colour only when that is a terminal.
        let colours = ttdrv_controller::config::log_colours(
            std::io::IsTerminal::is_terminal(&std::io::stderr()),
            std::env::var_os("NO_COLOR").as_deref(),
        );
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_ansi(colours)
            .with_env_filter(filter)
            .init();
    }
    // Actors live on the System thread; kube's Send futures run on the
    // multi-threaded tokio runtime behind it.
    let system = actix::System::with_tokio_rt(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("building the tokio runtime")
    });
    system.block_on(run(config))
}

async fn run(config: Config) -> anyhow::Result<()> {
    let metrics = Arc::new(Metrics::new(env!("CARGO_PKG_VERSION")));
    let ready = Arc::new(AtomicBool::new(false));
    let admin = tokio::spawn(admin::serve(
        config.admin_addr,
        metrics.clone(),
        ready.clone(),
    ));

    let mut kube_config = kube::Config::infer()
        .await
        .context("loading Kubernetes client configuration")?;
    // We retry 409/429 ourselves and must see an eviction's 429 at once.
    kube_config.default_retry = false;
    let client = ttdrv_controller::runtime::requests::counted_client(kube_config, metrics.clone())
        .context("building the Kubernetes client")?;

    let manager_ctx = actix::Context::<PolicyManager>::new();
    let manager_addr = manager_ctx.address();
    let (stores, synced) = watch::start(
        &client,
        &config.namespace,
        config.policy_selector.as_deref(),
        &config.dra_driver,
        manager_addr,
        metrics.clone(),
    );
    synced.await;
    ready.store(true, Ordering::Relaxed);
    tracing::info!("watch caches synced");
    // Ready already (a rolling upgrade from the Go chart waits for that
    // before it stops the Go pod), but not acting while the Go one runs.
    if config.wait_for_go_controller {
        ttdrv_controller::runtime::handover::wait_for_go_controller(&client, &config.namespace)
            .await;
    }

    let identity = config
        .identity
        .clone()
        .unwrap_or_else(|| format!("ttdrv-controller-{}", std::process::id()));
    let elector = config.leader_elect.then(|| {
        LeaderElector::new(
            client.clone(),
            &config.namespace,
            &config.lease_name,
            &identity,
            config.lease_duration_seconds,
        )
    });
    if let Some(e) = &elector {
        tracing::info!(
            identity,
            lease = config.lease_name,
            "waiting to become leader"
        );
        e.acquire().await;
        tracing::info!(identity, "became leader");
    }
    metrics.set_leader(true);

    let ctx = Arc::new(Context::new(client, config, stores, metrics.clone()));
    let _manager = manager_ctx.run(PolicyManager::new(ctx.clone()));
    // The firmware policies: their own watches, the same node and pod caches.
    let _firmware = if ctx.config.firmware {
        let (kick, kicks) = tokio::sync::mpsc::channel(1);
        let (fw_stores, fw_synced) = firmware::start_watches(
            &ctx.client,
            &ctx.config.namespace,
            ctx.config.policy_selector.as_deref(),
            kick,
        );
        fw_synced.await;
        tracing::info!("firmware watch caches synced");
        Some(firmware::FirmwareManager::new(ctx.clone(), fw_stores, kicks).start())
    } else {
        None
    };

    let lost = async {
        match &elector {
            Some(e) => e.hold().await,
            None => futures::future::pending().await,
        }
    };
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("SIGTERM handler")?;
    tokio::select! {
        _ = lost => {
            // Stop acting at once: another replica holds (or will take) the lease.
            metrics.set_leader(false);
            tracing::error!("lost the leader lease; exiting");
            std::process::exit(2);
        }
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupted; shutting down"),
        _ = term.recv() => tracing::info!("SIGTERM; shutting down"),
        res = admin => anyhow::bail!("admin server stopped: {res:?}"),
    }
    // Every step is persisted before it acts, so stopping here is safe.
    actix::System::current().stop();
    Ok(())
}
