//! Canary promotion (issue 34, `spec.promoteAfter`): a production policy
//! rolls a version out only once its canary policy has been Ready at that
//! version for `soakSeconds` with no Failed node; a halted canary blocks it.
//! Real control plane, the controller binary, the simulated agent, two
//! policies on disjoint pools of kwok nodes.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::runtime::watcher;
use ttdrv_api::NodeState;
use ttdrv_testkit::TestEnv;
use ttdrv_testkit::policy::wait_nodes;
use ttdrv_testkit::sim_agent::VALIDATION_FAILS_ANNOTATION;

const T: Duration = Duration::from_secs(90);
const POOL: &str = "tt.tenstorrent.com/pool";
const SOAK: i64 = 5;

/// Wall-clock seconds (fractional), the clock the API server stamps its
/// conditions with on this machine.
fn now_f64() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}

/// Watches the test's nodes and notes, per node, when it was first seen in
/// a cycle: cordoned, or its record (the controller's, on the node) in a
/// state past Pending. Wall-clock seconds, and the record's `started`.
/// Per node: when first seen in a cycle (wall clock), and its record's `started`.
type FirstSeen = Arc<Mutex<BTreeMap<String, (f64, Option<i64>)>>>;

struct CycleWatcher {
    first: FirstSeen,
    task: tokio::task::JoinHandle<()>,
}

impl CycleWatcher {
    fn start(env: &TestEnv) -> Self {
        let api: Api<Node> = Api::all(env.client.clone());
        let cfg = watcher::Config::default().labels(&env.selector());
        let first: FirstSeen = Arc::default();
        let out = first.clone();
        let task = tokio::spawn(async move {
            let mut stream = ttdrv_testkit::watch_applied(api, cfg);
            while let Some(n) = stream.next().await {
                let name = n.metadata.name.clone().unwrap_or_default();
                let rec = ttdrv_core::node::record(&n).ok().flatten();
                let in_cycle = rec.as_ref().is_some_and(|r| r.state.is_in_progress());
                if (unschedulable(&n) || in_cycle)
                    && let Ok(mut m) = out.lock()
                {
                    m.entry(name)
                        .or_insert((now_f64(), rec.and_then(|r| r.started)));
                }
            }
        });
        Self { first, task }
    }

    fn first(&self, node: &str) -> Option<(f64, Option<i64>)> {
        self.first.lock().ok().and_then(|m| m.get(node).copied())
    }

    fn any_of(&self, nodes: &[String]) -> Vec<String> {
        self.first
            .lock()
            .map(|m| m.keys().filter(|n| nodes.contains(n)).cloned().collect())
            .unwrap_or_default()
    }
}

impl Drop for CycleWatcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The pools: `canary` nodes for the canary policy, `prod` ones for
/// production; both policies installed at 2.7.0 (first installs, which the
/// promotion does not hold), production with `promoteAfter`.
struct Pools {
    env: TestEnv,
    canary: String,
    prod: String,
    canary_nodes: Vec<String>,
    prod_nodes: Vec<String>,
    running: (ttdrv_testkit::ControllerProcess, ttdrv_testkit::SimAgent),
}

async fn pools(name: &str, canary_n: usize, prod_n: usize) -> Pools {
    let env = TestEnv::new(name).await;
    let ns = env.namespace().await;
    let mut canary_nodes = vec![];
    for i in 0..canary_n {
        canary_nodes.push(
            env.tt_node_name(&format!("c{i}"), &[(POOL, "canary")])
                .await,
        );
    }
    let mut prod_nodes = vec![];
    for i in 0..prod_n {
        prod_nodes.push(env.tt_node_name(&format!("p{i}"), &[(POOL, "prod")]).await);
    }
    let agent = ttdrv_testkit::SimAgent::spawn(
        env.client.clone(),
        ttdrv_testkit::SimAgentConfig {
            namespace: ns.clone(),
            ..sim_agent_300ms()
        },
    );
    let ctl = controller(&env, &ns);
    let sel = |p: &str| format!("{{matchLabels: {{ttdrv-test: {}, {POOL}: {p}}}}}", env.id);
    let canary = env.name("canary");
    let prod = env.name("prod");
    create_policy(
        &env,
        &canary,
        &format!("version: \"2.7.0\"\nnodeAffinity: {}", sel("canary")),
    )
    .await;
    create_policy(
        &env,
        &prod,
        &format!(
            "version: \"2.7.0\"\nnodeAffinity: {}\npromoteAfter: {{policy: {canary}, soakSeconds: {SOAK}}}",
            sel("prod")
        ),
    )
    .await;
    wait_nodes(
        &env,
        &canary,
        &canary_nodes,
        NodeState::Done,
        Some("2.7.0"),
        T,
    )
    .await;
    wait_nodes(&env, &prod, &prod_nodes, NodeState::Done, Some("2.7.0"), T).await;
    Pools {
        env,
        canary,
        prod,
        canary_nodes,
        prod_nodes,
        running: (ctl, agent),
    }
}

/// Every production node is Pending with reason WaitingForPromotion and a
/// message containing `part`; returns the first node's entry.
async fn prod_waits(p: &Pools, part: &str) -> ttdrv_api::NodeStatus {
    let what = format!("{:?} Pending, WaitingForPromotion, {part:?}", p.prod_nodes);
    ttdrv_testkit::policy::wait_status(&p.env, &p.prod, &what, T, |st| {
        let entries: Vec<_> = p
            .prod_nodes
            .iter()
            .map(|n| st.nodes.iter().find(|e| &e.name == n).cloned())
            .collect();
        let ok = entries.iter().all(|e| {
            e.as_ref().is_some_and(|e| {
                e.state == NodeState::Pending
                    && e.reason.as_deref() == Some("WaitingForPromotion")
                    && e.message.as_deref().is_some_and(|m| m.contains(part))
            })
        });
        match entries.first() {
            Some(Some(e)) if ok => Ok(e.clone()),
            _ => Err(format!("{entries:?}")),
        }
    })
    .await
}

/// No production node was cordoned, in a cycle, or moved off 2.7.0.
async fn prod_untouched(p: &Pools, cycles: &CycleWatcher, when: &str) {
    assert_eq!(
        cycles.any_of(&p.prod_nodes),
        Vec::<String>::new(),
        "{when}: a production node started a cycle"
    );
    for n in &p.prod_nodes {
        let node = p.env.get_node(n).await;
        assert!(!unschedulable(&node), "{when}: {n} is cordoned");
        assert_eq!(kmd(&node).as_deref(), Some("2.7.0"), "{when}: {n}");
    }
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn production_upgrades_only_after_the_canary_is_ready_for_the_soak() {
    let p = pools("promote-soak", 1, 2).await;
    let watcher = SafetyWatcher::start(&p.env);
    let cycles = CycleWatcher::start(&p.env);
    // Production first: it must wait for a canary that has not even begun.
    patch_policy(&p.env, &p.prod, serde_json::json!({ "version": "2.8.0" })).await;
    let waiting = prod_waits(&p, "waiting for the canary policy").await;
    assert_message(&waiting, &p.canary);
    assert_message(&waiting, "not at 2.8.0 yet");
    let progressing = wait_condition(
        &p.env,
        &p.prod,
        "Progressing",
        "True, WaitingForPromotion",
        T,
        |c| c.status == "True" && c.reason == "WaitingForPromotion",
    )
    .await;
    assert!(progressing.message.contains(&p.canary), "{progressing:?}");
    prod_untouched(&p, &cycles, "before the canary moved").await;

    // The canary goes; production keeps waiting through its rollout.
    patch_policy(&p.env, &p.canary, serde_json::json!({ "version": "2.8.0" })).await;
    wait_nodes(
        &p.env,
        &p.canary,
        &p.canary_nodes,
        NodeState::Done,
        Some("2.8.0"),
        T,
    )
    .await;
    let ready = wait_condition(&p.env, &p.canary, "Ready", "True at 2.8.0", T, |c| {
        c.status == "True"
    })
    .await;
    let ready_at = ready.last_transition_time.0.as_second();
    let ready_seen = now_f64();
    assert_eq!(
        status(&p.env, &p.canary).await.desired_version.as_deref(),
        Some("2.8.0")
    );
    // During the soak: production still waits, and says until when.
    if now_f64() < (ready_at + SOAK) as f64 - 1.5 {
        let soaking = prod_waits(&p, "the promotion opens at").await;
        assert_message(&soaking, "soakSeconds 5");
        prod_untouched(&p, &cycles, "during the canary's soak").await;
    }

    // Then production upgrades, one node at a time.
    wait_nodes(
        &p.env,
        &p.prod,
        &p.prod_nodes,
        NodeState::Done,
        Some("2.8.0"),
        T,
    )
    .await;
    assert_done_uncordoned(&p.env, &p.prod_nodes, "2.8.0").await;
    let (first_wall, first_started) = p
        .prod_nodes
        .iter()
        .filter_map(|n| cycles.first(n))
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .expect("a production node went through a cycle");
    let waited = first_wall - ready_at as f64;
    eprintln!(
        "canary Ready at {ready_at} (seen {:.1}s later); production's first cycle seen {waited:.1}s after it (record started {:?}, {:?}s after)",
        ready_seen - ready_at as f64,
        first_started,
        first_started.map(|s| s - ready_at)
    );
    assert!(
        waited >= SOAK as f64,
        "production started {waited:.1}s after the canary was Ready, before the {SOAK}s soak"
    );
    if let Some(s) = first_started {
        assert!(
            s - ready_at >= SOAK,
            "the record's start {s} is less than {SOAK}s after {ready_at}"
        );
    }
    assert!(
        waited < SOAK as f64 + 20.0,
        "production started {waited:.1}s after the canary was Ready: the promotion should open within a few passes of the soak's end"
    );
    let progressing =
        wait_condition(&p.env, &p.prod, "Ready", "True", T, |c| c.status == "True").await;
    assert_eq!(progressing.reason, "RolloutComplete");
    watcher.assert_safe(1, None, "promotion");
    p.env.teardown().await;
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn a_halted_canary_blocks_the_promotion() {
    let p = pools("promote-halt", 1, 2).await;
    let bad = p.canary_nodes[0].clone();
    p.env
        .annotate_node(&bad, VALIDATION_FAILS_ANNOTATION, Some("2.8.0"))
        .await;
    let cycles = CycleWatcher::start(&p.env);
    patch_policy(&p.env, &p.canary, serde_json::json!({ "version": "2.8.0" })).await;
    patch_policy(&p.env, &p.prod, serde_json::json!({ "version": "2.8.0" })).await;
    let failed = wait_node(&p.env, &p.canary, &bad, NodeState::Failed, T).await;
    assert_eq!(
        failed.reason.as_deref(),
        Some("ValidationFailed"),
        "{failed:?}"
    );
    // Production's nodes say why: the canary is halted.
    let blocked = prod_waits(&p, "promotion blocked").await;
    assert_message(&blocked, &p.canary);
    assert_message(&blocked, "1 Failed node");
    let progressing = wait_condition(
        &p.env,
        &p.prod,
        "Progressing",
        "False, PromotionBlocked",
        T,
        |c| c.status == "False" && c.reason == "PromotionBlocked",
    )
    .await;
    assert!(
        progressing.message.contains("promotion blocked"),
        "{progressing:?}"
    );
    // A while longer (several controller passes, more than the soak):
    // production never starts.
    tokio::time::sleep(Duration::from_secs(SOAK as u64 + 4)).await;
    prod_untouched(&p, &cycles, "with the canary halted").await;
    let entry = node_entry(&p.env, &p.prod, &p.prod_nodes[0])
        .await
        .expect("a production node's entry");
    assert_eq!(entry.state, NodeState::Pending, "{entry:?}");
    assert_eq!(entry.reason.as_deref(), Some("WaitingForPromotion"));
    // The metrics say it too: held for the promotion, and blocked.
    let ctl = &p.running.0;
    let cr = [("cr", p.prod.as_str())];
    assert_eq!(
        ctl.metric("ttdriver_policy_promotion_blocked", &cr).await,
        1.0
    );
    assert_eq!(
        ctl.metric(
            "ttdriver_policy_rollout_held",
            &[("cr", p.prod.as_str()), ("reason", "WaitingForPromotion")]
        )
        .await,
        1.0
    );
    let canary_cr = [("cr", p.canary.as_str())];
    assert_eq!(
        ctl.metric("ttdriver_policy_promotion_blocked", &canary_cr)
            .await,
        0.0
    );
    p.env.teardown().await;
}

/// Issue 49 item 5: two policies that name each other in `promoteAfter`
/// would each wait for the other for ever. Both are blocked (Progressing
/// False, PromotionBlocked) with a message that names the cycle, nothing
/// starts, and removing one link lets both roll out, canary first.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn a_promote_after_cycle_blocks_both_policies_naming_it() {
    let p = pools("promote-cycle", 1, 1).await;
    let cycles = CycleWatcher::start(&p.env);
    patch_policy(
        &p.env,
        &p.canary,
        serde_json::json!({ "version": "2.8.0", "promoteAfter": {"policy": p.prod, "soakSeconds": 0} }),
    )
    .await;
    patch_policy(&p.env, &p.prod, serde_json::json!({ "version": "2.8.0" })).await;
    for (me, other) in [(&p.canary, &p.prod), (&p.prod, &p.canary)] {
        let cycle = format!("cycle ({me} -> {other} -> {me})");
        let c = wait_condition(
            &p.env,
            me,
            "Progressing",
            &format!("False, PromotionBlocked, {cycle}"),
            T,
            |c| c.status == "False" && c.reason == "PromotionBlocked" && c.message.contains(&cycle),
        )
        .await;
        println!("{me}: Progressing {} {}: {}", c.status, c.reason, c.message);
    }
    // Several passes later nothing started on either side.
    tokio::time::sleep(Duration::from_secs(SOAK as u64 + 4)).await;
    prod_untouched(&p, &cycles, "with the promotion cycle").await;
    assert_eq!(
        cycles.any_of(&p.canary_nodes),
        Vec::<String>::new(),
        "a canary node started a cycle inside the promotion cycle"
    );
    // One link removed: the canary goes, then production after it.
    patch_policy(
        &p.env,
        &p.canary,
        serde_json::json!({ "promoteAfter": null }),
    )
    .await;
    wait_nodes(
        &p.env,
        &p.canary,
        &p.canary_nodes,
        NodeState::Done,
        Some("2.8.0"),
        T,
    )
    .await;
    wait_nodes(
        &p.env,
        &p.prod,
        &p.prod_nodes,
        NodeState::Done,
        Some("2.8.0"),
        T,
    )
    .await;
    p.env.teardown().await;
}
