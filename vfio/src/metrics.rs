//! The binder's Prometheus families, with the Go operator's names and labels
//! (dashboards and alerts carry over), and a minimal HTTP server for
//! `/metrics` and `/healthz`: two fixed GET routes do not need a framework.

use std::sync::Arc;

use prometheus::{Encoder, GaugeVec, IntCounterVec, IntGauge, Opts, Registry, TextEncoder};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::error::{Result, VfioError};

pub struct Metrics {
    registry: Registry,
    pub devices_bound: GaugeVec,
    pub bind_errors: IntCounterVec,
    pub noiommu_mode: IntGauge,
    pub device_info: GaugeVec,
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        // Fixed, valid names and labels: construction and registration cannot fail.
        let devices_bound = GaugeVec::new(
            Opts::new(
                "tt_vfio_devices_bound_total",
                "Number of PCI devices currently bound to vfio-pci.",
            ),
            &["resource"],
        )
        .expect("valid metric");
        let bind_errors = IntCounterVec::new(
            Opts::new(
                "tt_vfio_bind_errors_total",
                "Cumulative number of vfio-pci bind/unbind failures.",
            ),
            &["action"],
        )
        .expect("valid metric");
        let noiommu_mode = IntGauge::new(
            "tt_vfio_noiommu_mode",
            "1 if vfio-pci is operating in unsafe-noiommu mode, 0 otherwise.",
        )
        .expect("valid metric");
        let device_info = GaugeVec::new(
            Opts::new(
                "tt_vfio_device_info",
                "Identity of each PCI device the binder matched (always 1).",
            ),
            &["bdf", "resource", "board_type", "serial"],
        )
        .expect("valid metric");
        for c in [
            Box::new(devices_bound.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(bind_errors.clone()),
            Box::new(noiommu_mode.clone()),
            Box::new(device_info.clone()),
        ] {
            registry.register(c).expect("unique metric");
        }
        // Both actions exist from the start, so a rate() sees the first error.
        for action in ["bind", "unbind"] {
            bind_errors.with_label_values(&[action]);
        }
        Metrics {
            registry,
            devices_bound,
            bind_errors,
            noiommu_mode,
            device_info,
        }
    }

    /// The text exposition of every family.
    pub fn encode(&self) -> String {
        let mut out = Vec::new();
        // Encoding a gathered registry into a Vec does not fail.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8_lossy(&out).into_owned()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Go's `:9401` listens on every address; so does ours.
pub fn listen_addr(addr: &str) -> String {
    if addr.starts_with(':') {
        format!("0.0.0.0{addr}")
    } else {
        addr.to_string()
    }
}

/// Binds `addr` (Go's form) now, so a port in use fails the start.
pub async fn bind(addr: &str) -> Result<TcpListener> {
    TcpListener::bind(listen_addr(addr))
        .await
        .map_err(|source| VfioError::Metrics {
            addr: addr.to_string(),
            source,
        })
}

/// Serves `/metrics` and `/healthz` until the process ends.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>) {
    loop {
        let Ok((mut conn, _)) = listener.accept().await else {
            continue;
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 2048];
            let read =
                tokio::time::timeout(std::time::Duration::from_secs(5), conn.read(&mut buf)).await;
            let Ok(Ok(n)) = read else { return };
            let (status, ctype, body) = respond(&String::from_utf8_lossy(&buf[..n]), &metrics);
            let head = format!(
                "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = conn.write_all(head.as_bytes()).await;
            let _ = conn.write_all(body.as_bytes()).await;
            let _ = conn.shutdown().await;
        });
    }
}

/// Status, content type and body for a request's first line.
fn respond(request: &str, metrics: &Metrics) -> (&'static str, &'static str, String) {
    let mut words = request.split_whitespace();
    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/metrics") => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            metrics.encode(),
        ),
        ("GET", "/healthz") => ("200 OK", "text/plain; charset=utf-8", "ok".into()),
        ("GET", _) => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "not found\n".into(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            "GET only\n".into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn metrics_and_healthz_are_served_with_gos_names() {
        let m = Arc::new(Metrics::new());
        m.devices_bound
            .with_label_values(&["tenstorrent.com/wormhole"])
            .set(2.0);
        m.device_info
            .with_label_values(&["0000:01:00.0", "tenstorrent.com/wormhole", "n150", ""])
            .set(1.0);
        let listener = bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(serve(listener, m));
        let get = |path: &'static str| async move {
            let mut c = tokio::net::TcpStream::connect(addr).await.expect("connect");
            c.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
                .await
                .expect("send");
            let mut out = String::new();
            c.read_to_string(&mut out).await.expect("read");
            out
        };
        let body = get("/metrics").await;
        for want in [
            "HTTP/1.1 200 OK",
            "tt_vfio_devices_bound_total{resource=\"tenstorrent.com/wormhole\"} 2",
            "tt_vfio_bind_errors_total{action=\"bind\"} 0",
            "tt_vfio_noiommu_mode 0",
            "tt_vfio_device_info{bdf=\"0000:01:00.0\",board_type=\"n150\"",
        ] {
            assert!(body.contains(want), "{want} in {body}");
        }
        assert!(get("/healthz").await.ends_with("\r\n\r\nok"));
        assert!(get("/other").await.starts_with("HTTP/1.1 404"));
        assert_eq!(listen_addr(":9401"), "0.0.0.0:9401");
    }
}
