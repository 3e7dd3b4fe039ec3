//! A workload's graceful stop on kwok nodes.
//!
//! kwok deletes an evicted pod at once, so a drain on a simulated node ends
//! before anyone can see it. A pod labelled [`STOP_SECONDS_LABEL`]`: "<s>"`
//! and carrying the finalizer [`STOP_FINALIZER`] is held Terminating once
//! deleted; this task lifts the finalizer `<s>` seconds later, as a model
//! server finishing its requests would. The demo's device workload uses it,
//! so its node stays Draining for that long.

use std::collections::HashSet;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};

/// Seconds a deleted pod takes to stop.
pub const STOP_SECONDS_LABEL: &str = "sim.ttdrv.io/stop-seconds";
/// Holds the deleted pod until its stop time has passed.
pub const STOP_FINALIZER: &str = "sim.ttdrv.io/graceful-stop";

/// The stop time a pod asks for: `None` when it is not deleted, does not
/// carry the finalizer or has no (valid) label.
pub fn stop_time(pod: &Pod) -> Option<Duration> {
    let m = &pod.metadata;
    m.deletion_timestamp.as_ref()?;
    if !m.finalizers.iter().flatten().any(|f| f == STOP_FINALIZER) {
        return None;
    }
    let secs = m.labels.as_ref()?.get(STOP_SECONDS_LABEL)?.parse().ok()?;
    Some(Duration::from_secs(secs))
}

/// Runs until the process ends: every deleted pod with the label and the
/// finalizer, in any namespace, stops after its time.
pub async fn run(client: Client) {
    let pods: Api<Pod> = Api::all(client.clone());
    let wc = watcher::Config::default().labels(STOP_SECONDS_LABEL);
    let mut stream = watcher(pods, wc)
        .default_backoff()
        .applied_objects()
        .boxed();
    let mut seen = HashSet::new();
    loop {
        let pod = match stream.try_next().await {
            Ok(Some(p)) => p,
            Ok(None) => break,
            Err(e) => {
                tracing::warn!(error = %e, "sim-workload watch error");
                continue;
            }
        };
        let (Some(wait), Some(uid)) = (stop_time(&pod), pod.metadata.uid.clone()) else {
            continue;
        };
        // One timer per pod: every update of a Terminating pod comes back here.
        if !seen.insert(uid) {
            continue;
        }
        let client = client.clone();
        tokio::spawn(async move {
            let ns = pod.metadata.namespace.clone().unwrap_or_default();
            let name = pod.metadata.name.clone().unwrap_or_default();
            tracing::info!(pod = %format!("{ns}/{name}"), seconds = wait.as_secs(), "workload stopping");
            tokio::time::sleep(wait).await;
            let api: Api<Pod> = Api::namespaced(client, &ns);
            let left: Vec<String> = pod
                .metadata
                .finalizers
                .iter()
                .flatten()
                .filter(|f| *f != STOP_FINALIZER)
                .cloned()
                .collect();
            let patch = serde_json::json!({"metadata": {"finalizers": left}});
            match api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => tracing::info!(pod = %format!("{ns}/{name}"), "workload stopped"),
                // Gone already (deleted by hand): nothing to hold.
                Err(e) => {
                    tracing::warn!(pod = %format!("{ns}/{name}"), error = %e, "lifting the stop finalizer")
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn pod(deleted: bool, finalizer: bool, label: Option<&str>) -> Pod {
        let mut p = Pod::default();
        if deleted {
            p.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        }
        if finalizer {
            p.metadata.finalizers = Some(vec![STOP_FINALIZER.into()]);
        }
        if let Some(l) = label {
            p.metadata.labels = Some([(STOP_SECONDS_LABEL.to_string(), l.to_string())].into());
        }
        p
    }

    #[test]
    fn only_a_deleted_pod_with_finalizer_and_label_waits() {
        assert_eq!(
            stop_time(&pod(true, true, Some("5"))),
            Some(Duration::from_secs(5))
        );
        assert_eq!(stop_time(&pod(false, true, Some("5"))), None);
        assert_eq!(stop_time(&pod(true, false, Some("5"))), None);
        assert_eq!(stop_time(&pod(true, true, None)), None);
        assert_eq!(stop_time(&pod(true, true, Some("soon"))), None);
    }
}
