//! The real tt-kmd on the VM node: the first install (a real build), a
//! workload holding the device, the upgrade built ahead under it, the
//! leader's metrics, the downgrade from the agent's cache.

use super::*;

/// The first install of the real tt-kmd (r_old), a source build in the
/// installer pod, loaded and Done; udev names card 0's by-id link from the
/// card's own tt_asic_id. That link, and the name the real driver gives it.
pub(super) async fn first_install(t: &Run, ph: &mut Phases, watch: &Watcher) -> (String, String) {
    let vm = &t.vm;
    let vnode = &t.vm.node;
    let ns = &t.vm.ns;
    let r_old = t.r_old.as_str();
    let nodes: Api<Node> = Api::all(vm.c.clone());
    let pci = serde_json::json!({"metadata": {"labels": {PCI: "true"}}});
    nodes
        .patch(vnode, &PatchParams::default(), &Patch::Merge(&pci))
        .await
        .unwrap_or_else(|e| panic!("labelling {vnode}: {e}"));
    let t0 = now();
    apply_fixture(
        &vm.c,
        &fixture("policy.yaml"),
        &[("NODE", vnode), ("VERSION", r_old)],
    )
    .await;
    wait_for(&format!("an installer pod on {vnode}"), vm.t, || {
        vm.first_installer()
    })
    .await;
    vm.wait_con(
        &format!("the installer container running on {vnode}"),
        "agent ",
    )
    .await;
    ph.phase(&format!(
        "policy {r_old} -> installer pod scheduled, agent container started"
    ));
    vm.wait_con(
        &format!("{r_old} loaded in the guest"),
        &format!("module={r_old} "),
    )
    .await;
    ph.phase(&format!(
        "agent: clone, real build, finit_module of {r_old}"
    ));
    vm.wait_done(&format!("the node Done at {r_old}"), r_old)
        .await;
    let s = vm.wait_summary(r_old, "none").await;
    assert!(
        s.contains("previous=none source=build"),
        "{r_old} was not a source build: {s}"
    );
    let p = vm.first_installer().await.unwrap_or_else(|e| panic!("{e}"));
    if let Ok(pod) = Api::<Pod>::namespaced(vm.c.clone(), ns).get(&p).await {
        let st = pod.status.unwrap_or_default();
        let started = st
            .container_statuses
            .unwrap_or_default()
            .first()
            .and_then(|c| {
                c.state
                    .as_ref()?
                    .running
                    .as_ref()?
                    .started_at
                    .as_ref()
                    .map(|t| t.0.to_string())
            });
        let ready = st
            .conditions
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "Ready");
        ph.log(&format!(
            "installer pod {p}: created {:?}, started {started:?}, Ready {:?}",
            pod.metadata.creation_timestamp.map(|t| t.0.to_string()),
            ready
                .and_then(|c| c.last_transition_time)
                .map(|t| t.0.to_string())
        ));
    }
    // tt-kmd's udev rule, written by the agent and run by the guest's udevd:
    // card 0's by-id link, named from its tt_asic_id (16 hex digits). The
    // agent settles udev before it reports, so the node's Done is late
    // enough: 5 min is for the console's report loop under load. What the
    // agent did about udev, and udevd's health, say why when it is missing.
    wait_for(
        "card 0's by-id link (udev)",
        vm.t.min(Duration::from_secs(300)),
        || async {
            let con = vm.con();
            match con.module_now() {
                Some(m) if by_id_link(&m).is_some() => Ok(()),
                m => {
                    let mut udev: Vec<String> = con
                        .agent_lines()
                        .into_iter()
                        .filter(|l| {
                            l.text.contains("device access") || l.text.contains("tt_* attributes")
                        })
                        .map(|l| l.text)
                        .collect();
                    let health: Vec<&str> = con
                        .reports()
                        .filter(|(_, w)| w.contains("udevd"))
                        .map(|(_, w)| w)
                        .collect();
                    udev.extend(health.iter().rev().take(3).map(|w| w.to_string()));
                    Err(format!("module report {m:?}; udev: {udev:?}"))
                }
            }
        },
    )
    .await;
    let link = vm
        .con()
        .module_now()
        .and_then(|m| by_id_link(&m))
        .unwrap_or_default();
    // The real driver reads tt_asic_id from the card's telemetry: the
    // emulated card 0's, as ttdrv-ttcard serves it.
    let real_link = format!("wormhole-{}", ttdrv_testkit::ttcard::tt_asic_id(0));
    assert_eq!(
        link, real_link,
        "the by-id link is not named from the card's own tt_asic_id"
    );
    ph.phase(&format!("udev: /dev/tenstorrent/by-id/{link}"));
    t.table(
        watch,
        ph,
        &format!("first install of {r_old} (nothing loaded)"),
        t0,
        r_old,
        false,
    );
    ph.phase(&format!("readiness, labels, node Done at {r_old}"));
    (link, real_link)
}

/// The workload maps /dev/tenstorrent/0 and closes its fd (refcnt 1). The
/// workload pod.
pub(super) async fn workload_holds_device(t: &Run, ph: &mut Phases) -> String {
    let vm = &t.vm;
    let vnode = &t.vm.node;
    let agent_ref = &t.agent_ref;
    let r_old = t.r_old.as_str();
    let vars = [
        ("NODE", vnode.as_str()),
        ("AGENT_IMAGE", agent_ref.as_str()),
    ];
    apply_fixture(&vm.c, &fixture("workload.yaml"), &vars).await;
    let running = format!("status.phase=Running,spec.nodeName={vnode}");
    wait_for(
        &format!("the workload Running on {vnode}"),
        vm.t,
        || async {
            let p = vm.pods("ml", "app=hold", &running).await?;
            if p.len() == 1 {
                Ok(())
            } else {
                Err(format!("Running: {p:?}"))
            }
        },
    )
    .await;
    vm.wait_module(
        "the workload mapping /dev/tenstorrent/0 (refcnt 1)",
        &format!("module={r_old} refcnt=1"),
    )
    .await;
    let hold1 = vm.hold_pod().await;
    ph.phase(&format!(
        "workload {hold1} maps /dev/tenstorrent/0, its fd closed (refcnt 1)"
    ));

    hold1
}

/// r_old -> r_new under the workload, built ahead (upgradePolicy.prepare, on
/// by default): the installer pod is replaced at once and its agent builds
/// r_new (cache-cold) while the node serves; the controller cordons only once
/// the node carries kmd-prepared=r_new, and keeps that pod through the window.
pub(super) async fn upgrade_built_ahead(t: &Run, ph: &mut Phases, watch: &Watcher, hold1: &str) {
    let vm = &t.vm;
    let r_old = t.r_old.as_str();
    let r_new = t.r_new.as_str();
    let t0 = now();
    vm.patch_policy(serde_json::json!({"version": r_new})).await;
    wait_for(
        &format!("{r_new} built ahead (kmd-prepared={r_new} on the node)"),
        vm.t,
        || async {
            match vm.label(PREPARED).await {
                Some(v) if v == r_new => Ok(()),
                v => Err(format!("kmd-prepared {v:?}")),
            }
        },
    )
    .await;
    ph.phase(&format!(
        "upgrade to {r_new}: installer pod replaced ahead, real build while the node serves"
    ));
    vm.wait_cordoned("the node cordoned").await;
    // Until the drain and the go-ahead, the module and its holder stay.
    let m = vm.con().module_now().unwrap_or_default();
    assert!(
        m.starts_with(&format!("module={r_old} refcnt=1 ")),
        "module touched before the drain: {m}"
    );
    vm.wait_gone("the workload evicted", "ml", hold1).await;
    t.evicted_by_controller(hold1);
    vm.wait_con(
        &format!("{r_new} loaded in the guest"),
        &format!("module={r_new} "),
    )
    .await;
    vm.wait_done(&format!("the node Done at {r_new}"), r_new)
        .await;
    let s = vm.wait_summary(r_new, r_old).await;
    // source=build: this pod built it, ahead of the cordon (the window check)
    assert!(
        s.contains(&format!("previous={r_old} source=build")),
        "{r_new} was not a source build replacing {r_old}: {s}"
    );
    vm.wait_module(
        &format!("the workload back, holding the {r_new} device"),
        &format!("module={r_new} refcnt=1 "),
    )
    .await;
    swap_after_drain(&watch.timeline(), &vm.con(), t0, r_new);
    t.window(
        watch,
        ph,
        &format!("upgrade {r_old} -> {r_new} (cache-cold, built ahead)"),
        t0,
        r_new,
        Mode::Ahead,
    );
    t.table(
        watch,
        ph,
        &format!("upgrade {r_old} -> {r_new} under the workload (real build, ahead)"),
        t0,
        r_new,
        true,
    );
    ph.phase(&format!(
        "upgrade to {r_new}: cordon, eviction, go-ahead, load of the prepared module, uncordon"
    ));
}

/// The controller's metrics after the upgrade, as a dashboard reads them on
/// hardware.
pub(super) async fn leader_metrics_after_upgrade(t: &Run, ph: &mut Phases) {
    let vm = &t.vm;
    let vnode = &t.vm.node;
    let r_new = t.r_new.as_str();
    let m = vm.leader_metrics().await;
    let node_done = metric_sum(
        &m,
        "ttdriver_node_state",
        &[("cr", POLICY), ("node", vnode), ("state", "Done")],
    );
    let on_new = metric_sum(&m, "ttdriver_nodes_by_kmd_version", &[("version", r_new)]);
    let evicted = metric_sum(&m, "ttdriver_pods_evicted_total", &[("cr", POLICY)]);
    let cycles = metric_sum(
        &m,
        "ttdriver_node_upgrade_duration_seconds_count",
        &[("cr", POLICY)],
    );
    assert!(
        node_done == 1.0 && on_new >= 1.0 && evicted >= 1.0 && cycles >= 1.0,
        "the leader's metrics after the upgrade: node_state Done {node_done}, nodes on {r_new} {on_new}, \
         pods evicted {evicted}, upgrade cycles {cycles}"
    );
    ph.phase(&format!(
        "metrics: {vnode} Done, {on_new} node(s) on {r_new}, {evicted} pod(s) evicted, {cycles} cordoned cycle(s) timed"
    ));
}

/// The downgrade back to r_old, from the agent's cache.
pub(super) async fn downgrade_from_cache(t: &Run, ph: &mut Phases, watch: &Watcher) {
    let vm = &t.vm;
    let r_old = t.r_old.as_str();
    let r_new = t.r_new.as_str();
    let hold2 = vm.hold_pod().await;

    // --- the downgrade back to r_old, from the agent's cache
    let t0 = now();
    vm.patch_policy(serde_json::json!({"version": r_old})).await;
    vm.wait_gone("the workload evicted again", "ml", &hold2)
        .await;
    vm.wait_done(&format!("the node Done at {r_old} again"), r_old)
        .await;
    let s = vm.wait_summary(r_old, r_new).await;
    assert!(
        s.contains(&format!("previous={r_new} source=cache")),
        "the downgrade did not come from the cache: {s}"
    );
    vm.wait_module(
        &format!("the workload back, holding the {r_old} device"),
        &format!("module={r_old} refcnt=1 "),
    )
    .await;
    swap_after_drain(&watch.timeline(), &vm.con(), t0, r_old);
    t.window(
        watch,
        ph,
        &format!("downgrade {r_new} -> {r_old} (cache hit)"),
        t0,
        r_old,
        Mode::Ahead,
    );
    t.table(
        watch,
        ph,
        &format!("downgrade {r_new} -> {r_old} (from the agent's cache)"),
        t0,
        r_old,
        true,
    );
    ph.phase(&format!("downgrade to {r_old} from the cache"));
}
