//! Pause that holds, and failures seen within about a minute with their cause:
//! real control plane, the controller binary, the simulated agent.

mod common;

use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::core::v1::Pod;
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
        assert_ne!(
            other,
            Some(NodeState::Cordoning),
            "paused: nothing new starts"
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
/// fails cordoned and the rollout halts.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn crash_looping_installer_fails_the_node_fast() {
    let extra = "upgradePolicy: {prepare: {enabled: false}}";
    let (env, _ns, nodes, policy, _running) = installed_fleet("failfast-crash", 2, extra, T).await;
    env.annotate_node(&nodes[0], CRASH_ANNOTATION, Some("true"))
        .await;
    fails_fast(&env, &policy, &nodes[0], to_2_8_0(), "InstallerCrashLoop").await;
    assert!(
        unschedulable(&env.get_node(&nodes[0]).await),
        "a Failed node stays cordoned"
    );
    let other = node_entry(&env, &policy, &nodes[1]).await.map(|s| s.state);
    assert_eq!(other, Some(NodeState::Pending), "the rollout halts");
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
    env.teardown().await;
}
