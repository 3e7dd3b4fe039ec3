//! Pause that holds, and failures seen within about a minute with their cause:
//! real control plane, the controller binary, the simulated agent.

mod common;

use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use ttdrv_api::NodeState;
use ttdrv_testkit::sim_agent::CRASH_ANNOTATION;
use ttdrv_testkit::{TestEnv, wait_for};

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

async fn state_of(env: &TestEnv, policy: &str, node: &str) -> Option<ttdrv_api::NodeStatus> {
    get_policy(env, policy)
        .await
        .status
        .unwrap_or_default()
        .nodes
        .into_iter()
        .find(|n| n.name == node)
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn pause_during_a_blocked_drain_holds_and_resume_continues() {
    let (env, ns, nodes, _agent) = sim_fleet("failfast-pause", 2).await;
    let _ctl = controller(&env, &ns);
    let policy = installed(
        &env,
        &nodes,
        "upgradePolicy: {drain: {timeoutSeconds: 6}}",
        T,
    )
    .await;
    pinned_deployment(&env, &ns, "guarded", &nodes[0]).await;
    pdb(&env, &ns, "guarded").await;
    let guarded = app_pods(&env, &ns, "guarded")
        .await
        .first()
        .map(|p| p.0.clone())
        .expect("guarded pod");
    let watcher = SafetyWatcher::start(&env);
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    wait_node(&env, &policy, &nodes[0], NodeState::Draining, T).await;
    patch_policy(&env, &policy, serde_json::json!({ "paused": true })).await;
    // The controller has seen the pause once it says so (an eviction retry
    // it sent before that could otherwise meet the PDB gone).
    wait_for("the Paused condition", T, || async {
        let p = ttdrv_testkit::policy::get_policy(&env, &policy).await;
        let paused = p.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Paused" && c.status == "True")
        });
        if paused {
            Ok(())
        } else {
            Err("not yet".to_string())
        }
    })
    .await;
    // The PDB goes away while paused: nothing may be evicted until resume.
    let pdbs: Api<k8s_openapi::api::policy::v1::PodDisruptionBudget> =
        Api::namespaced(env.client.clone(), &ns);
    pdbs.delete("guarded", &Default::default())
        .await
        .expect("delete PDB");
    // Well past the 6 s drain deadline.
    let paused_at = Instant::now();
    while paused_at.elapsed() < Duration::from_secs(12) {
        let st = state_of(&env, &policy, &nodes[0]).await;
        assert_eq!(
            st.as_ref().map(|s| s.state),
            Some(NodeState::Draining),
            "paused: the node holds where it is (no Failed, no Upgrading): {st:?}"
        );
        assert!(
            pod_exists(&env, &ns, &guarded).await,
            "paused: {guarded} must not be evicted"
        );
        let other = state_of(&env, &policy, &nodes[1]).await.map(|s| s.state);
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
    let seen = watcher.seen();
    assert!(seen.max_ready_cordoned_by_us <= 1, "{seen:?}");
    assert!(seen.swaps_without_go_ahead.is_empty(), "{seen:?}");
    for n in &nodes {
        assert!(!unschedulable(&env.get_node(n).await), "{n} uncordoned");
    }
    delete_policies(&env).await;
    env.cleanup().await;
}

/// Changes the policy and measures how long until `node` is Failed.
async fn time_to_failed(
    env: &TestEnv,
    policy: &str,
    node: &str,
    patch: serde_json::Value,
) -> (Duration, ttdrv_api::NodeStatus) {
    let start = Instant::now();
    patch_policy(env, policy, patch).await;
    let failed = wait_node(env, policy, node, NodeState::Failed, T).await;
    (start.elapsed(), failed)
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn unpullable_installer_image_fails_the_node_fast() {
    let (env, ns, nodes, _agent) = sim_fleet("failfast-image", 2).await;
    let _ctl = controller(&env, &ns);
    let policy = installed(&env, &nodes, "", T).await;
    let (took, failed) = time_to_failed(
        &env,
        &policy,
        &nodes[0],
        serde_json::json!({ "version": "2.8.0",
                            "installer": { "image": "registry.invalid/tt-agent-unpullable:1" } }),
    )
    .await;
    eprintln!("unpullable image: {} Failed after {took:?}", nodes[0]);
    assert_eq!(failed.reason.as_deref(), Some("InstallerImagePull"));
    let msg = failed.message.unwrap_or_default();
    assert!(msg.contains("unpullable"), "names the image: {msg}");
    assert!(took < Duration::from_secs(90), "took {took:?}");
    delete_policies(&env).await;
    env.cleanup().await;
}

async fn crash_annotate(env: &TestEnv, node: &str) {
    let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(env.client.clone());
    let patch = serde_json::json!({ "metadata": { "annotations": { CRASH_ANNOTATION: "true" } } });
    api.patch(node, &Default::default(), &kube::api::Patch::Merge(&patch))
        .await
        .expect("annotate");
}

/// Without build-ahead the crash loop comes inside the cycle: the node
/// fails cordoned and the rollout halts.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn crash_looping_installer_fails_the_node_fast() {
    let (env, ns, nodes, _agent) = sim_fleet("failfast-crash", 2).await;
    let _ctl = controller(&env, &ns);
    let policy = installed(
        &env,
        &nodes,
        "upgradePolicy: {prepare: {enabled: false}}",
        T,
    )
    .await;
    crash_annotate(&env, &nodes[0]).await;
    let (took, failed) = time_to_failed(
        &env,
        &policy,
        &nodes[0],
        serde_json::json!({ "version": "2.8.0" }),
    )
    .await;
    eprintln!("crash loop: {} Failed after {took:?}", nodes[0]);
    assert_eq!(failed.reason.as_deref(), Some("InstallerCrashLoop"));
    assert!(took < Duration::from_secs(90), "took {took:?}");
    assert!(
        unschedulable(&env.get_node(&nodes[0]).await),
        "a Failed node stays cordoned"
    );
    let other = state_of(&env, &policy, &nodes[1]).await.map(|s| s.state);
    assert_eq!(other, Some(NodeState::Pending), "the rollout halts");
    delete_policies(&env).await;
    env.cleanup().await;
}

/// With build-ahead (the default) the new installer crash-loops while the
/// node still serves: the node fails without ever being cordoned.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn crash_looping_installer_fails_its_node_ahead_of_the_cordon() {
    let (env, ns, nodes, _agent) = sim_fleet("failfast-crash-ahead", 1).await;
    let _ctl = controller(&env, &ns);
    let policy = installed(&env, &nodes, "", T).await;
    crash_annotate(&env, &nodes[0]).await;
    let cordons = CordonWatcher::start(&env);
    let (took, failed) = time_to_failed(
        &env,
        &policy,
        &nodes[0],
        serde_json::json!({ "version": "2.8.0" }),
    )
    .await;
    eprintln!("crash loop ahead: {} Failed after {took:?}", nodes[0]);
    assert_eq!(failed.reason.as_deref(), Some("InstallerCrashLoop"));
    assert!(
        failed
            .message
            .as_deref()
            .is_some_and(|m| m.contains("not cordoned")),
        "{failed:?}"
    );
    assert!(cordons.ever().is_empty(), "cordoned: {:?}", cordons.ever());
    assert_eq!(
        kmd(&env.get_node(&nodes[0]).await).as_deref(),
        Some("2.7.0")
    );
    delete_policies(&env).await;
    env.cleanup().await;
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn device_busy_fails_the_node_with_the_holders() {
    let (env, ns, nodes, _agent) = sim_fleet("failfast-busy", 1).await;
    let _ctl = controller(&env, &ns);
    let policy = installed(&env, &nodes, "", T).await;
    device_holder(&env, &ns, "holder", &nodes[0]).await;
    let (took, failed) = time_to_failed(
        &env,
        &policy,
        &nodes[0],
        serde_json::json!({ "version": "2.8.0" }),
    )
    .await;
    eprintln!("device busy: {} Failed after {took:?}", nodes[0]);
    assert_eq!(failed.reason.as_deref(), Some("DeviceBusy"));
    let msg = failed.message.unwrap_or_default();
    assert!(
        msg.contains(&format!("{ns}/holder")),
        "names the holder: {msg}"
    );
    assert!(took < Duration::from_secs(90), "took {took:?}");
    assert!(
        policy_events(&env, &policy)
            .await
            .iter()
            .any(|(r, n)| r == "NodeUpgradeFailed" && n.contains(&format!("{ns}/holder"))),
        "the Event carries the agent's words"
    );
    delete_policies(&env).await;
    env.cleanup().await;
}
