//! Labeler: every write to a Node (cordon, uncordon, deploy gates, claim label,
//! persisted upgrade record) goes through here as one merge patch, retried with
//! backoff on conflicts, throttling and server errors.

use std::sync::Arc;

use actix::prelude::*;
use backon::Retryable;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams};

use crate::context::Context;
use crate::{Error, Result};

pub struct Labeler {
    ctx: Arc<Context>,
}

impl Labeler {
    pub fn new(ctx: Arc<Context>) -> Self {
        Self { ctx }
    }
}

impl Actor for Labeler {
    type Context = actix::Context<Self>;
}

/// A JSON merge patch for one node; replies with the node as the API server
/// stored it (fresher than any cache).
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<Node>")]
pub struct PatchNode {
    pub node: String,
    pub patch: serde_json::Value,
    /// Why, for logs and errors.
    pub action: &'static str,
}

impl Handler<PatchNode> for Labeler {
    type Result = ResponseFuture<Result<Node>>;

    fn handle(&mut self, msg: PatchNode, _: &mut Self::Context) -> Self::Result {
        let api: Api<Node> = Api::all(self.ctx.client.clone());
        let slots = self.ctx.patch_slots.clone();
        Box::pin(async move {
            let _permit = slots.acquire().await;
            let call = || async {
                api.patch(
                    &msg.node,
                    &PatchParams::default(),
                    &Patch::Merge(&msg.patch),
                )
                .await
                .map_err(Error::kube(format!("{} on node {}", msg.action, msg.node)))
            };
            // A patch with a resourceVersion precondition was decided on that
            // version of the Node: a conflict means the decision is stale, and
            // the next pass makes a fresh one (retrying it cannot succeed).
            let precondition = msg.patch["metadata"]["resourceVersion"].is_string();
            call.retry(crate::error::backoff())
                .when(|e| e.is_transient() && !(precondition && e.is_conflict()))
                .adjust(crate::error::honor_retry_after)
                .await
        })
    }
}
