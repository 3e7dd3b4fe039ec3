//! The scheduling surface before the uncordon (issue 50, item 3): after a
//! validated swap the node's DRA kubelet plugin is restarted and the node
//! waits until its ResourceSlices list as many devices as the agent counted
//! cards. Real control plane (its DaemonSet controller re-creates the
//! evicted plugin pod on the cordoned node), the controller binary, the
//! simulated agent (labels `kmd-cards` from the node's `sim.ttdrv.io/cards`),
//! and the simulated DRA plugin of [`ttdrv_testkit::stack`], which publishes
//! a node's slice when its pod starts (STACK.md: it keeps what it read at
//! start until restarted).
//!
//! - The plugin is restarted, republishes every card, and only then is the
//!   node uncordoned.
//! - A plugin that republishes one card short fails the node
//!   `DevicesNotPublished`, kept cordoned, naming both counts.
//! - A plugin that never publishes again fails it the same way, at its
//!   deadline.

mod common;

use std::time::{Duration, Instant};

use common::*;
use ttdrv_api::NodeState;
use ttdrv_testkit::sim_agent::CARDS_ANNOTATION;
use ttdrv_testkit::stack::{self, DraPlugin, Publishes};
use ttdrv_testkit::{ControllerOptions, TestEnv, wait_for};

const T: Duration = Duration::from_secs(90);

/// A fleet of one node with `cards` cards, its controller (`args`), the
/// policy installed at 2.7.0, and the DRA plugin running on the node and
/// published once (`Cards(cards)`).
async fn fleet_with_plugin(
    name: &str,
    cards: u32,
    args: Vec<String>,
) -> (
    TestEnv,
    String,
    String,
    String,
    DraPlugin,
    (ttdrv_testkit::ControllerProcess, ttdrv_testkit::SimAgent),
) {
    let (env, ns, nodes, agent) = sim_fleet(name, 1).await;
    let node = nodes[0].clone();
    env.annotate_node(&node, CARDS_ANNOTATION, Some(&cards.to_string()))
        .await;
    let ctl = controller_with(
        &env,
        &ns,
        ControllerOptions {
            extra_args: args,
            ..Default::default()
        },
    );
    let policy = installed(&env, &nodes, "", T).await;
    let ds = env.name("dra");
    stack::create(&env, &ns, &stack::dra_plugin(&env.id, &ds)).await;
    let plugin = DraPlugin::start(&env, &ns, &ds, Publishes::Cards(cards));
    wait_for("the DRA plugin's first slice", T, || async {
        match plugin.publications().len() {
            0 => Err("none yet".to_string()),
            _ => Ok(()),
        }
    })
    .await;
    (env, ns, node, policy, plugin, (ctl, agent))
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn the_dra_plugin_is_restarted_and_the_node_waits_for_its_cards() {
    let (env, _ns, node, policy, plugin, _running) =
        fleet_with_plugin("surface-ok", 2, vec![]).await;
    let before = plugin.publications();
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    // Never back in service before the restarted plugin republished.
    let start = Instant::now();
    let mut cordoned = false;
    loop {
        let n = env.get_node(&node).await;
        if unschedulable(&n) {
            cordoned = true;
        } else if cordoned {
            let now = plugin.publications();
            assert!(
                now.len() > before.len(),
                "uncordoned before the restarted plugin republished: {now:?}"
            );
        }
        let st = node_entry(&env, &policy, &node).await;
        if st.as_ref().is_some_and(|s| {
            s.state == NodeState::Done && s.current_version.as_deref() == Some("2.8.0")
        }) {
            break;
        }
        assert!(
            start.elapsed() < T,
            "not Done at 2.8.0 within {T:?}: {st:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(cordoned, "the cycle cordoned the node");
    assert_done_uncordoned(&env, std::slice::from_ref(&node), "2.8.0").await;
    let after = plugin.publications();
    let (first, last) = (&before[0], &after[after.len() - 1]);
    assert_ne!(first.1, last.1, "a new plugin pod published: {after:?}");
    assert!(last.2 > first.2, "a newer pool generation: {after:?}");
    let events = policy_events(&env, &policy).await;
    assert!(
        events
            .iter()
            .any(|(r, m)| r == "RefreshingDevices" && m.contains(&node)),
        "{events:?}"
    );
    env.teardown().await;
}

/// Upgrades the node while the plugin will publish `then`; the node must
/// fail `DevicesNotPublished`, still cordoned, its message containing
/// `says`.
async fn fails_short(name: &str, then: Publishes, says: &[&str]) {
    let args = vec!["--scheduling-surface-timeout-seconds=12".to_string()];
    let (env, _ns, node, policy, plugin, _running) = fleet_with_plugin(name, 2, args).await;
    plugin.set(then);
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    let failed = wait_node(&env, &policy, &node, NodeState::Failed, T).await;
    assert_eq!(
        failed.reason.as_deref(),
        Some("DevicesNotPublished"),
        "{failed:?}"
    );
    let msg = failed.message.unwrap_or_default();
    for s in says {
        assert!(msg.contains(s), "{s:?} in {msg}");
    }
    assert!(
        unschedulable(&env.get_node(&node).await),
        "a node short of cards stays cordoned"
    );
    env.teardown().await;
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn a_plugin_that_republishes_one_card_short_fails_the_node_cordoned() {
    fails_short(
        "surface-short",
        Publishes::Cards(1),
        &["list 1 device(s)", "counted 2 card(s)", "stays cordoned"],
    )
    .await;
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn a_plugin_that_never_publishes_again_times_out_with_its_reason() {
    fails_short(
        "surface-never",
        Publishes::Nothing,
        &[
            "list 0 device(s)",
            "counted 2 card(s)",
            "12s after the swap",
        ],
    )
    .await;
}
