//! DaemonSetRenderer: keeps `ttdrv-<policy>` equal to its rendering (server-side
//! apply, only when the template hash differs, so a restarted controller never
//! touches an unchanged DaemonSet), and replaces a node's installer pod with
//! one from that template when the node's turn comes (`ReplaceInstallerPod`).

use std::sync::Arc;

use actix::prelude::*;
use backon::Retryable;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use ttdrv_api::{TenstorrentDriverPolicy, labels};

use crate::context::Context;
use crate::render::{daemonset_name, render_daemonset};
use crate::{Error, Result};

pub struct DaemonSetRenderer {
    ctx: Arc<Context>,
}

impl DaemonSetRenderer {
    pub fn new(ctx: Arc<Context>) -> Self {
        Self { ctx }
    }
}

impl Actor for DaemonSetRenderer {
    type Context = actix::Context<Self>;
}

/// Make the policy's DaemonSet match its rendering; returns the template hash.
#[derive(Message, Clone)]
#[rtype(result = "Result<String>")]
pub struct Ensure {
    pub policy: Arc<TenstorrentDriverPolicy>,
}

impl Handler<Ensure> for DaemonSetRenderer {
    type Result = ResponseFuture<Result<String>>;

    fn handle(&mut self, msg: Ensure, _: &mut Self::Context) -> Self::Result {
        let ctx = self.ctx.clone();
        Box::pin(async move {
            let (ds, hash) = render_daemonset(&msg.policy, &ctx.render_context());
            let name = daemonset_name(msg.policy.metadata.name.as_deref().unwrap_or_default());
            let existing = ctx
                .stores
                .daemonsets
                .get(&ObjectRef::new(&name).within(&ctx.config.namespace));
            let current = existing
                .as_ref()
                .and_then(|d| d.metadata.annotations.as_ref())
                .and_then(|a| a.get(labels::TEMPLATE_HASH))
                .cloned();
            if current.as_deref() == Some(hash.as_str()) {
                return Ok(hash);
            }
            let api: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), &ctx.config.namespace);
            let pp = PatchParams::apply("tt-driver-manager").force();
            let apply = || async {
                api.patch(&name, &pp, &Patch::Apply(&ds))
                    .await
                    .map_err(Error::kube(format!("applying DaemonSet {name}")))
            };
            let applied = apply
                .retry(crate::error::backoff())
                .when(Error::is_transient)
                .adjust(crate::error::honor_retry_after)
                .await;
            // ttdriver_daemonset_operations_total, as the Go operator counted.
            let cr = msg.policy.metadata.name.as_deref().unwrap_or_default();
            let op = if existing.is_some() {
                "update"
            } else {
                "create"
            };
            ctx.metrics.inc_daemonset_operation(cr, op, applied.is_ok());
            applied?;
            let (reason, verb) = if existing.is_some() {
                ("DaemonSetUpdated", "updated")
            } else {
                ("DaemonSetCreated", "created")
            };
            tracing::info!(daemonset = name, hash, verb, "installer DaemonSet applied");
            ctx.event(
                msg.policy.as_ref(),
                false,
                reason,
                "Render",
                format!(
                    "installer DaemonSet {name} {verb} (template {})",
                    &hash[..12]
                ),
            );
            Ok(hash)
        })
    }
}

/// Replace a node's installer pod with one from the current template: the pod
/// is deleted and the DaemonSet (OnDelete) creates the new one.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<()>")]
pub struct ReplaceInstallerPod {
    pub namespace: String,
    pub name: String,
}

impl Handler<ReplaceInstallerPod> for DaemonSetRenderer {
    type Result = ResponseFuture<Result<()>>;

    fn handle(&mut self, msg: ReplaceInstallerPod, _: &mut Self::Context) -> Self::Result {
        let api: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &msg.namespace);
        Box::pin(async move {
            match api.delete(&msg.name, &DeleteParams::default()).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                Err(e) => Err(Error::Kube {
                    action: format!("deleting installer pod {}/{}", msg.namespace, msg.name),
                    source: e,
                }),
            }
        })
    }
}
