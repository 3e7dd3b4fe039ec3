//! What every actor shares: the client, the settings, the watch caches, the
//! metrics and the event recorder.

use std::sync::Arc;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Client;
use kube::Resource;
use kube::runtime::events::{Event, Recorder, Reporter};
use kube::runtime::reflector::Store;
use ttdrv_api::TenstorrentDriverPolicy;

use crate::config::Config;
use crate::metrics::Metrics;
use crate::render::RenderContext;

/// Read-only caches fed by one watch per resource kind.
#[derive(Clone)]
pub struct Stores {
    pub policies: Store<TenstorrentDriverPolicy>,
    pub nodes: Store<Node>,
    pub pods: Store<Pod>,
    pub daemonsets: Store<DaemonSet>,
    pub pdbs: Store<PodDisruptionBudget>,
}

pub struct Context {
    pub client: Client,
    pub config: Config,
    pub stores: Stores,
    pub metrics: Arc<Metrics>,
    pub recorder: Recorder,
}

impl Context {
    pub fn new(client: Client, config: Config, stores: Stores, metrics: Arc<Metrics>) -> Self {
        let reporter = Reporter {
            controller: "tt-driver-manager".into(),
            instance: config.identity.clone(),
        };
        let recorder = Recorder::new(client.clone(), reporter);
        Self {
            client,
            config,
            stores,
            metrics,
            recorder,
        }
    }

    pub fn render_context(&self) -> RenderContext {
        RenderContext {
            namespace: self.config.namespace.clone(),
            default_image: self.config.installer_image.clone(),
            default_pull_policy: self.config.installer_pull_policy.clone(),
            default_source_repository: self.config.source_repository(),
            tt_smi_version: self.config.tt_smi_version.clone(),
            service_account: self.config.agent_service_account.clone(),
        }
    }

    /// Records an Event on an object; failures are logged, never fatal.
    pub async fn event<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        warning: bool,
        reason: &str,
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
            note: Some(note),
            action: action.to_string(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, &obj.object_ref(&())).await {
            tracing::warn!(error = %e, reason, "could not record event");
        }
    }
}
