//! One test's slice of the shared cluster ([`TestEnv`]) and the helpers
//! around it: the client, waiting for a condition, nodes, pods and
//! workloads, the CRDs. A leaf: it uses no other module of the crate, so the
//! crate root re-exports it whole and the harnesses ([`crate::controller`],
//! [`crate::sim_agent`]) use it without an import circle.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::future::Future;
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::{Namespace, Node, NodeSpec, NodeStatus, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use rand::Rng;

/// Label every test object carries.
pub const TEST_LABEL: &str = "ttdrv-test";
/// kwok simulates nodes carrying this annotation.
pub const KWOK_NODE_ANNOTATION: &str = "kwok.x-k8s.io/node";

/// Connects to the cluster named by KUBECONFIG and checks that it answers.
pub async fn client() -> Client {
    let hint = "the cluster tests need the local simulated cluster: run `make test` or \
                `hack/run-cluster-tests.sh` (or `hack/cluster.sh up`, export \
                KUBECONFIG=$(hack/cluster.sh kubeconfig) and run the test with `-- --ignored`)";
    let mut config = match kube::Config::infer().await {
        Ok(c) => c,
        Err(e) => panic!("cannot load a kubeconfig ({e}); {hint}"),
    };
    // kube retries 429 on its own by default; tests must see an eviction's 429.
    config.default_retry = false;
    let client = match Client::try_from(config) {
        Ok(c) => c,
        Err(e) => panic!("cannot build a Kubernetes client ({e}); {hint}"),
    };
    if let Err(e) = client.apiserver_version().await {
        panic!("the Kubernetes API server does not answer ({e}); {hint}");
    }
    client
}

/// Every object `api` shows under `cfg`, as it changes, for a recorder a
/// test runs beside the controller. A watch error (the API server slow
/// under CI load) re-lists after a backoff and is logged; the stream never
/// ends on one, because a recorder that stopped would undercount and let a
/// safety assertion pass unseen.
pub fn watch_applied<K>(api: Api<K>, cfg: kube::runtime::watcher::Config) -> BoxStream<'static, K>
where
    K: kube::Resource + Clone + Debug + k8s_openapi::serde::de::DeserializeOwned + Send + 'static,
{
    use kube::runtime::WatchStreamExt;
    kube::runtime::watcher(api, cfg)
        .default_backoff()
        .applied_objects()
        .filter_map(|o| async move {
            o.map_err(|e| tracing::warn!(error = %e, "test recorder watch error, re-listing"))
                .ok()
        })
        .boxed()
}

/// Polls `check` until it returns `Ok`, or panics after `timeout` with what was
/// expected and what was last seen.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    match wait_for_result(what, timeout, check).await {
        Ok(v) => v,
        Err(e) => panic!("{e}"),
    }
}

/// As [`wait_for`], but a timeout is an `Err` saying what was expected and
/// what was last seen (for a caller that records it and goes on).
pub async fn wait_for_result<T, F, Fut>(
    what: &str,
    timeout: Duration,
    mut check: F,
) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let start = Instant::now();
    let mut last = String::from("(not checked yet)");
    while start.elapsed() < timeout {
        match check().await {
            Ok(v) => return Ok(v),
            Err(seen) => last = seen,
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(format!(
        "timed out after {timeout:?} waiting for {what}; last seen: {last}"
    ))
}

/// One test's slice of the shared cluster.
pub struct TestEnv {
    pub client: Client,
    /// Unique id, also the value of the `ttdrv-test` label on every object.
    pub id: String,
}

impl TestEnv {
    pub async fn new(test_name: &str) -> Self {
        let suffix: String = rand::rng()
            .sample_iter(rand::distr::Alphanumeric)
            .take(5)
            .map(|c| char::from(c).to_ascii_lowercase())
            .collect();
        let short: String = test_name
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
            .take(20)
            .collect::<String>()
            .to_ascii_lowercase();
        Self {
            client: client().await,
            id: format!("{}-{suffix}", short.trim_matches('-')),
        }
    }

    pub fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([(TEST_LABEL.to_string(), self.id.clone())])
    }

    pub fn selector(&self) -> String {
        format!("{TEST_LABEL}={}", self.id)
    }

    /// A policy's `nodeAffinity` (YAML flow) selecting exactly this test's nodes.
    pub fn nodes_selector(&self) -> String {
        format!("{{matchLabels: {{{TEST_LABEL}: {}}}}}", self.id)
    }

    /// Name of a test object: `<id>-<suffix>`.
    pub fn name(&self, suffix: &str) -> String {
        format!("{}-{suffix}", self.id)
    }

    /// Creates a namespace for this test and returns its name.
    pub async fn namespace(&self) -> String {
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(self.id.clone()),
                labels: Some(self.labels()),
                ..Default::default()
            },
            ..Default::default()
        };
        let api: Api<Namespace> = Api::all(self.client.clone());
        if let Err(e) = api.create(&PostParams::default(), &ns).await {
            panic!("creating namespace {}: {e}", self.id);
        }
        self.id.clone()
    }

    /// A simulated Tenstorrent node (NFD PCI label set) with extra labels.
    pub async fn tt_node(&self, suffix: &str, extra: &[(&str, &str)]) -> Node {
        let mut labels = vec![(ttdrv_api::labels::TT_PCI_PRESENT, "true")];
        labels.extend_from_slice(extra);
        self.node(suffix, &labels).await
    }

    /// [`TestEnv::tt_node`], returning only the node's name.
    pub async fn tt_node_name(&self, suffix: &str, extra: &[(&str, &str)]) -> String {
        self.tt_node(suffix, extra)
            .await
            .metadata
            .name
            .unwrap_or_default()
    }

    /// One tt node per suffix (no extra labels); their names, in that order.
    pub async fn tt_node_names<S: AsRef<str>>(&self, suffixes: &[S]) -> Vec<String> {
        let mut names = vec![];
        for s in suffixes {
            names.push(self.tt_node_name(s.as_ref(), &[]).await);
        }
        names
    }

    /// A simulated node with the given labels (plus the test label).
    pub async fn node(&self, suffix: &str, extra: &[(&str, &str)]) -> Node {
        let name = self.name(suffix);
        let mut labels = self.labels();
        labels.insert("kubernetes.io/hostname".into(), name.clone());
        labels.insert("type".into(), "kwok".into());
        for (k, v) in extra {
            labels.insert((*k).to_string(), (*v).to_string());
        }
        let capacity: BTreeMap<String, Quantity> =
            [("cpu", "32"), ("memory", "256Gi"), ("pods", "110")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                .collect();
        let node = Node {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(labels),
                annotations: Some(BTreeMap::from([(
                    KWOK_NODE_ANNOTATION.to_string(),
                    "fake".to_string(),
                )])),
                ..Default::default()
            },
            spec: Some(NodeSpec::default()),
            status: Some(NodeStatus {
                allocatable: Some(capacity.clone()),
                capacity: Some(capacity),
                ..Default::default()
            }),
        };
        let api: Api<Node> = Api::all(self.client.clone());
        match api.create(&PostParams::default(), &node).await {
            Ok(n) => n,
            Err(e) => panic!("creating node {name}: {e}"),
        }
    }

    /// Waits until kwok reports the node Ready.
    pub async fn wait_node_ready(&self, name: &str) {
        let api: Api<Node> = Api::all(self.client.clone());
        wait_for(
            &format!("node {name} Ready"),
            Duration::from_secs(60),
            || async {
                let node = api.get(name).await.map_err(|e| e.to_string())?;
                let ready = node
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .into_iter()
                    .find(|c| c.type_ == "Ready")
                    .map(|c| c.status);
                if ready.as_deref() == Some("True") {
                    Ok(())
                } else {
                    Err(format!("Ready={ready:?}"))
                }
            },
        )
        .await
    }

    /// Merge-patches the node; `what` says what for, in a failure.
    async fn patch_node(&self, name: &str, patch: serde_json::Value, what: &str) {
        let api: Api<Node> = Api::all(self.client.clone());
        if let Err(e) = api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            panic!("{what} on node {name}: {e}");
        }
    }

    pub async fn label_node(&self, name: &str, key: &str, value: Option<&str>) {
        let patch = serde_json::json!({ "metadata": { "labels": { key: value } } });
        self.patch_node(name, patch, &format!("setting label {key}={value:?}"))
            .await;
    }

    /// Sets (or with `None` removes) an annotation on a node.
    pub async fn annotate_node(&self, name: &str, key: &str, value: Option<&str>) {
        let patch = serde_json::json!({ "metadata": { "annotations": { key: value } } });
        self.patch_node(name, patch, &format!("setting annotation {key}={value:?}"))
            .await;
    }

    pub async fn set_unschedulable(&self, name: &str, unschedulable: bool) {
        let patch = serde_json::json!({ "spec": { "unschedulable": unschedulable } });
        self.patch_node(
            name,
            patch,
            &format!("setting unschedulable={unschedulable}"),
        )
        .await;
    }

    /// Takes the node out of kwok's hands (label [`NOT_READY_LABEL`]: no
    /// heartbeat, no re-initialisation) and sets its Ready condition to
    /// `status` ("False" or "Unknown"); `None` gives it back to kwok, which
    /// makes it Ready again.
    pub async fn set_node_ready(&self, name: &str, status: Option<&str>) {
        let api: Api<Node> = Api::all(self.client.clone());
        match status {
            Some(s) => {
                self.label_node(name, NOT_READY_LABEL, Some("true")).await;
                let now = k8s_openapi::jiff::Timestamp::now()
                    .round(k8s_openapi::jiff::Unit::Second)
                    .map(|t| t.to_string())
                    .unwrap_or_default();
                let patch = serde_json::json!({ "status": { "conditions": [{
                    "type": "Ready", "status": s, "reason": "TestPartition",
                    "message": "set by the test", "lastHeartbeatTime": now, "lastTransitionTime": now
                }] } });
                if let Err(e) = api
                    .patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
                    .await
                {
                    panic!("setting Ready={s} on {name}: {e}");
                }
            }
            None => self.label_node(name, NOT_READY_LABEL, None).await,
        }
    }

    pub async fn get_node(&self, name: &str) -> Node {
        let api: Api<Node> = Api::all(self.client.clone());
        match api.get(name).await {
            Ok(n) => n,
            Err(e) => panic!("reading node {name}: {e}"),
        }
    }

    /// Pods on `node` in `namespace`.
    pub async fn pods_on(&self, namespace: &str, node: &str) -> Vec<Pod> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let lp = ListParams::default().fields(&format!("spec.nodeName={node}"));
        match api.list(&lp).await {
            Ok(l) => l.items,
            Err(e) => panic!("listing pods on {node}: {e}"),
        }
    }

    /// A one-replica Deployment `app` of `namespace` whose pod (labelled
    /// `app=<app>`) is pinned to `node` by nodeSelector, so an evicted replica
    /// waits Pending while the node is cordoned; with `device` it mounts
    /// /dev/tenstorrent (hostPath), a device user.
    pub async fn pinned_deployment(&self, namespace: &str, app: &str, node: &str, device: bool) {
        let mut spec = workload_pod(device);
        spec.node_selector = Some(BTreeMap::from([(
            "kubernetes.io/hostname".to_string(),
            node.to_string(),
        )]));
        self.deployment(namespace, app, spec).await;
    }

    /// A one-replica Deployment `app` of pods `spec`, labelled `app=<app>`.
    pub async fn deployment(
        &self,
        namespace: &str,
        app: &str,
        spec: k8s_openapi::api::core::v1::PodSpec,
    ) {
        use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
        use k8s_openapi::api::core::v1::PodTemplateSpec;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
        let labels = BTreeMap::from([("app".to_string(), app.to_string())]);
        let dep = Deployment {
            metadata: ObjectMeta {
                name: Some(app.into()),
                ..Default::default()
            },
            spec: Some(DeploymentSpec {
                replicas: Some(1),
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
        };
        let api: Api<Deployment> = Api::namespaced(self.client.clone(), namespace);
        if let Err(e) = api.create(&PostParams::default(), &dep).await {
            panic!("creating Deployment {app}: {e}");
        }
    }

    /// A bare pod `name` (no controller, labelled `app=<name>`) bound to `node`.
    pub async fn bare_pod(&self, namespace: &str, name: &str, node: &str) {
        let mut spec = workload_pod(false);
        spec.node_name = Some(node.into());
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(BTreeMap::from([("app".to_string(), name.to_string())])),
                ..Default::default()
            },
            spec: Some(spec),
            ..Default::default()
        };
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        if let Err(e) = api.create(&PostParams::default(), &pod).await {
            panic!("creating pod {name}: {e}");
        }
    }

    /// A PodDisruptionBudget `name` with minAvailable 1 over the pods `app=<app>`
    /// of `namespace`; waits until it counts `app`'s pod healthy and allows no
    /// disruption, so that it refuses every eviction from then on.
    pub async fn guard_app(&self, namespace: &str, name: &str, app: &str) {
        use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
        use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
        let pdb = PodDisruptionBudget {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(PodDisruptionBudgetSpec {
                min_available: Some(IntOrString::Int(1)),
                selector: Some(LabelSelector {
                    match_labels: Some(BTreeMap::from([("app".to_string(), app.to_string())])),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let api: Api<PodDisruptionBudget> = Api::namespaced(self.client.clone(), namespace);
        if let Err(e) = api.create(&PostParams::default(), &pdb).await {
            panic!("creating PDB {name}: {e}");
        }
        wait_for(
            &format!("PDB {name} to count the healthy pod of {app} and allow no disruption"),
            Duration::from_secs(60),
            || async {
                let p = api.get(name).await.map_err(|e| e.to_string())?;
                match p.status {
                    Some(s) if s.current_healthy >= 1 && s.disruptions_allowed == 0 => Ok(()),
                    s => Err(format!("{s:?}")),
                }
            },
        )
        .await;
    }

    /// Deletes the PodDisruptionBudget `name`: the drains it held may finish.
    pub async fn delete_pdb(&self, namespace: &str, name: &str) {
        use k8s_openapi::api::policy::v1::PodDisruptionBudget;
        let api: Api<PodDisruptionBudget> = Api::namespaced(self.client.clone(), namespace);
        if let Err(e) = api.delete(name, &DeleteParams::default()).await {
            panic!("deleting PDB {name}: {e}");
        }
    }

    /// The non-terminating installer pods (label [`ttdrv_api::labels::CLAIM`]) in
    /// `namespace`: of `policy`, or of any policy with `None`. An error to list is
    /// returned as text, for [`wait_for`].
    pub async fn installer_pods(
        &self,
        namespace: &str,
        policy: Option<&str>,
    ) -> Result<Vec<Pod>, String> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let claim = ttdrv_api::labels::CLAIM;
        let lp = ListParams::default().labels(&match policy {
            Some(p) => format!("{claim}={p}"),
            None => claim.to_string(),
        });
        let list = api
            .list(&lp)
            .await
            .map_err(|e| format!("listing installer pods in {namespace}: {e}"))?;
        Ok(list
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect())
    }

    /// Waits until the DaemonSet `name` of `namespace` is gone.
    pub async fn wait_daemonset_gone(&self, namespace: &str, name: &str, timeout: Duration) {
        use k8s_openapi::api::apps::v1::DaemonSet;
        let api: Api<DaemonSet> = Api::namespaced(self.client.clone(), namespace);
        wait_for(&format!("DaemonSet {name} deleted"), timeout, || async {
            match api.get_opt(name).await {
                Ok(None) => Ok(()),
                Ok(Some(d)) => Err(format!(
                    "still there (deletionTimestamp {:?})",
                    d.metadata.deletion_timestamp
                )),
                Err(e) => Err(e.to_string()),
            }
        })
        .await
    }

    /// The last step of a cluster test: deletes this test's policies, then its
    /// nodes and namespace.
    pub async fn teardown(&self) {
        delete_policies(self).await;
        self.cleanup().await;
    }

    /// Deletes this test's nodes and namespace. Call at the end of a test.
    pub async fn cleanup(&self) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let lp = ListParams::default().labels(&self.selector());
        let _ = nodes.delete_collection(&DeleteParams::default(), &lp).await;
        let nss: Api<Namespace> = Api::all(self.client.clone());
        let _ = nss.delete(&self.id, &DeleteParams::default()).await;
    }
}

/// The pod of a test workload: one busybox container; with `device` a
/// hostPath volume /dev/tenstorrent (a device user).
pub fn workload_pod(device: bool) -> k8s_openapi::api::core::v1::PodSpec {
    use k8s_openapi::api::core::v1::{Container, HostPathVolumeSource, PodSpec, Volume};
    PodSpec {
        containers: vec![Container {
            name: "c".into(),
            image: Some("busybox".into()),
            ..Default::default()
        }],
        volumes: device.then(|| {
            vec![Volume {
                name: "dev".into(),
                host_path: Some(HostPathVolumeSource {
                    path: "/dev/tenstorrent".into(),
                    type_: None,
                }),
                ..Default::default()
            }]
        }),
        ..Default::default()
    }
}

/// Node label that takes a node out of kwok's heartbeat and initialisation
/// stages (hack/cluster.sh), so a test can make it NotReady.
pub const NOT_READY_LABEL: &str = "sim.ttdrv.io/not-ready";

/// True when the pod's Ready condition is True (the controller's reading).
pub use ttdrv_core::node::pod_ready;

/// Short description of a list of objects for failure messages.
pub fn describe<T: Debug>(items: &[T]) -> String {
    format!("{items:?}")
}

/// Installs (server-side apply) the committed CRDs, the driver's and the
/// firmware's, and waits until they are Established.
pub async fn ensure_crd(client: &Client) {
    for file in [
        "tenstorrentdriverpolicies.yaml",
        "tenstorrentfirmwarepolicies.yaml",
    ] {
        apply_crd(client, file).await;
    }
}

async fn apply_crd(client: &Client, file: &str) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let path = format!("{}/../crds/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    let crd: CustomResourceDefinition =
        serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("parsing {path}: {e}"));
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = crd.metadata.name.clone().unwrap_or_default();
    let pp = PatchParams::apply("ttdrv-tests").force();
    if let Err(e) = api.patch(&name, &pp, &Patch::Apply(&crd)).await {
        panic!("applying CRD {name}: {e}");
    }
    wait_for(
        &format!("CRD {name} Established"),
        Duration::from_secs(30),
        || async {
            let crd = api.get(&name).await.map_err(|e| e.to_string())?;
            let ok = crd
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            if ok {
                Ok(())
            } else {
                Err("not Established".into())
            }
        },
    )
    .await;
}

/// Deletes every policy of this test.
pub async fn delete_policies(env: &TestEnv) {
    let api: Api<ttdrv_api::TenstorrentDriverPolicy> = Api::all(env.client.clone());
    let _ = api
        .delete_collection(
            &Default::default(),
            &ListParams::default().labels(&env.selector()),
        )
        .await;
}
