//! Soak and maintenance windows (issue 34): after a node is upgraded the
//! next one waits out `upgradePolicy.soakSeconds`, and trouble on the
//! upgraded node meanwhile halts the rollout; outside every
//! `upgradePolicy.maintenanceWindows` entry no cycle starts, while one under
//! way finishes. Real control plane, the controller binary, the simulated
//! agent.
//!
//! The windows are placed relative to the controller's own clock (a window
//! that opens in two hours, one that is open now) and moved by patching the
//! policy, so that no test sleeps until a wall-clock minute; the arithmetic
//! of the windows themselves (days, overnight, time zones, daylight saving
//! time) is tested with injected instants in `core/src/window.rs`.

mod common;

use std::time::{Duration, Instant};

use common::*;
use ttdrv_api::{NodeState, NodeStatus};
use ttdrv_testkit::{ControllerOptions, TestEnv};

const T: Duration = Duration::from_secs(90);

/// The controller with a 1 s safety-net pass (default 30 s): a soak's end and
/// a window's opening are noticed by time, not by a watch event.
fn fast_controller(env: &TestEnv, ns: &str) -> ttdrv_testkit::ControllerProcess {
    controller_with(
        env,
        ns,
        ControllerOptions {
            extra_args: vec!["--full-resync-ms=1000".into()],
            ..Default::default()
        },
    )
}

/// Polls the policy's status until `pred` holds for the entries of `nodes`.
async fn wait_entries(
    env: &TestEnv,
    policy: &str,
    nodes: &[String],
    what: &str,
    pred: impl Fn(&[NodeStatus]) -> bool,
) -> Vec<NodeStatus> {
    let start = Instant::now();
    loop {
        let st = status(env, policy).await;
        let entries: Vec<NodeStatus> = nodes
            .iter()
            .filter_map(|n| st.nodes.iter().find(|e| &e.name == n).cloned())
            .collect();
        if entries.len() == nodes.len() && pred(&entries) {
            return entries;
        }
        assert!(
            start.elapsed() < T,
            "{policy}: never {what}; last seen: {:#?}",
            entries
                .iter()
                .map(|e| (&e.name, e.state, &e.reason, &e.message))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// `HH:MM` in UTC, `minutes` from now.
fn utc_hhmm(minutes: i64) -> String {
    let t = k8s_openapi::jiff::Timestamp::now()
        .checked_add(k8s_openapi::jiff::SignedDuration::from_mins(minutes))
        .expect("in range");
    t.strftime("%H:%M").to_string()
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn a_soak_holds_the_next_node_and_trouble_on_the_soaking_node_halts_the_rollout() {
    let (env, ns, nodes, agent) = sim_fleet("soak-halt", 3).await;
    let _ctl = fast_controller(&env, &ns);
    let policy = ttdrv_testkit::policy::installed(
        &env,
        &nodes,
        "upgradePolicy: {maxUnavailable: 1, soakSeconds: 600}",
        T,
    )
    .await;
    let cordons = CordonWatcher::start(&env);
    let watcher = SafetyWatcher::start(&env);
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    let first = nodes[0].clone();
    let rest = &nodes[1..];
    wait_node_at(&env, &policy, &first, NodeState::Done, Some("2.8.0"), T).await;
    // The others wait out the soak, and say so.
    let waiting = wait_entries(&env, &policy, rest, "Soaking", |es| {
        es.iter()
            .all(|e| e.state == NodeState::Pending && e.reason.as_deref() == Some("Soaking"))
    })
    .await;
    for e in &waiting {
        assert_message(e, &format!("soaking: {first} was upgraded"));
        assert_message(e, "soakSeconds: 600");
    }
    let progressing = status(&env, &policy)
        .await
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Progressing")
        .expect("Progressing");
    assert_eq!(progressing.reason, "Soaking", "{progressing:?}");
    // Several passes (1 s apart): nothing else starts.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        cordons.ever(),
        std::slice::from_ref(&first),
        "only the first node cycled"
    );

    // Trouble during the soak: the upgraded node goes NotReady.
    env.set_node_ready(&first, Some("False")).await;
    let failed = wait_node(&env, &policy, &first, NodeState::Failed, T).await;
    assert_eq!(failed.reason.as_deref(), Some("SoakFailed"), "{failed:?}");
    assert_message(&failed, "NotReady");
    assert_message(&failed, "the rollout halts");
    let node = env.get_node(&first).await;
    assert!(
        !unschedulable(&node),
        "a soak failure does not cordon a node in service"
    );
    assert_eq!(kmd(&node).as_deref(), Some("2.8.0"));
    env.set_node_ready(&first, Some("True")).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    for e in wait_entries(&env, &policy, rest, "still Pending", |es| {
        es.iter().all(|e| e.state == NodeState::Pending)
    })
    .await
    {
        assert_ne!(e.state, NodeState::Done, "{e:?}: the rollout halted");
    }
    assert_eq!(
        cordons.ever(),
        std::slice::from_ref(&first),
        "halted: nothing started"
    );

    // A person decides: retry the node and drop the soak; the rest follows.
    env.annotate_node(&first, ttdrv_core::node::RETRY_ANNOTATION, Some("1"))
        .await;
    patch_policy(
        &env,
        &policy,
        serde_json::json!({ "upgradePolicy": { "soakSeconds": 0 } }),
    )
    .await;
    wait_nodes_state(&env, &policy, &nodes, NodeState::Done, "2.8.0", T).await;
    assert_done_uncordoned(&env, &nodes, "2.8.0").await;
    watcher.assert_safe(1, None, "soak halt");
    drop(agent);
    env.teardown().await;
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn each_next_node_starts_only_after_the_soak_of_the_last() {
    const SOAK: i64 = 3;
    let (env, ns, nodes, agent) = sim_fleet("soak-pass", 3).await;
    let _ctl = fast_controller(&env, &ns);
    let extra = format!("upgradePolicy: {{maxUnavailable: 1, soakSeconds: {SOAK}}}");
    let policy = ttdrv_testkit::policy::installed(&env, &nodes, &extra, T).await;
    let watcher = SafetyWatcher::start(&env);
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    wait_nodes_state(&env, &policy, &nodes, NodeState::Done, "2.8.0", T).await;
    assert_done_uncordoned(&env, &nodes, "2.8.0").await;
    // The controller's own records: each cycle's start and its Done time.
    let mut cycles: Vec<(i64, i64, String)> = vec![];
    for n in &nodes {
        let rec = ttdrv_core::node::record(&env.get_node(n).await)
            .ok()
            .flatten()
            .unwrap_or_else(|| panic!("{n}: no record"));
        let started = rec.started.unwrap_or_else(|| panic!("{n}: {rec:?}"));
        cycles.push((started, rec.since, n.clone()));
    }
    cycles.sort();
    for pair in cycles.windows(2) {
        let ((_, done, a), (next, _, b)) = (&pair[0], &pair[1]);
        assert!(
            *next >= done + SOAK,
            "{b} started at {next}, {}s after {a} was upgraded at {done}: the soak is {SOAK}s",
            next - done
        );
    }
    println!(
        "soak {SOAK}s: gaps between a node's upgrade and the next start: {:?}s",
        cycles
            .windows(2)
            .map(|p| p[1].0 - p[0].1)
            .collect::<Vec<_>>()
    );
    watcher.assert_safe(1, None, "soak pass");
    drop(agent);
    env.teardown().await;
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn a_controller_killed_during_a_soak_leaves_the_soak_to_run_out() {
    // The soak is decided from what survives the controller (the record on
    // the upgraded node), not from memory: a new controller started right
    // after the kill must not start the next node before the soak ends.
    const SOAK: i64 = 20;
    let (env, ns, nodes, agent) = sim_fleet("soak-restart", 2).await;
    let mut ctl = fast_controller(&env, &ns);
    let extra = format!("upgradePolicy: {{maxUnavailable: 1, soakSeconds: {SOAK}}}");
    let policy = ttdrv_testkit::policy::installed(&env, &nodes, &extra, T).await;
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    let first = wait_entries(&env, &policy, &nodes, "one node upgraded", |es| {
        es.iter()
            .any(|e| e.state == NodeState::Done && e.current_version.as_deref() == Some("2.8.0"))
    })
    .await;
    ctl.kill();
    let killed_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default();
    let _ctl = fast_controller(&env, &ns);
    wait_nodes_state(&env, &policy, &nodes, NodeState::Done, "2.8.0", T).await;
    let upgraded = first
        .iter()
        .find(|e| e.state == NodeState::Done && e.current_version.as_deref() == Some("2.8.0"))
        .map(|e| e.name.clone())
        .expect("the node upgraded first");
    let record = |n: String| {
        let env = &env;
        async move {
            ttdrv_core::node::record(&env.get_node(&n).await)
                .ok()
                .flatten()
                .unwrap_or_else(|| panic!("{n}: no record"))
        }
    };
    let done = record(upgraded.clone()).await.since;
    let next = nodes
        .iter()
        .find(|n| **n != upgraded)
        .cloned()
        .expect("the other node");
    let started = record(next.clone())
        .await
        .started
        .unwrap_or_else(|| panic!("{next}: no start"));
    println!(
        "soak {SOAK}s, controller killed {}s after {upgraded} was upgraded: {next} started {}s after it",
        killed_at - done,
        started - done
    );
    assert!(
        killed_at - done < SOAK,
        "the kill came after the soak ({}s): the test proves nothing",
        killed_at - done
    );
    assert!(
        started >= done + SOAK,
        "{next} started {}s after {upgraded} was upgraded, across a controller restart: the soak is {SOAK}s",
        started - done
    );
    assert_done_uncordoned(&env, &nodes, "2.8.0").await;
    drop(agent);
    env.teardown().await;
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn outside_a_window_nothing_starts_and_a_cycle_under_way_finishes() {
    let (env, ns, nodes, agent) = sim_fleet("windows", 3).await;
    let ctl = fast_controller(&env, &ns);
    // Opens in two hours: closed now. First installs need no cycle and go on.
    let closed = serde_json::json!([{ "start": utc_hhmm(120), "end": utc_hhmm(180) }]);
    let open = serde_json::json!([{ "start": utc_hhmm(-60), "end": utc_hhmm(60) }]);
    let extra = format!("upgradePolicy: {{maxUnavailable: 1, maintenanceWindows: {closed}}}");
    let policy = ttdrv_testkit::policy::installed(&env, &nodes, &extra, T).await;
    let cordons = CordonWatcher::start(&env);
    let watcher = SafetyWatcher::start(&env);
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    let held = wait_entries(&env, &policy, &nodes, "OutsideMaintenanceWindow", |es| {
        es.iter().all(|e| {
            e.state == NodeState::Pending && e.reason.as_deref() == Some("OutsideMaintenanceWindow")
        })
    })
    .await;
    assert_message(&held[0], "no new cycle starts until the next opens at");
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(cordons.ever().is_empty(), "{:?}", cordons.ever());

    // The window opens (moved over now); the first node's drain is held by a
    // PodDisruptionBudget, and the window closes again while it drains.
    let first = nodes[0].clone();
    hold_drain(&env, &ns, &first).await;
    patch_policy(
        &env,
        &policy,
        serde_json::json!({ "upgradePolicy": { "maintenanceWindows": open } }),
    )
    .await;
    wait_node(&env, &policy, &first, NodeState::Draining, T).await;
    patch_policy(
        &env,
        &policy,
        serde_json::json!({ "upgradePolicy": { "maintenanceWindows": closed } }),
    )
    .await;
    // Held, with a node still draining: the budget the metrics export is
    // the policy's (1), not the 0 that holds new starts, or
    // TTDriverTooManyUnavailable (in progress > max) would page.
    ttdrv_testkit::wait_for("held while the first node drains", T, || async {
        let held = ctl
            .metric(
                "ttdriver_policy_rollout_held",
                &[
                    ("cr", policy.as_str()),
                    ("reason", "OutsideMaintenanceWindow"),
                ],
            )
            .await;
        if held == 1.0 {
            Ok(())
        } else {
            Err(format!("held {held}"))
        }
    })
    .await;
    let cr = [("cr", policy.as_str())];
    assert_eq!(
        ctl.metric("ttdriver_rollout_max_unavailable", &cr).await,
        1.0
    );
    assert_eq!(
        ctl.metric("ttdriver_rollout_in_progress_nodes", &cr).await,
        1.0
    );
    release_drain(&env, &ns).await;
    // The cycle under way finishes; nothing else starts.
    wait_node_at(&env, &policy, &first, NodeState::Done, Some("2.8.0"), T).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    wait_entries(&env, &policy, &nodes[1..], "held again", |es| {
        es.iter()
            .all(|e| e.reason.as_deref() == Some("OutsideMaintenanceWindow"))
    })
    .await;
    assert_eq!(cordons.ever(), std::slice::from_ref(&first));
    let progressing = status(&env, &policy)
        .await
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Progressing")
        .expect("Progressing");
    assert_eq!(
        progressing.reason, "OutsideMaintenanceWindow",
        "{progressing:?}"
    );

    // No windows: the rest goes.
    patch_policy(
        &env,
        &policy,
        serde_json::json!({ "upgradePolicy": { "maintenanceWindows": [] } }),
    )
    .await;
    wait_nodes_state(&env, &policy, &nodes, NodeState::Done, "2.8.0", T).await;
    assert_done_uncordoned(&env, &nodes, "2.8.0").await;
    watcher.assert_safe(1, None, "windows");
    drop(agent);
    env.teardown().await;
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn windows_are_checked_at_the_api_server_and_an_unknown_zone_by_the_controller() {
    let env = TestEnv::new("windows-invalid").await;
    let bad = [
        (
            serde_json::json!([{ "start": "25:00", "end": "04:00" }]),
            "start",
        ),
        (
            serde_json::json!([{ "start": "02:00", "end": "02:00" }]),
            "must differ",
        ),
        (
            serde_json::json!([{ "days": ["Mon", "Mon"], "start": "02:00", "end": "04:00" }]),
            "days",
        ),
        (
            serde_json::json!([{ "days": ["Monday"], "start": "02:00", "end": "04:00" }]),
            "days",
        ),
    ];
    for (i, (windows, part)) in bad.into_iter().enumerate() {
        let spec = serde_json::json!({
            "version": "2.8.0",
            "upgradePolicy": { "maintenanceWindows": windows },
        });
        let err =
            ttdrv_testkit::policy::create_raw_policy(&env, &env.name(&format!("bad{i}")), &spec)
                .await
                .expect_err("refused by the API server");
        assert!(err.to_string().contains(part), "{part}: {err}");
    }
    // A zone the API server cannot know is wrong: the controller refuses it.
    let ns = env.namespace().await;
    let _ctl = controller(&env, &ns);
    let policy = env.name("mars");
    create_policy(
        &env,
        &policy,
        &fleet_spec(
            &env,
            "2.8.0",
            "upgradePolicy: {maintenanceWindows: [{start: \"02:00\", end: \"04:00\", timeZone: Mars/Olympus_Mons}]}",
        ),
    )
    .await;
    let c = wait_condition(&env, &policy, "Degraded", "True/PolicyRefused", T, |c| {
        c.status == "True" && c.reason == "PolicyRefused"
    })
    .await;
    for part in ["maintenanceWindows[0].timeZone", "Mars/Olympus_Mons"] {
        assert!(c.message.contains(part), "{part}: {}", c.message);
    }
    env.teardown().await;
}
