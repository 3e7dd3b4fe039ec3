//! The stub tt-kmd's cycles: without build-ahead (the build inside the
//! cordon window), the real faults, the reboots at rest.

use super::*;

/// r_old -> s_cmp (the stub), cache-cold, prepare off: the pod is replaced
/// after the cordon and the drain, and the build falls inside the window. The
/// stub's by-id link (its own id, not the real driver's `link`).
pub(super) async fn upgrade_prepare_off(
    t: &Run,
    ph: &mut Phases,
    watch: &Watcher,
    link: &str,
) -> String {
    let vm = &t.vm;
    let r_old = t.r_old.as_str();
    let s_cmp = t.s_cmp.as_str();
    let hold3 = vm.hold_pod().await;
    let t0 = now();
    vm.patch_policy(
        serde_json::json!({"version": s_cmp, "upgradePolicy": {"prepare": {"enabled": false}}}),
    )
    .await;
    vm.wait_cordoned("the node cordoned (prepare off)").await;
    vm.wait_gone("the workload evicted (prepare off)", "ml", &hold3)
        .await;
    vm.wait_done(&format!("the node Done at {s_cmp}"), s_cmp)
        .await;
    let s = vm.wait_summary(s_cmp, r_old).await;
    assert!(
        s.contains(&format!("previous={r_old} source=build")),
        "{s_cmp} was not a source build replacing {r_old}: {s}"
    );
    vm.wait_module(
        &format!("the workload back, holding the {s_cmp} device"),
        &format!("module={s_cmp} refcnt=1 "),
    )
    .await;
    swap_after_drain(&watch.timeline(), &vm.con(), t0, s_cmp);
    t.window(
        watch,
        ph,
        &format!("upgrade {r_old} -> {s_cmp} (cache-cold, prepare off)"),
        t0,
        s_cmp,
        Mode::Inside,
    );
    t.table(
        watch,
        ph,
        &format!("upgrade {r_old} -> {s_cmp} under the workload (real build, prepare off)"),
        t0,
        s_cmp,
        true,
    );
    ph.phase(&format!(
        "upgrade to {s_cmp}, prepare off: cordon, eviction, pod replaced, build, load, uncordon"
    ));
    // the stub, bound to the same PCI function, names its own id
    let stub_link = vm.con().module_now().and_then(|m| by_id_link(&m));
    assert!(
        stub_link.as_ref().is_some_and(|l| *l != link),
        "the stub's by-id link {stub_link:?} is missing or the real driver's {link}"
    );
    stub_link.unwrap_or_default()
}

/// The real faults in two cycles from `cur` (kubelet, containerd, the API
/// server cut off; the leader killed), then the reboots. Ends with the
/// loaded version and the other one in the cache.
pub(super) async fn real_faults<'a>(
    t: &'a Run,
    ph: &mut Phases,
    watch: &Watcher,
    mut cur: &'a str,
) -> (&'a str, &'a str) {
    let vm = &t.vm;
    let agent_ref = &t.agent_ref;
    let s_fault = t.s_fault.as_str();
    for row in fault_phase(vm, ph, watch, cur, s_fault).await {
        ph.log(&row);
        ph.add_to_report(FAULTS, format!("[test-vm-node]   {row}"));
    }
    // loaded: cur again; s_fault is in the cache
    let mut other = s_fault;
    let row = leader_fault(vm, ph, watch, cur, other, agent_ref).await;
    ph.log(&row);
    ph.add_to_report(FAULTS, format!("[test-vm-node]   {row}"));
    (cur, other) = (other, cur);
    // ends where it began: cur loaded, other in the cache
    // (VMNODE_REBOOTS=0 skips the reboots: .ci/run says why)
    if std::env::var("VMNODE_REBOOTS").as_deref().unwrap_or("1") == "1" {
        for row in reboot_faults(vm, ph, watch, cur, other).await {
            ph.log(&row);
            ph.add_to_report(FAULTS, format!("[test-vm-node]   {row}"));
        }
    } else {
        ph.log("VMNODE_REBOOTS=0: the guest reboots (D1-D5) skipped");
    }
    (cur, other)
}

/// Many reboots at rest (VMNODE_REBOOT_SOAK=N; none by default), and the
/// guest boots the watchdog had to reset.
pub(super) async fn reboots_at_rest(t: &Run, ph: &mut Phases, watch: &Watcher, cur: &str) {
    let vm = &t.vm;
    let soak: usize = std::env::var("VMNODE_REBOOT_SOAK")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    if soak > 0 {
        let row = reboot_soak(vm, ph, watch, cur, soak).await;
        ph.log(&row);
        ph.add_to_report(FAULTS, format!("[test-vm-node]   {row}"));
    }
    let resets = vm.watchdog.load(std::sync::atomic::Ordering::SeqCst);
    let row = format!(
        "guest boots not back within {:?}, dumped and reset (WATCHDOG above): {resets}{}",
        vm.boot_t,
        if soak > 0 {
            ", one the soak's boot made to hang"
        } else {
            ""
        }
    );
    ph.log(&row);
    ph.add_to_report(FAULTS, format!("[test-vm-node]   {row}"));
}
