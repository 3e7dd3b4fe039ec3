//! What an installer pod's status says about the agent in it: why it is
//! unhealthy (for messages), and whether it has failed for good — the image
//! cannot be pulled, the container crash-loops, or the agent gave up and said
//! why in its termination message. The node then fails within about a
//! minute with that cause, instead of at the upgrade deadline.

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};

use crate::reason;

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

/// The installer has failed for good, with its cause. A pod being deleted
/// has failed nothing: it is on its way out.
pub fn failure(pod: &Pod) -> Option<Failure> {
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
        if cs.restart_count >= CRASH_LOOP_RESTARTS {
            return Some(Failure {
                reason: reason::INSTALLER_CRASH_LOOP,
                message: format!(
                    "installer restarted {} times: {}",
                    cs.restart_count,
                    problem(pod).unwrap_or_default()
                ),
                pod_created,
                terminated_at,
            });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateTerminated, ContainerStateWaiting, PodStatus,
    };

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
        let f = failure(&pod(waiting("ImagePullBackOff", 0))).expect("failure");
        assert_eq!(f.reason, reason::INSTALLER_IMAGE_PULL);
        assert!(f.message.contains("reg/agent:1"), "{}", f.message);
        assert_eq!(failure(&pod(waiting("ContainerCreating", 0))), None);
        let f = failure(&pod(terminated_last(
            "DeviceBusy: pid 42 (python) in pod ml/train-0",
            1,
        )))
        .expect("failure");
        assert_eq!(f.reason, reason::DEVICE_BUSY);
        assert!(f.message.contains("pid 42"), "{}", f.message);
        assert_eq!(failure(&pod(terminated_last("Error", 2))), None);
        let f = failure(&pod(terminated_last("Error", 3))).expect("failure");
        assert_eq!(f.reason, reason::INSTALLER_CRASH_LOOP);
        assert!(f.message.contains("3 times"), "{}", f.message);
        assert_eq!(failure(&Pod::default()), None);
    }
}
