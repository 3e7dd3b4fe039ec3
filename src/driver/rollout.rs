//! RolloutActor (one per policy): owns the policy's rollout budget. It keeps
//! every node's slot facts ([`Candidate`]) and the slots it has handed out.
//! The budget is asked once: a plan ([`PlanRollout`]) reserves the slots it
//! grants, the pass hands each granted node its slot with the observation it
//! steps on, and the NodeActor gives it back (`ReleaseSlot`) when its cycle
//! ends (Done, Failed, or a step that did not use it). Every decision is
//! [`ttdrv_core::rollout::plan`]'s; messages are handled one at a time, so two
//! nodes can never take the last slot together.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use actix::prelude::*;

use ttdrv_core::rollout::{Candidate, Limits, Plan, plan};

pub struct RolloutActor {
    candidates: HashMap<String, Candidate>,
    /// Nodes holding a slot a plan granted, until given back or their facts
    /// say they neither wait to start nor run a cycle.
    held: BTreeSet<String>,
    limits: Limits,
    last: Plan,
    /// The names of `candidates`, handed to every plan's budget; rebuilt
    /// only when a node joins or leaves, not on every plan.
    fleet: Arc<BTreeSet<String>>,
}

impl Default for RolloutActor {
    fn default() -> Self {
        Self {
            candidates: HashMap::new(),
            held: BTreeSet::new(),
            // Nothing starts before the first facts arrive with the limits.
            limits: Limits {
                max_unavailable: 0,
                brake_percent: 0,
            },
            last: Plan::default(),
            fleet: Arc::default(),
        }
    }
}

impl Actor for RolloutActor {
    type Context = actix::Context<Self>;
}

impl RolloutActor {
    fn plan(&self) -> Plan {
        plan(self.candidates.values(), &self.held, self.limits)
    }
}

/// Fresh facts about some nodes (all of them when `replace`); replies with the
/// plan over every node known. Its `granted` nodes hold a slot from now on:
/// the pass passes it on to them ([`Observation::slot`]).
///
/// [`Observation::slot`]: ttdrv_core::machine::Observation::slot
#[derive(Message, Debug, Clone)]
#[rtype(result = "RolloutPlan")]
pub struct PlanRollout {
    pub replace: bool,
    pub updates: Vec<Candidate>,
    pub limits: Limits,
}

/// The plan, and the budget a start it granted is checked against at the
/// instant it takes its claim ([`crate::runtime::claims::Budget`]).
#[derive(Debug, Clone)]
pub struct RolloutPlan {
    pub plan: Plan,
    pub budget: std::sync::Arc<crate::runtime::claims::Budget>,
}

impl Handler<PlanRollout> for RolloutActor {
    type Result = MessageResult<PlanRollout>;

    fn handle(&mut self, msg: PlanRollout, _: &mut Self::Context) -> Self::Result {
        let before = self.candidates.len();
        if msg.replace {
            self.candidates.clear();
        }
        let mut joined = false;
        for c in msg.updates {
            joined |= self.candidates.insert(c.name.clone(), c).is_none();
        }
        if joined || self.candidates.len() != before {
            self.fleet = Arc::new(self.candidates.keys().cloned().collect());
        }
        self.limits = msg.limits;
        // A hold ends with the node's cycle even if its ReleaseSlot was lost
        // (actor restarted, node no longer owned): facts say it is not waiting
        // to start and not mid-cycle.
        let candidates = &self.candidates;
        self.held.retain(|n| {
            candidates
                .get(n)
                .is_some_and(|c| (c.wants_slot && c.ready) || c.in_progress)
        });
        let p = self.plan();
        for node in &p.granted {
            if self.held.insert(node.clone()) {
                tracing::info!(
                    node,
                    held = self.held.len(),
                    max = self.limits.max_unavailable,
                    "rollout slot taken"
                );
            }
        }
        if p.blocked != self.last.blocked
            && let Some(why) = &p.blocked
        {
            tracing::info!(
                blocked = why,
                unavailable = p.unavailable,
                max = p.max_unavailable,
                "rollout waits"
            );
        }
        self.last = p.clone();
        let budget = crate::runtime::claims::Budget {
            fleet: self.fleet.clone(),
            cap: self.limits.max_unavailable,
            out: self
                .candidates
                .values()
                .filter(|c| c.in_progress || c.unavailable || c.failed)
                .map(|c| c.name.clone())
                .collect(),
        };
        MessageResult(RolloutPlan {
            plan: p,
            budget: Arc::new(budget),
        })
    }
}

/// A NodeActor's cycle ended (Done, Failed, or back to waiting), or its step
/// did not use the slot it was granted: the slot goes back to the budget.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct ReleaseSlot {
    pub node: String,
}

impl Handler<ReleaseSlot> for RolloutActor {
    type Result = ();

    fn handle(&mut self, msg: ReleaseSlot, _: &mut Self::Context) {
        if self.held.remove(&msg.node) {
            tracing::debug!(node = msg.node, "rollout slot given back");
        }
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
            ready: true,
            prepared: true,
            ..Default::default()
        }
    }

    fn facts(replace: bool, updates: Vec<Candidate>) -> PlanRollout {
        PlanRollout {
            replace,
            updates,
            limits: Limits {
                max_unavailable: 1,
                brake_percent: 25,
            },
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
        let p = actor.send(facts(true, all)).await.expect("plan").plan;
        assert!(p.granted.is_empty(), "a holds the only slot: {p:?}");
        // A pass that looked at c only must not forget that a holds the slot.
        let p = actor
            .send(facts(false, vec![c("c", true, false)]))
            .await
            .expect("plan")
            .plan;
        assert!(p.granted.is_empty(), "{p:?}");
        assert_eq!(p.unavailable, 1);
        // a reaches Done: the slot goes to b, in name order.
        let p = actor
            .send(facts(false, vec![c("a", false, false)]))
            .await
            .expect("plan")
            .plan;
        assert_eq!(p.granted, ["b"]);
        // A full pass replaces what was known: a node no longer owned is gone.
        let p = actor
            .send(facts(true, vec![c("c", true, false)]))
            .await
            .expect("plan")
            .plan;
        assert_eq!(p.granted, ["c"]);
    }

    #[actix::test]
    async fn the_plan_comes_with_the_budget_its_starts_are_checked_against() {
        let actor = RolloutActor::default().start();
        let mut down = c("b", true, false);
        down.unavailable = true;
        let p = actor
            .send(facts(
                true,
                vec![c("a", false, true), down, c("c", true, false)],
            ))
            .await
            .expect("plan");
        assert_eq!(p.budget.cap, 1);
        assert_eq!(p.budget.fleet.len(), 3);
        let out: Vec<&str> = p.budget.out.iter().map(String::as_str).collect();
        assert_eq!(out, ["a", "b"], "ours in a cycle and the unavailable one");
        // A targeted plan (no node joins) hands out the same fleet, not a
        // copy of every name; a node that joins makes a new one.
        let again = actor
            .send(facts(false, vec![c("c", true, false)]))
            .await
            .expect("plan");
        assert!(Arc::ptr_eq(&p.budget.fleet, &again.budget.fleet));
        let joined = actor
            .send(facts(false, vec![c("d", true, false)]))
            .await
            .expect("plan");
        assert!(!Arc::ptr_eq(&p.budget.fleet, &joined.budget.fleet));
        assert_eq!(joined.budget.fleet.len(), 4);
    }

    #[actix::test]
    async fn a_granted_slot_is_held_until_given_back() {
        let actor = RolloutActor::default().start();
        // Five nodes, so that one NotReady stays under the fleet brake.
        let all = ["a", "b", "c", "d", "e"].map(|n| c(n, true, false));
        let p = actor
            .send(facts(true, all.to_vec()))
            .await
            .expect("plan")
            .plan;
        assert_eq!(p.granted, ["a"]);
        // A second plan before a's step shows: a still holds the only slot,
        // b gets nothing (the budget is not offered twice).
        let p = actor
            .send(facts(false, vec![c("b", true, false)]))
            .await
            .expect("plan")
            .plan;
        assert_eq!(p.granted, ["a"], "the holder is granted again, nobody else");
        assert_eq!(p.in_progress, 1);
        // a turns NotReady before it cordons: its hold ends (a NotReady node
        // never waits on a slot) and it is granted nothing.
        let mut down = c("a", true, false);
        down.ready = false;
        let p = actor
            .send(facts(false, vec![down]))
            .await
            .expect("plan")
            .plan;
        assert!(!p.granted.contains(&"a".to_string()), "{p:?}");
        // ... and b, next in line, gets the slot a no longer holds.
        assert_eq!(p.granted, ["b"]);
        // b cordons (mid-cycle), then gives the slot back at Done.
        actor
            .send(facts(false, vec![c("b", false, true)]))
            .await
            .expect("plan");
        let p = actor
            .send(facts(false, vec![c("a", true, false)]))
            .await
            .expect("plan")
            .plan;
        assert!(p.granted.is_empty(), "b mid-cycle holds the slot: {p:?}");
        actor
            .send(ReleaseSlot { node: "b".into() })
            .await
            .expect("reply");
        let p = actor
            .send(facts(false, vec![c("b", false, false)]))
            .await
            .expect("plan")
            .plan;
        assert_eq!(p.granted, ["a"], "given back: a may go");
    }

    #[actix::test]
    async fn a_slot_given_back_unused_goes_to_the_next_node() {
        let actor = RolloutActor::default().start();
        let p = actor
            .send(facts(true, vec![c("a", true, false), c("b", true, false)]))
            .await
            .expect("plan")
            .plan;
        assert_eq!(p.granted, ["a"]);
        // a's step did not cordon (say its module was already the target):
        // it gives the slot back and its facts no longer ask for one.
        actor
            .send(ReleaseSlot { node: "a".into() })
            .await
            .expect("reply");
        let p = actor
            .send(facts(false, vec![c("a", false, false)]))
            .await
            .expect("plan")
            .plan;
        assert_eq!(p.granted, ["b"]);
    }

    #[actix::test]
    async fn a_lost_release_ends_with_the_cycle() {
        let actor = RolloutActor::default().start();
        let p = actor
            .send(facts(true, vec![c("a", true, false), c("b", true, false)]))
            .await
            .expect("plan")
            .plan;
        assert_eq!(p.granted, ["a"]);
        // a finished (Done) but its ReleaseSlot never came.
        let p = actor
            .send(facts(false, vec![c("a", false, false)]))
            .await
            .expect("plan")
            .plan;
        assert_eq!(p.granted, ["b"]);
    }
}
