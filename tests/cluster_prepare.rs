//! Build ahead against the real control plane (issue 22): when the version
//! changes, installer pods are replaced ahead of their node's cycle, at most
//! `prepare.maxConcurrent` nodes building at once; a node is cordoned only
//! once its agent has built the target into its cache (`kmd-prepared`); a
//! build that fails fails its node before any cordon; `prepare.enabled:
//! false` builds inside the window, as before.
//!
//! A [`BuildLog`] watches the test's nodes and installer pods together from
//! before the version change and judges from what it saw: per node, the order
//! of `kmd-prepared` and the cordon; at every instant, how many nodes were
//! building (a current installer pod, the target neither prepared nor loaded).

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use ttdrv_api::{NodeState, labels};
use ttdrv_testkit::policy::get_policy;
use ttdrv_testkit::sim_agent::BUILD_FAIL_ANNOTATION;
use ttdrv_testkit::{SimAgentConfig, TestEnv, wait_for};

/// Bound of each wait.
const T: Duration = Duration::from_secs(90);

/// This test's `n` nodes at 2.7.0 under policy `fleet` (maxUnavailable 1,
/// `prepare` its build-ahead settings), the controller, and an agent that takes
/// `build` to build a target and 200 ms for each of the rest. Returns the
/// environment, namespace, nodes, policy, and the controller and agent.
async fn setup(name: &str, n: usize, build: Duration, prepare: &str) -> InstalledFleet {
    let agent = SimAgentConfig {
        namespace: String::new(),
        work: Duration::from_millis(200),
        build,
        load: Duration::from_millis(200),
        ..Default::default()
    };
    let (env, ns, nodes, agent) = sim_fleet_with(name, &numbered_nodes(n), &[], agent).await;
    let ctl = controller(&env, &ns);
    let extra = format!("upgradePolicy: {{maxUnavailable: 1, prepare: {prepare}}}");
    let policy = installed(&env, &nodes, &extra, T).await;
    (env, ns, nodes, policy, (ctl, agent))
}

fn label(n: &Node, key: &str) -> Option<String> {
    n.metadata.labels.as_ref()?.get(key).cloned()
}

/// What the [`BuildLog`] saw.
#[derive(Clone, Debug, Default)]
struct Seen {
    /// Per node, in watch order: "prepared" when `kmd-prepared` first names
    /// the target, "cordon" when first cordoned, "loaded" when the target is
    /// first loaded.
    order: BTreeMap<String, Vec<&'static str>>,
    /// Most nodes building the target at one instant.
    max_building: usize,
}

/// Nodes and installer pods of one test, watched together.
struct BuildLog {
    seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

enum Change {
    Node(Node),
    Pod(Pod),
    PodGone(Pod),
}

impl BuildLog {
    fn start(env: &TestEnv, ns: &str, target: &str) -> Self {
        let nodes = watcher(
            Api::<Node>::all(env.client.clone()),
            watcher::Config::default().labels(&env.selector()),
        )
        .default_backoff()
        .applied_objects()
        .map_ok(Change::Node)
        .boxed();
        let pods = watcher(
            Api::<Pod>::namespaced(env.client.clone(), ns),
            watcher::Config::default().labels(labels::CLAIM),
        )
        .default_backoff()
        .touched_objects()
        .map_ok(|p| {
            if p.metadata.deletion_timestamp.is_some() {
                Change::PodGone(p)
            } else {
                Change::Pod(p)
            }
        })
        .boxed();
        let seen: Arc<Mutex<Seen>> = Arc::default();
        let out = seen.clone();
        let target = target.to_string();
        let task = tokio::spawn(async move {
            let mut stream = futures::stream::select(nodes, pods);
            let mut node_of: BTreeMap<String, Node> = BTreeMap::new();
            // Node -> (pod name, its version) of its live installer pod.
            let mut pod_of: BTreeMap<String, (String, Option<String>)> = BTreeMap::new();
            // A watch error re-lists after its backoff; the log goes on.
            while let Some(change) = stream.next().await {
                let Ok(change) = change else { continue };
                let Ok(mut s) = out.lock() else { return };
                match change {
                    Change::Node(n) => {
                        let name = n.metadata.name.clone().unwrap_or_default();
                        let order = s.order.entry(name.clone()).or_default();
                        let mut note = |what: &'static str| {
                            if !order.contains(&what) {
                                order.push(what);
                            }
                        };
                        if label(&n, labels::KMD_PREPARED).as_deref() == Some(target.as_str()) {
                            note("prepared");
                        }
                        if unschedulable(&n) {
                            note("cordon");
                        }
                        if kmd(&n).as_deref() == Some(target.as_str()) {
                            note("loaded");
                        }
                        node_of.insert(name, n);
                    }
                    Change::Pod(p) => {
                        let node = p
                            .spec
                            .as_ref()
                            .and_then(|s| s.node_name.clone())
                            .unwrap_or_default();
                        let name = p.metadata.name.clone().unwrap_or_default();
                        pod_of.insert(node, (name, pod_version(&p)));
                    }
                    Change::PodGone(p) => {
                        let name = p.metadata.name.clone().unwrap_or_default();
                        pod_of.retain(|_, (n, _)| *n != name);
                    }
                }
                let building = pod_of
                    .iter()
                    .filter(|(node, (_, v))| {
                        v.as_deref() == Some(target.as_str())
                            && node_of.get(*node).is_some_and(|n| {
                                label(n, labels::KMD_PREPARED).as_deref() != Some(target.as_str())
                                    && kmd(n).as_deref() != Some(target.as_str())
                            })
                    })
                    .count();
                s.max_building = s.max_building.max(building);
            }
        });
        Self { seen, task }
    }

    fn seen(&self) -> Seen {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Waits until the watch has listed every one of `nodes`.
    async fn synced(&self, nodes: &[String]) {
        wait_for("the build log to list the nodes", T, || async {
            let s = self.seen();
            if nodes.iter().all(|n| s.order.contains_key(n)) {
                Ok(())
            } else {
                Err(format!("{:?}", s.order.keys()))
            }
        })
        .await
    }
}

impl Drop for BuildLog {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn condition(p: &ttdrv_api::TenstorrentDriverPolicy, type_: &str) -> Option<(String, String)> {
    p.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

/// Four nodes at 2.7.0 move to 2.8.0 with a build of 2 s and two places:
/// every node is prepared before its cordon, never more than two build at
/// once, one node at a time is cordoned, every swap has its go-ahead.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn nodes_build_ahead_within_max_concurrent_and_are_cordoned_only_once_prepared() {
    let prepare = "{maxConcurrent: 2}";
    let (env, ns, nodes, policy, _running) =
        setup("prep-ahead", 4, Duration::from_secs(2), prepare).await;

    let safety = SafetyWatcher::start(&env);
    let log = BuildLog::start(&env, &ns, "2.8.0");
    log.synced(&nodes).await;
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    wait_nodes_state(&env, &policy, &nodes, NodeState::Done, "2.8.0", T).await;

    let seen = log.seen();
    eprintln!("build log: {seen:?}");
    for n in &nodes {
        assert_eq!(
            seen.order.get(n).map(Vec::as_slice),
            Some(["prepared", "cordon", "loaded"].as_slice()),
            "{n}: built ahead, then cordoned, then loaded"
        );
        let node = env.get_node(n).await;
        assert!(!unschedulable(&node), "{n} left cordoned");
    }
    assert!(
        seen.max_building <= 2,
        "{} nodes built at once (maxConcurrent 2)",
        seen.max_building
    );
    assert!(
        seen.max_building >= 1,
        "the log saw no build at all: {seen:?}"
    );
    safety.assert_safe(1, None, "after the rollout");
    wait_for("Prepared True and the count", T, || async {
        let p = get_policy(&env, &policy).await;
        let prepared = p.status.as_ref().map(|s| s.summary.prepared);
        match (condition(&p, "Prepared"), prepared) {
            (Some((s, r)), Some(4)) if s == "True" && r == "AllPrepared" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    env.teardown().await;
}

/// A node whose build of the target fails is Failed (BuildFailed) without
/// ever being cordoned, the policy is Degraded and no cordon starts after
/// it; once the cause is gone, a retry builds it again and the rollout ends.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn a_build_that_fails_ahead_fails_its_node_uncordoned_and_halts_the_rollout() {
    let (env, ns, nodes, policy, _running) =
        setup("prep-fail", 3, Duration::from_secs(1), "{}").await;
    let bad = &nodes[0];
    env.annotate_node(bad, BUILD_FAIL_ANNOTATION, Some("2.8.0"))
        .await;

    let log = BuildLog::start(&env, &ns, "2.8.0");
    let cordons = CordonWatcher::start(&env);
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    let entry = wait_node(&env, &policy, bad, NodeState::Failed, T).await;
    assert_eq!(entry.reason.as_deref(), Some("BuildFailed"), "{entry:?}");
    assert_message(&entry, "not cordoned");
    let p = get_policy(&env, &policy).await;
    assert_eq!(
        condition(&p, "Degraded").map(|c| c.0).as_deref(),
        Some("True")
    );
    // Halted: whatever had started finishes, nothing new is cordoned.
    let settled_cordons = cordons.ever().len();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        cordons.ever().len(),
        settled_cordons,
        "a cordon started after the failure: {:?}",
        cordons.ever()
    );
    assert!(
        !cordons.ever().contains(bad),
        "the node whose build failed was cordoned: {:?}",
        cordons.ever()
    );

    env.annotate_node(bad, BUILD_FAIL_ANNOTATION, None).await;
    env.annotate_node(bad, ttdrv_core::node::RETRY_ANNOTATION, Some("1"))
        .await;
    wait_nodes_state(&env, &policy, &nodes, NodeState::Done, "2.8.0", T).await;
    let seen = log.seen();
    assert_eq!(
        seen.order.get(bad).map(Vec::as_slice),
        Some(["prepared", "cordon", "loaded"].as_slice()),
        "after the retry {bad} built ahead before its cordon: {seen:?}"
    );
    env.teardown().await;
}

/// `prepare.enabled: false`: the installer pod is replaced after the drain,
/// so each node is cordoned before it is prepared (the build is inside the
/// window): the switch turns build-ahead off.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn prepare_disabled_builds_inside_the_cordon_window() {
    let (env, ns, nodes, policy, _running) =
        setup("prep-off", 2, Duration::from_secs(1), "{enabled: false}").await;
    let log = BuildLog::start(&env, &ns, "2.8.0");
    log.synced(&nodes).await;
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    wait_nodes_state(&env, &policy, &nodes, NodeState::Done, "2.8.0", T).await;
    let seen = log.seen();
    for n in &nodes {
        assert_eq!(
            seen.order.get(n).map(Vec::as_slice),
            Some(["cordon", "prepared", "loaded"].as_slice()),
            "{n}: cordoned, then built, then loaded: {seen:?}"
        );
    }
    let p = get_policy(&env, &policy).await;
    assert_eq!(
        condition(&p, "Prepared"),
        Some(("False".to_string(), "Disabled".to_string()))
    );
    env.teardown().await;
}

/// A host that moved to a DKMS install while its labels still say the
/// container's module: its installer pod, replaced ahead, reports the DKMS
/// install while the node serves, and the node ends HostManaged without ever
/// being cordoned (before build-ahead it was cordoned and drained first).
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn a_dkms_host_is_recognized_ahead_and_never_cordoned() {
    let (env, _ns, nodes, policy, _running) =
        setup("prep-dkms", 2, Duration::from_secs(1), "{}").await;
    let dkms = &nodes[0];
    env.annotate_node(
        dkms,
        ttdrv_testkit::sim_agent::HOST_MANAGED_ANNOTATION,
        Some("2.6.1"),
    )
    .await;
    let cordons = CordonWatcher::start(&env);
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    wait_nodes_state(&env, &policy, &nodes[1..], NodeState::Done, "2.8.0", T).await;
    let entry = wait_node(&env, &policy, dkms, NodeState::Done, T).await;
    assert_eq!(entry.reason.as_deref(), Some("HostManaged"), "{entry:?}");
    assert!(
        !cordons.ever().contains(dkms),
        "the DKMS host was cordoned: {:?}",
        cordons.ever()
    );
    env.teardown().await;
}
