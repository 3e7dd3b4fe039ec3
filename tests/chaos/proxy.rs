//! A fault-injecting proxy between the controllers and the API server
//! (hack/chaos.sh points their KUBECONFIG at it): injected 409s and 429s that
//! the controller must retry, without touching the API server itself.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Answers a share of the controller's requests itself — 409 Conflict for
/// writes, 429 Too Many Requests (with Retry-After) for anything, watches
/// included — and forwards the rest to the real API server. The controller
/// must retry them all; the counts go into the summary.
#[derive(Default)]
pub(crate) struct ProxyStats {
    pub(crate) forwarded: AtomicUsize,
    pub(crate) conflicts: AtomicUsize,
    pub(crate) throttled: AtomicUsize,
    pub(crate) upstream_errors: AtomicUsize,
    /// Of the injected 409s: on node patches (cordon, uncordon, gates, record).
    pub(crate) node_patch_conflicts: AtomicUsize,
    /// Of the injected 429s: on watch requests.
    pub(crate) watch_throttled: AtomicUsize,
    /// Injected 409s on policy status writes (the status-conflict test).
    pub(crate) status_conflicts: AtomicUsize,
    /// Injected 429s on Event writes (the throttled-events test).
    pub(crate) event_throttled: AtomicUsize,
}

#[derive(Clone)]
struct Proxy {
    upstream: kube::Client,
    rng: Arc<Mutex<StdRng>>,
    p409: f64,
    p429: f64,
    /// Extra 409 rate on policy status writes only (changed while running).
    status_p409: Arc<Mutex<f64>>,
    /// The next this-many Event writes are answered 429 (set while running).
    throttle_events: Arc<AtomicUsize>,
    stats: Arc<ProxyStats>,
}

fn status_response(code: u16, reason: &str, message: &str) -> axum::response::Response {
    let body = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code,
    });
    let mut resp = axum::response::Response::new(axum::body::Body::from(body.to_string()));
    *resp.status_mut() =
        axum::http::StatusCode::from_u16(code).unwrap_or(axum::http::StatusCode::BAD_GATEWAY);
    let h = resp.headers_mut();
    h.insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json"),
    );
    if code == 429 {
        h.insert(
            axum::http::header::RETRY_AFTER,
            axum::http::HeaderValue::from_static("1"),
        );
    }
    resp
}

async fn proxy_handler(
    axum::extract::State(p): axum::extract::State<Proxy>,
    req: axum::extract::Request,
) -> axum::response::Response {
    use axum::http::Method;
    let (parts, body) = req.into_parts();
    let write = matches!(
        parts.method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    );
    let (r409, r429) = {
        let mut rng = p.rng.lock().unwrap_or_else(|e| e.into_inner());
        (rng.random::<f64>(), rng.random::<f64>())
    };
    let path_str = parts.uri.path();
    let status_write = parts.method == Method::PATCH
        && path_str.contains("/tenstorrentdriverpolicies/")
        && path_str.ends_with("/status");
    let event_write = write && path_str.contains("/events");
    if event_write
        && p.throttle_events
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    {
        p.stats.event_throttled.fetch_add(1, Ordering::Relaxed);
        return status_response(
            429,
            "TooManyRequests",
            "chaos proxy: injected throttling of an event write",
        );
    }
    let status_p409 = *p.status_p409.lock().unwrap_or_else(|e| e.into_inner());
    if status_write && r429 < status_p409 {
        p.stats.status_conflicts.fetch_add(1, Ordering::Relaxed);
        return status_response(
            409,
            "Conflict",
            "chaos proxy: injected conflict on a status write",
        );
    }
    if write && r409 < p.p409 {
        p.stats.conflicts.fetch_add(1, Ordering::Relaxed);
        if parts.method == Method::PATCH && path_str.starts_with("/api/v1/nodes/") {
            p.stats.node_patch_conflicts.fetch_add(1, Ordering::Relaxed);
        }
        return status_response(
            409,
            "Conflict",
            "chaos proxy: injected conflict, please retry",
        );
    }
    if r429 < p.p429 {
        p.stats.throttled.fetch_add(1, Ordering::Relaxed);
        if parts.uri.query().is_some_and(|q| q.contains("watch=true")) {
            p.stats.watch_throttled.fetch_add(1, Ordering::Relaxed);
        }
        return status_response(
            429,
            "TooManyRequests",
            "chaos proxy: injected throttling, please retry",
        );
    }
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return status_response(400, "BadRequest", "chaos proxy: unreadable body");
    };
    let path = parts
        .uri
        .path_and_query()
        .map(|pq| pq.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let mut up = axum::http::Request::builder()
        .method(parts.method.clone())
        .uri(path);
    for name in [
        axum::http::header::CONTENT_TYPE,
        axum::http::header::ACCEPT,
        axum::http::header::USER_AGENT,
    ] {
        if let Some(v) = parts.headers.get(&name) {
            up = up.header(name, v.clone());
        }
    }
    let Ok(up) = up.body(kube::client::Body::from(bytes.to_vec())) else {
        return status_response(400, "BadRequest", "chaos proxy: bad request");
    };
    match p.upstream.send(up).await {
        Ok(resp) => {
            p.stats.forwarded.fetch_add(1, Ordering::Relaxed);
            let (parts, body) = resp.into_parts();
            axum::response::Response::from_parts(parts, axum::body::Body::new(body))
        }
        Err(e) => {
            p.stats.upstream_errors.fetch_add(1, Ordering::Relaxed);
            status_response(
                503,
                "ServiceUnavailable",
                &format!("chaos proxy: upstream: {e}"),
            )
        }
    }
}

/// Serves the proxy on 127.0.0.1:`port` (the address in the controllers'
/// KUBECONFIG, written by hack/chaos.sh).
pub(crate) async fn spawn_proxy(
    upstream: kube::Client,
    port: u16,
    seed: u64,
    p409: f64,
    p429: f64,
    status_p409: Arc<Mutex<f64>>,
    throttle_events: Arc<AtomicUsize>,
) -> (Arc<ProxyStats>, tokio::task::JoinHandle<()>) {
    let stats = Arc::new(ProxyStats::default());
    let p = Proxy {
        upstream,
        rng: Arc::new(Mutex::new(StdRng::seed_from_u64(seed))),
        p409,
        p429,
        status_p409,
        throttle_events,
        stats: stats.clone(),
    };
    let app = axum::Router::new().fallback(proxy_handler).with_state(p);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap_or_else(|e| panic!("binding the chaos proxy on port {port}: {e}"));
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            eprintln!("chaos proxy stopped: {e}");
        }
    });
    (stats, task)
}
