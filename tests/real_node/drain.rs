//! Steps 2 to 4 on the node: the workload, the policy and the real agent's
//! refusal, the drain held by the PDB and then let through.

use super::*;

/// The workload (hostPath /dev/tenstorrent, behind a PDB) and the telemetry
/// DaemonSet behind the deploy gate Running. The workload pod.
pub(super) async fn workload_running(t: &Ctx, ph: &mut Phases) -> String {
    let rn = &t.rn;
    let node = &t.rn.node;
    let agent_ref = &t.agent_ref;
    let pause_ref = &t.pause_ref;
    let vars = [
        ("NODE", node.as_str()),
        ("AGENT_IMAGE", agent_ref.as_str()),
        ("PAUSE_IMAGE", pause_ref.as_str()),
    ];
    apply_fixture(&rn.c, &fixture("workload.yaml"), &vars).await;
    let train = rn
        .wait_running(
            &format!("the workload pod Running on {node}"),
            "ml",
            "app=train",
            1,
        )
        .await;
    for app in STACK {
        rn.wait_running(
            &format!("the privileged {app} DaemonSet pod Running"),
            "ml",
            &format!("app={app}"),
            1,
        )
        .await;
    }
    let train1 = train[0].clone();
    ph.phase(
        "workload (hostPath /dev/tenstorrent, PDB), privileged telemetry and fabric-manager DaemonSets Running",
    );
    train1
}

/// The policy cordons the node and closes the deploy gate; the telemetry
/// pod leaves.
pub(super) async fn policy_cordons_and_closes_gate(t: &Ctx, ph: &mut Phases) {
    let rn = &t.rn;
    apply_fixture(&rn.c, &fixture("policy.yaml"), &[]).await;
    wait_for("the node cordoned for 2.7.0 -> 2.8.0", rn.t, || async {
        if rn.cordoned().await? {
            Ok(())
        } else {
            Err("schedulable".into())
        }
    })
    .await;
    ph.phase("policy applied -> node cordoned");
    for gate in GATES {
        wait_for(&format!("deploy gate {gate} closed"), rn.t, || {
            rn.label_is(gate, "false")
        })
        .await;
    }
    for app in STACK {
        wait_for(
            &format!("the {app} pod gone behind its closed gate"),
            rn.t,
            || async {
                let p = rn.pod_names("ml", &format!("app={app}"), "").await?;
                if p.is_empty() {
                    Ok(())
                } else {
                    Err(format!("{p:?}"))
                }
            },
        )
        .await;
    }
    ph.phase("both deploy gates closed, the telemetry and fabric-manager pods left");
}

/// The real agent in the installer pod refuses the source build (no kernel
/// headers on this machine). The installer pod.
pub(super) async fn agent_refuses_source_build(t: &Ctx, ph: &mut Phases) -> String {
    let rn = &t.rn;
    let node = &t.rn.node;
    // The installer pod on the real node: the real agent, refusing a source build here.
    let inst1 = wait_for(&format!("an installer pod on {node}"), rn.t, || async {
        rn.installers()
            .await?
            .into_iter()
            .next()
            .ok_or_else(|| "none".to_string())
    })
    .await;
    let kver = run("uname", &["-r"]).unwrap_or_default();
    let words = wait_for(
        &format!(
            "the agent refuses the source build (no kernel headers for {})",
            kver.trim()
        ),
        rn.t,
        || async {
            for previous in [false, true] {
                if let Some(l) = refusal(&rn.logs(&inst1, previous).await) {
                    return Ok(l.to_string());
                }
            }
            Err(format!("no refusal in the logs of {inst1}"))
        },
    )
    .await;
    let words = words
        .find("summary: result=failed")
        .map_or(&words[..], |i| &words[i..]);
    ph.log(&format!(
        "agent on {node}: {}",
        words.chars().take(240).collect::<String>()
    ));
    ph.phase("real agent in the installer pod: refusal (no kernel headers) asserted");
    inst1
}

/// A DKMS install appears on the node while it drains (before the refusing
/// pod has crash-looped three times: the controller would fail the node on
/// that pod's restarts at Upgrading); the agent's next start finds it. This
/// test runs in the node's mount namespace: this is the node's /var/lib.
pub(super) fn dkms_install_appears() {
    std::fs::create_dir_all("/var/lib/dkms/tenstorrent/2.7.0")
        .unwrap_or_else(|e| panic!("creating the DKMS tree: {e}"));
}

/// The drain blocked: the PDB refuses the eviction
/// (`ttdriver_drain_blocked_total`), the workload pod stays.
pub(super) async fn blocked_by_pdb(t: &Ctx, ph: &mut Phases, svc_addr: &str, train1: &str) {
    let rn = &t.rn;
    wait_for("the drain blocked by the PDB", rn.t, || {
        rn.state_is("Draining")
    })
    .await;
    wait_for(
        "ttdriver_drain_blocked_total (the PDB refused the eviction)",
        rn.t,
        || async {
            let mut addrs = vec![svc_addr.to_string()];
            addrs.extend(rn.endpoints().await?);
            for a in &addrs {
                if let Ok(t) = http_get(a, "/metrics").await
                    && metric(&t, "ttdriver_drain_blocked_total").is_some()
                {
                    return Ok(());
                }
            }
            Err(format!("no ttdriver_drain_blocked_total at {addrs:?}"))
        },
    )
    .await;
    assert!(
        rn.pod_exists("ml", train1).await.unwrap_or(false),
        "the workload pod went although its PDB refuses"
    );
    ph.phase("drain: eviction refused by the PDB, pod kept");
}

/// The PDB relaxed: the controller evicts the workload pod through the
/// Eviction API (audit log).
pub(super) async fn pdb_relaxed_pod_evicted(t: &Ctx, ph: &mut Phases, train1: &str) {
    let rn = &t.rn;
    let audit = &t.audit;
    let ctl_sa = &t.ctl_sa;
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(rn.c.clone(), "ml");
    let relax = serde_json::json!({"spec": {"minAvailable": 0}});
    pdbs.patch("train", &PatchParams::default(), &Patch::Merge(&relax))
        .await
        .unwrap_or_else(|e| panic!("relaxing the PDB: {e}"));
    wait_for("the workload pod evicted", rn.t, || async {
        if rn.pod_exists("ml", train1).await? {
            Err(format!("{train1} still there"))
        } else {
            Ok(())
        }
    })
    .await;
    let eviction = AuditQuery {
        verb: "create",
        resource: "pods",
        subresource: "eviction",
        user: ctl_sa,
        name: Some(train1),
        node_claim: None,
    };
    eviction
        .find_in(audit)
        .unwrap_or_else(|e| panic!("no eviction of ml/{train1} by the controller: {e}"));
    ph.phase("PDB relaxed -> pod evicted through the Eviction API");
}
