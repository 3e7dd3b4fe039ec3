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
//! - With the telemetry key only (the Go operator's default), the
//!   fabric-manager DaemonSet and the key it
//!   lacks are named before the cordon (the waiting node's message, one
//!   `UngatedDeviceHolder` Event), and the agent's refusal fails the node
//!   naming the DaemonSet and the key.
//! - A firmware flash stands the stack down the same way: the gates close
//!   with its cordon, its flash Job is created only once both pods have left
//!   the node, and they come back after its uncordon.

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

/// Creates both stack DaemonSets in `ns`, the fabric-manager agent only on
/// `fabric_on` (every node when `None`), and waits for their pods; their
/// names.
async fn run_stack(
    env: &TestEnv,
    ns: &str,
    nodes: &[String],
    fabric_on: Option<&str>,
) -> [String; 2] {
    let names = [env.name("telemetry"), env.name("fabric")];
    stack::create(env, ns, &stack::telemetry_collector(&env.id, &names[0])).await;
    let mut fabric = stack::fabric_manager_agent(&env.id, &names[1]);
    if let (Some(node), Some(spec)) = (
        fabric_on,
        fabric.spec.as_mut().and_then(|s| s.template.spec.as_mut()),
    ) {
        spec.node_selector
            .get_or_insert_default()
            .insert("kubernetes.io/hostname".into(), node.into());
    }
    stack::create(env, ns, &fabric).await;
    for n in nodes {
        let want = if fabric_on.is_none_or(|f| f == n) {
            2
        } else {
            1
        };
        wait_for(&format!("{want} stack pods on {n}"), T, || async {
            let on = stack_pods(env, ns, n, &names).await;
            if on.len() == want {
                Ok(())
            } else {
                Err(format!("{on:?}"))
            }
        })
        .await;
    }
    names
}

/// The fewest stack pods seen on `node` while it was cordoned. Driven by
/// two watches (the node; the namespace's pods on it), not by polling: every
/// change is seen however slow the API server is, and a watch error re-lists
/// after a backoff instead of ending the tracker.
fn track_while_cordoned(
    env: &TestEnv,
    ns: &str,
    node: &str,
    names: &[String],
) -> (Arc<Mutex<Option<usize>>>, tokio::task::JoinHandle<()>) {
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::Node;
    use kube::Api;
    use kube::runtime::{WatchStreamExt, watcher};
    use std::collections::BTreeSet;

    enum Seen {
        Cordoned(bool),
        Pods(Box<watcher::Event<Pod>>),
    }
    let fewest = Arc::new(Mutex::new(None::<usize>));
    let nodes: Api<Node> = Api::all(env.client.clone());
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), ns);
    let node_cfg = watcher::Config::default().fields(&format!("metadata.name={node}"));
    let pod_cfg = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let node_events = watcher(nodes, node_cfg)
        .default_backoff()
        .applied_objects()
        .filter_map(|n| async move { n.ok().map(|n| Seen::Cordoned(unschedulable(&n))) });
    let pod_events = watcher(pods, pod_cfg)
        .default_backoff()
        .filter_map(|e| async move { e.ok().map(|e| Seen::Pods(Box::new(e))) });
    let (names, out) = (names.to_vec(), fewest.clone());
    let task = tokio::spawn(async move {
        let stack_pod = |p: &Pod| {
            p.metadata.deletion_timestamp.is_none()
                && p.metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|o| o.kind == "DaemonSet" && names.contains(&o.name))
        };
        let (mut cordoned, mut on, mut relist) = (false, BTreeSet::new(), BTreeSet::new());
        // Nothing is counted before the pods' first list is whole: an empty
        // set then would be a zero never seen.
        let mut listed = false;
        let mut events = futures::stream::select(node_events.boxed(), pod_events.boxed());
        while let Some(seen) = events.next().await {
            let pods = match seen {
                Seen::Cordoned(c) => {
                    cordoned = c;
                    None
                }
                Seen::Pods(e) => Some(*e),
            };
            match pods {
                None => {}
                Some(watcher::Event::Apply(p)) => {
                    let uid = p.metadata.uid.clone().unwrap_or_default();
                    if stack_pod(&p) {
                        on.insert(uid);
                    } else {
                        on.remove(&uid);
                    }
                }
                Some(watcher::Event::Delete(p)) => {
                    on.remove(&p.metadata.uid.clone().unwrap_or_default());
                }
                Some(watcher::Event::Init) => relist.clear(),
                Some(watcher::Event::InitApply(p)) if stack_pod(&p) => {
                    relist.insert(p.metadata.uid.clone().unwrap_or_default());
                }
                Some(watcher::Event::InitApply(_)) => {}
                Some(watcher::Event::InitDone) => {
                    on = std::mem::take(&mut relist);
                    listed = true;
                }
            }
            if cordoned
                && listed
                && let Ok(mut f) = out.lock()
            {
                *f = Some(f.map_or(on.len(), |m: usize| m.min(on.len())));
            }
        }
    });
    (fewest, task)
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn with_both_gates_the_stack_leaves_the_node_and_comes_back() {
    // A swap of 3 s: the node stays cordoned long enough to be seen without
    // the stack's pods.
    let (env, ns, nodes, agent) = sim_fleet_with(
        "stack-gated",
        &numbered_nodes(1),
        &[],
        ttdrv_testkit::SimAgentConfig {
            work: Duration::from_secs(3),
            ..Default::default()
        },
    )
    .await;
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
    let names = run_stack(&env, &ns, &nodes, None).await;
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
    // The Go operator's default gates, kept by a user who migrated: the
    // telemetry key only.
    // A swap of 3 s: the first node's cycle outlasts the policy status's
    // one-second write pacing, so the second node's wait is seen in it.
    let (env, ns, nodes, _agent) = sim_fleet_with(
        "stack-ungated",
        &numbered_nodes(2),
        &[],
        ttdrv_testkit::SimAgentConfig {
            work: Duration::from_secs(3),
            ..Default::default()
        },
    )
    .await;
    let _ctl = controller_with(
        &env,
        &ns,
        ControllerOptions {
            extra_args: vec![format!("--deploy-gates={TELEMETRY_GATE}")],
            ..Default::default()
        },
    );
    let policy = installed(&env, &nodes, "", T).await;
    // The fabric-manager agent runs on the second node only: the first
    // upgrades (its telemetry collector is gated), the second waits for it.
    let (first, second) = (nodes[0].clone(), nodes[1].clone());
    let names = run_stack(&env, &ns, &nodes, Some(&second)).await;
    let fabric = format!("{ns}/{}", names[1]);
    let cordons = CordonWatcher::start(&env);
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    // While the first node cycles (maxUnavailable 1), the second waits, and
    // its message names the DaemonSet and the key it lacks before its cordon.
    let add = format!("add {FABRIC_MANAGER_GATE} to controller.deployGates");
    let names_fabric = |m: &str| m.contains(&format!("DaemonSet {fabric}")) && m.contains(&add);
    let waiting = ttdrv_testkit::policy::wait_status(
        &env,
        &policy,
        "the waiting node's message naming the fabric-manager DaemonSet",
        T,
        |st| {
            st.nodes
                .iter()
                .find(|n| n.name == second && n.state == NodeState::Pending)
                .and_then(|n| n.message.clone())
                .filter(|m| names_fabric(m))
                .ok_or_else(|| format!("{:?}", st.nodes))
        },
    )
    .await;
    // (Its record said so in Pending: written before the step that cordons
    // it. The policy status trails the records by up to a second, so the
    // cordon watcher may already have seen the cordon by now.)
    // The telemetry collector is gated: never named.
    assert!(!waiting.contains(&names[0]), "{waiting}");
    // The first node, with no ungated holder, upgrades and is never named.
    wait_nodes_state(
        &env,
        &policy,
        std::slice::from_ref(&first),
        NodeState::Done,
        "2.8.0",
        T,
    )
    .await;
    // The second gets its slot and is cordoned all the same (a warning);
    // the agent refuses (the fabric-manager pod stays), the node drains
    // again once, then fails naming the DaemonSet and the key.
    let failed = wait_node(&env, &policy, &second, NodeState::Failed, T).await;
    assert!(
        cordons.ever().contains(&second),
        "the warning held nothing back"
    );
    assert_eq!(failed.reason.as_deref(), Some("DeviceBusy"), "{failed:?}");
    assert_message(&failed, &format!("is of DaemonSet {fabric}"));
    assert_message(&failed, &add);
    // One Event for the second node (while it waited, not again at its
    // cordon), none for the first.
    wait_event(&env, &policy, "UngatedDeviceHolder", T, |n| {
        n.contains(&second) && names_fabric(n)
    })
    .await;
    let events = policy_events(&env, &policy).await;
    let about = |node: &str| {
        events
            .iter()
            .filter(|(r, n)| r == "UngatedDeviceHolder" && n.contains(&format!("node {node}:")))
            .count()
    };
    assert_eq!((about(&first), about(&second)), (0, 1), "{events:?}");
    env.teardown().await;
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn a_firmware_flash_stands_the_stack_down_before_its_job() {
    use k8s_openapi::api::batch::v1::Job;
    use ttdrv_api::firmware::{FirmwareNodeState, labels as fw};
    let (env, ns, nodes, _agent) = flashing_fleet("stack-fw").await;
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
    let names = run_stack(&env, &ns, &nodes, None).await;
    let node = nodes[0].clone();
    // The stack pods on the node whenever a flash Job for it exists and the
    // node is still cordoned.
    let seen_with_job = Arc::new(Mutex::new(Vec::<usize>::new()));
    let probe = {
        let (env, ns, node, names, out) = (
            TestEnv {
                client: env.client.clone(),
                id: env.id.clone(),
            },
            ns.clone(),
            node.clone(),
            names.to_vec(),
            seen_with_job.clone(),
        );
        tokio::spawn(async move {
            let jobs: kube::Api<Job> = kube::Api::namespaced(env.client.clone(), &ns);
            let nodes: kube::Api<k8s_openapi::api::core::v1::Node> =
                kube::Api::all(env.client.clone());
            let pods: kube::Api<Pod> = kube::Api::namespaced(env.client.clone(), &ns);
            let on_node = kube::api::ListParams::default().fields(&format!("spec.nodeName={node}"));
            loop {
                // A failed read (the API server slow under load) is a
                // sample missed, never the probe's end.
                let lp = kube::api::ListParams::default().labels(fw::JOB_POLICY);
                let has_job = jobs.list(&lp).await.is_ok_and(|l| !l.items.is_empty());
                let cordoned = nodes.get(&node).await.is_ok_and(|n| unschedulable(&n));
                // Until the uncordon (the gates open in the same write).
                if has_job
                    && cordoned
                    && let Ok(list) = pods.list(&on_node).await
                {
                    let n = list
                        .items
                        .iter()
                        .filter(|p| p.metadata.deletion_timestamp.is_none())
                        .filter(|p| {
                            p.metadata
                                .owner_references
                                .iter()
                                .flatten()
                                .any(|o| o.kind == "DaemonSet" && names.contains(&o.name))
                        })
                        .count();
                    if let Ok(mut v) = out.lock() {
                        v.push(n);
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let policy = env.name("fw");
    ttdrv_testkit::policy::create_firmware_policy(&env, &policy, serde_json::json!({})).await;
    wait_for("the node flashed and Done", T, || async {
        let st = ttdrv_testkit::policy::firmware_status(&env, &policy).await;
        match st.nodes.iter().find(|n| n.name == node) {
            Some(n) if n.state == FirmwareNodeState::Done => Ok(()),
            n => Err(format!("{n:?}")),
        }
    })
    .await;
    probe.abort();
    let seen = seen_with_job.lock().map(|v| v.clone()).unwrap_or_default();
    assert!(!seen.is_empty(), "no flash Job was seen");
    assert!(
        seen.iter().all(|n| *n == 0),
        "stack pods on the node while its flash Job existed: {seen:?}"
    );
    let n = env.get_node(&node).await;
    assert!(!unschedulable(&n), "left cordoned");
    assert!(
        gate_labels(&n).is_empty(),
        "gates left: {:?}",
        gate_labels(&n)
    );
    wait_for("both stack pods back on the node", T, || async {
        let on = stack_pods(&env, &ns, &node, &names).await;
        if on.len() == 2 {
            Ok(())
        } else {
            Err(format!("{on:?}"))
        }
    })
    .await;
    env.teardown().await;
}
