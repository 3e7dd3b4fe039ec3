//! Step 5: the agent finds the host's (DKMS) install, labels its node with
//! its own token; the node Done (HostManaged), uncordoned, gate open.

use super::*;

/// The agent labels its node install-mode=host with its pod-bound token
/// (audit log); no kmd-version label without a loaded module.
pub(super) async fn agent_labels_host_mode(t: &Ctx, ph: &mut Phases) {
    let rn = &t.rn;
    let node = &t.rn.node;
    let audit = &t.audit;
    let agent_sa = &t.agent_sa;
    wait_for("the agent labels its node install-mode=host", rn.t, || {
        rn.label_is(MODE, "host")
    })
    .await;
    let by_agent = AuditQuery {
        verb: "patch",
        resource: "nodes",
        subresource: "",
        user: agent_sa,
        name: Some(node),
        node_claim: Some(node),
    }
    .find_in(audit)
    .unwrap_or_else(|e| panic!("no node patch by the agent's own pod-bound token: {e}"));
    ph.log(&format!(
        "agent's label patch: {} by {} from {}, code {}",
        by_agent["verb"],
        by_agent["user"]["username"],
        by_agent["sourceIPs"],
        by_agent["responseStatus"]["code"]
    ));
    assert_eq!(
        rn.label(KMD).await,
        Ok(None),
        "kmd-version label kept although no module is loaded"
    );
}

/// The node Done; the full-node drain tried no eviction in the controller's
/// own namespace.
pub(super) async fn done_without_own_evictions(t: &Ctx, ph: &mut Phases) {
    let rn = &t.rn;
    let ns = &t.rn.ns;
    let audit = &t.audit;
    let ctl_sa = &t.ctl_sa;
    // The cycle ends (Upgrading replaced the pre-cycle installer pod; the new
    // agent reports the host first and idles): take the pod that stays.
    wait_for("the node Done", rn.t, || rn.state_is("Done")).await;
    // Full-node drain is on and the controller runs on the node it drained:
    // it tried no eviction in its own namespace (the Go drain skipped it too;
    // on a one-node cluster without the toleration above, an evicted
    // controller's replacement could not schedule on the cordoned node).
    let own = evictions_in(audit, ctl_sa, ns);
    assert!(
        own.is_empty(),
        "the controller evicted pods of its own namespace {ns}: {own:?}"
    );
    ph.log(&format!(
        "full-node drain: no eviction tried in {ns} (the controller's namespace)"
    ));
    // (the node can be Done a moment after the controller deleted the
    // pre-cycle pod, before the DaemonSet's replacement exists: wait for the
}

/// The installer pod that stays (not the pre-cycle one): its exec readiness
/// probe runs on the kubelet and keeps it not Ready. That pod.
pub(super) async fn readiness_probe_ran(t: &Ctx, ph: &mut Phases, inst1: &str) -> String {
    let rn = &t.rn;
    let node = &t.rn.node;
    let ns = &t.rn.ns;
    // replacement, and only it)
    let inst2 = wait_for(
        &format!("one installer pod on {node} (the pre-cycle one gone)"),
        rn.t,
        || async {
            let lp = ListParams::default()
                .labels(INSTALLER)
                .fields(&format!("spec.nodeName={node}"));
            let l = rn.pods(ns).list(&lp).await.map_err(|e| e.to_string())?;
            let p: Vec<String> = l
                .items
                .into_iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .filter_map(|p| p.metadata.name)
                .collect();
            if p.len() == 1 && p[0] != inst1 {
                Ok(p[0].clone())
            } else {
                Err(format!("{p:?} (pre-cycle {inst1})"))
            }
        },
    )
    .await;
    // The agent idles now: its exec readiness probe runs on the kubelet and
    // says why the pod is not Ready (nothing loaded; a host-managed node's pod
    // is Ready only when the host's module is the policy's version).
    let events: Api<Event> = Api::namespaced(rn.c.clone(), ns);
    wait_for(
        &format!("the readiness probe (ttdrv-agent ready) of {inst2} reported"),
        rn.t,
        || async {
            let lp = ListParams::default()
                .fields(&format!("involvedObject.name={inst2},reason=Unhealthy"));
            let l = events.list(&lp).await.map_err(|e| e.to_string())?;
            let msgs: Vec<String> = l.items.into_iter().filter_map(|e| e.message).collect();
            if msgs
                .iter()
                .any(|m| m.contains("not ready: loaded none, want 2.8.0"))
            {
                Ok(())
            } else {
                Err(format!("{msgs:?}"))
            }
        },
    )
    .await;
    let pod2 = rn
        .pods(ns)
        .get(&inst2)
        .await
        .unwrap_or_else(|e| panic!("{inst2}: {e}"));
    assert!(
        !ttdrv_testkit::pod_ready(&pod2),
        "installer pod Ready without a module"
    );
    ph.phase("agent's host path: node labelled with its own token, readiness probe ran");
    inst2
}

/// Done with reason HostManaged, uncordoned, the gate label gone, the
/// telemetry pod and the workload back.
pub(super) async fn uncordoned_gate_open(t: &Ctx, ph: &mut Phases) {
    let rn = &t.rn;
    let node = &t.rn.node;
    let (_, reason) = rn.record().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        reason.as_deref(),
        Some("HostManaged"),
        "node Done with the wrong reason"
    );
    assert_eq!(
        rn.cordoned().await,
        Ok(false),
        "node still cordoned after Done"
    );
    for gate in GATES {
        assert_eq!(
            rn.label(gate).await,
            Ok(None),
            "deploy gate label {gate} left on the node"
        );
    }
    for app in STACK {
        rn.wait_running(
            &format!("the {app} pod back"),
            "ml",
            &format!("app={app}"),
            1,
        )
        .await;
    }
    rn.wait_running(
        &format!("the workload Running again on {node}"),
        "ml",
        "app=train",
        1,
    )
    .await;
    ph.phase("uncordoned, gates open, Done (HostManaged), stack and workload back");
}
