//! Setting up what a chaos test runs on: the test's own client, the
//! Tenstorrent nodes, a controller with a settled policy, and workloads.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::ListParams;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use ttdrv_api::labels;
use ttdrv_testkit::TestEnv;

use crate::SETTLE;
use crate::common::create_policy;
use crate::controller::Controller;
use crate::rollout::wait_settled;

/// The test's own view of the cluster: the real API server directly (the
/// controllers may go through the proxy instead).
pub(crate) async fn chaos_env(prefix: &str, run_seed: u64) -> TestEnv {
    match std::env::var("CHAOS_DIRECT_KUBECONFIG") {
        Ok(path) => {
            let kc = kube::config::Kubeconfig::read_from(&path)
                .unwrap_or_else(|e| panic!("reading {path}: {e}"));
            let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .unwrap_or_else(|e| panic!("loading {path}: {e}"));
            cfg.default_retry = false;
            let client = kube::Client::try_from(cfg).expect("client");
            let suffix: String = StdRng::seed_from_u64(run_seed ^ 0x5eed)
                .sample_iter(rand::distr::Alphanumeric)
                .take(5)
                .map(|c| char::from(c).to_ascii_lowercase())
                .collect();
            TestEnv {
                client,
                id: format!("{prefix}-{suffix}"),
            }
        }
        Err(_) => TestEnv::new(prefix).await,
    }
}

/// `count` Tenstorrent nodes of the test (n0, n1, …), Ready.
pub(crate) async fn ready_tt_nodes(env: &TestEnv, count: usize) -> Vec<String> {
    let mut nodes = vec![];
    for i in 0..count {
        nodes.push(
            env.tt_node(&format!("n{i}"), &[])
                .await
                .metadata
                .name
                .unwrap_or_default(),
        );
    }
    for n in &nodes {
        env.wait_node_ready(n).await;
    }
    nodes
}

/// One controller (no leader election) and a policy over the test's nodes
/// with the given `upgradePolicy`, installed at 2.7.0 and settled.
pub(crate) async fn install_fleet(
    env: &TestEnv,
    ns: &str,
    upgrade_policy: &str,
) -> (Controller, String) {
    let mut ctl = Controller::new(env, ns);
    ctl.restore(env);
    let policy = env.name("fleet");
    create_policy(
        env,
        &policy,
        &format!(
            "version: \"2.7.0\"\nnodeAffinity: {{matchLabels: {{ttdrv-test: {}}}}}\nupgradePolicy: {upgrade_policy}",
            env.id
        ),
    )
    .await;
    if let Err(e) = wait_settled(env, &policy, "2.7.0", SETTLE).await {
        panic!("initial install did not settle: {e}");
    }
    (ctl, policy)
}

pub(crate) async fn test_nodes(env: &TestEnv) -> Vec<Node> {
    let api: Api<Node> = Api::all(env.client.clone());
    match api
        .list(&ListParams::default().labels(&env.selector()))
        .await
    {
        Ok(l) => l.items,
        Err(e) => panic!("listing nodes: {e}"),
    }
}

pub(crate) fn deployment(
    ns: &str,
    name: &str,
    replicas: i32,
    device: bool,
    node: Option<&str>,
) -> Deployment {
    let mut pod_spec = serde_json::json!({
        "containers": [{ "name": "main", "image": "example.invalid/workload:1" }],
        "terminationGracePeriodSeconds": 0,
    });
    if device {
        pod_spec["volumes"] =
            serde_json::json!([{ "name": "dev", "hostPath": { "path": labels::DEVICE_DIR } }]);
        pod_spec["containers"][0]["volumeMounts"] =
            serde_json::json!([{ "name": "dev", "mountPath": labels::DEVICE_DIR }]);
    }
    if let Some(n) = node {
        pod_spec["nodeSelector"] = serde_json::json!({ "kubernetes.io/hostname": n });
    }
    let v = serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": { "name": name, "namespace": ns },
        "spec": {
            "replicas": replicas,
            "selector": { "matchLabels": { "app": name } },
            "template": { "metadata": { "labels": { "app": name } }, "spec": pod_spec },
        }
    });
    serde_json::from_value(v).expect("deployment")
}
