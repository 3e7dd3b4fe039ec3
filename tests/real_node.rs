//! The real-node test (hack/test-realnode.sh, a stage of `make test`): the
//! shipped chart, controller image and agent image on a real kubelet. The
//! script brings up the node (hack/realnode.sh) and runs this test inside its
//! namespaces, passing the facts it needs as REALNODE_* variables; every
//! check is made here, in the order of docs/development.md ("The real-node
//! test"):
//!
//!   1. helm install of chart/: two controller replicas with leader election,
//!      the metrics Service scraped through its IP and each endpoint (one
//!      leader); the VFIO binder (vfioManager) reports this node's functions
//!      with its pod's token, through its node-patch policy
//!   2. a workload (hostPath /dev/tenstorrent) behind a PDB that first
//!      refuses, and the privileged telemetry and fabric-manager DaemonSets,
//!      each behind its deploy gate
//!   3. a policy (2.8.0): the real agent in the installer pod refuses the
//!      source build (no kernel headers on this machine)
//!   4. cordon, both gates closed (both pods leave), the eviction refused by the PDB; helm upgrade and
//!      rollback keep the node Draining with a lease hand-over; the PDB
//!      relaxed, the controller evicts the pod (audit log)
//!   5. a DKMS install appears: the agent labels its node install-mode=host
//!      with its pod-bound token (audit log), its readiness probe runs, the
//!      node is Done (HostManaged), uncordoned, gates open, stack and workload back
//!   6. the admission policy on the agent's own token
//!   7. `kubectl tt driver`
//!   8. a firmware policy flashes the node: a real flash Job on the kubelet
//!      (the flasher image, its cards simulated in a host directory)
//!
//! [`real_node`] lists the steps in that order, one call each; their code is
//! in the modules named for what they check (`chart`, `drain`, `host_path`,
//! `access`), over the helpers here.

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, ListParams, LogParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use ttdrv_api::TenstorrentDriverPolicy;
use ttdrv_api::vfio::{PCI_FUNCTIONS, Passthrough, PciFunctions};
use ttdrv_testkit::real_node::{
    AuditQuery, Diagnostics, Phases, apply_fixture, env, http_get, run, timeout_from_env,
};
use ttdrv_testkit::{client, wait_for};

#[path = "real_node/access.rs"]
mod access;
#[path = "real_node/chart.rs"]
mod chart;
#[path = "real_node/drain.rs"]
mod drain;
#[path = "real_node/host_path.rs"]
mod host_path;

/// The first sample of `name` in a scrape.
fn metric(text: &str, name: &str) -> Option<f64> {
    ttdrv_testkit::controller::metric_samples(text, name, &[]).next()
}

const POLICY: &str = "realnode";
const INSTALLER: &str = "app.kubernetes.io/name=tt-driver-installer";
const PCI: &str = "feature.node.kubernetes.io/pci-1200_1e52.present";
/// The chart's default deploy gates: the telemetry collector's and the
/// fabric manager's.
const GATES: [&str; 2] = [
    "tenstorrent.com/deploy.tt-telemetry",
    "tenstorrent.com/deploy.tt-fabric-manager",
];
/// The stack's privileged DaemonSets of the workload fixture (their `app`).
const STACK: [&str; 2] = ["telemetry", "fabric-manager-agent"];
const KMD: &str = "driver.tenstorrent.com/kmd-version";
const MODE: &str = "driver.tenstorrent.com/install-mode";

struct Rn {
    c: Client,
    node: String,
    ns: String,
    rel: String,
    t: Duration,
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/real_node")
        .join(name)
}

impl Rn {
    fn pods(&self, ns: &str) -> Api<Pod> {
        Api::namespaced(self.c.clone(), ns)
    }

    async fn node_obj(&self) -> Result<Node, String> {
        let api: Api<Node> = Api::all(self.c.clone());
        api.get(&self.node).await.map_err(|e| e.to_string())
    }

    async fn label(&self, key: &str) -> Result<Option<String>, String> {
        let n = self.node_obj().await?;
        Ok(n.metadata.labels.and_then(|l| l.get(key).cloned()))
    }

    async fn label_is(&self, key: &str, want: &str) -> Result<(), String> {
        match self.label(key).await? {
            Some(v) if v == want => Ok(()),
            v => Err(format!("{key}={v:?}")),
        }
    }

    async fn cordoned(&self) -> Result<bool, String> {
        let n = self.node_obj().await?;
        Ok(n.spec.and_then(|s| s.unschedulable).unwrap_or(false))
    }

    /// The node's record in the policy: (state, reason).
    async fn record(&self) -> Result<(String, Option<String>), String> {
        let api: Api<TenstorrentDriverPolicy> = Api::all(self.c.clone());
        let p = api.get(POLICY).await.map_err(|e| e.to_string())?;
        let st = p.status.unwrap_or_default();
        let r = st
            .nodes
            .iter()
            .find(|n| n.name == self.node)
            .ok_or_else(|| format!("no record of {} in {:?}", self.node, st.nodes))?;
        Ok((r.state.as_str().to_string(), r.reason.clone()))
    }

    async fn state_is(&self, want: &str) -> Result<(), String> {
        let (s, r) = self.record().await?;
        if s == want {
            Ok(())
        } else {
            Err(format!("state {s} ({r:?})"))
        }
    }

    async fn running(&self, ns: &str, sel: &str) -> Result<Vec<String>, String> {
        let lp = ListParams::default()
            .labels(sel)
            .fields("status.phase=Running");
        let l = self.pods(ns).list(&lp).await.map_err(|e| e.to_string())?;
        Ok(l.items
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect())
    }

    async fn wait_running(&self, what: &str, ns: &str, sel: &str, n: usize) -> Vec<String> {
        wait_for(what, self.t, || async {
            let r = self.running(ns, sel).await?;
            if r.len() == n {
                Ok(r)
            } else {
                Err(format!("Running: {r:?}"))
            }
        })
        .await
    }

    async fn pod_names(&self, ns: &str, sel: &str, fields: &str) -> Result<Vec<String>, String> {
        let lp = ListParams::default().labels(sel).fields(fields);
        let l = self.pods(ns).list(&lp).await.map_err(|e| e.to_string())?;
        Ok(l.items
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect())
    }

    async fn installers(&self) -> Result<Vec<String>, String> {
        self.pod_names(&self.ns, INSTALLER, &format!("spec.nodeName={}", self.node))
            .await
    }

    async fn pod_exists(&self, ns: &str, name: &str) -> Result<bool, String> {
        self.pods(ns)
            .get_opt(name)
            .await
            .map(|p| p.is_some())
            .map_err(|e| e.to_string())
    }

    async fn lease_holder(&self) -> Result<String, String> {
        let api: Api<Lease> = Api::namespaced(self.c.clone(), &self.ns);
        let l = api
            .get("tt-k8s-driver-manager")
            .await
            .map_err(|e| e.to_string())?;
        l.spec
            .and_then(|s| s.holder_identity)
            .filter(|h| !h.is_empty())
            .ok_or_else(|| "no holder".to_string())
    }

    /// Waits until a controller pod other than `not` holds the lease.
    async fn wait_new_holder(&self, what: &str, not: &str) -> String {
        wait_for(what, self.t, || async {
            let h = self.lease_holder().await?;
            if h != not && self.pod_exists(&self.ns, &h).await? {
                Ok(h)
            } else {
                Err(format!("holder {h}"))
            }
        })
        .await
    }

    fn svc(&self) -> String {
        format!("{}-metrics", self.rel)
    }

    async fn svc_addr(&self) -> String {
        let api: Api<Service> = Api::namespaced(self.c.clone(), &self.ns);
        let s = api
            .get(&self.svc())
            .await
            .unwrap_or_else(|e| panic!("Service {}: {e}", self.svc()));
        let ip = s.spec.and_then(|s| s.cluster_ip).unwrap_or_default();
        format!("{ip}:8080")
    }

    /// The first address of each endpoint of the metrics Service.
    async fn endpoints(&self) -> Result<Vec<String>, String> {
        let api: Api<EndpointSlice> = Api::namespaced(self.c.clone(), &self.ns);
        let lp =
            ListParams::default().labels(&format!("kubernetes.io/service-name={}", self.svc()));
        let l = api.list(&lp).await.map_err(|e| e.to_string())?;
        Ok(l.items
            .iter()
            .flat_map(|s| s.endpoints.iter())
            .filter_map(|e| e.addresses.first().map(|a| format!("{a}:8080")))
            .collect())
    }

    /// Logs of every container (init containers too) of the pod; `previous`
    /// for their last terminated run.
    async fn logs(&self, pod: &str, previous: bool) -> String {
        let api = self.pods(&self.ns);
        let Ok(p) = api.get(pod).await else {
            return String::new();
        };
        let spec = p.spec.unwrap_or_default();
        let names = spec
            .init_containers
            .unwrap_or_default()
            .into_iter()
            .chain(spec.containers)
            .map(|c| c.name);
        let mut out = String::new();
        for container in names {
            let lp = LogParams {
                container: Some(container),
                previous,
                ..Default::default()
            };
            if let Ok(l) = api.logs(pod, &lp).await {
                out.push_str(&l);
            }
        }
        out
    }

    fn helm(&self, args: &[&str]) -> Result<String, String> {
        run("helm", args)
    }
}

/// The agent's summary line of a refused source build (no kernel headers).
/// The eviction requests (answered or refused) `user` made for pods of
/// `namespace`, from the audit log at `path`, as `name (code)`.
fn evictions_in(path: &str, user: &str, namespace: &str) -> Vec<String> {
    let log = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    let s = |v: &serde_json::Value| v.as_str().unwrap_or("").to_string();
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| {
            let o = &e["objectRef"];
            s(&e["stage"]) == "ResponseComplete"
                && s(&e["verb"]) == "create"
                && s(&o["resource"]) == "pods"
                && s(&o["subresource"]) == "eviction"
                && s(&o["namespace"]) == namespace
                && s(&e["user"]["username"]) == user
        })
        .map(|e| {
            format!(
                "{} ({})",
                s(&e["objectRef"]["name"]),
                e["responseStatus"]["code"]
            )
        })
        .collect()
}

fn refusal(logs: &str) -> Option<&str> {
    logs.lines().find(|l| {
        l.find("result=failed")
            .is_some_and(|i| l[i..].contains("linux-headers"))
    })
}

/// What every step reads: the node and the release, the images the script
/// built, the API server's audit log, the two service accounts.
struct Ctx {
    rn: Rn,
    audit: String,
    ctl_ref: String,
    agent_ref: String,
    pause_ref: String,
    vfio_ref: String,
    flasher_ref: String,
    flash_sim: String,
    agent_sa: String,
    ctl_sa: String,
}

impl Ctx {
    /// From the REALNODE_* variables hack/test-realnode.sh passes.
    async fn from_env() -> Self {
        let rn = Rn {
            c: client().await,
            node: env("REALNODE_NODE"),
            ns: env("REALNODE_NAMESPACE"),
            rel: env("REALNODE_RELEASE"),
            t: timeout_from_env(120),
        };
        let audit = env("REALNODE_AUDIT_LOG");
        let (ctl_ref, agent_ref, pause_ref, vfio_ref) = (
            env("REALNODE_CONTROLLER_IMAGE"),
            env("REALNODE_AGENT_IMAGE"),
            env("REALNODE_PAUSE_IMAGE"),
            env("REALNODE_VFIO_IMAGE"),
        );
        let (flasher_ref, flash_sim) = (env("REALNODE_FLASHER_IMAGE"), env("REALNODE_FLASH_SIM"));
        let (ns, rel) = (&rn.ns, &rn.rel);
        let agent_sa = format!("system:serviceaccount:{ns}:{rel}-agent");
        let ctl_sa = format!("system:serviceaccount:{ns}:{rel}-controller");
        Ctx {
            rn,
            audit,
            ctl_ref,
            agent_ref,
            pause_ref,
            vfio_ref,
            flasher_ref,
            flash_sim,
            agent_sa,
            ctl_sa,
        }
    }

    /// What a failed run prints (see `Diagnostics`).
    fn diagnostics(&self) -> Diagnostics {
        let ns = &self.rn.ns;
        Diagnostics(vec![
            "kubectl get nodes -o wide --show-labels".into(),
            "kubectl get pods -A -o wide".into(),
            "kubectl get ttdp -o jsonpath='{.items[*].status.nodes}'; echo".into(),
            format!("kubectl -n {ns} logs -l {INSTALLER} --tail=30 --all-containers"),
            format!("kubectl -n {ns} logs -l app.kubernetes.io/component=controller --tail=30"),
            "kubectl get events -A --sort-by=.lastTimestamp | tail -n 30".into(),
        ])
    }

    /// helm's and kubectl's `--timeout`: the test's own bound.
    fn timeout(&self) -> String {
        format!("{}s", self.rn.t.as_secs())
    }
}

/// An image reference's repository and tag (`latest` when it has none).
fn split_image(r: &str) -> (String, String) {
    let (repo, tag) = r.rsplit_once(':').unwrap_or((r, "latest"));
    (repo.to_string(), tag.to_string())
}

/// The arguments of `helm <verb>` of chart/ with this test's values.
fn helm_args(t: &Ctx, verb: &str, extra: &[&str]) -> Vec<String> {
    let (rel, ns) = (&t.rn.rel, &t.rn.ns);
    let ((ctl_repo, ctl_tag), (agent_repo, agent_tag)) =
        (split_image(&t.ctl_ref), split_image(&t.agent_ref));
    let (vfio_repo, vfio_tag) = split_image(&t.vfio_ref);
    let (flasher_repo, flasher_tag) = split_image(&t.flasher_ref);
    let flash_sim = &t.flash_sim;
    let timeout = t.timeout();
    let sets = [
        format!("controller.image.repository={ctl_repo}"),
        format!("controller.image.tag={ctl_tag}"),
        format!("driver.image.repository={agent_repo}"),
        format!("driver.image.tag={agent_tag}"),
        "controller.image.pullPolicy=Never".into(),
        "driver.image.pullPolicy=Never".into(),
        // The only node is the one being upgraded: the controller's new pods
        // (helm upgrade, rollback) must schedule on it while it is cordoned.
        "controller.tolerations[0].key=node.kubernetes.io/unschedulable".into(),
        "controller.tolerations[0].operator=Exists".into(),
        "controller.tolerations[0].effect=NoSchedule".into(),
        // the rollout's own timers, short for a test
        "controller.extraArgs={--resync-ms=1000}".into(),
        // No registry here: the CRD upgrade Job's kubectl image cannot be
        // pulled. The controller pods share the only node with the drained
        // workload: a PDB of theirs would add its own refusals to the drain
        // this test counts.
        "crds.upgradeJob.enabled=false".into(),
        "controller.podDisruptionBudget.enabled=false".into(),
        // The VFIO binder, for Wormhole functions this machine does not have:
        // it runs, binds nothing (vfio-pci is not even loadable here) and
        // reports the node.
        "vfioManager.enabled=true".into(),
        format!("vfioManager.image.repository={vfio_repo}"),
        format!("vfioManager.image.tag={vfio_tag}"),
        "vfioManager.image.pullPolicy=Never".into(),
        "vfioManager.devices[0].resourceName=tenstorrent.com/wormhole-vfio".into(),
        "vfioManager.devices[0].deviceId[0]=401e".into(),
        // The firmware policy's flash Jobs: the real flasher image on the
        // kubelet, its cards simulated in a host directory.
        format!("flasher.image.repository={flasher_repo}"),
        format!("flasher.image.tag={flasher_tag}"),
        "flasher.image.pullPolicy=Never".into(),
        format!("flasher.simulateDir={flash_sim}"),
    ];
    let mut a: Vec<String> = [verb, rel.as_str(), "chart", "-n", ns.as_str()]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for s in &sets {
        a.push("--set".into());
        a.push(s.clone());
    }
    // (--set would read 1e52 as a number)
    a.extend([
        "--set-string".into(),
        "vfioManager.devices[0].vendorId=1e52".into(),
    ]);
    a.extend(extra.iter().map(|s| s.to_string()));
    a.extend(["--wait".into(), "--timeout".into(), timeout]);
    a
}

/// The node as node-feature-discovery and an earlier container install left
/// it, and another node's fixture.
async fn label_node_as_found(t: &Ctx) {
    let (rn, node) = (&t.rn, &t.rn.node);
    let nodes: Api<Node> = Api::all(rn.c.clone());
    let labels = serde_json::json!({"metadata": {"labels": {
        PCI: "true", KMD: "2.7.0", MODE: "container"}}});
    nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(&labels))
        .await
        .unwrap_or_else(|e| panic!("labelling {node}: {e}"));
    apply_fixture(&rn.c, &fixture("other-node.yaml"), &[]).await;
}

#[tokio::test]
#[ignore = "runs inside the real node's namespaces: bash hack/test-realnode.sh (make test)"]
async fn real_node() {
    let mut ph = Phases::from_env("test-realnode");
    let t = Ctx::from_env().await;
    let _diag = t.diagnostics();
    ph.log(&format!(
        "images: {} {} {} {}",
        t.ctl_ref, t.agent_ref, t.pause_ref, t.vfio_ref
    ));
    // The node as node-feature-discovery and an earlier container install left it.
    label_node_as_found(&t).await;

    // --- 1. the chart
    // helm install of chart/: two controller replicas Ready
    chart::install(&t, &mut ph);
    // one replica leads; the metrics Service and each endpoint scraped, one leader
    let (holder1, svc_addr) = chart::leader_and_metrics(&t, &mut ph).await;
    // the VFIO binder reports the node (this boot, no function) with its pod token
    chart::vfio_binder_reports_the_node(&t, &mut ph).await;

    // --- 2. the workload
    // the workload behind its PDB and the gated telemetry DaemonSet Running
    let train1 = drain::workload_running(&t, &mut ph).await;

    // --- 3. the policy; the real agent
    // the policy cordons the node and closes the gate; the telemetry pod leaves
    drain::policy_cordons_and_closes_gate(&t, &mut ph).await;
    // the real agent refuses the source build (no kernel headers here)
    let inst1 = drain::agent_refuses_source_build(&t, &mut ph).await;
    // a DKMS install appears on the node while it drains
    drain::dkms_install_appears();

    // --- 4. the drain, with helm upgrade and rollback in the middle
    // the PDB refuses the eviction (counted in the metrics), the pod stays
    drain::blocked_by_pdb(&t, &mut ph, &svc_addr, &train1).await;
    // helm upgrade: the lease handed over, the node still cordoned and Draining
    let holder2 = chart::upgrade_keeps_draining(&t, &mut ph, &holder1).await;
    // helm rollback: the lease handed over again, still Draining, in helm's history
    chart::rollback_keeps_draining(&t, &mut ph, &holder2).await;
    // the PDB relaxed: the controller evicts the pod through the Eviction API
    drain::pdb_relaxed_pod_evicted(&t, &mut ph, &train1).await;

    // --- 5. host path of the agent, uncordon, gate open
    // the agent labels its node install-mode=host with its own pod-bound token
    host_path::agent_labels_host_mode(&t, &mut ph).await;
    // the node Done; no eviction tried in the controller's own namespace
    host_path::done_without_own_evictions(&t, &mut ph).await;
    // the installer pod that stays: its readiness probe ran and keeps it not Ready
    let inst2 = host_path::readiness_probe_ran(&t, &mut ph, &inst1).await;
    // Done (HostManaged), uncordoned, gate open, telemetry and workload back
    host_path::uncordoned_gate_open(&t, &mut ph).await;

    // --- 6. the admission policy on the agent's pod-bound token
    access::admission_on_agent_token(&t, &mut ph, &inst2).await;

    // --- 7. kubectl tt driver shows the policy and the node
    access::kubectl_tt_driver(&t, &mut ph);

    // --- 8. a firmware policy: cordon, drain, a real flash Job on the
    // kubelet (the flasher image; its cards simulated), readback, uncordon
    flash_the_node(&t.rn, &t.flash_sim).await;
    ph.phase("firmware: a real flash Job flashed the node (simulated cards), Done, uncordoned, workload back");
    ph.report();
}

/// A client with only the token (no admin certificate): the server and CA
/// of the admin kubeconfig.
async fn agent_client(token: &str, ca: &str) -> Client {
    let server = kube::Config::infer()
        .await
        .map(|c| c.cluster_url.to_string())
        .unwrap_or_else(|e| panic!("kubeconfig: {e}"));
    let yaml = serde_json::json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server, "certificate-authority": ca}}],
        "users": [{"name": "agent", "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "agent"}}],
        "current-context": "c"
    })
    .to_string();
    let kc =
        kube::config::Kubeconfig::from_yaml(&yaml).unwrap_or_else(|e| panic!("kubeconfig: {e}"));
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap_or_else(|e| panic!("agent's client config: {e}"));
    Client::try_from(config).unwrap_or_else(|e| panic!("agent's client: {e}"))
}

/// What the agent's token may and may not do; the number of checks made.
async fn admission_checks(agent: &Client, node: &str, agent_sa: &str, ph: &Phases) -> usize {
    use k8s_openapi::api::authentication::v1::SelfSubjectReview;
    let review = Api::<SelfSubjectReview>::all(agent.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .unwrap_or_else(|e| panic!("auth whoami with the agent's token: {e}"));
    let who = review
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username);
    assert_eq!(
        who.as_deref(),
        Some(agent_sa),
        "the token is not the agent's"
    );
    let nodes: Api<Node> = Api::all(agent.clone());
    let patch = |name: &str, body: serde_json::Value| {
        let nodes = nodes.clone();
        let name = name.to_string();
        async move {
            nodes
                .patch(&name, &PatchParams::default(), &Patch::Merge(&body))
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        }
    };
    let labels = |k: &str, v: &str| serde_json::json!({"metadata": {"labels": {k: v}}});
    let go_ahead = format!(r#"{{"policy":"realnode","node":"{node}","target":"2.8.0","cycle":1}}"#);
    let mut checks = 0;
    let r = patch(
        node,
        labels("tt-smi.driver.tenstorrent.com/version", "6.8.0"),
    )
    .await;
    assert_eq!(
        r,
        Ok(()),
        "agent token refused: label its own node's driver label"
    );
    ph.log("allowed as expected: label its own node's driver label");
    checks += 1;
    let denied = [
        (
            "label another node",
            "may not modify node other-node",
            patch("other-node", labels(KMD, "2.8.0")).await,
        ),
        (
            "set another label on its node",
            "may change only the node labels",
            patch(node, labels("pool", "stolen")).await,
        ),
        (
            "write the go-ahead annotation",
            "may not change node annotations",
            patch(
                node,
                serde_json::json!({"metadata": {"annotations": {
             "driver.tenstorrent.com/go-ahead": go_ahead}}}),
            )
            .await,
        ),
        (
            "cordon its node",
            "may not change the node spec",
            patch(node, serde_json::json!({"spec": {"unschedulable": true}})).await,
        ),
        (
            "delete its node (RBAC)",
            "forbidden",
            nodes
                .delete(node, &DeleteParams::default())
                .await
                .map(|_| ())
                .map_err(|e| e.to_string()),
        ),
    ];
    for (what, want, r) in denied {
        match r {
            Ok(()) => panic!("agent token allowed: {what}"),
            Err(e) => assert!(
                e.contains(want),
                "agent token refused for another reason: {what}: {e}"
            ),
        }
        ph.log(&format!("refused as expected: {what}"));
        checks += 1;
    }
    checks
}

/// Phase 8: a TenstorrentFirmwarePolicy flashes the node through a real Job on
/// the kubelet; the flasher's device step is simulated in `sim` (two cards).
async fn flash_the_node(rn: &Rn, sim: &str) {
    use ttdrv_api::firmware::{FirmwareNodeState, TenstorrentFirmwarePolicy, labels as fw};
    let cards = format!("{sim}/cards.json");
    std::fs::create_dir_all(sim).unwrap_or_else(|e| panic!("creating {sim}: {e}"));
    std::fs::write(&cards, r#"["19.7.0.0", "19.7.0.0"]"#)
        .unwrap_or_else(|e| panic!("writing {cards}: {e}"));
    let policy: TenstorrentFirmwarePolicy = serde_json::from_value(serde_json::json!({
        "apiVersion": "firmware.tenstorrent.com/v1alpha1",
        "kind": "TenstorrentFirmwarePolicy",
        "metadata": { "name": "realnode-fw" },
        "spec": { "version": "19.8.0", "nodeAffinity": {} },
    }))
    .expect("firmware policy");
    let api: Api<TenstorrentFirmwarePolicy> = Api::all(rn.c.clone());
    api.create(&PostParams::default(), &policy)
        .await
        .unwrap_or_else(|e| panic!("creating the firmware policy: {e}"));
    let node = rn.node.clone();
    wait_for("the firmware policy's node Done", rn.t, || async {
        let st = api
            .get("realnode-fw")
            .await
            .map_err(|e| e.to_string())?
            .status
            .unwrap_or_default();
        match st.nodes.iter().find(|n| n.name == node) {
            Some(n) if n.state == FirmwareNodeState::Done => Ok(n.clone()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let st = api
        .get("realnode-fw")
        .await
        .expect("firmware policy")
        .status
        .unwrap_or_default();
    let entry = st.nodes.iter().find(|n| n.name == node).expect("entry");
    assert_eq!(
        entry.current_version.as_deref(),
        Some("19.8.0.0"),
        "{entry:?}"
    );
    let written = std::fs::read_to_string(&cards).unwrap_or_default();
    assert_eq!(
        written.matches("19.8.0.0").count(),
        2,
        "the flasher wrote both simulated cards: {written}"
    );
    // The Job's pod ran on the kubelet and succeeded.
    let lp = ListParams::default().labels(&format!("{}=realnode-fw", fw::JOB_POLICY));
    let pods = rn.pods(&rn.ns).list(&lp).await.expect("flash pods");
    let phases: Vec<Option<String>> = pods
        .items
        .iter()
        .map(|p| p.status.as_ref().and_then(|s| s.phase.clone()))
        .collect();
    assert_eq!(phases, vec![Some("Succeeded".to_string())], "flash pods");
    assert!(!rn.cordoned().await.expect("node"), "left cordoned");
    assert_eq!(
        rn.label(fw::FW_VERSION).await.expect("node").as_deref(),
        Some("19.8.0.0")
    );
    rn.wait_running(
        &format!("the workload Running again on {node} after the flash"),
        "ml",
        "app=train",
        1,
    )
    .await;
}
