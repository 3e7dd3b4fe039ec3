//! `kubectl tt fw` against the local simulated cluster, with the real
//! controller and the simulated flasher: `plan` predicts the waves the
//! rollout then runs, `watch` follows it to a Failed node (exit 2), `retry`
//! refuses a node that is not Failed and retries one that is, `pause` and
//! `resume` set spec.paused, `status` and `nodes` report the end.

mod common;

use std::time::Duration;

use common::*;
use kube::Api;
use ttdrv_api::firmware::{TenstorrentFirmwarePolicy, labels as fw};
use ttdrv_testkit::policy::firmware_status;
use ttdrv_testkit::sim_flasher::FAULT_ANNOTATION;
use ttdrv_testkit::{TestEnv, ensure_crd, wait_for};

const T: Duration = Duration::from_secs(90);

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn fw_subcommands_follow_a_firmware_rollout() {
    let env = TestEnv::new("plugin-fw").await;
    let _guard = CleanupOnPanic { id: env.id.clone() };
    ensure_crd(&env.client).await;
    let ns = env.namespace().await;
    let nodes = env.tt_node_names(&["n0", "n1", "n2"]).await;
    env.annotate_node(&nodes[2], FAULT_ANNOTATION, Some("flash"))
        .await;
    let _agent = agent(&env, &ns);
    let _ctl = controller(&env, &ns);
    let name = env.name("fw");
    // Created paused: plan first, then resume.
    let spec = serde_json::json!({ "paused": true, "upgradePolicy": { "maxParallel": 2 } });
    ttdrv_testkit::policy::create_firmware_policy(&env, &name, spec).await;

    let run = plugin(&["fw", "plan", &name, "-o", "json"]).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let plan = run.json();
    assert_eq!(plan["waves"], 2, "{plan}");
    assert_eq!(plan["nodes"][0]["wave"], 1);
    assert_eq!(plan["nodes"][2]["wave"], 2);

    let typed: Api<TenstorrentFirmwarePolicy> = Api::all(env.client.clone());
    wait_for("the paused policy's status lists its nodes", T, || async {
        let st = firmware_status(&env, &name).await;
        if st.nodes.len() == 3 {
            Ok(())
        } else {
            Err(format!("{:?}", st.nodes))
        }
    })
    .await;
    // Not Failed: refused.
    let run = plugin(&["fw", "retry", &name, &nodes[0]]).await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.contains("not Failed"), "{}", run.stderr);

    let run = plugin(&["fw", "resume", &name]).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    // The failing node ends the watch with exit 2.
    let run = plugin(&["fw", "watch", &name, "--interval", "0.5", "--timeout", "80"]).await;
    assert_eq!(run.code, 2, "{run:?}");
    let run = plugin(&["fw", "nodes", &name, "-o", "json"]).await;
    let nodes_json = run.json();
    let state = |n: &str| {
        nodes_json
            .as_array()
            .and_then(|a| a.iter().find(|e| e["name"] == n))
            .map(|e| e["state"].as_str().unwrap_or_default().to_string())
    };
    assert_eq!(state(&nodes[2]).as_deref(), Some("Failed"), "{nodes_json}");

    // Fixed and retried: the rollout finishes; watch exits 0.
    env.annotate_node(&nodes[2], FAULT_ANNOTATION, None).await;
    let run = plugin(&["fw", "retry", &name, &nodes[2]]).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let node = env.get_node(&nodes[2]).await;
    assert!(ttdrv_core::node::annotation(&node, fw::RETRY).is_some());
    wait_for("the retried node out of Failed", T, || async {
        let st = firmware_status(&env, &name).await;
        if st.summary.failed == 0 {
            Ok(())
        } else {
            Err(format!("{:?}", st.summary))
        }
    })
    .await;
    let run = plugin(&["fw", "watch", &name, "--interval", "0.5", "--timeout", "80"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let run = plugin(&["fw", "status", &name]).await;
    assert!(run.stdout.contains("3/3 up to date"), "{}", run.stdout);
    let run = plugin(&["fw", "pause", &name, "-o", "json"]).await;
    assert_eq!(run.json()["paused"], true);
    wait_for("spec.paused", T, || async {
        match typed.get(&name).await {
            Ok(p) if p.spec.paused => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    env.teardown().await;
}
