//! The deliberate break: no controller, the installer edited by hand: no
//! go-ahead, the loaded module stays. Then the Events, for the log.

use super::*;

/// An agent's report that it waits for the controller's go-ahead.
fn waiting_for_go_ahead(w: &str) -> bool {
    w.contains("waiting for the controller") && w.contains("go-ahead")
}

/// No go-ahead annotation outlived the last cycle.
pub(super) async fn no_go_ahead_left(t: &Run) {
    let vm = &t.vm;
    let n = vm.node_obj().await.unwrap_or_else(|e| panic!("{e}"));
    let go = n
        .metadata
        .annotations
        .unwrap_or_default()
        .get(GO_AHEAD)
        .cloned();
    assert_eq!(go, None, "the go-ahead outlived the cycle");
}

/// The controller scaled to zero: no controller pod left.
pub(super) async fn controller_scaled_to_zero(t: &Run) {
    let vm = &t.vm;
    let ns = &t.vm.ns;
    let rel = &t.rel;
    let deploys: Api<Deployment> = Api::namespaced(vm.c.clone(), ns);
    let zero = serde_json::json!({"spec": {"replicas": 0}});
    deploys
        .patch(
            &format!("{rel}-controller"),
            &PatchParams::default(),
            &Patch::Merge(&zero),
        )
        .await
        .unwrap_or_else(|e| panic!("scaling the controller to 0: {e}"));
    wait_for("no controller pod", vm.t, || async {
        let p = vm
            .pods(ns, "app.kubernetes.io/component=controller", "")
            .await?;
        if p.is_empty() {
            Ok(())
        } else {
            Err(format!("{p:?}"))
        }
    })
    .await;
}

/// A pod that starts for another reason (here: the DaemonSet edited by hand
/// and the pod deleted) with another target (`other`, still cached: no build
/// to wait for), while the workload holds the device: its agent waits for
/// the go-ahead. The workload pod and the module report before.
pub(super) async fn installer_restarted_by_hand(t: &Run, other: &str) -> (String, String) {
    let vm = &t.vm;
    let ns = &t.vm.ns;
    let holdb = vm.hold_pod().await;
    let before = vm.con().module_now().unwrap_or_default();
    let t0 = now();
    run(
        "kubectl",
        &[
            "-n",
            ns,
            "set",
            "env",
            &format!("ds/ttdrv-{POLICY}"),
            &format!("TT_KMD_VERSION={other}"),
        ],
    )
    .unwrap_or_else(|e| panic!("editing the installer DaemonSet: {e}"));
    let old = vm.first_installer().await.unwrap_or_else(|e| panic!("{e}"));
    Api::<Pod>::namespaced(vm.c.clone(), ns)
        .delete(&old, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("deleting {old}: {e}"));
    wait_for("a replacement installer pod", vm.t, || async {
        let p = vm.first_installer().await?;
        if p != old {
            Ok(())
        } else {
            Err(format!("still {p}"))
        }
    })
    .await;
    wait_for("the agent waiting for the go-ahead", vm.t, || async {
        if vm
            .con()
            .reports()
            .any(|(t, w)| t >= t0 && waiting_for_go_ahead(w))
        {
            Ok(())
        } else {
            Err("not yet".into())
        }
    })
    .await;
    (holdb, before)
}

/// Three go-ahead polls later the module, the workload, the cordon and the
/// kmd-version label are as before.
pub(super) async fn module_stays(
    t: &Run,
    ph: &mut Phases,
    (holdb, before): (String, String),
    cur: &str,
    other: &str,
    mut link: String,
    real_link: &str,
) {
    let vm = &t.vm;
    let real = &t.real;
    // three of the agent's go-ahead polls (every 5 s) later
    tokio::time::sleep(Duration::from_secs(16)).await;
    let con = vm.con();
    let after = con.module_now().unwrap_or_default();
    if !real.iter().any(|v| v == cur) && link == real_link {
        // VMNODE_COMPARE=0: the stub's link not seen before the faults
        link = by_id_link(&before).unwrap_or_default();
        assert_ne!(link, real_link, "the stub named the real driver's link");
    }
    assert_eq!(
        before,
        // card 0's by-id link unchanged by every swap of the same driver (the
        // real one names the card's tt_asic_id, the stub an id of its own)
        format!("module={cur} refcnt=1 dev=0, links={link},"),
        "unexpected state before the break"
    );
    assert_eq!(after, before, "without the go-ahead the module changed");
    let phase = Api::<Pod>::namespaced(vm.c.clone(), "ml")
        .get(&holdb)
        .await
        .ok()
        .and_then(|p| p.status?.phase);
    assert_eq!(
        phase.as_deref(),
        Some("Running"),
        "the workload pod {holdb} is not Running"
    );
    assert_eq!(
        vm.cordoned().await,
        Ok(false),
        "node cordoned without a controller"
    );
    assert_eq!(
        vm.label(KMD).await.as_deref(),
        Some(cur),
        "kmd-version label changed without a go-ahead"
    );
    let said = con
        .reports()
        .filter(|(_, w)| waiting_for_go_ahead(w))
        .last()
        .map(|(_, w)| w.chars().take(200).collect::<String>());
    ph.log(&format!(
        "no go-ahead: {after}, workload {holdb} Running, agent: {}",
        said.unwrap_or_default()
    ));
    ph.phase(&format!(
        "break: no controller, pod replaced with target {other}: {cur} untouched"
    ));
}

/// The policy's and the node's last Events, for the log.
pub(super) fn print_events(t: &Run, ph: &mut Phases) {
    let vnode = &t.vm.node;
    for (what, name) in [("the policy's", POLICY), ("the node's", vnode.as_str())] {
        ph.log(&format!("--- {what} Events"));
        let out = run(
            "kubectl",
            &[
                "get",
                "events",
                "-A",
                "--field-selector",
                &format!("involvedObject.name={name}"),
                "--sort-by=.lastTimestamp",
                "-o",
                "custom-columns=TIME:.lastTimestamp,REASON:.reason,MESSAGE:.message",
            ],
        )
        .unwrap_or_default();
        let lines: Vec<&str> = out.lines().collect();
        for l in &lines[lines.len().saturating_sub(40)..] {
            eprintln!("[events] {l}");
        }
    }
}
