//! RolloutActor (one per policy): decides which waiting nodes may start now,
//! enforcing `maxUnavailable` through [`crate::upgrade::rollout::plan`].

use actix::prelude::*;

use crate::upgrade::rollout::{Candidate, Plan, plan};

#[derive(Default)]
pub struct RolloutActor {
    last: Plan,
}

impl Actor for RolloutActor {
    type Context = actix::Context<Self>;
}

#[derive(Message, Debug, Clone)]
#[rtype(result = "Plan")]
pub struct PlanRollout {
    pub candidates: Vec<Candidate>,
    pub max_unavailable: usize,
}

impl Handler<PlanRollout> for RolloutActor {
    type Result = MessageResult<PlanRollout>;

    fn handle(&mut self, msg: PlanRollout, _: &mut Self::Context) -> Self::Result {
        let p = plan(&msg.candidates, msg.max_unavailable);
        if p.granted != self.last.granted && !p.granted.is_empty() {
            tracing::info!(granted = ?p.granted, unavailable = p.unavailable, max = p.max_unavailable, "rollout slots granted");
        }
        self.last = p.clone();
        MessageResult(p)
    }
}
