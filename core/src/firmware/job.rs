//! The flash Job of one node, free of I/O: what the controller creates
//! ([`flash_job`]) and what it reads back ([`state`]). The Job is the Go
//! operator's (its name, labels, deadline, no retries, a day's TTL, the
//! privileged flasher on the node's host network, `/sys` and hugepages from
//! the host), with the bundle fetched by the flasher image itself (no
//! third-party curl image) and the flasher's report as its termination
//! message.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, EnvVar, HostPathVolumeSource, Pod, PodSpec,
    PodTemplateSpec, SecurityContext, Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use ttdrv_api::firmware::flasher::{self, Report};
use ttdrv_api::firmware::{TenstorrentFirmwarePolicy, job_labels, job_name_for};

use super::FlashJob;

/// What the chart gives every flash Job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobDefaults {
    pub namespace: String,
    pub image: String,
    pub pull_policy: String,
    /// A host directory the flasher simulates its host in (tests and demos):
    /// mounted at the same path, named in `TTDRV_FLASH_SIMULATE`.
    pub simulate_dir: Option<String>,
}

/// Seconds a finished flash Job is kept (its logs with it): the Go operator's day.
pub const TTL_SECONDS: i32 = 86_400;

fn env(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..Default::default()
    }
}

/// The flash Job of `node` for `policy`'s version, its `attempt`-th retry.
pub fn flash_job(p: &TenstorrentFirmwarePolicy, node: &str, attempt: u32, d: &JobDefaults) -> Job {
    let policy = p.metadata.name.clone().unwrap_or_default();
    let spec = &p.spec;
    let f = spec.flasher();
    let labels: BTreeMap<String, String> = job_labels(&policy, node, &spec.version);
    let image = f
        .image
        .clone()
        .filter(|i| !i.is_empty())
        .unwrap_or_else(|| d.image.clone());
    let pull = f
        .image_pull_policy
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| d.pull_policy.clone());
    let owner = p.metadata.uid.clone().map(|uid| OwnerReference {
        api_version: "firmware.tenstorrent.com/v1alpha1".into(),
        kind: "TenstorrentFirmwarePolicy".into(),
        name: policy.clone(),
        uid,
        controller: Some(true),
        block_owner_deletion: Some(true),
    });
    let PodParts {
        fetch_env,
        flash_env,
        fetch_mounts,
        flash_mounts,
        volumes,
    } = pod_parts(p, d);
    Job {
        metadata: ObjectMeta {
            name: Some(job_name_for(&policy, node, &spec.version, attempt)),
            namespace: Some(d.namespace.clone()),
            labels: Some(labels.clone()),
            owner_references: owner.map(|o| vec![o]),
            ..Default::default()
        },
        spec: Some(JobSpec {
            backoff_limit: Some(0),
            active_deadline_seconds: Some(spec.upgrade_policy.flash_timeout_seconds),
            ttl_seconds_after_finished: Some(TTL_SECONDS),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    restart_policy: Some("Never".into()),
                    host_network: Some(true),
                    node_name: Some(node.into()),
                    tolerations: Some(vec![Toleration {
                        operator: Some("Exists".into()),
                        ..Default::default()
                    }]),
                    init_containers: Some(vec![Container {
                        name: "fetch-bundle".into(),
                        image: Some(image.clone()),
                        image_pull_policy: Some(pull.clone()),
                        args: Some(vec!["fetch".into()]),
                        env: Some(fetch_env),
                        termination_message_path: Some(flasher::REPORT_PATH.into()),
                        termination_message_policy: Some("FallbackToLogsOnError".into()),
                        volume_mounts: Some(fetch_mounts),
                        ..Default::default()
                    }]),
                    containers: vec![Container {
                        name: "flash".into(),
                        image: Some(image),
                        image_pull_policy: Some(pull),
                        args: Some(vec!["flash".into()]),
                        env: Some(flash_env),
                        security_context: Some(SecurityContext {
                            privileged: Some(true),
                            capabilities: Some(Capabilities {
                                add: Some(vec!["SYS_RAWIO".into(), "SYS_ADMIN".into()]),
                                drop: None,
                            }),
                            ..Default::default()
                        }),
                        termination_message_path: Some(flasher::REPORT_PATH.into()),
                        termination_message_policy: Some("FallbackToLogsOnError".into()),
                        volume_mounts: Some(flash_mounts),
                        ..Default::default()
                    }],
                    volumes: Some(volumes),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// What the flash pod's two containers get: the environment and mounts of
/// `fetch-bundle` (the init container) and of `flash`, and the pod's volumes.
struct PodParts {
    fetch_env: Vec<EnvVar>,
    flash_env: Vec<EnvVar>,
    fetch_mounts: Vec<VolumeMount>,
    flash_mounts: Vec<VolumeMount>,
    volumes: Vec<Volume>,
}

fn pod_parts(p: &TenstorrentFirmwarePolicy, d: &JobDefaults) -> PodParts {
    let spec = &p.spec;
    let f = spec.flasher();
    let bool_env = |b: bool| if b { "true" } else { "false" };
    let work = VolumeMount {
        name: "work".into(),
        mount_path: "/work".into(),
        ..Default::default()
    };
    let bundle_path = "/work/bundle.fwbundle";
    let host_path = |name: &str, path: &str| Volume {
        name: name.into(),
        host_path: Some(HostPathVolumeSource {
            path: path.into(),
            type_: None,
        }),
        ..Default::default()
    };
    // The report always lands where the kubelet reads termination messages.
    let mut fetch_env = vec![
        env(flasher::ENV_BUNDLE_URL, spec.bundle()),
        env(flasher::ENV_BUNDLE_PATH, bundle_path),
        env(flasher::ENV_VERSION, spec.version.clone()),
        env(flasher::ENV_REPORT, flasher::REPORT_PATH),
    ];
    if let Some(sum) = spec.bundle_sha256.as_deref().filter(|s| !s.is_empty()) {
        fetch_env.push(env(flasher::ENV_BUNDLE_SHA256, sum));
    }
    let mut flash_env = vec![
        env(flasher::ENV_REPORT, flasher::REPORT_PATH),
        env(flasher::ENV_BUNDLE_PATH, bundle_path),
        env(flasher::ENV_VERSION, spec.version.clone()),
        env(flasher::ENV_READBACK, spec.readback()),
        env(
            flasher::ENV_FLASH_ARGS,
            if f.force_write { "--force" } else { "" },
        ),
        env(flasher::ENV_FORCE_WRITE, bool_env(f.force_write)),
        env(
            flasher::ENV_CONTINUE_ON_READBACK_FAILURE,
            bool_env(f.continue_on_readback_failure),
        ),
        env(
            flasher::ENV_HOMOGENIZE,
            bool_env(f.homogenize_firmware_versions),
        ),
    ];
    let mut fetch_mounts = vec![work.clone()];
    let mut flash_mounts = vec![
        VolumeMount {
            read_only: Some(true),
            ..work.clone()
        },
        VolumeMount {
            name: "hugepages".into(),
            mount_path: "/dev/hugepages".into(),
            ..Default::default()
        },
        VolumeMount {
            name: "sys".into(),
            mount_path: "/sys".into(),
            ..Default::default()
        },
    ];
    let mut volumes = vec![
        Volume {
            name: "work".into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        },
        host_path("hugepages", "/dev/hugepages"),
        host_path("sys", "/sys"),
    ];
    if let Some(dir) = d.simulate_dir.as_deref().filter(|d| !d.is_empty()) {
        for e in [&mut fetch_env, &mut flash_env] {
            e.push(env(flasher::ENV_SIMULATE, dir));
        }
        let mount = VolumeMount {
            name: "simulate".into(),
            mount_path: dir.into(),
            ..Default::default()
        };
        fetch_mounts.push(mount.clone());
        flash_mounts.push(mount);
        volumes.push(Volume {
            name: "simulate".into(),
            host_path: Some(HostPathVolumeSource {
                path: dir.into(),
                type_: Some("DirectoryOrCreate".into()),
            }),
            ..Default::default()
        });
    }
    PodParts {
        fetch_env,
        flash_env,
        fetch_mounts,
        flash_mounts,
        volumes,
    }
}

/// The flasher's report from its pod's termination message, if it left one:
/// the `flash` container's, else the `fetch-bundle` init container's (a
/// bundle that could not be fetched).
pub fn report(pod: &Pod) -> Option<Report> {
    let status = pod.status.as_ref()?;
    let of = |name: &str, list: Option<&Vec<k8s_openapi::api::core::v1::ContainerStatus>>| {
        list?
            .iter()
            .find(|c| c.name == name)?
            .state
            .as_ref()?
            .terminated
            .as_ref()?
            .message
            .as_deref()
            .and_then(|m| serde_json::from_str::<Report>(m.trim()).ok())
    };
    of("flash", status.container_statuses.as_ref())
        .or_else(|| of("fetch-bundle", status.init_container_statuses.as_ref()))
}

/// A container of the pod waits on its image.
fn image_pull_failed(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    let all = status
        .and_then(|s| s.init_container_statuses.as_ref())
        .into_iter()
        .flatten()
        .chain(
            status
                .and_then(|s| s.container_statuses.as_ref())
                .into_iter()
                .flatten(),
        );
    all.filter_map(|c| c.state.as_ref()?.waiting.as_ref()?.reason.as_deref())
        .any(|r| matches!(r, "ErrImagePull" | "ImagePullBackOff" | "InvalidImageName"))
}

/// What a flash Job (and its pod, when known) says.
pub fn state(job: Option<&Job>, pods: &[&Pod]) -> FlashJob {
    let Some(job) = job else {
        return FlashJob::Missing;
    };
    let name = job.metadata.name.clone().unwrap_or_default();
    let conds = job
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .map(Vec::as_slice)
        .unwrap_or_default();
    let is = |t: &str| conds.iter().any(|c| c.type_ == t && c.status == "True");
    let report = pods.iter().find_map(|p| report(p));
    if is("Complete") || is("SuccessCriteriaMet") {
        return FlashJob::Succeeded { name, report };
    }
    if is("Failed") {
        let deadline = conds
            .iter()
            .any(|c| c.type_ == "Failed" && c.reason.as_deref() == Some("DeadlineExceeded"));
        return FlashJob::Failed {
            name,
            report,
            deadline,
        };
    }
    FlashJob::Running {
        name,
        image_pull_failed: pods.iter().any(|p| image_pull_failed(p)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::batch::v1::{JobCondition, JobStatus};

    fn policy() -> TenstorrentFirmwarePolicy {
        let mut p: TenstorrentFirmwarePolicy = serde_json::from_value(serde_json::json!({
            "apiVersion": "firmware.tenstorrent.com/v1alpha1",
            "kind": "TenstorrentFirmwarePolicy",
            "metadata": {"name": "fw", "uid": "u1"},
            "spec": {"version": "19.8.0", "nodeAffinity": {},
                     "flasher": {"forceWrite": true}}
        }))
        .expect("policy");
        p.spec.upgrade_policy.flash_timeout_seconds = 300;
        p
    }

    fn defaults() -> JobDefaults {
        JobDefaults {
            namespace: "ops".into(),
            image: "flasher:1".into(),
            pull_policy: "IfNotPresent".into(),
            simulate_dir: None,
        }
    }

    #[test]
    fn the_job_is_gos_with_the_report_path() {
        let j = flash_job(&policy(), "n1", 0, &defaults());
        assert_eq!(
            j.metadata.name,
            Some(ttdrv_api::firmware::job_name("fw", "n1", "19.8.0"))
        );
        let retry = flash_job(&policy(), "n1", 1, &defaults());
        assert_ne!(retry.metadata.name, j.metadata.name);
        let sim = flash_job(
            &policy(),
            "n1",
            0,
            &JobDefaults {
                simulate_dir: Some("/var/sim".into()),
                ..defaults()
            },
        );
        let pod = sim.spec.and_then(|s| s.template.spec).expect("pod");
        for c in pod
            .containers
            .iter()
            .chain(pod.init_containers.iter().flatten())
        {
            let env = c.env.as_ref().expect("env");
            assert!(
                env.iter()
                    .any(|e| e.name == flasher::ENV_SIMULATE
                        && e.value.as_deref() == Some("/var/sim")),
                "{}",
                c.name
            );
        }
        let spec = j.spec.expect("spec");
        assert_eq!(
            (spec.backoff_limit, spec.active_deadline_seconds),
            (Some(0), Some(300))
        );
        let pod = spec.template.spec.expect("pod");
        assert_eq!(pod.node_name.as_deref(), Some("n1"));
        let c = &pod.containers[0];
        let env: BTreeMap<_, _> = c
            .env
            .iter()
            .flatten()
            .map(|e| (e.name.as_str(), e.value.clone().unwrap_or_default()))
            .collect();
        assert_eq!(env[flasher::ENV_READBACK], "19.8.0.0");
        assert_eq!(env[flasher::ENV_FLASH_ARGS], "--force");
        assert_eq!(
            c.termination_message_path.as_deref(),
            Some(flasher::REPORT_PATH)
        );
        assert_eq!(c.image.as_deref(), Some("flasher:1"));
        let owner = &j.metadata.owner_references.expect("owner")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("TenstorrentFirmwarePolicy", "u1")
        );
    }

    fn job(cond: Option<(&str, Option<&str>)>) -> Job {
        Job {
            metadata: ObjectMeta {
                name: Some("j".into()),
                ..Default::default()
            },
            status: Some(JobStatus {
                conditions: cond.map(|(t, r)| {
                    vec![JobCondition {
                        type_: t.into(),
                        status: "True".into(),
                        reason: r.map(String::from),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn pod(message: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "status": {"containerStatuses": [{"name": "flash", "image": "", "imageID": "",
                "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 0, "message": message}}}]}
        }))
        .expect("pod")
    }

    #[test]
    fn job_states() {
        assert_eq!(state(None, &[]), FlashJob::Missing);
        assert!(matches!(
            state(Some(&job(None)), &[]),
            FlashJob::Running { .. }
        ));
        let ok = pod(r#"{"after": ["19.8.0.0"]}"#);
        match state(Some(&job(Some(("Complete", None)))), &[&ok]) {
            FlashJob::Succeeded {
                report: Some(r), ..
            } => assert_eq!(r.after, ["19.8.0.0"]),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            state(Some(&job(Some(("Failed", Some("DeadlineExceeded"))))), &[]),
            FlashJob::Failed { deadline: true, .. }
        ));
        let pulling: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "status": {"initContainerStatuses": [{"name": "fetch-bundle", "image": "", "imageID": "",
                "ready": false, "restartCount": 0,
                "state": {"waiting": {"reason": "ImagePullBackOff"}}}]}
        }))
        .expect("pod");
        assert_eq!(
            state(Some(&job(None)), &[&pulling]),
            FlashJob::Running {
                name: "j".into(),
                image_pull_failed: true
            }
        );
        // A message that is not a report (logs, FallbackToLogsOnError) is none.
        assert_eq!(report(&pod("tt-flash: error")), None);
        // A fetch that failed: the init container's report.
        let fetch: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "status": {"initContainerStatuses": [{"name": "fetch-bundle", "image": "", "imageID": "",
                "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 1,
                    "message": "{\"reason\": \"FlashJobFailed\", \"message\": \"curl: (6) no host\"}"}}}]}
        }))
        .expect("pod");
        assert_eq!(
            report(&fetch).and_then(|r| r.message).as_deref(),
            Some("curl: (6) no host")
        );
    }
}
