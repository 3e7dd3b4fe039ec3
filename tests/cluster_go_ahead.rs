//! The go-ahead contract against the real control plane: a loaded tt-kmd is
//! replaced only inside the node's own cycle (cordoned, drained, record in
//! Upgrading with the go-ahead of that cycle), whatever brings an installer pod
//! of a new version onto the node first: a deleted installer pod, a node moved
//! to another pool, a policy deleted and re-created, a go-ahead copied from
//! another node or left from an earlier cycle.
//!
//! Each test runs a [`SafetyWatcher`] (every swap checked against the go-ahead
//! at that instant, Ready nodes cordoned by us counted) and a [`NodeLog`] (every
//! version of the test's nodes, in watch order) from before its action, and
//! judges from them at the end; the sleeps below only hold a window open for
//! the simulated agent to misbehave in, they never decide anything.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::ListParams;
use kube::runtime::watcher;
use ttdrv_api::{NodeState, TenstorrentDriverPolicy, labels};
use ttdrv_core::go_ahead::{self, GoAhead, Swap};
use ttdrv_core::machine::{Cordon, NodeRecord};
use ttdrv_testkit::{SimAgent, TestEnv, wait_for};

/// Bound of each wait; every test stays well under two minutes.
const T: Duration = Duration::from_secs(60);
/// How long a replacement installer pod of the new version is left on a node
/// that waits, before the rollout is let go on: the simulated agent re-decides
/// on every change of its Node, so it has its chances to swap without a go-ahead.
const WINDOW: Duration = Duration::from_secs(3);
const POOL: &str = "ttdrv-pool";

// ---------------------------------------------------------------------------
// Set-up

async fn setup(
    name: &str,
    pools: &[&str],
    work: Duration,
) -> (TestEnv, String, Vec<String>, SimAgent) {
    let env = TestEnv::new(name).await;
    let ns = env.namespace().await;
    let mut nodes = vec![];
    for (i, pool) in pools.iter().enumerate() {
        nodes.push(env.tt_node_name(&format!("n{i}"), &[(POOL, pool)]).await);
    }
    let agent = SimAgent::working(env.client.clone(), &ns, work);
    (env, ns, nodes, agent)
}

/// A rollout held at its first node: three nodes of pool `a` at 2.7.0 (an
/// agent taking `work` a swap), the watchers listening, the version changed to
/// 2.8.0, nodes[0] held in Draining by [`hold_drain`], the others Pending
/// waiting for its slot. Returns the environment, namespace, nodes, policy,
/// the watchers, and the agent and controller (they stop when dropped).
type Held = (
    TestEnv,
    String,
    Vec<String>,
    String,
    SafetyWatcher,
    NodeLog,
    (SimAgent, ttdrv_testkit::ControllerProcess),
);

async fn held_rollout(name: &str, work: Duration) -> Held {
    let (env, ns, nodes, agent) = setup(name, &["a", "a", "a"], work).await;
    let ctl = controller(&env, &ns);
    let policy = env.name("fleet");
    create_policy(&env, &policy, &spec(&env, "2.7.0", None)).await;
    wait_nodes_state(&env, &policy, &nodes, NodeState::Done, "2.7.0", T).await;
    hold_drain(&env, &ns, &nodes[0]).await;

    let safety = SafetyWatcher::start(&env);
    let log = NodeLog::start(&env);
    log.synced(&nodes).await;
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    wait_node(&env, &policy, &nodes[0], NodeState::Draining, T).await;
    for n in &nodes[1..] {
        wait_waiting_for_slot(&env, &policy, n).await;
    }
    (env, ns, nodes, policy, safety, log, (agent, ctl))
}

/// Build-ahead off: these tests put an installer pod of the new version on
/// a waiting node themselves, in a fixed order (node 0 drains first). With
/// it on, the controller does the same to every node, in the order builds
/// finish; tests/cluster_prepare.rs checks the go-ahead on that path.
fn spec(env: &TestEnv, version: &str, pool: Option<&str>) -> String {
    let pool = pool.map(|p| format!(", {POOL}: {p}")).unwrap_or_default();
    format!(
        "version: \"{version}\"\nnodeAffinity: {{matchLabels: {{ttdrv-test: {}{pool}}}}}\nupgradePolicy: {{maxUnavailable: 1, prepare: {{enabled: false}}}}",
        env.id
    )
}

// ---------------------------------------------------------------------------
// Reading the cluster

/// The node's (non-terminating) installer pod, if any.
async fn installer_pod(env: &TestEnv, ns: &str, node: &str) -> Option<Pod> {
    let api: Api<Pod> = Api::namespaced(env.client.clone(), ns);
    let lp = ListParams::default()
        .labels(labels::CLAIM)
        .fields(&format!("spec.nodeName={node}"));
    api.list(&lp)
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .find(|p| p.metadata.deletion_timestamp.is_none())
}

fn pod_brief(pod: &Option<Pod>) -> String {
    match pod {
        None => "no installer pod".into(),
        Some(p) => format!(
            "{} (uid {}, policy {:?}, TT_KMD_VERSION {:?}, ready {})",
            p.metadata.name.as_deref().unwrap_or(""),
            p.metadata.uid.as_deref().unwrap_or(""),
            p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(labels::CLAIM)),
            pod_version(p),
            ttdrv_testkit::pod_ready(p)
        ),
    }
}

/// Deletes the node's installer pod and waits until its DaemonSet has put a
/// pod of `policy` for `version` (a new one) in its place; returns that pod.
async fn replace_installer_pod(
    env: &TestEnv,
    ns: &str,
    node: &str,
    policy: &str,
    version: &str,
) -> Pod {
    let old = installer_pod(env, ns, node)
        .await
        .unwrap_or_else(|| panic!("{node} has no installer pod to delete"));
    let old_uid = old.metadata.uid.clone();
    Api::<Pod>::namespaced(env.client.clone(), ns)
        .delete(
            old.metadata.name.as_deref().unwrap_or_default(),
            &Default::default(),
        )
        .await
        .unwrap_or_else(|e| panic!("deleting the installer pod of {node}: {e}"));
    wait_installer(env, ns, node, policy, version, old_uid.as_deref()).await
}

/// Waits for an installer pod of `policy` for `version` on `node` (other than
/// the pod with uid `not`).
async fn wait_installer(
    env: &TestEnv,
    ns: &str,
    node: &str,
    policy: &str,
    version: &str,
    not: Option<&str>,
) -> Pod {
    wait_for(
        &format!("an installer pod of {policy} for {version} on {node}"),
        T,
        || async {
            let pod = installer_pod(env, ns, node).await;
            match &pod {
                Some(p)
                    if p.metadata.uid.as_deref() != not
                        && pod_version(p).as_deref() == Some(version)
                        && p.metadata
                            .labels
                            .as_ref()
                            .and_then(|l| l.get(labels::CLAIM))
                            .map(String::as_str)
                            == Some(policy) =>
                {
                    Ok(p.clone())
                }
                _ => Err(pod_brief(&pod)),
            }
        },
    )
    .await
}

/// The pod of the re-created policy's DaemonSet on `node`: the old DaemonSet
/// is normally garbage-collected with its pods and the new one creates them;
/// should the new policy have adopted the old DaemonSet before the collector
/// got to it (same name), its stale pod is deleted so that one from the new
/// template lands all the same.
async fn new_installer(env: &TestEnv, ns: &str, node: &str, policy: &str, version: &str) -> Pod {
    let start = std::time::Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        if let Some(p) = installer_pod(env, ns, node)
            .await
            .filter(|p| pod_version(p).as_deref() == Some(version))
        {
            return p;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    match installer_pod(env, ns, node).await {
        Some(stale) => {
            eprintln!(
                "{node}: no pod for {version} yet; replacing {}",
                pod_brief(&Some(stale))
            );
            replace_installer_pod(env, ns, node, policy, version).await
        }
        None => wait_installer(env, ns, node, policy, version, None).await,
    }
}

/// Waits until `node` waits for a slot in `policy`'s status.
async fn wait_waiting_for_slot(env: &TestEnv, policy: &str, node: &str) {
    wait_for(
        &format!(
            "{node} Pending ({}) in {policy}",
            ttdrv_core::reason::WAITING
        ),
        T,
        || async {
            match node_entry(env, policy, node).await {
                Some(e)
                    if e.state == NodeState::Pending
                        && e.reason.as_deref() == Some(ttdrv_core::reason::WAITING) =>
                {
                    Ok(())
                }
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
}

/// Asserts, at this instant, that `node` is still Pending (waiting for a slot)
/// in `policy` and still runs `loaded`.
async fn assert_still_waiting(env: &TestEnv, policy: &str, node: &str, loaded: &str) {
    let entry = node_entry(env, policy, node).await;
    assert!(
        entry
            .as_ref()
            .is_some_and(|e| e.state == NodeState::Pending),
        "{node} should still wait for its slot in {policy}: {entry:?}"
    );
    let n = env.get_node(node).await;
    assert_eq!(
        kmd(&n).as_deref(),
        Some(loaded),
        "{node} swapped its module while waiting for its slot: {}",
        brief(&n)
    );
}

async fn delete_policy(env: &TestEnv, name: &str) {
    let api: Api<TenstorrentDriverPolicy> = Api::all(env.client.clone());
    api.delete(name, &Default::default())
        .await
        .unwrap_or_else(|e| panic!("deleting policy {name}: {e}"));
    wait_for(&format!("policy {name} gone"), T, || async {
        match api.get_opt(name).await {
            Ok(None) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

fn record(n: &Node) -> Option<NodeRecord> {
    ttdrv_core::node::record(n).ok().flatten()
}

fn go_ahead_raw(n: &Node) -> Option<String> {
    ttdrv_core::node::annotation(n, labels::GO_AHEAD).map(String::from)
}

fn claim(n: &Node) -> Option<String> {
    ttdrv_core::node::label(n, labels::CLAIM).map(String::from)
}

/// One line per node version, for failure messages.
fn brief(n: &Node) -> String {
    let rec = record(n).map_or("-".to_string(), |r| {
        format!(
            "{}/{}->{} cycle {:?} cordon {:?}{}",
            r.policy,
            r.state.as_str(),
            r.target,
            r.started,
            r.cordon,
            if r.no_drain { " no-drain" } else { "" }
        )
    });
    let go = go_ahead_raw(n).map_or("-".to_string(), |raw| {
        serde_json::from_str::<GoAhead>(&raw).map_or(raw, |g| {
            format!("{}/{}->{} cycle {}", g.policy, g.node, g.target, g.cycle)
        })
    });
    format!(
        "kmd {:?} claim {:?} unschedulable {} record [{rec}] go-ahead [{go}]",
        kmd(n),
        claim(n),
        unschedulable(n)
    )
}

// ---------------------------------------------------------------------------
// The node log

/// Every version of this test's nodes the watch delivers, in order: the
/// record, go-ahead, cordon and loaded module of each node at each change.
struct NodeLog {
    events: Arc<Mutex<Vec<Node>>>,
    task: tokio::task::JoinHandle<()>,
}

impl NodeLog {
    fn start(env: &TestEnv) -> Self {
        let api: Api<Node> = Api::all(env.client.clone());
        let cfg = watcher::Config::default().labels(&env.selector());
        let events: Arc<Mutex<Vec<Node>>> = Arc::default();
        let out = events.clone();
        let task = tokio::spawn(async move {
            let mut stream = ttdrv_testkit::watch_applied(api, cfg);
            while let Some(n) = stream.next().await {
                if let Ok(mut v) = out.lock() {
                    v.push(n);
                }
            }
        });
        Self { events, task }
    }

    fn of(&self, node: &str) -> Vec<Node> {
        self.events
            .lock()
            .map(|v| {
                v.iter()
                    .filter(|n| n.metadata.name.as_deref() == Some(node))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Waits until the watch has delivered every listed node (both watchers
    /// of a test start together: the SafetyWatcher is listening by then too).
    async fn synced(&self, nodes: &[String]) {
        wait_for("the node watch to list the test's nodes", T, || async {
            let missing: Vec<&String> = nodes.iter().filter(|n| self.of(n).is_empty()).collect();
            if missing.is_empty() {
                Ok(())
            } else {
                Err(format!("not seen yet: {missing:?}"))
            }
        })
        .await
    }

    /// Waits until the record on `node` is `policy`'s, in `state`, for `target`.
    async fn wait_record(&self, node: &str, policy: &str, state: NodeState, target: &str) {
        wait_for(
            &format!("{node}'s record: {policy} {} for {target}", state.as_str()),
            T,
            || async {
                let hit = self.of(node).iter().any(|n| {
                    record(n).is_some_and(|r| {
                        r.policy == policy && r.state == state && r.target == target
                    })
                });
                if hit {
                    Ok(())
                } else {
                    Err(self.timeline(node))
                }
            },
        )
        .await
    }

    fn timeline(&self, node: &str) -> String {
        let evs = self.of(node);
        let skip = evs.len().saturating_sub(40);
        evs.iter()
            .enumerate()
            .skip(skip)
            .map(|(i, n)| format!("\n  #{i}: {}", brief(n)))
            .collect()
    }

    /// Every module swap (`kmd-version` a -> b) on `node`, as indexes into
    /// [`NodeLog::of`].
    fn swaps(&self, node: &str) -> Vec<usize> {
        let evs = self.of(node);
        (1..evs.len())
            .filter(|&i| {
                let (a, b) = (kmd(&evs[i - 1]), kmd(&evs[i]));
                a.is_some() && b.is_some() && a != b
            })
            .collect()
    }

    /// Every swap on `node` happened in a cycle of its own: at the swap the
    /// record is in Upgrading for the new version, with a drain, the node
    /// carries a go-ahead naming itself, its policy, the version and the
    /// record's cycle (the agent's own decision agrees), and earlier in that
    /// same cycle the record was in Draining on the cordoned node. Returns
    /// the swaps as `a -> b`.
    fn assert_swaps_in_own_cycles(&self, node: &str) -> Vec<String> {
        let evs = self.of(node);
        let mut seen = vec![];
        for i in self.swaps(node) {
            let (from, to) = (
                kmd(&evs[i - 1]).unwrap_or_default(),
                kmd(&evs[i]).unwrap_or_default(),
            );
            let at = &evs[i];
            let why = || {
                format!(
                    "{node}: swap {from} -> {to} at #{i}; timeline:{}",
                    self.timeline(node)
                )
            };
            let rec = record(at).unwrap_or_else(|| panic!("no record at the swap: {}", why()));
            assert!(
                rec.state == NodeState::Upgrading && rec.target == to && !rec.no_drain,
                "the record at the swap is not this version's Upgrading with a drain: {}",
                why()
            );
            assert_ne!(
                rec.cordon,
                Cordon::None,
                "swapped on a node not cordoned: {}",
                why()
            );
            assert!(
                unschedulable(at),
                "swapped on a schedulable node: {}",
                why()
            );
            let go: Option<GoAhead> = go_ahead_raw(at).and_then(|g| serde_json::from_str(&g).ok());
            assert_eq!(
                go,
                GoAhead::for_cycle(node, &rec),
                "the go-ahead at the swap is not this node's for this cycle: {}",
                why()
            );
            assert!(
                matches!(
                    go_ahead::decide(
                        at,
                        &rec.policy,
                        ttdrv_core::node::Target::version(&to),
                        Some(&from),
                        None
                    ),
                    Swap::GoAhead(_)
                ),
                "the agent's decision at the swap was not a go-ahead: {}",
                why()
            );
            let drained = evs[..i].iter().any(|n| {
                unschedulable(n)
                    && record(n).is_some_and(|r| {
                        r.policy == rec.policy
                            && r.state == NodeState::Draining
                            && r.started == rec.started
                    })
            });
            assert!(
                drained,
                "no Draining of this cycle before the swap: {}",
                why()
            );
            seen.push(format!(
                "{from} -> {to} in {}'s cycle {:?}",
                rec.policy, rec.started
            ));
        }
        seen
    }

    /// `node` swapped exactly once, `from` -> `to`, in its own cycle of
    /// `policy`; before its record reached Upgrading of that cycle it ran
    /// `from` throughout. Returns the record of that cycle.
    fn assert_one_swap_in_own_cycle(
        &self,
        node: &str,
        policy: &str,
        from: &str,
        to: &str,
    ) -> NodeRecord {
        self.assert_swaps_in_own_cycles(node);
        let evs = self.of(node);
        let swaps = self.swaps(node);
        let why = || format!("timeline of {node}:{}", self.timeline(node));
        assert_eq!(
            swaps.len(),
            1,
            "{node}: expected one swap {from} -> {to}: {}",
            why()
        );
        let i = swaps[0];
        assert_eq!(
            (kmd(&evs[i - 1]), kmd(&evs[i])),
            (Some(from.to_string()), Some(to.to_string())),
            "{node}: wrong swap: {}",
            why()
        );
        let rec = record(&evs[i]).unwrap_or_else(|| panic!("no record at the swap: {}", why()));
        assert_eq!(
            rec.policy,
            policy,
            "{node} swapped in another policy's cycle: {}",
            why()
        );
        let upgrading = evs
            .iter()
            .position(|n| {
                record(n).is_some_and(|r| {
                    r.policy == policy
                        && r.state == NodeState::Upgrading
                        && r.started == rec.started
                })
            })
            .unwrap_or(i);
        assert!(
            upgrading < i,
            "{node}: the module changed before its record reached Upgrading: {}",
            why()
        );
        assert!(
            evs[..upgrading]
                .iter()
                .all(|n| kmd(n).as_deref() == Some(from)),
            "{node} did not run {from} until its own cycle reached Upgrading: {}",
            why()
        );
        rec
    }
}

impl Drop for NodeLog {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// ---------------------------------------------------------------------------
// The common end of every test

/// The safety figures hold, and every node is Done at `version` in `policy`,
/// runs it, is schedulable and carries no gate label, no go-ahead.
async fn assert_settled(
    env: &TestEnv,
    policy: &str,
    nodes: &[String],
    version: &str,
    safety: &SafetyWatcher,
    log: &NodeLog,
    max_unavailable: usize,
) -> SafetySeen {
    wait_nodes_state(env, policy, nodes, NodeState::Done, version, T).await;
    let seen = safety.seen();
    eprintln!(
        "safety: max Ready cordoned by us {}, max in cycle {}, swaps {:?}",
        seen.max_ready_cordoned_by_us, seen.max_in_cycle, seen.swaps
    );
    safety.assert_safe(max_unavailable, None, "at the end (maxUnavailable)");
    for n in nodes {
        let node = env.get_node(n).await;
        assert_eq!(
            kmd(&node).as_deref(),
            Some(version),
            "{n} at the end: {}",
            brief(&node)
        );
        assert!(!unschedulable(&node), "{n} left cordoned: {}", brief(&node));
        assert!(
            gate_labels(&node).is_empty(),
            "{n} still has deploy gates: {:?}",
            gate_labels(&node)
        );
        assert_eq!(
            go_ahead_raw(&node),
            None,
            "{n} kept a go-ahead after its cycle: {}",
            brief(&node)
        );
        log.assert_swaps_in_own_cycles(n);
    }
    seen
}

/// [`assert_settled`] at `to` with maxUnavailable 1, and every node swapped
/// exactly once, `from` -> `to`, in its own cycle.
async fn assert_each_swapped_once(
    env: &TestEnv,
    policy: &str,
    nodes: &[String],
    (from, to): (&str, &str),
    safety: &SafetyWatcher,
    log: &NodeLog,
) {
    let seen = assert_settled(env, policy, nodes, to, safety, log, 1).await;
    for n in nodes {
        log.assert_one_swap_in_own_cycle(n, policy, from, to);
    }
    assert_eq!(
        seen.swaps.len(),
        nodes.len(),
        "one swap per node: {:?}",
        seen.swaps
    );
}

// ---------------------------------------------------------------------------
// The tests

/// A waiting node whose installer pod is deleted gets one from the new
/// template at once (OnDelete): it must keep its module until its own turn.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn replaced_installer_pod_of_a_waiting_node_waits_for_its_turn() {
    let (env, ns, nodes, policy, safety, log, _running) =
        held_rollout("ga-replaced", Duration::from_millis(300)).await;
    for n in &nodes[1..] {
        let pod = replace_installer_pod(&env, &ns, n, &policy, "2.8.0").await;
        eprintln!("{n}: replacement installer pod {}", pod_brief(&Some(pod)));
    }
    // The new pods run their agent while their nodes wait behind the held drain.
    tokio::time::sleep(WINDOW).await;
    for n in &nodes[1..] {
        assert_still_waiting(&env, &policy, n, "2.7.0").await;
    }
    release_drain(&env, &ns).await;

    let versions = ("2.7.0", "2.8.0");
    assert_each_swapped_once(&env, &policy, &nodes, versions, &safety, &log).await;
    env.teardown().await;
}

/// A node relabelled from pool A (2.7.0) to pool B (2.8.0) gets B's installer
/// pod as soon as B claims it; B must cordon and drain it before the swap.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn node_moved_to_another_pool_is_swapped_only_in_a_cycle() {
    let (env, ns, nodes, _agent) = setup("ga-moved", &["a", "b"], Duration::from_millis(300)).await;
    let _ctl = controller(&env, &ns);
    let (a, b) = (env.name("pool-a"), env.name("pool-b"));
    create_policy(&env, &a, &spec(&env, "2.7.0", Some("a"))).await;
    create_policy(&env, &b, &spec(&env, "2.8.0", Some("b"))).await;
    wait_nodes_state(&env, &a, &nodes[..1], NodeState::Done, "2.7.0", T).await;
    wait_nodes_state(&env, &b, &nodes[1..], NodeState::Done, "2.8.0", T).await;
    let moved = &nodes[0];
    hold_drain(&env, &ns, moved).await;

    let safety = SafetyWatcher::start(&env);
    let log = NodeLog::start(&env);
    log.synced(&nodes).await;
    env.label_node(moved, POOL, Some("b")).await;
    // B's pod lands while B holds the node in Draining (its drain is blocked):
    // cordoned, but not drained, so no go-ahead yet.
    wait_node(&env, &b, moved, NodeState::Draining, T).await;
    let pod = wait_installer(&env, &ns, moved, &b, "2.8.0", None).await;
    eprintln!("{moved}: B's installer pod {}", pod_brief(&Some(pod)));
    tokio::time::sleep(WINDOW).await;
    let n = env.get_node(moved).await;
    assert_eq!(
        kmd(&n).as_deref(),
        Some("2.7.0"),
        "{moved} swapped before B drained it: {}",
        brief(&n)
    );
    assert_eq!(
        go_ahead_raw(&n),
        None,
        "a go-ahead before the drain ended: {}",
        brief(&n)
    );
    release_drain(&env, &ns).await;

    assert_settled(&env, &b, &nodes, "2.8.0", &safety, &log, 1).await;
    let rec = log.assert_one_swap_in_own_cycle(moved, &b, "2.7.0", "2.8.0");
    assert_eq!(rec.cordon, Cordon::Ours, "B cordoned it for the swap");
    assert!(
        log.swaps(&nodes[1]).is_empty(),
        "{} (already at 2.8.0 in B) was swapped: {}",
        nodes[1],
        log.timeline(&nodes[1])
    );
    let n = env.get_node(moved).await;
    assert_eq!(claim(&n).as_deref(), Some(b.as_str()), "{}", brief(&n));
    // A no longer counts the node. (Its `status.nodes` keeps the old entry:
    // an empty list is left out of the status merge patch; not asserted here.)
    let t0 = std::time::Instant::now();
    wait_for(&format!("{a}'s status to count no node"), T, || async {
        let st = status(&env, &a).await;
        if st.summary.matched == 0 {
            Ok(())
        } else {
            Err(format!("{:?} {:?}", st.summary, st.nodes))
        }
    })
    .await;
    eprintln!("{a}'s status counts no node after {:?}", t0.elapsed());
    env.teardown().await;
}

/// A policy deleted mid-rollout and re-created with a newer version: first
/// at once while a node drains, then, after the controller has released the
/// nodes, while a node is in Upgrading. New DaemonSet pods land on every
/// node; none may swap outside a cycle, and no cordon is left behind.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn policy_recreated_mid_rollout_swaps_nothing_outside_a_cycle() {
    // A slower agent keeps a node in Upgrading long enough to delete the policy there.
    let (env, ns, nodes, policy, safety, log, _running) =
        held_rollout("ga-recreated", Duration::from_secs(2)).await;

    // 1. Deleted while nodes[0] drains, re-created at once with 2.9.0.
    delete_policy(&env, &policy).await;
    create_policy(&env, &policy, &spec(&env, "2.9.0", None)).await;
    for n in &nodes {
        let pod = new_installer(&env, &ns, n, &policy, "2.9.0").await;
        eprintln!("{n}: {}", pod_brief(&Some(pod)));
    }
    wait_node(&env, &policy, &nodes[0], NodeState::Draining, T).await;
    tokio::time::sleep(WINDOW).await;
    for n in &nodes[1..] {
        assert_still_waiting(&env, &policy, n, "2.7.0").await;
    }

    // 2. Deleted while nodes[0] is in Upgrading with its go-ahead, its agent
    // held back (sim fail annotation) so that the go-ahead is revoked before
    // the agent acts on it.
    let hold = ttdrv_testkit::sim_agent::FAIL_ANNOTATION;
    env.annotate_node(&nodes[0], hold, Some("true")).await;
    release_drain(&env, &ns).await;
    // The record on the Node, not the status (written at most once a second).
    log.wait_record(&nodes[0], &policy, NodeState::Upgrading, "2.9.0")
        .await;
    let n0 = env.get_node(&nodes[0]).await;
    assert!(
        go_ahead_raw(&n0).is_some() && kmd(&n0).as_deref() == Some("2.7.0"),
        "{} should be in Upgrading with its go-ahead, 2.7.0 still loaded: {}",
        nodes[0],
        brief(&n0)
    );
    delete_policy(&env, &policy).await;
    for n in &nodes {
        wait_for(
            &format!("{n} released by the deleted policy"),
            T,
            || async {
                let node = env.get_node(n).await;
                let released = !unschedulable(&node)
                    && gate_labels(&node).is_empty()
                    && record(&node).is_none()
                    && go_ahead_raw(&node).is_none()
                    && claim(&node).is_none();
                if released { Ok(()) } else { Err(brief(&node)) }
            },
        )
        .await;
    }
    // The agent is let go; whatever installer pod of 2.9.0 is still around
    // finds no go-ahead any more.
    env.annotate_node(&nodes[0], hold, None).await;
    // The collector and the DaemonSet controller (the claim is gone) usually
    // have removed it by now; if not, it gets its chances to swap.
    let leftover = installer_pod(&env, &ns, &nodes[0]).await;
    eprintln!(
        "after the second deletion, on {}: {}",
        nodes[0],
        pod_brief(&leftover)
    );
    if leftover.is_some() {
        tokio::time::sleep(WINDOW).await;
    }
    for n in &nodes {
        let node = env.get_node(n).await;
        assert_eq!(
            kmd(&node).as_deref(),
            Some("2.7.0"),
            "{n} swapped after the policy (and its go-ahead) went: {}",
            brief(&node)
        );
    }
    create_policy(&env, &policy, &spec(&env, "2.10.0", None)).await;

    let versions = ("2.7.0", "2.10.0");
    assert_each_swapped_once(&env, &policy, &nodes, versions, &safety, &log).await;
    env.teardown().await;
}

/// A go-ahead copied from another node, and one naming the node but left from
/// an earlier cycle, open nothing: the waiting nodes keep their module, with
/// the new installer pod running, until their own cycle.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn stale_or_copied_go_ahead_opens_nothing() {
    // A slower agent keeps nodes[0] in Upgrading (go-ahead present) a while.
    let (env, ns, nodes, policy, safety, log, _running) =
        held_rollout("ga-forged", Duration::from_secs(2)).await;
    for n in &nodes[1..] {
        replace_installer_pod(&env, &ns, n, &policy, "2.8.0").await;
    }

    // nodes[1]: a go-ahead naming it, its policy and the new version, but for
    // its earlier cycle (the one its record still names).
    let (stale_node, copy_node) = (&nodes[1], &nodes[2]);
    let old = record(&env.get_node(stale_node).await)
        .unwrap_or_else(|| panic!("{stale_node} has no record"));
    let stale = GoAhead {
        policy: policy.clone(),
        node: stale_node.clone(),
        target: "2.8.0".into(),
        cycle: old.started.unwrap_or(1),
        unload: false,
    };
    let stale_raw = serde_json::to_string(&stale).expect("go-ahead");
    env.annotate_node(stale_node, labels::GO_AHEAD, Some(&stale_raw))
        .await;
    tokio::time::sleep(WINDOW).await;
    assert_still_waiting(&env, &policy, stale_node, "2.7.0").await;

    // nodes[2]: the go-ahead nodes[0] gets when its drain ends, copied over.
    release_drain(&env, &ns).await;
    let copied = wait_for(&format!("the go-ahead of {}", nodes[0]), T, || async {
        log.of(&nodes[0])
            .iter()
            .find_map(go_ahead_raw)
            .ok_or_else(|| log.timeline(&nodes[0]))
    })
    .await;
    env.annotate_node(copy_node, labels::GO_AHEAD, Some(&copied))
        .await;
    assert_still_waiting(&env, &policy, copy_node, "2.7.0").await;
    eprintln!("copied onto {copy_node}: {copied}; stale on {stale_node}: {stale_raw}");

    assert_settled(&env, &policy, &nodes, "2.8.0", &safety, &log, 1).await;
    for (n, forged) in [(stale_node, &stale_raw), (copy_node, &copied)] {
        let rec = log.assert_one_swap_in_own_cycle(n, &policy, "2.7.0", "2.8.0");
        let evs = log.of(n);
        let carried = evs
            .iter()
            .position(|e| go_ahead_raw(e).as_ref() == Some(forged))
            .unwrap_or_else(|| panic!("{n} never carried the forged go-ahead:{}", log.timeline(n)));
        assert_eq!(
            kmd(&evs[carried]).as_deref(),
            Some("2.7.0"),
            "{n} carried the forged go-ahead with 2.7.0 loaded: {}",
            log.timeline(n)
        );
        assert_ne!(
            go_ahead_raw(&evs[log.swaps(n)[0]]).as_ref(),
            Some(forged),
            "{n} swapped under the forged go-ahead: {}",
            log.timeline(n)
        );
        assert!(
            rec.started != Some(stale.cycle),
            "{n}'s own cycle must be a new one: {rec:?}"
        );
    }
    env.teardown().await;
}
