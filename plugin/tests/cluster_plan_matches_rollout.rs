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

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use ttdrv_api::{NodeState, TenstorrentDriverPolicy};
use ttdrv_testkit::{SimAgent, SimAgentConfig, TestEnv, wait_for};

const T: Duration = Duration::from_secs(120);

/// Records the order in which this test's nodes first enter a cycle of ours
/// (Cordoning..Uncordoning in the record the controller keeps on the node).
/// Unlike `CordonOrder` it sees a node an admin had cordoned already.
struct CycleOrder {
    order: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl CycleOrder {
    async fn start(env: &TestEnv) -> Self {
        let api: Api<Node> = Api::all(env.client.clone());
        let cfg = watcher::Config::default().labels(&env.selector());
        let order = Arc::new(Mutex::new(Vec::new()));
        let o = order.clone();
        let task = tokio::spawn(async move {
            let mut stream = watcher(api, cfg).applied_objects().boxed();
            while let Ok(Some(n)) = stream.try_next().await {
                let name = n.metadata.name.clone().unwrap_or_default();
                let cycling = ttdrv_core::node::record(&n)
                    .ok()
                    .flatten()
                    .is_some_and(|r| r.state.is_in_progress());
                if cycling
                    && let Ok(mut v) = o.lock()
                    && !v.contains(&name)
                {
                    v.push(name);
                }
            }
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        Self { order, task }
    }

    fn order(&self) -> Vec<String> {
        self.order.lock().map(|v| v.clone()).unwrap_or_default()
    }
}

impl Drop for CycleOrder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn agent(env: &TestEnv, ns: &str) -> SimAgent {
    SimAgent::spawn(
        env.client.clone(),
        SimAgentConfig {
            namespace: ns.to_string(),
            work: Duration::from_millis(300),
            ..Default::default()
        },
    )
}

async fn tt_nodes(env: &TestEnv, names: &[&str]) -> Vec<String> {
    let mut out = vec![];
    for n in names {
        let node = env.tt_node(n, &[]).await;
        out.push(node.metadata.name.unwrap_or_default());
    }
    out
}

/// Creates the policy at 2.7.0 (first install: no cordon) and waits for it.
async fn installed(env: &TestEnv, nodes: &[String], upgrade_policy: &str) -> String {
    let policy = env.name("fleet");
    create_policy(
        env,
        &policy,
        &format!(
            "version: \"2.7.0\"\nnodeAffinity: {}\nupgradePolicy: {upgrade_policy}",
            selector(env)
        ),
    )
    .await;
    wait_nodes(env, &policy, nodes, NodeState::Done, Some("2.7.0"), T).await;
    policy
}

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

async fn status_of(env: &TestEnv, policy: &str) -> ttdrv_api::TenstorrentDriverPolicyStatus {
    get_policy(env, policy).await.status.unwrap_or_default()
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
    let env = TestEnv::new("planvs-dev").await;
    let _guard = CleanupOnPanic { id: env.id.clone() };
    let ns = env.namespace().await;
    let tt = tt_nodes(&env, &["a0", "a1", "a2", "a3"]).await;
    let _agent = agent(&env, &ns);
    let _ctl = controller(&env, &ns);
    let policy = installed(&env, &tt, "{maxUnavailable: 1}").await;
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

    let cordons = CordonOrder::start(&env).await;
    let cycles = CycleOrder::start(&env).await;
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    wait_nodes(&env, &policy, &tt, NodeState::Done, Some("2.8.0"), T).await;
    assert_eq!(cordons.order(), plan.order, "cordon order = plan order");
    assert_eq!(cycles.order(), plan.order, "cycle order = plan order");
    let st = status_of(&env, &policy).await;
    for n in &st.nodes {
        assert!(
            n.state == NodeState::Done,
            "no blockers predicted, none met: {n:?}"
        );
    }

    delete_policies(&env).await;
    env.cleanup().await;
}

/// An admin's cordon: the node goes first (it is out of service already), keeps
/// its cordon, and with one slot the rollout stalls behind it for the reason the
/// plan gave; once the admin uncordons it the rest follow in the planned order.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn admin_cordon_goes_first_and_stalls_as_planned() {
    let env = TestEnv::new("planvs-admin").await;
    let _guard = CleanupOnPanic { id: env.id.clone() };
    let ns = env.namespace().await;
    let tt = tt_nodes(&env, &["b0", "b1", "b2"]).await;
    let _agent = agent(&env, &ns);
    let _ctl = controller(&env, &ns);
    let policy = installed(&env, &tt, "{maxUnavailable: 1}").await;
    // The node that sorts last by name.
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

    let cycles = CycleOrder::start(&env).await;
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    wait_nodes(
        &env,
        &policy,
        std::slice::from_ref(&tt[2]),
        NodeState::Done,
        Some("2.8.0"),
        T,
    )
    .await;
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

    delete_policies(&env).await;
    env.cleanup().await;
}

/// A node whose drain a PodDisruptionBudget blocks: the plan names the PDB; the
/// controller takes the nodes in the planned order, fails that one naming the
/// same PDB, and starts nothing after it until it is retried.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn pdb_blocker_is_the_one_the_controller_meets() {
    let env = TestEnv::new("planvs-pdb").await;
    let _guard = CleanupOnPanic { id: env.id.clone() };
    let ns = env.namespace().await;
    let tt = tt_nodes(&env, &["c0", "c1", "c2"]).await;
    let _agent = agent(&env, &ns);
    let _ctl = controller(&env, &ns);
    let policy = installed(&env, &tt, "{maxUnavailable: 1, drain: {timeoutSeconds: 3}}").await;
    // A device user on c0 sends it last; the guarded pod sits on c1.
    deployment(&env, &ns, "dev0", &tt[0], true).await;
    deployment(&env, &ns, "guarded", &tt[1], false).await;
    let pdb = PodDisruptionBudget {
        metadata: ObjectMeta {
            name: Some("guard".into()),
            ..Default::default()
        },
        spec: Some(PodDisruptionBudgetSpec {
            min_available: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some([("app".to_string(), "guarded".to_string())].into()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(env.client.clone(), &ns);
    pdbs.create(&PostParams::default(), &pdb)
        .await
        .expect("creating the PDB");
    wait_pods_ready(&env, &ns, 2).await;
    wait_for("the PDB computed", Duration::from_secs(60), || async {
        let p = pdbs.get("guard").await.map_err(|e| e.to_string())?;
        match p.status {
            Some(s) if s.current_healthy == 1 && s.disruptions_allowed == 0 => Ok(()),
            s => Err(format!("{s:?}")),
        }
    })
    .await;
    let pdb_id = format!("{ns}/guard");

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

    let cycles = CycleOrder::start(&env).await;
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    wait_nodes(
        &env,
        &policy,
        std::slice::from_ref(&tt[1]),
        NodeState::Failed,
        None,
        T,
    )
    .await;
    // The blocker the controller reports is the one the plan named.
    let st = status_of(&env, &policy).await;
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
    pdbs.delete("guard", &Default::default())
        .await
        .expect("deleting the PDB");
    let ok = plugin(&["retry", &policy, &tt[1]]).await;
    assert_eq!(ok.code, 0, "{}", ok.stderr);
    wait_nodes(&env, &policy, &tt, NodeState::Done, Some("2.8.0"), T).await;
    assert_eq!(cycles.order(), plan.order, "cycle order = plan order");

    delete_policies(&env).await;
    env.cleanup().await;
}
