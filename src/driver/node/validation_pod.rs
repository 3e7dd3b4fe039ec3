//! ValidationPods: the NodeActors' port to the user's validation pods
//! ([`crate::validation_pod`]): creates a cycle's pod from the policy's
//! PodTemplate and deletes it once it has said all it had to. A port, so the
//! node actor's tests put a fake in its place.

use std::sync::Arc;

use actix::prelude::*;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use ttdrv_api::TenstorrentDriverPolicy;

use crate::runtime::context::Context;
use crate::{Error, Result};

pub struct ValidationPods {
    ctx: Arc<Context>,
}

impl ValidationPods {
    pub fn new(ctx: Arc<Context>) -> Self {
        Self { ctx }
    }
}

impl Actor for ValidationPods {
    type Context = actix::Context<Self>;
}

/// Create the validation pod of `node`'s cycle `cycle` from PodTemplate
/// `template` (an existing one is left as it is); replies with its name.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<String>")]
pub struct RunValidationPod {
    pub policy: Arc<TenstorrentDriverPolicy>,
    pub template: String,
    pub node: String,
    pub cycle: i64,
}

impl Handler<RunValidationPod> for ValidationPods {
    type Result = ResponseFuture<Result<String>>;

    fn handle(&mut self, msg: RunValidationPod, _: &mut Self::Context) -> Self::Result {
        let ctx = self.ctx.clone();
        Box::pin(async move {
            crate::validation_pod::run(
                ctx.client.clone(),
                &msg.template,
                &msg.policy,
                &msg.node,
                msg.cycle,
                &ctx.config.namespace,
            )
            .await
        })
    }
}

/// Delete validation pod `namespace/name`.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<()>")]
pub struct DeleteValidationPod {
    pub namespace: String,
    pub name: String,
}

impl Handler<DeleteValidationPod> for ValidationPods {
    type Result = ResponseFuture<Result<()>>;

    fn handle(&mut self, msg: DeleteValidationPod, _: &mut Self::Context) -> Self::Result {
        let pods: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &msg.namespace);
        Box::pin(async move {
            pods.delete(&msg.name, &Default::default())
                .await
                .map(|_| ())
                .map_err(Error::kube(format!(
                    "deleting validation pod {}/{}",
                    msg.namespace, msg.name
                )))
        })
    }
}
