//! Runs the real controller binary against the test cluster, scoped to one
//! test's policies (`--policy-selector ttdrv-test=<id>`) and namespace.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// A controller process; killed (SIGKILL) when dropped.
pub struct ControllerProcess {
    pub child: Child,
    pub admin_port: u16,
    pub identity: String,
}

/// Options beyond the defaults every test controller gets.
#[derive(Clone, Debug, Default)]
pub struct ControllerOptions {
    pub leader_elect: bool,
    pub lease_name: Option<String>,
    pub identity: Option<String>,
    pub extra_args: Vec<String>,
    /// Controller binary; default: `ttdrv-controller` beside the test binary's
    /// target directory (integration tests pass `env!("CARGO_BIN_EXE_ttdrv-controller")`).
    pub bin: Option<PathBuf>,
    /// Extra environment for the process (e.g. a KUBECONFIG with other credentials).
    pub env: Vec<(String, String)>,
    /// Keep the controller's default drain exemption (its own namespace).
    /// Off by default: the tests run their workloads in the controller's
    /// namespace, and drain them.
    pub exempt_own_namespace: bool,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(18080)
}

/// Path of the controller binary built for this test run.
pub fn controller_binary() -> PathBuf {
    // target/<profile>/deps/<test> -> target/<profile>/ttdrv-controller
    let exe = std::env::current_exe().unwrap_or_default();
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .map(PathBuf::from)
        .unwrap_or_default();
    dir.join("ttdrv-controller")
}

impl ControllerProcess {
    pub fn start(env: &crate::cluster::TestEnv, namespace: &str, opts: ControllerOptions) -> Self {
        let admin_port = free_port();
        let identity = opts
            .identity
            .clone()
            .unwrap_or_else(|| format!("ctl-{}", env.id));
        let bin = opts.bin.clone().unwrap_or_else(controller_binary);
        let mut cmd = Command::new(&bin);
        cmd.args([
            "--namespace",
            namespace,
            "--policy-selector",
            &env.selector(),
            "--admin-addr",
            &format!("127.0.0.1:{admin_port}"),
            "--resync-ms",
            "500",
            "--identity",
            &identity,
            "--installer-image",
            "example.invalid/tt-driver-agent:test",
            "--leader-elect",
            if opts.leader_elect { "true" } else { "false" },
            "--lease-name",
            opts.lease_name
                .as_deref()
                .unwrap_or(&format!("ttdrv-{}", env.id)),
            "--lease-duration-seconds",
            "6",
        ]);
        if !opts.exempt_own_namespace {
            cmd.arg("--drain-exempt-namespaces=");
        }
        cmd.args(&opts.extra_args);
        cmd.envs(opts.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let log = std::env::temp_dir().join(format!("ttdrv-controller-{identity}.log"));
        let out = std::fs::File::create(&log)
            .map(Stdio::from)
            .unwrap_or_else(|_| Stdio::null());
        cmd.stdout(Stdio::null())
            .stderr(out)
            .env("RUST_LOG", "info,kube=warn");
        let child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => panic!(
                "starting {} ({e}); build it with `cargo build --bin ttdrv-controller`",
                bin.display()
            ),
        };
        eprintln!("controller {identity} started, log: {}", log.display());
        Self {
            child,
            admin_port,
            identity,
        }
    }

    /// SIGKILL, as a crash would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// GET on the admin server; `None` when it does not answer.
    pub async fn admin_get(&self, path: &str) -> Option<(u16, String, String)> {
        admin_get(self.admin_port, path).await
    }

    /// The sum of the `/metrics` samples of `name` carrying every one of
    /// `labels` (0 when none, or the admin server does not answer).
    pub async fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.admin_get("/metrics")
            .await
            .map(|(_, _, body)| metric_sum(&body, name, labels))
            .unwrap_or_default()
    }
}

/// The sample values of `name` in Prometheus text `metrics` whose labels
/// include every one of `labels`, in order.
pub fn metric_samples<'a>(
    metrics: &'a str,
    name: &'a str,
    labels: &'a [(&'a str, &'a str)],
) -> impl Iterator<Item = f64> + 'a {
    metrics
        .lines()
        .filter(move |l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter(move |l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
}

/// The sum of [`metric_samples`].
pub fn metric_sum(metrics: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    metric_samples(metrics, name, labels).sum()
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// GET `path` on an admin server at 127.0.0.1:`port` (plain HTTP/1.1):
/// status code, content type and body; `None` when it does not answer.
pub async fn admin_get(port: u16, path: &str) -> Option<(u16, String, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.ok()?;
    let text = String::from_utf8_lossy(&buf).to_string();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    let ctype = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-type:")
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_default();
    Some((code, ctype, body.to_string()))
}
