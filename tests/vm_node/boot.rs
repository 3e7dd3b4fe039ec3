//! The chart and the guest: helm install while the guest boots, its init,
//! containerd and images, the node Ready.

use super::*;

/// helm install of chart/: the controller (two replicas) on the host-side
/// node, the installer image the agent image.
pub(super) fn install_chart(t: &Run, ph: &mut Phases) {
    let vm = &t.vm;
    let ns = &t.vm.ns;
    let rel = &t.rel;
    let ctl_ref = &t.ctl_ref;
    let agent_ref = &t.agent_ref;
    let split = |r: &str| -> (String, String) {
        let (repo, tag) = r.rsplit_once(':').unwrap_or((r, "latest"));
        (repo.to_string(), tag.to_string())
    };
    let ((ctl_repo, ctl_tag), (agent_repo, agent_tag)) = (split(ctl_ref), split(agent_ref));
    let timeout = format!("{}s", vm.t.as_secs());
    let mut args: Vec<String> = ["install", rel, "chart", "--create-namespace", "-n", ns]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for s in [
        format!("controller.image.repository={ctl_repo}"),
        format!("controller.image.tag={ctl_tag}"),
        format!("driver.image.repository={agent_repo}"),
        format!("driver.image.tag={agent_tag}"),
        "controller.image.pullPolicy=Never".into(),
        "driver.image.pullPolicy=Never".into(),
        // two: the fault phase kills the leader (leader_fault)
        "controller.replicas=2".into(),
        "controller.nodeSelector.kubernetes\\.io/hostname=real-node-1".into(),
        // The guest builds the real tt-kmd on one TCG thread, about 70 times
        // slower than the host (in CI 484 s, 869 s and 1140 s as the load
        // beside it grew): the default 900 s failed the first install as
        // UpgradeTimeout while it built. The test's own waits bound each step.
        format!(
            "controller.upgradeTimeoutSeconds={}",
            2 * vm.t.as_secs().max(900)
        ),
        // the stub tt-kmd repository in the guest, through the installer pod's /host
        "controller.extraArgs={--resync-ms=1000,--source-repository=/host/opt/tt-kmd.git}".into(),
        // That repository's tags name the stub's commits, not upstream's:
        // the chart's pins of the upstream releases go.
        "driver.sourceCommits=null".into(),
    ] {
        args.extend(["--set".to_string(), s]);
    }
    args.extend(["--wait".into(), "--timeout".into(), timeout]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run("helm", &args).unwrap_or_else(|e| panic!("helm install of chart/: {e}"));
    ph.log("chart installed: controller Ready on real-node-1");
}

/// The guest boots to init, brings up containerd and imports the agent and
/// pause images.
pub(super) async fn guest_boots(t: &Run, ph: &mut Phases) {
    let vm = &t.vm;
    vm.wait_con("the guest's init", "init ").await;
    ph.phase("guest kernel boot to init");
    vm.wait_con("containerd in the guest", "containerd up")
        .await;
    ph.phase("guest network, containerd up");
    vm.wait_con("images imported in the guest", "images imported")
        .await;
    ph.phase("agent and pause images imported into the guest's containerd");
}

/// The guest's kubelet registers the node and it turns Ready.
pub(super) async fn node_ready(t: &Run, ph: &mut Phases) {
    let vm = &t.vm;
    let vnode = &t.vm.node;
    wait_for(&format!("node {vnode} Ready"), vm.t, || async {
        let n = vm.node_obj().await?;
        let ready = n.status.and_then(|s| s.conditions).unwrap_or_default();
        let ready = ready
            .iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| c.status.clone());
        if ready.as_deref() == Some("True") {
            Ok(())
        } else {
            Err(format!("Ready={ready:?}"))
        }
    })
    .await;
    ph.phase(&format!(
        "kubelet started -> node {vnode} registered and Ready"
    ));
}
