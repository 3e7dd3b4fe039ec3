//! Step 1 and the helm steps of step 4: the chart installed, its leader and
//! metrics, the VFIO binder's report; helm upgrade and rollback mid-drain.

use super::*;

/// The message of a check that the node is still Draining after `when`.
fn still(when: &str) -> String {
    format!("after {when} the node must still be Draining")
}

/// helm install of chart/ (two controller replicas Ready).
pub(super) fn install(t: &Ctx, ph: &mut Phases) {
    let rn = &t.rn;
    let install = helm_args(t, "install", &["--create-namespace"]);
    let install: Vec<&str> = install.iter().map(String::as_str).collect();
    rn.helm(&install)
        .unwrap_or_else(|e| panic!("helm install of chart/: {e}"));
    ph.phase("helm install (2 controller replicas Ready)");
}

/// One replica holds the lease; the metrics Service answers through its
/// ClusterIP, and of its endpoints exactly one exports `ttdriver_leader 1`.
/// The lease holder and the Service's address.
pub(super) async fn leader_and_metrics(t: &Ctx, ph: &mut Phases) -> (String, String) {
    let rn = &t.rn;
    let ns = &t.rn.ns;
    let holder1 = wait_for("a controller replica holds the lease", rn.t, || {
        rn.lease_holder()
    })
    .await;
    assert!(
        rn.pod_exists(ns, &holder1).await.unwrap_or(false),
        "lease holder {holder1} is not a controller pod"
    );
    // The metrics Service: through its ClusterIP (kube-proxy), and each endpoint.
    // kube-proxy programs a new Service's endpoints on its own time (a
    // ClusterIP without them refuses connections): waited for, bounded.
    let svc_addr = rn.svc_addr().await;
    let scrape = wait_for(
        &format!("Service {} answers at {svc_addr} (kube-proxy)", rn.svc()),
        rn.t,
        || http_get(&svc_addr, "/metrics"),
    )
    .await;
    assert!(
        metric(&scrape, "ttdriver_build_info").is_some(),
        "no ttdriver_build_info from {}",
        rn.svc()
    );
    let mut leaders = 0;
    let eps = rn
        .endpoints()
        .await
        .unwrap_or_else(|e| panic!("endpoints: {e}"));
    for ep in &eps {
        let text = http_get(ep, "/metrics")
            .await
            .unwrap_or_else(|e| panic!("scrape of endpoint {ep}: {e}"));
        if metric(&text, "ttdriver_leader") == Some(1.0) {
            leaders += 1;
        }
    }
    assert_eq!(
        leaders, 1,
        "expected exactly one replica (of {eps:?}) exporting ttdriver_leader 1"
    );
    ph.log(&format!(
        "leader {holder1}; metrics scraped through {svc_addr} and both endpoints (one leader)"
    ));
    ph.phase("leader elected, metrics Service scraped");
    (holder1, svc_addr)
}

/// The VFIO binder's report, written with its pod's token (the node-patch
/// policy admits only its own node's two keys): this boot, no function.
pub(super) async fn vfio_binder_reports_the_node(t: &Ctx, ph: &mut Phases) {
    let rn = &t.rn;
    let report = wait_for("the VFIO binder's report on the node", rn.t, || async {
        let n = rn.node_obj().await?;
        let boot = n
            .status
            .as_ref()
            .and_then(|s| s.node_info.as_ref())
            .map(|i| i.boot_id.clone());
        let value = n
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(PCI_FUNCTIONS).cloned());
        match value
            .as_deref()
            .and_then(|v| PciFunctions::at_boot(v, boot.as_deref()))
        {
            Some(p) if !p.boot_id.is_empty() => Ok(p),
            _ => Err(format!("{value:?} (node boot {boot:?})")),
        }
    })
    .await;
    assert_eq!(report.total(), 0, "{report:?}");
    assert_eq!(report.passthrough(), Passthrough::None);
    ph.log(&format!("the binder's report: {}", report.to_annotation()));
    ph.phase("VFIO binder: the node reported with its pod token");
}

/// helm upgrade mid-drain: the lease goes to an upgraded replica, the node
/// stays cordoned and Draining. The new lease holder.
pub(super) async fn upgrade_keeps_draining(t: &Ctx, ph: &mut Phases, holder1: &str) -> String {
    let rn = &t.rn;
    let upgrade = helm_args(t, "upgrade", &["--set", "controller.logLevel=debug"]);
    let upgrade: Vec<&str> = upgrade.iter().map(String::as_str).collect();
    rn.helm(&upgrade)
        .unwrap_or_else(|e| panic!("helm upgrade: {e}"));
    let holder2 = rn
        .wait_new_holder("the lease held by an upgraded replica", holder1)
        .await;
    assert_eq!(
        rn.record().await.map(|r| r.0),
        Ok("Draining".into()),
        "{}",
        still("helm upgrade")
    );
    assert_eq!(
        rn.cordoned().await,
        Ok(true),
        "helm upgrade uncordoned the node mid-rollout"
    );
    ph.phase("helm upgrade: new replicas, lease handed over, still Draining");
    holder2
}

/// helm rollback mid-drain: the lease goes to a rolled-back replica, the node
/// stays Draining, and helm's history ends with the rollback.
pub(super) async fn rollback_keeps_draining(t: &Ctx, ph: &mut Phases, holder2: &str) {
    let rn = &t.rn;
    let ns = &t.rn.ns;
    let rel = &t.rn.rel;
    let timeout = t.timeout();
    rn.helm(&["-n", ns, "rollback", rel])
        .unwrap_or_else(|e| panic!("helm rollback: {e}"));
    let deploy = format!("deploy/{rel}-controller");
    run(
        "kubectl",
        &[
            "-n",
            ns,
            "rollout",
            "status",
            &deploy,
            &format!("--timeout={timeout}"),
        ],
    )
    .unwrap_or_else(|e| panic!("rollback's controller pods: {e}"));
    rn.wait_new_holder("the lease held by a rolled-back replica", holder2)
        .await;
    assert_eq!(
        rn.record().await.map(|r| r.0),
        Ok("Draining".into()),
        "{}",
        still("helm rollback")
    );
    let history: serde_json::Value = rn
        .helm(&["-n", ns, "history", rel, "-o", "json"])
        .and_then(|h| serde_json::from_str(&h).map_err(|e| e.to_string()))
        .unwrap_or_else(|e| panic!("helm history: {e}"));
    let last = history
        .as_array()
        .and_then(|h| h.last())
        .map(|h| h["description"].clone());
    assert_eq!(
        last,
        Some(serde_json::json!("Rollback to 1")),
        "helm history does not end with the rollback"
    );
    ph.phase("helm rollback: old replicas, lease handed over, still Draining");
}
