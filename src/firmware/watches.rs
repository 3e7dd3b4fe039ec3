//! The firmware controller's watches: its policies and flash Jobs, cached,
//! each change asking for a pass.

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use kube::Api;
use kube::Client;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use ttdrv_api::firmware::{TenstorrentFirmwarePolicy, labels as fw};

/// The firmware policies and the flash Jobs, as their watches keep them.
#[derive(Clone)]
pub struct FirmwareStores {
    pub policies: Store<TenstorrentFirmwarePolicy>,
    pub jobs: Store<Job>,
}

/// Starts the two watches; each change asks for a pass (`kick`). Returns the
/// caches and a future that resolves once both have listed.
pub fn start_watches(
    client: &Client,
    namespace: &str,
    policy_selector: Option<&str>,
    kick: tokio::sync::mpsc::Sender<()>,
) -> (FirmwareStores, impl std::future::Future<Output = ()>) {
    let (policies, pw) = reflector::store();
    let (jobs, jw) = reflector::store();
    let mut pcfg = watcher::Config::default();
    if let Some(sel) = policy_selector {
        // As for the driver policies: only those this controller serves.
        pcfg = pcfg.labels(sel);
    }
    let policy_stream = watcher(Api::<TenstorrentFirmwarePolicy>::all(client.clone()), pcfg)
        .default_backoff()
        .reflect(pw)
        .map(|_| ())
        .boxed();
    let job_cfg = watcher::Config::default().labels(fw::JOB_POLICY);
    let job_stream = watcher(Api::<Job>::namespaced(client.clone(), namespace), job_cfg)
        .default_backoff()
        .modify(|j| j.metadata.managed_fields = None)
        .reflect(jw)
        .map(|_| ())
        .boxed();
    tokio::spawn(async move {
        let mut both = futures::stream::select(policy_stream, job_stream);
        while both.next().await.is_some() {
            // A pass is pending already when the channel is full.
            let _ = kick.try_send(());
        }
    });
    let (p, j) = (policies.clone(), jobs.clone());
    let ready = async move {
        let _ = futures::join!(p.wait_until_ready(), j.wait_until_ready());
    };
    (FirmwareStores { policies, jobs }, ready)
}
