//! `spec.unmanage` (the Go operator's): the policy's nodes are vacated for
//! DKMS one slot at a time (cordon, drain, unload with the go-ahead) and then
//! left alone: no driver label, schedulable, no gate, no record, no installer
//! pod, the DaemonSet gone. A failed unload halts the others until retried.
//! Real control plane, the controller binary, the simulated agent.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams};
use ttdrv_api::{NodeState, labels};
use ttdrv_testkit::sim_agent::{HOST_MANAGED_ANNOTATION, UNLOAD_FAIL_ANNOTATION};
use ttdrv_testkit::{TestEnv, wait_for};

const T: Duration = Duration::from_secs(120);

fn spec(env: &TestEnv) -> String {
    format!(
        "version: \"2.8.0\"\nnodeAffinity: {{matchLabels: {{ttdrv-test: {}}}}}\nupgradePolicy: {{maxUnavailable: 1}}",
        env.id
    )
}

async fn annotate(env: &TestEnv, node: &str, key: &str, value: Option<&str>) {
    let api: Api<Node> = Api::all(env.client.clone());
    let patch = serde_json::json!({ "metadata": { "annotations": { key: value } } });
    api.patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("annotating node");
}

/// A managed fleet at 2.8.0 (one node a DKMS host, one with a workload on
/// the device) is switched to `unmanage: true`: every node is vacated, at
/// most one at a time, the DKMS host without a cordon, and nothing swapped.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn unmanage_vacates_every_node_one_at_a_time_and_leaves_them_alone() {
    let (env, ns, nodes, _agent) = sim_fleet_with(
        "unmanage",
        &["n0", "n1", "n2", "dkms"],
        &[(labels::KMD_VERSION, "2.7.0")],
        sim_agent_300ms(),
    )
    .await;
    let dkms = nodes[3].clone();
    annotate(&env, &dkms, HOST_MANAGED_ANNOTATION, Some("2.6.0")).await;
    let _ctl = controller(&env, &ns);
    let policy = env.name("fleet");
    create_policy(&env, &policy, &spec(&env)).await;
    wait_nodes_state(&env, &policy, &nodes[..3], NodeState::Done, "2.8.0", T).await;
    wait_node(&env, &policy, &dkms, NodeState::Done, T).await;
    pinned_deployment(&env, &ns, "trainer", &nodes[1]).await;

    let safety = SafetyWatcher::start(&env);
    let cordons = CordonWatcher::start(&env);
    let started = std::time::Instant::now();
    patch_policy(&env, &policy, serde_json::json!({ "unmanage": true })).await;
    for n in &nodes {
        let st = wait_node(&env, &policy, n, NodeState::Unmanaged, T).await;
        let want = if *n == dkms { "HostManaged" } else { "Vacated" };
        assert_eq!(st.reason.as_deref(), Some(want), "{n}: {st:?}");
    }
    eprintln!(
        "vacated {} nodes (3 cycles, maxUnavailable 1, sim work 300 ms) in {:?}",
        nodes.len(),
        started.elapsed()
    );
    for n in &nodes {
        wait_for(&format!("{n} vacated"), T, || async {
            vacated(&env.get_node(n).await, &policy)
        })
        .await;
    }
    // No installer pod left, and the DaemonSet goes.
    let ds_name = format!("ttdrv-{policy}");
    let dss: Api<DaemonSet> = Api::namespaced(env.client.clone(), &ns);
    wait_for("the DaemonSet deleted", T, || async {
        match dss.get_opt(&ds_name).await {
            Ok(None) => Ok(()),
            other => Err(format!("{:?}", other.map(|d| d.is_some()))),
        }
    })
    .await;
    for n in &nodes {
        wait_for(&format!("no installer pod on {n}"), T, || async {
            let pods = env.pods_on(&ns, n).await;
            let installers: Vec<_> = pods
                .iter()
                .filter(|p| {
                    p.metadata
                        .labels
                        .as_ref()
                        .is_some_and(|l| l.contains_key(labels::CLAIM))
                })
                .filter_map(|p| p.metadata.name.clone())
                .collect();
            if installers.is_empty() {
                Ok(())
            } else {
                Err(format!("{installers:?}"))
            }
        })
        .await;
    }
    // The workload was drained off its node, and is back somewhere schedulable.
    let st = get_policy(&env, &policy).await.status.unwrap_or_default();
    assert_eq!(st.phase.as_deref(), Some("Unmanaged"), "{st:?}");
    let seen = safety.seen();
    assert!(
        seen.max_ready_cordoned_by_us <= 1 && seen.max_in_cycle <= 1,
        "maxUnavailable 1 held: {seen:?}"
    );
    assert!(seen.swaps.is_empty(), "nothing was swapped: {seen:?}");
    let cordoned = cordons.ever();
    assert!(
        !cordoned.contains(&dkms),
        "the DKMS host is never cordoned: {cordoned:?}"
    );
    assert_eq!(
        cordoned.len(),
        3,
        "every container-managed node was cordoned for its unload: {cordoned:?}"
    );
    let events = policy_events(&env, &policy).await;
    for n in &nodes {
        assert!(
            events
                .iter()
                .any(|(r, note)| r == "NodeUnmanaged" && note.contains(n.as_str())),
            "{n}: no NodeUnmanaged Event: {events:?}"
        );
    }
    // Left alone: a restarted controller writes nothing to the vacated nodes.
    let before: Vec<Option<String>> = futures::future::join_all(
        nodes
            .iter()
            .map(|n| async { env.get_node(n).await.metadata.resource_version }),
    )
    .await;
    drop(_ctl);
    let _ctl = controller(&env, &ns);
    for n in &nodes {
        wait_node(&env, &policy, n, NodeState::Unmanaged, T).await;
    }
    let after: Vec<Option<String>> = futures::future::join_all(
        nodes
            .iter()
            .map(|n| async { env.get_node(n).await.metadata.resource_version }),
    )
    .await;
    // kwok heartbeats touch Node status, not its labels or annotations.
    for ((n, b), a) in nodes.iter().zip(&before).zip(&after) {
        if a != b {
            vacated(&env.get_node(n).await, &policy)
                .unwrap_or_else(|e| panic!("{n} touched after a restart: {e}"));
        }
    }
    assert!(
        dss.get_opt(&ds_name).await.ok().flatten().is_none(),
        "the DaemonSet stays gone"
    );
    delete_policies(&env).await;
    env.cleanup().await;
}

/// One node's unload fails: it is UnloadFailed, still cordoned, the policy
/// Degraded with an Event; no other node starts. Fixed and retried, the
/// vacate goes on to the end.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn a_failed_unload_halts_the_other_nodes_until_retried() {
    let (env, ns, nodes, _agent) = sim_fleet_with(
        "unmanage-fail",
        &["a-fails", "b", "c"],
        &[(labels::KMD_VERSION, "2.7.0")],
        sim_agent_300ms(),
    )
    .await;
    annotate(&env, &nodes[0], UNLOAD_FAIL_ANNOTATION, Some("true")).await;
    let _ctl = controller(&env, &ns);
    let policy = env.name("fleet");
    create_policy(&env, &policy, &format!("{}\nunmanage: true", spec(&env))).await;
    let failed = wait_node(&env, &policy, &nodes[0], NodeState::UnloadFailed, T).await;
    assert_eq!(failed.reason.as_deref(), Some("UnloadError"), "{failed:?}");
    let msg = failed.message.unwrap_or_default();
    assert!(msg.contains("rmmod") && msg.contains("retry"), "{msg}");
    // Halted: the others do not start.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let st = get_policy(&env, &policy).await.status.unwrap_or_default();
    for n in &nodes[1..] {
        let state = st.nodes.iter().find(|e| e.name == *n).map(|e| e.state);
        assert_eq!(state, Some(NodeState::Pending), "{n} held: {st:?}");
        assert!(!unschedulable(&env.get_node(n).await), "{n} not cordoned");
    }
    assert!(
        unschedulable(&env.get_node(&nodes[0]).await),
        "an UnloadFailed node stays cordoned"
    );
    assert_eq!(st.phase.as_deref(), Some("Degraded"), "{st:?}");
    let degraded = st
        .conditions
        .iter()
        .find(|c| c.type_ == "Degraded")
        .expect("Degraded condition");
    assert_eq!(degraded.status, "True");
    assert!(
        policy_events(&env, &policy)
            .await
            .iter()
            .any(|(r, n)| r == "NodeUnloadFailed" && n.contains(&nodes[0]))
    );
    // Fixed and retried: every node ends vacated.
    annotate(&env, &nodes[0], UNLOAD_FAIL_ANNOTATION, None).await;
    annotate(&env, &nodes[0], "driver.tenstorrent.com/retry", Some("1")).await;
    for n in &nodes {
        wait_node(&env, &policy, n, NodeState::Unmanaged, T).await;
        wait_for(&format!("{n} vacated"), T, || async {
            vacated(&env.get_node(n).await, &policy)
        })
        .await;
    }
    delete_policies(&env).await;
    env.cleanup().await;
}
