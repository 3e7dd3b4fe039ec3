//! Honest labels: after a reboot (a new boot ID) nothing is loaded until the
//! agent says so, and workloads selecting on `kmd-version` must not land on
//! the node before; a Done node stays Done meanwhile. Real control plane, the controller binary, the simulated
//! agent; the test plays the rebooted host.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams};
use ttdrv_api::{NodeState, labels};
use ttdrv_testkit::policy::wait_status;
use ttdrv_testkit::{NOT_READY_LABEL, TestEnv, wait_for};

const T: Duration = Duration::from_secs(90);

/// Plays the kubelet of a (re)booted host: Ready, with this boot ID.
async fn boot(env: &TestEnv, node: &str, boot_id: &str) {
    let api: Api<Node> = Api::all(env.client.clone());
    let now = k8s_openapi::jiff::Timestamp::now()
        .round(k8s_openapi::jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_default();
    let patch = serde_json::json!({ "status": {
        "conditions": [{ "type": "Ready", "status": "True", "reason": "KubeletReady",
                         "lastHeartbeatTime": now, "lastTransitionTime": now }],
        "nodeInfo": { "bootID": boot_id, "machineID": "", "systemUUID": "", "kernelVersion": "",
                      "osImage": "", "containerRuntimeVersion": "", "kubeletVersion": "",
                      "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64" }
    } });
    api.patch_status(node, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .unwrap_or_else(|e| panic!("booting {node}: {e}"));
}

/// Plays the agent reporting what it loaded, at this boot.
async fn report(env: &TestEnv, node: &str, version: &str, boot_id: &str) {
    let api: Api<Node> = Api::all(env.client.clone());
    let patch = serde_json::json!({ "metadata": { "labels": {
        labels::KMD_VERSION: version, labels::KMD_BOOT_ID: boot_id,
    } } });
    api.patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("labelling {node}: {e}"));
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn a_reboot_clears_kmd_version_until_the_agent_reports_again() {
    let (env, ns, nodes, _agent) = sim_fleet("honest-reboot", 1).await;
    let node = nodes[0].clone();
    let _ctl = controller(&env, &ns);
    let policy = env.name("fleet");
    create_policy(&env, &policy, &fleet_spec(&env, "2.8.0", "")).await;
    wait_node_at(&env, &policy, &node, NodeState::Done, Some("2.8.0"), T).await;
    // The host as the test plays it from here on (kwok leaves it alone).
    env.label_node(&node, NOT_READY_LABEL, Some("true")).await;
    boot(&env, &node, "boot-1").await;
    report(&env, &node, "2.8.0", "boot-1").await;
    let watcher = SafetyWatcher::start(&env);
    // Reboot: the kubelet reports a new boot ID; the agent has not spoken yet.
    boot(&env, &node, "boot-2").await;
    wait_for("kmd-version removed after the reboot", T, || async {
        let n = env.get_node(&node).await;
        match kmd(&n) {
            None => Ok(()),
            Some(v) => Err(format!("still {v}")),
        }
    })
    .await;
    // The node stays Done (a reboot is no reason for a cycle), and its
    // status reports no module of an earlier boot.
    let entry = wait_status(
        &env,
        &policy,
        "the status without the last boot's module",
        T,
        |st| match st.nodes.into_iter().find(|e| e.name == node) {
            Some(e) if e.current_version.is_none() => Ok(e),
            other => Err(format!("{other:?}")),
        },
    )
    .await;
    assert_eq!(
        entry.state,
        NodeState::Done,
        "left Done for a reboot: {entry:?}"
    );
    let since = entry.last_transition_time.clone();
    // The agent loads it again (from its cache) and says so: Done, no cordon.
    report(&env, &node, "2.8.0", "boot-2").await;
    let done = wait_status(
        &env,
        &policy,
        "the status with the module of this boot",
        T,
        |st| match st.nodes.into_iter().find(|e| e.name == node) {
            Some(e) if e.current_version.is_some() => Ok(e),
            other => Err(format!("{other:?}")),
        },
    )
    .await;
    assert_eq!(done.state, NodeState::Done);
    assert_eq!(done.current_version.as_deref(), Some("2.8.0"));
    assert_eq!(
        done.last_transition_time, since,
        "the node's state changed across the reboot: {done:?}"
    );
    let seen = watcher.seen();
    assert_eq!(
        seen.max_ready_cordoned_by_us, 0,
        "a reboot needs no cordon: {seen:?}"
    );
    assert!(!unschedulable(&env.get_node(&node).await));
    env.label_node(&node, NOT_READY_LABEL, None).await;
    env.teardown().await;
}
