//! Simulated DaemonSets of the Tenstorrent stack around the driver, on kwok
//! nodes: the pods a driver upgrade must stand down by deploy gates, since no
//! drain evicts a DaemonSet's pod. Each models a contract stated in
//! `../shared/design/STACK.md` (read from the public tt-operator,
//! tt-telemetry and tt-fabric-manager charts); the real charts cannot be
//! reached from CI.
//!
//! Their pods run only on the test's nodes (nodeSelector on the test label),
//! and hold the device the way the real ones do: `privileged: true`, no
//! hostPath of /dev/tenstorrent (pass 1 of the drain does not see them; the
//! simulated agent counts a privileged pod as a holder).

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec};
use k8s_openapi::api::core::v1::{
    Affinity, Container, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    PodSpec, PodTemplateSpec, SecurityContext,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::Api;
use kube::api::PostParams;

use crate::cluster::{TEST_LABEL, TestEnv};

/// The telemetry chart's gate (its default, in both arms of its node
/// selection).
pub const TELEMETRY_GATE: &str = "tenstorrent.com/deploy.tt-telemetry";
/// The fabric manager's gate (0.2.29 and later; 0.2.28 ships none).
pub const FABRIC_MANAGER_GATE: &str = "tenstorrent.com/deploy.tt-fabric-manager";

fn not_false(key: &str) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: key.into(),
        operator: "NotIn".into(),
        values: Some(vec!["false".into()]),
    }
}

/// A privileged DaemonSet `name` on the test's nodes whose required node
/// affinity has one term per entry of `terms`, each `<gate> NotIn ["false"]`
/// (and the term's own extra requirements).
fn privileged_daemon_set(
    test_id: &str,
    name: &str,
    gate: Option<&str>,
    terms: Vec<Vec<NodeSelectorRequirement>>,
) -> DaemonSet {
    let labels = BTreeMap::from([("app.kubernetes.io/name".to_string(), name.to_string())]);
    let terms: Vec<NodeSelectorTerm> = terms
        .into_iter()
        .map(|mut extra| {
            if let Some(g) = gate {
                extra.insert(0, not_false(g));
            }
            NodeSelectorTerm {
                match_expressions: Some(extra),
                ..Default::default()
            }
        })
        .collect();
    let affinity = (!terms.is_empty()).then(|| Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: terms,
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    daemon_set(
        test_id,
        name,
        labels,
        PodSpec {
            affinity,
            containers: vec![Container {
                name: "main".into(),
                image: Some("busybox".into()),
                security_context: Some(SecurityContext {
                    privileged: Some(true),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        },
    )
}

/// A DaemonSet `name` of the test (labelled with its id), selecting its pods
/// by `labels`, whose pods run `spec` on the test's Tenstorrent nodes only,
/// as the real charts select them (NFD's PCI vendor label).
fn daemon_set(
    test_id: &str,
    name: &str,
    labels: BTreeMap<String, String>,
    mut spec: PodSpec,
) -> DaemonSet {
    spec.node_selector = Some(BTreeMap::from([
        (TEST_LABEL.to_string(), test_id.to_string()),
        (
            ttdrv_api::labels::TT_PCI_PRESENT.to_string(),
            "true".to_string(),
        ),
    ]));
    let mut meta_labels = BTreeMap::from([(TEST_LABEL.to_string(), test_id.to_string())]);
    meta_labels.extend(labels.clone());
    DaemonSet {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(meta_labels),
            ..Default::default()
        },
        spec: Some(DaemonSetSpec {
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..Default::default()
                }),
                spec: Some(spec),
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The tt-telemetry collector (STACK.md, "Who holds the device"): opens
/// `/dev/tenstorrent/*` at start-up and holds it for its pod's life through
/// `privileged: true`; stood down by `tenstorrent.com/deploy.tt-telemetry
/// NotIn ["false"]`, which the chart puts in both arms of its node-selection
/// OR (two terms here, the second with a requirement every node meets).
pub fn telemetry_collector(test_id: &str, name: &str) -> DaemonSet {
    let any_node = NodeSelectorRequirement {
        key: "kubernetes.io/hostname".into(),
        operator: "Exists".into(),
        values: None,
    };
    privileged_daemon_set(
        test_id,
        name,
        Some(TELEMETRY_GATE),
        vec![vec![], vec![any_node]],
    )
}

/// The tt-fabric-manager 0.2.29+ per-node agent (STACK.md): reads the local
/// card topology, holding the device for its pod's life through
/// `privileged: true`; stood down by `tenstorrent.com/deploy.tt-fabric-manager
/// NotIn ["false"]` (the gate 0.2.29 ships, which the driver manager's
/// default `deployGates` lacks).
pub fn fabric_manager_agent(test_id: &str, name: &str) -> DaemonSet {
    privileged_daemon_set(test_id, name, Some(FABRIC_MANAGER_GATE), vec![vec![]])
}

/// The tt-fabric-manager 0.2.28 (and earlier) agent: the same holder, with no
/// gate at all (STACK.md: "on 0.2.28 and earlier no gate ships").
pub fn ungated_fabric_manager_agent(test_id: &str, name: &str) -> DaemonSet {
    privileged_daemon_set(test_id, name, None, vec![])
}

/// Creates `ds` in `namespace`.
pub async fn create(env: &TestEnv, namespace: &str, ds: &DaemonSet) {
    let api: Api<DaemonSet> = Api::namespaced(env.client.clone(), namespace);
    if let Err(e) = api.create(&PostParams::default(), ds).await {
        panic!(
            "creating DaemonSet {}: {e}",
            ds.metadata.name.as_deref().unwrap_or_default()
        );
    }
}

/// A pod labelled with this key is made Ready by [`LateStarter`] that many
/// seconds after it was created, not by kwok (hack/kwok-stages.py).
pub const READY_AFTER_LABEL: &str = "sim.ttdrv.io/ready-after";

/// `ds` whose pods turn Ready `seconds` after they are created (with a
/// [`LateStarter`] running): an agent slow to serve after it starts.
pub fn ready_after(mut ds: DaemonSet, seconds: u32) -> DaemonSet {
    if let Some(meta) = ds.spec.as_mut().and_then(|s| s.template.metadata.as_mut()) {
        meta.labels
            .get_or_insert_default()
            .insert(READY_AFTER_LABEL.into(), seconds.to_string());
    }
    ds
}

/// Plays the kubelet for the pods of `namespace` labelled
/// [`READY_AFTER_LABEL`]: each turns Ready that many seconds after the
/// late starter first sees it. Stops when dropped.
pub struct LateStarter {
    task: tokio::task::JoinHandle<()>,
}

impl LateStarter {
    pub fn start(env: &TestEnv, namespace: &str) -> Self {
        use futures::StreamExt;
        use k8s_openapi::api::core::v1::Pod;
        let pods: Api<Pod> = Api::namespaced(env.client.clone(), namespace);
        let cfg = kube::runtime::watcher::Config::default().labels(READY_AFTER_LABEL);
        let task = tokio::spawn(async move {
            let mut seen = std::collections::HashSet::new();
            let mut stream = crate::cluster::watch_applied(pods.clone(), cfg);
            while let Some(pod) = stream.next().await {
                let (Some(uid), Some(name)) = (pod.metadata.uid.clone(), pod.metadata.name.clone())
                else {
                    continue;
                };
                let seconds: u64 = pod
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(READY_AFTER_LABEL))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                let scheduled = pod.spec.as_ref().is_some_and(|s| s.node_name.is_some());
                if pod.metadata.deletion_timestamp.is_some() || !scheduled || !seen.insert(uid) {
                    continue;
                }
                let pods = pods.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(std::time::Duration::from_secs(seconds)).await;
                    if let Err(e) = crate::sim_agent::set_ready(&pods, &name, &pod).await {
                        tracing::warn!(error = %e, pod = %name, "late starter: not made Ready");
                    }
                });
            }
        });
        Self { task }
    }
}

impl Drop for LateStarter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The tt-dra-driver chart's DRA kubelet plugin (STACK.md): a DaemonSet on
/// the Tenstorrent nodes, labelled `app.kubernetes.io/name=tt-dra-driver`
/// (what the controller's `--dra-plugin-selector` finds by default), which
/// does not hold the device (it learns the cards from the fabric-manager
/// agent). Its publishing is [`DraPlugin`]'s.
pub fn dra_plugin(test_id: &str, name: &str) -> DaemonSet {
    let labels = BTreeMap::from([
        (
            "app.kubernetes.io/name".to_string(),
            "tt-dra-driver".to_string(),
        ),
        ("app.kubernetes.io/instance".to_string(), name.to_string()),
        (READY_WHEN_PUBLISHED_LABEL.to_string(), "true".to_string()),
    ]);
    daemon_set(
        test_id,
        name,
        labels,
        PodSpec {
            containers: vec![Container {
                name: "plugin".into(),
                image: Some("busybox".into()),
                ..Default::default()
            }],
            ..Default::default()
        },
    )
}

/// A pod labelled with this key is made Ready by [`DraPlugin`] once it has
/// published for it (or found nothing to read), not by kwok
/// (hack/kwok-stages.py): a plugin that registers with the kubelet, and so
/// turns Ready, only after its first publication. The controller's surface
/// check also waits a few seconds of Ready for plugins that publish just
/// after; this order keeps the tests' "republished before the uncordon"
/// independent of how late the test process runs under load.
pub const READY_WHEN_PUBLISHED_LABEL: &str = "sim.ttdrv.io/ready-when-published";

/// Reports `pod` Ready unless it already is; a failure is retried on the
/// plugin's next round.
async fn make_ready(
    pods: &Api<k8s_openapi::api::core::v1::Pod>,
    pod: &k8s_openapi::api::core::v1::Pod,
) {
    if crate::cluster::pod_ready(pod) {
        return;
    }
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    if let Err(e) = crate::sim_agent::set_ready(pods, name, pod).await {
        tracing::warn!(error = %e, pod = %name, "sim DRA plugin: not made Ready");
    }
}

/// What the simulated DRA plugin publishes when one of its pods starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Publishes {
    /// A ResourceSlice of the node listing this many devices (a new pool
    /// generation each time).
    Cards(u32),
    /// Nothing: the node's slice is removed and none comes back (a plugin
    /// that cannot read the topology).
    Nothing,
}

/// The publishing half of the DRA kubelet plugin (STACK.md: after a driver
/// swap it keeps the inventory it read at start, until it restarts): each
/// time a pod of the plugin's DaemonSet starts on a node, the node's
/// ResourceSlice of driver `tenstorrent.com` is (re)published as [`Publishes`]
/// says then, owned by the Node as the kubelet's are, and then the pod is
/// made Ready ([`READY_WHEN_PUBLISHED_LABEL`]). Stops when dropped.
///
/// Started with a fabric-manager DaemonSet ([`DraPlugin::reading_from`]),
/// it reads the cards from that agent as tt-dra-driver does, and a pod that
/// starts while no Ready agent pod is on its node reads no topology and
/// keeps the node's slice as it was (recorded in [`DraPlugin::kept_stale`]).
/// The real plugin keeps its slice too, but re-reads once its watch of the
/// agent reconnects (a backoff of up to 30 s); this one never does, the
/// stricter case.
pub struct DraPlugin {
    mode: std::sync::Arc<std::sync::Mutex<Publishes>>,
    /// (node, pod uid, generation) of every publication, in order.
    pub published: std::sync::Arc<std::sync::Mutex<Vec<(String, String, i64)>>>,
    /// (node, pod uid) of every start that found no topology to read.
    pub stale: std::sync::Arc<std::sync::Mutex<Vec<(String, String)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl DraPlugin {
    /// Publishes for the pods of DaemonSet `name` (made by [`dra_plugin`])
    /// in `namespace`, `first` until [`DraPlugin::set`] says otherwise.
    pub fn start(env: &TestEnv, namespace: &str, name: &str, first: Publishes) -> Self {
        Self::run(env, namespace, name, first, None)
    }

    /// As [`DraPlugin::start`], the topology read from the pods of the
    /// fabric-manager DaemonSet `fabric` (made by [`fabric_manager_agent`]).
    pub fn reading_from(
        env: &TestEnv,
        namespace: &str,
        name: &str,
        first: Publishes,
        fabric: &str,
    ) -> Self {
        Self::run(env, namespace, name, first, Some(fabric.to_string()))
    }

    fn run(
        env: &TestEnv,
        namespace: &str,
        name: &str,
        first: Publishes,
        fabric: Option<String>,
    ) -> Self {
        use k8s_openapi::api::core::v1::{Node, Pod};
        use k8s_openapi::api::resource::v1::ResourceSlice;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
        use kube::api::{DeleteParams, ListParams, Patch, PatchParams};

        let mode = std::sync::Arc::new(std::sync::Mutex::new(first));
        let published = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let stale = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (client, ns, instance) = (env.client.clone(), namespace.to_string(), name.to_string());
        let (m, out, kept) = (mode.clone(), published.clone(), stale.clone());
        let task = tokio::spawn(async move {
            let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
            let nodes: Api<Node> = Api::all(client.clone());
            let slices: Api<ResourceSlice> = Api::all(client.clone());
            let mut seen: BTreeMap<String, (String, i64)> = BTreeMap::new();
            let lp =
                ListParams::default().labels(&format!("app.kubernetes.io/instance={instance}"));
            loop {
                let list = pods.list(&lp).await.map(|l| l.items).unwrap_or_default();
                for p in list {
                    let (Some(node), Some(uid)) = (
                        p.spec.as_ref().and_then(|s| s.node_name.clone()),
                        p.metadata.uid.clone(),
                    ) else {
                        continue;
                    };
                    if p.metadata.deletion_timestamp.is_some() {
                        continue;
                    }
                    if seen.get(&node).is_some_and(|(u, _)| *u == uid) {
                        make_ready(&pods, &p).await;
                        continue;
                    }
                    if let Some(fabric) = &fabric {
                        let agent = ListParams::default()
                            .labels(&format!("app.kubernetes.io/name={fabric}"))
                            .fields(&format!("spec.nodeName={node}"));
                        let Ok(agents) = pods.list(&agent).await else {
                            continue;
                        };
                        let topology = agents.items.iter().any(|a| {
                            a.metadata.deletion_timestamp.is_none() && crate::cluster::pod_ready(a)
                        });
                        if !topology {
                            // Nothing to read: what was published stays.
                            let g = seen.get(&node).map_or(0, |(_, g)| *g);
                            seen.insert(node.clone(), (uid.clone(), g));
                            if let Ok(mut k) = kept.lock() {
                                k.push((node, uid));
                            }
                            make_ready(&pods, &p).await;
                            continue;
                        }
                    }
                    let generation = seen.get(&node).map_or(1, |(_, g)| g + 1);
                    let slice_name = format!("{node}-tenstorrent.com");
                    let now = *m.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    let done = match now {
                        Publishes::Nothing => slices
                            .delete(&slice_name, &DeleteParams::default())
                            .await
                            .map(|_| ())
                            .or_else(|e| match e {
                                kube::Error::Api(s) if s.code == 404 => Ok(()),
                                e => Err(e),
                            }),
                        Publishes::Cards(n) => {
                            let Ok(owner) = nodes.get(&node).await else {
                                continue;
                            };
                            let mut slice = ttdrv_core::fixtures::resource_slice(
                                &node,
                                "tenstorrent.com",
                                generation,
                                n,
                            );
                            slice.metadata.name = Some(slice_name.clone());
                            slice.metadata.owner_references = Some(vec![OwnerReference {
                                api_version: "v1".into(),
                                kind: "Node".into(),
                                name: node.clone(),
                                uid: owner.metadata.uid.clone().unwrap_or_default(),
                                ..Default::default()
                            }]);
                            slices
                                .patch(
                                    &slice_name,
                                    &PatchParams::apply("sim-dra-plugin").force(),
                                    &Patch::Apply(&slice),
                                )
                                .await
                                .map(|_| ())
                        }
                    };
                    match done {
                        Ok(()) => {
                            seen.insert(node.clone(), (uid.clone(), generation));
                            if let Ok(mut o) = out.lock() {
                                o.push((node, uid, generation));
                            }
                            make_ready(&pods, &p).await;
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "sim DRA plugin: publishing failed; retrying")
                        }
                    }
                }
                tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            }
        });
        Self {
            mode,
            published,
            stale,
            task,
        }
    }

    /// What its next pod start publishes.
    pub fn set(&self, p: Publishes) {
        *self
            .mode
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = p;
    }

    /// The starts that found no fabric-manager agent to read: (node, pod uid).
    pub fn kept_stale(&self) -> Vec<(String, String)> {
        self.stale.lock().map(|p| p.clone()).unwrap_or_default()
    }

    /// The publications so far: (node, pod uid, generation).
    pub fn publications(&self) -> Vec<(String, String, i64)> {
        self.published.lock().map(|p| p.clone()).unwrap_or_default()
    }
}

impl Drop for DraPlugin {
    fn drop(&mut self) {
        self.task.abort();
    }
}
