//! Helpers of the plugin's cluster tests: run the plugin binary, start the real
//! controller, create policies and workloads, record the order of cordons.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Container, HostPathVolumeSource, Node, Pod, PodSpec, PodTemplateSpec, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::Api;
use kube::api::{ListParams, ObjectMeta, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use ttdrv_api::TenstorrentDriverPolicy;
// Each test binary uses a different subset of these.
#[allow(unused_imports)]
pub use ttdrv_testkit::policy::{
    create_policy, delete_policies, get_policy, patch_policy, wait_nodes,
};
use ttdrv_testkit::{ControllerOptions, ControllerProcess, TestEnv, wait_for};

/// Output of one plugin run.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("plugin output is not JSON ({e}):\n{}", self.stdout))
    }
}

pub fn plugin_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_kubectl-tt-driver"))
}

/// Runs `kubectl-tt-driver <args>` (no terminal, so no color) and waits for it.
pub async fn plugin(args: &[&str]) -> Run {
    plugin_env(args, &[]).await
}

/// Same, with extra environment variables.
pub async fn plugin_env(args: &[&str], envs: &[(&str, &str)]) -> Run {
    let out = tokio::process::Command::new(plugin_bin())
        .args(args)
        .env_remove("NO_COLOR")
        .envs(envs.iter().copied())
        .output()
        .await
        .unwrap_or_else(|e| panic!("running the plugin {args:?}: {e}"));
    let run = Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into(),
        stderr: String::from_utf8_lossy(&out.stderr).into(),
    };
    eprintln!(
        "$ kubectl tt driver {} -> {}\n{}{}",
        args.join(" "),
        run.code,
        run.stdout,
        run.stderr
    );
    run
}

/// The target directory this test binary was built in (`<target>/<profile>/deps/<test>`).
fn target_profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    exe.parent()
        .and_then(Path::parent)
        .map(PathBuf::from)
        .unwrap_or_default()
}

static BUILD: Mutex<Option<PathBuf>> = Mutex::new(None);

/// The controller binary: `TTDRV_CONTROLLER_BIN`, else `ttdrv-controller` beside
/// this test's target directory (cargo builds it there for the controller's own
/// tests in `cargo test --workspace`), else built now for these tests, in a
/// separate target directory so it cannot wait on the lock of the running cargo.
pub fn controller_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("TTDRV_CONTROLLER_BIN") {
        return PathBuf::from(p);
    }
    let beside = ttdrv_testkit::controller::controller_binary();
    if beside.is_file() {
        return beside;
    }
    let mut built = BUILD.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = built.as_ref() {
        return p.clone();
    }
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let target = target_profile_dir()
        .parent()
        .map(|t| t.join("plugin-tests"))
        .unwrap_or_else(|| workspace.join("target/plugin-tests"));
    eprintln!(
        "{} is missing: building ttdrv-controller into {}",
        beside.display(),
        target.display()
    );
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = std::process::Command::new(cargo)
        .args([
            "build",
            "-p",
            "ttdrv-controller",
            "--bin",
            "ttdrv-controller",
        ])
        .env("CARGO_TARGET_DIR", &target)
        .current_dir(&workspace)
        .status()
        .unwrap_or_else(|e| panic!("running cargo build for ttdrv-controller: {e}"));
    assert!(
        status.success(),
        "building ttdrv-controller failed; set TTDRV_CONTROLLER_BIN"
    );
    let bin = target.join("debug/ttdrv-controller");
    *built = Some(bin.clone());
    bin
}

pub fn controller(env: &TestEnv, ns: &str) -> ControllerProcess {
    ControllerProcess::start(
        env,
        ns,
        ControllerOptions {
            bin: Some(controller_bin()),
            ..Default::default()
        },
    )
}

/// Selector YAML matching this test's nodes.
pub fn selector(env: &TestEnv) -> String {
    format!("{{matchLabels: {{ttdrv-test: {}}}}}", env.id)
}

/// Records, independently of the controller, the order in which this test's
/// nodes were first seen cordoned.
pub struct CordonOrder {
    order: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl CordonOrder {
    pub async fn start(env: &TestEnv) -> Self {
        let api: Api<Node> = Api::all(env.client.clone());
        let cfg = watcher::Config::default().labels(&env.selector());
        let order = Arc::new(Mutex::new(Vec::new()));
        let o = order.clone();
        let task = tokio::spawn(async move {
            let mut stream = watcher(api, cfg).applied_objects().boxed();
            while let Ok(Some(n)) = stream.try_next().await {
                let name = n.metadata.name.clone().unwrap_or_default();
                let cordoned = n
                    .spec
                    .as_ref()
                    .and_then(|s| s.unschedulable)
                    .unwrap_or(false);
                if cordoned
                    && let Ok(mut v) = o.lock()
                    && !v.contains(&name)
                {
                    v.push(name);
                }
            }
        });
        // Let the watch's initial list land before anything is cordoned.
        tokio::time::sleep(Duration::from_millis(500)).await;
        Self { order, task }
    }

    pub fn order(&self) -> Vec<String> {
        self.order.lock().map(|v| v.clone()).unwrap_or_default()
    }
}

impl Drop for CordonOrder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn pod_spec(node: &str, device: bool) -> PodSpec {
    PodSpec {
        node_selector: Some(labels(&[("kubernetes.io/hostname", node)])),
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

/// A one-replica Deployment pinned to `node` (by nodeSelector, so an evicted
/// replica waits Pending while the node is cordoned).
pub async fn deployment(env: &TestEnv, ns: &str, app: &str, node: &str, device: bool) {
    let dep = Deployment {
        metadata: ObjectMeta {
            name: Some(app.into()),
            ..Default::default()
        },
        spec: Some(DeploymentSpec {
            replicas: Some(1),
            selector: LabelSelector {
                match_labels: Some(labels(&[("app", app)])),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels(&[("app", app)])),
                    ..Default::default()
                }),
                spec: Some(pod_spec(node, device)),
            },
            ..Default::default()
        }),
        ..Default::default()
    };
    Api::<Deployment>::namespaced(env.client.clone(), ns)
        .create(&PostParams::default(), &dep)
        .await
        .unwrap_or_else(|e| panic!("creating Deployment {app}: {e}"));
}

/// A pod with no controller on `node`.
pub async fn bare_pod(env: &TestEnv, ns: &str, name: &str, node: &str) {
    let mut spec = pod_spec(node, false);
    spec.node_selector = None;
    spec.node_name = Some(node.into());
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels(&[("app", name)])),
            ..Default::default()
        },
        spec: Some(spec),
        ..Default::default()
    };
    Api::<Pod>::namespaced(env.client.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("creating pod {name}: {e}"));
}

/// Waits until `count` pods of the namespace are Ready; returns `app -> ns/name`.
pub async fn wait_pods_ready(env: &TestEnv, ns: &str, count: usize) -> BTreeMap<String, String> {
    let api: Api<Pod> = Api::namespaced(env.client.clone(), ns);
    wait_for(
        &format!("{count} workload pods Ready in {ns}"),
        Duration::from_secs(60),
        || async {
            let pods = api
                .list(&ListParams::default().labels("app"))
                .await
                .map_err(|e| e.to_string())?
                .items;
            let ready: BTreeMap<String, String> = pods
                .iter()
                .filter(|p| ttdrv_testkit::pod_ready(p))
                .filter_map(|p| {
                    let app = p.metadata.labels.as_ref()?.get("app")?.clone();
                    Some((app, format!("{ns}/{}", p.metadata.name.clone()?)))
                })
                .collect();
            if ready.len() >= count {
                Ok(ready)
            } else {
                Err(format!("ready: {ready:?}"))
            }
        },
    )
    .await
}

pub fn names(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|x| {
            x.get("name")
                .or_else(|| x.get("pod"))
                .and_then(|n| n.as_str())
                .map(String::from)
        })
        .collect()
}

pub fn strings(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|x| x.as_str().map(String::from))
        .collect()
}

/// Deletes a test's policies, nodes and namespace when the test panics (a test
/// that passes cleans up itself), so a failure leaves no rollout behind on the
/// shared cluster.
pub struct CleanupOnPanic {
    pub id: String,
}

impl Drop for CleanupOnPanic {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let id = self.id.clone();
        // The test's runtime is unwinding: clean up from a fresh one.
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                let client = ttdrv_testkit::client().await;
                let lp =
                    ListParams::default().labels(&format!("{}={id}", ttdrv_testkit::TEST_LABEL));
                let _ = Api::<TenstorrentDriverPolicy>::all(client.clone())
                    .delete_collection(&Default::default(), &lp)
                    .await;
                let _ = Api::<Node>::all(client.clone())
                    .delete_collection(&Default::default(), &lp)
                    .await;
                let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(client)
                    .delete(&id, &Default::default())
                    .await;
            });
        })
        .join();
    }
}
