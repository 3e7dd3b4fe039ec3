//! Pause that holds, and failures seen within about a minute with their cause:
//! real control plane, the controller binary, the simulated agent.

mod common;

use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::PostParams;
use ttdrv_api::NodeState;
use ttdrv_testkit::TestEnv;
use ttdrv_testkit::sim_agent::CRASH_ANNOTATION;

const T: Duration = Duration::from_secs(90);

/// A bare pod holding the device (hostPath /dev/tenstorrent) on `node`: the
/// drain leaves it (no controller, `drain.force` off), so the agent finds
/// the device busy.
async fn device_holder(env: &TestEnv, ns: &str, name: &str, node: &str) {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": { "name": name },
        "spec": {
            "nodeName": node,
            "containers": [{ "name": "c", "image": "busybox",
                             "volumeMounts": [{ "name": "dev", "mountPath": "/dev/tenstorrent" }] }],
            "volumes": [{ "name": "dev", "hostPath": { "path": "/dev/tenstorrent" } }]
        }
    }))
    .expect("pod");
    Api::<Pod>::namespaced(env.client.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("creating pod {name}: {e}"));
}

async fn pod_exists(env: &TestEnv, ns: &str, name: &str) -> bool {
    Api::<Pod>::namespaced(env.client.clone(), ns)
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .is_some_and(|p| p.metadata.deletion_timestamp.is_none())
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn pause_during_a_blocked_drain_holds_and_resume_continues() {
    let extra = "upgradePolicy: {drain: {timeoutSeconds: 6}}";
    let (env, ns, nodes, policy, _running) = installed_fleet("failfast-pause", 2, extra, T).await;
    let guarded = hold_drain(&env, &ns, &nodes[0]).await;
    let watcher = SafetyWatcher::start(&env);
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    wait_node(&env, &policy, &nodes[0], NodeState::Draining, T).await;
    patch_policy(&env, &policy, serde_json::json!({ "paused": true })).await;
    // The controller has seen the pause once it says so (an eviction retry
    // it sent before that could otherwise meet the PDB gone).
    wait_condition(&env, &policy, "Paused", "True", T, |c| c.status == "True").await;
    // The PDB goes away while paused: nothing may be evicted until resume.
    release_drain(&env, &ns).await;
    // Well past the 6 s drain deadline.
    let paused_at = Instant::now();
    while paused_at.elapsed() < Duration::from_secs(12) {
        let st = node_entry(&env, &policy, &nodes[0]).await;
        assert_eq!(
            st.as_ref().map(|s| s.state),
            Some(NodeState::Draining),
            "paused: the node holds where it is (no Failed, no Upgrading): {st:?}"
        );
        assert!(
            pod_exists(&env, &ns, &guarded).await,
            "paused: {guarded} must not be evicted"
        );
        let other = node_entry(&env, &policy, &nodes[1]).await.map(|s| s.state);
        assert!(
            !other.is_some_and(|s| s.is_in_progress()),
            "paused: nothing new starts: {other:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        unschedulable(&env.get_node(&nodes[0]).await),
        "paused: our cordon stays"
    );
    patch_policy(&env, &policy, serde_json::json!({ "paused": false })).await;
    wait_nodes_state(&env, &policy, &nodes, NodeState::Done, "2.8.0", T).await;
    watcher.assert_safe(1, None, "after the resumed rollout");
    for n in &nodes {
        assert!(!unschedulable(&env.get_node(n).await), "{n} uncordoned");
    }
    env.teardown().await;
}

/// Changes the policy, waits until `node` is Failed and checks that it failed
/// fast (within 90 s) with `reason`; returns its entry.
async fn fails_fast(
    env: &TestEnv,
    policy: &str,
    node: &str,
    patch: serde_json::Value,
    reason: &str,
) -> ttdrv_api::NodeStatus {
    let start = Instant::now();
    patch_policy(env, policy, patch).await;
    let failed = wait_node(env, policy, node, NodeState::Failed, T).await;
    let took = start.elapsed();
    eprintln!("{reason}: {node} Failed after {took:?}");
    assert_eq!(failed.reason.as_deref(), Some(reason), "{failed:?}");
    assert!(took < Duration::from_secs(90), "took {took:?}");
    failed
}

/// The version change every test of this file makes.
fn to_2_8_0() -> serde_json::Value {
    serde_json::json!({ "version": "2.8.0" })
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn unpullable_installer_image_fails_the_node_fast() {
    let (env, _ns, nodes, policy, _running) = installed_fleet("failfast-image", 2, "", T).await;
    let image = "registry.invalid/tt-agent-unpullable:1";
    let patch = serde_json::json!({ "version": "2.8.0", "installer": { "image": image } });
    let failed = fails_fast(&env, &policy, &nodes[0], patch, "InstallerImagePull").await;
    let msg = failed.message.unwrap_or_default();
    assert!(msg.contains("unpullable"), "names the image: {msg}");
    env.teardown().await;
}

/// Without build-ahead the crash loop comes inside the cycle: the node
/// fails cordoned and the rollout halts. Both nodes crash-loop, so whichever
/// the rollout takes first (a targeted pass may start either) is the one
/// that fails, and the other must never start.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn crash_looping_installer_fails_the_node_fast() {
    let extra = "upgradePolicy: {prepare: {enabled: false}}";
    let (env, _ns, nodes, policy, _running) = installed_fleet("failfast-crash", 2, extra, T).await;
    for n in &nodes {
        env.annotate_node(n, CRASH_ANNOTATION, Some("true")).await;
    }
    let start = Instant::now();
    patch_policy(&env, &policy, to_2_8_0()).await;
    let (failed, other) = loop {
        let mut failed = None;
        for (i, n) in nodes.iter().enumerate() {
            if let Some(st) = node_entry(&env, &policy, n).await
                && st.state == NodeState::Failed
            {
                failed = Some((i, st));
            }
        }
        if let Some((i, st)) = failed {
            break ((nodes[i].clone(), st), nodes[1 - i].clone());
        }
        assert!(start.elapsed() < T, "no node Failed within {T:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let took = start.elapsed();
    eprintln!("InstallerCrashLoop: {} Failed after {took:?}", failed.0);
    assert_eq!(
        failed.1.reason.as_deref(),
        Some("InstallerCrashLoop"),
        "{:?}",
        failed.1
    );
    assert!(took < Duration::from_secs(90), "took {took:?}");
    assert!(
        unschedulable(&env.get_node(&failed.0).await),
        "a Failed node stays cordoned"
    );
    // Halted: the other node never starts, for a while after the failure.
    let held = Instant::now();
    while held.elapsed() < Duration::from_secs(5) {
        let st = node_entry(&env, &policy, &other).await.map(|s| s.state);
        assert_eq!(st, Some(NodeState::Pending), "the rollout halts: {other}");
        assert!(
            !unschedulable(&env.get_node(&other).await),
            "{other} is never cordoned"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    env.teardown().await;
}

/// With build-ahead (the default) the new installer crash-loops while the
/// node still serves: the node fails without ever being cordoned.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn crash_looping_installer_fails_its_node_ahead_of_the_cordon() {
    let (env, _ns, nodes, policy, _running) =
        installed_fleet("failfast-crash-ahead", 1, "", T).await;
    env.annotate_node(&nodes[0], CRASH_ANNOTATION, Some("true"))
        .await;
    let cordons = CordonWatcher::start(&env);
    let failed = fails_fast(&env, &policy, &nodes[0], to_2_8_0(), "InstallerCrashLoop").await;
    assert_message(&failed, "not cordoned");
    assert!(cordons.ever().is_empty(), "cordoned: {:?}", cordons.ever());
    assert_eq!(
        kmd(&env.get_node(&nodes[0]).await).as_deref(),
        Some("2.7.0")
    );
    env.teardown().await;
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn device_busy_fails_the_node_with_the_holders() {
    let (env, ns, nodes, policy, _running) = installed_fleet("failfast-busy", 1, "", T).await;
    device_holder(&env, &ns, "holder", &nodes[0]).await;
    let failed = fails_fast(&env, &policy, &nodes[0], to_2_8_0(), "DeviceBusy").await;
    let msg = failed.message.unwrap_or_default();
    assert!(
        msg.contains(&format!("{ns}/holder")),
        "names the holder: {msg}"
    );
    assert!(
        policy_events(&env, &policy)
            .await
            .iter()
            .any(|(r, n)| r == "NodeUpgradeFailed" && n.contains(&format!("{ns}/holder"))),
        "the Event carries the agent's words"
    );
    // The first refusal drained again (once: the drain leaves a bare pod
    // without `force`); the second failed the node.
    assert!(
        policy_events(&env, &policy)
            .await
            .iter()
            .any(|(r, _)| r == "NodeDrainedAgain"),
        "drained again before failing"
    );
    env.teardown().await;
}

/// A pod that reaches the drained node after its drain ended (put there by
/// name here, as a scheduler that had not seen the cordon yet binds it): the
/// agent refuses the swap (`DeviceBusy`); the controller withdraws the
/// go-ahead, drains again (once per cycle), evicts the newcomer and the swap
/// goes on. Before this, the node failed and the rollout halted.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn a_pod_that_reaches_the_node_after_its_drain_is_drained_again() {
    let agent = ttdrv_testkit::SimAgentConfig {
        // Time to put the pod there between the go-ahead and the agent's look.
        holder_check_delay: Duration::from_secs(3),
        ..sim_agent_300ms()
    };
    let (env, ns, nodes, agent) =
        sim_fleet_with("failfast-late", &numbered_nodes(1), &[], agent).await;
    let _running = (controller(&env, &ns), agent);
    // `force`: the newcomer is a bare pod, which the drain evicts only then.
    let policy = installed(&env, &nodes, "upgradePolicy: {drain: {force: true}}", T).await;
    let node = nodes[0].clone();
    let napi: Api<Node> = Api::all(env.client.clone());
    patch_policy(&env, &policy, to_2_8_0()).await;
    let go_ahead =
        |n: &Node| ttdrv_core::node::annotation(n, ttdrv_api::labels::GO_AHEAD).map(String::from);
    ttdrv_testkit::wait_for("the go-ahead", T, || async {
        let n = napi.get(&node).await.map_err(|e| e.to_string())?;
        go_ahead(&n).ok_or_else(|| "none yet".to_string())
    })
    .await;
    device_holder(&env, &ns, "late", &node).await;
    // Sampled until Done: the record went back to Draining (DrainAgain)
    // without a go-ahead on the Node while it drained again.
    let mut drained_again = false;
    let start = Instant::now();
    let done = loop {
        assert!(
            start.elapsed() < T,
            "not Done within {T:?}; drained again: {drained_again}"
        );
        let n = napi.get(&node).await.expect("node");
        let rec = ttdrv_core::node::record(&n)
            .ok()
            .flatten()
            .expect("a record");
        if rec.state == NodeState::Draining && rec.reason.as_deref() == Some("DrainAgain") {
            drained_again = true;
            assert_eq!(go_ahead(&n), None, "no go-ahead while draining again");
            assert!(n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true));
        }
        assert_ne!(rec.state, NodeState::Failed, "{rec:?}");
        if rec.state == NodeState::Done && rec.target == "2.8.0" {
            break n;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        !pod_exists(&env, &ns, "late").await,
        "the newcomer was evicted"
    );
    assert_eq!(
        ttdrv_core::node::label(&done, ttdrv_api::labels::KMD_VERSION),
        Some("2.8.0")
    );
    assert!(
        done.spec.as_ref().and_then(|s| s.unschedulable) != Some(true),
        "back in service"
    );
    // The Event says why, with the agent's words naming the pod.
    let events = policy_events(&env, &policy).await;
    assert!(
        events
            .iter()
            .any(|(r, n)| r == "NodeDrainedAgain" && n.contains(&format!("{ns}/late"))),
        "{events:?}"
    );
    eprintln!(
        "drain again: sampled in Draining/DrainAgain: {drained_again}; Done after {:?}",
        start.elapsed()
    );
    env.teardown().await;
}
