//! Pod density (issue 23): what the pods of a cluster cost the controller.
//!
//! N Tenstorrent nodes of a group plus M ordinary pods spread over them and
//! over ordinary nodes (≤100 pods each). For each controller binary given
//! (`--density-bins`: e.g. the previous release and this one), on the same
//! cluster: the controller's RSS and CPU with no pods, while the M pods are
//! created and made Running by kwok, at rest with them, and during a churn
//! (every pod deleted and replaced, as a Deployment restart does). Pods are
//! created by the benchmark, bound to their node (the scheduler and the
//! ReplicaSet controller of the local cluster, at their default QPS, would
//! take many minutes for 10,000 pods); their spec is that of a typical
//! Deployment's pod, the API server adds the service-account volume and
//! tolerations.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client};
use serde::{Deserialize, Serialize};
use ttdrv_testkit::TestEnv;

use crate::{Args, ProcStats, proc_stats, start_ready_controller, wait_policy_done};

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Density {
    pub controller: String,
    pub tt_nodes: usize,
    pub pods: usize,
    pub rss_no_pods_mib: f64,
    pub rss_with_pods_mib: f64,
    /// (RSS with pods − RSS without) / pods.
    pub bytes_per_pod: f64,
    pub rss_after_churn_mib: f64,
    pub rss_peak_mib: f64,
    /// CPU seconds per second at rest, without and with the pods.
    pub cpu_rest_no_pods: f64,
    pub cpu_rest_with_pods: f64,
    pub create_events: u64,
    pub create_cpu_s: f64,
    pub churn_events: u64,
    pub churn_cpu_s: f64,
    /// CPU seconds per 1,000 pod events (creation and churn together).
    pub cpu_per_1000_events: f64,
    /// `ttdriver_cache_objects{kind="Pod"}` at rest with the pods (0: not exported).
    pub cached_pods: f64,
}

/// Counts pod events in one namespace and how many pods are Running.
struct PodCounter {
    state: Arc<Mutex<(u64, HashMap<String, bool>)>>,
    task: tokio::task::JoinHandle<()>,
}

impl PodCounter {
    fn start(client: Client, ns: &str) -> Self {
        let api: Api<Pod> = Api::namespaced(client, ns);
        let state = Arc::new(Mutex::new((0u64, HashMap::new())));
        let st = state.clone();
        let task = tokio::spawn(async move {
            let mut stream = watcher(api, watcher::Config::default()).boxed();
            while let Ok(Some(ev)) = stream.try_next().await {
                let Ok(mut s) = st.lock() else { break };
                match ev {
                    watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                        s.0 += 1;
                        let running = p.status.as_ref().and_then(|s| s.phase.as_deref())
                            == Some("Running")
                            && p.metadata.deletion_timestamp.is_none();
                        s.1.insert(p.metadata.name.unwrap_or_default(), running);
                    }
                    watcher::Event::Delete(p) => {
                        s.0 += 1;
                        s.1.remove(&p.metadata.name.unwrap_or_default());
                    }
                    _ => {}
                }
            }
        });
        Self { state, task }
    }

    /// (events so far, pods present, of them Running).
    fn get(&self) -> (u64, usize, usize) {
        self.state.lock().map_or((0, 0, 0), |s| {
            (s.0, s.1.len(), s.1.values().filter(|r| **r).count())
        })
    }

    /// Waits until exactly `n` pods are present and all Running.
    /// Waits for `n` pods Running (`what` names the phase), then for the
    /// controller (`pid`) to take the last events, which come a moment after:
    /// the events so far, and the controller's stats then.
    async fn settled(&self, n: usize, what: &str, pid: u32) -> anyhow::Result<(u64, ProcStats)> {
        self.wait_running(n, what).await?;
        tokio::time::sleep(Duration::from_secs(5)).await;
        let (events, _, _) = self.get();
        Ok((events, proc_stats(pid)?))
    }

    async fn wait_running(&self, n: usize, what: &str) -> anyhow::Result<()> {
        let t = Instant::now();
        loop {
            let (_, present, running) = self.get();
            if present == n && running == n {
                return Ok(());
            }
            if t.elapsed() > Duration::from_secs(900) {
                bail!("{what}: {running} of {n} pods Running ({present} present) after 900s");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

impl Drop for PodCounter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn pod(name: &str, node: &str, app: usize) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": name,
            "labels": { "app": format!("web-{app}"), "pod-template-hash": "5d8f7c9b6", "tier": "frontend" },
            "annotations": { "kubectl.kubernetes.io/restartedAt": "2026-01-01T00:00:00Z" }
        },
        "spec": {
            "nodeName": node,
            "tolerations": [{ "key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule" }],
            "containers": [{
                "name": "web",
                "image": "registry.example.invalid/team/web-frontend:1.24.3",
                "ports": [{ "name": "http", "containerPort": 8080 }, { "name": "metrics", "containerPort": 9090 }],
                "env": [
                    { "name": "LOG_LEVEL", "value": "info" },
                    { "name": "UPSTREAM", "value": "http://backend.default.svc.cluster.local:8080" },
                    { "name": "POD_NAME", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } },
                    { "name": "POD_IP", "valueFrom": { "fieldRef": { "fieldPath": "status.podIP" } } }
                ],
                "resources": { "requests": { "cpu": "10m", "memory": "16Mi" }, "limits": { "memory": "64Mi" } },
                "readinessProbe": { "httpGet": { "path": "/healthz", "port": 8080 }, "periodSeconds": 10 },
                "livenessProbe": { "httpGet": { "path": "/healthz", "port": 8080 }, "periodSeconds": 20 },
                "volumeMounts": [{ "name": "cache", "mountPath": "/cache" }]
            }],
            "volumes": [{ "name": "cache", "emptyDir": {} }]
        }
    }))?)
}

/// Creates `m` pods named `<prefix>-<i>` spread round-robin over `nodes`.
async fn create_pods(
    client: &Client,
    ns: &str,
    nodes: &[String],
    m: usize,
    prefix: &str,
) -> anyhow::Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(0..m)
        .map(|i| {
            let api = api.clone();
            let node = nodes[i % nodes.len()].clone();
            async move {
                let p = pod(&format!("{prefix}-{i:05}"), &node, i % 50)?;
                api.create(&PostParams::default(), &p).await?;
                Ok(())
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    results.into_iter().collect()
}

/// Deletes the pods `<prefix>-<i>` one request each, as a Deployment's
/// rollout does (one delete-collection of 10,000 pods outlasts the API
/// server's request timeout).
async fn delete_pods(client: &Client, ns: &str, m: usize, prefix: &str) -> anyhow::Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(0..m)
        .map(|i| {
            let api = api.clone();
            async move {
                match api
                    .delete(&format!("{prefix}-{i:05}"), &DeleteParams::default())
                    .await
                {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
                    Err(e) => Err(e.into()),
                }
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    results.into_iter().collect()
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// The ordinary nodes and namespace the pods live in.
pub struct PodPlace {
    pub env: TestEnv,
    pub ns: String,
    pub nodes: Vec<String>,
}

impl PodPlace {
    /// Ordinary nodes for `m` pods besides the Tenstorrent ones (≤100 pods a node).
    pub async fn create(group: usize, tt_nodes: &[String], m: usize) -> anyhow::Result<Self> {
        let env = TestEnv::new(&format!("bench-{group}-pods")).await;
        let ns = env.namespace().await;
        let plain = m.div_ceil(100).saturating_sub(tt_nodes.len()).max(1);
        let mut nodes = crate::create_named_nodes(&env, plain, "p", false).await;
        nodes.extend(tt_nodes.iter().cloned());
        // The namespace's default ServiceAccount (the API server's admission
        // mounts its token in every pod) is created by the controller manager.
        let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> =
            Api::namespaced(env.client.clone(), &ns);
        let t = Instant::now();
        while sas.get_opt("default").await?.is_none() && t.elapsed() < Duration::from_secs(60) {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(Self { env, ns, nodes })
    }
}

/// Runs the density measurement with one controller binary.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    args: &Args,
    env: &TestEnv,
    ns: &str,
    policy: &str,
    tt_nodes: usize,
    place: &PodPlace,
    m: usize,
    bin: &Path,
    label: &str,
) -> anyhow::Result<Density> {
    let client = env.client.clone();
    let papi: Api<ttdrv_api::TenstorrentDriverPolicy> = Api::all(client.clone());
    let tag = format!("density-{tt_nodes}-{label}");
    let mut a = args.clone();
    a.controller_bin = bin.to_path_buf();
    let ctl = start_ready_controller(&a, env, ns, &tag, false, &[]).await?;
    wait_policy_done(&papi, policy, "1.0.0", tt_nodes, Duration::from_secs(300)).await?;
    let rest = Duration::from_secs(20);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let s0 = proc_stats(ctl.proc.pid())?;
    tokio::time::sleep(rest).await;
    let s1 = proc_stats(ctl.proc.pid())?;
    let cpu_rest_no_pods = (s1.cpu_seconds - s0.cpu_seconds) / rest.as_secs_f64();

    let counter = PodCounter::start(client.clone(), &place.ns);
    eprintln!("[bench] {tag}: creating {m} pods");
    let t = Instant::now();
    create_pods(&client, &place.ns, &place.nodes, m, "web-a").await?;
    let (create_events, s2) = counter.settled(m, "creation", ctl.proc.pid()).await?;
    eprintln!(
        "[bench] {tag}: {m} pods Running in {:.0}s ({create_events} events)",
        t.elapsed().as_secs_f64()
    );
    tokio::time::sleep(rest).await;
    let s3 = proc_stats(ctl.proc.pid())?;
    let cpu_rest_with_pods = (s3.cpu_seconds - s2.cpu_seconds) / rest.as_secs_f64();
    let cached_pods = crate::admin_get(ctl.port, "/metrics")
        .await
        .map(|(_, b)| {
            b.lines()
                .find_map(|l| l.strip_prefix("ttdriver_cache_objects{kind=\"Pod\"} "))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0)
        })
        .unwrap_or(0.0);

    eprintln!(
        "[bench] {tag}: RSS {:.1} MiB without pods, {:.1} MiB with {m} ({:.0} B/pod); CPU {:.2} s for {create_events} events",
        mib(s1.rss_kib),
        mib(s3.rss_kib),
        (s3.rss_kib as f64 - s1.rss_kib as f64) * 1024.0 / m as f64,
        s2.cpu_seconds - s1.cpu_seconds
    );
    eprintln!("[bench] {tag}: churn (every pod replaced)");
    let t = Instant::now();
    let (deleted, created) = futures::join!(
        delete_pods(&client, &place.ns, m, "web-a"),
        create_pods(&client, &place.ns, &place.nodes, m, "web-b")
    );
    deleted?;
    created?;
    let (all_events, s4) = counter.settled(m, "churn", ctl.proc.pid()).await?;
    eprintln!(
        "[bench] {tag}: churn done in {:.0}s ({} events)",
        t.elapsed().as_secs_f64(),
        all_events - create_events
    );
    let rest_cpu = |from: &ProcStats, to: &ProcStats| (to.cpu_seconds - from.cpu_seconds).max(0.0);
    let create_cpu_s = rest_cpu(&s1, &s2);
    let churn_cpu_s = rest_cpu(&s3, &s4);
    let churn_events = all_events - create_events;
    let d = Density {
        controller: label.to_string(),
        tt_nodes,
        pods: m,
        rss_no_pods_mib: mib(s1.rss_kib),
        rss_with_pods_mib: mib(s3.rss_kib),
        bytes_per_pod: (s3.rss_kib as f64 - s1.rss_kib as f64) * 1024.0 / m as f64,
        rss_after_churn_mib: mib(s4.rss_kib),
        rss_peak_mib: mib(s4.hwm_kib),
        cpu_rest_no_pods,
        cpu_rest_with_pods,
        create_events,
        create_cpu_s,
        churn_events,
        churn_cpu_s,
        cpu_per_1000_events: (create_cpu_s + churn_cpu_s) * 1000.0
            / (create_events + churn_events).max(1) as f64,
        cached_pods,
    };
    drop(ctl);
    // Back to no pods for the next binary (or the rollout scenarios keep them).
    Ok(d)
}

/// Deletes the pods a run left (`web-b-*`) and waits until they are gone.
pub async fn clear(place: &PodPlace, m: usize) -> anyhow::Result<()> {
    delete_pods(&place.env.client, &place.ns, m, "web-b").await?;
    let api: Api<Pod> = Api::namespaced(place.env.client.clone(), &place.ns);
    let t = Instant::now();
    loop {
        let left = api.list(&ListParams::default().limit(1)).await?.items.len();
        if left == 0 {
            return Ok(());
        }
        if t.elapsed() > Duration::from_secs(600) {
            bail!("pods still present 600s after deleting them");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

pub fn table(rows: &[Density]) -> String {
    let mut s = String::from(
        "| controller | TT nodes | pods | RSS no pods (MiB) | RSS with pods (MiB) | bytes/pod | RSS after churn (MiB) | peak RSS (MiB) | CPU at rest no pods / with pods (s/s) | pod events (create + churn) | CPU create + churn (s) | CPU per 1,000 pod events (s) | cached pods |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {} | {:.1} | {:.1} | {:.0} | {:.1} | {:.1} | {:.4} / {:.4} | {} + {} | {:.2} + {:.2} | {:.3} | {} |\n",
            r.controller,
            r.tt_nodes,
            r.pods,
            r.rss_no_pods_mib,
            r.rss_with_pods_mib,
            r.bytes_per_pod,
            r.rss_after_churn_mib,
            r.rss_peak_mib,
            r.cpu_rest_no_pods,
            r.cpu_rest_with_pods,
            r.create_events,
            r.churn_events,
            r.create_cpu_s,
            r.churn_cpu_s,
            r.cpu_per_1000_events,
            if r.cached_pods > 0.0 {
                format!("{:.0}", r.cached_pods)
            } else {
                "-".into()
            },
        ));
    }
    s
}
