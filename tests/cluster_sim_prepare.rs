//! The simulated agent builds ahead as the real agent does (issue 22): a
//! target its node has not cached is built and the node labelled
//! `kmd-prepared` before any go-ahead, the loaded module untouched until the
//! go-ahead comes; a failing build gives up with `BuildFailed`, the loaded
//! module still untouched. No controller runs: the test writes the go-ahead
//! the controller would write.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use ttdrv_api::labels;
use ttdrv_core::reason;
use ttdrv_testkit::sim_agent::{BUILD_FAIL_ANNOTATION, CACHED_ANNOTATION};
use ttdrv_testkit::{SimAgent, SimAgentConfig, TestEnv, wait_for};

const T: Duration = Duration::from_secs(60);

/// An installer pod of `policy` for `version` on `node` (what the DaemonSet
/// would create).
async fn installer(env: &TestEnv, ns: &str, node: &str, policy: &str, version: &str) -> Pod {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": { "name": format!("installer-{node}"), "labels": { labels::CLAIM: policy } },
        "spec": {
            "nodeName": node,
            "containers": [{
                "name": "agent",
                "image": "example.invalid/tt-driver-agent:test",
                "env": [{ "name": labels::env::TT_KMD_VERSION, "value": version }]
            }]
        }
    }))
    .unwrap_or_else(|e| panic!("pod json: {e}"));
    Api::<Pod>::namespaced(env.client.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("creating the installer pod on {node}: {e}"))
}

async fn annotate(env: &TestEnv, node: &str, ann: serde_json::Value) {
    Api::<Node>::all(env.client.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "metadata": { "annotations": ann } })),
        )
        .await
        .unwrap_or_else(|e| panic!("annotating {node}: {e}"));
}

/// A test's node `n0` at 2.7.0 carrying the annotation `key=value`, and the
/// simulated agent with `build` and `load` times over the test's namespace,
/// handed an installer pod of policy `p` for 2.8.0 on that node. Returns the
/// environment, namespace, policy, node and the agent.
async fn handed_2_8_0(
    name: &str,
    key: &str,
    value: &str,
    build: Duration,
    load: Duration,
) -> (TestEnv, String, String, String, SimAgent) {
    let env = TestEnv::new(name).await;
    let ns = env.namespace().await;
    let policy = env.name("p");
    let node = env
        .tt_node_name("n0", &[(labels::KMD_VERSION, "2.7.0")])
        .await;
    env.annotate_node(&node, key, Some(value)).await;
    let config = SimAgentConfig {
        namespace: ns.clone(),
        build,
        load,
        ..Default::default()
    };
    let agent = SimAgent::spawn(env.client.clone(), config);
    installer(&env, &ns, &node, &policy, "2.8.0").await;
    (env, ns, policy, node, agent)
}

fn label<'a>(n: &'a Node, k: &str) -> Option<&'a str> {
    ttdrv_core::node::label(n, k)
}

fn cached(n: &Node) -> Vec<String> {
    ttdrv_core::node::annotation(n, CACHED_ANNOTATION)
        .unwrap_or_default()
        .split(',')
        .map(str::to_string)
        .collect()
}

#[tokio::test]
#[ignore = "needs the local cluster (hack/run-cluster-tests.sh)"]
async fn sim_agent_builds_and_reports_prepared_before_the_go_ahead() {
    let (build, load) = (Duration::from_millis(500), Duration::from_millis(200));
    let (env, ns, policy, node, _agent) =
        handed_2_8_0("sim-prepare", CACHED_ANNOTATION, "2.7.0", build, load).await;

    // Built and reported prepared, with no go-ahead: 2.7.0 still loaded.
    let n = wait_for("kmd-prepared=2.8.0", T, || async {
        let n = env.get_node(&node).await;
        match label(&n, labels::KMD_PREPARED) {
            Some("2.8.0") => Ok(n),
            other => Err(format!("kmd-prepared {other:?}")),
        }
    })
    .await;
    assert_eq!(label(&n, labels::KMD_VERSION), Some("2.7.0"));
    assert_eq!(cached(&n), ["2.7.0", "2.8.0"]);
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &ns);
    let pod = pods
        .get(&format!("installer-{node}"))
        .await
        .unwrap_or_else(|e| panic!("installer pod: {e}"));
    assert!(
        !ttdrv_testkit::pod_ready(&pod),
        "Ready without the go-ahead"
    );

    // The go-ahead of a cycle, as the controller writes it: the load follows.
    let cycle = 1_700_000_000;
    annotate(
        &env,
        &node,
        serde_json::json!({
            labels::UPGRADE_STATE: serde_json::json!({
                "policy": policy, "state": "Upgrading", "target": "2.8.0",
                "since": cycle, "started": cycle, "cordonedByUs": true
            }).to_string(),
            labels::GO_AHEAD: serde_json::json!({
                "policy": policy, "node": node, "target": "2.8.0", "cycle": cycle
            }).to_string(),
        }),
    )
    .await;
    wait_for("kmd-version=2.8.0 and the pod Ready", T, || async {
        let n = env.get_node(&node).await;
        let p = pods
            .get(&format!("installer-{node}"))
            .await
            .map_err(|e| e.to_string())?;
        let loaded = label(&n, labels::KMD_VERSION);
        let ready = ttdrv_testkit::pod_ready(&p);
        if loaded == Some("2.8.0") && ready {
            Ok(())
        } else {
            Err(format!("kmd-version {loaded:?}, Ready {ready}"))
        }
    })
    .await;
    env.cleanup().await;
}

#[tokio::test]
#[ignore = "needs the local cluster (hack/run-cluster-tests.sh)"]
async fn sim_agent_build_failure_gives_up_with_build_failed_and_keeps_the_module() {
    let (build, load) = (Duration::from_millis(200), Duration::ZERO);
    let (env, ns, _policy, node, _agent) = handed_2_8_0(
        "sim-build-fail",
        BUILD_FAIL_ANNOTATION,
        "2.8.0",
        build,
        load,
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &ns);
    let message = wait_for("a termination message", T, || async {
        let p = pods
            .get(&format!("installer-{node}"))
            .await
            .map_err(|e| e.to_string())?;
        p.status
            .and_then(|s| s.container_statuses)
            .and_then(|c| c.first()?.last_state.clone()?.terminated?.message)
            .ok_or_else(|| "no termination message yet".to_string())
    })
    .await;
    assert!(
        message.starts_with(&format!("{}: ", reason::BUILD_FAILED)),
        "{message}"
    );
    let n = env.get_node(&node).await;
    assert_eq!(label(&n, labels::KMD_VERSION), Some("2.7.0"));
    assert_eq!(label(&n, labels::KMD_PREPARED), None);
    assert!(!cached(&n).contains(&"2.8.0".to_string()));
    env.cleanup().await;
}
