//! A stand-in for the node agent on kwok-simulated nodes.
//!
//! kwok makes ordinary pods Ready at once, but `hack/cluster.sh` excludes pods of
//! our installer DaemonSet (label `driver.tenstorrent.com/policy`). This task
//! plays their agent instead: after a fixed amount of simulated work it "loads"
//! the pod's `TT_KMD_VERSION` (sets the node's `kmd-version` and `install-mode`
//! labels the way the real agent does) and only then marks the pod Ready. Like the
//! real agent it refuses to swap the module while a pod on the node still uses
//! the device (hostPath /dev/tenstorrent or a `tenstorrent.com/*` resource).
//!
//! Node annotations steer it per node:
//! - `sim.ttdrv.io/host-managed: "<version>"`: a DKMS host; report mode `host`.
//! - `sim.ttdrv.io/fail: "true"`: the agent fails; the pod never becomes Ready.
//! - `sim.ttdrv.io/crash: "true"`: the agent crashes over and over (restarts counted).
//! - `sim.ttdrv.io/loaded: "<version>"`: a module of that version is loaded
//!   although the node has no `kmd-version` label (the Go operator removed it
//!   while its pod was NotReady): the agent reports it honestly at start and
//!   then needs the go-ahead to swap it, as for a labelled one.
//!
//! - `sim.ttdrv.io/unload-fail: "true"`: an unload (`spec.unmanage`) fails
//!   with an `UnloadError` termination message.
//! - `sim.ttdrv.io/cached: "<version>,<version>,..."`: the node's module cache
//!   (the agent adds each version it builds). A cached target is not built.
//! - `sim.ttdrv.io/build-fail: "<version>"`: building that version fails: after
//!   the build time the agent gives up with a `BuildFailed` termination message
//!   (and tries again after the kubelet's back-off, 10 s doubling); the
//!   loaded module is not touched.
//! - `sim.ttdrv.io/validation-fails: "<version>"`: that version loads but
//!   fails validation (it serves no card): as the real agent, after the swap
//!   the agent rolls back to the version it replaced (labels say so) and
//!   gives up with a `ValidationFailed` termination message, and does not
//!   swap again under the same go-ahead; with `onValidationFailure: hold`
//!   (env `TT_KMD_ON_VALIDATION_FAILURE=hold`) it keeps the version loaded
//!   and fails at every restart while the annotation stays.
//!
//! The controller's rollback verdict (`driver.tenstorrent.com/rollback`
//! naming a cycle), as the real agent takes it: a swap's load records the
//! previous version and the cycle on the node ([`SWAP_ANNOTATION`], where
//! the real agent keeps its swap record on the host); an agent at the
//! target that finds the verdict on that cycle labels the previous version
//! again and gives up `ValidationFailed` (or, with `hold`, keeps the target
//! and says so), and does not swap again under the same go-ahead.
//!
//! Build ahead (issue 22), as the real agent: a target that is not cached is
//! built first ([`SimAgentConfig::build`]), before the go-ahead is asked for,
//! and when a module is loaded the node is then labelled
//! [`labels::KMD_PREPARED`]`=<target>`. Only then does it wait for the
//! go-ahead (watching its own Node, re-reading its pod every few seconds, so
//! that a hundred waiting pods cost the API server little), and with it it
//! loads ([`SimAgentConfig::load`]), labels `kmd-version` and becomes Ready.
//!
//! The installer of a `spec.unmanage` policy (env `TTDRV_UNMANAGE=true`)
//! installs nothing: with the controller's unload go-ahead
//! ([`ttdrv_core::go_ahead::decide_unload`]) and no pod holding the device it
//! removes the node's driver labels and becomes Ready.
//!
//! Module parameters (`TT_KMD_MODULE_PARAMETERS` of the pod) are part of the
//! target, as for the real agent: the node's `kmd-parameters` annotation
//! stands for sysfs (the defaults with the pod's parameters over them are
//! written with every load), and a node at the target version with other
//! values is swapped (reloaded) like one of another version.
//!
//! Like the real agent it swaps a loaded module only with the controller's
//! go-ahead ([`ttdrv_core::go_ahead::decide`], the real agent's decision), and
//! when a pod still holds the device it gives up with a `DeviceBusy`
//! termination message. An installer image named `...unpullable...` plays
//! ImagePullBackOff.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use ttdrv_api::{labels, module_params};
use ttdrv_core::{go_ahead, reason};

pub const HOST_MANAGED_ANNOTATION: &str = "sim.ttdrv.io/host-managed";
pub const FAIL_ANNOTATION: &str = "sim.ttdrv.io/fail";
/// The agent crashes at once, over and over (exit 1, no reason given).
pub const CRASH_ANNOTATION: &str = "sim.ttdrv.io/crash";
/// A module of this version is loaded, whatever the node's labels say.
pub const LOADED_ANNOTATION: &str = "sim.ttdrv.io/loaded";
/// Unloading fails (`spec.unmanage`).
pub const UNLOAD_FAIL_ANNOTATION: &str = "sim.ttdrv.io/unload-fail";
/// The node's simulated module cache: versions, comma-separated.
pub const CACHED_ANNOTATION: &str = "sim.ttdrv.io/cached";
/// Building this version fails (`BuildFailed`).
pub const BUILD_FAIL_ANNOTATION: &str = "sim.ttdrv.io/build-fail";
/// See the module doc.
pub const VALIDATION_FAILS_ANNOTATION: &str = "sim.ttdrv.io/validation-fails";
/// Node annotation the simulated agent writes with a swap's load: the
/// previous version and the go-ahead's cycle (`<previous>@<cycle>`), as the
/// real agent keeps its validated swap's record on the host, for the
/// controller's rollback verdict ([`labels::ROLLBACK_VERDICT`]).
pub const SWAP_ANNOTATION: &str = "sim.ttdrv.io/swapped";
/// Node annotation: how many cards the simulated node has (default 1): the
/// agent labels it `kmd-cards` with the version it loads, as the real one
/// counts its device nodes.
pub const CARDS_ANNOTATION: &str = "sim.ttdrv.io/cards";
/// While waiting for the go-ahead the pod is read again at least this often
/// (the Node is watched): a deleted pod stops waiting.
const GO_AHEAD_RECHECK: Duration = Duration::from_secs(5);
/// An installer image whose name contains this is never pulled.
pub const UNPULLABLE: &str = "unpullable";
pub const SIM_TT_SMI_VERSION: &str = "3.0.0-sim";

#[derive(Clone, Debug, Default)]
pub struct SimAgentConfig {
    /// Namespace of the installer DaemonSets.
    pub namespace: String,
    /// Simulated time before the agent does anything (its start); with
    /// `build` and `load` zero, all the simulated work of a swap.
    pub work: Duration,
    /// Simulated time to build a target that is not in the node's cache
    /// ([`CACHED_ANNOTATION`]), spent before the go-ahead is asked for.
    pub build: Duration,
    /// Simulated time to unload the old module and load the target, spent
    /// after the go-ahead.
    pub load: Duration,
    /// Simulated time of a flash (the flash Job pod's run,
    /// [`crate::sim_flasher`]); `None`: `work`.
    pub flash: Option<Duration>,
    /// Simulated time from seeing the go-ahead to looking for the device's
    /// holders (the real agent reads its record and the module's users
    /// first): a window in which a test can put a pod on the drained node.
    pub holder_check_delay: Duration,
}

/// Handle to the running simulated agent; dropping it stops it.
pub struct SimAgent {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for SimAgent {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SimAgent {
    pub fn spawn(client: Client, config: SimAgentConfig) -> Self {
        let task = tokio::spawn(run(client, config));
        Self { task }
    }

    /// The agent most cluster tests run: over `namespace`, every swap taking
    /// `work`, nothing to build.
    pub fn working(client: Client, namespace: &str, work: Duration) -> Self {
        Self::spawn(
            client,
            SimAgentConfig {
                namespace: namespace.to_string(),
                work,
                ..Default::default()
            },
        )
    }
}

/// Runs until the process ends (used by the `ttdrv-sim-agent` binary).
/// The flash Jobs' pods of the firmware policies are played too
/// ([`crate::sim_flasher`]), in the same task (stopped with it).
pub async fn run(client: Client, config: SimAgentConfig) {
    let flash = config.flash.unwrap_or(config.work);
    let flasher = crate::sim_flasher::run(client.clone(), config.namespace.clone(), flash);
    futures::join!(flasher, run_agent(client, config));
}

/// How often a sim agent whose API calls fail starts again before it gives up.
const SIM_RESTARTS: u32 = 60;

async fn run_agent(client: Client, config: SimAgentConfig) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &config.namespace);
    let in_flight: Arc<Mutex<HashSet<String>>> = Arc::default();
    let wc = watcher::Config::default().labels(labels::CLAIM);
    let mut stream = watcher(pods.clone(), wc)
        .default_backoff()
        .applied_objects()
        .boxed();
    loop {
        let pod = match stream.try_next().await {
            Ok(Some(p)) => p,
            Ok(None) => break,
            Err(e) => {
                tracing::warn!(error = %e, "sim-agent watch error");
                continue;
            }
        };
        if pod.metadata.deletion_timestamp.is_some() || crate::cluster::pod_ready(&pod) {
            continue;
        }
        let (Some(uid), Some(node)) = (
            pod.metadata.uid.clone(),
            pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        ) else {
            continue;
        };
        let fresh = in_flight
            .lock()
            .map(|mut s| s.insert(uid.clone()))
            .unwrap_or(false);
        if !fresh {
            continue;
        }
        let (client, config, in_flight) = (client.clone(), config.clone(), in_flight.clone());
        tokio::spawn(async move {
            // An error is the API server's (down, or a write's answer lost):
            // the real agent exits and the kubelet starts it again, which
            // reads the node afresh. Bounded, as a crash loop is not.
            for restart in 1..=SIM_RESTARTS {
                match play_agent(&client, &config, &pod, &node).await {
                    Ok(()) => break,
                    Err(e) if restart < SIM_RESTARTS => {
                        tracing::warn!(error = %e, node, restart, "sim-agent failed; starting again");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    Err(e) => tracing::warn!(error = %e, node, "sim-agent gave up on pod"),
                }
            }
            if let Ok(mut s) = in_flight.lock() {
                s.remove(&uid);
            }
        });
    }
}

fn env_of(pod: &Pod, name: &str) -> Option<String> {
    pod.spec.as_ref()?.containers.iter().find_map(|c| {
        c.env
            .as_ref()?
            .iter()
            .find(|e| e.name == name)?
            .value
            .clone()
    })
}

fn target_version(pod: &Pod) -> Option<String> {
    env_of(pod, labels::env::TT_KMD_VERSION)
}

fn pod_image(pod: &Pod) -> Option<String> {
    pod.spec.as_ref()?.containers.first()?.image.clone()
}

/// The policy an installer pod belongs to (its claim label).
fn pod_policy(pod: &Pod) -> String {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(labels::CLAIM))
        .cloned()
        .unwrap_or_default()
}

/// The name of the installer pod's first container, the agent's.
fn agent_container(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .map(|c| c.name.clone())
        .unwrap_or_default()
}

/// Plays the kubelet: the container waits (e.g. ImagePullBackOff).
async fn set_waiting(
    pods: &Api<Pod>,
    name: &str,
    pod: &Pod,
    why: &str,
    image: &str,
) -> anyhow::Result<()> {
    let c = agent_container(pod);
    let status = serde_json::json!({ "status": { "containerStatuses": [{
        "name": c, "image": image, "imageID": "", "ready": false, "restartCount": 0,
        "state": { "waiting": { "reason": why, "message": format!("simulated: {image} not found") } }
    }] } });
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}

/// Plays the kubelet after the agent exited: restart count, the last
/// termination with the agent's termination message, and the back-off
/// before the next start (CrashLoopBackOff, as the kubelet shows it).
async fn set_terminated(
    pods: &Api<Pod>,
    name: &str,
    pod: &Pod,
    restarts: i32,
    message: &str,
) -> anyhow::Result<()> {
    let c = agent_container(pod);
    let now = now_seconds()?;
    let status = serde_json::json!({ "status": { "containerStatuses": [{
        "name": c, "image": pod_image(pod).unwrap_or_default(), "imageID": "", "ready": false,
        "restartCount": restarts,
        "state": { "waiting": { "reason": "CrashLoopBackOff",
                                "message": "back-off restarting failed container (simulated)" } },
        "lastState": { "terminated": { "exitCode": 1, "reason": "Error", "message": message,
                                        "startedAt": now, "finishedAt": now } }
    }] } });
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}

/// The device rule is the controller's: a pod the drain would not see as a
/// device user must not block the simulated swap either.
pub use ttdrv_core::drain::uses_device;

async fn play_agent(
    client: &Client,
    config: &SimAgentConfig,
    pod: &Pod,
    node_name: &str,
) -> anyhow::Result<()> {
    let mut agent = Agent::new(client, config, pod, node_name);
    tokio::time::sleep(config.work).await;
    loop {
        if let Flow::Finished = agent.pass().await? {
            return Ok(());
        }
    }
}

/// What the agent's loop does after one pass.
enum Flow {
    /// Look at the pod and the Node again.
    Again,
    /// The agent is done (Ready, stood down, or its pod is gone).
    Finished,
}

/// One installer pod's simulated agent: what it carries from one pass of
/// its loop to the next. Its async methods take `&mut self` even when they
/// only read: the Node watch is not `Sync`, so a `&Agent` held across an
/// await would make the agent's task not `Send`.
struct Agent<'a> {
    client: &'a Client,
    config: &'a SimAgentConfig,
    pod: &'a Pod,
    node_name: &'a str,
    nodes: Api<Node>,
    pods_ns: Api<Pod>,
    all_pods: Api<Pod>,
    name: String,
    target: String,
    restarts: i32,
    waiting: Option<String>,
    node_changes: Option<BoxStream<'static, Result<Node, watcher::Error>>>,
    /// The cycle whose swap this agent rolled back: its go-ahead opens no
    /// second swap (the real agent's swap record).
    rolled_back_in: Option<i64>,
    /// `onValidationFailure: hold`.
    hold: bool,
    /// The swap this agent goes through: (previous version, cycle).
    swapping_from: Option<(String, i64)>,
}

impl<'a> Agent<'a> {
    fn new(
        client: &'a Client,
        config: &'a SimAgentConfig,
        pod: &'a Pod,
        node_name: &'a str,
    ) -> Self {
        Self {
            client,
            config,
            pod,
            node_name,
            nodes: Api::all(client.clone()),
            pods_ns: Api::namespaced(client.clone(), &config.namespace),
            all_pods: Api::all(client.clone()),
            name: pod.metadata.name.clone().unwrap_or_default(),
            target: target_version(pod).unwrap_or_default(),
            restarts: 0,
            waiting: None,
            node_changes: None,
            rolled_back_in: None,
            swapping_from: None,
            hold: env_of(pod, labels::env::ON_VALIDATION_FAILURE).as_deref() == Some("hold"),
        }
    }

    /// One pass: read the pod and the Node, and do the next thing the real
    /// agent would.
    async fn pass(&mut self) -> anyhow::Result<Flow> {
        // The pod may have been deleted meanwhile (node drained again, CR changed).
        if !self.pod_is_current().await? {
            return Ok(Flow::Finished);
        }
        let node = self.nodes.get(self.node_name).await?;
        let ann = node.metadata.annotations.clone().unwrap_or_default();
        let node_labels = node.metadata.labels.clone().unwrap_or_default();
        if ann.get(FAIL_ANNOTATION).map(String::as_str) == Some("true") {
            tokio::time::sleep(Duration::from_millis(500)).await;
            return Ok(Flow::Again);
        }
        if env_of(self.pod, labels::env::UNMANAGE).as_deref() == Some("true") {
            return self.unload(&node).await;
        }
        let target = self.target.clone();
        let (mode, version) = match ann.get(HOST_MANAGED_ANNOTATION) {
            Some(v) => (labels::INSTALL_MODE_HOST, v.clone()),
            None => (labels::INSTALL_MODE_CONTAINER, target.clone()),
        };
        let hidden = ann.get(LOADED_ANNOTATION);
        if hidden.is_some() && !node_labels.contains_key(labels::KMD_VERSION) {
            self.report_hidden_module(hidden).await?;
            return Ok(Flow::Again);
        }
        let loaded = node_labels.get(labels::KMD_VERSION);
        if self.kubelet_refuses(&ann).await? {
            return Ok(Flow::Again);
        }
        // The module parameters: the pod's, and those in effect as the
        // node's annotation reports them (the real agent reads sysfs).
        let wanted = env_of(self.pod, labels::env::MODULE_PARAMETERS)
            .and_then(|s| module_params::parse(&s).ok())
            .unwrap_or_default();
        let in_effect = ttdrv_core::node::loaded_parameters(&node);
        let want = ttdrv_core::node::Target::new(&target, &wanted);
        let at_target = is_at_target(mode, loaded, in_effect.as_ref(), want);
        let swapping = mode == labels::INSTALL_MODE_CONTAINER && !target.is_empty() && !at_target;
        let fails_validation = ann.get(VALIDATION_FAILS_ANNOTATION) == Some(&target);
        if at_target && self.hold && fails_validation {
            self.fail_validation_held().await?;
            return Ok(Flow::Again);
        }
        // The controller's verdict on the swap this node went through.
        if at_target
            && mode == labels::INSTALL_MODE_CONTAINER
            && let Some((previous, cycle)) = verdict_on_swap(&ann)
        {
            let why = format!(
                "the scheduler did not see every card of the node after the swap (the controller's verdict on cycle {cycle}, {})",
                labels::ROLLBACK_VERDICT
            );
            self.fail_validation_after_load(Some(&previous), Some(cycle), &why)
                .await?;
            return Ok(Flow::Again);
        }
        if swapping && self.prepare(&ann, &node_labels, loaded.is_some()).await? {
            return Ok(Flow::Again);
        }
        if mode == labels::INSTALL_MODE_CONTAINER
            && loaded.is_some()
            && !at_target
            && self
                .swap(&node, want, loaded, in_effect.as_ref(), fails_validation)
                .await?
        {
            return Ok(Flow::Again);
        }
        let load = Load {
            mode,
            version,
            swapping,
            hidden: hidden.is_some(),
            wanted: &wanted,
        };
        self.report_loaded(&node, load).await
    }

    /// The pod is still there, the same one, and not being deleted.
    async fn pod_is_current(&mut self) -> anyhow::Result<bool> {
        Ok(match self.pods_ns.get_opt(&self.name).await? {
            Some(p) => {
                p.metadata.deletion_timestamp.is_none() && p.metadata.uid == self.pod.metadata.uid
            }
            None => false,
        })
    }

    /// The installer of a `spec.unmanage` policy ([`play_unload`]).
    async fn unload(&mut self, node: &Node) -> anyhow::Result<Flow> {
        let (progress, r) =
            play_unload(self.client, self.config, self.pod, node, self.restarts).await?;
        self.restarts = r;
        match progress {
            Unload::Done => {
                set_ready(&self.pods_ns, &self.name, self.pod).await?;
                return Ok(Flow::Finished);
            }
            // As the real agent: reported once, then idle, never Ready.
            Unload::StandDown => return Ok(Flow::Finished),
            Unload::Wait => {}
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        Ok(Flow::Again)
    }

    /// What is loaded, reported before anything else (the real agent
    /// reads sysfs at start).
    async fn report_hidden_module(&mut self, hidden: Option<&String>) -> anyhow::Result<()> {
        let patch = serde_json::json!({ "metadata": { "labels": {
            labels::KMD_VERSION: hidden,
            labels::INSTALL_MODE: labels::INSTALL_MODE_CONTAINER,
        } } });
        self.nodes
            .patch(
                self.node_name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        Ok(())
    }

    /// The kubelet does not get the agent running: an image that cannot be
    /// pulled, or an agent that crashes at once. True when it played that.
    async fn kubelet_refuses(
        &mut self,
        ann: &std::collections::BTreeMap<String, String>,
    ) -> anyhow::Result<bool> {
        if let Some(image) = pod_image(self.pod).filter(|i| i.contains(UNPULLABLE)) {
            // The kubelet's answer to an image that does not exist.
            set_waiting(
                &self.pods_ns,
                &self.name,
                self.pod,
                "ImagePullBackOff",
                &image,
            )
            .await?;
            tokio::time::sleep(Duration::from_millis(500)).await;
            return Ok(true);
        }
        if ann.get(CRASH_ANNOTATION).map(String::as_str) == Some("true") {
            self.restarts += 1;
            set_terminated(&self.pods_ns, &self.name, self.pod, self.restarts, "Error").await?;
            tokio::time::sleep(Duration::from_millis(500)).await;
            return Ok(true);
        }
        Ok(false)
    }

    /// Held: the restarted agent checks again, and fails again.
    async fn fail_validation_held(&mut self) -> anyhow::Result<()> {
        let target = &self.target;
        self.restarts += 1;
        let msg = reason::termination_message(
            reason::VALIDATION_FAILED,
            &format!(
                "tenstorrent {target} loaded but failed validation: 1 of 1 function(s) served before the swap are not served now: 0000:01:00.0 (simulated); not rolled back (onValidationFailure: hold)"
            ),
        );
        set_terminated(&self.pods_ns, &self.name, self.pod, self.restarts, &msg).await?;
        tokio::time::sleep(crash_loop_backoff(self.restarts)).await;
        Ok(())
    }

    /// The prepare step, before any go-ahead: build what the cache
    /// lacks, then say the node is prepared (the controller starts
    /// the disruptive cycle only then). True when the Node changed or the
    /// build failed: decide again.
    async fn prepare(
        &mut self,
        ann: &std::collections::BTreeMap<String, String>,
        node_labels: &std::collections::BTreeMap<String, String>,
        has_loaded: bool,
    ) -> anyhow::Result<bool> {
        let target = self.target.clone();
        let mut cached = cached_versions(ann);
        let mut changes = serde_json::Map::new();
        if !cached.contains(&target) {
            if self.build_fails().await? {
                return Ok(true);
            }
            cached.push(target.clone());
            let mut ann_set = serde_json::Map::new();
            ann_set.insert(CACHED_ANNOTATION.into(), cached.join(",").into());
            changes.insert("annotations".into(), ann_set.into());
        }
        if has_loaded && node_labels.get(labels::KMD_PREPARED).map(String::as_str) != Some(&target)
        {
            let mut l = serde_json::Map::new();
            l.insert(labels::KMD_PREPARED.into(), target.clone().into());
            changes.insert("labels".into(), l.into());
        }
        if !changes.is_empty() {
            let patch = serde_json::json!({ "metadata": changes });
            self.nodes
                .patch(
                    self.node_name,
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await?;
            // Decide on the Node as it is now.
            return Ok(true);
        }
        Ok(false)
    }

    /// Builds the target (simulated time); true when the build failed and
    /// the agent exited for it.
    async fn build_fails(&mut self) -> anyhow::Result<bool> {
        let target = self.target.clone();
        tokio::time::sleep(self.config.build).await;
        // Whether it fails is up to the node as it is when the build
        // ends: a fix made meanwhile (and a retry after it) is not
        // answered by one more failure.
        let after = self.nodes.get(self.node_name).await?;
        if ttdrv_core::node::annotation(&after, BUILD_FAIL_ANNOTATION) != Some(target.as_str()) {
            return Ok(false);
        }
        // As the real agent: it exits, the loaded module untouched,
        // and the kubelet restarts it (which builds again).
        self.restarts += 1;
        let msg = reason::termination_message(
            reason::BUILD_FAILED,
            &format!("make -C /lib/modules/sim/build: Error 2 (simulated build of {target})"),
        );
        set_terminated(&self.pods_ns, &self.name, self.pod, self.restarts, &msg).await?;
        // The kubelet's CrashLoopBackOff before the next attempt:
        // a retry made meanwhile finds this failure seconds old.
        tokio::time::sleep(crash_loop_backoff(self.restarts)).await;
        Ok(true)
    }

    /// A swap: only with the controller's go-ahead, decided as the real
    /// agent decides; refused while a pod holds the device; rolled back (or
    /// held) when the target fails validation. True when it did not go
    /// through: decide again.
    async fn swap(
        &mut self,
        node: &Node,
        want: ttdrv_core::node::Target<'_>,
        loaded: Option<&String>,
        in_effect: Option<&module_params::Values>,
        fails_validation: bool,
    ) -> anyhow::Result<bool> {
        let cycle = match self.go_ahead(node, want, loaded, in_effect) {
            Ok(cycle) => cycle,
            Err(why) => {
                self.wait_for_node_change(why).await;
                return Ok(true);
            }
        };
        // Refuse while any pod on the node still holds the device, as the
        // real agent does: it gives up and says why.
        if !self.config.holder_check_delay.is_zero() {
            tokio::time::sleep(self.config.holder_check_delay).await;
        }
        if let Some(holder) = device_holder(&self.all_pods, node).await? {
            self.restarts += 1;
            let msg = reason::termination_message(
                reason::DEVICE_BUSY,
                &format!("pid 4242 (sim) in pod {holder} holds /dev/tenstorrent/0"),
            );
            set_terminated(&self.pods_ns, &self.name, self.pod, self.restarts, &msg).await?;
            tokio::time::sleep(Duration::from_millis(500)).await;
            return Ok(true);
        }
        if fails_validation {
            let why = "1 of 1 function(s) served before the swap are not served now: 0000:01:00.0 (simulated)";
            self.fail_validation_after_load(loaded, cycle, why).await?;
            return Ok(true);
        }
        self.swapping_from = loaded.cloned().zip(cycle);
        Ok(false)
    }

    /// The go-ahead's cycle (none without a go-ahead to give), or why the agent waits (a cycle whose swap it
    /// rolled back opens no second one).
    fn go_ahead(
        &self,
        node: &Node,
        want: ttdrv_core::node::Target<'_>,
        loaded: Option<&String>,
        in_effect: Option<&module_params::Values>,
    ) -> Result<Option<i64>, String> {
        let target = &self.target;
        let policy = pod_policy(self.pod);
        let swap = go_ahead::decide(node, &policy, want, loaded.map(String::as_str), in_effect);
        match swap {
            go_ahead::Swap::GoAhead(go) if self.rolled_back_in == Some(go.cycle) => Err(format!(
                "the swap to {target} in this cycle failed validation and was rolled back"
            )),
            go_ahead::Swap::GoAhead(go) => Ok(Some(go.cycle)),
            go_ahead::Swap::Wait(why) => Err(why),
            go_ahead::Swap::FirstInstall | go_ahead::Swap::AlreadyLoaded => Ok(None),
        }
    }

    /// Until the Node changes (its own watch), or a while passes and the
    /// pod is read again.
    async fn wait_for_node_change(&mut self, why: String) {
        let node_name = self.node_name;
        if self.waiting.as_deref() != Some(why.as_str()) {
            tracing::info!(node = node_name, why, "sim-agent waiting");
            self.waiting = Some(why);
        }
        let nodes = self.nodes.clone();
        let changes = self.node_changes.get_or_insert_with(|| {
            let wc = watcher::Config::default().fields(&format!("metadata.name={node_name}"));
            watcher(nodes, wc)
                .default_backoff()
                .applied_objects()
                .boxed()
        });
        let _ = tokio::time::timeout(GO_AHEAD_RECHECK, changes.try_next()).await;
    }

    /// Loaded, failed validation: back to what was loaded (or held), and
    /// the agent gives up.
    async fn fail_validation_after_load(
        &mut self,
        loaded: Option<&String>,
        cycle: Option<i64>,
        problem: &str,
    ) -> anyhow::Result<()> {
        let target = self.target.clone();
        if !self.config.load.is_zero() {
            tokio::time::sleep(self.config.load).await;
        }
        let previous = loaded.cloned().unwrap_or_default();
        let (now, what) = if self.hold {
            (
                target.clone(),
                "not rolled back (onValidationFailure: hold)".to_string(),
            )
        } else {
            self.rolled_back_in = cycle;
            (
                previous.clone(),
                format!(
                    "rolled back: the previous version {previous} is loaded again from the cache"
                ),
            )
        };
        // The swap's record says it ended so.
        let patch = serde_json::json!({ "metadata": {
            "labels": {
                labels::KMD_VERSION: now,
                labels::KMD_PREPARED: null,
            },
            "annotations": { SWAP_ANNOTATION: null },
        } });
        self.nodes
            .patch(
                self.node_name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        self.restarts += 1;
        let msg = reason::termination_message(
            reason::VALIDATION_FAILED,
            &format!("tenstorrent {target} loaded but failed validation: {problem}; {what}"),
        );
        set_terminated(&self.pods_ns, &self.name, self.pod, self.restarts, &msg).await?;
        tokio::time::sleep(crash_loop_backoff(self.restarts)).await;
        Ok(())
    }

    /// The load is done: the Node's labels (and parameters) say so, and the
    /// pod turns Ready. A conflict (the controller changed the Node since
    /// the decision) decides again.
    async fn report_loaded(&mut self, node: &Node, load: Load<'_>) -> anyhow::Result<Flow> {
        let Load {
            mode,
            version,
            swapping,
            hidden,
            wanted,
        } = load;
        let mut set = serde_json::Map::new();
        set.insert(labels::KMD_VERSION.into(), version.into());
        set.insert(labels::INSTALL_MODE.into(), mode.into());
        let cards = node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(CARDS_ANNOTATION))
            .and_then(|c| c.parse::<u32>().ok())
            .unwrap_or(1);
        set.insert(labels::KMD_CARDS.into(), cards.to_string().into());
        if mode == labels::INSTALL_MODE_CONTAINER {
            set.insert(labels::TT_SMI_VERSION.into(), SIM_TT_SMI_VERSION.into());
        }
        // Written on the Node version the decision was made on: if the
        // controller changed it meanwhile (took the go-ahead back), decide
        // again. A load that takes time has happened once it is over, whatever
        // changed meanwhile: then the labels say so unconditionally.
        let mut resource_version = node.metadata.resource_version.clone();
        if swapping && !self.config.load.is_zero() {
            tokio::time::sleep(self.config.load).await;
            resource_version = None;
        }
        let mut patch = serde_json::json!({ "metadata": {
            "labels": set,
            "resourceVersion": resource_version,
        } });
        let mut annotations = serde_json::Map::new();
        if hidden {
            // The module loaded now is the one the labels say.
            annotations.insert(LOADED_ANNOTATION.into(), serde_json::Value::Null);
        }
        if swapping && let Some((previous, cycle)) = self.swapping_from.take() {
            annotations.insert(SWAP_ANNOTATION.into(), format!("{previous}@{cycle}").into());
        }
        if mode == labels::INSTALL_MODE_CONTAINER {
            // What the real agent reads back from sysfs after its load: the
            // defaults, with the pod's parameters in effect.
            let mut now = module_params::defaults();
            now.extend(wanted.clone());
            annotations.insert(
                labels::KMD_PARAMETERS.into(),
                module_params::canonical(&now).into(),
            );
        }
        if !annotations.is_empty() {
            patch["metadata"]["annotations"] = annotations.into();
        }
        match self
            .nodes
            .patch(
                self.node_name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => return Ok(Flow::Again),
            Err(e) => return Err(e.into()),
        }
        set_ready(&self.pods_ns, &self.name, self.pod).await?;
        Ok(Flow::Finished)
    }
}

/// What the agent loads, for [`Agent::report_loaded`].
struct Load<'a> {
    mode: &'static str,
    version: String,
    swapping: bool,
    /// A module was loaded unbeknownst to the labels ([`LOADED_ANNOTATION`]).
    hidden: bool,
    wanted: &'a module_params::Values,
}

/// The swap the node's [`SWAP_ANNOTATION`] records, (previous version,
/// cycle), when the controller's verdict names its cycle.
fn verdict_on_swap(ann: &std::collections::BTreeMap<String, String>) -> Option<(String, i64)> {
    let (previous, cycle) = ann.get(SWAP_ANNOTATION)?.rsplit_once('@')?;
    let cycle: i64 = cycle.parse().ok()?;
    (ann.get(labels::ROLLBACK_VERDICT)?.parse::<i64>().ok()? == cycle)
        .then(|| (previous.to_string(), cycle))
}

/// The target with its parameters is loaded; or (container installs) a
/// parameter the loaded target takes at run time is written in sysfs by
/// the real agent, without a reload or a go-ahead: at the target once the
/// annotation says so.
fn is_at_target(
    mode: &str,
    loaded: Option<&String>,
    in_effect: Option<&module_params::Values>,
    want: ttdrv_core::node::Target<'_>,
) -> bool {
    ttdrv_core::node::is_loaded(loaded.map(String::as_str), in_effect, want)
        || (mode == labels::INSTALL_MODE_CONTAINER
            && ttdrv_core::node::takes_at_run_time(loaded.map(String::as_str), in_effect, want))
}

/// The kubelet's wait before restarting a container that exited for the
/// `restarts`-th time: 10 s, doubling, at most 5 minutes.
fn crash_loop_backoff(restarts: i32) -> Duration {
    let doublings = u32::try_from(restarts.saturating_sub(1))
        .unwrap_or(0)
        .min(5);
    Duration::from_secs(10 * 2u64.pow(doublings)).min(Duration::from_secs(300))
}

/// Now, to the second, as the kubelet writes container times (truncated:
/// never later than the event).
fn now_seconds() -> anyhow::Result<String> {
    use k8s_openapi::jiff::{RoundMode, TimestampRound, Unit};
    Ok(k8s_openapi::jiff::Timestamp::now()
        .round(
            TimestampRound::new()
                .smallest(Unit::Second)
                .mode(RoundMode::Trunc),
        )?
        .to_string())
}

/// The versions in the node's simulated module cache.
fn cached_versions(ann: &std::collections::BTreeMap<String, String>) -> Vec<String> {
    ann.get(CACHED_ANNOTATION)
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// Plays the kubelet once the agent is done: the pod is Ready.
pub(crate) async fn set_ready(pods_ns: &Api<Pod>, name: &str, pod: &Pod) -> anyhow::Result<()> {
    let now = now_seconds()?;
    let containers: Vec<_> = pod
        .spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .map(|c| {
            serde_json::json!({
                "name": c.name, "image": c.image.clone().unwrap_or_default(), "imageID": "",
                "ready": true, "started": true, "restartCount": 0,
                "state": { "running": { "startedAt": now } }
            })
        })
        .collect();
    let cond =
        |t: &str| serde_json::json!({ "type": t, "status": "True", "lastTransitionTime": now });
    let status = serde_json::json!({ "status": {
        "phase": "Running",
        "startTime": now,
        "conditions": [cond("PodScheduled"), cond("Initialized"), cond("ContainersReady"), cond("Ready")],
        "containerStatuses": containers,
    }});
    pods_ns
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}

/// A pod on `node`, not an installer, that holds the device (the device-use
/// rules, a privileged container, a hostPath of /dev): not one on
/// the node's vfio-pci functions only (a VM holds /dev/vfio, not tt-kmd's
/// device), as the binder reports them on the Node (as just read).
async fn device_holder(all_pods: &Api<Pod>, node: &Node) -> anyhow::Result<Option<String>> {
    let node_name = node.metadata.name.as_deref().unwrap_or_default();
    let vfio = ttdrv_core::node::vfio_resources(node);
    let lp = ListParams::default().fields(&format!("spec.nodeName={node_name}"));
    Ok(all_pods
        .list(&lp)
        .await?
        .items
        .iter()
        .find(|p| {
            p.metadata.deletion_timestamp.is_none()
                && !matches!(
                    p.status.as_ref().and_then(|s| s.phase.as_deref()),
                    Some("Succeeded" | "Failed")
                )
                && !p
                    .metadata
                    .labels
                    .as_ref()
                    .is_some_and(|l| l.contains_key(labels::CLAIM))
                // A privileged pod or one with the host's /dev holds the
                // device too, as the telemetry collector and the
                // fabric-manager agent do (../shared/design/STACK.md).
                && p.spec.as_ref().is_some_and(ttdrv_core::drain::holds_device)
                && !ttdrv_core::drain::PodFacts::of(p).passthrough_only(&vfio)
        })
        .map(|p| {
            format!(
                "{}/{}",
                p.metadata.namespace.as_deref().unwrap_or(""),
                p.metadata.name.as_deref().unwrap_or("")
            )
        }))
}

/// How far the unload-only installer got.
enum Unload {
    Wait,
    Done,
    /// A DKMS host: reported once, then nothing.
    StandDown,
}

/// The installer of a `spec.unmanage` policy: nothing before the unload
/// go-ahead; then a DKMS host is reported and left alone; otherwise it unloads, gives up
/// (`DeviceBusy`, `UnloadError`) as the real agent does, and on success
/// removes the driver labels. Returns how far it got, and the restarts.
async fn play_unload(
    client: &Client,
    config: &SimAgentConfig,
    pod: &Pod,
    node: &Node,
    mut restarts: i32,
) -> anyhow::Result<(Unload, i32)> {
    let nodes: Api<Node> = Api::all(client.clone());
    let pods_ns: Api<Pod> = Api::namespaced(client.clone(), &config.namespace);
    let node_name = node.metadata.name.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let ann = node.metadata.annotations.clone().unwrap_or_default();
    let policy = pod_policy(pod);
    if let go_ahead::Unload::Wait(why) = go_ahead::decide_unload(node, &policy) {
        tracing::debug!(node = node_name, why, "sim-agent waiting to unload");
        return Ok((Unload::Wait, restarts));
    }
    // Nothing is written before the go-ahead (as the real agent).
    if let Some(v) = ann.get(HOST_MANAGED_ANNOTATION) {
        let patch = serde_json::json!({ "metadata": { "labels": {
            labels::KMD_VERSION: v,
            labels::INSTALL_MODE: labels::INSTALL_MODE_HOST,
        } } });
        nodes
            .patch(&node_name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        return Ok((Unload::StandDown, restarts));
    }
    let all_pods: Api<Pod> = Api::all(client.clone());
    let failure = if let Some(holder) = device_holder(&all_pods, node).await? {
        Some(reason::termination_message(
            reason::DEVICE_BUSY,
            &format!("pid 4242 (sim) in pod {holder} holds /dev/tenstorrent/0"),
        ))
    } else if ann.get(UNLOAD_FAIL_ANNOTATION).map(String::as_str) == Some("true") {
        Some(reason::termination_message(
            reason::UNLOAD_ERROR,
            "rmmod tenstorrent: Operation not permitted (simulated)",
        ))
    } else {
        None
    };
    if let Some(msg) = failure {
        restarts += 1;
        set_terminated(&pods_ns, &name, pod, restarts, &msg).await?;
        return Ok((Unload::Wait, restarts));
    }
    let patch = serde_json::json!({ "metadata": {
        "labels": {
            labels::KMD_VERSION: null,
            labels::INSTALL_MODE: null,
            labels::TT_SMI_VERSION: null,
        },
        "resourceVersion": node.metadata.resource_version,
    } });
    match nodes
        .patch(&node_name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok((Unload::Done, restarts)),
        // The Node changed since the decision: decide again.
        Err(kube::Error::Api(s)) if s.code == 409 => Ok((Unload::Wait, restarts)),
        Err(e) => Err(e.into()),
    }
}
