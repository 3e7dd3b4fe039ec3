//! The flash Job writer: every flash Job the firmware controller creates
//! goes through it, under the per-object write backoff
//! ([`crate::runtime::write_backoff`]), as every Node, pod and status write does. An
//! actor, so a node actor's tests put a recording fake in its place.

use std::sync::Arc;

use actix::prelude::*;
use k8s_openapi::api::batch::v1::Job;
use kube::Api;
use kube::api::PostParams;

use crate::runtime::context::Context;
use crate::runtime::write_backoff::WriteTarget;
use crate::{Error, Result};

pub struct FlashJobWriter {
    ctx: Arc<Context>,
}

impl FlashJobWriter {
    pub fn new(ctx: Arc<Context>) -> Self {
        Self { ctx }
    }
}

impl Actor for FlashJobWriter {
    type Context = actix::Context<Self>;
}

/// Create this flash Job in the controller's namespace.
#[derive(Message)]
#[rtype(result = "Result<JobCreate>")]
pub struct CreateFlashJob {
    pub job: Job,
}

/// How a create ended well: the Job exists now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobCreate {
    Created,
    /// There already: a create of ours whose answer was lost. (A 409
    /// Conflict is not that: nothing was created, and it is an error.)
    AlreadyThere,
}

impl Handler<CreateFlashJob> for FlashJobWriter {
    type Result = ResponseFuture<Result<JobCreate>>;

    fn handle(&mut self, msg: CreateFlashJob, _: &mut Self::Context) -> Self::Result {
        let ctx = self.ctx.clone();
        Box::pin(async move {
            let namespace = ctx.config.namespace.clone();
            let name = msg.job.metadata.name.clone().unwrap_or_default();
            let api: Api<Job> = Api::namespaced(ctx.client.clone(), &namespace);
            let target = WriteTarget::Job {
                namespace,
                name: name.clone(),
            };
            let write = async {
                match api.create(&PostParams::default(), &msg.job).await {
                    Ok(_) => Ok(JobCreate::Created),
                    Err(kube::Error::Api(e)) if e.code == 409 && e.reason == "AlreadyExists" => {
                        Ok(JobCreate::AlreadyThere)
                    }
                    Err(e) => Err(Error::kube(format!("creating flash Job {name}"))(e)),
                }
            };
            ctx.guarded_write(target, |e| !e.is_conflict(), write).await
        })
    }
}
