//! The driver policy beside the VFIO binder (the chart's `vfioManager`): a
//! node whose Tenstorrent functions are all on vfio-pci is left alone (no
//! cordon, no drain, no swap: `Done`, reason `VfioPassthrough`, an Event);
//! on a node with functions on both drivers the cycle runs for tt-kmd's
//! functions and its drain leaves the VMs on the passthrough ones in place.
//! The binder's report is the Node annotation it writes
//! (`vfio.tenstorrent.com/pci-functions`). Real control plane, the controller
//! binary, the simulated agent.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::Api;
use kube::api::ListParams;
use ttdrv_api::NodeState;
use ttdrv_api::vfio::{PCI_FUNCTIONS, PciFunctions};
use ttdrv_testkit::{TestEnv, wait_for};

const T: Duration = Duration::from_secs(120);
const VFIO_RESOURCE: &str = "tenstorrent.com/wh-vfio";

fn report(drivers: &[(&str, u32)]) -> String {
    PciFunctions {
        boot_id: String::new(),
        drivers: drivers.iter().map(|(d, n)| (d.to_string(), *n)).collect(),
        vfio_resources: vec![VFIO_RESOURCE.into()],
    }
    .to_annotation()
}

/// A VM on `node`'s passthrough functions: a one-replica Deployment `app`
/// whose pod asks for the binder's resource, bound to the node directly (as
/// KubeVirt's launcher is, once scheduled).
async fn vm(env: &TestEnv, ns: &str, app: &str, node: &str) {
    let mut spec = ttdrv_testkit::workload_pod(false);
    spec.node_name = Some(node.into());
    spec.containers[0].resources = Some(ResourceRequirements {
        limits: Some(BTreeMap::from([(
            VFIO_RESOURCE.to_string(),
            Quantity("1".into()),
        )])),
        ..Default::default()
    });
    env.deployment(ns, app, spec).await;
}

/// The uid of `app`'s one running pod, once there is one.
async fn pod_uid(env: &TestEnv, ns: &str, app: &str) -> String {
    let api: Api<Pod> = Api::namespaced(env.client.clone(), ns);
    let lp = ListParams::default().labels(&format!("app={app}"));
    wait_for(&format!("{app} running"), T, || async {
        let pods = api.list(&lp).await.map_err(|e| e.to_string())?.items;
        pods.iter()
            .find(|p| {
                p.metadata.deletion_timestamp.is_none()
                    && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            })
            .and_then(|p| p.metadata.uid.clone())
            .ok_or_else(|| format!("{pods:?}"))
    })
    .await
}

/// Three nodes at 2.7.0, the policy at 2.8.0: `vfio` has every function on
/// vfio-pci and a VM, `mixed` one function on each driver with a VM and a
/// job on tt-kmd's device, `plain` no passthrough.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn a_passthrough_node_is_left_alone_and_a_mixed_node_keeps_its_vms() {
    let (env, ns, nodes, _agent) = sim_fleet_at("vfio", &["vfio", "mixed", "plain"], "2.7.0").await;
    let (all, mixed, plain) = (&nodes[0], &nodes[1], &nodes[2]);
    env.annotate_node(all, PCI_FUNCTIONS, Some(&report(&[("vfio-pci", 2)])))
        .await;
    env.annotate_node(
        mixed,
        PCI_FUNCTIONS,
        Some(&report(&[("vfio-pci", 1), ("tenstorrent", 1)])),
    )
    .await;
    vm(&env, &ns, "vm-all", all).await;
    vm(&env, &ns, "vm-mixed", mixed).await;
    env.pinned_deployment(&ns, "job", mixed, true).await;
    let vm_all = pod_uid(&env, &ns, "vm-all").await;
    let vm_mixed = pod_uid(&env, &ns, "vm-mixed").await;
    let job = pod_uid(&env, &ns, "job").await;

    let safety = SafetyWatcher::start(&env);
    let cordons = CordonWatcher::start(&env);
    let _ctl = controller(&env, &ns);
    let policy = env.name("fleet");
    create_policy(
        &env,
        &policy,
        &fleet_spec(&env, "2.8.0", "upgradePolicy: {maxUnavailable: 1}"),
    )
    .await;
    let upgraded = [mixed.clone(), plain.clone()];
    wait_nodes_state(&env, &policy, &upgraded, NodeState::Done, "2.8.0", T).await;
    let st = wait_node(&env, &policy, all, NodeState::Done, T).await;
    assert_eq!(st.reason.as_deref(), Some("VfioPassthrough"), "{st:?}");
    assert_message(&st, "all 2 Tenstorrent PCI functions are bound to vfio-pci");
    wait_event(&env, &policy, "NodePassthrough", T, |n| {
        n.contains(all.as_str())
    })
    .await;

    // The passthrough node: never cordoned, never swapped, its VM untouched.
    assert!(
        !cordons.ever().contains(all),
        "{all} was cordoned: {:?}",
        cordons.ever()
    );
    assert_eq!(kmd(&env.get_node(all).await).as_deref(), Some("2.7.0"));
    let seen = safety.seen();
    assert!(
        seen.swaps.iter().all(|s| !s.contains(all.as_str())),
        "{all} swapped: {seen:?}"
    );
    assert_eq!(pod_uid(&env, &ns, "vm-all").await, vm_all, "VM evicted");
    // The mixed node went through its cycle for tt-kmd's function: the job
    // was drained, the VM stayed.
    assert!(cordons.ever().contains(mixed), "{:?}", cordons.ever());
    assert_ne!(
        pod_uid(&env, &ns, "job").await,
        job,
        "the job was not drained"
    );
    assert_eq!(
        pod_uid(&env, &ns, "vm-mixed").await,
        vm_mixed,
        "the VM on the passthrough function was evicted"
    );
    assert!(seen.max_ready_cordoned_by_us <= 1, "{seen:?}");

    // The VM goes and the binder hands the functions back (restoreOnExit):
    // the node now needs the target and gets its cycle.
    let deps: Api<Deployment> = Api::namespaced(env.client.clone(), &ns);
    if let Err(e) = deps.delete("vm-all", &Default::default()).await {
        panic!("deleting vm-all: {e}");
    }
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &ns);
    wait_for("vm-all gone", T, || async {
        let lp = ListParams::default().labels("app=vm-all");
        match pods.list(&lp).await {
            Ok(l) if l.items.is_empty() => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    env.annotate_node(all, PCI_FUNCTIONS, Some(&report(&[("tenstorrent", 2)])))
        .await;
    wait_for(&format!("{all} upgraded"), T, || async {
        let st = status(&env, &policy).await;
        let e = st.nodes.iter().find(|e| e.name == *all);
        match e {
            Some(e) if e.state == NodeState::Done && e.reason.as_deref() == Some("Upgraded") => {
                Ok(())
            }
            _ => Err(format!("{e:?}")),
        }
    })
    .await;
    assert_done_uncordoned(&env, std::slice::from_ref(all), "2.8.0").await;
    env.teardown().await;
}
