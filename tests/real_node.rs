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
//!      refuses, and a DaemonSet behind the deploy gate
//!   3. a policy (2.8.0): the real agent in the installer pod refuses the
//!      source build (no kernel headers on this machine)
//!   4. cordon, gate closed, the eviction refused by the PDB; helm upgrade and
//!      rollback keep the node Draining with a lease hand-over; the PDB
//!      relaxed, the controller evicts the pod (audit log)
//!   5. a DKMS install appears: the agent labels its node install-mode=host
//!      with its pod-bound token (audit log), its readiness probe runs, the
//!      node is Done (HostManaged), uncordoned, gate open, workload back
//!   6. the admission policy on the agent's own token
//!   7. `kubectl tt driver`
//!   8. a firmware policy flashes the node: a real flash Job on the kubelet
//!      (the flasher image, its cards simulated in a host directory)

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

/// The first sample of `name` in a scrape.
fn metric(text: &str, name: &str) -> Option<f64> {
    ttdrv_testkit::controller::metric_samples(text, name, &[]).next()
}

const POLICY: &str = "realnode";
const INSTALLER: &str = "app.kubernetes.io/name=tt-driver-installer";
const PCI: &str = "feature.node.kubernetes.io/pci-1200_1e52.present";
const GATE: &str = "tenstorrent.com/deploy.tt-telemetry";
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

#[tokio::test]
#[ignore = "runs inside the real node's namespaces: bash hack/test-realnode.sh (make test)"]
async fn real_node() {
    let mut ph = Phases::from_env("test-realnode");
    let rn = Rn {
        c: client().await,
        node: env("REALNODE_NODE"),
        ns: env("REALNODE_NAMESPACE"),
        rel: env("REALNODE_RELEASE"),
        t: timeout_from_env(120),
    };
    let (node, ns, rel) = (rn.node.clone(), rn.ns.clone(), rn.rel.clone());
    let audit = env("REALNODE_AUDIT_LOG");
    let (ctl_ref, agent_ref, pause_ref, vfio_ref) = (
        env("REALNODE_CONTROLLER_IMAGE"),
        env("REALNODE_AGENT_IMAGE"),
        env("REALNODE_PAUSE_IMAGE"),
        env("REALNODE_VFIO_IMAGE"),
    );
    let (flasher_ref, flash_sim) = (env("REALNODE_FLASHER_IMAGE"), env("REALNODE_FLASH_SIM"));
    let agent_sa = format!("system:serviceaccount:{ns}:{rel}-agent");
    let ctl_sa = format!("system:serviceaccount:{ns}:{rel}-controller");
    let _diag = Diagnostics(vec![
        "kubectl get nodes -o wide --show-labels".into(),
        "kubectl get pods -A -o wide".into(),
        "kubectl get ttdp -o jsonpath='{.items[*].status.nodes}'; echo".into(),
        format!("kubectl -n {ns} logs -l {INSTALLER} --tail=30 --all-containers"),
        format!("kubectl -n {ns} logs -l app.kubernetes.io/component=controller --tail=30"),
        "kubectl get events -A --sort-by=.lastTimestamp | tail -n 30".into(),
    ]);
    ph.log(&format!(
        "images: {ctl_ref} {agent_ref} {pause_ref} {vfio_ref}"
    ));

    // The node as node-feature-discovery and an earlier container install left it.
    let nodes: Api<Node> = Api::all(rn.c.clone());
    let labels = serde_json::json!({"metadata": {"labels": {
        PCI: "true", KMD: "2.7.0", MODE: "container"}}});
    nodes
        .patch(&node, &PatchParams::default(), &Patch::Merge(&labels))
        .await
        .unwrap_or_else(|e| panic!("labelling {node}: {e}"));
    apply_fixture(&rn.c, &fixture("other-node.yaml"), &[]).await;

    // --- 1. the chart
    let split = |r: &str| -> (String, String) {
        let (repo, tag) = r.rsplit_once(':').unwrap_or((r, "latest"));
        (repo.to_string(), tag.to_string())
    };
    let ((ctl_repo, ctl_tag), (agent_repo, agent_tag)) = (split(&ctl_ref), split(&agent_ref));
    let (vfio_repo, vfio_tag) = split(&vfio_ref);
    let (flasher_repo, flasher_tag) = split(&flasher_ref);
    let timeout = format!("{}s", rn.t.as_secs());
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
    let helm_args = |verb: &str, extra: &[&str]| -> Vec<String> {
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
        a.extend(["--wait".into(), "--timeout".into(), timeout.clone()]);
        a
    };
    let install = helm_args("install", &["--create-namespace"]);
    let install: Vec<&str> = install.iter().map(String::as_str).collect();
    rn.helm(&install)
        .unwrap_or_else(|e| panic!("helm install of chart/: {e}"));
    ph.phase("helm install (2 controller replicas Ready)");
    let holder1 = wait_for("a controller replica holds the lease", rn.t, || {
        rn.lease_holder()
    })
    .await;
    assert!(
        rn.pod_exists(&ns, &holder1).await.unwrap_or(false),
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

    // The binder's report, written with its pod's token (the node-patch
    // policy admits only its own node's two keys): this boot, no function.
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

    // --- 2. the workload
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
    rn.wait_running(
        "the telemetry DaemonSet pod Running",
        "ml",
        "app=telemetry",
        1,
    )
    .await;
    let train1 = train[0].clone();
    ph.phase("workload (hostPath /dev/tenstorrent, PDB) and telemetry DaemonSet Running");

    // --- 3. the policy; the real agent
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
    wait_for("deploy gate closed", rn.t, || rn.label_is(GATE, "false")).await;
    wait_for(
        "the telemetry pod gone behind the closed gate",
        rn.t,
        || async {
            let p = rn.pod_names("ml", "app=telemetry", "").await?;
            if p.is_empty() {
                Ok(())
            } else {
                Err(format!("{p:?}"))
            }
        },
    )
    .await;
    ph.phase("deploy gate closed, telemetry pod left");
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
    // A DKMS install appears on the node while it drains (before the refusing
    // pod has crash-looped three times: the controller would fail the node on
    // that pod's restarts at Upgrading); the agent's next start finds it. This
    // test runs in the node's mount namespace: this is the node's /var/lib.
    std::fs::create_dir_all("/var/lib/dkms/tenstorrent/2.7.0")
        .unwrap_or_else(|e| panic!("creating the DKMS tree: {e}"));

    // --- 4. the drain, with helm upgrade and rollback in the middle
    wait_for("the drain blocked by the PDB", rn.t, || {
        rn.state_is("Draining")
    })
    .await;
    wait_for(
        "ttdriver_drain_blocked_total (the PDB refused the eviction)",
        rn.t,
        || async {
            let mut addrs = vec![svc_addr.clone()];
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
        rn.pod_exists("ml", &train1).await.unwrap_or(false),
        "the workload pod went although its PDB refuses"
    );
    ph.phase("drain: eviction refused by the PDB, pod kept");
    let upgrade = helm_args("upgrade", &["--set", "controller.logLevel=debug"]);
    let upgrade: Vec<&str> = upgrade.iter().map(String::as_str).collect();
    rn.helm(&upgrade)
        .unwrap_or_else(|e| panic!("helm upgrade: {e}"));
    let holder2 = rn
        .wait_new_holder("the lease held by an upgraded replica", &holder1)
        .await;
    let still = |when: &str| format!("after {when} the node must still be Draining");
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
    rn.helm(&["-n", &ns, "rollback", &rel])
        .unwrap_or_else(|e| panic!("helm rollback: {e}"));
    let deploy = format!("deploy/{rel}-controller");
    run(
        "kubectl",
        &[
            "-n",
            &ns,
            "rollout",
            "status",
            &deploy,
            &format!("--timeout={timeout}"),
        ],
    )
    .unwrap_or_else(|e| panic!("rollback's controller pods: {e}"));
    rn.wait_new_holder("the lease held by a rolled-back replica", &holder2)
        .await;
    assert_eq!(
        rn.record().await.map(|r| r.0),
        Ok("Draining".into()),
        "{}",
        still("helm rollback")
    );
    let history: serde_json::Value = rn
        .helm(&["-n", &ns, "history", &rel, "-o", "json"])
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
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(rn.c.clone(), "ml");
    let relax = serde_json::json!({"spec": {"minAvailable": 0}});
    pdbs.patch("train", &PatchParams::default(), &Patch::Merge(&relax))
        .await
        .unwrap_or_else(|e| panic!("relaxing the PDB: {e}"));
    wait_for("the workload pod evicted", rn.t, || async {
        if rn.pod_exists("ml", &train1).await? {
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
        user: &ctl_sa,
        name: Some(&train1),
        node_claim: None,
    };
    eviction
        .find_in(&audit)
        .unwrap_or_else(|e| panic!("no eviction of ml/{train1} by the controller: {e}"));
    ph.phase("PDB relaxed -> pod evicted through the Eviction API");

    // --- 5. host path of the agent, uncordon, gate open
    wait_for("the agent labels its node install-mode=host", rn.t, || {
        rn.label_is(MODE, "host")
    })
    .await;
    let by_agent = AuditQuery {
        verb: "patch",
        resource: "nodes",
        subresource: "",
        user: &agent_sa,
        name: Some(&node),
        node_claim: Some(&node),
    }
    .find_in(&audit)
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
    // The cycle ends (Upgrading replaced the pre-cycle installer pod; the new
    // agent reports the host first and idles): take the pod that stays.
    wait_for("the node Done", rn.t, || rn.state_is("Done")).await;
    // Full-node drain is on and the controller runs on the node it drained:
    // it tried no eviction in its own namespace (the Go drain skipped it too;
    // on a one-node cluster without the toleration above, an evicted
    // controller's replacement could not schedule on the cordoned node).
    let own = evictions_in(&audit, &ctl_sa, &ns);
    assert!(
        own.is_empty(),
        "the controller evicted pods of its own namespace {ns}: {own:?}"
    );
    ph.log(&format!(
        "full-node drain: no eviction tried in {ns} (the controller's namespace)"
    ));
    // (the node can be Done a moment after the controller deleted the
    // pre-cycle pod, before the DaemonSet's replacement exists: wait for the
    // replacement, and only it)
    let inst2 = wait_for(
        &format!("one installer pod on {node} (the pre-cycle one gone)"),
        rn.t,
        || async {
            let lp = ListParams::default()
                .labels(INSTALLER)
                .fields(&format!("spec.nodeName={node}"));
            let l = rn.pods(&ns).list(&lp).await.map_err(|e| e.to_string())?;
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
    let events: Api<Event> = Api::namespaced(rn.c.clone(), &ns);
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
        .pods(&ns)
        .get(&inst2)
        .await
        .unwrap_or_else(|e| panic!("{inst2}: {e}"));
    assert!(
        !ttdrv_testkit::pod_ready(&pod2),
        "installer pod Ready without a module"
    );
    ph.phase("agent's host path: node labelled with its own token, readiness probe ran");
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
    assert_eq!(
        rn.label(GATE).await,
        Ok(None),
        "deploy gate label left on the node"
    );
    rn.wait_running("the telemetry pod back", "ml", "app=telemetry", 1)
        .await;
    rn.wait_running(
        &format!("the workload Running again on {node}"),
        "ml",
        "app=train",
        1,
    )
    .await;
    ph.phase("uncordoned, gate open, Done (HostManaged), workload back");

    // --- 6. the admission policy on the agent's pod-bound token
    let token = run(
        "kubectl",
        &[
            "-n",
            &ns,
            "exec",
            &inst2,
            "--",
            "cat",
            "/var/run/secrets/kubernetes.io/serviceaccount/token",
        ],
    )
    .unwrap_or_else(|e| panic!("reading the agent pod's token: {e}"));
    let agent = agent_client(token.trim(), &env("REALNODE_CA")).await;
    let checks = admission_checks(&agent, &node, &agent_sa, &ph).await;
    ph.phase(&format!(
        "admission policy on the agent's pod-bound token ({checks} checks)"
    ));

    // --- 7. kubectl tt driver
    let out =
        run("kubectl", &["tt", "driver"]).unwrap_or_else(|e| panic!("kubectl tt driver: {e}"));
    for l in out.lines() {
        eprintln!("[kubectl tt driver] {l}");
    }
    assert!(
        out.contains(POLICY) && out.contains(&node),
        "kubectl tt driver does not show policy {POLICY} and node {node}"
    );
    ph.phase("kubectl tt driver");

    // --- 8. a firmware policy: cordon, drain, a real flash Job on the
    // kubelet (the flasher image; its cards simulated), readback, uncordon
    flash_the_node(&rn, &flash_sim).await;
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
