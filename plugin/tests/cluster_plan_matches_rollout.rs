//! `plan` against what the controller then does, on three fleets with
//! maxUnavailable=1: nodes with device users (they go last), a node an admin
//! cordoned (it goes first, and with one slot the rollout stalls behind it),
//! and a node whose drain a PodDisruptionBudget blocks (it fails, naming the
//! PDB the plan named, and the rollout halts there). Each fleet is built so that
//! a plan ordering by name alone would predict a different order than the one
//! the controller takes. Ignored by plain `cargo test` (no cluster there); run by
//! `hack/run-cluster-tests.sh`, or by hand with KUBECONFIG set:
//! `cargo test -p kubectl-tt-driver --test cluster_plan_matches_rollout -- --ignored`.

mod common;

use std::time::Duration;

use common::*;
use ttdrv_api::{NodeState, TenstorrentDriverPolicy};
use ttdrv_testkit::wait_for;

const T: Duration = Duration::from_secs(120);
/// The upgrade policy of these fleets: one node at a time.
const ONE_SLOT: &str = "upgradePolicy: {maxUnavailable: 1}";

/// The plugin's plan for 2.8.0: (node order, blockers per node in that order, halted).
struct Predicted {
    order: Vec<String>,
    blockers: Vec<(String, Vec<String>)>,
    halted: Option<String>,
}

async fn predict(policy: &str) -> Predicted {
    let run = plugin(&["plan", policy, "--version", "2.8.0", "-o", "json"]).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let plan = run.json();
    let blockers = plan["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|n| {
            (
                n["name"].as_str().unwrap_or("").to_string(),
                strings(&n["blockers"]),
            )
        })
        .collect();
    Predicted {
        order: names(&plan["nodes"]),
        blockers,
        halted: plan["halted"].as_str().map(String::from),
    }
}

fn progressing_message(p: &TenstorrentDriverPolicy) -> String {
    p.status
        .iter()
        .flat_map(|s| s.conditions.iter())
        .find(|c| c.type_ == "Progressing")
        .map(|c| c.message.clone())
        .unwrap_or_default()
}

/// Device users go last: the plan says so and the controller cordons in that order.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn device_users_go_last_as_planned() {
    let (env, ns, tt, policy, _running) =
        fleet("planvs-dev", &["a0", "a1", "a2", "a3"], ONE_SLOT).await;
    // Device users on the two nodes that sort first by name.
    deployment(&env, &ns, "dev0", &tt[0], true).await;
    deployment(&env, &ns, "dev1", &tt[1], true).await;
    deployment(&env, &ns, "web", &tt[2], false).await;
    wait_pods_ready(&env, &ns, 3).await;

    let plan = predict(&policy).await;
    assert_eq!(
        plan.order,
        [tt[2].clone(), tt[3].clone(), tt[0].clone(), tt[1].clone()],
        "device users last"
    );
    assert!(plan.halted.is_none(), "{:?}", plan.halted);
    for (n, b) in &plan.blockers {
        assert!(b.is_empty(), "no blockers predicted on {n}: {b:?}");
    }

    let cordons = NodeOrder::cordons(&env).await;
    let cycles = NodeOrder::cycles(&env).await;
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    wait_nodes(&env, &policy, &tt, NodeState::Done, Some("2.8.0"), T).await;
    assert_eq!(cordons.order(), plan.order, "cordon order = plan order");
    assert_eq!(cycles.order(), plan.order, "cycle order = plan order");
    let st = status(&env, &policy).await;
    for n in &st.nodes {
        assert!(
            n.state == NodeState::Done,
            "no blockers predicted, none met: {n:?}"
        );
    }

    env.teardown().await;
}

/// An admin's cordon: the node goes first (it is out of service already), keeps
/// its cordon, and with one slot the rollout stalls behind it for the reason the
/// plan gave; once the admin uncordons it the rest follow in the planned order.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn admin_cordon_goes_first_and_stalls_as_planned() {
    let (env, _ns, tt, policy, _running) =
        fleet("planvs-admin", &["b0", "b1", "b2"], ONE_SLOT).await;
    // The node that sorts last by name, cordoned by an admin. (A firmware
    // policy's cordon would hold the driver's cycle off the node altogether:
    // tests/cluster_firmware.rs.)
    env.set_unschedulable(&tt[2], true).await;

    let plan = predict(&policy).await;
    assert_eq!(
        plan.order,
        [tt[2].clone(), tt[0].clone(), tt[1].clone()],
        "the admin's node first"
    );
    for (n, b) in &plan.blockers {
        assert!(b.is_empty(), "no blockers predicted on {n}: {b:?}");
    }
    let stall = plan
        .halted
        .clone()
        .and_then(|h| {
            h.strip_prefix("the rollout would stall: ")
                .map(String::from)
        })
        .unwrap_or_else(|| panic!("plan predicts the stall: {:?}", plan.halted));
    let named = format!("{} cordoned by someone else", tt[2]);
    assert!(
        stall.contains(&named),
        "the stall names whose cordon: {stall}"
    );

    let cycles = NodeOrder::cycles(&env).await;
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    wait_node_at(&env, &policy, &tt[2], NodeState::Done, Some("2.8.0"), T).await;
    // The controller says why nothing more starts: the reason the plan gave.
    wait_for("the controller's stall reason", T, || async {
        let msg = progressing_message(&get_policy(&env, &policy).await);
        if msg == stall {
            Ok(())
        } else {
            Err(format!("Progressing: {msg:?}, plan: {stall:?}"))
        }
    })
    .await;
    // ... and says it once in an Event.
    wait_for(
        "a RolloutWaitingOnOthers Event naming the cordon",
        T,
        || async {
            use k8s_openapi::api::events::v1::Event;
            let api: kube::Api<Event> = kube::Api::all(env.client.clone());
            let events = api
                .list(&Default::default())
                .await
                .map(|l| l.items)
                .unwrap_or_default();
            let notes: Vec<String> = events
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some("RolloutWaitingOnOthers"))
                .filter_map(|e| e.note)
                .collect();
            if notes.iter().any(|n| n.contains(&named)) {
                Ok(())
            } else {
                Err(format!("{notes:?}"))
            }
        },
    )
    .await;
    // Settled in the stall: nothing else started.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(cycles.order(), plan.order[..1], "only the admin's node ran");
    assert_eq!(
        env.get_node(&tt[2])
            .await
            .spec
            .and_then(|s| s.unschedulable),
        Some(true),
        "the admin's cordon survives the upgrade"
    );

    env.set_unschedulable(&tt[2], false).await;
    wait_nodes(&env, &policy, &tt, NodeState::Done, Some("2.8.0"), T).await;
    assert_eq!(cycles.order(), plan.order, "cycle order = plan order");

    env.teardown().await;
}

/// A node whose drain a PodDisruptionBudget blocks: the plan names the PDB; the
/// controller takes the nodes in the planned order, fails that one naming the
/// same PDB, and starts nothing after it until it is retried.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn pdb_blocker_is_the_one_the_controller_meets() {
    let drain = "upgradePolicy: {maxUnavailable: 1, drain: {timeoutSeconds: 3}}";
    let (env, ns, tt, policy, _running) = fleet("planvs-pdb", &["c0", "c1", "c2"], drain).await;
    // A device user on c0 sends it last; the guarded pod sits on c1.
    deployment(&env, &ns, "dev0", &tt[0], true).await;
    deployment(&env, &ns, "guarded", &tt[1], false).await;
    let pdb_id = guard(&env, &ns, 2).await;

    let plan = predict(&policy).await;
    assert_eq!(plan.order, [tt[1].clone(), tt[2].clone(), tt[0].clone()]);
    let blocked: Vec<&(String, Vec<String>)> = plan
        .blockers
        .iter()
        .filter(|(_, b)| !b.is_empty())
        .collect();
    assert!(
        blocked.len() == 1 && blocked[0].0 == tt[1] && blocked[0].1.len() == 1,
        "one blocker, on {}: {blocked:?}",
        tt[1]
    );
    assert!(blocked[0].1[0].contains(&pdb_id), "{blocked:?}");

    let cycles = NodeOrder::cycles(&env).await;
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    wait_node_at(&env, &policy, &tt[1], NodeState::Failed, None, T).await;
    // The blocker the controller reports is the one the plan named.
    let st = status(&env, &policy).await;
    let failed = st
        .nodes
        .iter()
        .find(|n| n.name == tt[1])
        .cloned()
        .unwrap_or_else(|| panic!("{} in the status", tt[1]));
    let msg = failed.message.clone().unwrap_or_default();
    assert_eq!(failed.reason.as_deref(), Some("DrainTimeout"), "{failed:?}");
    let reported: Vec<&str> = msg
        .split_once("blocked by PodDisruptionBudgets: ")
        .and_then(|(_, rest)| rest.split(['.', ';']).next())
        .map(|list| list.split(", ").collect())
        .unwrap_or_default();
    assert_eq!(reported, [pdb_id.as_str()], "{msg}");
    // Halted at the blocked node: nothing after it in the order started.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(cycles.order(), plan.order[..1]);
    for n in st.nodes.iter().filter(|n| n.name != tt[1]) {
        assert!(n.state != NodeState::Failed, "{n:?}");
    }

    // The plan's order assumes the Failed node retried: remove the cause, retry.
    env.delete_pdb(&ns, "guard").await;
    let ok = plugin(&["retry", &policy, &tt[1]]).await;
    assert_eq!(ok.code, 0, "{}", ok.stderr);
    wait_nodes(&env, &policy, &tt, NodeState::Done, Some("2.8.0"), T).await;
    assert_eq!(cycles.order(), plan.order, "cycle order = plan order");

    env.teardown().await;
}
