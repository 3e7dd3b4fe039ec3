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
//! - With the stack (the telemetry collector and a fabric-manager agent
//!   behind the deploy gates, the plugin reading the cards from the agent):
//!   the gates open with the node still cordoned and the plugin restarts
//!   only once the agent is Ready again, after a driver swap and after a
//!   firmware flash.

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
    spec: &str,
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
    let policy = installed(&env, &nodes, spec, T).await;
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
    let (env, _ns, node, policy, plugin, running) =
        fleet_with_plugin("surface-ok", 2, vec![], "").await;
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
    assert_surface_observed(
        &running.0,
        "ttdriver_node_scheduling_surface_seconds",
        &policy,
    )
    .await;
    env.teardown().await;
}

/// The controller's `/metrics` counts one observation of `histogram` for
/// policy `cr`.
async fn assert_surface_observed(
    ctl: &ttdrv_testkit::ControllerProcess,
    histogram: &str,
    cr: &str,
) {
    let (_, _, body) = ctl.admin_get("/metrics").await.expect("metrics");
    let line = format!("{histogram}_count{{cr=\"{cr}\"}} 1");
    assert!(
        body.lines().any(|l| l == line),
        "missing `{line}` in: {:?}",
        body.lines()
            .filter(|l| l.starts_with(histogram))
            .collect::<Vec<_>>()
    );
}

/// Upgrades the node while the plugin will publish `then`, with
/// `onValidationFailure: hold`; the node must fail `DevicesNotPublished`,
/// still cordoned, its message containing `says`.
async fn fails_short(name: &str, then: Publishes, says: &[&str]) {
    let args = vec!["--scheduling-surface-timeout-seconds=12".to_string()];
    let hold = "upgradePolicy: {onValidationFailure: hold}";
    let (env, _ns, node, policy, plugin, _running) = fleet_with_plugin(name, 2, args, hold).await;
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
async fn held_a_plugin_that_republishes_one_card_short_fails_the_node_cordoned() {
    fails_short(
        "surface-short",
        Publishes::Cards(1),
        &["list 1 device(s)", "counted 2 card(s)", "stays cordoned"],
    )
    .await;
}

/// With `onValidationFailure: rollback` (the default) a shortfall is a
/// failed validation: the controller gives the agent its verdict, the agent
/// loads the previous version again, and the node goes back into service on
/// it, Failed (the rollout halts), the counts in its message.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn a_plugin_that_republishes_one_card_short_fails_validation_and_rolls_back() {
    let args = vec!["--scheduling-surface-timeout-seconds=12".to_string()];
    let (env, _ns, node, policy, plugin, running) =
        fleet_with_plugin("surface-rollback", 2, args, "").await;
    plugin.set(Publishes::Cards(1));
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    // The verdict reaches the node while the cycle rolls back.
    let verdict = wait_for("the controller's verdict on the node", T, || async {
        let n = env.get_node(&node).await;
        match ttdrv_core::node::annotation(&n, ttdrv_api::labels::ROLLBACK_VERDICT) {
            Some(v) => Ok(v.to_string()),
            None => Err(format!("{:?}", node_entry(&env, &policy, &node).await)),
        }
    })
    .await;
    // The plugin pods that published from 2.8.0; the previous module serves
    // both cards again.
    let short: Vec<String> = plugin.publications().into_iter().map(|p| p.1).collect();
    plugin.set(Publishes::Cards(2));
    let failed = wait_node(&env, &policy, &node, NodeState::Failed, T).await;
    assert_eq!(
        failed.reason.as_deref(),
        Some("ValidationFailed"),
        "{failed:?}"
    );
    // Back in service on 2.7.0, the plugin is restarted so that the
    // scheduler sees that module's cards, not the slice from 2.8.0.
    wait_for("the DRA plugin restarted after the rollback", T, || async {
        let now = plugin.publications();
        if now.iter().any(|p| !short.contains(&p.1)) {
            Ok(())
        } else {
            Err(format!("{now:?}"))
        }
    })
    .await;
    let msg = failed.message.unwrap_or_default();
    for s in [
        "list 1 device(s)",
        "counted 2 card(s)",
        "the scheduler did not see every card",
        &format!("cycle {verdict}"),
        "back in service on tt-kmd 2.7.0",
    ] {
        assert!(msg.contains(s), "{s:?} in {msg}");
    }
    let n = env.get_node(&node).await;
    assert!(
        !unschedulable(&n),
        "back in service on the previous version"
    );
    assert_eq!(
        ttdrv_core::node::label(&n, ttdrv_api::labels::KMD_VERSION),
        Some("2.7.0")
    );
    for k in [
        ttdrv_api::labels::ROLLBACK_VERDICT,
        ttdrv_api::labels::GO_AHEAD,
    ] {
        assert_eq!(ttdrv_core::node::annotation(&n, k), None, "{k} left");
    }
    let (_, _, body) = running.0.admin_get("/metrics").await.expect("metrics");
    let line = format!("ttdriver_node_rollbacks_total{{cr=\"{policy}\"}} 1");
    assert!(body.lines().any(|l| l == line), "missing `{line}`");
    env.teardown().await;
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

/// The stack of STACK.md around the plugin on `node`: the telemetry
/// collector and the fabric-manager agent behind the default deploy gates
/// (the agent Ready 4 s after it starts: a plugin restarted as soon as the
/// gates open finds nothing to read), and a plugin that reads the cards
/// from that agent (tt-dra-driver as its source reads: a start without a
/// Ready agent on the node keeps the old slice), published once.
async fn stack_with_plugin(
    env: &TestEnv,
    ns: &str,
    node: &str,
) -> (DraPlugin, stack::LateStarter, String) {
    let (telemetry, fabric, dra) = (env.name("telemetry"), env.name("fabric"), env.name("dra"));
    stack::create(env, ns, &stack::telemetry_collector(&env.id, &telemetry)).await;
    let late = stack::LateStarter::start(env, ns);
    let agent = stack::ready_after(stack::fabric_manager_agent(&env.id, &fabric), 4);
    stack::create(env, ns, &agent).await;
    wait_for("the fabric-manager agent Ready on the node", T, || async {
        if agent_ready(env, ns, node, &fabric).await {
            Ok(())
        } else {
            Err("not yet".to_string())
        }
    })
    .await;
    stack::create(env, ns, &stack::dra_plugin(&env.id, &dra)).await;
    let plugin = DraPlugin::reading_from(env, ns, &dra, Publishes::Cards(2), &fabric);
    wait_for("the DRA plugin's first slice", T, || async {
        match plugin.publications().len() {
            0 => Err(format!("none yet; kept stale: {:?}", plugin.kept_stale())),
            _ => Ok(()),
        }
    })
    .await;
    (plugin, late, fabric)
}

/// A Ready pod of the fabric-manager DaemonSet `fabric` is on `node`.
async fn agent_ready(env: &TestEnv, ns: &str, node: &str, fabric: &str) -> bool {
    env.pods_on(ns, node).await.iter().any(|p| {
        p.metadata.deletion_timestamp.is_none()
            && p.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with(fabric))
            && ttdrv_testkit::pod_ready(p)
    })
}

/// Follows `node` through a cycle until `back` says it ended, checking on
/// the way that it is never uncordoned before the restarted plugin
/// republished; then that the cycle stood the agent down, opened the gates
/// while the node was still cordoned, started no plugin pod while the
/// agent was away, and a new plugin pod published a newer generation.
async fn through_the_cycle<F, Fut>(
    env: &TestEnv,
    ns: &str,
    node: &str,
    fabric: &str,
    plugin: &DraPlugin,
    mut back: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let before = plugin.publications();
    let start = Instant::now();
    let (mut cordoned, mut open_while_cordoned, mut agent_gone) = (false, false, false);
    loop {
        let n = env.get_node(node).await;
        if unschedulable(&n) {
            cordoned = true;
            agent_gone |= !agent_ready(env, ns, node, fabric).await;
            open_while_cordoned |= agent_gone && gate_labels(&n).is_empty();
        } else if cordoned {
            assert!(
                plugin.publications().len() > before.len(),
                "uncordoned before the restarted plugin republished: {:?}",
                plugin.publications()
            );
        }
        let last = match back().await {
            Ok(()) => break,
            Err(e) => e,
        };
        assert!(
            start.elapsed() < T,
            "not back within {T:?}: {last}; kept stale: {:?}",
            plugin.kept_stale()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        cordoned && agent_gone,
        "the cycle cordoned the node and stood the agent down"
    );
    assert!(
        open_while_cordoned,
        "the gates opened while the node was still cordoned"
    );
    let n = env.get_node(node).await;
    assert!(!unschedulable(&n), "uncordoned at the end");
    assert!(gate_labels(&n).is_empty(), "{:?}", gate_labels(&n));
    assert_eq!(
        plugin.kept_stale(),
        vec![],
        "no plugin pod started while the fabric-manager agent was away"
    );
    let after = plugin.publications();
    let (first, last) = (&before[0], &after[after.len() - 1]);
    assert_ne!(first.1, last.1, "a new plugin pod published: {after:?}");
    assert!(last.2 > first.2, "a newer pool generation: {after:?}");
}

/// The driver's cycle on the stack: the gates open with the node still
/// cordoned, the plugin is restarted only once the agent's pod is Ready
/// again, and the node is uncordoned after it republished.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn with_the_stack_gated_the_plugin_restarts_after_the_fabric_manager_is_back() {
    let (env, ns, nodes, _sim) = sim_fleet("surface-stack", 1).await;
    let node = nodes[0].clone();
    env.annotate_node(&node, CARDS_ANNOTATION, Some("2")).await;
    // The default gates: both keys.
    let _ctl = controller(&env, &ns);
    let policy = installed(&env, &nodes, "", T).await;
    let (plugin, _late, fabric) = stack_with_plugin(&env, &ns, &node).await;
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    through_the_cycle(&env, &ns, &node, &fabric, &plugin, || async {
        match node_entry(&env, &policy, &node).await {
            Some(s)
                if s.state == NodeState::Done && s.current_version.as_deref() == Some("2.8.0") =>
            {
                Ok(())
            }
            st => Err(format!("{st:?}")),
        }
    })
    .await;
    assert_done_uncordoned(&env, std::slice::from_ref(&node), "2.8.0").await;
    env.teardown().await;
}

/// The same after a firmware flash: the flash stands the stack down, and
/// before its uncordon the gates open, the agent comes back, the plugin
/// restarts and republishes every card.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn after_a_firmware_flash_the_plugin_restarts_before_the_uncordon() {
    use ttdrv_api::firmware::FirmwareNodeState;
    let (env, ns, nodes, _sim) = flashing_fleet("surface-fw").await;
    let node = nodes[0].clone();
    env.annotate_node(&node, CARDS_ANNOTATION, Some("2")).await;
    let ctl = controller(&env, &ns);
    let (plugin, _late, fabric) = stack_with_plugin(&env, &ns, &node).await;
    let policy = env.name("fw");
    ttdrv_testkit::policy::create_firmware_policy(&env, &policy, serde_json::json!({})).await;
    through_the_cycle(&env, &ns, &node, &fabric, &plugin, || async {
        let st = ttdrv_testkit::policy::firmware_status(&env, &policy).await;
        match st.nodes.iter().find(|n| n.name == node) {
            Some(n) if n.state == FirmwareNodeState::Done => Ok(()),
            n => Err(format!("{n:?}")),
        }
    })
    .await;
    // Its reason's Event, and its time in the firmware kind's histogram.
    wait_event(&env, &policy, "RefreshingDevices", T, |m| m.contains(&node)).await;
    assert_surface_observed(&ctl, "ttfw_scheduling_surface_seconds", &policy).await;
    env.teardown().await;
}

/// A flash that hands its cordon to the driver's swap (one cordon and drain
/// for both): the flash stood the stack down, so the swap's check waits for
/// those DaemonSets too before it restarts the plugin, although no stack pod
/// was on the node when the swap took the cordon over.
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn after_a_flash_handed_to_a_swap_the_plugin_restarts_after_the_fabric_manager_is_back() {
    use ttdrv_api::firmware::FirmwareNodeState;
    use ttdrv_testkit::policy::{create_firmware_policy, firmware_status};
    use ttdrv_testkit::sim_flasher::HOLD_ANNOTATION;
    let (env, ns, nodes, _sim) = flashing_fleet("surface-handover").await;
    let node = nodes[0].clone();
    env.annotate_node(&node, CARDS_ANNOTATION, Some("2")).await;
    let _ctl = controller(&env, &ns);
    let driver = installed(&env, &nodes, "", T).await;
    let (plugin, _late, fabric) = stack_with_plugin(&env, &ns, &node).await;
    // The flash is held under way while the swap lines up behind it.
    env.annotate_node(&node, HOLD_ANNOTATION, Some("1")).await;
    let fw = env.name("fw");
    create_firmware_policy(&env, &fw, serde_json::json!({})).await;
    let fw_node = || async {
        let st = firmware_status(&env, &fw).await;
        st.nodes.into_iter().find(|n| n.name == node)
    };
    wait_for("the flash under way", T, || async {
        match fw_node().await {
            Some(n) if n.state == FirmwareNodeState::Flashing => Ok(()),
            n => Err(format!("{n:?}")),
        }
    })
    .await;
    patch_policy(&env, &driver, serde_json::json!({ "version": "2.8.0" })).await;
    wait_for("the swap waiting for the firmware", T, || async {
        match node_entry(&env, &driver, &node).await {
            Some(s) if s.reason.as_deref() == Some("WaitingForFirmware") => Ok(()),
            s => Err(format!("{s:?}")),
        }
    })
    .await;
    env.annotate_node(&node, HOLD_ANNOTATION, None).await;
    through_the_cycle(&env, &ns, &node, &fabric, &plugin, || async {
        match node_entry(&env, &driver, &node).await {
            Some(s)
                if s.state == NodeState::Done && s.current_version.as_deref() == Some("2.8.0") =>
            {
                Ok(())
            }
            st => Err(format!("{st:?}")),
        }
    })
    .await;
    let flashed = fw_node().await;
    assert!(
        flashed
            .as_ref()
            .is_some_and(|n| n.state == FirmwareNodeState::Done
                && n.reason.as_deref() == Some(ttdrv_api::firmware::reason::CORDON_HANDED_OVER)),
        "the flash handed its cordon to the swap: {flashed:?}"
    );
    assert_done_uncordoned(&env, std::slice::from_ref(&node), "2.8.0").await;
    env.teardown().await;
}

/// A rollback on the stack: the gates opened for the surface check, so the
/// fabric-manager agent is back on the node and holds the device; the
/// verdict (and so the agent's unload) comes only once the gates are closed
/// again and its pod has left. A finalizer keeps the leaving pod on the
/// node for a while (kwok removes deleted pods at once).
#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn with_the_stack_a_rollback_waits_until_the_fabric_manager_has_left() {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Patch, PatchParams};
    const FINALIZER: &str = "sim.ttdrv.io/slow-to-leave";
    let (env, ns, nodes, _sim) = sim_fleet("surface-stack-rb", 1).await;
    let node = nodes[0].clone();
    env.annotate_node(&node, CARDS_ANNOTATION, Some("2")).await;
    let _ctl = controller_with(
        &env,
        &ns,
        ControllerOptions {
            extra_args: vec!["--scheduling-surface-timeout-seconds=15".to_string()],
            ..Default::default()
        },
    );
    let policy = installed(&env, &nodes, "", T).await;
    let (plugin, _late, fabric) = stack_with_plugin(&env, &ns, &node).await;
    plugin.set(Publishes::Cards(1));
    patch_policy(&env, &policy, serde_json::json!({ "version": "2.8.0" })).await;
    // The check opened the gates and the agent came back on the cordoned
    // node: it will be slow to leave.
    let pods: kube::Api<Pod> = kube::Api::namespaced(env.client.clone(), &ns);
    let agent_pod = wait_for(
        "the fabric-manager agent back on the cordoned node",
        T,
        || async {
            let n = env.get_node(&node).await;
            let back = env.pods_on(&ns, &node).await.into_iter().find(|p| {
                p.metadata.deletion_timestamp.is_none()
                    && p.metadata
                        .name
                        .as_deref()
                        .is_some_and(|m| m.starts_with(fabric.as_str()))
            });
            match back {
                Some(p) if unschedulable(&n) && gate_labels(&n).is_empty() => {
                    Ok(p.metadata.name.unwrap_or_default())
                }
                _ => Err(format!("{:?}", node_entry(&env, &policy, &node).await)),
            }
        },
    )
    .await;
    let finalize = |list: serde_json::Value| {
        let pods = pods.clone();
        let name = agent_pod.clone();
        async move {
            pods.patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({ "metadata": { "finalizers": list } })),
            )
            .await
            .expect("finalizer patch");
        }
    };
    finalize(serde_json::json!([FINALIZER])).await;
    // Short: rolled back; the gates close, the agent's pod is leaving.
    wait_for("the agent's pod leaving in a rollback", T, || async {
        let leaving = pods
            .get_opt(&agent_pod)
            .await
            .ok()
            .flatten()
            .is_some_and(|p| p.metadata.deletion_timestamp.is_some());
        match node_entry(&env, &policy, &node).await {
            Some(s) if s.reason.as_deref() == Some("RollingBack") && leaving => Ok(()),
            s => Err(format!("leaving: {leaving}; {s:?}")),
        }
    })
    .await;
    // While it is still there: no verdict, and the node says why.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let n = env.get_node(&node).await;
    assert_eq!(
        ttdrv_core::node::label(&n, ttdrv_api::labels::KMD_VERSION),
        Some("2.8.0"),
        "nothing unloaded while the fabric-manager agent holds the device"
    );
    assert_eq!(
        ttdrv_core::node::annotation(&n, ttdrv_api::labels::ROLLBACK_VERDICT),
        None,
        "the verdict was given while the fabric-manager agent was on the node"
    );
    assert!(!gate_labels(&n).is_empty(), "the gates closed again");
    let entry = node_entry(&env, &policy, &node).await;
    assert!(
        entry
            .as_ref()
            .and_then(|s| s.message.as_deref())
            .is_some_and(|m| m.contains("to leave the node") && m.contains(fabric.as_str())),
        "{entry:?}"
    );
    // Gone: the verdict, the rollback, back in service on 2.7.0.
    finalize(serde_json::json!(null)).await;
    let failed = wait_node(&env, &policy, &node, NodeState::Failed, T).await;
    assert_eq!(
        failed.reason.as_deref(),
        Some("ValidationFailed"),
        "{failed:?}"
    );
    assert_done_uncordoned_at(&env, &node, "2.7.0").await;
    env.teardown().await;
}

/// Back in service, the gates open, on `version`.
async fn assert_done_uncordoned_at(env: &TestEnv, node: &str, version: &str) {
    let n = env.get_node(node).await;
    assert!(!unschedulable(&n), "back in service");
    assert!(gate_labels(&n).is_empty(), "{:?}", gate_labels(&n));
    assert_eq!(
        ttdrv_core::node::label(&n, ttdrv_api::labels::KMD_VERSION),
        Some(version)
    );
}
