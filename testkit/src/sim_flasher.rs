//! Plays the flasher (and the kubelet running it) on kwok nodes: each flash
//! Job pod (label `firmware.tenstorrent.com/cr`) is finished as the real
//! `ttdrv-flash` would finish it on the node's simulated cards, with its
//! report as the termination message. kwok's own stages leave these pods
//! alone (hack/kwok-stages.py).
//!
//! A node's simulated cards are its annotation [`CARDS_ANNOTATION`]
//! (comma-separated `fw_bundle_version`s, default two cards at
//! [`DEFAULT_CARDS`]); [`FAULT_ANNOTATION`] injects a fault: `flash` (tt-flash
//! fails, the cards keep their version), `readback` (the first card is
//! written, the others are not: a readback mismatch), `hang` (never finishes:
//! the Job's deadline ends it), `fetch` (the bundle's download fails in the
//! init container: no card is touched). [`HOLD_ANNOTATION`] holds a flash until it is
//! removed, so a test can line other things up behind a flash in progress.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use ttdrv_api::firmware::flasher::{self, Report};
use ttdrv_api::firmware::{labels as fw, reason};

pub const CARDS_ANNOTATION: &str = "sim.ttdrv.io/fw-cards";
pub const FAULT_ANNOTATION: &str = "sim.ttdrv.io/fw-fault";
pub const HOLD_ANNOTATION: &str = "sim.ttdrv.io/fw-hold";
pub const DEFAULT_CARDS: &str = "19.7.0.0,19.7.0.0";

/// Runs until the process ends, beside the simulated agent.
pub async fn run(client: Client, namespace: String, work: Duration) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let in_flight: Arc<Mutex<HashSet<String>>> = Arc::default();
    let mut stream = watcher(
        pods.clone(),
        watcher::Config::default().labels(fw::JOB_POLICY),
    )
    .default_backoff()
    .applied_objects()
    .boxed();
    loop {
        let pod = match stream.try_next().await {
            Ok(Some(p)) => p,
            Ok(None) => break,
            Err(e) => {
                tracing::warn!(error = %e, "sim-flasher watch error");
                continue;
            }
        };
        let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
        if pod.metadata.deletion_timestamp.is_some()
            || matches!(phase.as_deref(), Some("Succeeded" | "Failed"))
        {
            continue;
        }
        let (Some(uid), Some(node)) = (
            pod.metadata.uid.clone(),
            pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        ) else {
            continue;
        };
        if !in_flight.lock().map(|mut s| s.insert(uid)).unwrap_or(false) {
            continue;
        }
        let client = client.clone();
        tokio::spawn(async move {
            tokio::time::sleep(work).await;
            let nodes: Api<Node> = Api::all(client.clone());
            while nodes.get(&node).await.is_ok_and(|n| {
                n.metadata
                    .annotations
                    .is_some_and(|a| a.contains_key(HOLD_ANNOTATION))
            }) {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            if let Err(e) = flash(&client, &pod, &node).await {
                tracing::warn!(error = %e, node, "sim-flasher gave up on a pod");
            }
        });
    }
}

fn env(pod: &Pod, name: &str) -> Option<String> {
    pod.spec.as_ref()?.containers.iter().find_map(|c| {
        c.env
            .as_ref()?
            .iter()
            .find(|e| e.name == name)?
            .value
            .clone()
    })
}

async fn flash(client: &Client, pod: &Pod, node: &str) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let n = nodes.get(node).await?;
    let ann = n.metadata.annotations.clone().unwrap_or_default();
    let before: Vec<String> = ann
        .get(CARDS_ANNOTATION)
        .map(String::as_str)
        .unwrap_or(DEFAULT_CARDS)
        .split(',')
        .map(|s| s.trim().to_string())
        .collect();
    let target = env(pod, flasher::ENV_READBACK).unwrap_or_default();
    let fault = ann.get(FAULT_ANNOTATION).map(String::as_str);
    let (after, failure) = match fault {
        Some("hang") => return Ok(()),
        Some("fetch") => return fetch_failed(client, pod).await,
        Some("flash") => (
            before.clone(),
            Some((
                reason::FLASH_JOB_FAILED,
                "simulated: tt-flash exited 1".to_string(),
            )),
        ),
        Some("readback") => {
            let mut after = before.clone();
            after[0] = target.clone();
            let msg = format!(
                "readback mismatch: wanted {target} on every card, got [{}]",
                after.join(", ")
            );
            (after, Some((reason::READBACK_MISMATCH, msg)))
        }
        _ => (vec![target.clone(); before.len()], None),
    };
    if after != before {
        let patch = serde_json::json!({ "metadata": { "annotations": { CARDS_ANNOTATION: after.join(",") } } });
        nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    let report = Report {
        skipped: before == after && failure.is_none(),
        before,
        after,
        reason: failure.as_ref().map(|(r, _)| r.to_string()),
        message: failure.as_ref().map(|(_, m)| m.clone()),
    };
    let (phase, code, why) = if failure.is_some() {
        ("Failed", 1, "Error")
    } else {
        ("Succeeded", 0, "Completed")
    };
    let ended = Ended {
        list: "containerStatuses",
        container: "flash",
        exit_code: code,
        why,
    };
    end_pod(client, pod, phase, ended, &report).await
}

/// The init container's download fails, as curl fails on a URL it cannot
/// use: the report says so, and the flash container never runs.
async fn fetch_failed(client: &Client, pod: &Pod) -> anyhow::Result<()> {
    let report = Report {
        reason: Some(reason::BUNDLE_DOWNLOAD_FAILED.to_string()),
        message: Some(
            "simulated: curl: (3) URL rejected: Port number was not a decimal number between 0 and 65535"
                .to_string(),
        ),
        ..Default::default()
    };
    let ended = Ended {
        list: "initContainerStatuses",
        container: "fetch-bundle",
        exit_code: 1,
        why: "Error",
    };
    end_pod(client, pod, "Failed", ended, &report).await
}

/// The container a simulated flash pod ended in, and how.
struct Ended {
    /// `containerStatuses` or `initContainerStatuses`.
    list: &'static str,
    container: &'static str,
    exit_code: i32,
    why: &'static str,
}

/// Ends the pod as the kubelet would: `phase`, and the container
/// terminated with the flasher's report as its termination message.
async fn end_pod(
    client: &Client,
    pod: &Pod,
    phase: &str,
    ended: Ended,
    report: &Report,
) -> anyhow::Result<()> {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let status = serde_json::json!({ "status": {
        "phase": phase,
        (ended.list): [{
            "name": ended.container, "image": "", "imageID": "", "ready": false, "restartCount": 0,
            "state": { "terminated": { "exitCode": ended.exit_code, "reason": ended.why,
                "message": serde_json::to_string(report)?, "startedAt": now, "finishedAt": now } }
        }]
    } });
    let name = pod.metadata.name.clone().unwrap_or_default();
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    Api::<Pod>::namespaced(client.clone(), &ns)
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}
