//! A policy the API server accepted but the cluster refuses to carry out (its
//! DaemonSet apply answered 422): Degraded with the server's words, one Event,
//! backoff instead of a hot loop, and no capture of nodes from a policy that
//! works. Real control plane, the controller binary, the simulated agent.

mod common;

use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Api;
use kube::api::PostParams;
use ttdrv_api::NodeState;
use ttdrv_testkit::{ControllerOptions, TestEnv};

const T: Duration = Duration::from_secs(90);

/// A DaemonSet named as the policy's would be, with another selector: the
/// controller's apply is refused (a DaemonSet's selector is immutable).
async fn squatting_daemonset(env: &TestEnv, ns: &str, name: &str) {
    let ds: DaemonSet = serde_json::from_value(serde_json::json!({
        "metadata": { "name": name },
        "spec": {
            "selector": { "matchLabels": { "app": "squatter" } },
            "template": {
                "metadata": { "labels": { "app": "squatter" } },
                "spec": {
                    "nodeSelector": { "nowhere": "true" },
                    "containers": [{ "name": "c", "image": "busybox" }]
                }
            }
        }
    }))
    .expect("daemonset");
    Api::<DaemonSet>::namespaced(env.client.clone(), ns)
        .create(&PostParams::default(), &ds)
        .await
        .unwrap_or_else(|e| panic!("creating daemonset {name}: {e}"));
}

/// The policy's `PolicyRefused` Events.
async fn refusal_events(env: &TestEnv, policy: &str) -> Vec<(String, String)> {
    policy_events(env, policy)
        .await
        .into_iter()
        .filter(|(r, _)| r == "PolicyRefused")
        .collect()
}

/// Waits until the policy is Degraded because it was refused; returns the condition.
async fn wait_refused(env: &TestEnv, policy: &str) -> Condition {
    wait_condition(env, policy, "Degraded", "True/PolicyRefused", T, |c| {
        c.status == "True" && c.reason == "PolicyRefused"
    })
    .await
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn refused_policy_is_degraded_backs_off_and_captures_nothing() {
    let (env, ns, nodes, _agent) = sim_fleet("refusal", 2).await;
    let broken = env.name("broken");
    squatting_daemonset(&env, &ns, &format!("ttdrv-{broken}")).await;
    let ctl = controller(&env, &ns);
    create_policy(&env, &broken, &fleet_spec(&env, "2.8.0", "")).await;
    let start = Instant::now();
    // Degraded with the server's words, within seconds.
    let degraded = wait_refused(&env, &broken).await;
    eprintln!(
        "refused: Degraded after {:?}: {}",
        start.elapsed(),
        degraded.message
    );
    assert!(
        degraded.message.contains("selector") || degraded.message.contains("immutable"),
        "the API server's words: {}",
        degraded.message
    );
    // A newer, valid policy for the same nodes gets them.
    let good = env.name("good");
    create_policy(&env, &good, &fleet_spec(&env, "2.7.0", "")).await;
    wait_nodes_state(&env, &good, &nodes, NodeState::Done, "2.7.0", T).await;
    // Over the next 30 s the refused apply is retried with backoff, not every pass.
    let refused = [("cr", broken.as_str()), ("stage", "refused")];
    let before = ctl.metric("ttdriver_errors_total", &refused).await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    let after = ctl.metric("ttdriver_errors_total", &refused).await;
    eprintln!(
        "refused: {} refused attempts in 30 s (total {after})",
        after - before
    );
    assert!(
        after - before <= 4.0,
        "backoff: at most 4 attempts in 30 s, saw {}",
        after - before
    );
    let events = refusal_events(&env, &broken).await;
    assert_eq!(events.len(), 1, "one Event per distinct error: {events:?}");
    let st = status(&env, &good).await;
    assert_eq!(st.summary.matched, 2, "the valid policy owns both nodes");
    env.teardown().await;
}

/// Lines of the controller's log, and how many of them are warnings.
fn log_counts(identity_log: &std::path::Path) -> (usize, usize) {
    let text = std::fs::read_to_string(identity_log).unwrap_or_default();
    let lines = text.lines().count();
    let warns = text.lines().filter(|l| l.contains("WARN")).count();
    (lines, warns)
}

/// 300 policies the cluster refuses: API requests and warning lines per
/// minute stay bounded (the issue measured ~150 failing requests/s and ~9,500
/// warning lines a minute before the backoff).
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn three_hundred_refused_policies_stay_quiet() {
    const N: usize = 300;
    let env = TestEnv::new("refusal300").await;
    let ns = env.namespace().await;
    let ctl = controller(&env, &ns);
    let log = std::env::temp_dir().join(format!("ttdrv-controller-ctl-{}.log", env.id));
    let mut names = vec![];
    for i in 0..N {
        let name = env.name(&format!("p{i:03}"));
        squatting_daemonset(&env, &ns, &format!("ttdrv-{name}")).await;
        create_policy(
            &env,
            &name,
            "version: \"2.8.0\"\nnodeAffinity: {matchLabels: {nowhere: \"true\"}}",
        )
        .await;
        names.push(name);
    }
    // Every one refused and Degraded.
    ttdrv_testkit::wait_for("all policies Degraded", T, || async {
        let api: Api<ttdrv_api::TenstorrentDriverPolicy> = Api::all(env.client.clone());
        let lp = kube::api::ListParams::default().labels(&env.selector());
        let list = api.list(&lp).await.map_err(|e| e.to_string())?;
        let degraded = list
            .items
            .iter()
            .filter(|p| {
                p.status.as_ref().is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|c| c.type_ == "Degraded" && c.reason == "PolicyRefused")
                })
            })
            .count();
        if degraded == N {
            Ok(())
        } else {
            Err(format!("{degraded} of {N}"))
        }
    })
    .await;
    let refused = || ctl.metric("ttdriver_errors_total", &[("stage", "refused")]);
    let (before, (_, warns_before)) = (refused().await, log_counts(&log));
    tokio::time::sleep(Duration::from_secs(60)).await;
    let (after, (lines, warns_after)) = (refused().await, log_counts(&log));
    let requests = after - before;
    let warnings = warns_after - warns_before;
    eprintln!(
        "300 refused policies, one minute: {requests} refused apply requests ({:.1}/s), {warnings} warning lines ({lines} log lines in all)",
        requests / 60.0
    );
    assert!(
        requests <= (N * 4) as f64,
        "backoff: at most 4 applies per policy and minute, saw {requests}"
    );
    assert!(
        warnings <= N * 4,
        "one warning line per refused attempt at most, saw {warnings}"
    );
    env.teardown().await;
}

/// A policy naming an installer image outside the controller's allow-list is
/// refused like an apply the server refuses (Degraded PolicyRefused, one
/// Event) and never deployed; a policy inside it is deployed; fixing the
/// image lifts the refusal.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn policy_outside_the_allow_list_is_refused_and_not_deployed() {
    let (env, ns, nodes, _agent) = sim_fleet("allowlist", 1).await;
    let _ctl = controller_with(
        &env,
        &ns,
        ControllerOptions {
            extra_args: vec![
                "--allowed-installer-images".into(),
                "ghcr.io/tenstorrent/*".into(),
            ],
            ..Default::default()
        },
    );
    let rogue = env.name("rogue");
    let spec = fleet_spec(
        &env,
        "2.8.0",
        "installer: {image: \"evil.example/agent:1\"}",
    );
    create_policy(&env, &rogue, &spec).await;
    let degraded = wait_refused(&env, &rogue).await;
    assert!(
        degraded.message.contains("spec.installer.image")
            && degraded.message.contains("evil.example/agent:1"),
        "{}",
        degraded.message
    );
    let daemonsets: Api<DaemonSet> = Api::namespaced(env.client.clone(), &ns);
    assert!(
        daemonsets
            .get_opt(&format!("ttdrv-{rogue}"))
            .await
            .expect("get daemonset")
            .is_none(),
        "a refused image is never deployed"
    );
    let events = refusal_events(&env, &rogue).await;
    assert_eq!(events.len(), 1, "{events:?}");

    // The image fixed: deployed, and the node is driven to the version.
    let fixed = serde_json::json!({ "installer": { "image": "ghcr.io/tenstorrent/agent:1" } });
    patch_policy(&env, &rogue, fixed).await;
    wait_nodes_state(&env, &rogue, &nodes, NodeState::Done, "2.8.0", T).await;
    let ds = daemonsets
        .get(&format!("ttdrv-{rogue}"))
        .await
        .expect("deployed once allowed");
    let image = ds
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|p| p.containers.first().and_then(|c| c.image.clone()));
    assert_eq!(image.as_deref(), Some("ghcr.io/tenstorrent/agent:1"));
    env.teardown().await;
}

/// Issue 49 item 2: a spec the controller refuses (a maintenance window in a
/// time zone that does not exist) on a policy whose nodes are Done changes
/// nothing the accepted spec set up: the DaemonSet keeps its template (no
/// installer pod is replaced, no node gets the refused version), the claims
/// stay, nothing is cordoned, and the policy is not Ready while refused.
/// Fixed, the rollout goes on.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn a_refused_spec_changes_nothing_the_accepted_one_set_up() {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::ListParams;
    let (env, ns, nodes, policy, _running) = installed_fleet("refused-spec", 2, "", T).await;
    let ds_name = format!("ttdrv-{policy}");
    let dss: Api<DaemonSet> = Api::namespaced(env.client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &ns);
    let ds_before = dss
        .get(&ds_name)
        .await
        .unwrap_or_else(|e| panic!("DaemonSet {ds_name}: {e}"));
    let installer_uids = || async {
        let lp = ListParams::default().labels("app.kubernetes.io/name=tt-driver-installer");
        let mut uids: Vec<String> = pods
            .list(&lp)
            .await
            .map(|l| l.items.into_iter().filter_map(|p| p.metadata.uid).collect())
            .unwrap_or_default();
        uids.sort();
        uids
    };
    let uids_before = installer_uids().await;
    assert_eq!(uids_before.len(), 2, "one installer pod per node");
    patch_policy(
        &env,
        &policy,
        serde_json::json!({ "version": "2.8.0", "upgradePolicy": { "maintenanceWindows": [
            { "days": ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"], "start": "00:00", "end": "24:00",
              "timeZone": "Europe/Berln" }
        ] } }),
    )
    .await;
    let degraded = wait_refused(&env, &policy).await;
    assert!(
        degraded.message.contains("Europe/Berln"),
        "the refusal names the zone: {}",
        degraded.message
    );
    let ready = wait_condition(&env, &policy, "Ready", "False/Refused", T, |c| {
        c.status == "False" && c.reason == "Refused"
    })
    .await;
    println!(
        "refused: Ready {} {}: {}",
        ready.status, ready.reason, ready.message
    );
    // Several passes (1 s resync) later, nothing of the refused spec is applied.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let ds_now = dss
        .get(&ds_name)
        .await
        .unwrap_or_else(|e| panic!("DaemonSet {ds_name}: {e}"));
    assert_eq!(
        ds_now.metadata.generation, ds_before.metadata.generation,
        "the refused spec changed the installer DaemonSet"
    );
    assert_eq!(
        installer_uids().await,
        uids_before,
        "installer pods were replaced for a refused spec"
    );
    for n in &nodes {
        let node = env.get_node(n).await;
        assert!(!unschedulable(&node), "{n} cordoned for a refused spec");
        assert_eq!(kmd(&node).as_deref(), Some("2.7.0"), "{n} left 2.7.0");
        let claim = node
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(ttdrv_api::labels::CLAIM))
            .cloned();
        assert_eq!(claim.as_deref(), Some(policy.as_str()), "{n}'s claim");
    }
    let st = status(&env, &policy).await;
    assert!(
        !st.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True"),
        "a refused policy is Ready: {:?}",
        st.conditions
    );
    // Fixed: the rollout to 2.8.0 goes on, and the policy is Ready again.
    patch_policy(
        &env,
        &policy,
        serde_json::json!({ "upgradePolicy": { "maintenanceWindows": [] } }),
    )
    .await;
    wait_nodes_state(&env, &policy, &nodes, NodeState::Done, "2.8.0", T).await;
    wait_condition(&env, &policy, "Ready", "True", T, |c| c.status == "True").await;
    env.teardown().await;
}

/// Issue 49: a cycle under way when the spec is refused goes on towards the
/// version the last accepted spec deployed (the installers' own), not the
/// refused one, and nothing else starts; fixed, the rollout goes on to the
/// new version. Each swap holds the node in Upgrading for 6 s, so the
/// refusal lands mid-swap.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn a_cycle_under_way_finishes_on_the_accepted_version_when_the_spec_is_refused() {
    let agent = ttdrv_testkit::SimAgentConfig {
        work: Duration::from_millis(300),
        load: Duration::from_secs(6),
        ..Default::default()
    };
    let (env, ns, nodes, _agent) =
        sim_fleet_with("refused-mid-cycle", &numbered_nodes(2), &[], agent).await;
    let _ctl = controller(&env, &ns);
    let policy = ttdrv_testkit::policy::installed(&env, &nodes, "", T).await;
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    let deadline = Instant::now() + T;
    let first = loop {
        let st = status(&env, &policy).await;
        if let Some(n) = st.nodes.iter().find(|n| n.state == NodeState::Upgrading) {
            break n.name.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no node Upgrading: {:?}",
            st.nodes
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    patch_policy(
        &env,
        &policy,
        serde_json::json!({ "version": "2.9.0", "upgradePolicy": { "maintenanceWindows": [
            { "days": ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"], "start": "00:00", "end": "24:00",
              "timeZone": "Europe/Berln" }
        ] } }),
    )
    .await;
    wait_refused(&env, &policy).await;
    // The swap under way ends on 2.8.0, its node back in service.
    let done = wait_node_at(&env, &policy, &first, NodeState::Done, Some("2.8.0"), T).await;
    println!("{first}: {:?} at {:?}", done.state, done.current_version);
    let node = env.get_node(&first).await;
    assert_eq!(kmd(&node).as_deref(), Some("2.8.0"), "{first}'s module");
    assert!(!unschedulable(&node), "{first} left cordoned");
    // Nothing else starts while the spec is refused, and the DaemonSet
    // still deploys the accepted 2.8.0.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let other = nodes.iter().find(|n| **n != first).expect("two nodes");
    let node = env.get_node(other).await;
    assert_eq!(kmd(&node).as_deref(), Some("2.7.0"), "{other} started");
    assert!(!unschedulable(&node), "{other} cordoned for a refused spec");
    let dss: Api<DaemonSet> = Api::namespaced(env.client.clone(), &ns);
    let ds = dss
        .get(&format!("ttdrv-{policy}"))
        .await
        .unwrap_or_else(|e| panic!("the DaemonSet: {e}"));
    assert_eq!(
        ttdrv_core::installer::deployed_target(Some(&ds)).map(|(v, _)| v),
        Some("2.8.0".to_string()),
        "the DaemonSet's version"
    );
    // Fixed: every node goes to 2.9.0.
    patch_policy(
        &env,
        &policy,
        serde_json::json!({ "upgradePolicy": { "maintenanceWindows": [] } }),
    )
    .await;
    wait_nodes_state(&env, &policy, &nodes, NodeState::Done, "2.9.0", T).await;
    env.teardown().await;
}
