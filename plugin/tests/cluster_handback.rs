//! `kubectl tt driver handback` against a real control plane and the real
//! controller, still running (as it is until `helm rollback` replaces it): a
//! fleet caught mid-upgrade (one node Failed under our cordon with its deploy
//! gate closed, one node cordoned by the Go firmware controller) is handed
//! back. `--dry-run` changes nothing; the hand-back undoes only our cordon,
//! opens only our gates, deletes our DaemonSet and its pods, leaves the labels
//! the Go operator reads, and stays done while our controller keeps running;
//! the Go operator's own DaemonSet (its name and selector) can then be created
//! and is left alone. Ignored by plain `cargo test` (no cluster there); run by
//! `hack/run-cluster-tests.sh`, or by hand with KUBECONFIG set:
//! `cargo test -p kubectl-tt-driver --test cluster_handback -- --ignored`.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::PostParams;
use ttdrv_api::NodeState;
use ttdrv_api::labels;
use ttdrv_testkit::{TestEnv, wait_for};

const T: Duration = Duration::from_secs(120);

/// What the hand-back may change on a node, and what it must not.
#[derive(Debug, PartialEq, Eq, Clone)]
struct NodeMarks {
    unschedulable: bool,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
}

async fn marks(env: &TestEnv, node: &str) -> NodeMarks {
    let n: Node = env.get_node(node).await;
    NodeMarks {
        unschedulable: n.spec.and_then(|s| s.unschedulable).unwrap_or(false),
        labels: n.metadata.labels.unwrap_or_default(),
        annotations: n.metadata.annotations.unwrap_or_default(),
    }
}

async fn daemonset(env: &TestEnv, ns: &str, name: &str) -> Option<DaemonSet> {
    let api: Api<DaemonSet> = Api::namespaced(env.client.clone(), ns);
    api.get_opt(name)
        .await
        .unwrap_or_else(|e| panic!("reading DaemonSet {ns}/{name}: {e}"))
}

/// The DaemonSet the Go operator creates for `cr`: its name and its selector
/// (which differs from ours, so a `helm rollback` cannot update ours into it).
fn go_daemonset(cr: &str) -> DaemonSet {
    let sel = serde_json::json!({
        "app.kubernetes.io/name": "tt-kmd-installer",
        "app.kubernetes.io/component": "driver",
        "driver.tenstorrent.com/cr": cr,
    });
    serde_json::from_value(serde_json::json!({
        "metadata": { "name": format!("ttdrv-{cr}") },
        "spec": {
            "selector": { "matchLabels": sel },
            "template": {
                "metadata": { "labels": sel },
                "spec": {
                    // No node of the test carries it: the pods never land.
                    "nodeSelector": { "tenstorrent.com/go-handback-test": "none" },
                    "containers": [{ "name": "builder", "image": "registry.invalid/tt-kmd-builder:go" }]
                }
            }
        }
    }))
    .unwrap_or_else(|e| panic!("the Go DaemonSet fixture: {e}"))
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn handback_undoes_only_ours_and_stays_undone() {
    // Two slots; the drain gives up after 3 s.
    let spec = "upgradePolicy: {maxUnavailable: 2, drain: {timeoutSeconds: 3}}";
    let (env, ns, tt, policy, _running) = fleet("handback", &["h0", "h1", "h2"], spec).await;
    let (h0, h1, h2) = (&tt[0], &tt[1], &tt[2]);
    let gate = labels::DEFAULT_DEPLOY_GATE;
    // h0: a device user, so it goes last (and, with h1 and h2 out, never starts).
    deployment(&env, &ns, "dev0", h0, true).await;
    // h1: a pod a PodDisruptionBudget guards: its drain fails, under our cordon.
    deployment(&env, &ns, "guarded", h1, false).await;
    guard(&env, &ns, 2).await;
    // h2: cordoned by an admin. (A firmware policy's cordon would hold the
    // driver's cycle off the node altogether: tests/cluster_firmware.rs.)
    env.set_unschedulable(h2, true).await;

    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    wait_node_at(&env, &policy, h1, NodeState::Failed, None, T).await;
    wait_node_at(&env, &policy, h2, NodeState::Done, Some("2.8.0"), T).await;
    let failed = marks(&env, h1).await;
    assert!(
        failed.unschedulable,
        "h1 Failed under our cordon: {failed:?}"
    );
    assert_eq!(
        failed.labels.get(gate).map(String::as_str),
        Some("false"),
        "h1's gate closed"
    );
    let ds_name = format!("ttdrv-{policy}");
    let ours = daemonset(&env, &ns, &ds_name)
        .await
        .unwrap_or_else(|| panic!("our DaemonSet {ds_name}"));

    // --dry-run: the plan, and nothing changed.
    let before: Vec<NodeMarks> = futures::future::join_all(tt.iter().map(|n| marks(&env, n))).await;
    let run = plugin(&["handback", &policy, "--dry-run", "-n", &ns, "-o", "json"]).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let plan = run.json();
    assert_eq!(plan["dryRun"], true);
    assert_eq!(plan["pause"], true);
    assert_eq!(plan["deleteDaemonset"].as_str(), Some(ds_name.as_str()));
    let action = |n: &str| -> serde_json::Value {
        plan["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|a| a["name"] == n)
            .cloned()
            .unwrap_or_else(|| panic!("{n} in the plan: {plan}"))
    };
    assert_eq!(action(h1)["uncordon"], true);
    assert!(
        strings(&action(h1)["removeLabels"]).contains(&gate.to_string()),
        "h1's gate opened: {}",
        action(h1)
    );
    assert_eq!(action(h2)["uncordon"], false);
    assert!(action(h2)["keptCordon"].is_string(), "{}", action(h2));
    assert_eq!(action(h0)["uncordon"], false);
    // h0 and h1 never swapped: the Go controller would swap them at once.
    assert_eq!(names(&plan["behind"]), [h0.clone(), h1.clone()], "{plan}");
    let after: Vec<NodeMarks> = futures::future::join_all(tt.iter().map(|n| marks(&env, n))).await;
    assert_eq!(before, after, "--dry-run changed a node");
    assert!(
        !get_policy(&env, &policy).await.spec.paused,
        "--dry-run paused the policy"
    );
    let still = daemonset(&env, &ns, &ds_name).await;
    assert_eq!(
        still.and_then(|d| d.metadata.uid),
        ours.metadata.uid.clone(),
        "--dry-run deleted the DaemonSet"
    );

    // Nodes at 2.7.0 under a policy at 2.8.0: refused, saying why, and
    // nothing changed.
    let run = plugin(&["handback", &policy, "-n", &ns]).await;
    assert_ne!(run.code, 0, "handed back with nodes behind: {}", run.stdout);
    for part in [
        h0.as_str(),
        h1.as_str(),
        "without cordon or drain",
        "--accept-go-swap",
    ] {
        assert!(run.stderr.contains(part), "{part}: {}", run.stderr);
    }
    assert!(
        !get_policy(&env, &policy).await.spec.paused,
        "the refusal paused the policy"
    );
    assert!(
        daemonset(&env, &ns, &ds_name).await.is_some(),
        "the refusal deleted the DaemonSet"
    );
    // What our agent writes is there before the hand-back (and gone after).
    assert!(
        before
            .iter()
            .all(|m| m.annotations.contains_key(labels::KMD_PARAMETERS)),
        "{before:?}"
    );

    // The hand-back, the Go controller's swap of h0 and h1 accepted.
    let run = plugin(&["handback", &policy, "-n", &ns, "--accept-go-swap"]).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.contains("helm rollback"), "{}", run.stdout);
    let check = |when: &'static str| {
        let env = &env;
        let ns = &ns;
        let ds_name = &ds_name;
        let policy = &policy;
        let before = &before;
        async move {
            assert!(get_policy(env, policy).await.spec.paused, "{when}: paused");
            assert!(
                daemonset(env, ns, ds_name).await.is_none(),
                "{when}: our DaemonSet is gone"
            );
            let pods = env
                .installer_pods(ns, Some(policy))
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(
                pods.is_empty(),
                "{when}: installer pods left: {}",
                pods.len()
            );
            let now: Vec<NodeMarks> =
                futures::future::join_all([h0, h1, h2].map(|n| marks(env, n))).await;
            for (m, was) in now.iter().zip(before) {
                assert!(
                    !m.labels.contains_key(labels::CLAIM),
                    "{when}: claim: {m:?}"
                );
                for a in [
                    labels::UPGRADE_STATE,
                    labels::GO_AHEAD,
                    labels::KMD_PARAMETERS,
                ] {
                    assert!(!m.annotations.contains_key(a), "{when}: {a}: {m:?}");
                }
                assert!(
                    !m.labels.contains_key(labels::KMD_PREPARED),
                    "{when}: kmd-prepared: {m:?}"
                );
                // What the Go operator reads of the loaded module stays.
                for l in [labels::KMD_VERSION, labels::INSTALL_MODE] {
                    assert_eq!(m.labels.get(l), was.labels.get(l), "{when}: {l} kept");
                    assert!(m.labels.contains_key(l), "{when}: {l} on the node: {m:?}");
                }
            }
            let (m0, m1, m2) = (&now[0], &now[1], &now[2]);
            assert!(!m1.unschedulable, "{when}: our cordon on h1 undone");
            assert!(!m1.labels.contains_key(gate), "{when}: h1's gate opened");
            assert!(m2.unschedulable, "{when}: the admin's cordon on h2 kept");
            assert!(!m0.unschedulable, "{when}: h0 never cordoned");
            assert_eq!(
                m2.labels.get(labels::KMD_VERSION).map(String::as_str),
                Some("2.8.0"),
                "{when}: h2 was upgraded"
            );
            assert_eq!(
                m1.labels.get(labels::KMD_VERSION).map(String::as_str),
                Some("2.7.0"),
                "{when}: h1 never swapped"
            );
        }
    };
    check("after the hand-back").await;
    // Our controller is still running (until `helm rollback`): it must not
    // claim, cordon or re-create anything of a paused policy.
    tokio::time::sleep(Duration::from_secs(8)).await;
    check("8 s later, our controller still running").await;

    // What `helm rollback` then brings: the Go operator's DaemonSet, under the
    // same name. The name is free, and our controller leaves it alone.
    let api: Api<DaemonSet> = Api::namespaced(env.client.clone(), &ns);
    let go = api
        .create(&PostParams::default(), &go_daemonset(&policy))
        .await
        .unwrap_or_else(|e| panic!("creating the Go DaemonSet {ds_name}: {e}"));
    tokio::time::sleep(Duration::from_secs(5)).await;
    let kept = daemonset(&env, &ns, &ds_name)
        .await
        .unwrap_or_else(|| panic!("the Go DaemonSet {ds_name} was deleted"));
    assert_eq!(
        kept.metadata.uid, go.metadata.uid,
        "the Go DaemonSet replaced"
    );
    assert_eq!(
        kept.spec.map(|s| s.selector),
        go.spec.map(|s| s.selector),
        "the Go DaemonSet's selector changed"
    );
    // A second hand-back sees it as not ours.
    let run = plugin(&["handback", &policy, "--dry-run", "-n", &ns, "-o", "json"]).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let plan = run.json();
    assert!(plan["deleteDaemonset"].is_null(), "{plan}");
    assert_eq!(plan["foreignDaemonset"].as_str(), Some(ds_name.as_str()));
    assert_eq!(plan["pause"], false, "already paused");

    let _ = api.delete(&ds_name, &Default::default()).await;
    wait_for("the Go DaemonSet deleted", T, || async {
        match api.get_opt(&ds_name).await {
            Ok(None) => Ok(()),
            other => Err(format!("{:?}", other.map(|d| d.is_some()))),
        }
    })
    .await;
    env.teardown().await;
}

/// Issue 51, item 4: `handback --wait` with a cycle under way (a drain a
/// PodDisruptionBudget blocks on w0) holds new cycles at once (the policy's
/// hand-back annotation, not `spec.paused`, which would hold w0's cycle
/// too), lets w0's cycle end once the budget goes, and hands back with no
/// other node ever cordoned; then the policy is paused and the hold gone.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn handback_wait_holds_new_cycles_and_lets_the_one_under_way_end() {
    handback_wait("handback-wait", false).await;
}

/// The same with the policy paused mid-cycle first: paused, w0's cycle could
/// never end; `--wait` resumes it under the hold.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn handback_wait_on_a_paused_policy_lets_the_cycle_end() {
    handback_wait("handback-paused", true).await;
}

async fn handback_wait(name: &str, paused_first: bool) {
    let spec = "upgradePolicy: {maxUnavailable: 1}";
    let (env, ns, tt, policy, _running) = fleet(name, &["w0", "w1", "w2", "w3"], spec).await;
    // w0 first (no device user) and held in Draining; the others use the
    // device, so they go after it.
    deployment(&env, &ns, "guarded", &tt[0], false).await;
    for (i, n) in tt.iter().enumerate().skip(1) {
        deployment(&env, &ns, &format!("dev{i}"), n, true).await;
    }
    guard(&env, &ns, 4).await;
    let cordons = NodeOrder::cordons(&env).await;
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    wait_node_at(&env, &policy, &tt[0], NodeState::Draining, None, T).await;
    if paused_first {
        patch_policy(&env, &policy, serde_json::json!({ "paused": true })).await;
    }
    let args: Vec<String> = [
        "handback",
        &policy,
        "-n",
        &ns,
        "--wait",
        "--accept-go-swap",
        "--timeout",
        "120",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let run = tokio::spawn(async move {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        plugin(&args).await
    });
    // It waits for w0, holding new cycles without pausing.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(!run.is_finished(), "handback --wait did not wait for w0");
    let p = get_policy(&env, &policy).await;
    assert!(
        !p.spec.paused,
        "paused while a cycle is under way: it would hold it"
    );
    assert!(
        p.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(labels::HANDBACK)),
        "the hold is set"
    );
    // The budget goes: w0's cycle ends, and the hand-back goes on.
    env.delete_pdb(&ns, "guard").await;
    let run = run.await.unwrap_or_else(|e| panic!("the plugin task: {e}"));
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(
        cordons.order(),
        [tt[0].clone()],
        "no cycle started after the hand-back began"
    );
    for n in &tt[1..] {
        let m = marks(&env, n).await;
        assert_eq!(
            m.labels.get(labels::KMD_VERSION).map(String::as_str),
            Some("2.7.0"),
            "{n} was never swapped: {m:?}"
        );
    }
    let w0 = marks(&env, &tt[0]).await;
    assert_eq!(
        w0.labels.get(labels::KMD_VERSION).map(String::as_str),
        Some("2.8.0"),
        "w0's cycle ended: {w0:?}"
    );
    assert!(!w0.unschedulable, "w0 back in service");
    let p = get_policy(&env, &policy).await;
    assert!(p.spec.paused, "paused for the hand-back");
    assert!(
        p.metadata
            .annotations
            .as_ref()
            .is_none_or(|a| !a.contains_key(labels::HANDBACK)),
        "the hold removed"
    );
    env.teardown().await;
}
