//! Combined firmware + driver wave (issue 32): at N simulated nodes with
//! tt-kmd 2.7.0 loaded and the simulated cards at the sim default firmware,
//! the driver policy is moved to 2.8.0 and a firmware policy (19.8.0) is
//! created at the same moment, `maxUnavailable` = `maxParallel` = K; each node
//! runs one pinned Deployment pod that uses the device, so every drain evicts
//! it. The controller runs with `--combine-firmware-and-driver=true` (`on`:
//! one cordon and drain per node, the flash hands its cordon to the swap) or
//! `=false` (`off`: each policy cordons and drains on its own), each scenario
//! on fresh nodes.
//!
//! Measured by watches of the benchmark's own on the Nodes and on the
//! workload Pods (not read from the controller):
//!
//! - the wave: from the policy changes to the first moment both policies
//!   report every node Done (the driver at 2.8.0, the firmware at 19.8.0)
//!   and every node is uncordoned;
//! - per node, its cordon episodes (uncordoned → cordoned transitions), its
//!   time out of service (the sum of its cordoned intervals), its workload's
//!   evictions (distinct pods of its Deployment minus 1);
//! - the most nodes cordoned at once.
//!
//! The summary `combined-<tag>.json` is rewritten every 10 s while the wave
//! runs (marked partial until it is complete); the per-node figures land in
//! `combined-<tag>-nodes.jsonl` at the end.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client};
use serde::{Deserialize, Serialize};
use ttdrv_api::firmware::{FirmwareNodeState, TenstorrentFirmwarePolicy};
use ttdrv_api::{TenstorrentDriverPolicy, labels};
use ttdrv_testkit::TestEnv;

use crate::{Args, Proc, next_node_event, percentile, start_ready_controller};

const FROM: &str = "2.7.0";
const TO: &str = "2.8.0";
const FIRMWARE: &str = "19.8.0";
/// Prefix of the workload Deployments (`u0000`, ...; one per node).
const APP_PREFIX: &str = "u";

#[derive(Clone, Debug)]
pub struct Scenario {
    pub nodes: usize,
    /// `--combine-firmware-and-driver`.
    pub combine: bool,
    /// `maxUnavailable` of the driver policy = `maxParallel` of the firmware policy.
    pub k: usize,
}

impl Scenario {
    fn mode(&self) -> &'static str {
        if self.combine { "on" } else { "off" }
    }

    fn tag(&self) -> String {
        format!("{}-{}-k{}", self.nodes, self.mode(), self.k)
    }
}

/// `N:on|off[:K]` (K default: N/10, at least 1).
pub fn parse(s: &str) -> anyhow::Result<Scenario> {
    let parts: Vec<&str> = s.trim().split(':').collect();
    let (Some(n), Some(m)) = (parts.first(), parts.get(1)) else {
        bail!("combined scenario {s:?}: want N:on|off[:K]");
    };
    let nodes: usize = n.parse().context("N")?;
    let combine = match *m {
        "on" => true,
        "off" => false,
        _ => bail!("combined scenario {s:?}: mode is on or off"),
    };
    let k = match parts.get(2) {
        Some(k) => k.parse().context("K")?,
        None => (nodes / 10).max(1),
    };
    if nodes == 0 || k == 0 {
        bail!("combined scenario {s:?}: N and K must be positive");
    }
    Ok(Scenario { nodes, combine, k })
}

/// One node's figures (seconds since the policy changes).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct NodeFigures {
    pub node: String,
    pub cordon_episodes: u32,
    pub out_of_service_s: f64,
    pub first_cordon_s: Option<f64>,
    pub last_uncordon_s: Option<f64>,
    /// Distinct pods of the node's workload seen (the first one included).
    pub pods: usize,
    pub evictions: usize,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct CombResult {
    pub nodes: usize,
    pub mode: String,
    pub k: usize,
    pub flash_s: f64,
    pub swap_s: f64,
    /// Both policies Done on every node and every node uncordoned.
    pub complete: bool,
    pub driver_done: usize,
    pub firmware_done: usize,
    /// Policy changes → both policies Done everywhere and all uncordoned
    /// (the elapsed time for a partial run).
    pub wave_s: f64,
    pub first_cordon_s: Option<f64>,
    pub last_uncordon_s: Option<f64>,
    /// Cordon episodes per node → how many nodes had that many.
    pub cordon_episodes: BTreeMap<u32, usize>,
    pub oos_p50_s: f64,
    pub oos_p95_s: f64,
    pub oos_max_s: f64,
    pub oos_mean_s: f64,
    /// Evictions per node → how many nodes.
    pub evictions: BTreeMap<usize, usize>,
    pub max_cordoned: usize,
}

#[derive(Default)]
struct Seen {
    t0: Option<Instant>,
    cordoned: BTreeMap<String, bool>,
    cordoned_since: BTreeMap<String, f64>,
    episodes: BTreeMap<String, u32>,
    oos: BTreeMap<String, f64>,
    first_cordon: BTreeMap<String, f64>,
    last_uncordon: BTreeMap<String, f64>,
    max_cordoned: usize,
    /// Workload (Deployment) → uids of its pods seen.
    pods: BTreeMap<String, BTreeSet<String>>,
}

impl Seen {
    fn node(&mut self, name: String, cordoned: bool, at: Instant) {
        let prev = self.cordoned.insert(name.clone(), cordoned);
        let Some(t0) = self.t0 else { return };
        let since = at.saturating_duration_since(t0).as_secs_f64();
        match (prev.unwrap_or(false), cordoned) {
            (false, true) => {
                *self.episodes.entry(name.clone()).or_default() += 1;
                self.first_cordon.entry(name.clone()).or_insert(since);
                self.cordoned_since.insert(name, since);
            }
            (true, false) => {
                if let Some(from) = self.cordoned_since.remove(&name) {
                    *self.oos.entry(name.clone()).or_default() += since - from;
                }
                self.last_uncordon.insert(name, since);
            }
            _ => {}
        }
        let now = self.cordoned.values().filter(|c| **c).count();
        self.max_cordoned = self.max_cordoned.max(now);
    }

    fn cordoned_now(&self) -> usize {
        self.cordoned.values().filter(|c| **c).count()
    }
}

/// Watches the scenario's Nodes (`spec.unschedulable`) and the workload
/// Pods of its namespace; stops when dropped.
struct Watches {
    seen: Arc<Mutex<Seen>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Watches {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Watches {
    async fn start(client: Client, selector: &str, ns: &str) -> anyhow::Result<Self> {
        let seen: Arc<Mutex<Seen>> = Arc::default();
        let (synced_tx, mut synced_rx) = tokio::sync::watch::channel(0u8);
        let synced_tx = Arc::new(synced_tx);
        let nodes: Api<Node> = Api::all(client.clone());
        let (s, tx) = (seen.clone(), synced_tx.clone());
        let cfg = watcher::Config::default().labels(selector);
        let node_task = tokio::spawn(async move {
            let mut stream = watcher(nodes, cfg).boxed();
            while let Some(ev) = next_node_event(&mut stream).await {
                let at = Instant::now();
                let n = match ev {
                    watcher::Event::InitApply(n) | watcher::Event::Apply(n) => n,
                    watcher::Event::InitDone => {
                        tx.send_modify(|c| *c |= 1);
                        continue;
                    }
                    _ => continue,
                };
                let name = n.metadata.name.clone().unwrap_or_default();
                let cordoned = ttdrv_core::node::unschedulable(&n);
                let Ok(mut s) = s.lock() else { break };
                s.node(name, cordoned, at);
            }
        });
        let pods: Api<Pod> = Api::namespaced(client, ns);
        let (s, tx) = (seen.clone(), synced_tx);
        let pod_task = tokio::spawn(async move {
            let cfg = watcher::Config::default().labels("app");
            let mut stream = watcher(pods, cfg).boxed();
            loop {
                let ev = match stream.try_next().await {
                    Ok(Some(ev)) => ev,
                    Ok(None) => break,
                    Err(e) => {
                        eprintln!("[bench] pod watch error: {e}");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    }
                };
                let p = match ev {
                    watcher::Event::InitApply(p) | watcher::Event::Apply(p) => p,
                    watcher::Event::InitDone => {
                        tx.send_modify(|c| *c |= 2);
                        continue;
                    }
                    _ => continue,
                };
                let app = p
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("app"))
                    .cloned();
                let (Some(app), Some(uid)) = (app, p.metadata.uid.clone()) else {
                    continue;
                };
                let Ok(mut s) = s.lock() else { break };
                s.pods.entry(app).or_default().insert(uid);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        while *synced_rx.borrow() != 3 {
            if Instant::now() > deadline {
                bail!("node and pod watches did not sync within 60s");
            }
            let _ = tokio::time::timeout(Duration::from_secs(1), synced_rx.changed()).await;
        }
        Ok(Self {
            seen,
            tasks: vec![node_task, pod_task],
        })
    }

    fn start_clock(&self) -> Instant {
        let t0 = Instant::now();
        if let Ok(mut s) = self.seen.lock() {
            s.t0 = Some(t0);
        }
        t0
    }

    fn cordoned_now(&self) -> usize {
        self.seen
            .lock()
            .map(|s| s.cordoned_now())
            .unwrap_or(usize::MAX)
    }

    /// Per-node figures at `now` (a node still cordoned counts until now).
    fn figures(&self, nodes: &[String], now: f64) -> Vec<NodeFigures> {
        let Ok(s) = self.seen.lock() else {
            return vec![];
        };
        nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let open = s.cordoned_since.get(n).map_or(0.0, |from| now - from);
                let pods = s.pods.get(&app_name(i)).map_or(0, |u| u.len());
                NodeFigures {
                    node: n.clone(),
                    cordon_episodes: s.episodes.get(n).copied().unwrap_or(0),
                    out_of_service_s: s.oos.get(n).copied().unwrap_or(0.0) + open,
                    first_cordon_s: s.first_cordon.get(n).copied(),
                    last_uncordon_s: s.last_uncordon.get(n).copied(),
                    pods,
                    evictions: pods.saturating_sub(1),
                }
            })
            .collect()
    }

    fn max_cordoned(&self) -> usize {
        self.seen.lock().map(|s| s.max_cordoned).unwrap_or(0)
    }
}

fn app_name(i: usize) -> String {
    format!("{APP_PREFIX}{i:04}")
}

fn summarise(
    sc: &Scenario,
    args: &Args,
    figs: &[NodeFigures],
    max_cordoned: usize,
    complete: bool,
    done: (usize, usize),
    wave_s: f64,
) -> CombResult {
    let mut oos: Vec<f64> = figs.iter().map(|f| f.out_of_service_s).collect();
    oos.sort_by(f64::total_cmp);
    let mut episodes = BTreeMap::new();
    let mut evictions = BTreeMap::new();
    for f in figs {
        *episodes.entry(f.cordon_episodes).or_default() += 1;
        *evictions.entry(f.evictions).or_default() += 1;
    }
    CombResult {
        nodes: sc.nodes,
        mode: sc.mode().into(),
        k: sc.k,
        flash_s: args.flash_ms as f64 / 1000.0,
        swap_s: args.load_ms as f64 / 1000.0,
        complete,
        driver_done: done.0,
        firmware_done: done.1,
        wave_s,
        first_cordon_s: figs
            .iter()
            .filter_map(|f| f.first_cordon_s)
            .reduce(f64::min),
        last_uncordon_s: figs
            .iter()
            .filter_map(|f| f.last_uncordon_s)
            .reduce(f64::max),
        cordon_episodes: episodes,
        oos_p50_s: percentile(&oos, 50.0),
        oos_p95_s: percentile(&oos, 95.0),
        oos_max_s: oos.last().copied().unwrap_or(f64::NAN),
        oos_mean_s: if oos.is_empty() {
            f64::NAN
        } else {
            oos.iter().sum::<f64>() / oos.len() as f64
        },
        evictions,
        max_cordoned,
    }
}

fn write_json<T: Serialize>(path: &Path, r: &T) {
    if let Ok(j) = serde_json::to_string_pretty(r) {
        let _ = std::fs::write(path, j);
    }
}

/// Runs the scenarios one after the other: the results of those that
/// finished, and the first failure.
pub async fn run_all(
    args: &Args,
    scenarios: &[Scenario],
) -> (Vec<CombResult>, Option<anyhow::Error>) {
    let mut ok = vec![];
    let mut failure = None;
    for sc in scenarios {
        match run(args, sc).await {
            Ok(r) => ok.push(r),
            Err(e) => {
                eprintln!("[bench] combined {} failed: {e:#}", sc.tag());
                failure.get_or_insert(e);
            }
        }
    }
    (ok, failure)
}

/// The summaries (`combined-<tag>.json`) of earlier runs.
pub fn read_summaries(paths: &[std::path::PathBuf]) -> anyhow::Result<Vec<CombResult>> {
    paths
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).with_context(|| p.display().to_string())?;
            Ok(serde_json::from_str(&text)?)
        })
        .collect()
}

fn start_agent(args: &Args, ns: &str, log: &Path) -> anyhow::Result<Proc> {
    let out = std::fs::File::create(log)?;
    let child = std::process::Command::new(&args.sim_agent_bin)
        .args(["--namespace", ns, "--work-ms", "0", "--build-ms", "0"])
        .args(["--load-ms", &args.load_ms.to_string()])
        .args(["--flash-ms", &args.flash_ms.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::from(out))
        .spawn()
        .with_context(|| format!("starting {}", args.sim_agent_bin.display()))?;
    Ok(Proc(child))
}

/// Driver nodes Done at [`TO`], firmware nodes Done at [`FIRMWARE`].
async fn done_counts(
    dapi: &Api<TenstorrentDriverPolicy>,
    driver: &str,
    fapi: &Api<TenstorrentFirmwarePolicy>,
    firmware: &str,
) -> anyhow::Result<(usize, usize)> {
    let d = dapi.get(driver).await?.status.unwrap_or_default();
    let d_done = if d.desired_version.as_deref() == Some(TO) {
        d.nodes
            .iter()
            .filter(|e| {
                e.state == ttdrv_api::NodeState::Done && e.current_version.as_deref() == Some(TO)
            })
            .count()
    } else {
        0
    };
    let f = fapi.get(firmware).await?.status.unwrap_or_default();
    let f_done = if f.desired_version.as_deref() == Some(FIRMWARE) {
        f.nodes
            .iter()
            .filter(|e| e.state == FirmwareNodeState::Done)
            .count()
    } else {
        0
    };
    Ok((d_done, f_done))
}

/// Every workload pod is Running and Ready on its node.
async fn wait_workloads(client: &Client, ns: &str, n: usize) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let t = Instant::now();
    loop {
        let ready = pods
            .list(&ListParams::default().labels("app"))
            .await?
            .items
            .iter()
            .filter(|p| ttdrv_testkit::pod_ready(p))
            .count();
        if ready >= n {
            return Ok(());
        }
        if t.elapsed() > Duration::from_secs(300) {
            bail!("only {ready} of {n} workload pods Ready after 300s");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn run(args: &Args, sc: &Scenario) -> anyhow::Result<CombResult> {
    let n = sc.nodes;
    let tag = sc.tag();
    let out = |f: &str| args.out_dir.join(f);
    let env = TestEnv::new(&format!("comb-{}", sc.mode())).await;
    let ns = env.namespace().await;
    let t = Instant::now();
    let nodes = create_nodes(&env, n).await;
    crate::wait_nodes_ready(&env, n).await?;
    eprintln!(
        "[bench] combined {tag}: {n} nodes Ready in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    ttdrv_testkit::ensure_crd(&env.client).await;

    // Set-up, not measured: the driver policy at 2.7.0 (loaded already).
    let _agent = start_agent(args, &ns, &out(&format!("sim-agent-combined-{tag}.log")))?;
    let policies = Policies {
        dapi: Api::all(env.client.clone()),
        fapi: Api::all(env.client.clone()),
        driver: env.name("fleet"),
        firmware: env.name("fw"),
    };
    create_driver_policy(&env, &policies, sc.k).await?;
    let extra = [
        format!("--combine-firmware-and-driver={}", sc.combine),
        // The workloads run in the controller's namespace: drain them.
        "--drain-exempt-namespaces=".to_string(),
    ];
    let mut ctl =
        start_ready_controller(args, &env, &ns, &format!("combined-{tag}"), false, &extra).await?;
    wait_firmware_side(&out(&format!("controller-combined-{tag}.log")), &tag).await?;
    crate::wait_policy_done(
        &policies.dapi,
        &policies.driver,
        FROM,
        n,
        Duration::from_secs(600),
    )
    .await?;
    futures::stream::iter(nodes.iter().enumerate())
        .for_each_concurrent(16, |(i, node)| {
            let (env, ns) = (&env, &ns);
            async move { env.pinned_deployment(ns, &app_name(i), node, true).await }
        })
        .await;
    wait_workloads(&env.client, &ns, n).await?;
    eprintln!(
        "[bench] combined {tag}: {FROM} installed, {n} workloads Running after {:.1}s",
        t.elapsed().as_secs_f64()
    );

    let watches = Watches::start(env.client.clone(), &env.selector(), &ns).await?;
    if watches.cordoned_now() != 0 {
        bail!("{tag}: nodes cordoned before the wave");
    }
    let summary_path = out(&format!("combined-{tag}.json"));
    eprintln!(
        "[bench] combined {tag}: driver {FROM} -> {TO} and firmware -> {FIRMWARE} on {n} nodes, \
         K={} (flash {} ms, swap {} ms)",
        sc.k, args.flash_ms, args.load_ms
    );
    let t0 = watches.start_clock();
    start_wave(&env, &policies, sc.k).await?;
    let wave = Wave {
        args,
        sc,
        policies: &policies,
        watches: &watches,
        nodes: &nodes,
        summary_path: &summary_path,
        t0,
    };
    let (complete, done) = wave.wait(&mut ctl).await;
    let wave_s = t0.elapsed().as_secs_f64();
    // Let the pod watch see the last replacements of the workloads.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let r = wave.write_results(complete, done, wave_s)?;
    drop(watches);
    drop(ctl);
    env.teardown().await;
    if !complete {
        bail!(
            "{tag}: the wave did not finish (see {})",
            summary_path.display()
        );
    }
    Ok(r)
}

/// The scenario's `n` kwok nodes, at the old driver version.
async fn create_nodes(env: &TestEnv, n: usize) -> Vec<String> {
    futures::stream::iter(0..n)
        .map(|i| async move {
            env.tt_node(&format!("n{i:04}"), &[(labels::KMD_VERSION, FROM)])
                .await
                .metadata
                .name
                .unwrap_or_default()
        })
        .buffered(16)
        .collect()
        .await
}

/// The two policies of the wave: the driver's and the firmware's.
struct Policies {
    dapi: Api<TenstorrentDriverPolicy>,
    fapi: Api<TenstorrentFirmwarePolicy>,
    driver: String,
    firmware: String,
}

/// The driver policy at [`FROM`] over the scenario's nodes, `k` at a time.
async fn create_driver_policy(env: &TestEnv, policies: &Policies, k: usize) -> anyhow::Result<()> {
    let spec: ttdrv_api::TenstorrentDriverPolicySpec = serde_yaml::from_str(&format!(
        "version: \"{FROM}\"\nnodeAffinity: {}\nupgradePolicy: {{maxUnavailable: {}}}",
        env.nodes_selector(),
        k
    ))?;
    let mut p = TenstorrentDriverPolicy::new(&policies.driver, spec);
    p.metadata.labels = Some(env.labels());
    policies.dapi.create(&PostParams::default(), &p).await?;
    Ok(())
}

/// /readyz answers once the driver side is ready; the firmware side
/// starts after its own watches have synced (only its log says so).
async fn wait_firmware_side(log: &Path, tag: &str) -> anyhow::Result<()> {
    let t_fw = Instant::now();
    while !std::fs::read_to_string(log).is_ok_and(|l| l.contains("firmware watch caches synced")) {
        if t_fw.elapsed() > Duration::from_secs(120) {
            bail!("{tag}: the controller's firmware side not started after 120 s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// The wave starts: the driver policy moves to [`TO`] while the firmware
/// policy to [`FIRMWARE`] is created, at the same time.
async fn start_wave(env: &TestEnv, policies: &Policies, k: usize) -> anyhow::Result<()> {
    let fw_spec = serde_json::json!({
        "version": FIRMWARE,
        "nodeAffinity": { "matchLabels": env.labels() },
        "upgradePolicy": { "maxParallel": k },
    });
    let patch = Patch::Merge(serde_json::json!({ "spec": { "version": TO } }));
    let pp = PatchParams::default();
    let (d, f) = futures::join!(
        policies.dapi.patch(&policies.driver, &pp, &patch),
        ttdrv_testkit::policy::create_raw_firmware_policy(env, &policies.firmware, fw_spec)
    );
    d.context("patching the driver policy")?;
    f.context("creating the firmware policy")?;
    Ok(())
}

/// The measured wave: what it watches and where it writes its summary.
struct Wave<'a> {
    args: &'a Args,
    sc: &'a Scenario,
    policies: &'a Policies,
    watches: &'a Watches,
    nodes: &'a [String],
    summary_path: &'a Path,
    t0: Instant,
}

impl Wave<'_> {
    /// Until every node is Done on both sides and none is cordoned, the
    /// controller exits, or the timeout passes; the summary so far written
    /// every 10 s. Whether it completed, and the Done counts.
    async fn wait(&self, ctl: &mut crate::Controller) -> (bool, (usize, usize)) {
        let (args, sc, p) = (self.args, self.sc, self.policies);
        let (n, tag) = (sc.nodes, sc.tag());
        let waves = n.div_ceil(sc.k) as u32;
        let timeout = Duration::from_secs(300)
            + 2 * waves
                * (Duration::from_millis(args.flash_ms + args.load_ms) + Duration::from_secs(30));
        let mut last_write = Instant::now();
        let mut done = (0, 0);
        let complete = loop {
            let elapsed = self.t0.elapsed();
            match done_counts(&p.dapi, &p.driver, &p.fapi, &p.firmware).await {
                Ok(d) => done = d,
                Err(e) => eprintln!("[bench] {tag}: reading the policies: {e}"),
            }
            if done.0 >= n && done.1 >= n && self.watches.cordoned_now() == 0 {
                break true;
            }
            if let Ok(Some(st)) = ctl.proc.0.try_wait() {
                eprintln!("[bench] {tag}: controller exited during the wave: {st}");
                break false;
            }
            if elapsed > timeout {
                eprintln!("[bench] {tag}: not finished after {timeout:?}");
                break false;
            }
            if last_write.elapsed() > Duration::from_secs(10) {
                self.write_progress(elapsed.as_secs_f64(), done);
                last_write = Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        (complete, done)
    }

    /// The summary so far, written and told.
    fn write_progress(&self, now: f64, done: (usize, usize)) {
        let (n, tag) = (self.sc.nodes, self.sc.tag());
        let r = summarise(
            self.sc,
            self.args,
            &self.watches.figures(self.nodes, now),
            self.watches.max_cordoned(),
            false,
            done,
            now,
        );
        write_json(self.summary_path, &r);
        eprintln!(
            "[bench] combined {tag}: {now:.0}s: driver Done {}/{n}, firmware Done {}/{n}, \
             {} cordoned now (max {})",
            done.0,
            done.1,
            self.watches.cordoned_now(),
            r.max_cordoned
        );
    }

    /// The final summary (`combined-<tag>.json`) and the per-node figures
    /// (`combined-<tag>-nodes.jsonl`).
    fn write_results(
        &self,
        complete: bool,
        done: (usize, usize),
        wave_s: f64,
    ) -> anyhow::Result<CombResult> {
        let tag = self.sc.tag();
        let figs = self.watches.figures(self.nodes, wave_s);
        let r = summarise(
            self.sc,
            self.args,
            &figs,
            self.watches.max_cordoned(),
            complete,
            done,
            wave_s,
        );
        write_json(self.summary_path, &r);
        let lines: Vec<String> = figs
            .iter()
            .filter_map(|f| serde_json::to_string(f).ok())
            .collect();
        std::fs::write(
            self.args
                .out_dir
                .join(format!("combined-{tag}-nodes.jsonl")),
            lines.join("\n") + "\n",
        )?;
        eprintln!("[bench] combined {tag}: {}", serde_json::to_string(&r)?);
        Ok(r)
    }
}

fn dist<K: std::fmt::Display>(m: &BTreeMap<K, usize>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k} ({v} nodes)"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The markdown table of the results.
pub fn table(results: &[CombResult]) -> String {
    let mut s = String::from(
        "| N | one cordon for both | K (maxUnavailable = maxParallel) | flash / swap | wave (start → both policies Done, all uncordoned) | cordon episodes per node | out of service per node p50 / p95 / max (mean) | evictions per node | max nodes cordoned at once | first cordon / last uncordon |\n\
         |---:|---|---:|---:|---:|---|---:|---|---:|---:|\n",
    );
    let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1} s"));
    for r in results {
        let wave = if r.complete {
            format!("{:.1} s", r.wave_s)
        } else {
            format!(
                "partial: driver {} / firmware {} of {} Done at {:.1} s",
                r.driver_done, r.firmware_done, r.nodes, r.wave_s
            )
        };
        s.push_str(&format!(
            "| {} | {} | {} | {:.1} s / {:.1} s | {} | {} | {:.1} / {:.1} / {:.1} s ({:.1} s) | {} | {} | {} / {} |\n",
            r.nodes,
            r.mode,
            r.k,
            r.flash_s,
            r.swap_s,
            wave,
            dist(&r.cordon_episodes),
            r.oos_p50_s,
            r.oos_p95_s,
            r.oos_max_s,
            r.oos_mean_s,
            dist(&r.evictions),
            r.max_cordoned,
            f(r.first_cordon_s),
            f(r.last_uncordon_s),
        ));
    }
    s
}
