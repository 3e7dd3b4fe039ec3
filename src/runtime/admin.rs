//! Admin HTTP server: `/metrics` (Prometheus text format), `/healthz` (the
//! process is alive) and `/readyz` (the watch caches have synced).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::metrics::Metrics;

#[derive(Clone)]
struct AdminState {
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
}

pub fn router(metrics: Arc<Metrics>, ready: Arc<AtomicBool>) -> Router {
    Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(AdminState { metrics, ready })
}

async fn metrics_handler(State(s): State<AdminState>) -> impl IntoResponse {
    let (content_type, body) = s.metrics.encode();
    ([(header::CONTENT_TYPE, content_type)], body)
}

async fn readyz(State(s): State<AdminState>) -> impl IntoResponse {
    if s.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "watch caches not synced yet",
        )
    }
}

pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "admin server listening (/metrics, /healthz, /readyz)");
    axum::serve(listener, router(metrics, ready)).await
}
