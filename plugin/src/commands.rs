//! The subcommands: read from the cluster, call the pure views and renderers,
//! write the few things the plugin changes (spec.paused, the retry annotation).

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use futures::AsyncBufReadExt;
use futures::TryStreamExt;
use futures::stream::{BoxStream, StreamExt};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{
    DeleteParams, ListParams, LogParams, Patch, PatchParams, Preconditions, PropagationPolicy,
};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde::Serialize;
use ttdrv_api::{TenstorrentDriverPolicy, labels};
use ttdrv_core::node::RETRY_ANNOTATION;

use crate::cli::{Cli, Command, Output, exit};
use crate::style::{Palette, use_color};
use crate::transitions::{self, Tracker, Transition};
use crate::view::{self, Outcome, WatchView};
use crate::{plan, render};

pub struct Ctx {
    pub client: Client,
    pub output: Output,
    pub pal: Palette,
    pub namespace: String,
    pub tty: bool,
}

/// The client of `--kubeconfig` and `--context`, as kubectl resolves them:
/// the file given, else $KUBECONFIG, else ~/.kube/config, else in-cluster.
pub async fn client(kubeconfig: Option<&std::path::Path>, context: Option<&str>) -> Result<Client> {
    let options = kube::config::KubeConfigOptions {
        context: context.map(str::to_string),
        ..Default::default()
    };
    let config = match (kubeconfig, context) {
        (Some(path), _) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &options)
                .await
                .with_context(|| match context {
                    Some(c) => format!("kubeconfig {}, context {c:?}", path.display()),
                    None => format!("kubeconfig {}", path.display()),
                })?
        }
        (None, Some(c)) => kube::Config::from_kubeconfig(&options)
            .await
            .with_context(|| format!("loading kubeconfig context {c:?}"))?,
        (None, None) => kube::Config::infer().await.context(
            "loading the Kubernetes configuration (KUBECONFIG, ~/.kube/config or in-cluster)",
        )?,
    };
    Client::try_from(config).context("building the Kubernetes client")
}

/// `completion <shell>`: clap_complete's script for the binary's own name.
fn completion(shell: clap_complete::Shell) -> Result<i32> {
    use clap::CommandFactory;
    // The script completes the binary's own name; "kubectl tt driver" (three
    // words) is kubectl's to complete (see `complete`).
    let mut cmd = Cli::command()
        .name("kubectl-tt-driver")
        .bin_name("kubectl-tt-driver");
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, "kubectl-tt-driver", &mut script);
    let mut script = String::from_utf8(script).context("completion script")?;
    if shell == clap_complete::Shell::Bash {
        // clap_complete's bash names a subcommand's section after the binary
        // with each '-' read as a subcommand separator, but dispatches to it
        // with "__": align the sections with the dispatch.
        script = script.replace("kubectl__subcmd__tt__subcmd__driver", "kubectl__tt__driver");
    }
    let mut out = std::io::stdout().lock();
    out.write_all(script.as_bytes())?;
    out.flush()?;
    Ok(exit::OK)
}

/// `__complete <words>` (what the `kubectl_complete-*` shim runs): candidates
/// for kubectl's plugin completion. The words are the command line being typed,
/// so they are read as they are, not parsed (`-o ""` is incomplete, not an
/// error). Names come from the cluster when it answers (its `--kubeconfig` and
/// `--context` taken from the words); completion never fails on its account.
pub async fn complete(words: &[String]) -> Result<i32> {
    use clap::CommandFactory;
    let cmd = Cli::command();
    let done = &words[..words.len().saturating_sub(1)];
    let flag = |name: &str| {
        done.iter().enumerate().find_map(|(i, w)| {
            w.strip_prefix(&format!("--{name}="))
                .map(str::to_string)
                .or_else(|| {
                    (w == &format!("--{name}"))
                        .then(|| done.get(i + 1).cloned())
                        .flatten()
                })
        })
    };
    let kubeconfig = flag("kubeconfig").map(std::path::PathBuf::from);
    let context = flag("context");
    let policies: Vec<TenstorrentDriverPolicy> =
        match client(kubeconfig.as_deref(), context.as_deref()).await {
            Ok(c) => Api::<TenstorrentDriverPolicy>::all(c)
                .list(&ListParams::default())
                .await
                .map(|l| l.items)
                .unwrap_or_default(),
            Err(_) => Vec::new(),
        };
    let names = || {
        policies
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect()
    };
    let nodes = |policy: &str| {
        policies
            .iter()
            .filter(|p| p.metadata.name.as_deref() == Some(policy))
            .flat_map(|p| p.status.iter().flat_map(|s| s.nodes.iter()))
            .map(|n| n.name.clone())
            .collect()
    };
    let mut out = std::io::stdout().lock();
    for line in crate::complete::candidates(&cmd, words, &names, &nodes) {
        writeln!(out, "{line}")?;
    }
    out.flush()?;
    Ok(exit::OK)
}

/// Runs the command line; returns the process exit code.
pub async fn run(cli: Cli) -> Result<i32> {
    if let Some(Command::Completion { shell }) = &cli.command {
        return completion(*shell);
    }
    let tty = std::io::stdout().is_terminal();
    let no_color = std::env::var("NO_COLOR").ok();
    let ctx = Ctx {
        client: client(cli.kubeconfig.as_deref(), cli.context.as_deref()).await?,
        output: cli.output,
        pal: Palette {
            color: use_color(cli.color, tty, no_color.as_deref()),
        },
        namespace: cli.namespace,
        tty,
    };
    match cli.command.unwrap_or(Command::Status { policy: None }) {
        Command::Status { policy } => status(&ctx, policy.as_deref()).await,
        Command::Nodes { policy } => nodes(&ctx, &policy).await,
        Command::Watch {
            policy,
            interval,
            timeout,
        } => watch(&ctx, policy.as_deref(), interval, timeout).await,
        Command::Plan {
            policy,
            version,
            build_seconds,
            load_seconds,
            pod_seconds,
            drain_seconds,
            deploy_gates,
        } => {
            let costs = crate::eta::Costs {
                build: build_seconds.into(),
                load: load_seconds.into(),
                pod_replacement: pod_seconds.into(),
                drain: drain_seconds.into(),
            };
            plan_cmd(&ctx, &policy, version.as_deref(), costs, deploy_gates).await
        }
        Command::Pause { policy } => set_paused(&ctx, &policy, true).await,
        Command::Resume { policy } => set_paused(&ctx, &policy, false).await,
        Command::Retry { policy, node } => retry(&ctx, &policy, &node).await,
        Command::Restart { policy, node } => restart(&ctx, &policy, node.as_deref()).await,
        Command::Handback {
            policy,
            dry_run,
            wait,
            timeout,
            force,
            accept_go_swap,
        } => {
            let opts = HandbackOptions {
                dry_run,
                wait,
                force,
                accept_go_swap,
                timeout: Duration::from_secs(timeout),
            };
            handback(&ctx, &policy, opts).await
        }
        Command::Logs {
            policy,
            node,
            tail,
            follow,
            previous,
        } => logs(&ctx, &policy, node.as_deref(), tail, follow, previous).await,
        // Answered above, without a client.
        Command::Completion { .. } => Ok(exit::OK),
    }
}

fn now_secs() -> i64 {
    k8s_openapi::jiff::Timestamp::now().as_second()
}

/// Prints `value` as JSON/YAML, or the text.
fn emit<T: Serialize>(ctx: &Ctx, value: &T, text: impl FnOnce() -> String) -> Result<()> {
    let s = match ctx.output {
        Output::Text => text(),
        Output::Json => serde_json::to_string_pretty(value)? + "\n",
        Output::Yaml => serde_yaml::to_string(value)?,
    };
    let mut out = std::io::stdout().lock();
    out.write_all(s.as_bytes())?;
    out.flush()?;
    Ok(())
}

pub async fn get_policy(client: &Client, name: &str) -> Result<TenstorrentDriverPolicy> {
    let api: Api<TenstorrentDriverPolicy> = Api::all(client.clone());
    match api.get_opt(name).await {
        Ok(Some(p)) => Ok(p),
        Ok(None) => bail!("policy {name:?} not found (list them with `kubectl get ttdp`)"),
        Err(e) => Err(api_error(e)).with_context(|| format!("reading policy {name:?}")),
    }
}

/// Turns kube errors into short messages: the API server's own message for API
/// errors, and a hint when the policy API itself is missing.
fn api_error(e: kube::Error) -> anyhow::Error {
    match e {
        kube::Error::Api(s) if s.code == 404 => anyhow::anyhow!(
            "the API server does not serve driver.tenstorrent.com/v1alpha1 TenstorrentDriverPolicies: \
             is the operator's CRD installed? (kubectl apply -f crds/)"
        ),
        kube::Error::Api(s) => anyhow::anyhow!("{} ({})", s.message, s.code),
        other => other.into(),
    }
}

async fn list_policies(client: &Client) -> Result<Vec<TenstorrentDriverPolicy>> {
    let api: Api<TenstorrentDriverPolicy> = Api::all(client.clone());
    let mut items = api
        .list(&ListParams::default())
        .await
        .map_err(api_error)
        .context("listing TenstorrentDriverPolicies")?
        .items;
    items.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    Ok(items)
}

/// Policies named, or all.
async fn policies(client: &Client, name: Option<&str>) -> Result<Vec<TenstorrentDriverPolicy>> {
    match name {
        Some(n) => Ok(vec![get_policy(client, n).await?]),
        None => list_policies(client).await,
    }
}

/// Label selector of the nodes claimed by `policy` (or by any policy).
fn claim_selector(policy: Option<&str>) -> String {
    match policy {
        Some(p) => format!("{}={p}", labels::CLAIM),
        None => labels::CLAIM.to_string(),
    }
}

/// Nodes claimed by `policy` (or by any policy), with their upgrade records.
async fn claimed_nodes(client: &Client, policy: Option<&str>) -> Result<Vec<Node>> {
    let api: Api<Node> = Api::all(client.clone());
    Ok(api
        .list(&ListParams::default().labels(&claim_selector(policy)))
        .await
        .context("listing nodes")?
        .items)
}

async fn status(ctx: &Ctx, name: Option<&str>) -> Result<i32> {
    let ps = policies(&ctx.client, name).await?;
    let nodes = claimed_nodes(&ctx.client, name).await?;
    let now = now_secs();
    let mut views = Vec::with_capacity(ps.len());
    for p in &ps {
        let mut v = view::policy_view(p, &nodes, now);
        if let Some(after) = &p.spec.promote_after {
            let canary = match ps
                .iter()
                .find(|c| c.metadata.name.as_ref() == Some(&after.policy))
            {
                Some(c) => Some(c.clone()),
                None => Api::<TenstorrentDriverPolicy>::all(ctx.client.clone())
                    .get_opt(&after.policy)
                    .await
                    .map_err(api_error)
                    .with_context(|| format!("reading the canary policy {:?}", after.policy))?,
            };
            v.promotion = view::promotion_view(p, canary.as_ref(), now);
        }
        views.push(v);
    }
    emit(ctx, &views, || render::status(&views, ctx.pal))?;
    Ok(0)
}

async fn nodes(ctx: &Ctx, name: &str) -> Result<i32> {
    let p = get_policy(&ctx.client, name).await?;
    let nodes = claimed_nodes(&ctx.client, Some(name)).await?;
    let v = view::policy_view(&p, &nodes, now_secs());
    emit(ctx, &v.nodes, || render::nodes(&v, ctx.pal))?;
    Ok(0)
}

/// What changes between two `watch` frames worth printing when not on a terminal.
fn watch_key(views: &[WatchView]) -> String {
    let key: Vec<_> = views
        .iter()
        .map(|w| {
            (
                &w.policy.name,
                &w.policy.version,
                w.policy.paused,
                &w.progress,
                &w.outcome,
                w.policy
                    .nodes
                    .iter()
                    .map(|n| (&n.name, n.state, &n.current_version, &n.reason))
                    .collect::<Vec<_>>(),
            )
        })
        .collect();
    serde_json::to_string(&key).unwrap_or_default()
}

/// Combined outcome of every watched policy.
pub fn overall(views: &[WatchView]) -> Outcome {
    let mut failed = vec![];
    for w in views {
        if let Outcome::Failed { nodes } = &w.outcome {
            failed.extend(nodes.iter().cloned());
        }
    }
    if !failed.is_empty() {
        return Outcome::Failed { nodes: failed };
    }
    if !views.is_empty() && views.iter().all(|w| w.outcome == Outcome::Complete) {
        Outcome::Complete
    } else {
        Outcome::Running
    }
}

/// The watched nodes' record writes, each seen (a poll would miss those
/// overwritten within its interval), as transitions; off for `-o json|yaml`.
struct NodeFeed {
    events: Option<BoxStream<'static, Result<watcher::Event<Node>, watcher::Error>>>,
    tracker: Tracker,
    warned: bool,
}

impl NodeFeed {
    fn new(ctx: &Ctx, policy: Option<&str>) -> Self {
        let events = (ctx.output == Output::Text).then(|| {
            let api: Api<Node> = Api::all(ctx.client.clone());
            let config = watcher::Config::default().labels(&claim_selector(policy));
            watcher::watcher(api, config).default_backoff().boxed()
        });
        Self {
            events,
            tracker: Tracker::new(policy),
            warned: false,
        }
    }

    /// The next transition seen before `deadline`, or None once it passed.
    async fn next_until(&mut self, deadline: tokio::time::Instant) -> Option<Transition> {
        loop {
            let Some(events) = self.events.as_mut() else {
                tokio::time::sleep_until(deadline).await;
                return None;
            };
            let next = tokio::select! {
                _ = tokio::time::sleep_until(deadline) => return None,
                next = events.next() => next,
            };
            match next {
                Some(Ok(event)) => {
                    if let Some(t) = self.tracker.event(&event) {
                        return Some(t);
                    }
                }
                // The watch retries with backoff; the table still updates.
                Some(Err(e)) => {
                    if !self.warned {
                        eprintln!("warning: watching nodes: {e} (state changes may be missed)");
                        self.warned = true;
                    }
                }
                None => self.events = None,
            }
        }
    }
}

/// Redraws the terminal screen in place: home, each line cleared to its end,
/// rest cleared (no flicker).
fn redraw(out: &mut impl Write, frame: &str, first: bool) -> Result<()> {
    let mut s = String::from(if first { "\x1b[2J\x1b[H" } else { "\x1b[H" });
    for line in frame.lines() {
        s.push_str(line);
        s.push_str("\x1b[K\n");
    }
    s.push_str("\x1b[J");
    out.write_all(s.as_bytes())?;
    Ok(())
}

/// Shows a transition: a line of its own off a terminal, on a terminal in the
/// screen's list under the table (`frame` is the last table drawn).
fn show_transition(ctx: &Ctx, feed: &NodeFeed, t: &Transition, frame: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    if ctx.tty {
        redraw(
            &mut out,
            &(frame.to_string() + &transitions::section(&feed.tracker, ctx.pal)),
            false,
        )?;
    } else {
        out.write_all(transitions::line(t, ctx.pal).as_bytes())?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}

async fn watch(ctx: &Ctx, name: Option<&str>, interval: f64, timeout: Option<f64>) -> Result<i32> {
    let started = Instant::now();
    let interval = Duration::from_secs_f64(interval.max(0.1));
    let mut last_key = String::new();
    let mut first = true;
    let mut feed = NodeFeed::new(ctx, name);
    let mut frame = String::new();
    loop {
        let ps = policies(&ctx.client, name).await?;
        if ps.is_empty() {
            bail!("no TenstorrentDriverPolicy found to watch");
        }
        let nodes = claimed_nodes(&ctx.client, name).await?;
        let now = now_secs();
        let views: Vec<WatchView> = ps
            .iter()
            .map(|p| view::watch_view(p, &nodes, now))
            .collect();
        let result = overall(&views);
        if result != Outcome::Running {
            // The last writes (Upgrading → Done) come before the status
            // that ends the rollout: print them before its last screen.
            let grace = tokio::time::Instant::now() + Duration::from_millis(500);
            while let Some(t) = feed.next_until(grace).await {
                if !ctx.tty {
                    show_transition(ctx, &feed, &t, &frame)?;
                }
            }
        }
        let key = watch_key(&views);
        {
            let mut out = std::io::stdout().lock();
            match ctx.output {
                Output::Text if ctx.tty => {
                    frame = render::watch_frame(&views, now, ctx.pal);
                    let with = frame.clone() + &transitions::section(&feed.tracker, ctx.pal);
                    redraw(&mut out, &with, first)?;
                }
                Output::Text => {
                    if key != last_key {
                        let frame = render::watch_frame(&views, now, ctx.pal);
                        out.write_all(frame.as_bytes())?;
                        out.write_all(b"\n")?;
                    }
                }
                Output::Json => {
                    if key != last_key {
                        out.write_all(serde_json::to_string(&views)?.as_bytes())?;
                        out.write_all(b"\n")?;
                    }
                }
                Output::Yaml => {
                    if key != last_key {
                        out.write_all(b"---\n")?;
                        out.write_all(serde_yaml::to_string(&views)?.as_bytes())?;
                    }
                }
            }
            out.flush()?;
        }
        first = false;
        last_key = key;
        match result {
            Outcome::Complete => {
                if ctx.output == Output::Text {
                    println!("Rollout complete.");
                }
                return Ok(0);
            }
            Outcome::Failed { nodes } => {
                for n in nodes {
                    eprintln!(
                        "rollout halted: node {} Failed ({}): {}",
                        n.name,
                        n.reason.as_deref().unwrap_or("-"),
                        n.message.as_deref().unwrap_or("")
                    );
                }
                return Ok(exit::FAILED_NODE);
            }
            Outcome::Running => {}
        }
        if let Some(t) = timeout
            && started.elapsed().as_secs_f64() > t
        {
            eprintln!("error: rollout still running after {t}s (--timeout)");
            return Ok(exit::TIMEOUT);
        }
        // Until the next poll, each node state change as it is written.
        let next_poll = tokio::time::Instant::now() + interval;
        while let Some(t) = feed.next_until(next_poll).await {
            show_transition(ctx, &feed, &t, &frame)?;
        }
    }
}

async fn plan_cmd(
    ctx: &Ctx,
    name: &str,
    version: Option<&str>,
    costs: crate::eta::Costs,
    deploy_gates: Option<Vec<String>>,
) -> Result<i32> {
    if let Some(v) = version
        && !ttdrv_api::validation::is_valid_version(v)
    {
        bail!(
            "--version {v:?} is not a tt-kmd version (MAJOR.MINOR.PATCH, at most 9 digits per part, e.g. 2.8.0)"
        );
    }
    let p = get_policy(&ctx.client, name).await?;
    let c = &ctx.client;
    let all = list_policies(c).await?;
    let nodes = Api::<Node>::all(c.clone())
        .list(&ListParams::default())
        .await
        .context("listing nodes")?
        .items;
    let pods = Api::<Pod>::all(c.clone())
        .list(&ListParams::default())
        .await
        .context("listing pods")?
        .items;
    let pdbs = Api::<PodDisruptionBudget>::all(c.clone())
        .list(&ListParams::default())
        .await
        .context("listing PodDisruptionBudgets")?
        .items;
    let daemon_sets = Api::<DaemonSet>::all(c.clone())
        .list(&ListParams::default())
        .await
        .context("listing DaemonSets")?
        .items;
    let gates = match deploy_gates {
        Some(g) => g,
        None => controller_deploy_gates(ctx).await,
    };
    let gates: Vec<String> = gates
        .iter()
        .map(|g| g.trim().to_string())
        .filter(|g| !g.is_empty())
        .collect();
    let rp = plan::build(&plan::Inputs {
        policy: &p,
        policies: &all,
        nodes: &nodes,
        pods: &pods,
        pdbs: &pdbs,
        daemon_sets: &daemon_sets,
        deploy_gates: &gates,
        operator_namespace: &ctx.namespace,
        version,
        costs,
        now: now_secs(),
    });
    emit(ctx, &rp, || render::plan(&rp, ctx.pal))?;
    Ok(0)
}

/// The deploy gates the controller runs with: `TTDRV_DEPLOY_GATES` of a
/// Deployment's container in the operator's namespace (the chart sets it),
/// else the chart default.
async fn controller_deploy_gates(ctx: &Ctx) -> Vec<String> {
    let default = || {
        labels::DEFAULT_DEPLOY_GATES
            .split(',')
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let Ok(list) = Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(
        ctx.client.clone(),
        &ctx.namespace,
    )
    .list(&ListParams::default())
    .await
    else {
        return default();
    };
    list.items
        .iter()
        .filter_map(|d| d.spec.as_ref()?.template.spec.as_ref())
        .flat_map(|s| s.containers.iter())
        .flat_map(|c| c.env.iter().flatten())
        .find(|e| e.name == "TTDRV_DEPLOY_GATES")
        .map_or_else(default, |e| {
            e.value
                .as_deref()
                .unwrap_or_default()
                .split(',')
                .map(str::to_string)
                .collect()
        })
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PausedResult<'a> {
    policy: &'a str,
    paused: bool,
    changed: bool,
}

async fn set_paused(ctx: &Ctx, name: &str, paused: bool) -> Result<i32> {
    let p = get_policy(&ctx.client, name).await?;
    let changed = p.spec.paused != paused;
    if changed {
        let api: Api<TenstorrentDriverPolicy> = Api::all(ctx.client.clone());
        let patch = serde_json::json!({ "spec": { "paused": paused } });
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .with_context(|| format!("setting spec.paused={paused} on policy {name:?}"))?;
    }
    let res = PausedResult {
        policy: name,
        paused,
        changed,
    };
    emit(ctx, &res, || {
        let word = if paused { "paused" } else { "resumed" };
        if changed {
            format!("policy {name:?} {word} (spec.paused={paused})\n")
        } else {
            format!("policy {name:?} was already {word} (spec.paused={paused})\n")
        }
    })?;
    Ok(0)
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct RetryResult<'a> {
    policy: &'a str,
    node: &'a str,
    annotation: &'a str,
    token: String,
}

async fn retry(ctx: &Ctx, name: &str, node: &str) -> Result<i32> {
    let p = get_policy(&ctx.client, name).await?;
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let n = nodes
        .get_opt(node)
        .await
        .with_context(|| format!("reading node {node:?}"))?;
    let Some(n) = n else {
        bail!("node {node:?} not found");
    };
    let status = p.status.unwrap_or_default();
    let Some(entry) = status.nodes.iter().find(|e| e.name == node) else {
        bail!("node {node:?} is not managed by policy {name:?} (it is not in the policy's status)");
    };
    if !entry.state.is_failed() {
        bail!(
            "refusing to retry node {node:?}: it is {} in policy {name:?}, not Failed or UnloadFailed (only a failed node can be retried)",
            entry.state.as_str()
        );
    }
    let current = ttdrv_core::node::retry_token(&n).map(String::from);
    let mut token = now_secs().to_string();
    if current.as_deref() == Some(token.as_str()) {
        token.push_str("-1");
    }
    let patch = ttdrv_core::node::retry_patch(&token);
    nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("annotating node {node:?}"))?;
    let res = RetryResult {
        policy: name,
        node,
        annotation: RETRY_ANNOTATION,
        token: token.clone(),
    };
    emit(ctx, &res, || {
        format!(
            "retry of node {node:?} requested ({RETRY_ANNOTATION}={token}); the controller moves it back to Pending\n"
        )
    })?;
    Ok(0)
}

/// The installer pods of policy `name` (on `node` only, if given), by node.
async fn installer_pods(
    ctx: &Ctx,
    name: &str,
    node: Option<&str>,
) -> Result<BTreeMap<String, Pod>> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let sel = format!("{}={name}", labels::CLAIM);
    let list = pods
        .list(&ListParams::default().labels(&sel))
        .await
        .with_context(|| format!("listing installer pods in namespace {:?}", ctx.namespace))?;
    let mut by_node = BTreeMap::new();
    for p in list.items {
        let n = p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        if node.is_none_or(|want| want == n) {
            by_node.insert(n, p);
        }
    }
    Ok(by_node)
}

/// What `restart` and `logs` say when there is no installer pod to act on.
fn no_installer_pods(ctx: &Ctx, name: &str, node: Option<&str>) -> anyhow::Error {
    match node {
        Some(n) => anyhow::anyhow!(
            "no installer pod of policy {name:?} on node {n:?} in namespace {:?}",
            ctx.namespace
        ),
        None => anyhow::anyhow!(
            "policy {name:?} has no installer pods in namespace {:?} (is --namespace right?)",
            ctx.namespace
        ),
    }
}

#[derive(Serialize)]
struct RestartResult<'a> {
    policy: &'a str,
    namespace: &'a str,
    deleted: Vec<String>,
}

/// `restart <policy> [node]`: deletes the policy's installer pods (the Go
/// plugin's `restart`). The DaemonSet makes new ones; a new pod never swaps a
/// loaded module without the controller's go-ahead, so this is safe mid-rollout.
async fn restart(ctx: &Ctx, name: &str, node: Option<&str>) -> Result<i32> {
    get_policy(&ctx.client, name).await?;
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let mut deleted = vec![];
    for p in installer_pods(ctx, name, node).await?.into_values() {
        let pod = p.metadata.name.clone().unwrap_or_default();
        match pods.delete(&pod, &Default::default()).await {
            Ok(_) => deleted.push(pod),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("deleting installer pod {}/{pod}", ctx.namespace));
            }
        }
    }
    if deleted.is_empty() {
        return Err(no_installer_pods(ctx, name, node));
    }
    deleted.sort();
    let res = RestartResult {
        policy: name,
        namespace: &ctx.namespace,
        deleted: deleted.clone(),
    };
    emit(ctx, &res, || {
        let mut out = String::new();
        for pod in &deleted {
            out.push_str(&format!("pod {}/{pod} deleted\n", ctx.namespace));
        }
        out.push_str(&format!(
            "{} installer pod(s) of policy {name:?} deleted; the DaemonSet makes new ones\n",
            deleted.len()
        ));
        out
    })?;
    Ok(0)
}

async fn logs(
    ctx: &Ctx,
    name: &str,
    node: Option<&str>,
    tail: Option<i64>,
    follow: bool,
    previous: bool,
) -> Result<i32> {
    get_policy(&ctx.client, name).await?;
    if let Some(n) = node {
        let nodes: Api<Node> = Api::all(ctx.client.clone());
        if nodes
            .get_opt(n)
            .await
            .with_context(|| format!("reading node {n:?}"))?
            .is_none()
        {
            bail!("node {n:?} not found");
        }
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let by_node = installer_pods(ctx, name, node).await?;
    if by_node.is_empty() {
        return Err(no_installer_pods(ctx, name, node));
    }
    if follow && by_node.len() > 1 {
        bail!("--follow needs one node: kubectl tt driver logs {name} <node> -f");
    }
    let lp = LogParams {
        container: Some("installer".into()),
        tail_lines: tail,
        follow,
        previous,
        ..Default::default()
    };
    let many = by_node.len() > 1;
    let mut errors = vec![];
    for (n, p) in &by_node {
        let pod = p.metadata.name.clone().unwrap_or_default();
        if many {
            println!("==> node {n}, pod {}/{pod} <==", ctx.namespace);
        }
        if follow {
            let stream = match pods.log_stream(&pod, &lp).await {
                Ok(s) => s,
                Err(e) => bail!("{}", log_failure(ctx, n, &pod, &e).await),
            };
            let mut lines = stream.lines();
            while let Some(line) = lines.try_next().await? {
                println!("{line}");
            }
        } else {
            match pods.logs(&pod, &lp).await {
                Ok(text) => {
                    print!("{text}");
                    if !text.is_empty() && !text.ends_with('\n') {
                        println!();
                    }
                }
                Err(e) => errors.push(log_failure(ctx, n, &pod, &e).await),
            }
        }
    }
    if !errors.is_empty() {
        bail!("could not read installer logs: {}", errors.join("; "));
    }
    Ok(0)
}

/// Why the log of `pod` on `node` could not be read. A simulated node (kwok,
/// as in `make demo`) has no kubelet and its pods run no container, so the API
/// server answers 400: say that plainly rather than pass the 400 on alone.
async fn log_failure(ctx: &Ctx, node: &str, pod: &str, e: &kube::Error) -> String {
    let said = match e {
        kube::Error::Api(s) => format!("{} ({})", s.message, s.code),
        e => e.to_string(),
    };
    // Best effort: a node we cannot read is not known to be simulated.
    let simulated = Api::<Node>::all(ctx.client.clone())
        .get_opt(node)
        .await
        .ok()
        .flatten()
        .is_some_and(|n| is_simulated(&n));
    log_failure_text(&ctx.namespace, pod, node, &said, simulated)
}

/// kwok simulates the nodes that carry this annotation (the demo's, the
/// test cluster's).
const KWOK_NODE_ANNOTATION: &str = "kwok.x-k8s.io/node";

fn is_simulated(n: &Node) -> bool {
    n.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(KWOK_NODE_ANNOTATION))
}

fn log_failure_text(ns: &str, pod: &str, node: &str, said: &str, simulated: bool) -> String {
    if simulated {
        format!(
            "pod {ns}/{pod} on node {node}: no log to read: the node is simulated (kwok, annotation \
             {KWOK_NODE_ANNOTATION}) and its pods run no container. On a real node this shows the \
             installer's output; here `kubectl tt driver nodes` and the policy's Events tell what \
             happened (the API server said: {said})"
        )
    } else {
        format!("pod {ns}/{pod} on node {node}: {said}")
    }
}

pub struct HandbackOptions {
    pub dry_run: bool,
    pub wait: bool,
    pub force: bool,
    pub accept_go_swap: bool,
    pub timeout: Duration,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct HandbackResult<'a> {
    dry_run: bool,
    namespace: &'a str,
    #[serde(flatten)]
    plan: &'a crate::handback::Plan,
}

/// Reads what the hand-back decides on: the policy, every node, `ttdrv-<policy>`.
async fn handback_plan(ctx: &Ctx, name: &str) -> Result<crate::handback::Plan> {
    let p = get_policy(&ctx.client, name).await?;
    let nodes = Api::<Node>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await
        .context("listing nodes")?
        .items;
    let ds_name = format!("ttdrv-{name}");
    let ds = Api::<DaemonSet>::namespaced(ctx.client.clone(), &ctx.namespace)
        .get_opt(&ds_name)
        .await
        .with_context(|| format!("reading DaemonSet {}/{ds_name}", ctx.namespace))?;
    Ok(crate::handback::decide(
        name,
        &p.spec.version,
        p.spec.paused,
        &nodes,
        ds.as_ref(),
    ))
}

fn in_cycle_names(plan: &crate::handback::Plan) -> String {
    plan.in_cycle
        .iter()
        .map(|c| format!("{} ({})", c.name, c.state))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Sets (`Some(when)`) or removes the policy's [`labels::HANDBACK`] hold,
/// and `spec.paused` with it when `paused` is given (in the same patch: the
/// controller never sees the one without the other).
async fn set_handback_hold(
    ctx: &Ctx,
    name: &str,
    when: Option<String>,
    paused: Option<bool>,
) -> Result<()> {
    let mut patch =
        serde_json::json!({ "metadata": { "annotations": { labels::HANDBACK: when } } });
    if let Some(p) = paused {
        patch["spec"] = serde_json::json!({ "paused": p });
    }
    Api::<TenstorrentDriverPolicy>::all(ctx.client.clone())
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("setting {} on policy {name:?}", labels::HANDBACK))?;
    Ok(())
}

/// `--wait`: holds new cycles ([`labels::HANDBACK`]: unlike `spec.paused`,
/// the cycles under way go on to their end), then waits for them to end.
/// On a timeout the hold is lifted again: the rollout goes on as before.
async fn hold_and_wait(
    ctx: &Ctx,
    name: &str,
    opts: &HandbackOptions,
    started: Instant,
    mut plan: crate::handback::Plan,
) -> Result<crate::handback::Plan> {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    // A paused policy holds its cycles where they are: resumed under the
    // hold, they go on and nothing new starts; paused again if we give up.
    let was_paused = !plan.pause;
    set_handback_hold(ctx, name, Some(now), was_paused.then_some(false)).await?;
    eprintln!(
        "policy {name:?}: no new cycle starts; waiting for the cycles under way to end: {}",
        in_cycle_names(&plan)
    );
    while !plan.in_cycle.is_empty() {
        if started.elapsed() > opts.timeout {
            set_handback_hold(ctx, name, None, was_paused.then_some(true)).await?;
            bail!(
                "nodes still in a cycle after {}s (--timeout): {}. The hold on new cycles is \
                 lifted (the policy is as it was); nothing was handed back",
                opts.timeout.as_secs(),
                in_cycle_names(&plan)
            );
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        plan = handback_plan(ctx, name).await?;
    }
    Ok(plan)
}

/// `handback <policy>`: see [`crate::handback`]. With `--wait`, holds new
/// cycles and waits for those under way to end first; refuses nodes at
/// another version unless accepted ([`crate::handback::swap_refusal`]); then
/// pauses, so our controller neither re-creates the DaemonSet nor starts a
/// node meanwhile (a paused policy's DaemonSet is not applied); then deletes
/// the DaemonSet, waits for our installer pods to be gone, and patches the
/// nodes.
async fn handback(ctx: &Ctx, name: &str, opts: HandbackOptions) -> Result<i32> {
    let started = Instant::now();
    let mut plan = handback_plan(ctx, name).await?;
    if opts.dry_run {
        let res = HandbackResult {
            dry_run: true,
            namespace: &ctx.namespace,
            plan: &plan,
        };
        emit(ctx, &res, || {
            let mut s = String::new();
            if !plan.in_cycle.is_empty() {
                s.push_str(&format!(
                    "refused without --wait or --force: nodes in a cycle: {}\n",
                    in_cycle_names(&plan)
                ));
            }
            s + &crate::handback::render(&plan, &ctx.namespace, false)
        })?;
        return Ok(exit::OK);
    }
    // Whether --wait set its hold, and whether the policy was paused then.
    let mut held = None;
    if !plan.in_cycle.is_empty() && !opts.force {
        if !opts.wait {
            bail!(
                "refusing to hand back policy {name:?}: nodes in a cycle: {}. Wait for it to end \
                 (--wait), or --force to hand them back as they stand",
                in_cycle_names(&plan)
            );
        }
        let was_paused = !plan.pause;
        plan = hold_and_wait(ctx, name, &opts, started, plan).await?;
        held = Some(was_paused);
    }
    if let Some(why) = crate::handback::swap_refusal(&plan, opts.accept_go_swap) {
        // The hold of --wait is lifted (and a pause put back): nothing is
        // handed back.
        if let Some(was_paused) = held {
            set_handback_hold(ctx, name, None, was_paused.then_some(true)).await?;
        }
        bail!("{why}");
    }
    let policies: Api<TenstorrentDriverPolicy> = Api::all(ctx.client.clone());
    // Paused, and the hold of --wait removed with it (paused holds all).
    let patch = serde_json::json!({
        "metadata": { "annotations": { labels::HANDBACK: null } },
        "spec": { "paused": true }
    });
    policies
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("setting spec.paused=true on policy {name:?}"))?;
    // A cycle that started between the read and the pause holds where it is
    // (paused); it is reported, and handed back only with --force.
    let paused_plan = handback_plan(ctx, name).await?;
    if !paused_plan.in_cycle.is_empty() && !opts.force {
        bail!(
            "policy {name:?} paused, but a cycle started before the pause took: {}. \
             Resume it (kubectl tt driver resume {name}) and hand back again, or --force",
            in_cycle_names(&paused_plan)
        );
    }
    let plan = crate::handback::Plan {
        pause: plan.pause,
        ..paused_plan
    };
    if let Some(ds_name) = &plan.delete_daemonset {
        let api: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
        let uid = api
            .get_opt(ds_name)
            .await
            .with_context(|| format!("reading DaemonSet {}/{ds_name}", ctx.namespace))?
            .and_then(|d| d.metadata.uid);
        // Background: the DaemonSet goes at once (its name is free for the Go
        // one), its pods are then deleted by the garbage collector.
        let dp = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            preconditions: uid.map(|uid| Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(ds_name, &dp).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("deleting DaemonSet {}/{ds_name}", ctx.namespace));
            }
        }
        // Our agents must be gone before the Go builders start beside them.
        let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
        let sel = format!("{}={name}", labels::CLAIM);
        loop {
            let left = pods
                .list(&ListParams::default().labels(&sel))
                .await
                .with_context(|| format!("listing installer pods in {:?}", ctx.namespace))?
                .items
                .len();
            if left == 0 {
                break;
            }
            if started.elapsed() > opts.timeout {
                bail!(
                    "DaemonSet {}/{ds_name} deleted, but {left} installer pod(s) of policy {name:?} \
                     are still there after {}s (--timeout)",
                    ctx.namespace,
                    opts.timeout.as_secs()
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    for a in &plan.nodes {
        if let Some(patch) = a.patch() {
            match nodes
                .patch(&a.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e).with_context(|| format!("patching node {:?}", a.name)),
            }
        }
    }
    let res = HandbackResult {
        dry_run: false,
        namespace: &ctx.namespace,
        plan: &plan,
    };
    emit(ctx, &res, || {
        crate::handback::render(&plan, &ctx.namespace, true)
    })?;
    Ok(exit::OK)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    /// A log that cannot be read on a simulated node says why in plain words;
    /// elsewhere the API server's answer is passed on as it is.
    #[test]
    fn a_simulated_node_has_no_logs_and_says_so() {
        let mut n = Node {
            metadata: ObjectMeta {
                name: Some("kwok-1".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        assert!(!is_simulated(&n));
        n.metadata.annotations = Some(BTreeMap::from([(
            KWOK_NODE_ANNOTATION.to_string(),
            "fake".to_string(),
        )]));
        assert!(is_simulated(&n));
        let said = "Bad Request (400)";
        let sim = log_failure_text("ns", "p", "kwok-1", said, true);
        assert!(sim.contains("the node is simulated"), "{sim}");
        assert!(sim.contains("run no container"), "{sim}");
        assert!(
            sim.ends_with("(the API server said: Bad Request (400))"),
            "{sim}"
        );
        assert_eq!(
            log_failure_text("ns", "p", "n1", said, false),
            "pod ns/p on node n1: Bad Request (400)"
        );
    }
}
