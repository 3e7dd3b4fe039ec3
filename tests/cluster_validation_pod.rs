//! The user's validation pod (issue 34, `upgradePolicy.validation.podTemplateName`):
//! after the swap validated on the host, a pod of the user's PodTemplate runs
//! on the node, still cordoned; the node goes back into service only when it
//! succeeds, and a failed one fails the node, kept cordoned, and halts the
//! rollout. Real control plane, the controller binary, the simulated agent;
//! the pod's end is played by the test (kwok runs pods, never ends them).

mod common;

use std::time::Duration;

use common::*;
use ttdrv_api::NodeState;

const T: Duration = Duration::from_secs(90);

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn a_node_returns_to_service_only_after_its_validation_pod_succeeds() {
    // The template first: a policy naming a missing one is refused.
    let (env, ns, nodes, policy, _running) = installed_fleet("uservalid-ok", 2, "", T).await;
    validation_template(&env, &ns, "burn-in").await;
    let watcher = SafetyWatcher::start(&env);
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0", "upgradePolicy": { "validation": { "podTemplateName": "burn-in" } } })).await;
    // The first node waits for its pod, cordoned, with the new module.
    let first = &nodes[0];
    let waiting = wait_node(&env, &policy, first, NodeState::Upgrading, T).await;
    let validating = ttdrv_testkit::wait_for("the first node Validating", T, || async {
        match node_entry(&env, &policy, first).await {
            Some(e) if e.reason.as_deref() == Some("Validating") => Ok(e),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    drop(waiting);
    let node = env.get_node(first).await;
    assert!(unschedulable(&node), "cordoned while its pod runs");
    assert_eq!(kmd(&node).as_deref(), Some("2.8.0"));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let still = node_entry(&env, &policy, first).await.map(|e| e.state);
    assert_eq!(
        still,
        Some(NodeState::Upgrading),
        "{validating:?}: waits for the pod"
    );
    // The pods succeed: every node goes back into service.
    let _kubelet = finish_validation_pods(&env, &ns, false);
    wait_nodes_state(&env, &policy, &nodes, NodeState::Done, "2.8.0", T).await;
    assert_done_uncordoned(&env, &nodes, "2.8.0").await;
    // A pod that succeeded is removed.
    ttdrv_testkit::wait_for("validation pods removed", T, || async {
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
            kube::Api::namespaced(env.client.clone(), &ns);
        let left = pods
            .list(&kube::api::ListParams::default().labels(ttdrv_api::labels::VALIDATION_CYCLE))
            .await
            .map(|l| l.items.len())
            .unwrap_or(usize::MAX);
        if left == 0 {
            Ok(())
        } else {
            Err(format!("{left} left"))
        }
    })
    .await;
    watcher.assert_safe(1, None, "user validation");
    env.teardown().await;
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn a_failed_validation_pod_fails_the_node_cordoned_and_halts_the_rollout() {
    let (env, ns, nodes, policy, _running) = installed_fleet("uservalid-bad", 2, "", T).await;
    validation_template(&env, &ns, "burn-in").await;
    let cordons = CordonWatcher::start(&env);
    let _kubelet = finish_validation_pods(&env, &ns, true);
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0", "upgradePolicy": { "validation": { "podTemplateName": "burn-in" } } })).await;
    let first = &nodes[0];
    let failed = wait_node(&env, &policy, first, NodeState::Failed, T).await;
    assert_eq!(
        failed.reason.as_deref(),
        Some("ValidationFailed"),
        "{failed:?}"
    );
    for part in [
        "ttdrv-validate-",
        "exit code 3",
        "matmul mismatch",
        "stays cordoned",
        "retry",
    ] {
        assert_message(&failed, part);
    }
    let node = env.get_node(first).await;
    assert!(unschedulable(&node), "kept cordoned for a person");
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        node_entry(&env, &policy, &nodes[1]).await.map(|e| e.state),
        Some(NodeState::Pending),
        "the rollout halts"
    );
    assert_eq!(cordons.ever(), std::slice::from_ref(first));
    env.teardown().await;
}

/// A validation that cannot run (its PodTemplate does not exist) is found
/// when the policy is read: the policy is refused naming the field, and no
/// node is cordoned for it; once the template exists, the rollout goes on
/// and validates every node.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn a_missing_validation_template_refuses_the_policy_before_any_cordon() {
    let (env, ns, nodes, policy, _running) = installed_fleet("uservalid-none", 2, "", T).await;
    let cordons = CordonWatcher::start(&env);
    patch_policy(
        &env,
        &policy,
        serde_json::json!({ "version": "2.8.0", "upgradePolicy": { "validation": { "podTemplateName": "no-such-template" } } }),
    )
    .await;
    let degraded = ttdrv_testkit::wait_for("the policy refused", T, || async {
        let st = ttdrv_testkit::policy::status(&env, &policy).await;
        match st
            .conditions
            .iter()
            .find(|c| c.type_ == "Degraded" && c.status == "True")
        {
            Some(c) if c.reason == "PolicyRefused" => Ok(c.message.clone()),
            _ => Err(format!("{:?}", st.conditions)),
        }
    })
    .await;
    assert!(
        degraded.contains(&format!(
            "spec.upgradePolicy.validation.podTemplateName: PodTemplate {ns}/no-such-template does not exist"
        )),
        "{degraded}"
    );
    let st = ttdrv_testkit::policy::status(&env, &policy).await;
    assert!(
        st.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "False"),
        "a refused policy is never Ready: {:?}",
        st.conditions
    );
    // Passes go on (resync) and start nothing.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(cordons.ever().is_empty(), "cordoned: {:?}", cordons.ever());
    for n in &nodes {
        assert_eq!(kmd(&env.get_node(n).await).as_deref(), Some("2.7.0"), "{n}");
    }
    // The template appears: the refusal lifts (within the check's hold) and
    // the rollout validates every node.
    validation_template(&env, &ns, "no-such-template").await;
    let _kubelet = finish_validation_pods(&env, &ns, false);
    wait_nodes_state(&env, &policy, &nodes, NodeState::Done, "2.8.0", T).await;
    assert_done_uncordoned(&env, &nodes, "2.8.0").await;
    env.teardown().await;
}
