//! A node whose writes the API server keeps refusing (here: a
//! ValidatingAdmissionPolicy, as a cluster's own admission rules would): the
//! rest of the fleet rolls out, the refused node is not started, its writes
//! back off (a handful of tries in 30 s where every pass would have tried),
//! and it rolls out once the refusal is lifted. Real control plane, the
//! controller binary, the simulated agent.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use ttdrv_api::{NodeState, labels};

const T: Duration = Duration::from_secs(90);
const REFUSE: &str = "ttdrv-test-refuse-writes";

/// Refuses every update of a Node labelled `REFUSE=<id>` (status updates,
/// kwok's heartbeats, are a subresource and pass).
async fn refuse_writes(env: &ttdrv_testkit::TestEnv, name: &str) {
    let vap: ValidatingAdmissionPolicy = serde_json::from_value(serde_json::json!({
        "metadata": { "name": name },
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": { "resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["UPDATE"], "resources": ["nodes"]
            }]},
            "matchConditions": [{
                "name": "marked",
                "expression": format!(
                    "has(oldObject.metadata.labels) && '{REFUSE}' in oldObject.metadata.labels \
                     && oldObject.metadata.labels['{REFUSE}'] == '{}'", env.id)
            }],
            "validations": [{ "expression": "false", "message": "writes to this node are refused (test)" }]
        }
    }))
    .expect("policy");
    let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(serde_json::json!({
        "metadata": { "name": name },
        "spec": { "policyName": name, "validationActions": ["Deny"] }
    }))
    .expect("binding");
    let pp = PostParams::default();
    Api::<ValidatingAdmissionPolicy>::all(env.client.clone())
        .create(&pp, &vap)
        .await
        .unwrap_or_else(|e| panic!("creating {name}: {e}"));
    Api::<ValidatingAdmissionPolicyBinding>::all(env.client.clone())
        .create(&pp, &binding)
        .await
        .unwrap_or_else(|e| panic!("creating binding {name}: {e}"));
}

/// Waits until `ttdriver_api_writes_failing{kind="node"}` is `want`.
async fn wait_failing_nodes(ctl: &ttdrv_testkit::ControllerProcess, want: f64) {
    let what = format!("ttdriver_api_writes_failing{{kind=\"node\"}} {want}");
    ttdrv_testkit::wait_for(&what, T, || async {
        let v = ctl
            .metric("ttdriver_api_writes_failing", &[("kind", "node")])
            .await;
        if v == want {
            Ok(())
        } else {
            Err(format!("{v}"))
        }
    })
    .await;
}

async fn lift(env: &ttdrv_testkit::TestEnv, name: &str) {
    let dp = DeleteParams::default();
    let _ = Api::<ValidatingAdmissionPolicyBinding>::all(env.client.clone())
        .delete(name, &dp)
        .await;
    let _ = Api::<ValidatingAdmissionPolicy>::all(env.client.clone())
        .delete(name, &dp)
        .await;
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn a_node_whose_writes_are_refused_backs_off_alone_and_recovers() {
    let (env, ns, _, _agent) = sim_fleet("wbackoff", 0).await;
    let free = env.tt_node_name("free", &[]).await;
    let refused = env.tt_node_name("refused", &[(REFUSE, &env.id)]).await;
    let vap = env.name("refuse-writes");
    refuse_writes(&env, &vap).await;
    let nodes: Api<Node> = Api::all(env.client.clone());
    // Admission policies take a moment to apply: wait until our own write is refused.
    ttdrv_testkit::wait_for("the admission policy refusing writes", T, || async {
        let probe = serde_json::json!({"metadata": {"labels": {"ttdrv-test-probe": "1"}}});
        match nodes
            .patch(&refused, &PatchParams::default(), &Patch::Merge(&probe))
            .await
        {
            Err(kube::Error::Api(s)) if s.message.contains("refused (test)") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;

    let ctl = controller_with(
        &env,
        &ns,
        ttdrv_testkit::ControllerOptions {
            // A full pass every 300 ms: each one would retry the claim.
            extra_args: vec!["--full-resync-ms".into(), "300".into()],
            ..Default::default()
        },
    );
    let policy = env.name("fleet");
    create_policy(
        &env,
        &policy,
        &format!("version: \"2.8.0\"\nnodeAffinity: {}", env.nodes_selector()),
    )
    .await;
    // One node's refused claim does not hold the other back.
    wait_nodes_state(
        &env,
        &policy,
        std::slice::from_ref(&free),
        NodeState::Done,
        "2.8.0",
        T,
    )
    .await;
    let metrics = || async {
        ctl.admin_get("/metrics")
            .await
            .map(|(_, _, body)| body)
            .unwrap_or_default()
    };
    wait_failing_nodes(&ctl, 1.0).await;
    // 30 s of full passes every 300 ms (about 100): tries paced by the
    // node's backoff (1, 2, 4, 8, 16 s: at most 6 in any 30 s), the other
    // passes waiting on it.
    let count = |m: &str, stage: &str| {
        ttdrv_testkit::controller::metric_sum(
            m,
            "ttdriver_errors_total",
            &[("cr", &policy), ("stage", stage)],
        )
    };
    let before = metrics().await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    let after = metrics().await;
    let tries = count(&after, "kube_api") - count(&before, "kube_api");
    let waits = count(&after, "write_backoff") - count(&before, "write_backoff");
    eprintln!("write backoff: over 30 s, {tries} refused tries and {waits} passes waiting");
    assert!(
        (1.0..=6.0).contains(&tries),
        "{tries} tries of the refused node's writes in 30 s"
    );
    assert!(waits >= 10.0, "only {waits} passes waited on the backoff");
    let node = nodes.get(&refused).await.expect("node");
    assert!(
        !node
            .metadata
            .labels
            .unwrap_or_default()
            .contains_key(labels::CLAIM),
        "the refused node was claimed"
    );

    // Lifted: the node's next try (within its current backoff) succeeds.
    lift(&env, &vap).await;
    wait_nodes_state(&env, &policy, &[free, refused], NodeState::Done, "2.8.0", T).await;
    wait_failing_nodes(&ctl, 0.0).await;
}
