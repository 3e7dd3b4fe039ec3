//! Deploy gates on the Tenstorrent stack (issue 50, item 2): the telemetry
//! collector and the fabric-manager agent hold the device through
//! `privileged: true` for their pod's life, and only their deploy gates
//! stand them down ([`ttdrv_testkit::stack`], modelling
//! ../shared/design/STACK.md). Real control plane (its DaemonSet controller
//! removes and re-creates their pods as the gate labels change), the
//! controller binary, the simulated agent (which counts a privileged pod on
//! the node as a holder and refuses the swap with `DeviceBusy`).
//!
//! - With both keys in `deployGates` the node upgrades; both pods leave it
//!   during the cycle and come back after.
//! - With the telemetry key only, the fabric-manager DaemonSet and the key it
//!   lacks are named before the cordon (the waiting node's message, one
//!   `UngatedDeviceHolder` Event), and the agent's refusal fails the node
//!   naming the DaemonSet and the key.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::Pod;
use ttdrv_api::NodeState;
use ttdrv_testkit::stack::{self, FABRIC_MANAGER_GATE, TELEMETRY_GATE};
use ttdrv_testkit::{ControllerOptions, TestEnv, wait_for};

const T: Duration = Duration::from_secs(90);

/// The stack's pods on `node` (by DaemonSet name), not being deleted.
async fn stack_pods(env: &TestEnv, ns: &str, node: &str, names: &[String]) -> Vec<String> {
    env.pods_on(ns, node)
        .await
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p: &Pod| {
            let owner = p
                .metadata
                .owner_references
                .iter()
                .flatten()
                .find(|o| o.kind == "DaemonSet")?;
            names.contains(&owner.name).then(|| owner.name.clone())
        })
        .collect()
}

/// Creates both stack DaemonSets in `ns` and waits for their pods on every
/// node; their names.
async fn run_stack(env: &TestEnv, ns: &str, nodes: &[String]) -> [String; 2] {
    let names = [env.name("telemetry"), env.name("fabric")];
    stack::create(env, ns, &stack::telemetry_collector(&env.id, &names[0])).await;
    stack::create(env, ns, &stack::fabric_manager_agent(&env.id, &names[1])).await;
    for n in nodes {
        wait_for(&format!("both stack pods on {n}"), T, || async {
            let on = stack_pods(env, ns, n, &names).await;
            if on.len() == 2 {
                Ok(())
            } else {
                Err(format!("{on:?}"))
            }
        })
        .await;
    }
    names
}

/// The fewest stack pods seen on `node` while it was cordoned, polled
/// until dropped.
fn track_while_cordoned(
    env: &TestEnv,
    ns: &str,
    node: &str,
    names: &[String],
) -> (Arc<Mutex<Option<usize>>>, tokio::task::JoinHandle<()>) {
    let fewest = Arc::new(Mutex::new(None::<usize>));
    let (env, ns, node, names, out) = (
        TestEnv {
            client: env.client.clone(),
            id: env.id.clone(),
        },
        ns.to_string(),
        node.to_string(),
        names.to_vec(),
        fewest.clone(),
    );
    let task = tokio::spawn(async move {
        loop {
            if unschedulable(&env.get_node(&node).await) {
                let n = stack_pods(&env, &ns, &node, &names).await.len();
                if let Ok(mut f) = out.lock() {
                    *f = Some(f.map_or(n, |m: usize| m.min(n)));
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    (fewest, task)
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn with_both_gates_the_stack_leaves_the_node_and_comes_back() {
    let (env, ns, nodes, agent) = sim_fleet("stack-gated", 1).await;
    let _ctl = controller_with(
        &env,
        &ns,
        ControllerOptions {
            extra_args: vec![format!(
                "--deploy-gates={TELEMETRY_GATE},{FABRIC_MANAGER_GATE}"
            )],
            ..Default::default()
        },
    );
    let policy = installed(&env, &nodes, "", T).await;
    let names = run_stack(&env, &ns, &nodes).await;
    let node = nodes[0].clone();
    let (fewest, task) = track_while_cordoned(&env, &ns, &node, &names);
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    wait_nodes_state(&env, &policy, &nodes, NodeState::Done, "2.8.0", T).await;
    task.abort();
    assert_eq!(
        *fewest.lock().expect("lock"),
        Some(0),
        "both stack pods left the cordoned node"
    );
    assert_done_uncordoned(&env, &nodes, "2.8.0").await;
    wait_for("both stack pods back on the node", T, || async {
        let on = stack_pods(&env, &ns, &node, &names).await;
        if on.len() == 2 {
            Ok(())
        } else {
            Err(format!("{on:?}"))
        }
    })
    .await;
    assert!(
        !policy_events(&env, &policy)
            .await
            .iter()
            .any(|(r, _)| r == "UngatedDeviceHolder"),
        "nothing is ungated"
    );
    drop(agent);
    env.teardown().await;
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn without_the_fabric_manager_gate_it_is_named_before_the_cordon_and_in_the_refusal() {
    // The controller's default gates: the telemetry key only.
    let (env, ns, nodes, policy, _running) = installed_fleet("stack-ungated", 2, "", T).await;
    let names = run_stack(&env, &ns, &nodes).await;
    let fabric = format!("{ns}/{}", names[1]);
    let cordons = CordonWatcher::start(&env);
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    // One node goes first (maxUnavailable 1); the other waits, and its
    // message names the DaemonSet and the key it lacks before its cordon.
    let add = format!("add {FABRIC_MANAGER_GATE} to controller.deployGates");
    let waiting = ttdrv_testkit::policy::wait_status(
        &env,
        &policy,
        "a waiting node naming the fabric-manager DaemonSet",
        T,
        |st| {
            st.nodes
                .iter()
                .find(|n| {
                    n.state == NodeState::Pending
                        && n.message.as_deref().is_some_and(|m| {
                            m.contains(&format!("DaemonSet {fabric}")) && m.contains(&add)
                        })
                })
                .map(|n| n.name.clone())
                .ok_or_else(|| format!("{:?}", st.nodes))
        },
    )
    .await;
    assert!(
        !cordons.ever().contains(&waiting),
        "{waiting} was not cordoned yet"
    );
    // The telemetry collector is gated: never named.
    let entry = node_entry(&env, &policy, &waiting).await.expect("entry");
    assert!(
        !entry
            .message
            .as_deref()
            .unwrap_or_default()
            .contains(&names[0]),
        "{entry:?}"
    );
    wait_event(&env, &policy, "UngatedDeviceHolder", T, |n| {
        n.contains(&format!("DaemonSet {fabric}")) && n.contains(&add)
    })
    .await;
    // The node that went first: the agent refuses (the fabric-manager pod
    // stays), drains again once, then fails naming the DaemonSet and key.
    let first = nodes.iter().find(|n| **n != waiting).expect("two nodes");
    let failed = wait_node(&env, &policy, first, NodeState::Failed, T).await;
    assert_eq!(failed.reason.as_deref(), Some("DeviceBusy"), "{failed:?}");
    assert_message(&failed, &format!("is of DaemonSet {fabric}"));
    assert_message(&failed, &add);
    // One Event per node and cycle, not one per pass.
    let per_node = |node: &str| {
        let node = node.to_string();
        move |(r, n): &(String, String)| r == "UngatedDeviceHolder" && n.contains(&node)
    };
    let events = policy_events(&env, &policy).await;
    assert_eq!(
        events.iter().filter(|e| per_node(first)(e)).count(),
        1,
        "{events:?}"
    );
    env.teardown().await;
}
