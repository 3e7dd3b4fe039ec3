//! Helpers of the plugin's cluster tests: run the plugin binary, start the real
//! controller, create policies and workloads, record the order of cordons.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::ListParams;
use kube::runtime::{WatchStreamExt, watcher};
use ttdrv_api::TenstorrentDriverPolicy;
// Each test binary uses a different subset of these.
#[allow(unused_imports)]
pub use ttdrv_testkit::policy::{
    create_policy, delete_policies, fleet_spec, get_policy, installed, patch_policy, status,
    wait_node_at, wait_nodes,
};
use ttdrv_testkit::{ControllerOptions, ControllerProcess, SimAgent, TestEnv, wait_for};

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

/// The simulated agent of these tests: 300 ms a swap.
pub fn agent(env: &TestEnv, ns: &str) -> SimAgent {
    SimAgent::working(env.client.clone(), ns, Duration::from_millis(300))
}

/// Records, independently of the controller, the order in which this test's
/// nodes were first seen in some condition: cordoned ([`NodeOrder::cordons`])
/// or in a cycle of ours ([`NodeOrder::cycles`]).
pub struct NodeOrder {
    order: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl NodeOrder {
    /// The order in which the nodes were first seen unschedulable.
    pub async fn cordons(env: &TestEnv) -> Self {
        Self::start(env, |n| {
            n.spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false)
        })
        .await
    }

    /// The order in which the nodes first entered a cycle of ours
    /// (Cordoning..Uncordoning in the record the controller keeps on the node);
    /// unlike [`NodeOrder::cordons`] it sees a node an admin had cordoned already.
    pub async fn cycles(env: &TestEnv) -> Self {
        Self::start(env, |n| {
            ttdrv_core::node::record(n)
                .ok()
                .flatten()
                .is_some_and(|r| r.state.is_in_progress())
        })
        .await
    }

    async fn start(env: &TestEnv, seen: fn(&Node) -> bool) -> Self {
        let api: Api<Node> = Api::all(env.client.clone());
        let cfg = watcher::Config::default().labels(&env.selector());
        let order = Arc::new(Mutex::new(Vec::new()));
        let o = order.clone();
        let task = tokio::spawn(async move {
            let mut stream = watcher(api, cfg).applied_objects().boxed();
            while let Ok(Some(n)) = stream.try_next().await {
                let name = n.metadata.name.clone().unwrap_or_default();
                if seen(&n)
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

impl Drop for NodeOrder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What [`fleet`] set up: the environment, namespace, nodes, the policy, and
/// the agent, the controller and the clean-up guard (each acts when dropped).
pub type Fleet = (
    TestEnv,
    String,
    Vec<String>,
    String,
    (SimAgent, ControllerProcess, CleanupOnPanic),
);

/// One tt node per suffix, the agent, the controller, and policy `fleet`
/// installed at 2.7.0 (first install: no cordon) with `extra` spec lines.
pub async fn fleet(name: &str, suffixes: &[&str], extra: &str) -> Fleet {
    let env = TestEnv::new(name).await;
    let guard = CleanupOnPanic { id: env.id.clone() };
    let ns = env.namespace().await;
    let tt = env.tt_node_names(suffixes).await;
    let agent = agent(&env, &ns);
    let ctl = controller(&env, &ns);
    let policy = installed(&env, &tt, extra, Duration::from_secs(120)).await;
    (env, ns, tt, policy, (agent, ctl, guard))
}

/// A one-replica Deployment pinned to `node` (see [`TestEnv::pinned_deployment`]).
pub async fn deployment(env: &TestEnv, ns: &str, app: &str, node: &str, device: bool) {
    env.pinned_deployment(ns, app, node, device).await;
}

/// A pod with no controller on `node`.
pub async fn bare_pod(env: &TestEnv, ns: &str, name: &str, node: &str) {
    env.bare_pod(ns, name, node).await;
}

/// PodDisruptionBudget `guard` over the Deployment `guarded` (which must exist):
/// it refuses the eviction of its pod. Waits until it does and `ready_pods`
/// workload pods are Ready; returns the budget as `ns/guard`.
pub async fn guard(env: &TestEnv, ns: &str, ready_pods: usize) -> String {
    env.guard_app(ns, "guard", "guarded").await;
    wait_pods_ready(env, ns, ready_pods).await;
    format!("{ns}/guard")
}

/// The name of `policy`'s installer pod on `node`, if there is one.
pub async fn installer_pod(env: &TestEnv, ns: &str, node: &str, policy: &str) -> Option<String> {
    env.pods_on(ns, node)
        .await
        .into_iter()
        .find(|p| {
            p.metadata.labels.as_ref().is_some_and(|l| {
                l.get(ttdrv_api::labels::CLAIM).map(String::as_str) == Some(policy)
            })
        })
        .and_then(|p| p.metadata.name)
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
