//! What every actor shares: the client, the settings, the watch caches, the
//! metrics, the event recorder and the per-object write backoff.

use std::sync::Arc;

use backon::Retryable;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Client;
use kube::Resource;
use kube::runtime::events::{Event, Recorder, Reporter};
use kube::runtime::reflector::Store;
use ttdrv_api::TenstorrentDriverPolicy;
use ttdrv_core::event::EventReason;

use crate::config::Config;
use crate::metrics::Metrics;
use crate::render::RenderContext;
use crate::runtime::write_backoff::{WriteBackoff, WriteTarget};
use crate::{Error, Result};

/// Read-only caches fed by one watch per resource kind.
#[derive(Clone)]
pub struct Stores {
    pub policies: Store<TenstorrentDriverPolicy>,
    pub nodes: Store<Node>,
    /// What the controller keeps of pods: their drain facts, by node.
    pub pods: Arc<crate::runtime::pod_index::PodCache>,
    pub daemonsets: Store<DaemonSet>,
    /// Every DaemonSet of the cluster, as its deploy gates and device use.
    pub all_daemon_sets: Arc<crate::runtime::daemon_set_index::DaemonSetIndex>,
    pub pdbs: Store<PodDisruptionBudget>,
    /// The DRA driver's ResourceSlices, as device counts by node.
    pub slices: Arc<crate::runtime::slice_index::SliceIndex>,
}

pub struct Context {
    pub client: Client,
    pub config: Config,
    pub stores: Stores,
    pub metrics: Arc<Metrics>,
    /// Who records our Events.
    pub reporter: Reporter,
    event_slots: Arc<tokio::sync::Semaphore>,
    /// Bounds concurrent node patches (each is a connection under HTTP/1.1).
    pub patch_slots: Arc<tokio::sync::Semaphore>,
    /// Objects whose last write failed, shared by every writer.
    write_backoff: Arc<std::sync::Mutex<WriteBackoff>>,
    /// Which cycle (driver or firmware) has each node, in this process.
    pub claims: crate::runtime::claims::Claims,
}

impl Context {
    pub fn new(client: Client, config: Config, stores: Stores, metrics: Arc<Metrics>) -> Self {
        let reporter = Reporter {
            controller: "tt-driver-manager".into(),
            instance: config.identity.clone(),
        };
        Self {
            client,
            config,
            stores,
            metrics,
            reporter,
            event_slots: Arc::new(tokio::sync::Semaphore::new(4)),
            patch_slots: Arc::new(tokio::sync::Semaphore::new(16)),
            write_backoff: Arc::default(),
            claims: Default::default(),
        }
    }

    /// Runs `write` for `target` unless the object's writes are held back
    /// after a failure (then `Error::WriteHeld`, without a call). An error for
    /// which `counts` says yes starts or lengthens the object's backoff; a
    /// success ends it.
    pub async fn guarded_write<T>(
        &self,
        target: WriteTarget,
        counts: impl FnOnce(&Error) -> bool,
        write: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        let now = std::time::Instant::now();
        if let Some(h) = self.backoff().check(&target, now) {
            return Err(Error::WriteHeld {
                target: target.to_string(),
                retry_in: h.retry_at.saturating_duration_since(now),
                failures: h.failures,
                error: h.error.clone(),
            });
        }
        let res = write.await;
        let mut backoff = self.backoff();
        match &res {
            Ok(_) => backoff.succeeded(&target),
            Err(e) if counts(e) => {
                let wait = backoff.failed(target.clone(), std::time::Instant::now(), e.to_string());
                tracing::warn!(%target, error = %e, retry_in = ?wait, "write failed; this object's writes wait for their backoff");
            }
            Err(_) => {}
        }
        self.metrics.set_writes_failing(&backoff.failing());
        res
    }

    fn backoff(&self) -> std::sync::MutexGuard<'_, WriteBackoff> {
        // A panic while holding it leaves a map that is still consistent.
        self.write_backoff
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn render_context(&self) -> RenderContext {
        RenderContext {
            namespace: self.config.namespace.clone(),
            default_image: self.config.installer_image.clone(),
            default_pull_policy: self.config.installer_pull_policy.clone(),
            default_source_repository: self.config.source_repository(),
            tt_smi_version: self.config.tt_smi_version.clone(),
            service_account: self.config.agent_service_account.clone(),
            eligibility: self.eligibility(),
            proxy_env: crate::config::proxy_env(|k| std::env::var(k).ok()),
            source_commits: self.config.source_commit_table(),
            tag_keys_configmap: self
                .config
                .source_tag_keys_configmap
                .clone()
                .filter(|c| !c.is_empty()),
        }
    }

    /// Which nodes policies may select (the chart's
    /// `controller.requireTenstorrentLabel`).
    pub fn eligibility(&self) -> ttdrv_core::selection::Eligibility {
        ttdrv_core::selection::Eligibility {
            require_tenstorrent_label: self.config.require_tenstorrent_label,
        }
    }

    /// Records an Event on an object in the background: Events never sit on a
    /// node's critical path, and at most a few are in flight at once. Failures
    /// are logged, never fatal.
    pub fn event<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        warning: bool,
        reason: EventReason,
        action: &str,
        note: String,
    ) {
        let ev = Event {
            type_: if warning {
                kube::runtime::events::EventType::Warning
            } else {
                kube::runtime::events::EventType::Normal
            },
            reason: reason.to_string(),
            note: Some(event_note(note)),
            action: action.to_string(),
            secondary: None,
        };
        // A fresh Recorder per Event: a shared one folds Events with the same
        // reason about the same object version into one series that keeps the
        // first note, and our per-node Events all regard the policy, so the
        // second node's "NodeUpgraded" would be shown with the first node's
        // name. Events are only recorded on transitions: nothing to fold.
        let (recorder, reference, limit) = (
            Recorder::new(self.client.clone(), self.reporter.clone()),
            obj.object_ref(&()),
            self.event_slots.clone(),
        );
        tokio::spawn(async move {
            let _permit = limit.acquire().await;
            // Throttled (429), conflicting or failing server: retried with the
            // same backoff as every other write, then given up with a log line.
            let publish = || async {
                recorder
                    .publish(&ev, &reference)
                    .await
                    .map_err(crate::Error::kube(format!("recording event {}", ev.reason)))
            };
            if let Err(e) = publish
                .retry(crate::error::backoff())
                .when(crate::Error::is_transient)
                .adjust(crate::error::honor_retry_after)
                .await
            {
                tracing::warn!(error = %e, reason = ev.reason, "could not record event");
            }
        });
    }
}

/// The API server refuses an Event whose note is longer than 1 KiB (the
/// whole Event is lost then): a longer note (a rollout waiting on many
/// nodes names them all) is cut at a character boundary, marked with `…`.
pub fn event_note(mut note: String) -> String {
    const MAX: usize = 1024;
    if note.len() <= MAX {
        return note;
    }
    let mut end = MAX - '…'.len_utf8();
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    note.truncate(end);
    note.push('…');
    note
}

#[cfg(test)]
mod event_note_tests {
    #[test]
    fn event_notes_fit_the_api_servers_limit() {
        assert_eq!(super::event_note("short".into()), "short");
        let long = "é".repeat(700);
        let cut = super::event_note(long);
        assert!(cut.len() <= 1024 && cut.ends_with('…'), "{}", cut.len());
        assert!(cut.starts_with("éé"));
    }
}
