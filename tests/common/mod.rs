//! Shared helpers of the controller's cluster tests.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::ListParams;
use kube::runtime::watcher;
use ttdrv_api::{NodeState, labels};
// Each test binary uses a different subset of these.
#[allow(unused_imports)]
pub use ttdrv_testkit::policy::{
    create_policy, delete_policies, fleet_spec, get_policy, installed, node_entry, patch_policy,
    status, wait_condition, wait_node_at,
};
use ttdrv_testkit::{ControllerOptions, ControllerProcess, TestEnv, wait_for};

pub fn controller(env: &TestEnv, ns: &str) -> ControllerProcess {
    controller_with(env, ns, ControllerOptions::default())
}

pub fn controller_with(env: &TestEnv, ns: &str, mut opts: ControllerOptions) -> ControllerProcess {
    opts.bin = Some(env!("CARGO_BIN_EXE_ttdrv-controller").into());
    ControllerProcess::start(env, ns, opts)
}

/// Waits until every listed node is reported in `state` at `version` in the policy's status.
pub async fn wait_nodes_state(
    env: &TestEnv,
    policy: &str,
    nodes: &[String],
    state: NodeState,
    version: &str,
    timeout: Duration,
) {
    ttdrv_testkit::policy::wait_nodes(env, policy, nodes, state, Some(version), timeout).await
}

/// Watches this test's nodes and records the most that were ever unschedulable at
/// once, and every node ever seen unschedulable — independently of the controller.
pub struct CordonWatcher {
    pub max_cordoned: Arc<Mutex<usize>>,
    pub ever_cordoned: Arc<Mutex<std::collections::BTreeSet<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl CordonWatcher {
    pub fn start(env: &TestEnv) -> Self {
        let api: Api<Node> = Api::all(env.client.clone());
        let cfg = watcher::Config::default().labels(&env.selector());
        let max = Arc::new(Mutex::new(0usize));
        let ever = Arc::new(Mutex::new(std::collections::BTreeSet::new()));
        let (m, e) = (max.clone(), ever.clone());
        let task = tokio::spawn(async move {
            let mut cordoned: BTreeMap<String, bool> = BTreeMap::new();
            let mut stream = ttdrv_testkit::watch_applied(api, cfg);
            while let Some(n) = stream.next().await {
                let name = n.metadata.name.clone().unwrap_or_default();
                let c = n
                    .spec
                    .as_ref()
                    .and_then(|s| s.unschedulable)
                    .unwrap_or(false);
                cordoned.insert(name.clone(), c);
                if c && let Ok(mut s) = e.lock() {
                    s.insert(name);
                }
                let now = cordoned.values().filter(|v| **v).count();
                if let Ok(mut mx) = m.lock() {
                    *mx = (*mx).max(now);
                }
            }
        });
        Self {
            max_cordoned: max,
            ever_cordoned: ever,
            task,
        }
    }

    pub fn max(&self) -> usize {
        self.max_cordoned.lock().map(|m| *m).unwrap_or(usize::MAX)
    }

    pub fn ever(&self) -> Vec<String> {
        self.ever_cordoned
            .lock()
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }
}

impl Drop for CordonWatcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub fn gate_labels(node: &Node) -> Vec<String> {
    node.metadata
        .labels
        .iter()
        .flatten()
        .filter(|(k, _)| k.starts_with("tenstorrent.com/deploy."))
        .map(|(k, v)| format!("{k}={v}"))
        .collect()
}

pub fn unschedulable(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

pub fn kmd(node: &Node) -> Option<String> {
    node.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(labels::KMD_VERSION).cloned())
}

/// The tt-kmd version an installer pod is told to load (its `TT_KMD_VERSION`).
pub fn pod_version(pod: &k8s_openapi::api::core::v1::Pod) -> Option<String> {
    pod.spec.as_ref()?.containers.iter().find_map(|c| {
        c.env
            .as_ref()?
            .iter()
            .find(|e| e.name == labels::env::TT_KMD_VERSION)?
            .value
            .clone()
    })
}

/// A one-replica Deployment `name` whose pod (labelled `app=<name>`) is pinned
/// to `node` (see [`TestEnv::pinned_deployment`]).
pub async fn pinned_deployment(env: &TestEnv, ns: &str, name: &str, node: &str) {
    env.pinned_deployment(ns, name, node, false).await;
}

/// A bare pod (no controller) bound to `node`.
pub async fn bare_pod(env: &TestEnv, ns: &str, name: &str, node: &str) {
    env.bare_pod(ns, name, node).await;
}

/// A PodDisruptionBudget `<app>` with minAvailable 1 over `app=<app>`, counting
/// its pod (see [`TestEnv::guard_app`]).
pub async fn pdb(env: &TestEnv, ns: &str, app: &str) {
    env.guard_app(ns, app, app).await;
}

/// The pod of Deployment `guarded` on `node` under a PodDisruptionBudget that
/// refuses its eviction: the node's drain holds until [`release_drain`].
/// Returns the name of that pod.
pub async fn hold_drain(env: &TestEnv, ns: &str, node: &str) -> String {
    pinned_deployment(env, ns, "guarded", node).await;
    pdb(env, ns, "guarded").await;
    app_pods(env, ns, "guarded")
        .await
        .first()
        .map(|p| p.0.clone())
        .expect("guarded pod")
}

/// Deletes the PodDisruptionBudget of [`hold_drain`]: the held drain may finish.
pub async fn release_drain(env: &TestEnv, ns: &str) {
    env.delete_pdb(ns, "guarded").await;
}

/// Names (and uids) of the Ready/Running pods with `app=<app>` and the node they run on.
pub async fn app_pods(env: &TestEnv, ns: &str, app: &str) -> Vec<(String, String, String)> {
    use k8s_openapi::api::core::v1::Pod;
    let api: Api<Pod> = Api::namespaced(env.client.clone(), ns);
    let list = api
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    list.into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| {
            (
                p.metadata.name.clone().unwrap_or_default(),
                p.metadata.uid.clone().unwrap_or_default(),
                p.spec.and_then(|s| s.node_name).unwrap_or_default(),
            )
        })
        .collect()
}

/// Waits for a node's state in the policy status; returns the status entry.
pub async fn wait_node(
    env: &TestEnv,
    policy: &str,
    node: &str,
    state: NodeState,
    timeout: Duration,
) -> ttdrv_api::NodeStatus {
    wait_node_at(env, policy, node, state, None, timeout).await
}

/// Notes of Events recorded about the policy.
pub async fn policy_events(env: &TestEnv, policy: &str) -> Vec<(String, String)> {
    use k8s_openapi::api::events::v1::Event;
    let api: Api<Event> = Api::all(env.client.clone());
    let list = api
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    list.into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(policy))
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

/// Waits for an Event about the policy with `reason` whose note satisfies `ok`.
pub async fn wait_event(
    env: &TestEnv,
    policy: &str,
    reason: &str,
    timeout: Duration,
    ok: impl Fn(&str) -> bool,
) {
    wait_for(
        &format!("an Event {reason} about {policy}"),
        timeout,
        || async {
            let events = policy_events(env, policy).await;
            if events.iter().any(|(r, n)| r == reason && ok(n)) {
                Ok(())
            } else {
                Err(format!("{events:?}"))
            }
        },
    )
    .await;
}

/// What the [`SafetyWatcher`] saw, for assertions and failure messages.
#[derive(Clone, Debug, Default)]
pub struct SafetySeen {
    /// Most Ready nodes cordoned by us at one instant (cordoned, and our
    /// record says the cordon is ours).
    pub max_ready_cordoned_by_us: usize,
    /// Most nodes holding a slot of ours (Cordoning..Uncordoning with a drain,
    /// or a bounded restart-only cycle) at one instant, by the records on the
    /// nodes.
    pub max_in_cycle: usize,
    /// Most nodes in a cycle without drain (restart-only, first install) at
    /// one instant, by the records on the nodes.
    pub max_without_drain: usize,
    /// Module swaps (kmd-version a -> b, both set; or the same version with
    /// other module parameters reported) seen without a valid go-ahead on
    /// the node at that instant.
    pub swaps_without_go_ahead: Vec<String>,
    /// Every module swap seen, as `node: a -> b`.
    pub swaps: Vec<String>,
}

/// Watches this test's nodes, independently of the controller, and checks at
/// every event: how many Ready nodes we have cordoned, how many nodes are in
/// a cycle, and that every module swap happened under a valid go-ahead.
pub struct SafetyWatcher {
    seen: Arc<Mutex<SafetySeen>>,
    task: tokio::task::JoinHandle<()>,
}

impl SafetyWatcher {
    pub fn start(env: &TestEnv) -> Self {
        let api: Api<Node> = Api::all(env.client.clone());
        let cfg = watcher::Config::default().labels(&env.selector());
        let seen: Arc<Mutex<SafetySeen>> = Arc::default();
        let out = seen.clone();
        let task = tokio::spawn(async move {
            let mut nodes: BTreeMap<String, Node> = BTreeMap::new();
            let mut stream = ttdrv_testkit::watch_applied(api, cfg);
            while let Some(n) = stream.next().await {
                let name = n.metadata.name.clone().unwrap_or_default();
                let before = nodes.insert(name.clone(), n.clone());
                let Ok(mut s) = out.lock() else { return };
                // A swap (another version), or a reload: the same version with
                // other module parameters in effect (both reported). Either
                // needs the go-ahead.
                let params = |n: &Node| {
                    ttdrv_core::node::annotation(n, ttdrv_api::labels::KMD_PARAMETERS)
                        .and_then(|p| ttdrv_api::module_params::parse(p).ok())
                };
                if let (Some(a), Some(b)) = (before.as_ref().and_then(kmd), kmd(&n)) {
                    let (pa, pb) = (before.as_ref().and_then(params), params(&n));
                    let reload = match (&pa, &pb) {
                        (Some(pa), Some(pb)) if a == b && pa != pb => Some((pa, pb)),
                        _ => None,
                    };
                    if a != b || reload.is_some() {
                        let policy = ttdrv_core::node::record(&n)
                            .ok()
                            .flatten()
                            .map(|r| r.policy)
                            .unwrap_or_default();
                        let (what, swap) = match reload {
                            Some((pa, pb)) => (
                                format!(
                                    "{a} reloaded, {} -> {}",
                                    ttdrv_api::module_params::canonical(pa),
                                    ttdrv_api::module_params::canonical(pb)
                                ),
                                ttdrv_core::go_ahead::decide(
                                    &n,
                                    &policy,
                                    ttdrv_core::node::Target::new(&b, pb),
                                    Some(&a),
                                    Some(pa),
                                ),
                            ),
                            None => (
                                format!("{a} -> {b}"),
                                ttdrv_core::go_ahead::decide(
                                    &n,
                                    &policy,
                                    ttdrv_core::node::Target::version(&b),
                                    Some(&a),
                                    None,
                                ),
                            ),
                        };
                        s.swaps.push(format!("{name}: {what}"));
                        if !matches!(swap, ttdrv_core::go_ahead::Swap::GoAhead(_)) {
                            s.swaps_without_go_ahead
                                .push(format!("{name}: {what}: {swap:?}"));
                        }
                    }
                }
                let records: Vec<_> = nodes
                    .values()
                    .map(|n| (n, ttdrv_core::node::record(n).ok().flatten()))
                    .collect();
                let ready_ours = records
                    .iter()
                    .filter(|(n, r)| {
                        ttdrv_core::node::ready(n)
                            && unschedulable(n)
                            && r.as_ref().is_some_and(|r| r.cordoned_by_us())
                    })
                    .count();
                let in_cycle = records
                    .iter()
                    .filter(|(_, r)| r.as_ref().is_some_and(|r| r.occupies_slot()))
                    .count();
                s.max_ready_cordoned_by_us = s.max_ready_cordoned_by_us.max(ready_ours);
                s.max_in_cycle = s.max_in_cycle.max(in_cycle);
                let without_drain = records
                    .iter()
                    .filter(|(_, r)| {
                        r.as_ref()
                            .is_some_and(|r| r.state.is_in_progress() && r.no_drain)
                    })
                    .count();
                s.max_without_drain = s.max_without_drain.max(without_drain);
            }
        });
        Self { seen, task }
    }

    pub fn seen(&self) -> SafetySeen {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// The safety invariants, as the watcher saw them so far (`when` says at
    /// which point of the test): at most `max_ready_cordoned` Ready nodes
    /// cordoned by us at once, at most `max_in_cycle` nodes in a cycle (when
    /// given), no module swap without the controller's go-ahead.
    pub fn assert_safe(&self, max_ready_cordoned: usize, max_in_cycle: Option<usize>, when: &str) {
        let s = self.seen();
        assert!(
            s.swaps_without_go_ahead.is_empty(),
            "{when}: module swapped without the controller's go-ahead: {:?} (all swaps: {:?})",
            s.swaps_without_go_ahead,
            s.swaps
        );
        assert!(
            s.max_ready_cordoned_by_us <= max_ready_cordoned,
            "{when}: {} Ready nodes were cordoned by us at once (at most {max_ready_cordoned} allowed); the watcher saw {s:?}",
            s.max_ready_cordoned_by_us
        );
        if let Some(max) = max_in_cycle {
            assert!(
                s.max_in_cycle <= max,
                "{when}: {} nodes were in a cycle at once (at most {max} allowed); the watcher saw {s:?}",
                s.max_in_cycle
            );
        }
    }
}

impl Drop for SafetyWatcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What a vacated node must look like, or why it does not.
pub fn vacated(node: &Node, policy: &str) -> Result<(), String> {
    let l = node.metadata.labels.clone().unwrap_or_default();
    let a = node.metadata.annotations.clone().unwrap_or_default();
    let mut wrong = vec![];
    for k in [
        labels::KMD_VERSION,
        labels::INSTALL_MODE,
        labels::TT_SMI_VERSION,
        labels::KMD_BOOT_ID,
    ] {
        if l.contains_key(k) {
            wrong.push(format!("label {k} left"));
        }
    }
    if l.get(labels::UNMANAGED).map(String::as_str) != Some(policy) {
        wrong.push(format!("unmanaged label: {:?}", l.get(labels::UNMANAGED)));
    }
    if !gate_labels(node).is_empty() {
        wrong.push(format!("gates left: {:?}", gate_labels(node)));
    }
    for k in [labels::UPGRADE_STATE, labels::GO_AHEAD] {
        if a.contains_key(k) {
            wrong.push(format!("annotation {k} left"));
        }
    }
    if unschedulable(node) {
        wrong.push("still cordoned".into());
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("; "))
    }
}

/// Every node of `nodes` runs `version`, is schedulable and carries no deploy gate.
pub async fn assert_done_uncordoned(env: &TestEnv, nodes: &[String], version: &str) {
    for n in nodes {
        let node = env.get_node(n).await;
        assert!(
            !unschedulable(&node),
            "{n} must be schedulable after the rollout"
        );
        assert!(
            gate_labels(&node).is_empty(),
            "{n} still has deploy gates: {:?}",
            gate_labels(&node)
        );
        assert_eq!(kmd(&node).as_deref(), Some(version), "{n}'s loaded module");
    }
}

/// The node's status entry has a message, and it contains `part`.
pub fn assert_message(entry: &ttdrv_api::NodeStatus, part: &str) {
    assert!(
        entry.message.as_deref().is_some_and(|m| m.contains(part)),
        "the message of {}'s entry lacks {part:?}: {entry:?}",
        entry.name
    );
}

/// What [`sim_fleet`] set up: the test's environment, its namespace, its tt nodes'
/// names and the simulated agent working them (dropping it stops the agent).
pub type SimFleet = (TestEnv, String, Vec<String>, ttdrv_testkit::SimAgent);

/// One tt node whose simulated flashes take 2 s, with the firmware CRD
/// installed: the fleet of the firmware kind's single-node tests.
pub async fn flashing_fleet(name: &str) -> SimFleet {
    let fleet = sim_fleet_with(
        name,
        &numbered_nodes(1),
        &[],
        ttdrv_testkit::SimAgentConfig {
            flash: Some(Duration::from_secs(2)),
            ..Default::default()
        },
    )
    .await;
    ttdrv_testkit::ensure_crd(&fleet.0.client).await;
    fleet
}

/// A test's environment and namespace, one tt node per suffix carrying `node_labels`,
/// and a simulated agent over that namespace with `agent`'s timings (its namespace is
/// set here).
pub async fn sim_fleet_with<S: AsRef<str>>(
    name: &str,
    suffixes: &[S],
    node_labels: &[(&str, &str)],
    agent: ttdrv_testkit::SimAgentConfig,
) -> SimFleet {
    let env = TestEnv::new(name).await;
    let ns = env.namespace().await;
    let mut nodes = vec![];
    for s in suffixes {
        nodes.push(env.tt_node_name(s.as_ref(), node_labels).await);
    }
    let agent = ttdrv_testkit::SimAgent::spawn(
        env.client.clone(),
        ttdrv_testkit::SimAgentConfig {
            namespace: ns.clone(),
            ..agent
        },
    );
    (env, ns, nodes, agent)
}

/// [`sim_fleet_with`] over nodes `suffixes` that run tt-kmd `loaded` (their
/// `kmd-version` label), with an agent whose every swap takes 300 ms.
pub async fn sim_fleet_at(name: &str, suffixes: &[&str], loaded: &str) -> SimFleet {
    sim_fleet_with(
        name,
        suffixes,
        &[(ttdrv_api::labels::KMD_VERSION, loaded)],
        sim_agent_300ms(),
    )
    .await
}

/// [`sim_fleet_with`] over `n` unlabelled nodes `n0`, `n1`, ... and an agent whose
/// every swap takes 300 ms.
pub async fn sim_fleet(name: &str, n: usize) -> SimFleet {
    sim_fleet_with(name, &numbered_nodes(n), &[], sim_agent_300ms()).await
}

/// What [`installed_fleet`] set up: the environment, namespace, nodes, the
/// installed policy, and the controller and agent (each stops when dropped).
pub type InstalledFleet = (
    TestEnv,
    String,
    Vec<String>,
    String,
    (ControllerProcess, ttdrv_testkit::SimAgent),
);

/// The start of most rollout tests: a [`sim_fleet`] of `n` nodes, the
/// controller, and policy `fleet` [`installed`] at 2.7.0 with `extra` spec lines.
pub async fn installed_fleet(
    name: &str,
    n: usize,
    extra: &str,
    timeout: Duration,
) -> InstalledFleet {
    let (env, ns, nodes, agent) = sim_fleet(name, n).await;
    let ctl = controller(&env, &ns);
    let policy = installed(&env, &nodes, extra, timeout).await;
    (env, ns, nodes, policy, (ctl, agent))
}

/// Node suffixes `n0`, `n1`, ... `n{n-1}`.
pub fn numbered_nodes(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("n{i}")).collect()
}

/// The simulated agent's timings most cluster tests use: 300 ms a swap, nothing to build.
pub fn sim_agent_300ms() -> ttdrv_testkit::SimAgentConfig {
    ttdrv_testkit::SimAgentConfig {
        work: Duration::from_millis(300),
        ..Default::default()
    }
}

/// Runs a command line tool the test drives (helm, kubectl: `make test` puts
/// them on PATH), `input` on its stdin: its stdout, or its stderr (and
/// stdout) as the error.
pub fn try_run(cmd: &mut std::process::Command, input: Option<&str>) -> Result<String, String> {
    use std::io::Write;
    use std::process::Stdio;
    cmd.stdin(if input.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| {
        panic!("running {cmd:?}: {e} (helm and kubectl must be on PATH: make test sets it)")
    });
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin.write_all(text.as_bytes()).expect("stdin");
    }
    let out = child.wait_with_output().expect("wait");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    if out.status.success() {
        Ok(stdout)
    } else {
        Err(format!("{}{stdout}", String::from_utf8_lossy(&out.stderr)))
    }
}

/// [`try_run`] that must succeed.
pub fn run(cmd: &mut std::process::Command, input: Option<&str>) -> String {
    let what = format!("{cmd:?}");
    try_run(cmd, input).unwrap_or_else(|e| panic!("{what} failed: {e}"))
}

/// The YAML documents of a `helm template` output (empty ones dropped).
pub fn yaml_docs(text: &str) -> Vec<serde_yaml::Value> {
    serde_yaml::Deserializer::from_str(text)
        .filter_map(|d| serde::Deserialize::deserialize(d).ok())
        .filter(|d: &serde_yaml::Value| !d.is_null())
        .collect()
}

/// The API server's version as helm's `--kube-version` takes it (the chart's
/// kubeVersion refuses helm's offline default, 1.20).
pub async fn kube_version(env: &TestEnv) -> String {
    let server = env
        .client
        .apiserver_version()
        .await
        .expect("the API server's version");
    server.git_version.trim_start_matches('v').to_string()
}

/// Plays the kubelet for validation pods (`upgradePolicy.validation.podTemplateName`)
/// in `ns`: each one created ends Succeeded, or Failed with exit code 3 when
/// `fail`. kwok runs pods but never ends them.
pub fn finish_validation_pods(env: &TestEnv, ns: &str, fail: bool) -> tokio::task::JoinHandle<()> {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Patch, PatchParams};
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), ns);
    tokio::spawn(async move {
        loop {
            let list = pods
                .list(&ListParams::default().labels(ttdrv_api::labels::VALIDATION_CYCLE))
                .await
                .map(|l| l.items)
                .unwrap_or_default();
            for p in list {
                let phase = p.status.as_ref().and_then(|s| s.phase.clone());
                if matches!(phase.as_deref(), Some("Succeeded") | Some("Failed")) {
                    continue;
                }
                let name = p.metadata.name.clone().unwrap_or_default();
                let container = p
                    .spec
                    .as_ref()
                    .and_then(|s| s.containers.first())
                    .map(|c| c.name.clone())
                    .unwrap_or_default();
                let status = if fail {
                    serde_json::json!({ "status": {
                        "phase": "Failed",
                        "containerStatuses": [{
                            "name": container, "image": "check", "imageID": "", "ready": false,
                            "restartCount": 0,
                            "state": { "terminated": { "exitCode": 3, "reason": "Error",
                                "message": "card 0: matmul mismatch" } }
                        }]
                    }})
                } else {
                    serde_json::json!({ "status": { "phase": "Succeeded" } })
                };
                let _ = pods
                    .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                    .await;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
}

/// A PodTemplate `name` in `ns` for validation pods: one container.
pub async fn validation_template(env: &TestEnv, ns: &str, name: &str) {
    use k8s_openapi::api::core::v1::PodTemplate;
    let t: PodTemplate = serde_json::from_value(serde_json::json!({
        "metadata": { "name": name },
        "template": { "spec": { "containers": [{ "name": "check", "image": "example.com/burn-in:1" }] } }
    }))
    .expect("PodTemplate");
    let api: Api<PodTemplate> = Api::namespaced(env.client.clone(), ns);
    api.create(&Default::default(), &t)
        .await
        .unwrap_or_else(|e| panic!("creating PodTemplate {name}: {e}"));
}
