//! What an installer pod's status says about the agent in it: why it is
//! unhealthy (for messages), and whether it has failed for good — the image
//! cannot be pulled, the container crash-loops, or the agent gave up and said
//! why in its termination message. The node then fails within about a
//! minute with that cause, instead of at the upgrade deadline.
//!
//! A crash loop is counted in the pod's current sandbox: a DaemonSet pod
//! survives its node's reboots, and every reboot restarts its containers and
//! counts a restart. The controller keeps, per installer pod, the restart
//! counts it saw when the current sandbox appeared ([`SandboxBaseline`]);
//! only restarts beyond them count.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use ttdrv_api::{labels, module_params};

use crate::reason;

/// The target the installer DaemonSet deploys (its installer container's
/// `TT_KMD_VERSION` and `TT_KMD_MODULE_PARAMETERS`): what a node in a cycle
/// gets, whatever the policy says now. A refused spec leaves the DaemonSet
/// as the last accepted one set it, so cycles under way go on towards this,
/// not towards the refused version. `None` without a DaemonSet or a version.
pub fn deployed_target(ds: Option<&DaemonSet>) -> Option<(String, module_params::Values)> {
    let containers = &ds?.spec.as_ref()?.template.spec.as_ref()?.containers;
    let installer = containers
        .iter()
        .find(|c| c.name == labels::INSTALLER_CONTAINER)?;
    let env = installer
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.as_str(), e.value.as_deref().unwrap_or_default()));
    let mut version = None;
    let mut parameters = module_params::Values::default();
    for (name, value) in env {
        match name {
            labels::env::TT_KMD_VERSION => version = Some(value.to_string()),
            // Written canonical by the controller; unreadable means none.
            labels::env::MODULE_PARAMETERS => {
                parameters = module_params::parse(value).unwrap_or_default();
            }
            _ => {}
        }
    }
    version.filter(|v| !v.is_empty()).map(|v| (v, parameters))
}

/// Whether an installer pod deleted now comes back on the current template
/// (`hash`): the DaemonSet carries it and the DaemonSet controller has
/// observed that generation. Until then (a controller-manager that lags, as
/// after an API-server outage) a replacement would come back on the old
/// template, be replaced again, and so on at API speed; the controller waits.
pub fn template_observed(ds: Option<&DaemonSet>, hash: &str) -> bool {
    let Some(ds) = ds else {
        return false;
    };
    let carries = ds
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(labels::TEMPLATE_HASH))
        .is_some_and(|h| h == hash && !hash.is_empty());
    let observed = ds.status.as_ref().and_then(|s| s.observed_generation);
    carries
        && match (observed, ds.metadata.generation) {
            (Some(o), Some(g)) => o >= g,
            // A server that does not count generations: nothing to wait for.
            (_, None) => true,
            (None, Some(_)) => false,
        }
}

/// Restarts after which a crashing installer fails its node (the Go
/// operator's threshold).
pub const CRASH_LOOP_RESTARTS: i32 = 3;

/// Waiting reasons of a container whose image will not come.
const IMAGE_PULL: &[&str] = &[
    "ImagePullBackOff",
    "ErrImagePull",
    "InvalidImageName",
    "ErrImageNeverPull",
];

/// A failed installer: the reason (one of [`reason::FAILURES`]) and the words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub reason: &'static str,
    pub message: String,
    /// When the failed pod was created (Unix seconds): a pod from before the
    /// node's cycle is about to be replaced, and its failures are not the
    /// cycle's.
    pub pod_created: Option<i64>,
    /// When the container terminated with the failure (Unix seconds, the
    /// kubelet's clock), if it did: a pod kept across the start of a cycle
    /// (built ahead) carries failures from before it that are not the
    /// cycle's.
    pub terminated_at: Option<i64>,
}

impl Failure {
    /// When the failure happened, as far as the pod says: its termination,
    /// else the pod's creation.
    pub fn at(&self) -> Option<i64> {
        self.terminated_at.or(self.pod_created)
    }
}

/// When the pod was created (Unix seconds).
pub fn created(pod: &Pod) -> Option<i64> {
    pod.metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0.as_second())
}

fn statuses(pod: &Pod) -> impl Iterator<Item = &ContainerStatus> {
    pod.status
        .as_ref()
        .into_iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
}

/// Why the installer pod is unhealthy, for messages.
pub fn problem(pod: &Pod) -> Option<String> {
    for cs in statuses(pod) {
        if let Some(t) = cs.last_state.as_ref().and_then(|s| s.terminated.as_ref()) {
            return Some(format!(
                "restarted {} time(s), last exit {}: {}",
                cs.restart_count,
                t.exit_code,
                t.message.clone().or(t.reason.clone()).unwrap_or_default()
            ));
        }
        if let Some(w) = cs.state.as_ref().and_then(|s| s.waiting.as_ref()) {
            return Some(format!("waiting: {}", w.reason.clone().unwrap_or_default()));
        }
    }
    None
}

/// The restart counts of an installer pod's containers when its current
/// sandbox appeared: restarts up to them are not crashes of this sandbox.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SandboxBaseline {
    /// When the sandbox started (Unix seconds, the kubelet's clock): the
    /// pod's `PodReadyToStartContainers` transition to True.
    pub since: i64,
    /// (container, restart count) at that point; a container not listed
    /// counts from 0.
    pub restarts: Vec<(String, i32)>,
}

impl SandboxBaseline {
    fn of(&self, container: &str) -> i32 {
        self.restarts
            .iter()
            .find(|(c, _)| c == container)
            .map_or(0, |(_, n)| *n)
    }
}

/// A sandbox that started within this long of the pod is the pod's first:
/// its containers have not run anywhere before it.
const FIRST_SANDBOX_SECONDS: i64 = 120;

/// When the pod's current sandbox started (Unix seconds), if the kubelet
/// says (`PodReadyToStartContainers`, Kubernetes 1.29 and later).
pub fn sandbox_since(pod: &Pod) -> Option<i64> {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .find(|c| c.type_ == "PodReadyToStartContainers" && c.status == "True")
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0.as_second())
}

/// The baseline of `pod`'s current sandbox, given the one kept for the pod
/// so far (`known`). The same sandbox keeps its baseline. The pod's first
/// sandbox counts from 0. A later sandbox seen for the first time counts
/// from the restarts it shows now: a reboot's restart is not a crash, and a
/// controller that starts while a pod crash-loops in a later sandbox fails
/// it after three more crashes (later, never sooner; the upgrade deadline
/// still holds). `None` when the kubelet does not say when the sandbox
/// started: every restart counts then.
pub fn baseline(pod: &Pod, known: Option<&SandboxBaseline>) -> Option<SandboxBaseline> {
    let since = sandbox_since(pod)?;
    if let Some(k) = known.filter(|k| k.since == since) {
        return Some(k.clone());
    }
    let started = pod
        .status
        .as_ref()
        .and_then(|s| s.start_time.as_ref())
        .map(|t| t.0.as_second());
    let first = started.is_some_and(|t| since <= t + FIRST_SANDBOX_SECONDS);
    let restarts = if first {
        vec![]
    } else {
        // A container yet to start in this sandbox comes back with one more
        // restart, the reboot's.
        statuses(pod)
            .map(|cs| {
                let to_come = i32::from(!started_since(cs, since));
                (cs.name.clone(), cs.restart_count + to_come)
            })
            .collect()
    };
    Some(SandboxBaseline { since, restarts })
}

/// The container's latest start was at or after `since`.
fn started_since(cs: &ContainerStatus, since: i64) -> bool {
    let state = cs.state.as_ref();
    state
        .and_then(|s| s.running.as_ref())
        .and_then(|r| r.started_at.as_ref())
        .or_else(|| {
            state
                .and_then(|s| s.terminated.as_ref())
                .or_else(|| cs.last_state.as_ref().and_then(|s| s.terminated.as_ref()))
                .and_then(|t| t.started_at.as_ref())
        })
        .is_some_and(|t| t.0.as_second() >= since)
}

/// The installer has failed for good, with its cause. A pod being deleted
/// has failed nothing: it is on its way out. `baseline` is the pod's current
/// sandbox's ([`baseline`]); without one every restart counts.
pub fn failure(pod: &Pod, baseline: Option<&SandboxBaseline>) -> Option<Failure> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let pod_created = pod
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0.as_second());
    for cs in statuses(pod) {
        let state = cs.state.as_ref();
        let waiting = state.and_then(|s| s.waiting.as_ref());
        if let Some(w) = waiting
            && let Some(why) = w.reason.as_deref().filter(|r| IMAGE_PULL.contains(r))
        {
            return Some(Failure {
                reason: reason::INSTALLER_IMAGE_PULL,
                message: format!(
                    "installer image {} cannot be pulled ({why}): {}",
                    cs.image,
                    w.message.as_deref().unwrap_or("")
                ),
                pod_created,
                terminated_at: None,
            });
        }
        // The agent's own words, from its current or last termination.
        let terminated = state
            .and_then(|s| s.terminated.as_ref())
            .or_else(|| cs.last_state.as_ref().and_then(|s| s.terminated.as_ref()));
        let terminated_at = terminated
            .and_then(|t| t.finished_at.as_ref())
            .map(|t| t.0.as_second());
        if let Some((why, words)) = terminated
            .and_then(|t| t.message.as_deref())
            .and_then(reason::from_termination_message)
        {
            return Some(Failure {
                reason: why,
                message: format!("the agent gave up: {words}"),
                pod_created,
                terminated_at,
            });
        }
        let before = baseline
            .filter(|b| Some(b.since) == sandbox_since(pod))
            .map_or(0, |b| b.of(&cs.name));
        let crashes = cs.restart_count - before;
        if crashes >= CRASH_LOOP_RESTARTS && crashing_now(pod, cs) {
            return Some(Failure {
                reason: reason::INSTALLER_CRASH_LOOP,
                message: if before > 0 {
                    format!(
                        "installer restarted {crashes} times since its sandbox started ({} in all, the others before it): {}",
                        cs.restart_count,
                        problem(pod).unwrap_or_default()
                    )
                } else {
                    format!(
                        "installer restarted {} times: {}",
                        cs.restart_count,
                        problem(pod).unwrap_or_default()
                    )
                },
                pod_created,
                terminated_at,
            });
        }
    }
    None
}

/// The reason the runtime gives a container it lost with its node (a
/// reboot, a power cut): containerd reports it exited 255, "Unknown".
const LOST_WITH_THE_NODE: &str = "Unknown";

/// The container is down now after a crash of its own in its current
/// sandbox. A node's reboot restarts every container of its pods in a new
/// sandbox and counts that as a restart: on a node that reboots now and
/// then, a DaemonSet pod's restart count only grows. Those restarts are not
/// a crash loop, and neither is a container that runs again after its
/// restarts.
fn crashing_now(pod: &Pod, cs: &ContainerStatus) -> bool {
    if cs.state.as_ref().is_some_and(|s| s.running.is_some()) {
        return false;
    }
    let Some(last) = cs
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .or_else(|| cs.last_state.as_ref().and_then(|s| s.terminated.as_ref()))
    else {
        // restarted, and waiting without a known exit: say so only once
        // its exit is known
        return false;
    };
    if last.reason.as_deref() == Some(LOST_WITH_THE_NODE) {
        return false;
    }
    // Ran in a sandbox from before the current one: the node went away
    // under it (when the pod says when its current sandbox started).
    match (sandbox_since(pod), last.started_at.as_ref()) {
        (Some(sandbox), Some(started)) => started.0.as_second() >= sandbox,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_deployed_target_is_read_from_the_installer_container() {
        let ds = |env: serde_json::Value| -> DaemonSet {
            serde_json::from_value(serde_json::json!({
                "metadata": { "name": "ttdrv-fleet" },
                "spec": {
                    "selector": {},
                    "template": { "spec": { "containers": [
                        { "name": "pause", "env": [{ "name": "TT_KMD_VERSION", "value": "0.0.0" }] },
                        { "name": "installer", "env": env }
                    ] } }
                }
            }))
            .expect("a DaemonSet")
        };
        // The installer container's, not another's.
        let plain = ds(serde_json::json!([{ "name": "TT_KMD_VERSION", "value": "2.8.0" }]));
        assert_eq!(
            deployed_target(Some(&plain)),
            Some(("2.8.0".into(), module_params::Values::new()))
        );
        let with_params = ds(serde_json::json!([
            { "name": "TT_KMD_VERSION", "value": "2.9.0" },
            { "name": "TT_KMD_MODULE_PARAMETERS", "value": "auto_reset_timeout=5" }
        ]));
        let (v, p) = deployed_target(Some(&with_params)).expect("a target");
        assert_eq!(
            (v.as_str(), p.get("auto_reset_timeout").map(String::as_str)),
            ("2.9.0", Some("5"))
        );
        let empty = ds(serde_json::json!([{ "name": "TT_KMD_VERSION", "value": "" }]));
        assert_eq!(deployed_target(Some(&empty)), None, "no version");
        assert_eq!(deployed_target(None), None);
    }

    #[test]
    fn a_template_counts_as_observed_once_the_daemonset_controller_saw_it() {
        use k8s_openapi::api::apps::v1::DaemonSetStatus;
        let ds = |hash: &str, generation: i64, observed: Option<i64>| {
            let mut d = DaemonSet::default();
            d.metadata.annotations =
                Some([(labels::TEMPLATE_HASH.to_string(), hash.to_string())].into());
            d.metadata.generation = Some(generation);
            d.status = observed.map(|o| DaemonSetStatus {
                observed_generation: Some(o),
                ..Default::default()
            });
            d
        };
        assert!(template_observed(Some(&ds("h2", 2, Some(2))), "h2"));
        assert!(
            !template_observed(Some(&ds("h2", 2, Some(1))), "h2"),
            "lags"
        );
        assert!(
            !template_observed(Some(&ds("h2", 2, None)), "h2"),
            "no status yet"
        );
        assert!(
            !template_observed(Some(&ds("h1", 1, Some(1))), "h2"),
            "our cache is behind"
        );
        assert!(!template_observed(None, "h2"));
        assert!(!template_observed(Some(&ds("", 1, Some(1))), ""));
    }

    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateTerminated, ContainerStateWaiting, PodStatus,
    };

    /// Without a baseline: every restart counts.
    fn failure_of(p: &Pod) -> Option<Failure> {
        failure(p, None)
    }

    fn pod(cs: ContainerStatus) -> Pod {
        Pod {
            status: Some(PodStatus {
                container_statuses: Some(vec![cs]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn waiting(reason: &str, restarts: i32) -> ContainerStatus {
        ContainerStatus {
            image: "reg/agent:1".into(),
            restart_count: restarts,
            state: Some(ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some(reason.into()),
                    message: Some("not found".into()),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn terminated_last(message: &str, restarts: i32) -> ContainerStatus {
        ContainerStatus {
            restart_count: restarts,
            last_state: Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: 1,
                    message: Some(message.into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn causes() {
        let f = failure_of(&pod(waiting("ImagePullBackOff", 0))).expect("failure");
        assert_eq!(f.reason, reason::INSTALLER_IMAGE_PULL);
        assert!(f.message.contains("reg/agent:1"), "{}", f.message);
        assert_eq!(failure_of(&pod(waiting("ContainerCreating", 0))), None);
        let f = failure_of(&pod(terminated_last(
            "DeviceBusy: pid 42 (python) in pod ml/train-0",
            1,
        )))
        .expect("failure");
        assert_eq!(f.reason, reason::DEVICE_BUSY);
        assert!(f.message.contains("pid 42"), "{}", f.message);
        assert_eq!(failure_of(&pod(terminated_last("Error", 2))), None);
        let f = failure_of(&pod(terminated_last("Error", 3))).expect("failure");
        assert_eq!(f.reason, reason::INSTALLER_CRASH_LOOP);
        assert!(f.message.contains("3 times"), "{}", f.message);
        assert_eq!(failure_of(&Pod::default()), None);
    }

    fn time(s: &str) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(s.parse().expect("a timestamp"))
    }

    /// The installer pod of a node that rebooted four times at rest, as the
    /// VM node's kubelet reported it (a new sandbox at the last boot, the
    /// container running and Ready there).
    fn after_reboots() -> Pod {
        use k8s_openapi::api::core::v1::{ContainerStateRunning, PodCondition};
        let mut p = pod(ContainerStatus {
            name: "installer".into(),
            restart_count: 4,
            ready: true,
            state: Some(ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: Some(time("2026-12-05T10:33:41Z")),
                }),
                ..Default::default()
            }),
            last_state: Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: 255,
                    reason: Some("Unknown".into()),
                    message: Some("Error on reading termination message from logs: lstat /var/log/pods/x/installer/3.log: no such file or directory".into()),
                    started_at: Some(time("2026-12-05T10:32:52Z")),
                    finished_at: Some(time("2026-12-05T10:33:27Z")),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        if let Some(st) = p.status.as_mut() {
            st.conditions = Some(vec![PodCondition {
                type_: "PodReadyToStartContainers".into(),
                status: "True".into(),
                last_transition_time: Some(time("2026-12-05T10:33:41Z")),
                ..Default::default()
            }]);
        }
        p
    }

    fn set_container(p: &mut Pod, f: impl FnOnce(&mut ContainerStatus)) {
        if let Some(cs) = p
            .status
            .as_mut()
            .and_then(|s| s.container_statuses.as_mut())
            .and_then(|c| c.first_mut())
        {
            f(cs);
        }
    }

    /// [`after_reboots`] just back from a reboot, its container not started
    /// in the new sandbox yet.
    fn back_not_started() -> Pod {
        let mut p = after_reboots();
        set_container(&mut p, |cs| {
            cs.ready = false;
            cs.state = Some(ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some("ContainerCreating".into()),
                    message: None,
                }),
                ..Default::default()
            });
        });
        p
    }

    #[test]
    fn restarts_by_reboots_are_not_a_crash_loop() {
        let p = after_reboots();
        assert_eq!(failure_of(&p), None, "running and Ready after 4 reboots");
        // just back from a reboot, not started yet: the last exit is the
        // node's going away
        let mut p = back_not_started();
        assert_eq!(failure_of(&p), None, "waiting after a reboot");
        // an exit of its own, but in the sandbox from before the reboot
        set_container(&mut p, |cs| {
            if let Some(t) = cs.last_state.as_mut().and_then(|s| s.terminated.as_mut()) {
                t.reason = Some("Error".into());
                t.exit_code = 1;
            }
        });
        assert_eq!(failure_of(&p), None, "a crash before the reboot");
    }

    /// [`after_reboots`] after `restarts` restarts in all, crashed in the
    /// current sandbox and backing off.
    fn crashed(restarts: i32) -> Pod {
        let mut p = after_reboots();
        set_container(&mut p, |cs| {
            cs.ready = false;
            cs.restart_count = restarts;
            cs.state = Some(ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some("CrashLoopBackOff".into()),
                    message: Some("back-off 40s restarting failed container".into()),
                }),
                ..Default::default()
            });
            cs.last_state = Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: 101,
                    reason: Some("Error".into()),
                    started_at: Some(time("2026-12-05T10:35:00Z")),
                    finished_at: Some(time("2026-12-05T10:35:02Z")),
                    ..Default::default()
                }),
                ..Default::default()
            });
        });
        p
    }

    #[test]
    fn crashes_after_reboots_are_a_crash_loop_from_the_third_in_the_sandbox() {
        // taken when the sandbox appeared: 4 restarts, all by reboots
        let seen = baseline(&after_reboots(), None).expect("a sandbox");
        assert_eq!(seen.restarts, vec![("installer".to_string(), 4)]);
        for n in [5, 6] {
            assert_eq!(
                failure(&crashed(n), Some(&seen)),
                None,
                "{} crash(es) in the sandbox",
                n - 4
            );
        }
        let f = failure(&crashed(7), Some(&seen)).expect("three crashes in the sandbox");
        assert_eq!(f.reason, reason::INSTALLER_CRASH_LOOP);
        assert!(
            f.message
                .contains("restarted 3 times since its sandbox started (7 in all"),
            "{}",
            f.message
        );
        assert!(f.message.contains("last exit 101"), "{}", f.message);
        // the same sandbox keeps its baseline
        assert_eq!(baseline(&crashed(7), Some(&seen)), Some(seen.clone()));
        // without a baseline every restart counts: one crash would do
        assert!(failure(&crashed(5), None).is_some());
        // running again after its crashes: no loop (until it crashes again)
        let mut p = crashed(7);
        set_container(&mut p, |cs| {
            cs.state = after_reboots()
                .status
                .and_then(|s| s.container_statuses)
                .and_then(|c| c.into_iter().next())
                .and_then(|c| c.state);
        });
        assert_eq!(failure(&p, Some(&seen)), None, "running again");
    }

    #[test]
    fn a_pods_first_sandbox_counts_every_restart() {
        let mut p = crashed(3);
        if let Some(st) = p.status.as_mut() {
            st.start_time = Some(time("2026-12-05T10:33:30Z"));
        }
        let b = baseline(&p, None).expect("a sandbox");
        assert_eq!(b.restarts, vec![], "the first sandbox counts from 0");
        let f = failure(&p, Some(&b)).expect("three crashes");
        assert_eq!(f.reason, reason::INSTALLER_CRASH_LOOP);
        assert!(
            f.message.starts_with("installer restarted 3 times: "),
            "{}",
            f.message
        );
    }

    #[test]
    fn a_new_sandbox_takes_a_new_baseline() {
        let old = SandboxBaseline {
            since: time("2026-12-05T09:00:00Z").0.as_second(),
            restarts: vec![("installer".into(), 1)],
        };
        let now = baseline(&after_reboots(), Some(&old)).expect("a sandbox");
        assert_eq!(now.since, time("2026-12-05T10:33:41Z").0.as_second());
        assert_eq!(now.restarts, vec![("installer".to_string(), 4)]);
        // seen before the container's start in the new sandbox: the start
        // to come is the reboot's restart, not a crash
        let mut p = back_not_started();
        set_container(&mut p, |cs| cs.restart_count = 3);
        let early = baseline(&p, Some(&old)).expect("a sandbox");
        assert_eq!(early.restarts, vec![("installer".to_string(), 4)]);
        // no sandbox said: no baseline, every restart counts
        assert_eq!(baseline(&pod(terminated_last("Error", 3)), None), None);
    }
}
