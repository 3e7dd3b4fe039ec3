//! RolloutActor (one per policy): owns the policy's rollout budget. It keeps
//! every node's slot facts ([`Candidate`]) and the slots it has handed out; a
//! NodeActor asks it for a slot (`AcquireSlot`) before it cordons and gives it
//! back (`ReleaseSlot`) when its cycle ends (Done or Failed). Every decision is
//! [`ttdrv_core::rollout::plan`]'s; messages are handled one at a time, so two
//! nodes can never take the last slot together.

use std::collections::{BTreeSet, HashMap};

use actix::prelude::*;

use ttdrv_core::rollout::{Candidate, Limits, Plan, plan};

pub struct RolloutActor {
    candidates: HashMap<String, Candidate>,
    /// Nodes holding a slot handed out by `AcquireSlot`.
    held: BTreeSet<String>,
    limits: Limits,
    last: Plan,
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
/// plan over every node known: the nodes that may ask for a slot now.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Plan")]
pub struct PlanRollout {
    pub replace: bool,
    pub updates: Vec<Candidate>,
    pub limits: Limits,
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
        if p.granted != self.last.granted && !p.granted.is_empty() {
            tracing::info!(granted = ?p.granted, unavailable = p.unavailable, max = p.max_unavailable, "rollout slots offered");
        }
        self.last = p.clone();
        MessageResult(p)
    }
}

/// A NodeActor about to cordon (start a disruptive cycle) asks for a slot;
/// `true` when it holds one (asking again while holding is a no-op).
#[derive(Message, Debug, Clone)]
#[rtype(result = "bool")]
pub struct AcquireSlot {
    pub node: String,
}

impl Handler<AcquireSlot> for RolloutActor {
    type Result = bool;

    fn handle(&mut self, msg: AcquireSlot, _: &mut Self::Context) -> bool {
        let plan = self.plan();
        if self.held.contains(&msg.node) {
            // Asked again while holding: yes, unless the node turned NotReady
            // or the brake is on (it must not cordon now).
            let ready = self.candidates.get(&msg.node).is_none_or(|c| c.ready);
            return ready && plan.braked.is_none();
        }
        let granted = plan.granted.contains(&msg.node);
        if granted {
            tracing::info!(
                node = msg.node,
                held = self.held.len() + 1,
                max = self.limits.max_unavailable,
                "rollout slot taken"
            );
            self.held.insert(msg.node.clone());
            // Until the next facts arrive, the node counts as mid-cycle.
            if let Some(c) = self.candidates.get_mut(&msg.node) {
                c.in_progress = true;
                c.wants_slot = false;
            }
        }
        granted
    }
}

/// A NodeActor's cycle ended (Done, Failed, or back to waiting): its slot goes
/// back to the budget.
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
            unavailable: false,
            failed: false,
            has_device_pods: false,
            prepared: true,
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
        let p = actor.send(facts(true, all)).await.expect("plan");
        assert!(p.granted.is_empty(), "a holds the only slot: {p:?}");
        // A pass that looked at c only must not forget that a holds the slot.
        let p = actor
            .send(facts(false, vec![c("c", true, false)]))
            .await
            .expect("plan");
        assert!(p.granted.is_empty(), "{p:?}");
        assert_eq!(p.unavailable, 1);
        // a reaches Done: the slot goes to b, in name order.
        let p = actor
            .send(facts(false, vec![c("a", false, false)]))
            .await
            .expect("plan");
        assert_eq!(p.granted, ["b"]);
        // A full pass replaces what was known: a node no longer owned is gone.
        let p = actor
            .send(facts(true, vec![c("c", true, false)]))
            .await
            .expect("plan");
        assert_eq!(p.granted, ["c"]);
    }

    #[actix::test]
    async fn one_slot_one_holder_until_given_back() {
        let actor = RolloutActor::default().start();
        let p = actor
            .send(facts(true, vec![c("a", true, false), c("b", true, false)]))
            .await
            .expect("plan");
        assert_eq!(p.granted, ["a"]);
        let ask = |n: &str| {
            actor.send(AcquireSlot {
                node: n.to_string(),
            })
        };
        assert!(!ask("b").await.expect("reply"), "b is not next");
        assert!(ask("a").await.expect("reply"));
        assert!(ask("a").await.expect("reply"), "asking again keeps it");
        // a turns NotReady before it cordons: it may not cordon now, and its
        // hold ends (a NotReady node never waits on a slot).
        let mut down = c("a", true, false);
        down.ready = false;
        actor.send(facts(false, vec![down])).await.expect("plan");
        assert!(!ask("a").await.expect("reply"), "NotReady never cordons");
        // Back: a is first in line again.
        actor
            .send(facts(false, vec![c("a", true, false)]))
            .await
            .expect("plan");
        assert!(ask("a").await.expect("reply"));
        // Facts from a pass that observed a before it cordoned: still Pending.
        let p = actor
            .send(facts(false, vec![c("a", true, false)]))
            .await
            .expect("plan");
        assert_eq!(p.granted, ["a"], "the holder keeps its slot");
        assert!(!ask("b").await.expect("reply"), "the only slot is taken");
        actor
            .send(ReleaseSlot { node: "a".into() })
            .await
            .expect("reply");
        actor
            .send(facts(false, vec![c("a", false, false)]))
            .await
            .expect("plan");
        assert!(ask("b").await.expect("reply"), "given back: b may go");
    }

    #[actix::test]
    async fn a_lost_release_ends_with_the_cycle() {
        let actor = RolloutActor::default().start();
        actor
            .send(facts(true, vec![c("a", true, false), c("b", true, false)]))
            .await
            .expect("plan");
        assert!(
            actor
                .send(AcquireSlot { node: "a".into() })
                .await
                .expect("reply")
        );
        // a finished (Done) but its ReleaseSlot never came.
        let p = actor
            .send(facts(false, vec![c("a", false, false)]))
            .await
            .expect("plan");
        assert_eq!(p.granted, ["b"]);
    }
}
