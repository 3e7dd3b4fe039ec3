//! Evictor: evicts pods through the Eviction API, so PodDisruptionBudgets are
//! honoured. A 429 means a PDB refuses for now: reported as blocked and tried
//! again on the next pass (the NodeActor re-asks every resync).

use std::sync::Arc;

use actix::prelude::*;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::EvictParams;

use crate::context::Context;
use ttdrv_core::drain::{DrainPass, PodRef};

pub struct Evictor {
    ctx: Arc<Context>,
}

impl Evictor {
    pub fn new(ctx: Arc<Context>) -> Self {
        Self { ctx }
    }
}

impl Actor for Evictor {
    type Context = actix::Context<Self>;
}

#[derive(Message, Debug, Clone)]
#[rtype(result = "EvictOutcome")]
pub struct Evict {
    pub policy: String,
    pub pods: Vec<(PodRef, DrainPass)>,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct EvictOutcome {
    pub evicted: Vec<PodRef>,
    /// Refused by a PodDisruptionBudget (429).
    pub blocked: Vec<PodRef>,
    pub errors: Vec<String>,
}

impl Handler<Evict> for Evictor {
    type Result = ResponseFuture<EvictOutcome>;

    fn handle(&mut self, msg: Evict, _: &mut Self::Context) -> Self::Result {
        let ctx = self.ctx.clone();
        Box::pin(async move {
            let calls = msg.pods.iter().map(|(pod, pass)| {
                let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &pod.namespace);
                async move {
                    (
                        pod.clone(),
                        *pass,
                        api.evict(&pod.name, &EvictParams::default()).await,
                    )
                }
            });
            let mut out = EvictOutcome::default();
            for (pod, pass, res) in futures::future::join_all(calls).await {
                match res {
                    Ok(_) => {
                        ctx.metrics
                            .inc_evicted(&msg.policy, crate::metrics::pass_label(pass));
                        tracing::info!(policy = msg.policy, pod = %pod, pass = pass.as_str(), "evicted");
                        out.evicted.push(pod);
                    }
                    Err(kube::Error::Api(s)) if s.code == 404 => out.evicted.push(pod),
                    Err(kube::Error::Api(s)) if s.code == 429 => {
                        ctx.metrics
                            .inc_drain_blocked(&msg.policy, crate::metrics::pass_label(pass));
                        tracing::info!(policy = msg.policy, pod = %pod, "eviction refused by a PodDisruptionBudget; will retry");
                        out.blocked.push(pod);
                    }
                    Err(e) => out.errors.push(format!("evicting {pod}: {e}")),
                }
            }
            out
        })
    }
}
