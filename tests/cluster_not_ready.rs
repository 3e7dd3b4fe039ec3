//! Rollouts while nodes are NotReady, against the real control plane, with the
//! real controller binary and the simulated node agent: the fleet-health brake,
//! a node that turns NotReady mid-cycle, and a node NotReady before it starts.
//! A [`SafetyWatcher`] started before the version change checks, independently
//! of the controller, at every watch event of the test's nodes: how many Ready
//! nodes we have cordoned, how many nodes are in a cycle, and that every module
//! swap happened under the controller's go-ahead.
//!
//! The controller under test is the one built with these tests; set
//! `TTDRV_CONTROLLER_BIN=/path/to/ttdrv-controller` to run them against
//! another build (e.g. an older commit's, to see what they catch).

mod common;

use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use ttdrv_api::{ConditionType, NodeState, NodeStatus, TenstorrentDriverPolicyStatus};
use ttdrv_testkit::{ControllerOptions, ControllerProcess, TestEnv, wait_for};

/// Bound of every single wait; each test takes well under a minute normally.
const T: Duration = Duration::from_secs(60);
/// How long test 1 keeps the whole fleet NotReady.
const OUTAGE: Duration = Duration::from_secs(20);
/// How long test 2 keeps its node NotReady mid-cycle once the controller has
/// seen it (the window in which a wrong controller would start another node).
const HOLD: Duration = Duration::from_secs(6);

/// The controller under test: the binary built with these tests, or the one
/// `TTDRV_CONTROLLER_BIN` names.
fn start_controller(env: &TestEnv, ns: &str, extra_args: &[&str]) -> ControllerProcess {
    let opts = ControllerOptions {
        extra_args: extra_args.iter().map(|a| a.to_string()).collect(),
        ..Default::default()
    };
    match std::env::var_os("TTDRV_CONTROLLER_BIN") {
        Some(bin) => ControllerProcess::start(
            env,
            ns,
            ControllerOptions {
                bin: Some(bin.into()),
                ..opts
            },
        ),
        None => controller_with(env, ns, opts),
    }
}

fn cond(st: &TenstorrentDriverPolicyStatus, type_: &str) -> Option<Condition> {
    st.conditions.iter().find(|c| c.type_ == type_).cloned()
}

fn entry(st: &TenstorrentDriverPolicyStatus, node: &str) -> Option<NodeStatus> {
    st.nodes.iter().find(|n| n.name == node).cloned()
}

fn brief(st: &TenstorrentDriverPolicyStatus) -> String {
    let nodes: Vec<String> = st
        .nodes
        .iter()
        .map(|n| {
            format!(
                "{} {:?} {} ({})",
                n.name,
                n.state,
                n.reason.as_deref().unwrap_or("-"),
                n.current_version.as_deref().unwrap_or("-")
            )
        })
        .collect();
    let conds: Vec<String> = st
        .conditions
        .iter()
        .map(|c| format!("{}={} {}: {}", c.type_, c.status, c.reason, c.message))
        .collect();
    format!(
        "nodes [{}]; conditions [{}]",
        nodes.join(", "),
        conds.join("; ")
    )
}

/// Waits for every node to be Done at `version`, failing at once when a
/// safety invariant breaks on the way.
async fn wait_all_done_safely(
    env: &TestEnv,
    policy: &str,
    nodes: &[String],
    version: &str,
    safety: &SafetyWatcher,
    max_in_cycle: usize,
) {
    wait_for(&format!("every node Done at {version}"), T, || {
        safety.assert_safe(1, Some(max_in_cycle), "while the rollout completes");
        async {
            let st = status(env, policy).await;
            let done = nodes.iter().all(|n| {
                entry(&st, n).is_some_and(|e| {
                    e.state == NodeState::Done && e.current_version.as_deref() == Some(version)
                })
            });
            if done { Ok(()) } else { Err(brief(&st)) }
        }
    })
    .await;
}

/// Waits until the controller's /metrics has exactly `line`.
async fn wait_metric(ctl: &ControllerProcess, line: &str) {
    let family = line.split('{').next().unwrap_or(line).to_string();
    wait_for(&format!("metric `{line}`"), T, || async {
        match ctl.admin_get("/metrics").await {
            Some((200, _, body)) if body.lines().any(|l| l.trim() == line) => Ok(()),
            Some((code, _, body)) => Err(format!(
                "HTTP {code}: {:?}",
                body.lines()
                    .filter(|l| l.starts_with(&family))
                    .collect::<Vec<_>>()
            )),
            None => Err("the admin server does not answer".into()),
        }
    })
    .await;
}

/// `n` nodes at 2.7.0 (maxUnavailable 1) under a controller with `args`, moving
/// to 2.8.0 with nodes[0] held in Draining by [`hold_drain`] (it goes first:
/// name order, no device users), the [`SafetyWatcher`] started before the
/// version change. Returns the environment, namespace, nodes, policy, the
/// watcher, the controller and the agent.
async fn first_node_held_draining(
    name: &str,
    n: usize,
    args: &[&str],
) -> (
    TestEnv,
    String,
    Vec<String>,
    String,
    SafetyWatcher,
    (ControllerProcess, ttdrv_testkit::SimAgent),
) {
    let (env, ns, nodes, agent) = sim_fleet(name, n).await;
    let ctl = start_controller(&env, &ns, args);
    let policy = installed(&env, &nodes, "upgradePolicy: {maxUnavailable: 1}", T).await;
    hold_drain(&env, &ns, &nodes[0]).await;
    let safety = SafetyWatcher::start(&env);
    tokio::time::sleep(Duration::from_millis(500)).await;
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    wait_node(&env, &policy, &nodes[0], NodeState::Draining, T).await;
    (env, ns, nodes, policy, safety, (ctl, agent))
}

/// The whole fleet turns NotReady while the first node is mid-cycle.
///
/// The moment is "as soon as the first node is in a cycle", not "right away":
/// the harder case. Nothing is in progress right after the version change, so
/// an outage there only exercises the brake on an idle rollout (and whether
/// the first node started before the outage would be a race). Mid-cycle, the
/// controller must at once keep the busy node's slot while it is NotReady,
/// start none of the other five (all of them NotReady, hence "out of service
/// already", which the availability rule alone would let start at no cost),
/// and hand the fleet back with the busy node still cordoned: exactly at the
/// limit of one Ready node cordoned by us. The first node's drain is held by a
/// PodDisruptionBudget for the whole outage so it is surely still mid-cycle
/// when the nodes come back; the budget is removed afterwards.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn fleet_wide_not_ready_starts_nothing_and_resumes() {
    let started = Instant::now();
    let (env, ns, nodes, policy, safety, _running) =
        first_node_held_draining("notready-fleet", 6, &[]).await;

    // The outage: every node NotReady, half False, half Unknown.
    let outage = Instant::now();
    for (i, n) in nodes.iter().enumerate() {
        let s = if i % 2 == 0 { "False" } else { "Unknown" };
        env.set_node_ready(n, Some(s)).await;
    }
    let mut degraded: Option<Condition> = None;
    let mut during = String::from("(status not read)");
    while outage.elapsed() < OUTAGE {
        let st = status(&env, &policy).await;
        if let Some(c) = cond(&st, ConditionType::Degraded.as_str())
            && c.status == "True"
            && c.reason == "FleetNotReady"
            && nodes.iter().all(|n| c.message.contains(n.as_str()))
        {
            degraded.get_or_insert(c);
        }
        during = brief(&st);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for n in &nodes {
        env.set_node_ready(n, None).await;
    }
    for n in &nodes {
        env.wait_node_ready(n).await;
    }
    eprintln!("outage over after {:?}: {during}", outage.elapsed());

    // At every instant so far: the busy node is the only one of ours.
    safety.assert_safe(1, Some(1), "during and right after the fleet-wide outage");
    let degraded = degraded.unwrap_or_else(|| {
        panic!(
            "the policy was never Degraded=True/FleetNotReady naming all nodes {nodes:?} \
             during the outage; last seen: {during}"
        )
    });
    assert!(
        degraded.message.contains("NotReady"),
        "the Degraded message says why: {}",
        degraded.message
    );
    wait_event(&env, &policy, "FleetNotReady", T, |note| {
        note.contains(nodes[0].as_str()) && note.contains("NotReady")
    })
    .await;
    let st = status(&env, &policy).await;
    for n in &nodes[1..] {
        assert_eq!(
            entry(&st, n).map(|e| e.state),
            Some(NodeState::Pending),
            "{n} must not have started: {}",
            brief(&st)
        );
    }

    // The busy node's drain may finish now; the rest follows one at a time.
    release_drain(&env, &ns).await;
    wait_all_done_safely(&env, &policy, &nodes, "2.8.0", &safety, 1).await;
    wait_event(&env, &policy, "FleetReady", T, |_| true).await;
    assert_done_uncordoned(&env, &nodes, "2.8.0").await;
    safety.assert_safe(1, Some(1), "at the end");
    let seen = safety.seen();
    for n in &nodes {
        assert!(
            seen.swaps
                .iter()
                .any(|s| s == &format!("{n}: 2.7.0 -> 2.8.0")),
            "{n}'s swap was seen by the watcher: {:?}",
            seen.swaps
        );
    }
    let degraded_now = cond(
        &status(&env, &policy).await,
        ConditionType::Degraded.as_str(),
    );
    assert_eq!(
        degraded_now.as_ref().map(|c| c.status.as_str()),
        Some("False"),
        "Degraded clears once the fleet is back and done: {degraded_now:?}"
    );
    eprintln!(
        "fleet_wide_not_ready_starts_nothing_and_resumes: {:?}; watcher: max Ready cordoned by us {}, max in cycle {}",
        started.elapsed(),
        seen.max_ready_cordoned_by_us,
        seen.max_in_cycle
    );
    env.teardown().await;
}

/// A node that turns NotReady while Draining keeps its slot (reason
/// `NodeNotReady`, an Event), and no other node starts meanwhile. The brake is
/// raised to 50% so that one NotReady node in three (33%) does not engage it:
/// only the slot the NotReady node keeps holds the others back.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn node_not_ready_mid_cycle_keeps_its_slot() {
    let started = Instant::now();
    let (env, ns, nodes, policy, safety, (ctl, _agent)) =
        first_node_held_draining("notready-mid", 3, &["--not-ready-brake-percent", "50"]).await;

    env.set_node_ready(&nodes[0], Some("Unknown")).await;
    let busy = wait_for(
        &format!("{} Draining with reason NodeNotReady", nodes[0]),
        T,
        || async {
            let st = status(&env, &policy).await;
            match entry(&st, &nodes[0]) {
                Some(e)
                    if e.state == NodeState::Draining
                        && e.reason.as_deref() == Some("NodeNotReady") =>
                {
                    Ok(e)
                }
                _ => Err(brief(&st)),
            }
        },
    )
    .await;
    assert!(
        busy.message
            .as_deref()
            .is_some_and(|m| m.contains("keeps its slot")),
        "the entry says the node keeps its slot: {busy:?}"
    );
    wait_event(&env, &policy, "NodeNotReady", T, |note| {
        note.contains(nodes[0].as_str()) && note.contains("Draining")
    })
    .await;
    // The controller's plan has seen the node NotReady, and the brake is off.
    wait_metric(
        &ctl,
        &format!("ttdriver_rollout_not_ready_nodes{{cr=\"{policy}\"}} 1"),
    )
    .await;
    wait_metric(
        &ctl,
        &format!("ttdriver_rollout_braked{{cr=\"{policy}\"}} 0"),
    )
    .await;
    // A window in which a controller that lets the NotReady node's slot go
    // would start another node (passes run every 500 ms).
    tokio::time::sleep(HOLD).await;
    safety.assert_safe(1, Some(1), "while the busy node was NotReady");
    let st = status(&env, &policy).await;
    for n in &nodes[1..] {
        let e = entry(&st, n);
        assert!(
            e.as_ref()
                .is_some_and(|e| e.state == NodeState::Pending
                    && e.reason.as_deref() == Some("WaitingForSlot")),
            "{n} waits for the slot the NotReady node keeps: {}",
            brief(&st)
        );
    }
    assert_eq!(
        entry(&st, &nodes[0]).map(|e| (e.state, e.reason)),
        Some((NodeState::Draining, Some("NodeNotReady".to_string()))),
        "still Draining, still NodeNotReady: {}",
        brief(&st)
    );

    // Back: the usual reason returns, the drain finishes, the rest follows.
    env.set_node_ready(&nodes[0], None).await;
    env.wait_node_ready(&nodes[0]).await;
    wait_for(
        &format!("{} Draining with its usual reason again", nodes[0]),
        T,
        || async {
            let st = status(&env, &policy).await;
            match entry(&st, &nodes[0]) {
                // Its drain is still held by the test's budget: the usual
                // reason of a blocked drain.
                Some(e)
                    if e.state == NodeState::Draining
                        && e.reason.as_deref() == Some("EvictionBlocked") =>
                {
                    Ok(())
                }
                _ => Err(brief(&st)),
            }
        },
    )
    .await;
    release_drain(&env, &ns).await;
    wait_all_done_safely(&env, &policy, &nodes, "2.8.0", &safety, 1).await;
    assert_done_uncordoned(&env, &nodes, "2.8.0").await;
    safety.assert_safe(1, Some(1), "at the end");
    let seen = safety.seen();
    assert_eq!(seen.swaps.len(), 3, "one swap per node: {:?}", seen.swaps);
    eprintln!(
        "node_not_ready_mid_cycle_keeps_its_slot: {:?}; watcher: {seen:?}",
        started.elapsed()
    );
    env.teardown().await;
}

/// A node NotReady before the version change never starts (and is never
/// cordoned) while the Ready ones complete; once Ready it completes too.
///
/// maxUnavailable is 2: the NotReady node counts as out of service, so with 1
/// the availability rule would hold the Ready nodes back as well; with 2 they
/// go one at a time beside it. The brake is raised to 50% so that one NotReady
/// node in three (33%) does not hold the whole rollout.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn not_ready_node_is_never_started() {
    let started = Instant::now();
    let (env, ns, nodes, _agent) = sim_fleet("notready-never", 3).await;
    let ctl = start_controller(&env, &ns, &["--not-ready-brake-percent", "50"]);
    let policy = installed(&env, &nodes, "upgradePolicy: {maxUnavailable: 2}", T).await;
    // nodes[0] would go first (name order): NotReady, it must be skipped.
    let down = &nodes[0];
    env.set_node_ready(down, Some("False")).await;
    wait_metric(
        &ctl,
        &format!("ttdriver_rollout_not_ready_nodes{{cr=\"{policy}\"}} 1"),
    )
    .await;
    let safety = SafetyWatcher::start(&env);
    let cordons = CordonWatcher::start(&env);
    tokio::time::sleep(Duration::from_millis(500)).await;
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    wait_nodes_state(&env, &policy, &nodes[1..], NodeState::Done, "2.8.0", T).await;

    let st = status(&env, &policy).await;
    let e = entry(&st, down);
    assert!(
        e.as_ref().is_some_and(|e| e.state == NodeState::Pending
            && e.reason.as_deref() == Some("WaitingForSlot")
            && e.message
                .as_deref()
                .is_some_and(|m| m.contains("waiting for the node to be Ready"))),
        "{down} waits in Pending for the node to be Ready: {}",
        brief(&st)
    );
    assert!(
        !cordons.ever().contains(down),
        "{down} was cordoned while NotReady: cordoned so far {:?}",
        cordons.ever()
    );
    assert_eq!(
        kmd(&env.get_node(down).await).as_deref(),
        Some("2.7.0"),
        "{down} keeps its module while NotReady"
    );
    // The NotReady node takes one of the two units of availability: the
    // Ready nodes went one at a time.
    safety.assert_safe(1, Some(1), "while a node was NotReady");

    env.set_node_ready(down, None).await;
    env.wait_node_ready(down).await;
    wait_all_done_safely(&env, &policy, &nodes, "2.8.0", &safety, 1).await;
    assert_done_uncordoned(&env, &nodes, "2.8.0").await;
    assert!(
        cordons.ever().contains(down),
        "{down} went through a drained cycle once Ready: cordoned {:?}",
        cordons.ever()
    );
    safety.assert_safe(1, Some(1), "at the end");
    eprintln!(
        "not_ready_node_is_never_started: {:?}; watcher: {:?}",
        started.elapsed(),
        safety.seen()
    );
    env.teardown().await;
}

/// The installer pod of each node (by name), and its uid.
async fn installer_pods(
    env: &TestEnv,
    ns: &str,
    nodes: &[String],
) -> Vec<(String, String, String)> {
    let mut out = vec![];
    for n in nodes {
        for p in env.pods_on(ns, n).await {
            let meta = &p.metadata;
            if meta
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key(ttdrv_api::labels::CLAIM))
            {
                out.push((
                    n.clone(),
                    meta.name.clone().unwrap_or_default(),
                    meta.uid.clone().unwrap_or_default(),
                ));
            }
        }
    }
    out
}

/// Sets a pod's Ready condition, as the node lifecycle controller does for
/// the pods of an unreachable node ("False") and the kubelet once it reports
/// again ("True").
async fn set_pod_ready(env: &TestEnv, ns: &str, pod: &str, status: &str) {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Patch, PatchParams};
    let api: kube::Api<Pod> = kube::Api::namespaced(env.client.clone(), ns);
    let patch = serde_json::json!({ "status": { "conditions": [
        { "type": "Ready", "status": status },
        { "type": "ContainersReady", "status": status },
    ] } });
    if let Err(e) = api
        .patch_status(pod, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
    {
        panic!("setting Ready={status} on pod {pod}: {e}");
    }
}

/// Polls the policy's status for `d`; every entry seen outside Done, once.
async fn not_done_for(env: &TestEnv, policy: &str, d: Duration, seen: &mut Vec<String>) {
    let until = Instant::now() + d;
    while Instant::now() < until {
        for e in status(env, policy).await.nodes {
            if e.state != NodeState::Done {
                let s = format!("{} {:?} {}", e.name, e.state, e.reason.unwrap_or_default());
                if !seen.contains(&s) {
                    seen.push(s);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A whole-fleet partition that heals after the rollout finished: every node
/// Unknown, their installer pods marked NotReady (the node lifecycle
/// controller's doing), then the nodes back and, a few seconds later, the
/// pods Ready again (the kubelet reporting once more). Nothing changed on any
/// node: none may leave Done, no installer pod may be replaced (on 1000 nodes
/// that would be 1000 restarts and image pulls right after a network
/// incident), nothing is cordoned.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn a_partition_that_heals_restarts_nothing() {
    let (env, ns, nodes, _agent) = sim_fleet("partition", 6).await;
    let _ctl = start_controller(&env, &ns, &[]);
    let policy = installed(&env, &nodes, "upgradePolicy: {maxUnavailable: 1}", T).await;
    let before = installer_pods(&env, &ns, &nodes).await;
    assert_eq!(before.len(), nodes.len(), "{before:?}");
    let cordons = CordonWatcher::start(&env);
    let mut left_done = vec![];

    for n in &nodes {
        env.set_node_ready(n, Some("Unknown")).await;
    }
    for (_, pod, _) in &before {
        set_pod_ready(&env, &ns, pod, "False").await;
    }
    not_done_for(&env, &policy, OUTAGE, &mut left_done).await;
    for n in &nodes {
        env.set_node_ready(n, None).await;
    }
    for n in &nodes {
        env.wait_node_ready(n).await;
    }
    // The kubelets report their pods a moment after their nodes.
    not_done_for(&env, &policy, Duration::from_secs(3), &mut left_done).await;
    for (_, pod, _) in &before {
        set_pod_ready(&env, &ns, pod, "True").await;
    }
    not_done_for(&env, &policy, Duration::from_secs(10), &mut left_done).await;

    let after = installer_pods(&env, &ns, &nodes).await;
    assert_eq!(after, before, "installer pods replaced after the partition");
    assert!(left_done.is_empty(), "nodes left Done: {left_done:?}");
    assert!(cordons.ever().is_empty(), "cordoned: {:?}", cordons.ever());
    env.teardown().await;
}
