//! Labeler: every write to a Node (cordon, uncordon, deploy gates, claim label,
//! persisted upgrade record) goes through here as one merge patch, retried with
//! backoff on conflicts, throttling and server errors; a node whose patch still
//! failed is not patched again until its per-object backoff has passed
//! (`write_backoff`).

use std::sync::Arc;

use actix::prelude::*;
use backon::Retryable;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams};

use crate::runtime::context::Context;
use crate::runtime::write_backoff::WriteTarget;
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
        let ctx = self.ctx.clone();
        Box::pin(async move {
            let _permit = ctx.patch_slots.acquire().await;
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
            let stale = move |e: &Error| precondition && e.is_conflict();
            let retried = call
                .retry(crate::error::backoff())
                .when(|e| e.is_transient() && !stale(e))
                .adjust(crate::error::honor_retry_after);
            ctx.guarded_write(WriteTarget::Node(msg.node.clone()), |e| !stale(e), retried)
                .await
        })
    }
}

#[cfg(test)]
mod tests {
    //! The Labeler against a loopback HTTP server standing in for the API
    //! server: it counts the PATCH requests that reach it.
    use std::collections::HashMap;
    use std::sync::Mutex;

    use super::*;
    use axum::Router;
    use axum::extract::{Path, State};
    use axum::http::{StatusCode, header};
    use axum::routing::patch;

    /// Node name -> status code the server answers with; counts per node.
    #[derive(Clone, Default)]
    struct Server {
        answers: Arc<HashMap<&'static str, u16>>,
        calls: Arc<Mutex<HashMap<String, usize>>>,
    }

    impl Server {
        fn calls(&self, node: &str) -> usize {
            let calls = self.calls.lock().expect("calls");
            calls.get(node).copied().unwrap_or(0)
        }
    }

    async fn answer(
        State(s): State<Server>,
        Path(node): Path<String>,
    ) -> (StatusCode, [(header::HeaderName, &'static str); 1], String) {
        *s.calls
            .lock()
            .expect("calls")
            .entry(node.clone())
            .or_insert(0) += 1;
        let code = s.answers.get(node.as_str()).copied().unwrap_or(200);
        let body = if code == 200 {
            serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
        } else {
            serde_json::json!({"apiVersion": "v1", "kind": "Status", "status": "Failure",
                "message": format!("refused by the test server ({code})"), "reason": "Invalid", "code": code})
        };
        (
            StatusCode::from_u16(code).expect("code"),
            [(header::CONTENT_TYPE, "application/json")],
            body.to_string(),
        )
    }

    async fn labeler(answers: &[(&'static str, u16)]) -> (Addr<Labeler>, Server, Arc<Context>) {
        let server = Server {
            answers: Arc::new(answers.iter().copied().collect()),
            ..Server::default()
        };
        let app = Router::new()
            .route("/api/v1/nodes/{node}", patch(answer))
            .with_state(server.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        tokio::spawn(async move { axum::serve(listener, app).await });
        let ctx = crate::test_support::context(&url, crate::test_support::empty_stores());
        (Labeler::new(ctx.clone()).start(), server, ctx)
    }

    fn patch_of(node: &str, patch: serde_json::Value) -> PatchNode {
        PatchNode {
            node: node.into(),
            patch,
            action: "testing",
        }
    }

    fn failing_nodes(ctx: &Context) -> String {
        let (_, text) = ctx.metrics.encode();
        String::from_utf8_lossy(&text)
            .lines()
            .find(|l| l.starts_with("ttdriver_api_writes_failing{kind=\"node\"}"))
            .unwrap_or("missing")
            .to_string()
    }

    #[actix::test]
    async fn a_refused_node_is_not_patched_again_until_its_backoff_passes() {
        let (labeler, server, ctx) = labeler(&[("denied", 422)]).await;
        let label = || {
            patch_of(
                "denied",
                serde_json::json!({"metadata": {"labels": {"a": "b"}}}),
            )
        };

        let first = labeler.send(label()).await.expect("mailbox");
        assert!(matches!(first, Err(Error::Kube { .. })), "{first:?}");
        assert_eq!(
            server.calls("denied"),
            1,
            "a 422 is not retried in the call"
        );
        assert_eq!(
            failing_nodes(&ctx),
            "ttdriver_api_writes_failing{kind=\"node\"} 1"
        );

        // Within the backoff: refused here, without a request.
        match labeler.send(label()).await.expect("mailbox") {
            Err(Error::WriteHeld {
                failures, error, ..
            }) => {
                assert_eq!(failures, 1);
                assert!(
                    error.contains("refused by the test server (422)"),
                    "{error}"
                );
            }
            other => panic!("expected the write held back, got {other:?}"),
        }
        assert_eq!(server.calls("denied"), 1);

        // Another node is not held back by this one's failures.
        let ok = labeler.send(patch_of("ok", serde_json::json!({}))).await;
        assert!(matches!(ok, Ok(Ok(_))), "{ok:?}");
        assert_eq!(server.calls("ok"), 1);

        // After the first backoff (1 s) it is tried again; the next one is 2 s.
        tokio::time::sleep(crate::runtime::write_backoff::FIRST).await;
        assert!(matches!(
            labeler.send(label()).await,
            Ok(Err(Error::Kube { .. }))
        ));
        assert_eq!(server.calls("denied"), 2);
        match labeler.send(label()).await.expect("mailbox") {
            Err(Error::WriteHeld {
                failures, retry_in, ..
            }) => {
                assert_eq!(failures, 2);
                assert!(
                    retry_in > crate::runtime::write_backoff::FIRST,
                    "{retry_in:?}"
                );
            }
            other => panic!("expected the write held back, got {other:?}"),
        }
    }

    #[actix::test]
    async fn a_stale_precondition_is_not_a_failure_to_back_off_from() {
        let (labeler, server, ctx) = labeler(&[("moved", 409)]).await;
        let guarded = || {
            patch_of(
                "moved",
                serde_json::json!({"metadata": {"resourceVersion": "7", "labels": {"a": "b"}}}),
            )
        };
        for attempt in 1..=2 {
            let res = labeler.send(guarded()).await.expect("mailbox");
            assert!(res.as_ref().is_err_and(Error::is_conflict), "{res:?}");
            assert_eq!(server.calls("moved"), attempt, "sent each time, once");
        }
        assert_eq!(
            failing_nodes(&ctx),
            "ttdriver_api_writes_failing{kind=\"node\"} 0"
        );
    }
}
