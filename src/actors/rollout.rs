//! RolloutActor (one per policy): decides which waiting nodes may start now,
//! enforcing `maxUnavailable` through [`crate::upgrade::rollout::plan`]. It keeps
//! every node's [`Candidate`] so a pass that looked at a few nodes only sends
//! those: slot accounting stays correct without re-observing the whole fleet.

use std::collections::HashMap;

use actix::prelude::*;

use crate::upgrade::rollout::{Candidate, Plan, plan};

#[derive(Default)]
pub struct RolloutActor {
    candidates: HashMap<String, Candidate>,
    last: Plan,
}

impl Actor for RolloutActor {
    type Context = actix::Context<Self>;
}

/// Fresh facts about some nodes (all of them when `replace`); replies with the
/// plan over every node known.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Plan")]
pub struct PlanRollout {
    pub replace: bool,
    pub updates: Vec<Candidate>,
    pub max_unavailable: usize,
}

impl Handler<PlanRollout> for RolloutActor {
    type Result = MessageResult<PlanRollout>;

    fn handle(&mut self, msg: PlanRollout, _: &mut Self::Context) -> Self::Result {
        if msg.replace {
            self.candidates.clear();
        }
        for c in msg.updates {
            self.candidates.insert(c.name.clone(), c);
        }
        let p = plan(self.candidates.values(), msg.max_unavailable);
        if p.granted != self.last.granted && !p.granted.is_empty() {
            tracing::info!(granted = ?p.granted, unavailable = p.unavailable, max = p.max_unavailable, "rollout slots granted");
        }
        self.last = p.clone();
        MessageResult(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(name: &str, wants_slot: bool, in_progress: bool) -> Candidate {
        Candidate {
            name: name.into(),
            wants_slot,
            in_progress,
            unavailable: false,
            failed: false,
            has_device_pods: false,
        }
    }

    #[actix::test]
    async fn partial_updates_keep_the_budget_of_nodes_not_resent() {
        let actor = RolloutActor::default().start();
        let all = vec![
            c("a", false, true),
            c("b", true, false),
            c("c", true, false),
        ];
        let p = actor
            .send(PlanRollout {
                replace: true,
                updates: all,
                max_unavailable: 1,
            })
            .await
            .expect("plan");
        assert!(p.granted.is_empty(), "a holds the only slot: {p:?}");
        // A pass that looked at c only must not forget that a holds the slot.
        let p = actor
            .send(PlanRollout {
                replace: false,
                updates: vec![c("c", true, false)],
                max_unavailable: 1,
            })
            .await
            .expect("plan");
        assert!(p.granted.is_empty(), "{p:?}");
        assert_eq!(p.unavailable, 1);
        // a reaches Done: the slot goes to b, in name order.
        let p = actor
            .send(PlanRollout {
                replace: false,
                updates: vec![c("a", false, false)],
                max_unavailable: 1,
            })
            .await
            .expect("plan");
        assert_eq!(p.granted, ["b"]);
        // A full pass replaces what was known: a node no longer owned is gone.
        let p = actor
            .send(PlanRollout {
                replace: true,
                updates: vec![c("c", true, false)],
                max_unavailable: 1,
            })
            .await
            .expect("plan");
        assert_eq!(p.granted, ["c"]);
    }
}
