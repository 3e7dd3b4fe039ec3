//! Verified upgrades (issue 34): a new module that loads but fails the
//! agent's validation is rolled back and its node returned to service, or
//! held cordoned for a person; either way the node is Failed with
//! `ValidationFailed` and the rollout halts. Real control plane, the
//! controller binary, the simulated agent (`sim.ttdrv.io/validation-fails`).

mod common;

use std::time::Duration;

use common::*;
use ttdrv_api::NodeState;
use ttdrv_testkit::sim_agent::VALIDATION_FAILS_ANNOTATION;

const T: Duration = Duration::from_secs(90);

/// Nothing but `node` was ever cordoned, and the other nodes are still
/// Pending at 2.7.0: the rollout halted at the failed node.
async fn halted_at(
    env: &ttdrv_testkit::TestEnv,
    policy: &str,
    nodes: &[String],
    node: &str,
    cordons: &CordonWatcher,
) {
    // A few passes of the controller, to see that nothing else starts.
    tokio::time::sleep(Duration::from_secs(4)).await;
    for other in nodes.iter().filter(|n| *n != node) {
        let st = node_entry(env, policy, other).await.map(|s| s.state);
        assert_eq!(st, Some(NodeState::Pending), "{other}: the rollout halts");
        assert_eq!(kmd(&env.get_node(other).await).as_deref(), Some("2.7.0"));
    }
    let ever = cordons.ever();
    assert!(
        ever.iter().all(|n| n == node),
        "only the failed node was ever cordoned: {ever:?}"
    );
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn a_failed_validation_rolls_back_returns_the_node_and_halts_then_retry_upgrades() {
    let (env, _ns, nodes, policy, _running) = installed_fleet("verified-rollback", 3, "", T).await;
    let first = nodes[0].clone();
    env.annotate_node(&first, VALIDATION_FAILS_ANNOTATION, Some("2.8.0"))
        .await;
    let watcher = SafetyWatcher::start(&env);
    let cordons = CordonWatcher::start(&env);
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    let failed = wait_node(&env, &policy, &first, NodeState::Failed, T).await;
    assert_eq!(
        failed.reason.as_deref(),
        Some("ValidationFailed"),
        "{failed:?}"
    );
    assert_message(&failed, "back in service on tt-kmd 2.7.0");
    assert_message(&failed, "rolled back");
    assert_message(&failed, "retry");
    // Back in service on the version it had: uncordoned, gates open.
    let node = env.get_node(&first).await;
    assert!(!unschedulable(&node), "the rolled-back node is uncordoned");
    assert!(gate_labels(&node).is_empty(), "{:?}", gate_labels(&node));
    assert_eq!(kmd(&node).as_deref(), Some("2.7.0"));
    assert!(
        cordons.ever().contains(&first),
        "it was cordoned for the swap"
    );
    wait_event(&env, &policy, "NodeRolledBack", T, |n| n.contains(&first)).await;
    halted_at(&env, &policy, &nodes, &first, &cordons).await;
    // The fix (a version that serves the cards), then a retry: the node
    // upgrades and the rollout goes on.
    env.annotate_node(&first, VALIDATION_FAILS_ANNOTATION, None)
        .await;
    env.annotate_node(&first, ttdrv_core::node::RETRY_ANNOTATION, Some("1"))
        .await;
    wait_nodes_state(&env, &policy, &nodes, NodeState::Done, "2.8.0", T).await;
    assert_done_uncordoned(&env, &nodes, "2.8.0").await;
    watcher.assert_safe(1, None, "rollback, halt, retry");
    env.teardown().await;
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn hold_keeps_the_failed_node_cordoned_on_the_new_version() {
    let extra = "upgradePolicy: {onValidationFailure: hold}";
    let (env, _ns, nodes, policy, _running) = installed_fleet("verified-hold", 2, extra, T).await;
    let first = nodes[0].clone();
    env.annotate_node(&first, VALIDATION_FAILS_ANNOTATION, Some("2.8.0"))
        .await;
    let watcher = SafetyWatcher::start(&env);
    let cordons = CordonWatcher::start(&env);
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    let failed = wait_node(&env, &policy, &first, NodeState::Failed, T).await;
    assert_eq!(
        failed.reason.as_deref(),
        Some("ValidationFailed"),
        "{failed:?}"
    );
    assert_message(&failed, "hold");
    let node = env.get_node(&first).await;
    assert!(unschedulable(&node), "held: the node stays cordoned");
    assert!(
        !gate_labels(&node).is_empty(),
        "held: its gates stay closed"
    );
    assert_eq!(kmd(&node).as_deref(), Some("2.8.0"));
    halted_at(&env, &policy, &nodes, &first, &cordons).await;
    assert!(
        !policy_events(&env, &policy)
            .await
            .iter()
            .any(|(r, _)| r == "NodeRolledBack"),
        "nothing was rolled back"
    );
    watcher.assert_safe(1, None, "held");
    env.teardown().await;
}
