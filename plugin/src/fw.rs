//! `kubectl tt fw`: the firmware policies (TenstorrentFirmwarePolicy, `ttfwp`)
//! seen and steered from a terminal, as the Go operator's `kubectl-tt-fw`:
//! `status`, `nodes`, `watch`, `plan`, `pause`, `resume`, `retry`. Run as
//! `kubectl tt fw ...` (krew's `kubectl-tt` with `fw` first) or as the
//! binary `kubectl-tt-fw`. The plan is a pure function of the policy, its
//! nodes and their pods ([`plan`]).

use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use clap::{Parser, Subcommand};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde::Serialize;
use ttdrv_api::firmware::{
    FirmwareNodeState, FirmwareNodeStatus, TenstorrentFirmwarePolicy, labels as fw,
};
use ttdrv_core::drain::PodFacts;
use ttdrv_core::firmware::observe::{Selected, selects};
use ttdrv_core::selection::Eligibility;

use crate::cli::{Output, exit};
use crate::style::{GREEN, Palette, RED, YELLOW};
use crate::table::Table;

/// Shows and steers firmware rollouts of TenstorrentFirmwarePolicies (ttfwp).
#[derive(Debug, Parser)]
#[command(
    name = "kubectl tt fw",
    bin_name = "kubectl tt fw",
    version,
    after_help = "Without a subcommand: `status` of every firmware policy.\n\
                  Exit codes: 0 ok; 1 error; 2 `watch` ended with a Failed node; 3 `watch --timeout` ran out; 64 usage error."
)]
pub struct FwCli {
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text, global = true)]
    pub output: Output,
    #[arg(long, global = true)]
    pub context: Option<String>,
    #[arg(long, global = true, value_name = "PATH")]
    pub kubeconfig: Option<std::path::PathBuf>,
    #[command(subcommand)]
    pub command: Option<FwCommand>,
}

#[derive(Debug, Subcommand)]
pub enum FwCommand {
    /// One block per firmware policy: version, paused, summary, node states.
    Status { policy: Option<String> },
    /// Per-node table: state, firmware read back, reason, last flash Job.
    Nodes { policy: String },
    /// Refresh until every node is Done (exit 0) or one Failed (exit 2).
    Watch {
        policy: String,
        #[arg(long, default_value_t = 2.0)]
        interval: f64,
        #[arg(long)]
        timeout: Option<f64>,
    },
    /// Dry run: the order nodes would be flashed in, in waves of maxParallel,
    /// what holds a node back, and an estimate of the duration.
    Plan {
        policy: String,
        /// Prediction: seconds of one flash (bundle fetch, tt-flash, readback).
        #[arg(long, value_name = "S", default_value_t = 120)]
        flash_seconds: u32,
        /// Prediction: seconds of a node's cordon, drain and uncordon.
        #[arg(long, value_name = "S", default_value_t = 60)]
        drain_seconds: u32,
    },
    /// Set spec.paused=true: nothing new starts (a flash in progress finishes).
    Pause { policy: String },
    /// Set spec.paused=false.
    Resume { policy: String },
    /// Retry a Failed node (sets its firmware.tenstorrent.com/retry annotation).
    Retry { policy: String, node: String },
}

pub async fn run(cli: FwCli) -> Result<i32> {
    let client = crate::commands::client(cli.kubeconfig.as_deref(), cli.context.as_deref()).await?;
    let pal = Palette {
        color: crate::style::use_color(
            crate::style::ColorChoice::Auto,
            std::io::IsTerminal::is_terminal(&std::io::stdout()),
            std::env::var("NO_COLOR").ok().as_deref(),
        ),
    };
    let o = cli.output;
    match cli.command.unwrap_or(FwCommand::Status { policy: None }) {
        FwCommand::Status { policy } => {
            let ps = policies(&client, policy.as_deref()).await?;
            emit(o, &ps.iter().map(summary).collect::<Vec<_>>(), || {
                ps.iter().map(|p| status_text(p, pal)).collect()
            })?;
            Ok(exit::OK)
        }
        FwCommand::Nodes { policy } => {
            let p = get(&client, &policy).await?;
            let nodes = p.status.clone().unwrap_or_default().nodes;
            emit(o, &nodes, || nodes_table(&nodes, pal))?;
            Ok(exit::OK)
        }
        FwCommand::Watch {
            policy,
            interval,
            timeout,
        } => watch(&client, &policy, interval, timeout, pal).await,
        FwCommand::Plan {
            policy,
            flash_seconds,
            drain_seconds,
        } => {
            let p = get(&client, &policy).await?;
            let nodes: Api<Node> = Api::all(client.clone());
            let nodes = nodes.list(&ListParams::default()).await?.items;
            let pods: Api<Pod> = Api::all(client.clone());
            let pods = pods.list(&ListParams::default()).await?.items;
            let mut device_pods: BTreeMap<String, usize> = BTreeMap::new();
            for pod in &pods {
                let facts = PodFacts::of(pod);
                if let Some(n) = pod.spec.as_ref().and_then(|s| s.node_name.clone())
                    && facts.device
                    && !facts.installer
                    && !facts.finished
                {
                    *device_pods.entry(n).or_default() += 1;
                }
            }
            let plan = plan(&p, &nodes, &device_pods, flash_seconds, drain_seconds);
            emit(o, &plan, || plan_text(&plan))?;
            Ok(exit::OK)
        }
        FwCommand::Pause { policy } => set_paused(&client, &policy, true, o).await,
        FwCommand::Resume { policy } => set_paused(&client, &policy, false, o).await,
        FwCommand::Retry { policy, node } => retry(&client, &policy, &node, o).await,
    }
}

fn emit<T: Serialize>(o: Output, v: &T, text: impl FnOnce() -> String) -> Result<()> {
    let s = match o {
        Output::Text => text(),
        Output::Json => serde_json::to_string_pretty(v)? + "\n",
        Output::Yaml => serde_yaml::to_string(v)?,
    };
    let mut out = std::io::stdout().lock();
    out.write_all(s.as_bytes())?;
    out.flush()?;
    Ok(())
}

async fn get(client: &Client, name: &str) -> Result<TenstorrentFirmwarePolicy> {
    let api: Api<TenstorrentFirmwarePolicy> = Api::all(client.clone());
    match api.get_opt(name).await {
        Ok(Some(p)) => Ok(p),
        Ok(None) => {
            bail!("firmware policy {name:?} not found (list them with `kubectl get ttfwp`)")
        }
        Err(e) => Err(e).with_context(|| format!("reading firmware policy {name:?}")),
    }
}

async fn policies(client: &Client, name: Option<&str>) -> Result<Vec<TenstorrentFirmwarePolicy>> {
    if let Some(n) = name {
        return Ok(vec![get(client, n).await?]);
    }
    let api: Api<TenstorrentFirmwarePolicy> = Api::all(client.clone());
    let mut items = api
        .list(&ListParams::default())
        .await
        .context("listing TenstorrentFirmwarePolicies (is the CRD installed?)")?
        .items;
    items.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    Ok(items)
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Summary {
    name: String,
    version: String,
    paused: bool,
    matched: i32,
    up_to_date: i32,
    in_progress: i32,
    failed: i32,
    pending: i32,
}

fn summary(p: &TenstorrentFirmwarePolicy) -> Summary {
    let s = p.status.clone().unwrap_or_default().summary;
    Summary {
        name: p.metadata.name.clone().unwrap_or_default(),
        version: p.spec.version.clone(),
        paused: p.spec.paused,
        matched: s.matched,
        up_to_date: s.up_to_date,
        in_progress: s.in_progress,
        failed: s.failed,
        pending: s.pending,
    }
}

fn state_style(s: FirmwareNodeState) -> anstyle::Style {
    match s {
        FirmwareNodeState::Done => GREEN,
        FirmwareNodeState::Failed => RED,
        FirmwareNodeState::Pending => anstyle::Style::new(),
        _ => YELLOW,
    }
}

fn status_text(p: &TenstorrentFirmwarePolicy, pal: Palette) -> String {
    let s = summary(p);
    let mut out = format!(
        "{}  firmware {} (readback {}){}\n  {}/{} up to date, {} in progress, {} failed, {} pending\n",
        s.name,
        s.version,
        p.spec.readback(),
        if s.paused { "  PAUSED" } else { "" },
        s.up_to_date,
        s.matched,
        s.in_progress,
        s.failed,
        s.pending
    );
    let nodes = p.status.clone().unwrap_or_default().nodes;
    out.push_str(&indent(&nodes_table(&nodes, pal)));
    out
}

fn indent(s: &str) -> String {
    s.lines().map(|l| format!("  {l}\n")).collect()
}

fn nodes_table(nodes: &[FirmwareNodeStatus], pal: Palette) -> String {
    let mut t = Table::new(&["NODE", "STATE", "FIRMWARE", "REASON", "JOB"]);
    for n in nodes {
        t.row(vec![
            (n.name.clone(), anstyle::Style::new()),
            (n.state.as_str().to_string(), state_style(n.state)),
            (
                n.current_version.clone().unwrap_or("-".into()),
                anstyle::Style::new(),
            ),
            (
                n.reason.clone().unwrap_or("-".into()),
                anstyle::Style::new(),
            ),
            (
                n.last_flash_job.clone().unwrap_or("-".into()),
                anstyle::Style::new(),
            ),
        ]);
    }
    let mut s = t.render(pal, 0);
    for n in nodes
        .iter()
        .filter(|n| n.state == FirmwareNodeState::Failed)
    {
        s.push_str(&format!(
            "{}: {}\n",
            pal.paint(&n.name, RED),
            n.message.as_deref().unwrap_or("")
        ));
    }
    s
}

async fn watch(
    client: &Client,
    name: &str,
    interval: f64,
    timeout: Option<f64>,
    pal: Palette,
) -> Result<i32> {
    let started = Instant::now();
    let mut last = String::new();
    loop {
        let p = get(client, name).await?;
        let frame = status_text(&p, pal);
        if frame != last {
            println!("{frame}");
            last = frame;
        }
        match watch_verdict(&p) {
            Some(Verdict::Failed) => {
                eprintln!("firmware rollout halted: a node is Failed");
                return Ok(exit::FAILED_NODE);
            }
            Some(Verdict::Complete(note)) => {
                println!("Firmware rollout complete.{note}");
                return Ok(exit::OK);
            }
            None => {}
        }
        if let Some(t) = timeout
            && started.elapsed().as_secs_f64() > t
        {
            eprintln!("error: firmware rollout still running after {t}s (--timeout)");
            return Ok(exit::TIMEOUT);
        }
        tokio::time::sleep(Duration::from_secs_f64(interval.max(0.2))).await;
    }
}

/// How a watch ends, once the status is of the current spec.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Failed,
    /// Nothing pending or in progress; the note names the nodes another
    /// policy owns (its Conflict condition), if any.
    Complete(String),
}

fn watch_verdict(p: &TenstorrentFirmwarePolicy) -> Option<Verdict> {
    let st = p.status.as_ref()?;
    if st.summary.failed > 0 {
        return Some(Verdict::Failed);
    }
    let settled = st.observed_generation == p.metadata.generation
        && st.summary.pending == 0
        && st.summary.in_progress == 0
        // Until the policy selects a node (its own or another's), there is
        // no rollout to have completed.
        && !st.nodes.is_empty();
    if !settled {
        return None;
    }
    let note = st
        .conditions
        .iter()
        .find(|c| c.type_ == "Conflict" && c.status == "True")
        .map(|c| format!(" {}", c.message))
        .unwrap_or_default();
    Some(Verdict::Complete(note))
}

/// One node of a firmware plan.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PlanNode {
    pub name: String,
    /// The firmware it reads back now (its `fw-version` label).
    pub current: Option<String>,
    /// 1-based wave of maxParallel nodes; `None` when it is not flashed.
    pub wave: Option<usize>,
    /// Device users a drain would evict first.
    pub device_pods: usize,
    /// Why it is not in a wave, or what holds it.
    pub note: Option<String>,
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct FwPlan {
    pub policy: String,
    pub readback: String,
    pub max_parallel: usize,
    pub nodes: Vec<PlanNode>,
    pub waves: usize,
    /// Seconds, at the given per-node costs.
    pub estimate_seconds: u64,
}

/// The order a firmware rollout would flash `nodes` in: nodes without device
/// users first, then by name (the driver rollout's order), in waves of
/// `maxParallel`; nodes at the target, someone else's, cordoned by others,
/// NotReady or held by a driver cycle are named, not counted.
pub fn plan(
    p: &TenstorrentFirmwarePolicy,
    nodes: &[Node],
    device_pods: &BTreeMap<String, usize>,
    flash_seconds: u32,
    drain_seconds: u32,
) -> FwPlan {
    let readback = p.spec.readback();
    let max = usize::try_from(p.spec.upgrade_policy.max_parallel)
        .unwrap_or(1)
        .max(1);
    let mut todo: Vec<(bool, PlanNode)> = vec![];
    let mut rest: Vec<PlanNode> = vec![];
    for n in nodes {
        let name = n.metadata.name.clone().unwrap_or_default();
        let sel = selects(p, n, Eligibility::default());
        if sel == Selected::No {
            continue;
        }
        let current = ttdrv_core::node::label(n, fw::FW_VERSION).map(String::from);
        let device_pods = device_pods.get(&name).copied().unwrap_or(0);
        let mut pn = PlanNode {
            name: name.clone(),
            current: current.clone(),
            wave: None,
            device_pods,
            note: None,
        };
        let ours = ttdrv_core::node::annotation(n, fw::CORDONED_BY) == p.metadata.name.as_deref();
        pn.note = if let Selected::Conflict(o) = sel {
            Some(format!("owned by firmware policy {o}"))
        } else if current.as_deref() == Some(readback.as_str()) {
            Some("at the target".into())
        } else if !ttdrv_core::node::ready(n) {
            Some("NotReady: waits".into())
        } else if let Some(h) = ttdrv_core::claim::driver_cycle(n) {
            Some(format!("{h} has it: waits"))
        } else if ttdrv_core::node::unschedulable(n) && !ours {
            Some(format!("{}: waits", ttdrv_core::node::foreign_cordon(n)))
        } else {
            None
        };
        if pn.note.is_none() {
            todo.push((device_pods > 0, pn));
        } else {
            rest.push(pn);
        }
    }
    todo.sort_by(|a, b| (a.0, &a.1.name).cmp(&(b.0, &b.1.name)));
    let mut out: Vec<PlanNode> = todo
        .into_iter()
        .enumerate()
        .map(|(i, (_, mut n))| {
            n.wave = Some(i / max + 1);
            n
        })
        .collect();
    let waves = out.len().div_ceil(max);
    let per = u64::from(flash_seconds)
        + if p.spec.upgrade_policy.drain.enable {
            u64::from(drain_seconds)
        } else {
            0
        };
    rest.sort_by(|a, b| a.name.cmp(&b.name));
    out.extend(rest);
    FwPlan {
        policy: p.metadata.name.clone().unwrap_or_default(),
        readback,
        max_parallel: max,
        nodes: out,
        waves,
        estimate_seconds: waves as u64 * per,
    }
}

fn plan_text(p: &FwPlan) -> String {
    let mut t = Table::new(&["WAVE", "NODE", "FIRMWARE", "DEVICE PODS", "NOTE"]);
    for n in &p.nodes {
        t.plain_row(vec![
            n.wave.map_or("-".into(), |w| w.to_string()),
            n.name.clone(),
            n.current.clone().unwrap_or("-".into()),
            n.device_pods.to_string(),
            n.note.clone().unwrap_or_default(),
        ]);
    }
    format!(
        "firmware policy {}: flash to {} in {} wave(s) of up to {} node(s), about {} min\n{}",
        p.policy,
        p.readback,
        p.waves,
        p.max_parallel,
        p.estimate_seconds.div_ceil(60),
        t.render(Palette::PLAIN, 0)
    )
}

async fn set_paused(client: &Client, name: &str, paused: bool, o: Output) -> Result<i32> {
    get(client, name).await?;
    let api: Api<TenstorrentFirmwarePolicy> = Api::all(client.clone());
    let patch = serde_json::json!({ "spec": { "paused": paused } });
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("setting spec.paused={paused} on firmware policy {name:?}"))?;
    let word = if paused { "paused" } else { "resumed" };
    emit(
        o,
        &serde_json::json!({"policy": name, "paused": paused}),
        || format!("firmware policy {name:?} {word} (spec.paused={paused})\n"),
    )?;
    Ok(exit::OK)
}

async fn retry(client: &Client, name: &str, node: &str, o: Output) -> Result<i32> {
    let p = get(client, name).await?;
    let st = p.status.unwrap_or_default();
    let Some(e) = st.nodes.iter().find(|e| e.name == node) else {
        bail!("node {node:?} is not in firmware policy {name:?}'s status");
    };
    if e.state != FirmwareNodeState::Failed {
        bail!(
            "refusing to retry node {node:?}: it is {} in firmware policy {name:?}, not Failed",
            e.state.as_str()
        );
    }
    let token = k8s_openapi::jiff::Timestamp::now().as_second().to_string();
    let nodes: Api<Node> = Api::all(client.clone());
    let patch = serde_json::json!({ "metadata": { "annotations": { fw::RETRY: token } } });
    nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("annotating node {node:?}"))?;
    emit(
        o,
        &serde_json::json!({"policy": name, "node": node, "token": token}),
        || {
            format!(
                "retry of node {node:?} requested ({}={token}); it flashes again with a Job of its own\n",
                fw::RETRY
            )
        },
    )?;
    Ok(exit::OK)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ttdrv_core::fixtures::node;

    fn policy(max: i32) -> TenstorrentFirmwarePolicy {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "firmware.tenstorrent.com/v1alpha1",
            "kind": "TenstorrentFirmwarePolicy",
            "metadata": {"name": "fw"},
            "spec": {"version": "19.8.0", "nodeAffinity": {}, "upgradePolicy": {"maxParallel": max}}
        }))
        .expect("policy")
    }

    fn with_status(generation: i64, status: serde_json::Value) -> TenstorrentFirmwarePolicy {
        let mut p = policy(1);
        p.metadata.generation = Some(generation);
        p.status = Some(serde_json::from_value(status).expect("status"));
        p
    }

    #[test]
    fn watch_ends_when_the_policy_settles_even_with_another_policys_nodes() {
        let conflict = serde_json::json!({
            "name": "b", "state": "Pending", "reason": "NodeConflict",
            "message": "Conflict: node owned by a different TenstorrentFirmwarePolicy CR (fleet-fw)"
        });
        // Its own node done, one node another policy's (Conflict).
        let p = with_status(
            2,
            serde_json::json!({
                "observedGeneration": 2,
                "summary": {"matched": 1, "upToDate": 1, "inProgress": 0, "failed": 0, "pending": 0},
                "nodes": [{"name": "a", "state": "Done"}, conflict],
                "conditions": [{"type": "Conflict", "status": "True", "reason": "SelectorOverlap",
                    "message": "nodes another TenstorrentFirmwarePolicy owns are left to it: b (owned by fleet-fw)",
                    "lastTransitionTime": "2026-12-06T00:00:00Z"}]
            }),
        );
        assert_eq!(
            watch_verdict(&p),
            Some(Verdict::Complete(
                " nodes another TenstorrentFirmwarePolicy owns are left to it: b (owned by fleet-fw)"
                    .into()
            ))
        );
        // Every node another's: settled too.
        let p = with_status(
            1,
            serde_json::json!({"observedGeneration": 1, "summary": {}, "nodes": [conflict]}),
        );
        assert!(matches!(watch_verdict(&p), Some(Verdict::Complete(_))));
        // Still going, an older generation, nothing selected yet, or a failure.
        for (generation, status, want) in [
            (
                1,
                serde_json::json!({"observedGeneration": 1, "summary": {"matched": 2, "upToDate": 1, "pending": 1},
                "nodes": [{"name": "a", "state": "Done"}, {"name": "c", "state": "Pending"}]}),
                None,
            ),
            (
                2,
                serde_json::json!({"observedGeneration": 1, "summary": {"matched": 1, "upToDate": 1},
                "nodes": [{"name": "a", "state": "Done"}]}),
                None,
            ),
            (
                1,
                serde_json::json!({"observedGeneration": 1, "summary": {}, "nodes": []}),
                None,
            ),
            (
                1,
                serde_json::json!({"observedGeneration": 1, "summary": {"matched": 1, "failed": 1},
                "nodes": [{"name": "a", "state": "Failed"}]}),
                Some(Verdict::Failed),
            ),
        ] {
            assert_eq!(
                watch_verdict(&with_status(generation, status.clone())),
                want,
                "{status}"
            );
        }
    }

    #[test]
    fn plan_orders_waves_and_names_what_waits() {
        let tt = (ttdrv_api::labels::TT_PCI_PRESENT, "true");
        let nodes = vec![
            node("c", "True", false, &[tt]),
            node("a", "True", false, &[tt]),
            node("b", "True", false, &[tt]),
            node("done", "True", false, &[tt, (fw::FW_VERSION, "19.8.0.0")]),
            node("down", "False", false, &[tt]),
            node("admin", "True", true, &[tt]),
            node("other", "True", false, &[]),
        ];
        let busy = BTreeMap::from([("a".to_string(), 1)]);
        let p = plan(&policy(2), &nodes, &busy, 100, 50);
        let order: Vec<(&str, Option<usize>)> =
            p.nodes.iter().map(|n| (n.name.as_str(), n.wave)).collect();
        assert_eq!(
            order,
            [
                ("b", Some(1)),
                ("c", Some(1)),
                ("a", Some(2)),
                ("admin", None),
                ("done", None),
                ("down", None),
            ],
            "device users last; waves of maxParallel; the rest named"
        );
        assert_eq!((p.waves, p.estimate_seconds), (2, 300));
        assert!(
            p.nodes[3]
                .note
                .as_deref()
                .is_some_and(|n| n.contains("cordoned"))
        );
    }
}
