//! The policy-rule kinds (issue 49 item 6): rules of the policy's spec that
//! must hold through controller kills, checked against what the API server
//! recorded (the nodes' persisted records), not against the controller's word.
//!
//! - `soak-kill`: `upgradePolicy.soakSeconds` set with the bump; the acting
//!   controller (the Lease holder, in the leader-election variant) is killed
//!   while a node soaks. No node starts its cycle within the soak of a node
//!   that finished before it.
//! - `window-close`: a maintenance window open at the bump is closed
//!   mid-rollout, then reopened. No cycle starts after the close.
//! - `refused-spec`: a new version with a window in an unknown time zone lands
//!   mid-rollout. While refused: no cycle starts, the installer DaemonSets keep
//!   their generation, no module becomes the refused version, and the cycles
//!   under way finish on the accepted one. Lifted, the rollout finishes.
//! - `promotion-wait` has a module of its own ([`crate::promotion`]) and uses
//!   the [`Timeline`].
//!
//! A [`Timeline`] watches the nodes for the whole trial; each kind's rule is
//! checked on it once the trial settled.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::ListParams;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use rand::Rng;
use rand::rngs::StdRng;
use ttdrv_api::{NodeState, TenstorrentDriverPolicy};
use ttdrv_testkit::TestEnv;

use crate::common::kmd;
use crate::controller::Controller;
use crate::fleet::test_nodes;
use crate::invariants::Invariants;
use crate::rollout::{retrying, set_spec};
use crate::trials::Kind;

/// The kinds whose rules are checked on a [`Timeline`].
pub(crate) const RULE_KINDS: [Kind; 4] = [
    Kind::SoakKill,
    Kind::WindowClose,
    Kind::RefusedSpec,
    Kind::PromotionWait,
];

/// The unknown time zone that makes the controller refuse the spec.
const BAD_ZONE: &str = "Europe/Berln";

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn in_cycle(s: NodeState) -> bool {
    matches!(
        s,
        NodeState::Cordoning | NodeState::Draining | NodeState::Upgrading | NodeState::Uncordoning
    )
}

/// What the [`Timeline`] saw happen to one node, in watch order.
#[derive(Clone, Debug)]
pub(crate) enum What {
    /// A cycle started: the record entered Cordoning (or a later in-cycle
    /// state, when the watch missed it) with this `started`.
    Start { target: String, started: i64 },
    /// The record became Done, with its `since` and reason.
    Done {
        target: String,
        since: i64,
        reason: Option<String>,
    },
    /// The module the agent reports loaded changed.
    Kmd { version: String },
}

#[derive(Clone, Debug)]
pub(crate) struct Seen {
    pub(crate) node: String,
    /// Unix seconds (this machine's clock, the controller's too) it was seen.
    pub(crate) at: f64,
    pub(crate) what: What,
}

/// Every cycle start, finish and module change of the policy's nodes, in
/// the order one watch saw them (a relist compares with the last state seen,
/// so nothing is reported twice).
pub(crate) struct Timeline {
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Timeline {
    pub(crate) fn spawn(env: &TestEnv, policy: &str) -> Self {
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let api: Api<Node> = Api::all(env.client.clone());
        let cfg = watcher::Config::default().labels(&env.selector());
        let (out, policy) = (seen.clone(), policy.to_string());
        let task = tokio::spawn(async move {
            // node -> (state, target, started, since, kmd)
            type Last = (NodeState, String, Option<i64>, i64, Option<String>);
            let mut last: BTreeMap<String, Last> = BTreeMap::new();
            let mut stream = watcher::watcher(api, cfg).default_backoff().boxed();
            while let Some(ev) = stream.next().await {
                let n = match ev {
                    Ok(Event::Apply(n)) | Ok(Event::InitApply(n)) => n,
                    _ => continue,
                };
                let name = n.metadata.name.clone().unwrap_or_default();
                let Some(r) = ttdrv_core::node::record(&n).ok().flatten() else {
                    continue;
                };
                if r.policy != policy {
                    continue;
                }
                let now = (r.state, r.target.clone(), r.started, r.since, kmd(&n));
                let prev = last.get(&name).cloned();
                let at = unix_now();
                let push = |what| {
                    out.lock().unwrap_or_else(|e| e.into_inner()).push(Seen {
                        node: name.clone(),
                        at,
                        what,
                    })
                };
                if in_cycle(r.state) {
                    let new_cycle = match &prev {
                        Some((s, t, st, _, _)) => {
                            !in_cycle(*s) || *t != r.target || *st != r.started
                        }
                        None => true,
                    };
                    if new_cycle {
                        push(What::Start {
                            target: r.target.clone(),
                            started: r.started.unwrap_or(r.since),
                        });
                    }
                }
                if r.state == NodeState::Done
                    && prev.as_ref().is_none_or(|(s, t, _, since, _)| {
                        *s != NodeState::Done || *t != r.target || *since != r.since
                    })
                {
                    push(What::Done {
                        target: r.target.clone(),
                        since: r.since,
                        reason: r.reason.clone(),
                    });
                }
                if let Some(k) = &now.4
                    && prev.as_ref().is_none_or(|p| p.4.as_ref() != Some(k))
                {
                    push(What::Kmd { version: k.clone() });
                }
                last.insert(name, now);
            }
        });
        Self { seen, task }
    }

    pub(crate) fn events(&self) -> Vec<Seen> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Drop for Timeline {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A rule kind's faults, drawn from the trial's seed (a stream of its own).
pub(crate) struct RuleFaults {
    /// `soak-kill`: the soak (s), leader election, and the kills' downtimes (ms).
    soak: i64,
    leader: bool,
    soak_kills: Vec<u64>,
    /// `window-close` / `refused-spec`: when it strikes (ms into the rollout),
    /// or as soon as some node is in this state.
    at: u64,
    when: Option<&'static str>,
    /// `window-close`: how long the window stays closed once nothing is in
    /// a cycle any more (ms).
    closed_extra: u64,
}

impl RuleFaults {
    pub(crate) fn draw(rng: &mut StdRng) -> Self {
        Self {
            soak: rng.random_range(3..=4),
            leader: rng.random_bool(0.5),
            soak_kills: (0..rng.random_range(1..=2))
                .map(|_| rng.random_range(0..1500))
                .collect(),
            // Early: with the simulated agent a rollout of the ten nodes
            // takes a few seconds.
            at: rng.random_range(200..2_000),
            when: rng.random_bool(0.6).then(|| {
                // Cordoning and Uncordoning are written with the next
                // state: their draws strike at that one.
                ["Draining", "Draining", "Upgrading", "Done", "Done"][rng.random_range(0..5)]
            }),
            closed_extra: rng.random_range(2_000..5_000),
        }
    }

    /// Two controllers with leader election for this trial.
    pub(crate) fn leader_elect(&self, kind: Kind) -> bool {
        kind == Kind::SoakKill && self.leader
    }

    /// What the version bump also sets (`spec.upgradePolicy`), if anything.
    pub(crate) fn bump(&self, kind: Kind) -> Option<serde_json::Value> {
        match kind {
            Kind::SoakKill => Some(serde_json::json!({ "soakSeconds": self.soak })),
            Kind::WindowClose => Some(serde_json::json!({ "maintenanceWindows": [window(true)] })),
            _ => None,
        }
    }
}

/// A maintenance window (UTC, every day) open now for an hour either way,
/// or one that opens in two hours.
fn window(open: bool) -> serde_json::Value {
    let minute = (unix_now() as i64 / 60).rem_euclid(1440);
    let hm = |m: i64| {
        let m = m.rem_euclid(1440);
        format!("{:02}:{:02}", m / 60, m % 60)
    };
    let (start, end) = if open {
        (hm(minute - 60), hm(minute + 60))
    } else {
        (hm(minute + 120), hm(minute + 180))
    };
    serde_json::json!({ "start": start, "end": end })
}

/// Waits (up to `limit`) for some node of the test to be in `state`; its name.
async fn node_in(env: &TestEnv, state: &str, limit: Duration) -> Option<String> {
    let napi: Api<Node> = Api::all(env.client.clone());
    let lp = ListParams::default().labels(&env.selector());
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if let Ok(l) = napi.list(&lp).await
            && let Some(n) = l.items.into_iter().find_map(|n| {
                (crate::invariants::record_state(&n).as_deref() == Some(state))
                    .then(|| n.metadata.name.unwrap_or_default())
            })
        {
            return Some(n);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// Waits (up to `limit`) until no node of the test is mid-cycle; Err names
/// those still in a cycle.
async fn cycles_over(env: &TestEnv, limit: Duration) -> Result<(), String> {
    let until = Instant::now() + limit;
    loop {
        let busy: Vec<String> = test_nodes(env)
            .await
            .into_iter()
            .filter_map(|n| {
                let r = ttdrv_core::node::record(&n).ok().flatten()?;
                let name = n.metadata.name.clone()?;
                in_cycle(r.state).then(|| format!("{name} {:?}", r.state))
            })
            .collect();
        if busy.is_empty() {
            return Ok(());
        }
        if Instant::now() > until {
            return Err(busy.join(", "));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The installer DaemonSets of the namespace and their generations.
async fn daemonsets(env: &TestEnv, ns: &str) -> BTreeMap<String, Option<i64>> {
    let api: Api<DaemonSet> = Api::namespaced(env.client.clone(), ns);
    let lp = ListParams::default();
    retrying("listing DaemonSets", || api.list(&lp))
        .await
        .items
        .into_iter()
        .map(|d| (d.metadata.name.unwrap_or_default(), d.metadata.generation))
        .collect()
}

/// The policy's condition `Degraded` says `PolicyRefused`.
async fn refused(env: &TestEnv, policy: &str) -> bool {
    let api: Api<TenstorrentDriverPolicy> = Api::all(env.client.clone());
    let Ok(p) = api.get(policy).await else {
        return false;
    };
    let v = serde_json::to_value(&p).unwrap_or_default();
    v["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Degraded" && c["status"] == "True" && c["reason"] == "PolicyRefused")
}

/// Cycle starts (of `target`, or any target if None) whose record says they
/// started at least a second after `t` (a start decided on the spec before
/// `t` and persisted just after is not one).
fn starts_after(ev: &[Seen], t: f64, target: Option<&str>) -> Vec<String> {
    ev.iter()
        .filter_map(|s| match &s.what {
            What::Start {
                target: tg,
                started,
            } if target.is_none_or(|t| t == tg) && *started as f64 >= t + 1.0 => Some(format!(
                "{} started a cycle to {tg} at {started} (seen at {:.1})",
                s.node, s.at
            )),
            _ => None,
        })
        .collect()
}

/// Waits for the fault's moment: `f.at` into the rollout, then (if drawn)
/// until some node is in `f.when`. What it waited for, as a prefix for the log.
async fn strike(env: &TestEnv, f: &RuleFaults) -> String {
    tokio::time::sleep(Duration::from_millis(f.at)).await;
    match f.when {
        Some(state) => match node_in(env, state, Duration::from_secs(6)).await {
            Some(n) => format!("as {n} was {state}: "),
            None => format!("(no node {state} within 6 s): "),
        },
        None => String::new(),
    }
}

/// What a rule trial did besides the kills, and the version it ends on.
pub(crate) struct Outcome {
    pub(crate) log: Vec<String>,
    pub(crate) final_version: Option<String>,
}

/// The kind's fault, while the rollout to `target` runs.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn faults(
    env: &TestEnv,
    ns: &str,
    policy: &str,
    ctl: &Arc<tokio::sync::Mutex<Controller>>,
    inv: &Invariants,
    tl: &Timeline,
    kind: Kind,
    index: usize,
    target: &str,
    f: &RuleFaults,
) -> Outcome {
    let t0 = Instant::now();
    let ms = |t0: Instant| t0.elapsed().as_millis();
    let mut log = vec![];
    let mut final_version = None;
    match kind {
        Kind::SoakKill => {
            log.push(format!(
                "soakSeconds {}{}",
                f.soak,
                if f.leader {
                    ", two controllers with leader election"
                } else {
                    ""
                }
            ));
            let napi: Api<Node> = Api::all(env.client.clone());
            let lp = ListParams::default().labels(&env.selector());
            let mut struck: Vec<String> = vec![];
            for down in &f.soak_kills {
                // A node of this rollout soaking (upgraded less than soak-1 s
                // ago), each kill in the soak of another node.
                let until = Instant::now() + Duration::from_secs(40);
                let mut hit = None;
                while hit.is_none() && Instant::now() < until {
                    let now = unix_now() as i64;
                    hit = napi.list(&lp).await.ok().and_then(|l| {
                        l.items.into_iter().find_map(|n| {
                            let r = ttdrv_core::node::record(&n).ok().flatten()?;
                            (r.state == NodeState::Done
                                && r.target == target
                                && r.reason.as_deref() == Some(ttdrv_core::reason::UPGRADED)
                                && now - r.since < f.soak - 1)
                                .then(|| n.metadata.name.unwrap_or_default())
                                .filter(|n| !struck.contains(n))
                        })
                    });
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                let at = ms(t0);
                let who = ctl.lock().await.kill_acting(env).await;
                tokio::time::sleep(Duration::from_millis(*down)).await;
                ctl.lock().await.restore(env);
                let as_ = match hit {
                    Some(n) => {
                        struck.push(n.clone());
                        format!("as {n} soaked")
                    }
                    None => "(no node soaking within 40 s)".into(),
                };
                log.push(match who {
                    Some(w) => format!("SIGKILL {w} at {at}ms {as_} (down {down}ms)"),
                    None => format!("no controller to SIGKILL at {at}ms {as_}"),
                });
            }
        }
        Kind::WindowClose => {
            let mut l = strike(env, f).await;
            set_spec(
                env,
                policy,
                serde_json::json!({ "upgradePolicy": { "maintenanceWindows": [window(false)] } }),
            )
            .await;
            let closed = unix_now();
            let pending = test_nodes(env)
                .await
                .iter()
                .filter(|n| kmd(n).as_deref() != Some(target))
                .count();
            l.push_str(&format!(
                "window closed at {}ms ({pending} node(s) not yet on {target})",
                ms(t0)
            ));
            log.push(l);
            if let Err(busy) = cycles_over(env, Duration::from_secs(60)).await {
                inv.violation(format!(
                    "window closed: the cycles under way did not end within 60 s: {busy}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(f.closed_extra)).await;
            for s in starts_after(&tl.events(), closed, None) {
                inv.violation(format!("window closed at {closed:.1}: {s}"));
            }
            set_spec(
                env,
                policy,
                serde_json::json!({ "upgradePolicy": { "maintenanceWindows": [window(true)] } }),
            )
            .await;
            log.push(format!("window reopened at {}ms", ms(t0)));
        }
        Kind::RefusedSpec => {
            let mut l = strike(env, f).await;
            let refused_version = format!("3.{index}.9");
            let ds_before = daemonsets(env, ns).await;
            set_spec(
                env,
                policy,
                serde_json::json!({
                    "version": refused_version,
                    "upgradePolicy": { "maintenanceWindows": [
                        { "start": "00:00", "end": "24:00", "timeZone": BAD_ZONE }
                    ] }
                }),
            )
            .await;
            let at = unix_now();
            let states: BTreeMap<String, String> = test_nodes(env)
                .await
                .iter()
                .map(|n| {
                    (
                        n.metadata.name.clone().unwrap_or_default(),
                        crate::invariants::record_state(n).unwrap_or_default(),
                    )
                })
                .collect();
            let mut by_state: BTreeMap<&str, usize> = BTreeMap::new();
            for s in states.values() {
                *by_state.entry(s.as_str()).or_default() += 1;
            }
            l.push_str(&format!(
                "{refused_version} with a window in {BAD_ZONE} applied at {}ms (nodes then: {by_state:?})",
                ms(t0)
            ));
            log.push(l);
            let seen_refused = ttdrv_testkit::wait_for_result(
                "the policy refused",
                Duration::from_secs(15),
                || async {
                    if refused(env, policy).await {
                        Ok(())
                    } else {
                        Err("no Degraded=True PolicyRefused".to_string())
                    }
                },
            )
            .await;
            if let Err(e) = seen_refused {
                inv.violation(format!("the spec with {BAD_ZONE} was not refused: {e}"));
            }
            if let Err(busy) = cycles_over(env, Duration::from_secs(30)).await {
                inv.violation(format!(
                    "spec refused: the cycles under way did not finish within 30 s: {busy}"
                ));
            }
            // A moment more, for a start that should not come.
            tokio::time::sleep(Duration::from_secs(2)).await;
            let ev = tl.events();
            for s in starts_after(&ev, at, None) {
                inv.violation(format!("spec refused at {at:.1}: {s}"));
            }
            for s in &ev {
                if let What::Kmd { version } = &s.what
                    && *version == refused_version
                {
                    inv.violation(format!(
                        "spec refused: {} loaded the refused version {version} (seen at {:.1})",
                        s.node, s.at
                    ));
                }
            }
            // The cycles under way at the refusal ended on the accepted version.
            for n in test_nodes(env).await {
                let name = n.metadata.name.clone().unwrap_or_default();
                let was = states.get(&name).map(String::as_str).unwrap_or("");
                let mid = ["Cordoning", "Draining", "Upgrading", "Uncordoning"].contains(&was);
                if mid && kmd(&n).as_deref() != Some(target) {
                    inv.violation(format!(
                        "spec refused while {name} was {was}: it runs {:?}, not the accepted {target}",
                        kmd(&n)
                    ));
                }
            }
            let ds_after = daemonsets(env, ns).await;
            if ds_after != ds_before {
                inv.violation(format!(
                    "spec refused: the installer DaemonSets changed (name -> generation): {ds_before:?} -> {ds_after:?}"
                ));
            }
            set_spec(
                env,
                policy,
                serde_json::json!({ "upgradePolicy": { "maintenanceWindows": null } }),
            )
            .await;
            log.push(format!("refusal lifted (windows removed) at {}ms", ms(t0)));
            final_version = Some(refused_version);
        }
        _ => {}
    }
    Outcome { log, final_version }
}

/// Once the trial settled: the kind's rule over the whole rollout, and the
/// spec put back as the other kinds expect it (no soak, no windows).
pub(crate) async fn finish(
    env: &TestEnv,
    policy: &str,
    inv: &Invariants,
    tl: &Timeline,
    kind: Kind,
    target: &str,
    f: &RuleFaults,
) -> Vec<String> {
    let mut log = vec![];
    let ev = tl.events();
    if kind == Kind::SoakKill {
        // Each start of this rollout against the node upgraded last before
        // it (in watch order, so a start under way before a finish in the
        // same second is not counted against it).
        let mut checked = 0;
        let mut last: Option<(&str, i64)> = None;
        for s in &ev {
            match &s.what {
                What::Done {
                    target: t,
                    since,
                    reason,
                } if t == target
                    && reason.as_deref() == Some(ttdrv_core::reason::UPGRADED)
                    && last.is_none_or(|(_, l)| *since >= l) =>
                {
                    last = Some((&s.node, *since));
                }
                What::Start { target: t, started } if t == target => {
                    let Some((done, since)) = last else { continue };
                    if done == s.node || *started < since {
                        continue;
                    }
                    checked += 1;
                    if *started < since + f.soak {
                        inv.violation(format!(
                            "soak skipped: {} started its cycle at {started}, {}s after {done} was upgraded at {since} (soakSeconds {})",
                            s.node,
                            started - since,
                            f.soak
                        ));
                    }
                }
                _ => {}
            }
        }
        log.push(format!("{checked} start(s) checked against the last soak"));
    }
    // Back to the spec the other kinds run with.
    set_spec(
        env,
        policy,
        serde_json::json!({ "upgradePolicy": { "soakSeconds": 0, "maintenanceWindows": null } }),
    )
    .await;
    log
}
