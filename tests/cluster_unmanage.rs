//! `spec.unmanage` (the Go operator's): the policy's nodes are vacated for
//! DKMS one slot at a time (cordon, drain, unload with the go-ahead) and then
//! left alone: no driver label, schedulable, no gate, no record, no installer
//! pod, the DaemonSet gone. A failed unload halts the others until retried.
//! Real control plane, the controller binary, the simulated agent.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::apps::v1::DaemonSet;
use kube::Api;
use ttdrv_api::{NodeState, labels};
use ttdrv_testkit::sim_agent::{HOST_MANAGED_ANNOTATION, UNLOAD_FAIL_ANNOTATION};
use ttdrv_testkit::{TestEnv, wait_for};

const T: Duration = Duration::from_secs(120);

fn spec(env: &TestEnv) -> String {
    fleet_spec(env, "2.8.0", "upgradePolicy: {maxUnavailable: 1}")
}

/// Waits until every one of `nodes` is Unmanaged in the policy's status and
/// looks [`vacated`].
async fn wait_vacated(env: &TestEnv, policy: &str, nodes: &[String]) {
    for n in nodes {
        wait_node(env, policy, n, NodeState::Unmanaged, T).await;
        wait_for(&format!("{n} vacated"), T, || async {
            vacated(&env.get_node(n).await, policy)
        })
        .await;
    }
}

/// Every status of `policy` written from now on, in order, collected until
/// the returned task is aborted.
type Statuses = std::sync::Arc<std::sync::Mutex<Vec<ttdrv_api::TenstorrentDriverPolicyStatus>>>;
fn watch_statuses(env: &TestEnv, policy: &str) -> (Statuses, tokio::task::JoinHandle<()>) {
    use futures::StreamExt;
    use kube::runtime::watcher;
    let api: Api<ttdrv_api::TenstorrentDriverPolicy> = Api::all(env.client.clone());
    let cfg = watcher::Config::default().fields(&format!("metadata.name={policy}"));
    let seen: Statuses = Default::default();
    let into = seen.clone();
    let task = tokio::spawn(async move {
        let mut stream = ttdrv_testkit::watch_applied(api, cfg);
        while let Some(p) = stream.next().await {
            if let (Some(st), Ok(mut v)) = (p.status, into.lock()) {
                v.push(st);
            }
        }
    });
    (seen, task)
}

/// A managed fleet at 2.8.0 (one node a DKMS host, one with a workload on
/// the device) is switched to `unmanage: true`: every node is vacated, at
/// most one at a time, the DKMS host without a cordon, and nothing swapped.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn unmanage_vacates_every_node_one_at_a_time_and_leaves_them_alone() {
    let (env, ns, nodes, _agent) =
        sim_fleet_at("unmanage", &["n0", "n1", "n2", "dkms"], "2.7.0").await;
    let dkms = nodes[3].clone();
    env.annotate_node(&dkms, HOST_MANAGED_ANNOTATION, Some("2.6.0"))
        .await;
    let _ctl = controller(&env, &ns);
    let policy = env.name("fleet");
    create_policy(&env, &policy, &spec(&env)).await;
    wait_nodes_state(&env, &policy, &nodes[..3], NodeState::Done, "2.8.0", T).await;
    wait_node(&env, &policy, &dkms, NodeState::Done, T).await;
    pinned_deployment(&env, &ns, "trainer", &nodes[1]).await;

    let safety = SafetyWatcher::start(&env);
    let cordons = CordonWatcher::start(&env);
    // Go's recipe "wait for phase=Unmanaged, then install DKMS": the phase
    // must not say Unmanaged while a node is still being vacated. Every
    // status the controller writes is seen through a watch (sampling missed
    // them: the whole vacate takes about a second).
    let (statuses, watching) = watch_statuses(&env, &policy);
    let started = std::time::Instant::now();
    patch_policy(&env, &policy, serde_json::json!({ "unmanage": true })).await;
    for n in &nodes {
        let st = wait_node(&env, &policy, n, NodeState::Unmanaged, T).await;
        let want = if *n == dkms { "HostManaged" } else { "Vacated" };
        assert_eq!(st.reason.as_deref(), Some(want), "{n}: {st:?}");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    watching.abort();
    let seen = statuses.lock().map(|v| v.clone()).unwrap_or_default();
    let mid: Vec<_> = seen
        .iter()
        .filter(|ps| {
            ps.nodes.iter().any(|x| x.state == NodeState::Unmanaged)
                && ps.nodes.iter().any(|x| x.state != NodeState::Unmanaged)
        })
        .collect();
    assert!(
        !mid.is_empty(),
        "no status seen mid-vacate among {} statuses",
        seen.len()
    );
    for ps in &mid {
        assert_ne!(ps.phase.as_deref(), Some("Unmanaged"), "{ps:?}");
    }
    eprintln!(
        "vacated {} nodes (3 cycles, maxUnavailable 1, sim work 300 ms) in {:?}",
        nodes.len(),
        started.elapsed()
    );
    wait_vacated(&env, &policy, &nodes).await;
    // No installer pod left, and the DaemonSet goes.
    let ds_name = format!("ttdrv-{policy}");
    let dss: Api<DaemonSet> = Api::namespaced(env.client.clone(), &ns);
    env.wait_daemonset_gone(&ns, &ds_name, T).await;
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
    let st = status(&env, &policy).await;
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
    env.teardown().await;
}

/// One node's unload fails: it is UnloadFailed, still cordoned, the policy
/// Degraded with an Event; no other node starts. Fixed and retried, the
/// vacate goes on to the end.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn a_failed_unload_halts_the_other_nodes_until_retried() {
    let (env, ns, nodes, _agent) =
        sim_fleet_at("unmanage-fail", &["a-fails", "b", "c"], "2.7.0").await;
    env.annotate_node(&nodes[0], UNLOAD_FAIL_ANNOTATION, Some("true"))
        .await;
    let _ctl = controller(&env, &ns);
    let policy = env.name("fleet");
    create_policy(&env, &policy, &format!("{}\nunmanage: true", spec(&env))).await;
    let failed = wait_node(&env, &policy, &nodes[0], NodeState::UnloadFailed, T).await;
    assert_eq!(failed.reason.as_deref(), Some("UnloadError"), "{failed:?}");
    let msg = failed.message.unwrap_or_default();
    assert!(msg.contains("rmmod") && msg.contains("retry"), "{msg}");
    // Halted: the others do not start.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let st = status(&env, &policy).await;
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
    env.annotate_node(&nodes[0], UNLOAD_FAIL_ANNOTATION, None)
        .await;
    env.annotate_node(&nodes[0], ttdrv_core::node::RETRY_ANNOTATION, Some("1"))
        .await;
    wait_vacated(&env, &policy, &nodes).await;
    env.teardown().await;
}
