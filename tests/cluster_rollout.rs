//! Rollouts on simulated nodes against the real control plane, with the real
//! controller binary and a simulated node agent.

mod common;

use std::time::Duration;

use common::*;
use ttdrv_api::NodeState;
use ttdrv_testkit::TestEnv;

const T: Duration = Duration::from_secs(90);

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn three_node_upgrade_one_at_a_time() {
    let (env, _ns, nodes, policy, _running) = installed_fleet("rollout-3", 3, "", T).await;

    let watcher = CordonWatcher::start(&env);
    tokio::time::sleep(Duration::from_millis(500)).await;
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    wait_nodes_state(&env, &policy, &nodes, NodeState::Done, "2.8.0", T).await;

    assert_done_uncordoned(&env, &nodes, "2.8.0").await;
    assert_eq!(
        watcher.ever(),
        nodes,
        "every node was cordoned for its upgrade"
    );
    assert_eq!(
        watcher.max(),
        1,
        "never more than one node cordoned at once"
    );
    let st = status(&env, &policy).await;
    assert_eq!(st.summary.done, 3);
    assert_eq!(st.desired_version.as_deref(), Some("2.8.0"));
    let ready = st
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status.clone());
    assert_eq!(ready.as_deref(), Some("True"));
    env.teardown().await;
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn admin_cordoned_node_stays_cordoned() {
    let (env, _ns, nodes, policy, _running) =
        installed_fleet("rollout-admin", 3, "upgradePolicy: {maxUnavailable: 2}", T).await;
    env.set_unschedulable(&nodes[1], true).await;
    let watcher = CordonWatcher::start(&env);
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    wait_nodes_state(&env, &policy, &nodes, NodeState::Done, "2.8.0", T).await;
    assert!(
        unschedulable(&env.get_node(&nodes[1]).await),
        "the admin's cordon must survive the upgrade"
    );
    assert!(!unschedulable(&env.get_node(&nodes[0]).await));
    assert!(!unschedulable(&env.get_node(&nodes[2]).await));
    assert!(
        watcher.max() <= 2,
        "admin node + at most one of ours: saw {}",
        watcher.max()
    );
    env.teardown().await;
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn pdb_blocked_drain_fails_after_timeout_and_halts_until_retry() {
    let extra = "upgradePolicy: {drain: {timeoutSeconds: 3}}";
    let (env, ns, nodes, policy, _running) = installed_fleet("rollout-pdb", 2, extra, T).await;
    let pod = hold_drain(&env, &ns, &nodes[0]).await;
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    let failed = wait_node(&env, &policy, &nodes[0], NodeState::Failed, T).await;
    let msg = failed.message.unwrap_or_default();
    assert_eq!(failed.reason.as_deref(), Some("DrainTimeout"));
    assert!(msg.contains(&pod), "failure names the pod {pod}: {msg}");
    assert!(
        msg.contains(&format!("{ns}/guarded")),
        "failure names the PDB: {msg}"
    );
    assert!(msg.contains("retry"), "failure says how to retry: {msg}");
    // The rollout halts: the other node does not start.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let st = status(&env, &policy).await;
    let other = st
        .nodes
        .iter()
        .find(|n| n.name == nodes[1])
        .map(|n| n.state);
    assert_eq!(
        other,
        Some(NodeState::Pending),
        "a Failed node holds the rollout"
    );
    assert!(
        unschedulable(&env.get_node(&nodes[0]).await),
        "a Failed node stays cordoned"
    );
    let degraded = st
        .conditions
        .iter()
        .find(|c| c.type_ == "Degraded")
        .cloned()
        .expect("Degraded condition");
    assert_eq!(degraded.status, "True");
    assert!(degraded.message.contains(&nodes[0]));
    assert!(
        policy_events(&env, &policy)
            .await
            .iter()
            .any(|(r, n)| r == "NodeUpgradeFailed" && n.contains(&nodes[0]))
    );
    // Fix the cause, retry: the rollout finishes.
    release_drain(&env, &ns).await;
    env.annotate_node(&nodes[0], ttdrv_core::node::RETRY_ANNOTATION, Some("1"))
        .await;
    wait_nodes_state(&env, &policy, &nodes, NodeState::Done, "2.8.0", T).await;
    for n in &nodes {
        assert!(
            !unschedulable(&env.get_node(n).await),
            "{n} uncordoned after the retry"
        );
    }
    env.teardown().await;
}

/// Issue 51, item 2: while a PodDisruptionBudget blocks the drain, the node's
/// status says so (reason `EvictionBlocked`, the pod, the budget, the
/// deadline), and one `DrainBlocked` Event, not one per pass, says it with
/// the time left; once the budget goes, the drain finishes.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn pdb_blocked_drain_is_named_while_it_waits() {
    let extra = "upgradePolicy: {drain: {timeoutSeconds: 300}}";
    let (env, ns, nodes, policy, _running) = installed_fleet("rollout-blocked", 1, extra, T).await;
    let node = &nodes[0];
    let pod = hold_drain(&env, &ns, node).await;
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    let entry = async {
        let start = std::time::Instant::now();
        loop {
            let st = status(&env, &policy).await;
            let e = st.nodes.iter().find(|n| &n.name == node).cloned();
            if let Some(e) = e.filter(|e| e.reason.as_deref() == Some("EvictionBlocked")) {
                return e;
            }
            assert!(start.elapsed() < T, "never EvictionBlocked: {:?}", st.nodes);
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    .await;
    assert_eq!(entry.state, NodeState::Draining);
    let msg = entry.message.clone().unwrap_or_default();
    for part in [
        format!("PodDisruptionBudget {ns}/guarded refuses to evict {ns}/{pod}"),
        "The drain times out at ".to_string(),
        "DrainTimeout".to_string(),
    ] {
        assert!(msg.contains(&part), "the message lacks {part:?}: {msg}");
    }
    // Several passes later: still blocked, and still one Event.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let blocked: Vec<String> = policy_events(&env, &policy)
        .await
        .into_iter()
        .filter(|(r, n)| r == "DrainBlocked" && n.contains(node.as_str()))
        .map(|(_, n)| n)
        .collect();
    assert_eq!(blocked.len(), 1, "one DrainBlocked Event: {blocked:?}");
    assert!(
        blocked[0].contains(&format!("{ns}/{pod}"))
            && blocked[0].contains(&format!("{ns}/guarded"))
            && blocked[0].contains("left before the drain times out"),
        "{}",
        blocked[0]
    );
    let st = status(&env, &policy).await;
    let still = st.nodes.iter().find(|n| &n.name == node);
    assert_eq!(
        still.and_then(|n| n.reason.as_deref()),
        Some("EvictionBlocked"),
        "{still:?}"
    );
    release_drain(&env, &ns).await;
    wait_nodes_state(&env, &policy, &nodes, NodeState::Done, "2.8.0", T).await;
    env.teardown().await;
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn bare_pod_is_left_and_reported_without_force() {
    let (env, ns, nodes, policy, _running) = installed_fleet("rollout-bare", 1, "", T).await;
    bare_pod(&env, &ns, "lonely", &nodes[0]).await;
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    wait_nodes_state(&env, &policy, &nodes, NodeState::Done, "2.8.0", T).await;
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(env.client.clone(), &ns);
    let p = pods.get("lonely").await.expect("the bare pod still exists");
    assert!(
        p.metadata.deletion_timestamp.is_none(),
        "the bare pod was not evicted"
    );
    let events = policy_events(&env, &policy).await;
    assert!(
        events
            .iter()
            .any(|(r, n)| r == "PodsNotEvicted" && n.contains("lonely") && n.contains("bare pod")),
        "the skipped bare pod is reported: {events:?}"
    );
    env.teardown().await;
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn pod_selector_limits_the_full_node_pass() {
    let extra = "upgradePolicy: {drain: {podSelectorLabel: \"app=evictme\"}}";
    let (env, ns, nodes, policy, _running) = installed_fleet("rollout-sel", 1, extra, T).await;
    pinned_deployment(&env, &ns, "evictme", &nodes[0]).await;
    pinned_deployment(&env, &ns, "keepme", &nodes[0]).await;
    let uid = |v: Vec<(String, String, String)>| v.first().map(|p| p.1.clone()).unwrap_or_default();
    let (evict0, keep0) = ttdrv_testkit::wait_for("both pods running", T, || async {
        let (a, b) = (
            app_pods(&env, &ns, "evictme").await,
            app_pods(&env, &ns, "keepme").await,
        );
        if a.len() == 1 && b.len() == 1 {
            Ok((uid(a), uid(b)))
        } else {
            Err(format!("{a:?} {b:?}"))
        }
    })
    .await;
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    wait_nodes_state(&env, &policy, &nodes, NodeState::Done, "2.8.0", T).await;
    assert_ne!(
        uid(app_pods(&env, &ns, "evictme").await),
        evict0,
        "the selected pod was evicted (replaced)"
    );
    assert_eq!(
        uid(app_pods(&env, &ns, "keepme").await),
        keep0,
        "the unselected pod was left alone"
    );
    env.teardown().await;
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn drain_disabled_never_cordons() {
    let extra = "upgradePolicy: {drain: {enable: false}}";
    let (env, _ns, nodes, policy, _running) = installed_fleet("rollout-nodrain", 2, extra, T).await;
    let watcher = CordonWatcher::start(&env);
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    wait_nodes_state(&env, &policy, &nodes, NodeState::Done, "2.8.0", T).await;
    assert!(
        watcher.ever().is_empty(),
        "drain.enable=false must not cordon: {:?}",
        watcher.ever()
    );
    env.teardown().await;
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn installer_image_change_restarts_pods_without_cordon() {
    let (env, ns, nodes, policy, _running) = installed_fleet("rollout-image", 3, "", T).await;
    let before: Vec<String> = ds_pods(&env, &ns).await.expect("installer pods");
    let watcher = CordonWatcher::start(&env);
    // Restart-only cycles take a maxUnavailable slot (1 here) like any other:
    // the records on the nodes, seen in the order they were written, never
    // show two at once.
    let safety = SafetyWatcher::start(&env);
    tokio::time::sleep(Duration::from_millis(500)).await;
    patch_policy(
        &env,
        &policy,
        serde_json::json!({ "installer": { "image": "example.invalid/agent:canary" } }),
    )
    .await;
    ttdrv_testkit::wait_for("installer pods replaced with the new image", T, || async {
        let now = ds_pods(&env, &ns).await?;
        let replaced = now.len() == nodes.len() && now.iter().all(|p| !before.contains(p));
        if replaced {
            Ok(())
        } else {
            Err(format!("before {before:?} now {now:?}"))
        }
    })
    .await;
    wait_nodes_state(&env, &policy, &nodes, NodeState::Done, "2.7.0", T).await;
    let seen = safety.seen();
    eprintln!(
        "most restart-only cycles at once: {}",
        seen.max_without_drain
    );
    assert_eq!(
        seen.max_without_drain, 1,
        "one restart-only cycle at a time (maxUnavailable 1): {seen:?}"
    );
    assert!(
        watcher.ever().is_empty(),
        "a restart-only change must not cordon: {:?}",
        watcher.ever()
    );
    env.teardown().await;
}

/// Uids of the Ready installer pods, sorted.
async fn ds_pods(env: &TestEnv, ns: &str) -> Result<Vec<String>, String> {
    let mut v: Vec<String> = env
        .installer_pods(ns, None)
        .await?
        .into_iter()
        .filter(ttdrv_testkit::pod_ready)
        .filter_map(|p| p.metadata.uid)
        .collect();
    v.sort();
    Ok(v)
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn controller_killed_during_draining_resumes() {
    let (env, ns, nodes, policy, (mut ctl, _agent)) =
        installed_fleet("rollout-kill", 2, "", T).await;
    hold_drain(&env, &ns, &nodes[0]).await;
    let watcher = CordonWatcher::start(&env);
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    wait_node(&env, &policy, &nodes[0], NodeState::Draining, T).await;
    ctl.kill();
    release_drain(&env, &ns).await;
    let _ctl2 = controller(&env, &ns);
    wait_nodes_state(&env, &policy, &nodes, NodeState::Done, "2.8.0", T).await;
    assert_done_uncordoned(&env, &nodes, "2.8.0").await;
    assert_eq!(watcher.max(), 1);
    env.teardown().await;
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn max_unavailable_two_over_five_nodes() {
    let (env, _ns, nodes, policy, _running) =
        installed_fleet("rollout-max2", 5, "upgradePolicy: {maxUnavailable: 2}", T).await;
    let watcher = CordonWatcher::start(&env);
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    wait_nodes_state(&env, &policy, &nodes, NodeState::Done, "2.8.0", T).await;
    assert_eq!(watcher.ever().len(), 5);
    assert!(
        watcher.max() <= 2,
        "more than maxUnavailable=2 nodes cordoned at once: {}",
        watcher.max()
    );
    env.teardown().await;
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn downgrade_uses_the_same_flow() {
    let (env, _ns, nodes, policy, _running) = installed_fleet("rollout-down", 2, "", T).await;
    let watcher = CordonWatcher::start(&env);
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.6.1" })).await;
    wait_nodes_state(&env, &policy, &nodes, NodeState::Done, "2.6.1", T).await;
    assert_eq!(watcher.ever(), nodes);
    assert_eq!(watcher.max(), 1);
    env.teardown().await;
}
