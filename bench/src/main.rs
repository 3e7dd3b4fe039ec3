//! `ttdrv-bench`: rollout overhead and footprint of the controller on the local
//! simulated cluster, against a serial kubectl baseline (issue 11).
//!
//! Run through `hack/bench.sh`, which builds the binaries, starts a dedicated
//! cluster with an audit policy that records the controller's requests, and
//! passes the paths below. For each group of N simulated Tenstorrent nodes it:
//!
//! 1. creates the nodes and an operator namespace, installs version 1 with a
//!    warm-up controller (not measured), then for each scenario (work, maxUnavailable):
//! 2. starts the simulated agent with that work and a fresh controller (running
//!    as its own ServiceAccount, so the audit log holds exactly its requests),
//! 3. watches the nodes (upgrade-state annotation, `spec.unschedulable`) with
//!    timestamps, patches the policy's version, and waits until every node is Done;
//! 4. reads the controller's CPU time and peak RSS from /proc and its requests
//!    from the audit log, stops it, and times `bench/baseline.sh` (serial
//!    kubectl) on a sample of the nodes.
//!
//! Besides the rollout scenarios: [`density`] (what pods cost the
//! controller), [`prepare`] (build ahead, cache-cold) and [`combined`] (a
//! firmware and driver wave).

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, Seek};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client};
use serde::{Deserialize, Serialize};
use ttdrv_api::{TenstorrentDriverPolicy, labels};
use ttdrv_testkit::TestEnv;

mod combined;
mod density;
mod prepare;

#[derive(Parser, Debug, Clone)]
#[command(about = "Benchmark the tt-kmd rollout controller on the simulated cluster")]
struct Args {
    /// Scenarios `N:work_ms:maxUnavailable[:baseline_sample[:rollout_sample]]`,
    /// comma-separated. Scenarios with the same N share one set of nodes (run in
    /// the order given). A rollout sample K > 0 stops the measurement once K nodes
    /// are Done and extrapolates the rollout time to N (only for the last
    /// scenario of its N: it leaves the rollout unfinished).
    #[arg(long, value_delimiter = ',')]
    scenarios: Vec<String>,
    #[arg(long, default_value = "-")]
    controller_bin: PathBuf,
    #[arg(long, default_value = "-")]
    sim_agent_bin: PathBuf,
    /// Kubeconfig of the controller's ServiceAccount (the identity the audit log records).
    #[arg(long, default_value = "-")]
    controller_kubeconfig: PathBuf,
    /// The API server's audit log.
    #[arg(long, default_value = "-")]
    audit_log: PathBuf,
    /// User name of the controller in the audit log.
    #[arg(
        long,
        default_value = "system:serviceaccount:default:ttdrv-bench-controller"
    )]
    audit_user: String,
    #[arg(long, default_value = "-")]
    baseline_script: PathBuf,
    /// Nodes the baseline runs on when a scenario gives no sample size (extrapolated to N).
    #[arg(long, default_value_t = 20)]
    baseline_sample: usize,
    /// Controller `--resync-ms` (its production default is 2000).
    #[arg(long, default_value_t = 2000)]
    resync_ms: u64,
    /// Print the tables of an earlier run's results.json and exit.
    #[arg(long)]
    render: Option<PathBuf>,
    /// Pod density (docs/benchmarks.md): M ordinary pods besides each
    /// group's nodes, measured with each of `--density-bins` before the
    /// group's rollout scenarios (which then run with the pods in place).
    #[arg(long, default_value_t = 0)]
    pods: usize,
    /// Controllers compared by the pod-density run, `label=path`,
    /// comma-separated (default: `--controller-bin` as "this build").
    #[arg(long, value_delimiter = ',')]
    density_bins: Vec<String>,
    /// Build ahead (issue 22): scenarios `N:on|off|kubectl` (prepare on, off,
    /// the kubectl loop), cache-cold 2.7.0 -> 2.8.0, one node at a time,
    /// instead of the rollout scenarios. See bench/src/prepare.rs.
    #[arg(long, value_delimiter = ',')]
    prepare: Vec<String>,
    /// Print the table of `--prepare` summaries (prepare-*.json) and exit.
    #[arg(long, value_delimiter = ',')]
    render_prepare: Vec<PathBuf>,
    /// Run the `--prepare` scenarios at once (each on its own nodes).
    #[arg(long)]
    parallel: bool,
    /// The simulated agent's build time in the `--prepare` scenarios, ms.
    #[arg(long, default_value_t = 60_000)]
    build_ms: u64,
    /// The simulated agent's load time in the `--prepare` scenarios (the
    /// swap in the `--combined` ones), ms.
    #[arg(long, default_value_t = 2_000)]
    load_ms: u64,
    /// Combined firmware + driver wave (issue 32): scenarios `N:on|off[:K]`
    /// (`--combine-firmware-and-driver` on or off; K = maxUnavailable =
    /// maxParallel, default N/10). See bench/src/combined.rs. The swap takes
    /// `--load-ms`, the flash `--flash-ms`.
    #[arg(long, value_delimiter = ',')]
    combined: Vec<String>,
    /// Print the table of `--combined` summaries (combined-*.json) and exit.
    #[arg(long, value_delimiter = ',')]
    render_combined: Vec<PathBuf>,
    /// The simulated flash in the `--combined` scenarios, ms.
    #[arg(long, default_value_t = 5_000)]
    flash_ms: u64,
    /// Directory for logs and results.
    #[arg(long, default_value = "/tmp/ttdrv-bench")]
    out_dir: PathBuf,
}

#[derive(Clone, Debug)]
struct Scenario {
    nodes: usize,
    work_ms: u64,
    max_unavailable: String,
    baseline_sample: usize,
    /// Measure the first K nodes only (0: all).
    rollout_sample: usize,
}

fn parse_scenario(s: &str, default_sample: usize) -> anyhow::Result<Scenario> {
    let parts: Vec<&str> = s.trim().split(':').collect();
    if parts.len() < 3 {
        bail!("scenario {s:?}: want N:work_ms:maxUnavailable[:baseline_sample[:rollout_sample]]");
    }
    let nodes: usize = parts[0].parse().context("N")?;
    Ok(Scenario {
        nodes,
        work_ms: parts[1].parse().context("work_ms")?,
        max_unavailable: parts[2].to_string(),
        baseline_sample: match parts.get(3) {
            Some(p) => p.parse().context("baseline_sample")?,
            None => default_sample,
        }
        .min(nodes),
        rollout_sample: match parts.get(4) {
            Some(p) => p.parse::<usize>().context("rollout_sample")?.min(nodes),
            None => 0,
        },
    })
}

/// maxUnavailable resolved the way the controller does.
fn resolve_max_unavailable(spec: &str, n: usize) -> usize {
    match spec.strip_suffix('%') {
        Some(p) => (n * p.parse::<usize>().unwrap_or(0) / 100).max(1),
        None => spec.parse::<usize>().unwrap_or(1).max(1),
    }
}

/// One timestamped change seen by the node watcher.
#[derive(Clone, Debug)]
struct Seen {
    at: Instant,
    node: String,
    /// Upgrade state entered (from the annotation), "Cordon" for
    /// `spec.unschedulable` turning true, or "Loaded" for the agent setting the
    /// node's kmd-version label to a new value (its work is done).
    what: String,
    target: String,
}

#[derive(Default)]
struct WatchState {
    synced: bool,
    events: Vec<Seen>,
    last: HashMap<String, NodeKey>,
    /// Installer pods (uid) seen Ready.
    ready_pods: std::collections::HashSet<String>,
}

/// Watches the nodes of one group and records every state change with the time
/// it was seen; and the installer pods of the operator namespace turning
/// Ready ("Ready" on their node).
struct NodeWatcher {
    state: Arc<Mutex<WatchState>>,
    task: tokio::task::JoinHandle<()>,
    pods: tokio::task::JoinHandle<()>,
}

/// Records "Ready" on a node when a pod of `ns` on it turns Ready: the agent
/// is done when its label and its pod's Ready are both in (the controller
/// waits for both; the simulated agent, as the kubelet after a real one,
/// writes the pod's status after the label).
fn watch_pods_ready(
    client: Client,
    ns: &str,
    st: Arc<Mutex<WatchState>>,
) -> tokio::task::JoinHandle<()> {
    let api: Api<Pod> = Api::namespaced(client, ns);
    tokio::spawn(async move {
        let mut stream = watcher(api, watcher::Config::default()).boxed();
        while let Some(ev) = stream.next().await {
            let at = Instant::now();
            let (p, initial) = match ev {
                Ok(watcher::Event::Apply(p)) => (p, false),
                Ok(watcher::Event::InitApply(p)) => (p, true),
                _ => continue,
            };
            let (Some(uid), Some(node)) = (
                p.metadata.uid.clone(),
                p.spec.as_ref().and_then(|s| s.node_name.clone()),
            ) else {
                continue;
            };
            if !ttdrv_testkit::pod_ready(&p) {
                continue;
            }
            let Ok(mut s) = st.lock() else { break };
            if !s.ready_pods.insert(uid) || initial {
                continue;
            }
            let Some(target) = s.last.get(&node).map(|k| k.1.clone()) else {
                continue;
            };
            s.events.push(Seen {
                at,
                node,
                what: "Ready".into(),
                target,
            });
        }
    })
}

impl NodeWatcher {
    async fn start(client: Client, selector: &str, ns: &str) -> anyhow::Result<Self> {
        let api: Api<Node> = Api::all(client.clone());
        let state = Arc::new(Mutex::new(WatchState::default()));
        let pods = watch_pods_ready(client, ns, state.clone());
        let st = state.clone();
        let cfg = watcher::Config::default().labels(selector);
        let task = tokio::spawn(async move {
            let mut stream = watcher(api, cfg).boxed();
            loop {
                let Some(ev) = next_node_event(&mut stream).await else {
                    break;
                };
                let at = Instant::now();
                let Ok(mut s) = st.lock() else { break };
                match ev {
                    watcher::Event::InitApply(n) => {
                        let (name, k) = key(&n);
                        s.last.insert(name, k);
                    }
                    watcher::Event::InitDone => s.synced = true,
                    watcher::Event::Apply(n) => {
                        let (name, (state, target, cordoned, loaded)) = key(&n);
                        let prev = s.last.get(&name).cloned().unwrap_or_default();
                        if !loaded.is_empty() && loaded != prev.3 {
                            s.events.push(Seen {
                                at,
                                node: name.clone(),
                                what: "Loaded".into(),
                                target: target.clone(),
                            });
                        }
                        if state != prev.0 || target != prev.1 {
                            s.events.push(Seen {
                                at,
                                node: name.clone(),
                                what: state.clone(),
                                target: target.clone(),
                            });
                        }
                        if cordoned && !prev.2 {
                            s.events.push(Seen {
                                at,
                                node: name.clone(),
                                what: "Cordon".into(),
                                target: target.clone(),
                            });
                        }
                        s.last.insert(name, (state, target, cordoned, loaded));
                    }
                    _ => {}
                }
            }
        });
        let w = Self { state, task, pods };
        let t = Instant::now();
        while !w.state.lock().map(|s| s.synced).unwrap_or(false) {
            if t.elapsed() > Duration::from_secs(60) {
                bail!("node watcher did not sync within 60s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(w)
    }

    fn events(&self) -> Vec<Seen> {
        self.state
            .lock()
            .map(|s| s.events.clone())
            .unwrap_or_default()
    }

    /// Nodes currently Done at `target`.
    fn done_at(&self, target: &str) -> usize {
        self.state
            .lock()
            .map(|s| {
                s.last
                    .values()
                    .filter(|(st, t, _, _)| st == "Done" && t == target)
                    .count()
            })
            .unwrap_or(0)
    }
}

impl Drop for NodeWatcher {
    fn drop(&mut self) {
        self.task.abort();
        self.pods.abort();
    }
}

/// A node's record state and target, cordon, and loaded kmd version.
type NodeKey = (String, String, bool, String);

/// (name, (state, target, unschedulable, loaded version)) of a node.
fn key(n: &Node) -> (String, NodeKey) {
    let name = n.metadata.name.clone().unwrap_or_default();
    let rec = ttdrv_core::node::record(n).ok().flatten();
    let cordoned = ttdrv_core::node::unschedulable(n);
    let loaded = ttdrv_core::node::label(n, labels::KMD_VERSION)
        .unwrap_or_default()
        .to_string();
    let (state, target) = rec.map_or_else(Default::default, |r| {
        (r.state.as_str().to_string(), r.target)
    });
    (name, (state, target, cordoned, loaded))
}

/// /proc figures of a running process.
#[derive(Clone, Copy, Debug, Default)]
struct ProcStats {
    cpu_seconds: f64,
    hwm_kib: u64,
    rss_kib: u64,
}

fn clk_tck() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

fn proc_stats(pid: u32) -> anyhow::Result<ProcStats> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib = |k: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Ok(ProcStats {
        cpu_seconds: ticks / clk_tck(),
        hwm_kib: kib("VmHWM:"),
        rss_kib: kib("VmRSS:"),
    })
}

/// A child process killed when dropped.
struct Proc(Child);

impl Proc {
    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(18099)
}

struct Controller {
    proc: Proc,
    port: u16,
}

fn start_controller(
    args: &Args,
    env: &TestEnv,
    ns: &str,
    log: &Path,
    audited: bool,
    extra: &[String],
) -> anyhow::Result<Controller> {
    let port = free_port();
    let mut cmd = Command::new(&args.controller_bin);
    cmd.args([
        "--namespace",
        ns,
        "--policy-selector",
        &env.selector(),
        "--admin-addr",
        &format!("127.0.0.1:{port}"),
        "--resync-ms",
        &args.resync_ms.to_string(),
        "--leader-elect",
        "false",
        "--identity",
        &format!("bench-{}", env.id),
        "--installer-image",
        "example.invalid/tt-driver-agent:bench",
    ]);
    cmd.args(extra);
    if audited {
        cmd.env("KUBECONFIG", &args.controller_kubeconfig);
    }
    let out = std::fs::File::create(log)?;
    cmd.stdout(Stdio::null())
        .stderr(Stdio::from(out))
        // TTDRV_BENCH_RUST_LOG: a profiling run's filter (e.g. debug for the
        // controller's passes and writes); the level changes what is measured.
        .env(
            "RUST_LOG",
            std::env::var("TTDRV_BENCH_RUST_LOG").unwrap_or_else(|_| "info,kube=warn".into()),
        );
    let child = cmd
        .spawn()
        .with_context(|| format!("starting {}", args.controller_bin.display()))?;
    Ok(Controller {
        proc: Proc(child),
        port,
    })
}

fn start_agent(args: &Args, ns: &str, work_ms: u64, log: &Path) -> anyhow::Result<Proc> {
    let out = std::fs::File::create(log)?;
    let child = Command::new(&args.sim_agent_bin)
        .args(["--namespace", ns, "--work-ms", &work_ms.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::from(out))
        .spawn()
        .with_context(|| format!("starting {}", args.sim_agent_bin.display()))?;
    Ok(Proc(child))
}

async fn admin_get(port: u16, path: &str) -> Option<(u16, String)> {
    let (code, _, body) = ttdrv_testkit::controller::admin_get(port, path).await?;
    Some((code, body))
}

/// Sum of a metric's samples (all label sets) in Prometheus text.
fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with('{') || r.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Starts the controller, logging to `<out_dir>/controller-<name>.log`, and
/// waits until it is ready.
async fn start_ready_controller(
    args: &Args,
    env: &TestEnv,
    ns: &str,
    name: &str,
    audited: bool,
    extra: &[String],
) -> anyhow::Result<Controller> {
    let log = args.out_dir.join(format!("controller-{name}.log"));
    let mut ctl = start_controller(args, env, ns, &log, audited, extra)?;
    wait_ready(&mut ctl).await?;
    Ok(ctl)
}

async fn wait_ready(c: &mut Controller) -> anyhow::Result<()> {
    let t = Instant::now();
    loop {
        if let Ok(Some(st)) = c.proc.0.try_wait() {
            bail!("controller exited during start-up: {st}");
        }
        if let Some((200, _)) = admin_get(c.port, "/readyz").await {
            return Ok(());
        }
        if t.elapsed() > Duration::from_secs(120) {
            bail!("controller not ready after 120s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The next event of a node watch, waiting out (and logging) errors; `None`
/// when the watch ends.
pub(crate) async fn next_node_event<S>(stream: &mut S) -> Option<watcher::Event<Node>>
where
    S: futures::Stream<Item = Result<watcher::Event<Node>, watcher::Error>> + Unpin,
{
    loop {
        match stream.try_next().await {
            Ok(Some(ev)) => return Some(ev),
            Ok(None) => return None,
            Err(e) => {
                eprintln!("[bench] node watch error: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// `n` Tenstorrent nodes, created and Ready: their names, and the seconds
/// that took.
async fn create_ready_nodes(env: &TestEnv, n: usize) -> anyhow::Result<(Vec<String>, f64)> {
    let t = Instant::now();
    let nodes = create_nodes(env, n).await;
    wait_nodes_ready(env, n).await?;
    Ok((nodes, t.elapsed().as_secs_f64()))
}

async fn create_nodes(env: &TestEnv, n: usize) -> Vec<String> {
    create_named_nodes(env, n, "n", true).await
}

/// `n` nodes named `<prefix>NNNN`, Tenstorrent nodes when `tt` (plain ones
/// otherwise), created 16 at a time; their names, sorted.
pub(crate) async fn create_named_nodes(
    env: &TestEnv,
    n: usize,
    prefix: &str,
    tt: bool,
) -> Vec<String> {
    let names: Vec<String> = futures::stream::iter(0..n)
        .map(|i| async move {
            let name = format!("{prefix}{i:04}");
            let node = if tt {
                env.tt_node(&name, &[]).await
            } else {
                env.node(&name, &[]).await
            };
            node.metadata.name.unwrap_or_default()
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let mut names = names;
    names.sort();
    names
}

async fn wait_nodes_ready(env: &TestEnv, n: usize) -> anyhow::Result<()> {
    let api: Api<Node> = Api::all(env.client.clone());
    let t = Instant::now();
    loop {
        let list = api
            .list(&ListParams::default().labels(&env.selector()))
            .await?;
        let ready = list
            .items
            .iter()
            .filter(|nd| {
                nd.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .count();
        if ready >= n {
            return Ok(());
        }
        if t.elapsed() > Duration::from_secs(300) {
            bail!("only {ready} of {n} nodes Ready after 300s");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn policy_done(
    api: &Api<TenstorrentDriverPolicy>,
    name: &str,
    version: &str,
    n: usize,
) -> anyhow::Result<bool> {
    let p = api.get(name).await?;
    let st = p.status.unwrap_or_default();
    let at_version = st
        .nodes
        .iter()
        .filter(|e| {
            e.state == ttdrv_api::NodeState::Done && e.current_version.as_deref() == Some(version)
        })
        .count();
    Ok(st.desired_version.as_deref() == Some(version) && at_version >= n)
}

async fn wait_policy_done(
    api: &Api<TenstorrentDriverPolicy>,
    name: &str,
    version: &str,
    n: usize,
    timeout: Duration,
) -> anyhow::Result<()> {
    let t = Instant::now();
    while !policy_done(api, name, version, n).await? {
        if t.elapsed() > timeout {
            bail!("policy {name}: not all {n} nodes Done at {version} within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}

/// Requests of the controller in the audit log from byte `from` on, by
/// "verb resource[/subresource]"; watches counted apart (long-running).
/// Also returns how many (non-watch) requests were received before `split`
/// (RFC 3339, as the audit log writes it).
fn audit_counts(
    path: &Path,
    from: u64,
    user: &str,
    split: &str,
    until: &str,
) -> anyhow::Result<(BTreeMap<String, u64>, u64, u64)> {
    let mut f = std::fs::File::open(path)?;
    f.seek(std::io::SeekFrom::Start(from))?;
    let mut counts = BTreeMap::new();
    let mut watches = 0;
    let mut before = 0;
    for line in std::io::BufReader::new(f).lines() {
        let line = line?;
        let Ok(ev) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if ev["user"]["username"].as_str() != Some(user) {
            continue;
        }
        let verb = ev["verb"].as_str().unwrap_or("");
        if verb == "watch" {
            // One record per stage (ResponseStarted, ResponseComplete).
            if ev["stage"].as_str() == Some("ResponseStarted") {
                watches += 1;
            }
            continue;
        }
        if ev["stage"].as_str() != Some("ResponseComplete") {
            continue;
        }
        let received = ev["requestReceivedTimestamp"].as_str().unwrap_or("");
        if received > until {
            continue;
        }
        let obj = &ev["objectRef"];
        let mut res = obj["resource"].as_str().unwrap_or("-").to_string();
        if let Some(s) = obj["subresource"].as_str() {
            res = format!("{res}/{s}");
        }
        *counts.entry(format!("{verb} {res}")).or_insert(0) += 1;
        // Same format and zone (UTC, microseconds): string order is time order.
        if received < split {
            before += 1;
        }
    }
    Ok((counts, watches, before))
}

fn audit_size(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

#[derive(Serialize, Deserialize, Clone, Debug, Default)]
struct Result_ {
    nodes: usize,
    work_s: f64,
    max_unavailable: String,
    slots: usize,
    /// Nodes measured (N unless sampled).
    rollout_nodes: usize,
    rollout_measured_s: f64,
    /// Measured, or extrapolated to N for a sampled rollout.
    rollout_s: f64,
    /// (rollout − waves × work − eviction waits) / waves, in ms; waves = ceil(N / slots).
    controller_added_ms_per_node: f64,
    /// Mean time from the installer pod's deletion to the agent reporting the
    /// new version, minus the simulated work: the DaemonSet controller,
    /// scheduler, kwok and agent replacing the pod, ms.
    #[serde(default)]
    installer_replacement_ms: f64,
    /// From the agent done (label and pod Ready) to the node's next record, ms.
    #[serde(default)]
    agent_done_to_next_ms: f64,
    /// controller-added minus the installer replacement (one node at a time
    /// only; NaN otherwise), ms.
    #[serde(default)]
    controller_own_ms_per_node: f64,
    eviction_wait_s: f64,
    pods_evicted: f64,
    gap_p50_ms: f64,
    gap_p95_ms: f64,
    gap_max_ms: f64,
    first_cordon_ms: f64,
    /// Mean time in each state of a node's cycle, ms.
    phase_ms: BTreeMap<String, f64>,
    rss_peak_mib: f64,
    rss_end_mib: f64,
    cpu_rollout_s: f64,
    cpu_total_s: f64,
    reconciles: f64,
    /// Mean duration of one reconcile pass of the policy (controller metric).
    reconcile_mean_ms: f64,
    api_requests: u64,
    api_requests_per_node: f64,
    api_before_first_cordon: u64,
    api_watches: u64,
    api_by_kind: BTreeMap<String, u64>,
    baseline_nodes: usize,
    baseline_sampled_s: f64,
    baseline_s: f64,
    ratio: f64,
}

#[allow(clippy::too_many_arguments)]
async fn run_scenario(
    args: &Args,
    env: &TestEnv,
    ns: &str,
    policy: &str,
    nodes: &[String],
    baseline: &Baseline,
    sc: &Scenario,
    from_version: &str,
    version: &str,
    tag: &str,
) -> anyhow::Result<Result_> {
    let n = nodes.len();
    let papi: Api<TenstorrentDriverPolicy> = Api::all(env.client.clone());
    set_max_unavailable(&papi, policy, &sc.max_unavailable).await?;
    // Kept until the baseline is done: it plays the baseline's pods too.
    let _agent = start_agent(
        args,
        ns,
        sc.work_ms,
        &args.out_dir.join(format!("sim-agent-{tag}.log")),
    )?;
    let target = Target {
        ns,
        policy,
        from_version,
        version,
        n,
    };
    let run = measure_rollout(args, env, &papi, &target, sc, tag).await?;
    save_profile(args, &run, tag)?;
    let mut result = analyse(args, &run, sc, version, n)?;
    let (baseline_nodes, baseline_sampled_s) =
        run_baseline(args, ns, baseline, sc, version, tag, n)?;
    result.baseline_nodes = baseline_nodes;
    result.baseline_sampled_s = baseline_sampled_s;
    result.baseline_s = baseline_sampled_s * n as f64 / baseline_nodes.max(1) as f64;
    result.ratio = result.rollout_s / result.baseline_s;
    Ok(result)
}

/// maxUnavailable is set while no controller runs.
async fn set_max_unavailable(
    papi: &Api<TenstorrentDriverPolicy>,
    policy: &str,
    max_unavailable: &str,
) -> anyhow::Result<()> {
    let mu: serde_json::Value = match max_unavailable.parse::<i64>() {
        Ok(i) => i.into(),
        Err(_) => max_unavailable.to_string().into(),
    };
    papi.patch(
        policy,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "spec": { "upgradePolicy": { "maxUnavailable": mu } } })),
    )
    .await?;
    Ok(())
}

/// The rollout a scenario measures: the namespace, the policy, from which version to which,
/// over how many nodes.
struct Target<'a> {
    ns: &'a str,
    policy: &'a str,
    from_version: &'a str,
    version: &'a str,
    n: usize,
}

/// What a scenario's rollout left to analyse.
struct Rollout {
    events: Vec<Seen>,
    before: ProcStats,
    after: ProcStats,
    metrics_before: String,
    metrics_after: String,
    audit_from: u64,
    t0: Instant,
    t0_wall: k8s_openapi::jiff::Timestamp,
    /// When the goal was reached (and, unsampled, the status showed it).
    t_goal: Instant,
    slots: usize,
    waves: usize,
    /// Nodes to wait for: the sample, else all.
    goal: usize,
}

impl Rollout {
    /// `i` as wall-clock time, as the audit log writes it (RFC 3339, UTC,
    /// microseconds): string order is time order.
    fn wall(&self, i: Instant) -> String {
        let d = i.saturating_duration_since(self.t0);
        let ts = self
            .t0_wall
            .checked_add(k8s_openapi::jiff::SignedDuration::try_from(d).unwrap_or_default())
            .unwrap_or(self.t0_wall);
        format!(
            "{}.{:06}Z",
            ts.strftime("%Y-%m-%dT%H:%M:%S"),
            ts.subsec_microsecond()
        )
    }

    /// How much a controller counter grew over the rollout.
    fn metric_delta(&self, name: &str) -> f64 {
        metric_sum(&self.metrics_after, name) - metric_sum(&self.metrics_before, name)
    }
}

/// Starts the controller, lets it take stock, moves the policy to the new
/// version and watches the nodes until the goal is Done; the controller is
/// stopped on return.
async fn measure_rollout(
    args: &Args,
    env: &TestEnv,
    papi: &Api<TenstorrentDriverPolicy>,
    target: &Target<'_>,
    sc: &Scenario,
    tag: &str,
) -> anyhow::Result<Rollout> {
    let Target {
        ns,
        policy,
        from_version,
        version,
        n,
    } = *target;
    let mut ctl = start_ready_controller(args, env, ns, tag, true, &[]).await?;
    // Let it take stock (every node already Done at the old version) and go idle.
    wait_policy_done(papi, policy, from_version, n, Duration::from_secs(120)).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let watcher = NodeWatcher::start(env.client.clone(), &env.selector(), ns).await?;
    let before = proc_stats(ctl.proc.pid())?;
    let metrics_before = admin_get(ctl.port, "/metrics")
        .await
        .map(|(_, b)| b)
        .unwrap_or_default();
    let audit_from = audit_size(&args.audit_log);

    eprintln!(
        "[bench] {tag}: rollout {from_version} -> {version} on {n} nodes (work {} ms, maxUnavailable {})",
        sc.work_ms, sc.max_unavailable
    );
    let t0 = Instant::now();
    let t0_wall = k8s_openapi::jiff::Timestamp::now();
    papi.patch(
        policy,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "spec": { "version": version } })),
    )
    .await?;
    let slots = resolve_max_unavailable(&sc.max_unavailable, n);
    let waves = n.div_ceil(slots);
    let timeout =
        Duration::from_secs(120) + Duration::from_millis(waves as u64 * (sc.work_ms + 5000));
    let goal = if sc.rollout_sample > 0 {
        sc.rollout_sample
    } else {
        n
    };
    wait_for_goal(&watcher, &mut ctl, target, goal, t0, timeout, tag).await?;
    let events = watcher.events();
    let after = proc_stats(ctl.proc.pid())?;
    let metrics_after = admin_get(ctl.port, "/metrics")
        .await
        .map(|(_, b)| b)
        .unwrap_or_default();
    let sampled = goal < n;
    if !sampled {
        // Everything the controller did for this rollout: wait for the status to show it.
        wait_policy_done(papi, policy, version, n, Duration::from_secs(120)).await?;
    }
    let t_goal = Instant::now();
    tokio::time::sleep(Duration::from_secs(1)).await;
    drop(watcher);
    drop(ctl);
    Ok(Rollout {
        events,
        before,
        after,
        metrics_before,
        metrics_after,
        audit_from,
        t0,
        t0_wall,
        t_goal,
        slots,
        waves,
        goal,
    })
}

/// Waits until `goal` nodes are Done at the target version; fails when the
/// controller exits or the timeout passes. Reports progress every 30 s.
async fn wait_for_goal(
    watcher: &NodeWatcher,
    ctl: &mut Controller,
    target: &Target<'_>,
    goal: usize,
    t0: Instant,
    timeout: Duration,
    tag: &str,
) -> anyhow::Result<()> {
    let (version, n) = (target.version, target.n);
    let mut last_report = Instant::now();
    loop {
        let done = watcher.done_at(version);
        if done >= goal {
            return Ok(());
        }
        if let Ok(Some(st)) = ctl.proc.0.try_wait() {
            bail!("controller exited during the rollout: {st}");
        }
        if t0.elapsed() > timeout {
            bail!("rollout not finished after {timeout:?}: {done} of {n} Done");
        }
        if last_report.elapsed() > Duration::from_secs(30) {
            eprintln!(
                "[bench] {tag}: {done}/{n} Done after {:.0}s",
                t0.elapsed().as_secs_f64()
            );
            last_report = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The scenario's figures from its rollout (the baseline's left at zero).
fn analyse(
    args: &Args,
    run: &Rollout,
    sc: &Scenario,
    version: &str,
    n: usize,
) -> anyhow::Result<Result_> {
    let (t0, slots, waves, goal) = (run.t0, run.slots, run.waves, run.goal);
    let sampled = goal < n;
    let done_t = done_times(&run.events, version);
    let end = done_t.last().copied().unwrap_or(t0);
    let rollout_measured_s = end.duration_since(t0).as_secs_f64();
    let first_cordon = run
        .events
        .iter()
        .filter(|e| e.what == "Cordon")
        .map(|e| e.at)
        .min();
    let first_cordon_ms = first_cordon
        .map(|c| c.duration_since(t0).as_secs_f64() * 1000.0)
        .unwrap_or(f64::NAN);
    // A sampled rollout: the time to the first cordon, then the measured pace
    // of the K nodes, extrapolated to all N.
    let rollout_s = if sampled && !first_cordon_ms.is_nan() {
        let fc = first_cordon_ms / 1000.0;
        fc + (rollout_measured_s - fc) * n as f64 / goal as f64
    } else {
        rollout_measured_s
    };
    let (by_kind, watches, before_first_cordon) =
        rollout_audit(args, run, first_cordon, end, sampled)?;
    let gaps = slot_gaps(&run.events, version, &done_t, slots);
    let phase_sum = phase_sums(&run.events, version);
    // Eviction waits: time in Draining while the controller actually evicted
    // pods. The benchmark nodes run only the installer DaemonSet pod, which the
    // drain leaves alone, so nothing is evicted and Draining is pure controller
    // time (one reconcile round): it stays in the controller-added figure.
    let reconciles = run.metric_delta("ttdriver_reconcile_total");
    let rec_time = run.metric_delta("ttdriver_reconcile_duration_seconds_sum");
    let reconcile_mean_ms = rec_time * 1000.0 / reconciles.max(1.0);
    let evicted = run.metric_delta("ttdriver_pods_evicted_total");
    let eviction_wait_s = if evicted > 0.0 {
        phase_sum
            .get("Draining")
            .map(|(s, _)| s / 1000.0 / slots as f64)
            .unwrap_or(0.0)
    } else {
        0.0
    };
    let phase_ms: BTreeMap<String, f64> = phase_sum
        .into_iter()
        .map(|(k, (s, c))| (k, s / c.max(1) as f64))
        .collect();
    let work_s = sc.work_ms as f64 / 1000.0;
    let added = (rollout_s - waves as f64 * work_s - eviction_wait_s) / waves as f64 * 1000.0;
    // From the controller's entering Upgrading (it deletes the installer pod
    // right after) to the agent done: its label and its pod Ready.
    let (agent_ms, agent_done_to_next_ms) = agent_done_split(&run.events, version);
    let installer_replacement_ms = agent_ms - sc.work_ms as f64;
    let controller_own_ms_per_node = if slots == 1 {
        added - installer_replacement_ms
    } else {
        f64::NAN
    };
    let api_requests: u64 = by_kind.values().sum();
    // Per node upgrade: all of a full rollout over N; for a sample, the one-time
    // pass over all N nodes before the first cordon over N plus the rest over K.
    let api_requests_per_node = if sampled {
        before_first_cordon as f64 / n as f64
            + (api_requests - before_first_cordon) as f64 / goal as f64
    } else {
        api_requests as f64 / n as f64
    };
    let (before, after) = (run.before, run.after);
    Ok(Result_ {
        nodes: n,
        work_s,
        max_unavailable: sc.max_unavailable.clone(),
        slots,
        rollout_nodes: goal,
        rollout_measured_s,
        rollout_s,
        controller_added_ms_per_node: added,
        installer_replacement_ms,
        agent_done_to_next_ms,
        controller_own_ms_per_node,
        eviction_wait_s,
        pods_evicted: evicted,
        gap_p50_ms: percentile(&gaps, 50.0),
        gap_p95_ms: percentile(&gaps, 95.0),
        gap_max_ms: gaps.last().copied().unwrap_or(f64::NAN),
        first_cordon_ms,
        phase_ms,
        rss_peak_mib: after.hwm_kib as f64 / 1024.0,
        rss_end_mib: after.rss_kib as f64 / 1024.0,
        cpu_rollout_s: after.cpu_seconds - before.cpu_seconds,
        cpu_total_s: after.cpu_seconds,
        reconciles,
        reconcile_mean_ms,
        api_requests,
        api_requests_per_node,
        api_before_first_cordon: before_first_cordon,
        api_watches: watches,
        api_by_kind: by_kind,
        ..Default::default()
    })
}

/// When each node finished its cycle to `version`, in order.
fn done_times(events: &[Seen], version: &str) -> Vec<Instant> {
    let mut done_t: Vec<Instant> = events
        .iter()
        .filter(|e| e.target == version && e.what == "Done")
        .map(|e| e.at)
        .collect();
    done_t.sort();
    done_t
}

/// The controller's API requests during the rollout, from the audit log:
/// by kind, the watches, and those before the first cordon. A sampled
/// rollout goes on after the K-th node: count only up to it.
fn rollout_audit(
    args: &Args,
    run: &Rollout,
    first_cordon: Option<Instant>,
    end: Instant,
    sampled: bool,
) -> anyhow::Result<(BTreeMap<String, u64>, u64, u64)> {
    let wall = |i: Instant| run.wall(i);
    let split = first_cordon.map(&wall).unwrap_or_default();
    let until = if sampled {
        wall(end)
    } else {
        wall(run.t_goal + Duration::from_secs(1))
    };
    audit_counts(
        &args.audit_log,
        run.audit_from,
        &args.audit_user,
        &split,
        &until,
    )
}

/// For `bench/profile.py`: what the node and pod watches saw
/// (`timeline-<tag>.jsonl`) and the controller's requests as the API server
/// recorded them, with the time each came in and was answered
/// (`audit-<tag>.jsonl`), both in wall-clock time.
fn save_profile(args: &Args, run: &Rollout, tag: &str) -> anyhow::Result<()> {
    let mut timeline = String::new();
    for e in &run.events {
        let line = serde_json::json!({
            "t": run.wall(e.at),
            "node": e.node,
            "what": e.what,
            "target": e.target,
        });
        timeline.push_str(&line.to_string());
        timeline.push('\n');
    }
    std::fs::write(args.out_dir.join(format!("timeline-{tag}.jsonl")), timeline)?;
    let mut f = std::fs::File::open(&args.audit_log)?;
    f.seek(std::io::SeekFrom::Start(run.audit_from))?;
    let mut audit = String::new();
    for line in std::io::BufReader::new(f).lines() {
        let line = line?;
        let Ok(ev) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if ev["user"]["username"].as_str() == Some(args.audit_user.as_str())
            && ev["verb"].as_str() != Some("watch")
        {
            audit.push_str(&line);
            audit.push('\n');
        }
    }
    std::fs::write(args.out_dir.join(format!("audit-{tag}.jsonl")), audit)?;
    Ok(())
}

/// The waits between a slot freeing and the next node starting in it, ms,
/// sorted: the k-th node to finish frees the slot the (k + slots)-th starts in.
fn slot_gaps(events: &[Seen], version: &str, done_t: &[Instant], slots: usize) -> Vec<f64> {
    // A cycle starts with its cordon, written with the Cordoning record or,
    // folded into one patch, with the Draining record: each node's first.
    let mut first: HashMap<&str, Instant> = HashMap::new();
    for e in events.iter().filter(|e| e.target == version) {
        if e.what == "Cordoning" || e.what == "Draining" {
            first.entry(e.node.as_str()).or_insert(e.at);
        }
    }
    let mut starts: Vec<Instant> = first.into_values().collect();
    starts.sort();
    let mut gaps: Vec<f64> = done_t
        .iter()
        .enumerate()
        .filter_map(|(k, d)| {
            let s = starts.get(k + slots)?;
            Some(s.saturating_duration_since(*d).as_secs_f64() * 1000.0)
        })
        .collect();
    gaps.sort_by(|a, b| a.total_cmp(b));
    gaps
}

/// The agent's share and the controller's after it, mean ms per node: from
/// Upgrading (the controller deletes the installer pod) to the agent done —
/// its `kmd-version` label and its pod Ready, whichever comes last, as the
/// controller waits for both — and from then to the node's next record.
fn agent_done_split(events: &[Seen], version: &str) -> (f64, f64) {
    let mut per_node: HashMap<&str, Vec<&Seen>> = HashMap::new();
    for e in events.iter().filter(|e| e.target == version) {
        per_node.entry(e.node.as_str()).or_default().push(e);
    }
    let (mut agent, mut after, mut count) = (0.0, 0.0, 0usize);
    for seq in per_node.values() {
        let Some(upg) = seq.iter().position(|e| e.what == "Upgrading") else {
            continue;
        };
        let rest = &seq[upg + 1..];
        let first = |w: &str| rest.iter().find(|e| e.what == w).map(|e| e.at);
        let (Some(label), Some(ready)) = (first("Loaded"), first("Ready")) else {
            continue;
        };
        let done = label.max(ready);
        let record = |e: &&&Seen| !["Loaded", "Ready", "Cordon"].contains(&e.what.as_str());
        let Some(next) = rest.iter().filter(record).find(|e| e.at >= done) else {
            continue;
        };
        agent += done.duration_since(seq[upg].at).as_secs_f64() * 1000.0;
        after += next.at.duration_since(done).as_secs_f64() * 1000.0;
        count += 1;
    }
    let n = count.max(1) as f64;
    if count == 0 {
        return (f64::NAN, f64::NAN);
    }
    (agent / n, after / n)
}

/// Per state of a node's cycle (Pending aside): the total time nodes spent
/// in it, ms, and how many stays that counts.
fn phase_sums(events: &[Seen], version: &str) -> BTreeMap<String, (f64, usize)> {
    // Per node: time entering each state.
    let mut per_node: HashMap<&str, Vec<(&str, Instant)>> = HashMap::new();
    for e in events.iter().filter(|e| e.target == version) {
        if e.what != "Cordon" && e.what != "Ready" {
            per_node
                .entry(e.node.as_str())
                .or_default()
                .push((e.what.as_str(), e.at));
        }
    }
    let mut phase_sum: BTreeMap<String, (f64, usize)> = BTreeMap::new();
    for seq in per_node.values() {
        for w in seq.windows(2) {
            let (state, t) = w[0];
            if state == "Pending" {
                continue;
            }
            let e = phase_sum.entry(state.to_string()).or_insert((0.0, 0));
            e.0 += w[1].1.duration_since(t).as_secs_f64() * 1000.0;
            e.1 += 1;
        }
    }
    phase_sum
}

/// Baseline: serial kubectl on its own sample of nodes, the controller
/// stopped. The nodes it did and the time it took, s.
fn run_baseline(
    args: &Args,
    ns: &str,
    baseline: &Baseline,
    sc: &Scenario,
    version: &str,
    tag: &str,
    n: usize,
) -> anyhow::Result<(usize, f64)> {
    let sample: Vec<String> = baseline
        .nodes
        .iter()
        .take(sc.baseline_sample)
        .cloned()
        .collect();
    eprintln!(
        "[bench] {tag}: kubectl baseline on {} nodes (extrapolated to {n})",
        sample.len()
    );
    let b0 = Instant::now();
    let status = Command::new("bash")
        .arg(&args.baseline_script)
        .args([
            ns,
            &baseline.daemonset,
            &format!("{}={}", labels::CLAIM, baseline.claim),
            version,
        ])
        .args(&sample)
        .status()?;
    if !status.success() {
        bail!("baseline script failed: {status}");
    }
    Ok((sample.len(), b0.elapsed().as_secs_f64()))
}

async fn run_group(
    args: &Args,
    n: usize,
    scenarios: &[Scenario],
    results: &mut Vec<Result_>,
    densities: &mut Vec<density::Density>,
) -> anyhow::Result<()> {
    let env = TestEnv::new(&format!("bench-{n}")).await;
    let ns = env.namespace().await;
    let (nodes, took) = create_ready_nodes(&env, n).await?;
    eprintln!(
        "[bench] {n} nodes created and Ready in {took:.1}s (group {})",
        env.id
    );
    let benv = TestEnv::new(&format!("bench-{n}-baseline")).await;
    let bcount = scenarios
        .iter()
        .map(|s| s.baseline_sample)
        .max()
        .unwrap_or(0);
    let baseline = Baseline::create(&benv, &ns, bcount).await?;
    ttdrv_testkit::ensure_crd(&env.client).await;
    let policy = env.name("fleet");
    let spec: ttdrv_api::TenstorrentDriverPolicySpec = serde_yaml::from_str(&format!(
        "version: \"1.0.0\"\nnodeAffinity: {{matchLabels: {{{}: {}}}}}",
        ttdrv_testkit::TEST_LABEL,
        env.id
    ))?;
    let mut p = TenstorrentDriverPolicy::new(&policy, spec);
    p.metadata.labels = Some(env.labels());
    let papi: Api<TenstorrentDriverPolicy> = Api::all(env.client.clone());
    papi.create(&PostParams::default(), &p).await?;
    {
        // First install (no drain, all nodes at once): set-up, not measured.
        let t = Instant::now();
        let _agent = start_agent(
            args,
            &ns,
            0,
            &args.out_dir.join(format!("sim-agent-{n}-install.log")),
        )?;
        let _ctl =
            start_ready_controller(args, &env, &ns, &format!("{n}-install"), false, &[]).await?;
        wait_policy_done(&papi, &policy, "1.0.0", n, Duration::from_secs(600)).await?;
        baseline.wait_ready(&env.client, &ns).await?;
        eprintln!(
            "[bench] first install of 1.0.0 on {n} nodes: {:.1}s",
            t.elapsed().as_secs_f64()
        );
    }
    let place = if args.pods > 0 {
        let place = density::PodPlace::create(n, &nodes, args.pods).await?;
        let bins: Vec<(String, PathBuf)> = if args.density_bins.is_empty() {
            vec![("this build".into(), args.controller_bin.clone())]
        } else {
            args.density_bins
                .iter()
                .map(|b| match b.split_once('=') {
                    Some((l, p)) => Ok((l.to_string(), PathBuf::from(p))),
                    None => bail!("--density-bins {b:?}: want label=path"),
                })
                .collect::<anyhow::Result<_>>()?
        };
        for (i, (label, bin)) in bins.iter().enumerate() {
            if i > 0 {
                density::clear(&place, args.pods).await?;
            }
            let d =
                density::run(args, &env, &ns, &policy, n, &place, args.pods, bin, label).await?;
            eprintln!("[bench] density: {}", serde_json::to_string(&d)?);
            densities.push(d);
            std::fs::write(
                args.out_dir.join("density.json"),
                serde_json::to_string_pretty(&*densities)?,
            )?;
            std::fs::write(args.out_dir.join("density.md"), density::table(densities))?;
        }
        Some(place)
    } else {
        None
    };
    let mut from = "1.0.0".to_string();
    for (i, sc) in scenarios.iter().enumerate() {
        let version = format!("1.{}.0", i + 1);
        let tag = format!(
            "{n}-{}ms-{}",
            sc.work_ms,
            sc.max_unavailable.replace('%', "pct")
        );
        let r = run_scenario(
            args, &env, &ns, &policy, &nodes, &baseline, sc, &from, &version, &tag,
        )
        .await?;
        eprintln!("[bench] {tag}: {}", serde_json::to_string(&r)?);
        results.push(r);
        from = version;
    }
    // Clean up the group so the next one's controller sees only its own nodes.
    let _ = papi.delete(&policy, &DeleteParams::default()).await;
    let dsapi: Api<DaemonSet> = Api::namespaced(env.client.clone(), &ns);
    let _ = dsapi
        .delete(&baseline.daemonset, &DeleteParams::default())
        .await;
    benv.cleanup().await;
    if let Some(place) = place {
        place.env.cleanup().await;
    }
    env.cleanup().await;
    let api: Api<Node> = Api::all(env.client.clone());
    let t = Instant::now();
    while !api
        .list(&ListParams::default().labels(&env.selector()))
        .await?
        .items
        .is_empty()
        && t.elapsed() < Duration::from_secs(120)
    {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}

/// The kubectl baseline's installer DaemonSet `name` in `ns` on the run's
/// nodes (claim label `name`), its pods reporting `version`; shared with
/// the prepare scenario.
async fn create_baseline_daemonset(
    env: &TestEnv,
    ns: &str,
    name: &str,
    version: &str,
) -> anyhow::Result<()> {
    let ds: DaemonSet = serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": { "name": name, "namespace": ns, "labels": env.labels() },
        "spec": {
            "selector": { "matchLabels": { labels::CLAIM: name } },
            "updateStrategy": { "type": "OnDelete" },
            "template": {
                "metadata": { "labels": { labels::CLAIM: name } },
                "spec": {
                    "nodeSelector": { ttdrv_testkit::TEST_LABEL: env.id },
                    "containers": [{
                        "name": "agent",
                        "image": "example.invalid/tt-driver-agent:bench",
                        "env": [{ "name": labels::env::TT_KMD_VERSION, "value": version }]
                    }]
                }
            }
        }
    }))?;
    let api: Api<DaemonSet> = Api::namespaced(env.client.clone(), ns);
    api.create(&PostParams::default(), &ds).await?;
    Ok(())
}

/// The baseline's own nodes and installer DaemonSet: not matched by the policy,
/// so the controller never touches them; the simulated agent plays their pods
/// (it serves every pod carrying the claim label in the namespace).
struct Baseline {
    nodes: Vec<String>,
    daemonset: String,
    claim: String,
}

impl Baseline {
    async fn create(benv: &TestEnv, ns: &str, count: usize) -> anyhow::Result<Self> {
        let mut nodes = vec![];
        for i in 0..count {
            let node = benv.node(&format!("b{i:03}"), &[]).await;
            nodes.push(node.metadata.name.unwrap_or_default());
        }
        let daemonset = benv.name("kubectl");
        let claim = daemonset.clone();
        create_baseline_daemonset(benv, ns, &daemonset, "1.0.0").await?;
        Ok(Self {
            nodes,
            daemonset,
            claim,
        })
    }

    async fn wait_ready(&self, client: &Client, ns: &str) -> anyhow::Result<()> {
        let api: Api<Pod> = Api::namespaced(client.clone(), ns);
        let lp = ListParams::default().labels(&format!("{}={}", labels::CLAIM, self.claim));
        let t = Instant::now();
        loop {
            let ready = api
                .list(&lp)
                .await?
                .items
                .iter()
                .filter(|p| ttdrv_testkit::pod_ready(p))
                .count();
            if ready >= self.nodes.len() {
                return Ok(());
            }
            if t.elapsed() > Duration::from_secs(120) {
                bail!("baseline pods: {ready} of {} Ready", self.nodes.len());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

fn fmt_ms(v: f64) -> String {
    if v.is_nan() {
        "-".into()
    } else {
        format!("{v:.0}")
    }
}

fn table(results: &[Result_]) -> String {
    let mut s = String::new();
    s.push_str("| N | work/node | maxUnavailable | rollout | controller-added / node | of which installer pod replacement | controller's own / node | Done→next cordon p50 / p95 | patch→first cordon | peak RSS | CPU (rollout / process) | API requests / node | kubectl baseline | ours / baseline |\n");
    s.push_str("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for r in results {
        let baseline = if r.baseline_nodes < r.nodes {
            format!(
                "{:.1} s (×{:.0} of {} nodes: {:.1} s)",
                r.baseline_s,
                r.nodes as f64 / r.baseline_nodes as f64,
                r.baseline_nodes,
                r.baseline_sampled_s
            )
        } else {
            format!("{:.1} s", r.baseline_s)
        };
        let rollout = if r.rollout_nodes < r.nodes {
            format!(
                "{:.0} s (extrapolated: first {} nodes in {:.1} s)",
                r.rollout_s, r.rollout_nodes, r.rollout_measured_s
            )
        } else {
            format!("{:.1} s", r.rollout_s)
        };
        // With several slots the formula gives the time per wave of `slots` nodes.
        let added = if r.slots > 1 {
            format!(
                "{} ms per wave of {} (≈{} ms/node)",
                fmt_ms(r.controller_added_ms_per_node),
                r.slots,
                fmt_ms(r.controller_added_ms_per_node / r.slots as f64)
            )
        } else {
            format!("{} ms", fmt_ms(r.controller_added_ms_per_node))
        };
        let ratio = if r.slots > 1 {
            format!("{:.2} ({} at a time vs serial)", r.ratio, r.slots)
        } else {
            format!("{:.2}", r.ratio)
        };
        s.push_str(&format!(
            "| {} | {:.0} s | {} | {} | {} | {} ms | {} | {} / {} ms | {} ms | {:.1} MiB | {:.2} / {:.2} s | {:.1} | {} | {} |\n",
            r.nodes,
            r.work_s,
            r.max_unavailable,
            rollout,
            added,
            fmt_ms(r.installer_replacement_ms),
            if r.controller_own_ms_per_node.is_nan() {
                "-".to_string()
            } else {
                format!("{} ms", fmt_ms(r.controller_own_ms_per_node))
            },
            fmt_ms(r.gap_p50_ms),
            fmt_ms(r.gap_p95_ms),
            fmt_ms(r.first_cordon_ms),
            r.rss_peak_mib,
            r.cpu_rollout_s,
            r.cpu_total_s,
            r.api_requests_per_node,
            baseline,
            ratio
        ));
    }
    s
}

fn breakdown(results: &[Result_]) -> String {
    let mut s = String::new();
    s.push_str("| N | work | maxUnavailable | Cordoning | Draining | Upgrading (pod replaced + work) | agent done (label and pod Ready) → next record | Uncordoning | Done→next gap max | reconciles (mean duration) | requests (watches) | requests by kind |\n");
    s.push_str("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
    for r in results {
        let ph = |k: &str| r.phase_ms.get(k).map(|v| fmt_ms(*v)).unwrap_or("-".into());
        let kinds: Vec<String> = r
            .api_by_kind
            .iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect();
        s.push_str(&format!(
            "| {} | {:.0} s | {} | {} ms | {} ms | {} ms | {} ms | {} ms | {} ms | {:.0} ({:.0} ms) | {} ({}) | {} |\n",
            r.nodes,
            r.work_s,
            r.max_unavailable,
            ph("Cordoning"),
            ph("Draining"),
            ph("Upgrading"),
            fmt_ms(r.agent_done_to_next_ms),
            ph("Uncordoning"),
            fmt_ms(r.gap_max_ms),
            r.reconciles,
            r.reconcile_mean_ms,
            r.api_requests,
            r.api_watches,
            kinds.join(", ")
        ));
    }
    s
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if !args.render_prepare.is_empty() {
        println!(
            "{}",
            prepare::table(&prepare::read_summaries(&args.render_prepare)?)
        );
        return Ok(());
    }
    if !args.render_combined.is_empty() {
        println!(
            "{}",
            combined::table(&combined::read_summaries(&args.render_combined)?)
        );
        return Ok(());
    }
    if let Some(path) = &args.render {
        let results: Vec<Result_> = serde_json::from_str(&std::fs::read_to_string(path)?)?;
        print_tables(&results);
        return Ok(());
    }
    std::fs::create_dir_all(&args.out_dir)?;
    if !args.combined.is_empty() {
        let scenarios: Vec<combined::Scenario> = args
            .combined
            .iter()
            .map(|s| combined::parse(s))
            .collect::<anyhow::Result<_>>()?;
        let (results, failure) = combined::run_all(&args, &scenarios).await;
        let t = combined::table(&results);
        std::fs::write(args.out_dir.join("combined.md"), &t)?;
        std::fs::write(
            args.out_dir.join("combined.json"),
            serde_json::to_string_pretty(&results)?,
        )?;
        println!("{t}");
        return failure.map_or(Ok(()), Err);
    }
    if !args.prepare.is_empty() {
        let scenarios: Vec<prepare::Scenario> = args
            .prepare
            .iter()
            .map(|s| prepare::parse(s))
            .collect::<anyhow::Result<_>>()?;
        let (results, failure) = prepare::run_all(&args, &scenarios).await;
        let t = prepare::table(&results);
        std::fs::write(args.out_dir.join("prepare.md"), &t)?;
        println!("{t}");
        return failure.map_or(Ok(()), Err);
    }
    let scenarios: Vec<Scenario> = args
        .scenarios
        .iter()
        .map(|s| parse_scenario(s, args.baseline_sample))
        .collect::<anyhow::Result<_>>()?;
    if scenarios.is_empty() {
        bail!("no scenarios given (--scenarios N:work_ms:maxUnavailable,...)");
    }
    let mut order: Vec<usize> = vec![];
    for s in &scenarios {
        if !order.contains(&s.nodes) {
            order.push(s.nodes);
        }
    }
    let mut results = vec![];
    let mut densities = vec![];
    let mut failure = None;
    for n in order {
        let group: Vec<Scenario> = scenarios.iter().filter(|s| s.nodes == n).cloned().collect();
        if let Err(e) = run_group(&args, n, &group, &mut results, &mut densities).await {
            eprintln!("[bench] group N={n} failed: {e:#}");
            failure = Some(e);
            break;
        }
        write_results(&args, &results)?;
    }
    write_results(&args, &results)?;
    print_tables(&results);
    if !densities.is_empty() {
        println!("Pod density:\n\n{}", density::table(&densities));
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn print_tables(results: &[Result_]) {
    println!("{}", table(results));
    println!(
        "Per-node breakdown (mean time in each state; API requests of the controller during the rollout):\n"
    );
    println!("{}", breakdown(results));
}

fn write_results(args: &Args, results: &[Result_]) -> anyhow::Result<()> {
    std::fs::write(
        args.out_dir.join("results.json"),
        serde_json::to_string_pretty(results)?,
    )?;
    std::fs::write(
        args.out_dir.join("results.md"),
        format!("{}\n{}", table(results), breakdown(results)),
    )?;
    Ok(())
}
