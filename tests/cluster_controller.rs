//! Controller core against the real control plane: DaemonSet rendering and
//! placement, skip label, pause, pools and overlap, deletion, leader election,
//! restart stability, admin endpoints.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use ttdrv_api::{NodeState, labels};
use ttdrv_testkit::{ControllerOptions, SimAgent, SimAgentConfig, TestEnv, wait_for};

const T: Duration = Duration::from_secs(90);

/// This test's environment and namespace, one tt node per suffix, and the
/// simulated agent (200 ms a swap) over the namespace.
async fn fleet(name: &str, suffixes: &[&str]) -> SimFleet {
    let agent = SimAgentConfig {
        work: Duration::from_millis(200),
        ..Default::default()
    };
    sim_fleet_with(name, suffixes, &[], agent).await
}

/// [`fleet`] of the one node `a`.
async fn one_node(name: &str) -> (TestEnv, String, String, SimAgent) {
    let (env, ns, mut nodes, agent) = fleet(name, &["a"]).await;
    (env, ns, nodes.remove(0), agent)
}

/// Nodes that currently run a (non-terminating) installer pod of `policy`.
async fn installer_nodes(env: &TestEnv, ns: &str, policy: &str) -> Result<Vec<String>, String> {
    let mut v: Vec<String> = env
        .installer_pods(ns, Some(policy))
        .await?
        .into_iter()
        .filter_map(|p| p.spec.and_then(|s| s.node_name))
        .collect();
    v.sort();
    Ok(v)
}

/// The DaemonSet `ttdrv-<policy>`, which must exist.
async fn daemonset(env: &TestEnv, ns: &str, policy: &str) -> DaemonSet {
    Api::<DaemonSet>::namespaced(env.client.clone(), ns)
        .get(&format!("ttdrv-{policy}"))
        .await
        .unwrap_or_else(|e| panic!("DaemonSet ttdrv-{policy}: {e}"))
}

/// Waits until the Lease `lease` is held by `holder`.
async fn wait_lease_holder(env: &TestEnv, ns: &str, lease: &str, holder: &str, timeout: Duration) {
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), ns);
    wait_for(
        &format!("{holder} controller holds the lease"),
        timeout,
        || async {
            let l = leases.get(lease).await.map_err(|e| e.to_string())?;
            let h = l.spec.and_then(|s| s.holder_identity);
            if h.as_deref() == Some(holder) {
                Ok(())
            } else {
                Err(format!("{h:?}"))
            }
        },
    )
    .await;
}

async fn wait_installers(env: &TestEnv, ns: &str, policy: &str, want: &[String]) {
    let mut want = want.to_vec();
    want.sort();
    wait_for(
        &format!("installer pods of {policy} exactly on {want:?}"),
        T,
        || async {
            let got = installer_nodes(env, ns, policy).await?;
            if got == want {
                Ok(())
            } else {
                Err(format!("{got:?}"))
            }
        },
    )
    .await;
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn minimum_policy_places_pods_only_on_eligible_tenstorrent_nodes_and_skip_removes() {
    let (env, ns, nodes, _agent) = fleet("core-place", &["a", "b"]).await;
    let (a, b) = (nodes[0].clone(), nodes[1].clone());
    let skipped = env.tt_node_name("s", &[(labels::SKIP, "true")]).await;
    let _plain = env.node("plain", &[]).await;
    let _ctl = controller(&env, &ns);
    let policy = env.name("min");
    create_policy(&env, &policy, &fleet_spec(&env, "2.8.0", "")).await;
    wait_installers(&env, &ns, &policy, &[a.clone(), b.clone()]).await;

    let ds = daemonset(&env, &ns, &policy).await;
    let spec = ds.spec.clone().expect("spec");
    assert_eq!(
        spec.update_strategy.and_then(|u| u.type_).as_deref(),
        Some("OnDelete")
    );
    let exprs = spec
        .template
        .spec
        .and_then(|s| s.affinity)
        .and_then(|a| a.node_affinity)
        .and_then(|n| n.required_during_scheduling_ignored_during_execution)
        .map(|r| {
            r.node_selector_terms[0]
                .match_expressions
                .clone()
                .unwrap_or_default()
        })
        .unwrap_or_default();
    let keys: Vec<(String, String)> = exprs
        .iter()
        .map(|e| (e.key.clone(), e.operator.clone()))
        .collect();
    for want in [
        (labels::TT_PCI_PRESENT.to_string(), "In".to_string()),
        (labels::SKIP.to_string(), "DoesNotExist".to_string()),
        (ttdrv_testkit::TEST_LABEL.to_string(), "In".to_string()),
    ] {
        assert!(keys.contains(&want), "affinity lacks {want:?}: {keys:?}");
    }
    assert!(
        ds.metadata
            .owner_references
            .unwrap_or_default()
            .iter()
            .any(|o| o.kind == "TenstorrentDriverPolicy")
    );
    wait_nodes_state(
        &env,
        &policy,
        &[a.clone(), b.clone()],
        NodeState::Done,
        "2.8.0",
        T,
    )
    .await;
    let st = status(&env, &policy).await;
    assert_eq!(
        st.summary.matched, 2,
        "the skipped and the plain node are not matched"
    );
    assert_eq!(
        st.daemon_set.as_deref(),
        Some(format!("ttdrv-{policy}").as_str())
    );
    assert!(!st.nodes.iter().any(|n| n.name == skipped));

    env.label_node(&b, labels::SKIP, Some("true")).await;
    wait_installers(&env, &ns, &policy, std::slice::from_ref(&a)).await;

    // Deleting the policy removes its DaemonSet (owner reference, garbage collector).
    delete_policies(&env).await;
    env.wait_daemonset_gone(&ns, &format!("ttdrv-{policy}"), T)
        .await;
    env.cleanup().await;
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn pause_leaves_everything_untouched_and_unpause_resumes() {
    let (env, ns, nodes, _agent) = fleet("core-pause", &["a", "b"]).await;
    let _ctl = controller(&env, &ns);
    let policy = installed(&env, &nodes, "", T).await;
    let gen_before = daemonset(&env, &ns, &policy).await.metadata.generation;

    patch_policy(&env, &policy, serde_json::json!({ "paused": true })).await;
    wait_condition(&env, &policy, "Paused", "True", T, |c| c.status == "True").await;
    let watcher = CordonWatcher::start(&env);
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let gen_paused = daemonset(&env, &ns, &policy).await.metadata.generation;
    assert_eq!(
        gen_paused, gen_before,
        "a paused policy leaves its DaemonSet exactly as it was"
    );
    assert!(watcher.ever().is_empty(), "nothing starts while paused");
    for n in &nodes {
        assert_eq!(kmd(&env.get_node(n).await).as_deref(), Some("2.7.0"));
    }
    assert!(
        policy_events(&env, &policy)
            .await
            .iter()
            .all(|(r, _)| r != "NodeUpgradeStarted")
    );

    patch_policy(&env, &policy, serde_json::json!({ "paused": false })).await;
    wait_nodes_state(&env, &policy, &nodes, NodeState::Done, "2.8.0", T).await;
    assert_eq!(watcher.max(), 1);
    env.teardown().await;
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn disjoint_pools_and_overlap_conflict() {
    let env = TestEnv::new("core-pools").await;
    let ns = env.namespace().await;
    let pool = "tt.tenstorrent.com/pool";
    let p1 = env.tt_node_name("p1", &[(pool, "prod")]).await;
    let c1 = env.tt_node_name("c1", &[(pool, "canary")]).await;
    let _agent = SimAgent::working(env.client.clone(), &ns, Duration::from_millis(200));
    let _ctl = controller(&env, &ns);
    let (prod, canary, all) = (env.name("prod"), env.name("canary"), env.name("all"));
    let pool_sel = |p: &str| format!("{{matchLabels: {{ttdrv-test: {}, {pool}: {p}}}}}", env.id);
    create_policy(
        &env,
        &prod,
        &format!("version: \"2.7.0\"\nnodeAffinity: {}", pool_sel("prod")),
    )
    .await;
    create_policy(
        &env,
        &canary,
        &format!("version: \"2.8.0\"\nnodeAffinity: {}", pool_sel("canary")),
    )
    .await;
    wait_node_at(&env, &prod, &p1, NodeState::Done, Some("2.7.0"), T).await;
    wait_node_at(&env, &canary, &c1, NodeState::Done, Some("2.8.0"), T).await;

    // A newer policy matching both pools: Conflict, and no second pod anywhere.
    tokio::time::sleep(Duration::from_millis(1100)).await; // distinct creationTimestamp
    create_policy(&env, &all, &fleet_spec(&env, "2.9.0", "")).await;
    let conflict = wait_condition(&env, &all, "Conflict", "True on the newer policy", T, |c| {
        c.status == "True"
    })
    .await
    .message;
    assert!(
        conflict.contains(&p1) && conflict.contains(&c1),
        "conflict names the nodes: {conflict}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        installer_nodes(&env, &ns, &all)
            .await
            .expect("installer pods")
            .is_empty(),
        "the newer policy lands no pod on owned nodes"
    );
    assert_eq!(
        installer_nodes(&env, &ns, &prod)
            .await
            .expect("installer pods"),
        vec![p1.clone()]
    );
    assert_eq!(
        installer_nodes(&env, &ns, &canary)
            .await
            .expect("installer pods"),
        vec![c1.clone()]
    );
    assert_eq!(
        kmd(&env.get_node(&p1).await).as_deref(),
        Some("2.7.0"),
        "the prod node keeps its version"
    );
    assert!(
        policy_events(&env, &all)
            .await
            .iter()
            .any(|(r, _)| r == "SelectorConflict")
    );
    env.teardown().await;
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn deprecated_node_selector_works_with_a_warning() {
    let (env, ns, a, _agent) = one_node("core-alias").await;
    let _ctl = controller(&env, &ns);
    let policy = env.name("alias");
    create_policy(
        &env,
        &policy,
        &format!("version: \"2.8.0\"\nnodeSelector: {}", env.nodes_selector()),
    )
    .await;
    wait_node_at(&env, &policy, &a, NodeState::Done, Some("2.8.0"), T).await;
    wait_event(&env, &policy, "DeprecatedField", T, |n| {
        n.contains("nodeAffinity")
    })
    .await;
    env.teardown().await;
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn restart_does_not_touch_the_daemonset_and_admin_endpoints_work() {
    let (env, ns, a, _agent) = one_node("core-restart").await;
    let mut ctl = controller(&env, &ns);
    let policy = env.name("r");
    create_policy(&env, &policy, &fleet_spec(&env, "2.8.0", "")).await;
    wait_node_at(&env, &policy, &a, NodeState::Done, Some("2.8.0"), T).await;

    let (code, ctype, body) = ctl
        .admin_get("/metrics")
        .await
        .expect("admin server answers");
    assert_eq!(code, 200);
    assert!(
        ctype.starts_with("text/plain; version=0.0.4"),
        "Prometheus content type, got {ctype}"
    );
    assert!(
        body.contains(&format!(
            "ttdriver_node_state{{cr=\"{policy}\",node=\"{a}\",state=\"Done\"}} 1"
        )),
        "per-node state gauge"
    );
    assert_eq!(ctl.admin_get("/readyz").await.map(|r| r.0), Some(200));
    assert_eq!(ctl.admin_get("/healthz").await.map(|r| r.0), Some(200));

    let before = daemonset(&env, &ns, &policy)
        .await
        .metadata
        .resource_version;
    let status_before = get_policy(&env, &policy).await.metadata.resource_version;
    ctl.kill();
    let ctl2 = controller(&env, &ns);
    wait_for("restarted controller ready", T, || async {
        match ctl2.admin_get("/readyz").await {
            Some((200, _, _)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = daemonset(&env, &ns, &policy)
        .await
        .metadata
        .resource_version;
    assert_eq!(
        before, after,
        "a restarted controller must not rewrite an unchanged DaemonSet"
    );
    let status_after = get_policy(&env, &policy).await.metadata.resource_version;
    assert_eq!(
        status_before, status_after,
        "nor rewrite an unchanged status"
    );
    env.teardown().await;
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn only_the_leader_acts_and_a_killed_leader_hands_over() {
    let (env, ns, a, _agent) = one_node("core-leader").await;
    let lease = format!("lease-{}", env.id);
    let opts = |id: &str| ControllerOptions {
        leader_elect: true,
        lease_name: Some(lease.clone()),
        identity: Some(id.to_string()),
        ..Default::default()
    };
    let mut first = controller_with(&env, &ns, opts("first"));
    wait_lease_holder(&env, &ns, &lease, "first", T).await;
    let second = controller_with(&env, &ns, opts("second"));
    let policy = env.name("l");
    create_policy(&env, &policy, &fleet_spec(&env, "2.7.0", "")).await;
    wait_node_at(&env, &policy, &a, NodeState::Done, Some("2.7.0"), T).await;
    let leader_metric = |body: &str| {
        body.lines()
            .find(|l| l.starts_with("ttdriver_leader "))
            .map(|l| l.to_string())
    };
    let m2 = second
        .admin_get("/metrics")
        .await
        .map(|r| r.2)
        .unwrap_or_default();
    assert_eq!(
        leader_metric(&m2).as_deref(),
        Some("ttdriver_leader 0"),
        "the follower does not act"
    );
    assert!(
        !m2.contains(&format!("cr=\"{policy}\"")),
        "the follower exports no policy state"
    );

    first.kill();
    let killed = std::time::Instant::now();
    wait_lease_holder(&env, &ns, &lease, "second", Duration::from_secs(30)).await;
    let handover = killed.elapsed();
    assert!(
        handover <= Duration::from_secs(6 + 3),
        "handover within the lease duration (+1 retry): {handover:?}"
    );
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    wait_node_at(&env, &policy, &a, NodeState::Done, Some("2.8.0"), T).await;
    eprintln!("leader handover took {handover:?}");
    drop(second);
    env.teardown().await;
}
