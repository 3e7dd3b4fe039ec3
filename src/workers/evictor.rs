//! Evictor: evicts pods through the Eviction API, so PodDisruptionBudgets are
//! honoured. A 429 means a PDB refuses for now: reported as blocked and tried
//! again on the next pass (the NodeActor re-asks every resync). Any other
//! failure starts the pod's write backoff (`write_backoff`): it is not evicted
//! again until that has passed.

use std::sync::Arc;

use actix::prelude::*;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::EvictParams;

use crate::runtime::context::Context;
use crate::runtime::write_backoff::WriteTarget;
use crate::{Error, Result};
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
    /// For a firmware policy: its own counters (`ttfw_*`, from the outcome)
    /// count these evictions, not the driver policies' `ttdriver_*`.
    pub firmware: bool,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct EvictOutcome {
    pub evicted: Vec<PodRef>,
    /// Refused by a PodDisruptionBudget (429).
    pub blocked: Vec<PodRef>,
    pub errors: Vec<String>,
    /// Not tried: their last eviction failed and their backoff has not passed.
    pub held: Vec<PodRef>,
}

/// The API server's status code of an eviction's failure.
fn code(e: &Error) -> Option<u16> {
    match e {
        Error::Kube {
            source: kube::Error::Api(s),
            ..
        } => Some(s.code),
        _ => None,
    }
}

impl Handler<Evict> for Evictor {
    type Result = ResponseFuture<EvictOutcome>;

    fn handle(&mut self, msg: Evict, _: &mut Self::Context) -> Self::Result {
        let ctx = self.ctx.clone();
        Box::pin(async move {
            let calls = msg.pods.iter().map(|(pod, pass)| {
                let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &pod.namespace);
                let target = WriteTarget::Pod {
                    namespace: pod.namespace.clone(),
                    name: pod.name.clone(),
                };
                let ctx = ctx.clone();
                async move {
                    let evict = async {
                        api.evict(&pod.name, &EvictParams::default())
                            .await
                            .map_err(Error::kube(format!("evicting {pod}")))
                    };
                    // Gone (404) is what an eviction is for; a PDB's 429 is
                    // the drain's "not yet", retried every pass.
                    let counts = |e: &Error| !matches!(code(e), Some(404 | 429));
                    let res: Result<_> = ctx.guarded_write(target, counts, evict).await;
                    (pod.clone(), *pass, res)
                }
            });
            let mut out = EvictOutcome::default();
            for (pod, pass, res) in futures::future::join_all(calls).await {
                match res {
                    Ok(_) => {
                        if !msg.firmware {
                            ctx.metrics
                                .inc_evicted(&msg.policy, crate::metrics::pass_label(pass));
                        }
                        tracing::info!(policy = msg.policy, pod = %pod, pass = pass.as_str(), "evicted");
                        out.evicted.push(pod);
                    }
                    Err(e) if code(&e) == Some(404) => out.evicted.push(pod),
                    Err(e) if code(&e) == Some(429) => {
                        if !msg.firmware {
                            ctx.metrics
                                .inc_drain_blocked(&msg.policy, crate::metrics::pass_label(pass));
                        }
                        tracing::info!(policy = msg.policy, pod = %pod, "eviction refused by a PodDisruptionBudget; will retry");
                        out.blocked.push(pod);
                    }
                    Err(Error::WriteHeld { .. }) => out.held.push(pod),
                    Err(e) => out.errors.push(e.to_string()),
                }
            }
            out
        })
    }
}
