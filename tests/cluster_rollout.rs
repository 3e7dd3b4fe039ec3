//! Rollouts on simulated nodes against the real control plane, with the real
//! controller binary and a simulated node agent.

mod common;

use std::time::Duration;

use common::*;
use ttdrv_api::NodeState;
use ttdrv_testkit::{SimAgent, SimAgentConfig, TestEnv};

const T: Duration = Duration::from_secs(90);

async fn setup(
    name: &str,
    n: usize,
    extra: &[(&str, &str)],
) -> (TestEnv, String, Vec<String>, SimAgent) {
    let env = TestEnv::new(name).await;
    let ns = env.namespace().await;
    let mut nodes = vec![];
    for i in 0..n {
        let node = env.tt_node(&format!("n{i}"), extra).await;
        nodes.push(node.metadata.name.clone().unwrap_or_default());
    }
    let agent = SimAgent::spawn(
        env.client.clone(),
        SimAgentConfig {
            namespace: ns.clone(),
            work: Duration::from_millis(300),
        },
    );
    (env, ns, nodes, agent)
}

fn selector(env: &TestEnv) -> String {
    format!("{{matchLabels: {{ttdrv-test: {}}}}}", env.id)
}

#[tokio::test]
async fn three_node_upgrade_one_at_a_time() {
    let (env, ns, nodes, _agent) = setup("rollout-3", 3, &[]).await;
    let _ctl = controller(&env, &ns);
    let policy = env.name("fleet");
    create_policy(
        &env,
        &policy,
        &format!("version: \"2.7.0\"\nnodeAffinity: {}", selector(&env)),
    )
    .await;
    wait_nodes_state(&env, &policy, &nodes, NodeState::Done, "2.7.0", T).await;

    let watcher = CordonWatcher::start(&env);
    tokio::time::sleep(Duration::from_millis(500)).await;
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    wait_nodes_state(&env, &policy, &nodes, NodeState::Done, "2.8.0", T).await;

    for n in &nodes {
        let node = env.get_node(n).await;
        assert!(
            !unschedulable(&node),
            "{n} must be schedulable after the rollout"
        );
        assert!(
            gate_labels(&node).is_empty(),
            "{n} still has deploy gates: {:?}",
            gate_labels(&node)
        );
        assert_eq!(kmd(&node).as_deref(), Some("2.8.0"));
    }
    assert_eq!(
        watcher.ever(),
        nodes,
        "every node was cordoned for its upgrade"
    );
    assert_eq!(
        watcher.max(),
        1,
        "never more than one node cordoned at once"
    );
    let st = get_policy(&env, &policy).await.status.unwrap_or_default();
    assert_eq!(st.summary.done, 3);
    assert_eq!(st.desired_version.as_deref(), Some("2.8.0"));
    let ready = st
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status.clone());
    assert_eq!(ready.as_deref(), Some("True"));
    delete_policies(&env).await;
    env.cleanup().await;
}
