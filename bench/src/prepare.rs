//! Build ahead (issue 22): a cache-cold upgrade 2.7.0 -> 2.8.0 where each
//! node's agent needs a long build (60 s) and a short load (2 s), one node at
//! a time (maxUnavailable 1), by
//!
//! - `on`: the controller with `upgradePolicy.prepare.enabled: true` (pods
//!   replaced ahead, builds outside the cordon window);
//! - `off`: the controller with `prepare.enabled: false` (the pod is replaced
//!   after cordon and drain: the build is inside the window);
//! - `kubectl`: `bench/baseline.sh`, the serial kubectl loop (cordon, drain,
//!   replace the pod, wait for it to be Ready — build and load —, uncordon).
//!
//! Measured from the version change (the policy patch, or the script's start)
//! to every node Done (the script's end for kubectl): the rollout time, and
//! per node the time out of service, from cordon to uncordon as a watch on the
//! Nodes sees them. Every node's figures are appended to
//! `prepare-<tag>.jsonl` as it is uncordoned and the summary
//! (`prepare-<tag>.json`) is rewritten every few seconds, so a run cut short
//! still leaves what it measured, marked partial with the count of nodes done.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client};
use serde::{Deserialize, Serialize};
use ttdrv_api::{TenstorrentDriverPolicy, labels};
use ttdrv_testkit::TestEnv;

use crate::{Args, Proc, create_ready_nodes, next_node_event, start_ready_controller};

const FROM: &str = "2.7.0";
const TO: &str = "2.8.0";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    On,
    Off,
    Kubectl,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::On => "on",
            Mode::Off => "off",
            Mode::Kubectl => "kubectl",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Scenario {
    pub nodes: usize,
    pub mode: Mode,
    /// `prepare.maxConcurrent` (None: the API's default).
    pub max_concurrent: Option<u32>,
}

/// `N:on|off|kubectl[:maxConcurrent]`.
pub fn parse(s: &str) -> anyhow::Result<Scenario> {
    let parts: Vec<&str> = s.trim().split(':').collect();
    let (Some(n), Some(m)) = (parts.first(), parts.get(1)) else {
        bail!("prepare scenario {s:?}: want N:on|off|kubectl[:maxConcurrent]");
    };
    let mode = match *m {
        "on" => Mode::On,
        "off" => Mode::Off,
        "kubectl" => Mode::Kubectl,
        _ => bail!("prepare scenario {s:?}: mode is on, off or kubectl"),
    };
    Ok(Scenario {
        nodes: n.parse().context("N")?,
        mode,
        max_concurrent: parts
            .get(2)
            .map(|c| c.parse())
            .transpose()
            .context("maxConcurrent")?,
    })
}

/// One node's cycle, seconds since the version change.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct NodeTimes {
    pub node: String,
    pub prepared_s: Option<f64>,
    pub cordon_s: Option<f64>,
    pub loaded_s: Option<f64>,
    pub uncordon_s: Option<f64>,
    pub done_s: Option<f64>,
}

impl NodeTimes {
    fn out_of_service_s(&self) -> Option<f64> {
        Some(self.uncordon_s? - self.cordon_s?)
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PrepResult {
    pub nodes: usize,
    pub mode: String,
    /// `prepare.maxConcurrent` when set (else the default, 10).
    #[serde(default)]
    pub max_concurrent: Option<u32>,
    pub build_s: f64,
    pub load_s: f64,
    /// Every node finished; otherwise the figures are those of `nodes_done`.
    pub complete: bool,
    /// Nodes through their cycle (uncordoned and, for the controller, Done).
    pub nodes_done: usize,
    /// Version change to the last node done (the whole rollout when complete).
    pub rollout_s: f64,
    /// Version change to the end of the measurement (now, for a partial run).
    pub elapsed_s: f64,
    pub first_cordon_s: Option<f64>,
    pub oos_min_s: Option<f64>,
    pub oos_median_s: Option<f64>,
    pub oos_max_s: Option<f64>,
}

#[derive(Default)]
struct Rec {
    t0: Option<Instant>,
    last: BTreeMap<String, (bool, String, String, String)>,
    times: BTreeMap<String, NodeTimes>,
    finished: Vec<String>,
}

/// Records each node's cordon, uncordon, prepared label, loaded version and
/// Done record as the watch sees them (only after `t0` is set).
struct Recorder {
    rec: Arc<Mutex<Rec>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn node_key(n: &Node) -> (String, (bool, String, String, String)) {
    let name = n.metadata.name.clone().unwrap_or_default();
    let cordoned = ttdrv_core::node::unschedulable(n);
    let l = |k| {
        ttdrv_core::node::label(n, k)
            .unwrap_or_default()
            .to_string()
    };
    let state = ttdrv_core::node::record(n)
        .ok()
        .flatten()
        .map(|r| format!("{}@{}", r.state.as_str(), r.target))
        .unwrap_or_default();
    (
        name,
        (
            cordoned,
            l(labels::KMD_PREPARED),
            l(labels::KMD_VERSION),
            state,
        ),
    )
}

impl Recorder {
    async fn start(
        client: Client,
        selector: &str,
        mode: Mode,
        log: PathBuf,
    ) -> anyhow::Result<Self> {
        let api: Api<Node> = Api::all(client);
        let rec: Arc<Mutex<Rec>> = Arc::default();
        let r = rec.clone();
        let cfg = watcher::Config::default().labels(selector);
        let (synced_tx, mut synced_rx) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            let mut stream = watcher(api, cfg).boxed();
            let done_state = format!("Done@{TO}");
            loop {
                let Some(ev) = next_node_event(&mut stream).await else {
                    break;
                };
                let at = Instant::now();
                let Ok(mut s) = r.lock() else { break };
                let n = match ev {
                    watcher::Event::InitApply(n) => {
                        let (name, k) = node_key(&n);
                        s.last.insert(name, k);
                        continue;
                    }
                    watcher::Event::InitDone => {
                        let _ = synced_tx.send(true);
                        continue;
                    }
                    watcher::Event::Apply(n) => n,
                    _ => continue,
                };
                let (name, now) = node_key(&n);
                let prev = s.last.insert(name.clone(), now.clone()).unwrap_or_default();
                let Some(t0) = s.t0 else { continue };
                let since = at.duration_since(t0).as_secs_f64();
                let t = s.times.entry(name.clone()).or_insert_with(|| NodeTimes {
                    node: name.clone(),
                    ..Default::default()
                });
                if now.0 && !prev.0 && t.cordon_s.is_none() {
                    t.cordon_s = Some(since);
                }
                if !now.0 && prev.0 && t.cordon_s.is_some() && t.uncordon_s.is_none() {
                    t.uncordon_s = Some(since);
                }
                if now.1 == TO && prev.1 != TO && t.prepared_s.is_none() {
                    t.prepared_s = Some(since);
                }
                if now.2 == TO && prev.2 != TO && t.loaded_s.is_none() {
                    t.loaded_s = Some(since);
                }
                if now.3 == done_state && prev.3 != done_state && t.done_s.is_none() {
                    t.done_s = Some(since);
                }
                let finished =
                    t.uncordon_s.is_some() && (mode == Mode::Kubectl || t.done_s.is_some());
                if finished && !s.finished.contains(&name) {
                    let line = s
                        .times
                        .get(&name)
                        .and_then(|t| serde_json::to_string(t).ok());
                    s.finished.push(name);
                    if let Some(line) = line
                        && let Ok(mut f) = std::fs::OpenOptions::new()
                            .create(true)
                            .append(true)
                            .open(&log)
                    {
                        let _ = writeln!(f, "{line}");
                    }
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        while !*synced_rx.borrow() {
            if Instant::now() > deadline {
                bail!("node watcher did not sync within 60s");
            }
            let _ = tokio::time::timeout(Duration::from_secs(1), synced_rx.changed()).await;
        }
        Ok(Self { rec, task })
    }

    fn start_clock(&self) -> Instant {
        let t0 = Instant::now();
        if let Ok(mut s) = self.rec.lock() {
            s.t0 = Some(t0);
        }
        t0
    }

    fn finished(&self) -> usize {
        self.rec.lock().map(|s| s.finished.len()).unwrap_or(0)
    }

    fn summary(&self, sc: &Scenario, build_s: f64, load_s: f64, elapsed_s: f64) -> PrepResult {
        let Ok(s) = self.rec.lock() else {
            return PrepResult::default();
        };
        let done: Vec<&NodeTimes> = s.finished.iter().filter_map(|n| s.times.get(n)).collect();
        let mut oos: Vec<f64> = done.iter().filter_map(|t| t.out_of_service_s()).collect();
        oos.sort_by(f64::total_cmp);
        let median = (!oos.is_empty()).then(|| {
            let m = oos.len() / 2;
            if oos.len() % 2 == 1 {
                oos[m]
            } else {
                (oos[m - 1] + oos[m]) / 2.0
            }
        });
        let end = |t: &NodeTimes| {
            if sc.mode == Mode::Kubectl {
                t.uncordon_s
            } else {
                t.done_s
            }
        };
        PrepResult {
            nodes: sc.nodes,
            mode: sc.mode.name().into(),
            max_concurrent: sc.max_concurrent,
            build_s,
            load_s,
            complete: done.len() >= sc.nodes,
            nodes_done: done.len(),
            rollout_s: done.iter().filter_map(|t| end(t)).fold(0.0, f64::max),
            elapsed_s,
            first_cordon_s: s.times.values().filter_map(|t| t.cordon_s).reduce(f64::min),
            oos_min_s: oos.first().copied(),
            oos_median_s: median,
            oos_max_s: oos.last().copied(),
        }
    }
}

fn write_json(path: &Path, r: &PrepResult) {
    if let Ok(j) = serde_json::to_string_pretty(r) {
        let _ = std::fs::write(path, j);
    }
}

/// Runs the scenarios (at once with `parallel`, each on its own nodes):
/// the results of those that finished, and the first failure.
pub async fn run_all(
    args: &Args,
    scenarios: &[Scenario],
) -> (Vec<PrepResult>, Option<anyhow::Error>) {
    let futs = scenarios.iter().map(|sc| async move {
        let r = run(args, sc).await;
        if let Err(e) = &r {
            eprintln!(
                "[bench] prepare {}:{} failed: {e:#}",
                sc.nodes,
                sc.mode.name()
            );
        }
        r
    });
    let results: Vec<anyhow::Result<PrepResult>> = if args.parallel {
        futures::future::join_all(futs).await
    } else {
        let mut v = vec![];
        for f in futs {
            v.push(f.await);
        }
        v
    };
    let mut ok = vec![];
    let mut failure = None;
    for r in results {
        match r {
            Ok(r) => ok.push(r),
            Err(e) => {
                failure.get_or_insert(e);
            }
        }
    }
    (ok, failure)
}

/// The summaries (`prepare-<tag>.json`) of earlier, possibly unfinished, runs.
pub fn read_summaries(paths: &[PathBuf]) -> anyhow::Result<Vec<PrepResult>> {
    paths
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).with_context(|| p.display().to_string())?;
            Ok(serde_json::from_str(&text)?)
        })
        .collect()
}

fn start_agent(
    args: &Args,
    ns: &str,
    build_ms: u64,
    load_ms: u64,
    log: &Path,
) -> anyhow::Result<Proc> {
    let out = std::fs::File::create(log)?;
    let child = std::process::Command::new(&args.sim_agent_bin)
        .args(["--namespace", ns, "--work-ms", "0"])
        .args([
            "--build-ms",
            &build_ms.to_string(),
            "--load-ms",
            &load_ms.to_string(),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::from(out))
        .spawn()
        .with_context(|| format!("starting {}", args.sim_agent_bin.display()))?;
    Ok(Proc(child))
}

async fn run(args: &Args, sc: &Scenario) -> anyhow::Result<PrepResult> {
    let n = sc.nodes;
    let tag = match sc.max_concurrent {
        Some(c) => format!("{n}-{}-{c}", sc.mode.name()),
        None => format!("{n}-{}", sc.mode.name()),
    };
    let out = |f: &str| args.out_dir.join(f);
    let env = TestEnv::new(&format!("prep-{tag}")).await;
    let ns = env.namespace().await;
    let t = Instant::now();
    let (nodes, took) = create_ready_nodes(&env, n).await?;
    eprintln!("[bench] {tag}: {n} nodes Ready in {took:.1}s");

    // Set-up, not measured: every node gets 2.7.0 loaded (and cached) by a
    // quick agent.
    let setup_agent = start_agent(
        args,
        &ns,
        0,
        0,
        &out(&format!("sim-agent-prepare-{tag}-install.log")),
    )?;
    let papi: Api<TenstorrentDriverPolicy> = Api::all(env.client.clone());
    let policy = env.name("fleet");
    let mut controller = None;
    let ds_name = env.name("kubectl");
    if sc.mode == Mode::Kubectl {
        create_daemonset(&env, &ns, &ds_name).await?;
    } else {
        ttdrv_testkit::ensure_crd(&env.client).await;
        let spec: ttdrv_api::TenstorrentDriverPolicySpec = serde_yaml::from_str(&format!(
            "version: \"{FROM}\"\nnodeAffinity: {{matchLabels: {{{}: {}}}}}\n\
             upgradePolicy: {{maxUnavailable: 1, prepare: {{enabled: {}{}}}}}",
            ttdrv_testkit::TEST_LABEL,
            env.id,
            sc.mode == Mode::On,
            sc.max_concurrent
                .map(|c| format!(", maxConcurrent: {c}"))
                .unwrap_or_default()
        ))?;
        let mut p = TenstorrentDriverPolicy::new(&policy, spec);
        p.metadata.labels = Some(env.labels());
        papi.create(&PostParams::default(), &p).await?;
        let ctl =
            start_ready_controller(args, &env, &ns, &format!("prepare-{tag}"), false, &[]).await?;
        controller = Some(ctl);
    }
    wait_loaded(&env, &ns, n, FROM, Duration::from_secs(600)).await?;
    if sc.mode != Mode::Kubectl {
        crate::wait_policy_done(&papi, &policy, FROM, n, Duration::from_secs(300)).await?;
    }
    drop(setup_agent);
    eprintln!(
        "[bench] {tag}: {FROM} loaded on {n} nodes after {:.1}s",
        t.elapsed().as_secs_f64()
    );

    let build_ms = args.build_ms;
    let load_ms = args.load_ms;
    let _agent = start_agent(
        args,
        &ns,
        build_ms,
        load_ms,
        &out(&format!("sim-agent-prepare-{tag}.log")),
    )?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let progress = out(&format!("prepare-{tag}.jsonl"));
    let _ = std::fs::remove_file(&progress);
    let rec = Recorder::start(env.client.clone(), &env.selector(), sc.mode, progress).await?;
    let summary_path = out(&format!("prepare-{tag}.json"));
    let (build_s, load_s) = (build_ms as f64 / 1000.0, load_ms as f64 / 1000.0);

    eprintln!("[bench] {tag}: {FROM} -> {TO} on {n} nodes (build {build_s} s, load {load_s} s)");
    let t0 = rec.start_clock();
    let mut script = None;
    if sc.mode == Mode::Kubectl {
        let child = tokio::process::Command::new("bash")
            .arg(&args.baseline_script)
            .args([
                ns.as_str(),
                ds_name.as_str(),
                &format!("{}={}", labels::CLAIM, ds_name),
                TO,
            ])
            .args(&nodes)
            .kill_on_drop(true)
            .spawn()?;
        script = Some(child);
    } else {
        papi.patch(
            &policy,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "spec": { "version": TO } })),
        )
        .await?;
    }
    let timeout = Duration::from_secs(300)
        + n as u32 * (Duration::from_millis(build_ms + load_ms) + Duration::from_secs(30));
    let mut last_write = Instant::now();
    loop {
        if rec.finished() >= n {
            break;
        }
        if let Some(c) = script.as_mut()
            && let Some(st) = c.try_wait()?
        {
            if !st.success() {
                bail!("{tag}: baseline script failed: {st}");
            }
            // Its last uncordon may not have reached the watch yet.
            tokio::time::sleep(Duration::from_secs(1)).await;
            break;
        }
        if let Some(c) = controller.as_mut()
            && let Ok(Some(st)) = c.proc.0.try_wait()
        {
            bail!("{tag}: controller exited during the rollout: {st}");
        }
        if t0.elapsed() > timeout {
            bail!(
                "{tag}: not finished after {timeout:?}: {} of {n} done",
                rec.finished()
            );
        }
        if last_write.elapsed() > Duration::from_secs(10) {
            let r = rec.summary(sc, build_s, load_s, t0.elapsed().as_secs_f64());
            write_json(&summary_path, &r);
            eprintln!(
                "[bench] {tag}: {}/{n} done after {:.0}s; out of service median {:?}",
                r.nodes_done, r.elapsed_s, r.oos_median_s
            );
            last_write = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let r = rec.summary(sc, build_s, load_s, t0.elapsed().as_secs_f64());
    write_json(&summary_path, &r);
    eprintln!("[bench] {tag}: {}", serde_json::to_string(&r)?);
    drop(rec);
    drop(controller);
    env.cleanup().await;
    Ok(r)
}

/// The kubectl baseline's installer DaemonSet on the scenario's nodes.
async fn create_daemonset(env: &TestEnv, ns: &str, name: &str) -> anyhow::Result<()> {
    crate::create_baseline_daemonset(env, ns, name, FROM).await
}

/// Every node of the group reports `version` loaded and the installer pods
/// in `ns` are Ready.
async fn wait_loaded(
    env: &TestEnv,
    ns: &str,
    n: usize,
    version: &str,
    timeout: Duration,
) -> anyhow::Result<()> {
    let api: Api<Node> = Api::all(env.client.clone());
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), ns);
    let t = Instant::now();
    loop {
        let loaded = api
            .list(&ListParams::default().labels(&env.selector()))
            .await?
            .items
            .iter()
            .filter(|nd| ttdrv_core::node::label(nd, labels::KMD_VERSION) == Some(version))
            .count();
        let ready = pods
            .list(&ListParams::default().labels(labels::CLAIM))
            .await?
            .items
            .iter()
            .filter(|p| ttdrv_testkit::pod_ready(p))
            .count();
        if loaded >= n && ready >= n {
            return Ok(());
        }
        if t.elapsed() > timeout {
            bail!(
                "{version}: loaded on {loaded} of {n} nodes, {ready} pods Ready, after {timeout:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The markdown table of the results.
pub fn table(results: &[PrepResult]) -> String {
    let mut s = String::from(
        "| N | build / load | how | rollout (version change → all Done) | out of service per node (cordon → uncordon) min / median / max | first cordon |\n|---:|---:|---|---:|---:|---:|\n",
    );
    let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1} s"));
    for r in results {
        let how = match (r.mode.as_str(), r.max_concurrent) {
            ("on", Some(c)) => format!("controller, prepare on (maxConcurrent {c})"),
            ("on", None) => "controller, prepare on (maxConcurrent 10)".to_string(),
            ("off", _) => "controller, prepare off".to_string(),
            _ => "serial kubectl loop".to_string(),
        };
        let rollout = if r.complete {
            format!("{:.1} s", r.rollout_s)
        } else {
            format!(
                "partial: {} of {} nodes done in {:.1} s (run stopped at {:.0} s)",
                r.nodes_done, r.nodes, r.rollout_s, r.elapsed_s
            )
        };
        s.push_str(&format!(
            "| {} | {:.0} s / {:.0} s | {} | {} | {} / {} / {} | {} |\n",
            r.nodes,
            r.build_s,
            r.load_s,
            how,
            rollout,
            f(r.oos_min_s),
            f(r.oos_median_s),
            f(r.oos_max_s),
            f(r.first_cordon_s)
        ));
    }
    s
}
