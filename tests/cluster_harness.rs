//! Proves the test harness: the simulated cluster runs a real DaemonSet controller,
//! scheduler, eviction API with PodDisruptionBudgets, and watches.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec, Deployment};
use k8s_openapi::api::core::v1::{
    Affinity, Container, Node, NodeAffinity, NodeSelector, NodeSelectorRequirement,
    NodeSelectorTerm, Pod, PodSpec, PodTemplateSpec,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::Api;
use kube::api::{EvictParams, ListParams, ObjectMeta, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use ttdrv_testkit::{TestEnv, pod_ready, wait_for};

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn pod_template(app: &str) -> PodTemplateSpec {
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels(&[("app", app)])),
            ..Default::default()
        }),
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "c".into(),
                image: Some("busybox".into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
    }
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn daemonset_lands_one_ready_pod_per_matching_node_only() {
    let env = TestEnv::new("harness-ds").await;
    let ns = env.namespace().await;
    let a = env.tt_node("tt-a", &[("pool", "x")]).await;
    let b = env.tt_node("tt-b", &[("pool", "x")]).await;
    let plain = env.node("plain", &[("pool", "x")]).await;
    let names: Vec<String> = [&a, &b, &plain]
        .iter()
        .map(|n| n.metadata.name.clone().unwrap_or_default())
        .collect();
    for n in &names {
        env.wait_node_ready(n).await;
    }
    let mut tpl = pod_template("ds");
    if let Some(spec) = tpl.spec.as_mut() {
        spec.affinity = Some(Affinity {
            node_affinity: Some(NodeAffinity {
                required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: Some(vec![
                            NodeSelectorRequirement {
                                key: ttdrv_api::labels::TT_PCI_PRESENT.into(),
                                operator: "In".into(),
                                values: Some(vec!["true".into()]),
                            },
                            NodeSelectorRequirement {
                                key: ttdrv_testkit::TEST_LABEL.into(),
                                operator: "In".into(),
                                values: Some(vec![env.id.clone()]),
                            },
                        ]),
                        ..Default::default()
                    }],
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    let ds = DaemonSet {
        metadata: ObjectMeta {
            name: Some("probe".into()),
            ..Default::default()
        },
        spec: Some(DaemonSetSpec {
            selector: LabelSelector {
                match_labels: Some(labels(&[("app", "ds")])),
                ..Default::default()
            },
            template: tpl,
            ..Default::default()
        }),
        ..Default::default()
    };
    let dss: Api<DaemonSet> = Api::namespaced(env.client.clone(), &ns);
    dss.create(&PostParams::default(), &ds)
        .await
        .expect("create DaemonSet");
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &ns);
    let placed = wait_for(
        "one Ready DaemonSet pod on each Tenstorrent node",
        Duration::from_secs(60),
        || async {
            let list = pods
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let mut on: Vec<(String, bool)> = list
                .items
                .iter()
                .map(|p| {
                    (
                        p.spec
                            .as_ref()
                            .and_then(|s| s.node_name.clone())
                            .unwrap_or_default(),
                        pod_ready(p),
                    )
                })
                .collect();
            on.sort();
            if on.len() == 2 && on.iter().all(|(_, r)| *r) {
                Ok(on)
            } else {
                Err(format!("{on:?}"))
            }
        },
    )
    .await;
    assert_eq!(
        placed.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>(),
        vec![names[0].clone(), names[1].clone()]
    );
    // Give the DaemonSet controller time to (wrongly) place more; then re-check.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        env.pods_on(&ns, &names[2]).await.is_empty(),
        "no pod may land on the plain node"
    );
    env.cleanup().await;
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn eviction_blocked_by_pdb_is_refused_with_429() {
    let env = TestEnv::new("harness-pdb").await;
    let ns = env.namespace().await;
    let node_name = env.tt_node_name("tt", &[]).await;
    env.wait_node_ready(&node_name).await;
    let mut tpl = pod_template("guarded");
    if let Some(spec) = tpl.spec.as_mut() {
        spec.node_name = Some(node_name.clone());
    }
    let dep = Deployment {
        metadata: ObjectMeta {
            name: Some("guarded".into()),
            ..Default::default()
        },
        spec: Some(k8s_openapi::api::apps::v1::DeploymentSpec {
            replicas: Some(1),
            selector: LabelSelector {
                match_labels: Some(labels(&[("app", "guarded")])),
                ..Default::default()
            },
            template: tpl,
            ..Default::default()
        }),
        ..Default::default()
    };
    Api::<Deployment>::namespaced(env.client.clone(), &ns)
        .create(&PostParams::default(), &dep)
        .await
        .expect("create Deployment");
    env.guard_app(&ns, "guard", "guarded").await;
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(env.client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &ns);
    let pod_name = wait_for(
        "the guarded pod Ready and the PDB computed",
        Duration::from_secs(60),
        || async {
            let list = pods
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let ready: Vec<String> = list
                .items
                .iter()
                .filter(|p| pod_ready(p))
                .filter_map(|p| p.metadata.name.clone())
                .collect();
            let pdb = pdbs.get("guard").await.map_err(|e| e.to_string())?;
            let healthy = pdb.status.as_ref().map(|s| s.current_healthy).unwrap_or(0);
            match ready.first() {
                Some(n) if healthy == 1 => Ok(n.clone()),
                _ => Err(format!(
                    "ready pods {ready:?}, PDB currentHealthy {healthy}"
                )),
            }
        },
    )
    .await;
    match pods.evict(&pod_name, &EvictParams::default()).await {
        Err(kube::Error::Api(status)) => assert_eq!(
            status.code, 429,
            "expected 429 Too Many Requests, got {status:?}"
        ),
        other => panic!("eviction of a PDB-protected pod must be refused with 429, got {other:?}"),
    }
    assert!(
        pods.get(&pod_name).await.is_ok(),
        "the protected pod must still exist"
    );
    env.cleanup().await;
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn node_cordon_is_visible_through_a_watch() {
    let env = TestEnv::new("harness-watch").await;
    let name = env.tt_node_name("tt", &[]).await;
    let nodes: Api<Node> = Api::all(env.client.clone());
    let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut stream = watcher(nodes, cfg).applied_objects().boxed();
    // First event: the node as created, schedulable.
    let first = tokio::time::timeout(Duration::from_secs(30), stream.try_next())
        .await
        .expect("watch delivered the node")
        .expect("watch ok")
        .expect("stream open");
    assert_ne!(first.spec.and_then(|s| s.unschedulable), Some(true));
    env.set_unschedulable(&name, true).await;
    let seen = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(n) = stream.try_next().await.expect("watch ok") {
            if n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
                return true;
            }
        }
        false
    })
    .await
    .expect("cordon event within 30s");
    assert!(seen, "the watch must report the node as unschedulable");
    env.cleanup().await;
}
