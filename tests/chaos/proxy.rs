//! A fault-injecting proxy between the controllers and the API server
//! (hack/chaos.sh points their KUBECONFIG at it): injected 409s and 429s that
//! the controller must retry, without touching the API server itself; and a
//! trap that holds one chosen write while the test restarts the API server.

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

/// Whether a trapped write reaches the API server before it goes down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WriteFate {
    /// Applied, but its answer is lost in the restart: the writer sees an
    /// error for a write that happened.
    Landed,
    /// Lost in the restart: never applied, the writer sees an error.
    Lost,
}

/// Whether a request (method, path, body) is the write a trap waits for.
pub(crate) type WriteMatcher = Box<dyn Fn(&axum::http::Method, &str, &str) -> bool + Send + Sync>;
/// A check of a Node (as it was before a write) and the write's body.
pub(crate) type NodeCheck = Box<dyn Fn(&k8s_openapi::api::core::v1::Node, &str) + Send + Sync>;

/// One write to catch: the first request for which `matches(method, path,
/// body)` holds. The proxy tells the test (`fired`), holds the request until
/// the test says the API server is back (`resume`), and answers 503.
pub(crate) struct Trap {
    pub(crate) what: String,
    pub(crate) matches: WriteMatcher,
    pub(crate) fate: WriteFate,
    /// The request (method, path, body).
    pub(crate) fired: tokio::sync::oneshot::Sender<String>,
    pub(crate) resume: tokio::sync::oneshot::Receiver<()>,
}

/// The traps armed: each catches one write, the first that matches.
pub(crate) type WriteTrap = Arc<Mutex<Vec<Trap>>>;

/// A check of every write to a Node whose body contains `when_body_has`,
/// on the Node as it is just before the write is forwarded (or trapped):
/// independent of any watch, so a write made while watches are down
/// (across an API-server restart) is checked too.
pub(crate) struct NodeWriteCheck {
    pub(crate) when_body_has: String,
    pub(crate) check: NodeCheck,
}

/// What the proxy injects besides forwarding: the seed and rates of the
/// random 409s and 429s, the knobs tests turn while running, and the trap.
#[derive(Default)]
pub(crate) struct ProxyFaults {
    pub(crate) seed: u64,
    pub(crate) p409: f64,
    pub(crate) p429: f64,
    pub(crate) status_p409: Arc<Mutex<f64>>,
    pub(crate) throttle_events: Arc<AtomicUsize>,
    pub(crate) trap: WriteTrap,
    pub(crate) node_write_check: Option<Arc<NodeWriteCheck>>,
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
    trap: WriteTrap,
    node_write_check: Option<Arc<NodeWriteCheck>>,
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
    let node_written = path_str
        .strip_prefix("/api/v1/nodes/")
        .filter(|n| write && !n.contains('/'));
    // The node as it is before a checked write, checked once the write is
    // applied (a write refused, say for a stale resourceVersion, changed
    // nothing).
    let mut to_check = None;
    if let (Some(name), Some(c)) = (node_written, &p.node_write_check) {
        let text = String::from_utf8_lossy(&bytes);
        if text.contains(&c.when_body_has) {
            match kube::Api::<k8s_openapi::api::core::v1::Node>::all(p.upstream.clone())
                .get(name)
                .await
            {
                Ok(before) => to_check = Some((c.clone(), before, text.into_owned())),
                // The API server is down: the write cannot land either.
                Err(e) => eprintln!("  proxy: node {name} unreadable before a checked write: {e}"),
            }
        }
    }
    let check_if_applied = |status: axum::http::StatusCode| {
        if let Some((c, before, text)) = &to_check
            && status.is_success()
        {
            (c.check)(before, text);
        }
    };
    let trapped = if write {
        let text = String::from_utf8_lossy(&bytes);
        let mut armed = p.trap.lock().unwrap_or_else(|e| e.into_inner());
        armed
            .iter()
            .position(|t| (t.matches)(&parts.method, path_str, &text))
            .map(|i| (armed.remove(i), text.into_owned()))
    } else {
        None
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
    if let Some((trap, body)) = trapped {
        if trap.fate == WriteFate::Landed {
            // Applied; its answer is what the restart takes away.
            let applied = p.upstream.send(up).await.map(|r| r.status());
            if let Ok(status) = applied {
                check_if_applied(status);
            }
            eprintln!(
                "  proxy: {} applied ({applied:?}), its answer held",
                trap.what
            );
        }
        let _ = trap
            .fired
            .send(format!("{} {path_str} {body}", parts.method));
        let _ = trap.resume.await;
        return status_response(
            503,
            "ServiceUnavailable",
            &format!(
                "chaos proxy: the API server restarted during this write ({:?})",
                trap.fate
            ),
        );
    }
    match p.upstream.send(up).await {
        Ok(resp) => {
            p.stats.forwarded.fetch_add(1, Ordering::Relaxed);
            check_if_applied(resp.status());
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
    faults: ProxyFaults,
) -> (Arc<ProxyStats>, tokio::task::JoinHandle<()>) {
    let stats = Arc::new(ProxyStats::default());
    let p = Proxy {
        upstream,
        rng: Arc::new(Mutex::new(StdRng::seed_from_u64(faults.seed))),
        p409: faults.p409,
        p429: faults.p429,
        status_p409: faults.status_p409,
        throttle_events: faults.throttle_events,
        trap: faults.trap,
        node_write_check: faults.node_write_check,
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
