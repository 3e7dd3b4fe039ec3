//! Chaos test: rollouts on 10 simulated nodes while the controller is SIGKILLed
//! at random moments, the kube-apiserver is restarted, a node is deleted while
//! Draining, a node is added, the target version changes mid-rollout,
//! `spec.paused` is toggled, nodes go NotReady (one, or the whole fleet),
//! installer pods are deleted and nodes are moved out of the policy and back,
//! and the spec's rules (soak, maintenance window, refused spec, canary
//! promotion) are held through kills — with an independent watcher checking
//! the invariants throughout. See
//! docs/reliability.md.
//!
//! Needs its own cluster (it restarts the API server): run by `hack/chaos.sh`,
//! never by the default `cargo test`.
//!
//! Environment:
//! - `CHAOS_TRIALS` (default two per kind): trials (one rollout each) in this run;
//! - `CHAOS_RUN_SEED`: seed of the run (derives each trial's seed); default: the clock;
//! - `CHAOS_SEED` (+ `CHAOS_KIND`): replay one trial with this seed (and kind);
//! - `CHAOS_KIND` without `CHAOS_SEED`: the run cycles through these kinds only
//!   (comma-separated names, e.g. `relabel` or `not-ready-flap,fleet-not-ready`);
//! - `CHAOS_CLUSTER` (default `ttdrv-chaos`): the only cluster whose API server
//!   this test may restart (checked against KUBECONFIG's directory).
//!
//! The tests are in this file (so their names stay `chaos_rollouts`, …); their
//! parts are in modules: `trials` (one trial and its faults), `invariants` (what
//! is checked), `proxy`, `apiserver` and `controller` (the faults' machinery),
//! `fleet` (set-up), `rollout` (driving the policy, waiting for it to settle),
//! `firmware`, `rules` and `promotion` (kinds with faults and rules of their own).

#[path = "../common/mod.rs"]
mod common;

mod apiserver;
mod controller;
mod faults;
mod firmware;
mod fleet;
mod invariants;
mod promotion;
mod proxy;
mod rollout;
mod rules;
mod trials;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use ttdrv_api::labels;
use ttdrv_testkit::{SimAgent, SimAgentConfig};

use apiserver::{
    Component, chaos_cluster_dir, refresh_control_plane, restart_apiserver,
    spawn_component_supervisor,
};
use controller::Controller;
use fleet::{chaos_env, deployment, install_fleet, ready_tt_nodes};
use invariants::{Invariants, Shared, spawn_invariant_watchers};
use proxy::{ProxyFaults, Trap, WriteFate, spawn_proxy};
use rollout::{set_spec, wait_settled};
use trials::{KINDS, Kind, trial};

const NODES: usize = 10;
pub(crate) const MAX_UNAVAILABLE: usize = 2;
pub(crate) const GATE: &str = labels::DEFAULT_DEPLOY_GATE;
/// A node labelled `OUT_LABEL=OUT_VALUE` is outside the policy's `nodeAffinity`
/// (the `relabel` trials move nodes out of the selector with it).
pub(crate) const OUT_LABEL: &str = "sim.ttdrv.io/pool";
pub(crate) const OUT_VALUE: &str = "out";
/// How long a trial may take to settle after its last fault.
pub(crate) const SETTLE: Duration = Duration::from_secs(240);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by hack/chaos.sh"]
async fn chaos_rollouts() {
    let run_start = Instant::now();
    let replay: Option<u64> = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok());
    // CHAOS_KIND: the kind of a replayed trial, or the kinds a run cycles through.
    let kinds: Vec<Kind> = match std::env::var("CHAOS_KIND") {
        Ok(list) if !list.trim().is_empty() => list
            .split(',')
            .map(|k| {
                Kind::parse(k.trim()).unwrap_or_else(|| {
                    panic!(
                        "CHAOS_KIND: unknown kind {k:?}; kinds: {}",
                        KINDS.map(Kind::name).join(", ")
                    )
                })
            })
            .collect(),
        _ => KINDS.to_vec(),
    };
    let trials: usize = std::env::var("CHAOS_TRIALS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2 * KINDS.len());
    let run_seed: u64 = std::env::var("CHAOS_RUN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    let plan: Vec<(Kind, u64)> = match replay {
        Some(seed) => vec![(kinds[0], seed)],
        None => {
            let mut r = StdRng::seed_from_u64(run_seed);
            (0..trials)
                .map(|i| (kinds[i % kinds.len()], r.random::<u64>() >> 1))
                .collect()
        }
    };
    let kind_env = if kinds == KINDS {
        String::new()
    } else {
        format!(
            "CHAOS_KIND={} ",
            kinds.iter().map(|k| k.name()).collect::<Vec<_>>().join(",")
        )
    };
    eprintln!(
        "chaos: {} trial(s), run seed {run_seed} (replay the run: CHAOS_RUN_SEED={run_seed} CHAOS_TRIALS={trials} {kind_env}bash hack/chaos.sh chaos_rollouts)",
        plan.len()
    );
    // The control plane, recorded so it can be restarted (only on the chaos cluster).
    let control_plane_restarts: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut supervisor = None;
    let mut api = None;
    if plan.iter().any(|(k, _)| *k == Kind::ApiserverRestart) {
        let dir = chaos_cluster_dir()
            .unwrap_or_else(|e| panic!("{e}; run this test through hack/chaos.sh"));
        let record = |name| Component::record(&dir, name).unwrap_or_else(|e| panic!("{e}"));
        api = Some(record("kube-apiserver"));
        let others = vec![
            record("kube-controller-manager"),
            record("kube-scheduler"),
            record("kwok-controller"),
        ];
        supervisor = Some(spawn_component_supervisor(
            others,
            control_plane_restarts.clone(),
        ));
    }

    // The test itself talks to the API server directly; the controllers go
    // through the fault-injecting proxy when hack/chaos.sh set one up.
    let env = chaos_env("chaos", run_seed).await;
    let p409: f64 = std::env::var("CHAOS_P409")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0.05);
    let p429: f64 = std::env::var("CHAOS_P429")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0.03);
    let proxy = match std::env::var("CHAOS_PROXY_PORT")
        .ok()
        .and_then(|p| p.parse::<u16>().ok())
    {
        Some(port) => {
            eprintln!(
                "chaos: controllers reach the API server through a proxy on 127.0.0.1:{port} injecting 409 on {:.0}% of writes and 429 on {:.0}% of requests",
                p409 * 100.0,
                p429 * 100.0
            );
            Some(
                spawn_proxy(
                    env.client.clone(),
                    port,
                    ProxyFaults {
                        seed: run_seed,
                        p409,
                        p429,
                        ..Default::default()
                    },
                )
                .await,
            )
        }
        None => {
            eprintln!("chaos: no CHAOS_PROXY_PORT: controllers talk to the API server directly");
            None
        }
    };
    let ns = env.namespace().await;
    let _agent = SimAgent::spawn(
        env.client.clone(),
        SimAgentConfig {
            namespace: ns.clone(),
            work: Duration::from_millis(300),
            ..Default::default()
        },
    );
    let policy = env.name("fleet");
    let inv = Invariants {
        shared: Arc::new(Mutex::new(Shared::default())),
        client: env.client.clone(),
        ns: ns.clone(),
        policy: policy.clone(),
    };
    let mut nodes = vec![];
    for i in 0..NODES {
        let n = env.tt_node(&format!("n{i}"), &[]).await;
        nodes.push(n.metadata.name.unwrap_or_default());
    }
    // The administrator cordoned one node before anything started.
    let admin_node = nodes[NODES - 1].clone();
    env.set_unschedulable(&admin_node, true).await;
    inv.lock().admin.insert(admin_node.clone());
    for n in &nodes {
        env.wait_node_ready(n).await;
    }
    // Device users to drain, and that move around as nodes are cordoned.
    let dapi: Api<Deployment> = Api::namespaced(env.client.clone(), &ns);
    dapi.create(
        &PostParams::default(),
        &deployment(&ns, "train", 4, true, None),
    )
    .await
    .unwrap_or_else(|e| panic!("creating the workload: {e}"));

    let watchers = spawn_invariant_watchers(&env, &ns, inv.clone());
    let ctl = Arc::new(tokio::sync::Mutex::new(Controller::new(&env, &ns)));
    ctl.lock().await.restore(&env);
    create_policy(
        &env,
        &policy,
        &format!(
            "version: \"2.7.0\"\nnodeAffinity: {{matchLabels: {{ttdrv-test: {}}}, matchExpressions: [{{key: \"{OUT_LABEL}\", operator: NotIn, values: [\"{OUT_VALUE}\"]}}]}}\nupgradePolicy: {{maxUnavailable: {MAX_UNAVAILABLE}}}",
            env.id
        ),
    )
    .await;
    if let Err(e) = wait_settled(&env, &policy, "2.7.0", SETTLE).await {
        panic!("initial install did not settle: {e}");
    }
    eprintln!(
        "chaos: initial install of 2.7.0 on {NODES} nodes settled ({admin_node} admin-cordoned)"
    );

    let mut version = "2.7.0".to_string();
    let mut results = vec![];
    for (i, (kind, seed)) in plan.iter().enumerate() {
        let r = trial(
            &env,
            &ns,
            &policy,
            &ctl,
            &inv,
            api.as_ref(),
            i + 1,
            *kind,
            *seed,
            &mut version,
        )
        .await;
        eprintln!(
            "--- trial {} kind={} seed={} kills={} max_unschedulable(ours/total)={}/{} max_ready_cordoned_by_us={} swaps_checked={} violations={} {} in {:.1}s; faults: {}",
            r.index,
            r.kind.name(),
            r.seed,
            r.kills,
            r.max_ours,
            r.max_total,
            r.max_ready_ours,
            r.swaps,
            r.violations,
            if r.ok { "OK" } else { "FAILED" },
            r.duration.as_secs_f64(),
            r.faults.join("; ")
        );
        let settled = r.settled;
        results.push(r);
        if !settled {
            // The fleet is stuck; later trials would only time out one by one.
            eprintln!("chaos: trial did not settle; stopping the run here");
            break;
        }
    }

    for w in watchers {
        w.abort();
    }
    if let Some(s) = supervisor {
        s.abort();
    }
    if let Some((_, task)) = &proxy {
        task.abort();
    }
    let proxy_line = match &proxy {
        Some((st, _)) => format!(
            "proxy: forwarded {}, injected 409 {} ({} on node patches), injected 429 {} ({} on watches), upstream unreachable {}",
            st.forwarded.load(Ordering::Relaxed),
            st.conflicts.load(Ordering::Relaxed),
            st.node_patch_conflicts.load(Ordering::Relaxed),
            st.throttled.load(Ordering::Relaxed),
            st.watch_throttled.load(Ordering::Relaxed),
            st.upstream_errors.load(Ordering::Relaxed)
        ),
        None => "proxy: none".to_string(),
    };
    let cp_restarts = control_plane_restarts
        .lock()
        .map(|v| v.clone())
        .unwrap_or_default();
    let (violations, node_events, pod_events, watch_restarts) = {
        let s = inv.lock();
        (
            s.violations.clone(),
            s.node_events,
            s.pod_events,
            s.watch_restarts,
        )
    };
    let (starts, kills, logs) = {
        let c = ctl.lock().await;
        (c.starts, c.kills, c.logs.clone())
    };
    // Evidence that conflicts/throttling/transient errors were retried, and that
    // watches restarted: what the controller logged.
    let mut retried = 0usize;
    let mut watch_errors = 0usize;
    for l in &logs {
        let text = std::fs::read_to_string(l).unwrap_or_default();
        retried += text.matches("will retry").count();
        watch_errors += text.matches("watch error; restarting with backoff").count();
    }
    eprintln!("\n===== chaos summary =====");
    eprintln!(
        "run seed {run_seed}; {} trial(s) in {:.0}s",
        results.len(),
        run_start.elapsed().as_secs_f64()
    );
    eprintln!(
        "{:<6} {:<22} {:<20} {:>5} {:>9} {:>10} {:>11} {:>6} {:>7} {:>8}",
        "trial",
        "kind",
        "seed",
        "kills",
        "max ours",
        "max total",
        "max rdy/us",
        "swaps",
        "secs",
        "result"
    );
    for r in &results {
        eprintln!(
            "{:<6} {:<22} {:<20} {:>5} {:>9} {:>10} {:>11} {:>6} {:>7.1} {:>8}",
            r.index,
            r.kind.name(),
            r.seed,
            r.kills,
            r.max_ours,
            r.max_total,
            r.max_ready_ours,
            r.swaps,
            r.duration.as_secs_f64(),
            if r.ok { "ok" } else { "FAILED" }
        );
    }
    eprintln!(
        "controller processes started {starts}, SIGKILLed {kills}; node events checked {node_events}, installer-pod events checked {pod_events}; invariant-watcher watch restarts {watch_restarts}"
    );
    eprintln!("controller log lines: 'will retry' {retried}, watch restarts {watch_errors}");
    eprintln!("{proxy_line}");
    eprintln!(
        "control-plane components restarted after API-server outages: {} ({:?})",
        cp_restarts.len(),
        cp_restarts
    );
    eprintln!("invariant violations: {}", violations.len());
    for v in &violations {
        eprintln!("  {v}");
    }
    eprintln!(
        "controller logs: {}",
        logs.iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" ")
    );
    if let Ok(path) = std::env::var("CHAOS_SUMMARY") {
        let lines: Vec<String> = results
            .iter()
            .map(|r| {
                format!(
                    "trial={} kind={} seed={} kills={} max_ours={} max_total={} max_ready_cordoned_by_us={} swaps_checked={} violations={} ok={} secs={:.1}",
                    r.index,
                    r.kind.name(),
                    r.seed,
                    r.kills,
                    r.max_ours,
                    r.max_total,
                    r.max_ready_ours,
                    r.swaps,
                    r.violations,
                    r.ok,
                    r.duration.as_secs_f64()
                )
            })
            .chain([format!(
                "total trials={} kills={kills} violations={} controller_retries_logged={retried} controller_watch_restarts={watch_errors} control_plane_restarts={} {proxy_line}",
                results.len(),
                violations.len(),
                cp_restarts.len()
            )])
            .collect();
        let _ = std::fs::write(path, lines.join("\n") + "\n");
    }

    ctl.lock().await.kill_all();
    delete_policies(&env).await;
    let _ = dapi.delete("train", &DeleteParams::default()).await;
    env.cleanup().await;
    assert!(
        violations.is_empty(),
        "{} invariant violation(s):\n{}",
        violations.len(),
        violations.join("\n")
    );
}

/// Reproduction of a drain that is skipped when the policy's status write fails
/// (found by `chaos_rollouts`, trial 14 of run seed 1796042687684544580): a
/// rollout over 6 nodes, each running a bare device user (drain.force), while
/// the proxy answers 70% of the controller's policy-status writes with 409. No
/// controller kills, no other faults. Every node must be drained before its
/// module is swapped; the invariant watcher reports any node that reaches
/// Upgrading while its device user still runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by hack/chaos.sh"]
async fn status_write_conflicts_do_not_skip_drains() {
    let Some(port) = std::env::var("CHAOS_PROXY_PORT")
        .ok()
        .and_then(|p| p.parse::<u16>().ok())
    else {
        panic!("needs the fault-injecting proxy: run through hack/chaos.sh");
    };
    let seed: u64 = std::env::var("CHAOS_RUN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(12);
    let env = chaos_env("stconf", seed).await;
    let ns = env.namespace().await;
    let _agent = SimAgent::spawn(
        env.client.clone(),
        SimAgentConfig {
            namespace: ns.clone(),
            work: Duration::from_millis(300),
            ..Default::default()
        },
    );
    let status_p409: Arc<Mutex<f64>> = Arc::default();
    let (stats, proxy_task) = spawn_proxy(
        env.client.clone(),
        port,
        ProxyFaults {
            seed,
            status_p409: status_p409.clone(),
            ..Default::default()
        },
    )
    .await;
    let inv = Invariants {
        shared: Arc::new(Mutex::new(Shared::default())),
        client: env.client.clone(),
        ns: ns.clone(),
        policy: env.name("fleet"),
    };
    inv.lock().replay = format!("CHAOS_RUN_SEED={seed} bash hack/chaos.sh status_write_conflicts");
    let nodes = ready_tt_nodes(&env, 6).await;
    let watchers = spawn_invariant_watchers(&env, &ns, inv.clone());
    let (mut ctl, policy) =
        install_fleet(&env, &ns, "{maxUnavailable: 1, drain: {force: true}}").await;
    // One bare device user per node (evicted for good by a drain with force).
    let papi: Api<Pod> = Api::namespaced(env.client.clone(), &ns);
    for n in &nodes {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": { "name": format!("job-{n}"), "namespace": ns, "labels": { "app": "train" } },
            "spec": {
                "nodeName": n,
                "terminationGracePeriodSeconds": 0,
                "containers": [{ "name": "main", "image": "example.invalid/job:1",
                    "volumeMounts": [{ "name": "dev", "mountPath": labels::DEVICE_DIR }] }],
                "volumes": [{ "name": "dev", "hostPath": { "path": labels::DEVICE_DIR } }],
            }
        }))
        .expect("pod");
        papi.create(&PostParams::default(), &pod)
            .await
            .unwrap_or_else(|e| panic!("creating job on {n}: {e}"));
    }
    ttdrv_testkit::wait_for("device users running", Duration::from_secs(60), || async {
        let l = papi
            .list(&ListParams::default().labels("app=train"))
            .await
            .map_err(|e| e.to_string())?;
        let ready = l
            .items
            .iter()
            .filter(|p| ttdrv_testkit::pod_ready(p))
            .count();
        if ready == nodes.len() {
            Ok(())
        } else {
            Err(format!("{ready} ready"))
        }
    })
    .await;
    // Let the device users be "old" (scheduled well before any cycle starts).
    tokio::time::sleep(Duration::from_secs(3)).await;
    *status_p409.lock().unwrap_or_else(|e| e.into_inner()) = 0.7;
    set_spec(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    let outcome = wait_settled(&env, &policy, "2.8.0", Duration::from_secs(120)).await;
    *status_p409.lock().unwrap_or_else(|e| e.into_inner()) = 0.0;
    for w in watchers {
        w.abort();
    }
    proxy_task.abort();
    inv.settle().await;
    let violations = inv.lock().violations.clone();
    let conflicts = stats.status_conflicts.load(Ordering::Relaxed);
    eprintln!(
        "status-conflict test: {conflicts} status writes answered 409; outcome {outcome:?}; {} violation(s); controller log {}",
        violations.len(),
        ctl.logs
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" ")
    );
    ctl.kill_all();
    delete_policies(&env).await;
    env.cleanup().await;
    assert!(
        violations.is_empty() && outcome.is_ok(),
        "drains must survive failed status writes; outcome {outcome:?}; violations:\n{}",
        violations.join("\n")
    );
}

/// Events the API server refuses with 429 are retried, not lost: the proxy
/// throttles the first event writes of a rollout, and every node's
/// NodeUpgraded Event still appears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by hack/chaos.sh"]
async fn throttled_events_are_retried() {
    let Some(port) = std::env::var("CHAOS_PROXY_PORT")
        .ok()
        .and_then(|p| p.parse::<u16>().ok())
    else {
        panic!("needs the fault-injecting proxy: run through hack/chaos.sh");
    };
    let env = chaos_env("evthr", 7).await;
    let ns = env.namespace().await;
    let _agent = SimAgent::spawn(
        env.client.clone(),
        SimAgentConfig {
            namespace: ns.clone(),
            work: Duration::from_millis(200),
            ..Default::default()
        },
    );
    let throttle = Arc::new(AtomicUsize::new(0));
    let (stats, proxy_task) = spawn_proxy(
        env.client.clone(),
        port,
        ProxyFaults {
            seed: 7,
            throttle_events: throttle.clone(),
            ..Default::default()
        },
    )
    .await;
    let nodes = ready_tt_nodes(&env, 2).await;
    let (mut ctl, policy) = install_fleet(&env, &ns, "{maxUnavailable: 1}").await;
    // Four refusals: more than the first node's two Events, fewer than the
    // attempts the controller's backoff makes for any one of them.
    throttle.store(4, Ordering::SeqCst);
    set_spec(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    let outcome = wait_settled(&env, &policy, "2.8.0", Duration::from_secs(120)).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let (missing, seen) = loop {
        let seen = policy_events(&env, &policy).await;
        let missing: Vec<String> = nodes
            .iter()
            .filter(|n| {
                !seen.iter().any(|(reason, note)| {
                    reason == "NodeUpgraded"
                        && note.contains(&format!("node {n}:"))
                        && note.contains("2.8.0")
                })
            })
            .cloned()
            .collect();
        if missing.is_empty() || Instant::now() > deadline {
            break (missing, seen);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let throttled = stats.event_throttled.load(Ordering::Relaxed);
    eprintln!(
        "throttled-events test: {throttled} event writes answered 429; outcome {outcome:?}; controller log {}",
        ctl.logs
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" ")
    );
    proxy_task.abort();
    ctl.kill_all();
    delete_policies(&env).await;
    env.cleanup().await;
    assert!(outcome.is_ok(), "rollout did not settle: {outcome:?}");
    assert_eq!(
        throttled, 4,
        "the proxy throttled the first four event writes"
    );
    assert!(
        missing.is_empty(),
        "NodeUpgraded Events lost to throttling for {missing:?}; the policy's Events: {seen:?}"
    );
}

/// The API server restarts in the middle of the writes a swap hangs on
/// (issue 35, fault 6): the controller's write of a node's go-ahead, and the
/// agent's write of its labels after the load. The proxy holds the chosen
/// write while the test SIGKILLs and restarts kube-apiserver, then answers
/// 503: once for a write that was applied (its answer lost), once for one
/// that was not. Two rollouts of three nodes (maxUnavailable 1), each with
/// both writes trapped, the fates swapped between them. The invariant
/// watcher checks every swap against the go-ahead on the node as it was
/// then, the cordon budget and the drains; this test checks that no node
/// got a second go-ahead in a rollout (one cycle each), and that every node
/// ends Done on the target, uncordoned, its gates open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by hack/chaos.sh"]
async fn apiserver_restarts_during_the_go_ahead_and_label_writes() {
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::Node;
    use kube::runtime::{WatchStreamExt, watcher};
    use std::collections::{BTreeMap, BTreeSet};

    let Some(port) = std::env::var("CHAOS_PROXY_PORT")
        .ok()
        .and_then(|p| p.parse::<u16>().ok())
    else {
        panic!("needs the fault-injecting proxy: run through hack/chaos.sh");
    };
    let dir =
        chaos_cluster_dir().unwrap_or_else(|e| panic!("{e}; run this test through hack/chaos.sh"));
    let record = |name| Component::record(&dir, name).unwrap_or_else(|e| panic!("{e}"));
    let api = record("kube-apiserver");
    let restarts: Arc<Mutex<Vec<String>>> = Arc::default();
    let supervisor = spawn_component_supervisor(
        vec![
            record("kube-controller-manager"),
            record("kube-scheduler"),
            record("kwok-controller"),
        ],
        restarts.clone(),
    );
    let env = chaos_env("apiwr", 35).await;
    let ns = env.namespace().await;
    let trap: proxy::WriteTrap = Arc::default();
    let inv = Invariants {
        shared: Arc::new(Mutex::new(Shared::default())),
        client: env.client.clone(),
        ns: ns.clone(),
        policy: env.name("fleet"),
    };
    inv.lock().replay = "bash hack/chaos.sh apiserver_restarts_during".into();
    // Every module swap the agent reports is checked against the go-ahead
    // on the node as it was just before its label write: the invariant
    // watcher checks only those it sees within one watch, and a swap made
    // across a restart falls between two.
    let swap_writes = Arc::new(AtomicUsize::new(0));
    let check = {
        let (inv, swap_writes) = (inv.clone(), swap_writes.clone());
        proxy::NodeWriteCheck {
            when_body_has: format!("\"{}\":\"", labels::KMD_VERSION),
            check: Box::new(move |before, body| {
                let to = serde_json::from_str::<serde_json::Value>(body)
                    .ok()
                    .and_then(|v| {
                        v["metadata"]["labels"][labels::KMD_VERSION]
                            .as_str()
                            .map(str::to_string)
                    });
                let from = before
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(labels::KMD_VERSION).cloned());
                if let (Some(from), Some(to)) = (from, to)
                    && from != to
                {
                    swap_writes.fetch_add(1, Ordering::Relaxed);
                    inv.check_swap(
                        before,
                        &from,
                        &to,
                        "(proxy, before the agent's label write)",
                    );
                }
            }),
        }
    };
    let (_stats, proxy_task) = spawn_proxy(
        env.client.clone(),
        port,
        ProxyFaults {
            seed: 35,
            trap: trap.clone(),
            node_write_check: Some(Arc::new(check)),
            ..Default::default()
        },
    )
    .await;
    // The agent writes its labels through the proxy too (this process's
    // KUBECONFIG is the proxy's, as the controller's).
    let proxied = kube::Client::try_default()
        .await
        .unwrap_or_else(|e| panic!("a client through the proxy: {e}"));
    let _agent = SimAgent::spawn(
        proxied,
        SimAgentConfig {
            namespace: ns.clone(),
            work: Duration::from_millis(300),
            ..Default::default()
        },
    );
    let nodes = ready_tt_nodes(&env, 3).await;
    let watchers = spawn_invariant_watchers(&env, &ns, inv.clone());
    let (mut ctl, policy) = install_fleet(&env, &ns, "{maxUnavailable: 1}").await;

    // Every go-ahead value each node carried, per rollout (the target).
    // (target, node) -> the go-ahead values seen.
    type Seen = BTreeMap<(String, String), BTreeSet<String>>;
    let go_aheads: Arc<Mutex<Seen>> = Arc::default();
    let target_now: Arc<Mutex<String>> = Arc::new(Mutex::new("2.7.0".into()));
    let seen_task = {
        let (go_aheads, target_now) = (go_aheads.clone(), target_now.clone());
        let napi: Api<Node> = Api::all(env.client.clone());
        let wc = watcher::Config::default().labels(&format!("ttdrv-test={}", env.id));
        tokio::spawn(async move {
            let mut s = watcher(napi, wc)
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(ev) = s.next().await {
                let Ok(n) = ev else { continue };
                let name = n.metadata.name.clone().unwrap_or_default();
                let ann = n.metadata.annotations.clone().unwrap_or_default();
                if let Some(g) = ann.get(labels::GO_AHEAD) {
                    let t = target_now.lock().unwrap_or_else(|e| e.into_inner()).clone();
                    go_aheads
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .entry((t, name))
                        .or_default()
                        .insert(g.clone());
                }
            }
        })
    };

    let go_ahead_write = |m: &axum::http::Method, path: &str, body: &str| {
        m == axum::http::Method::PATCH
            && path.starts_with("/api/v1/nodes/")
            && body.contains(&format!("\"{}\":\"", labels::GO_AHEAD))
    };
    let mut faults = vec![];
    let mut outcomes = vec![];
    for (target, go_fate, label_fate) in [
        ("2.8.0", WriteFate::Landed, WriteFate::Lost),
        ("2.9.0", WriteFate::Lost, WriteFate::Landed),
    ] {
        let label_write = move |m: &axum::http::Method, path: &str, body: &str| {
            m == axum::http::Method::PATCH
                && path.starts_with("/api/v1/nodes/")
                && body.contains(&format!("\"{}\":\"{target}\"", labels::KMD_VERSION))
        };
        let mut armed = vec![];
        for (what, fate, m) in [
            (
                "the controller's go-ahead write",
                go_fate,
                Box::new(go_ahead_write) as proxy::WriteMatcher,
            ),
            ("the agent's label write", label_fate, Box::new(label_write)),
        ] {
            let (fired_tx, fired) = tokio::sync::oneshot::channel();
            let (resume, resume_rx) = tokio::sync::oneshot::channel();
            trap.lock().unwrap_or_else(|e| e.into_inner()).push(Trap {
                what: format!("{what} ({target})"),
                matches: m,
                fate,
                fired: fired_tx,
                resume: resume_rx,
            });
            armed.push((what, fate, fired, resume));
        }
        *target_now.lock().unwrap_or_else(|e| e.into_inner()) = target.to_string();
        let start = Instant::now();
        set_spec(&env, &policy, serde_json::json!({ "version": target })).await;
        for (what, fate, fired, resume) in armed {
            let caught = match tokio::time::timeout(Duration::from_secs(120), fired).await {
                Ok(Ok(req)) => req,
                _ => {
                    inv.violation(format!("{what} to {target} was never seen by the proxy"));
                    continue;
                }
            };
            let node = caught
                .split_whitespace()
                .nth(1)
                .and_then(|p| p.strip_prefix("/api/v1/nodes/"))
                .unwrap_or("?")
                .to_string();
            match restart_apiserver(&env, &api, true, Duration::from_secs(2)).await {
                Ok(took) => faults.push(format!(
                    "{target}: kube-apiserver SIGKILLed during {what} on {node} ({fate:?}), back after {} ms",
                    took.as_millis()
                )),
                Err(e) => inv.violation(format!("could not restart the API server: {e}")),
            }
            let _ = resume.send(());
            // Counted in `restarts` (the supervisor starts them again).
            for note in refresh_control_plane(&api).await {
                eprintln!("  control plane: {note}");
            }
        }
        let outcome = wait_settled(&env, &policy, target, SETTLE).await;
        outcomes.push(format!(
            "{target}: {outcome:?} ({:.1} s)",
            start.elapsed().as_secs_f64()
        ));
        if let Err(e) = outcome {
            inv.violation(format!("the rollout to {target} did not settle: {e}"));
            break;
        }
        let napi: Api<Node> = Api::all(env.client.clone());
        let all = napi
            .list(&ListParams::default().labels(&format!("ttdrv-test={}", env.id)))
            .await
            .unwrap_or_else(|e| panic!("listing nodes: {e}"))
            .items;
        if all.len() != nodes.len() {
            inv.violation(format!(
                "{} nodes of the test, {} listed",
                nodes.len(),
                all.len()
            ));
        }
        let p: Api<ttdrv_api::TenstorrentDriverPolicy> = Api::all(env.client.clone());
        let pol = p
            .get(&policy)
            .await
            .unwrap_or_else(|e| panic!("reading {policy}: {e}"));
        invariants::final_checks(&all, &BTreeSet::new(), target, &inv, &pol, true);
    }
    seen_task.abort();
    for w in watchers {
        w.abort();
    }
    supervisor.abort();
    proxy_task.abort();
    inv.settle().await;
    for ((target, node), values) in go_aheads.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        if target != "2.7.0" && values.len() != 1 {
            inv.violation(format!(
                "{node} carried {} go-aheads in the rollout to {target}: {values:?}",
                values.len()
            ));
        }
    }
    let (violations, swaps, max_ours) = {
        let s = inv.lock();
        (s.violations.clone(), s.swaps, s.max_ours)
    };
    eprintln!(
        "apiserver-at-write test: {}; rollouts {}; at most {max_ours} node(s) cordoned by us at once; {swaps} swaps checked against the go-ahead ({} of them label writes checked at the proxy); control plane restarts {:?}; {} violation(s); controller log {}",
        faults.join("; "),
        outcomes.join(", "),
        swap_writes.load(Ordering::Relaxed),
        restarts.lock().unwrap_or_else(|e| e.into_inner()),
        violations.len(),
        ctl.logs
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" ")
    );
    ctl.kill_all();
    delete_policies(&env).await;
    env.cleanup().await;
    assert_eq!(
        faults.len(),
        4,
        "four restarts, one per trapped write: {faults:?}"
    );
    let swap_writes = swap_writes.load(Ordering::Relaxed);
    assert!(
        swap_writes >= 2 * nodes.len(),
        "{swap_writes} swap label writes checked against the go-ahead, for {} nodes upgraded twice",
        nodes.len()
    );
    assert!(
        violations.is_empty(),
        "{} invariant violation(s):\n{}",
        violations.len(),
        violations.join("\n")
    );
}
