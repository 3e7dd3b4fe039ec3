//! The slot book: who holds each node's one maintenance slot, and whether a
//! start that takes a node out of service fits its policy's budget, for
//! every policy kind. A leaf: the kinds plug in through [`Cycle`], so this
//! module names none of them.
//!
//! Every start goes through [`gate`] in the same instant as the decision:
//! the claim is taken (or refused) before anything is written, and a refusal
//! re-steps the machine once with the refusal in its observation, so the
//! node waits with a reason instead of starting. The controller keeps one
//! book behind a lock (`src/claims.rs`); the records on the Node carry the
//! claim across restarts ([`crate::claim`] reads them back).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

/// Who holds a node's maintenance slot: a policy's cycle, of a kind. Each
/// kind names itself with a [`HolderKind`] of its own, so this module names
/// none of them.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Holder {
    pub kind: &'static HolderKind,
    pub policy: String,
}

/// A kind of cycle that holds slots, as a refusal names it: "the {noun}
/// {policy}'s {cycle}".
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct HolderKind {
    /// Short and stable ("driver").
    pub name: &'static str,
    /// The policy as a person calls it ("driver policy").
    pub noun: &'static str,
    /// Its cycle ("upgrade").
    pub cycle: &'static str,
}

impl Holder {
    pub fn new(kind: &'static HolderKind, policy: String) -> Self {
        Self { kind, policy }
    }
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let k = self.kind;
        write!(f, "the {} {}'s {}", k.noun, self.policy, k.cycle)
    }
}

/// What a start that takes a node out of service must stay within: its
/// policy's nodes, its cap, and those of its nodes the plan saw out of
/// service (in a cycle of ours, NotReady, cordoned, Failed).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Budget {
    /// Shared: a policy's plans hand out the same set until its nodes change.
    pub fleet: Arc<BTreeSet<String>>,
    pub cap: usize,
    pub out: BTreeSet<String>,
}

/// Why a node's slot was not taken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Another cycle holds the node.
    Held(Holder),
    /// Starting would put more of the policy's nodes out of service than its
    /// cap: cycles claimed since the plan (another policy's) took the place.
    OverBudget { out: usize, cap: usize },
}

/// The book itself: node → its holder, and whether its cycle took it out of
/// service (was taken within a budget): only those count against a budget.
#[derive(Clone, Debug, Default)]
pub struct SlotBook {
    held: HashMap<String, (Holder, bool)>,
}

impl SlotBook {
    /// Takes `node` for `holder`, a start that takes it out of service
    /// within `budget` (a node out of service already takes no place). Its
    /// holder taking it again is never refused.
    pub fn take(
        &mut self,
        node: &str,
        holder: Holder,
        budget: Option<&Budget>,
    ) -> Result<(), Refused> {
        match self.held.get(node) {
            Some((h, _)) if *h == holder => return Ok(()),
            Some((h, _)) => return Err(Refused::Held(h.clone())),
            None => {}
        }
        if let Some(b) = budget.filter(|b| !b.out.contains(node)) {
            // The book's holds, not the fleet, are walked: a few nodes, not
            // every node of the policy.
            let claimed = self
                .held
                .iter()
                .filter(|(n, (_, out))| *out && n.as_str() != node && b.fleet.contains(*n))
                .map(|(n, _)| n);
            let out: BTreeSet<&String> = b.out.iter().chain(claimed).collect();
            if out.len() + 1 > b.cap {
                return Err(Refused::OverBudget {
                    out: out.len(),
                    cap: b.cap,
                });
            }
        }
        self.held
            .insert(node.to_string(), (holder, budget.is_some()));
        Ok(())
    }

    /// Gives `node` back, if `holder` has it.
    pub fn release(&mut self, node: &str, holder: &Holder) {
        if self.held.get(node).is_some_and(|(h, _)| h == holder) {
            self.held.remove(node);
        }
    }

    /// Who holds `node` in this book.
    pub fn holder(&self, node: &str) -> Option<&Holder> {
        self.held.get(node).map(|(h, _)| h)
    }
}

/// What the runtime needs of a kind's node machine to gate a start on the
/// slot book: its step function and the two facts a refusal sets.
pub trait Cycle {
    type Record;
    type Observation;
    type Desired;
    type Step;

    /// The holder a cycle of `policy` of this kind is booked as.
    fn holder(policy: &str) -> Holder;
    fn step(rec: &Self::Record, obs: &Self::Observation, want: &Self::Desired) -> Self::Step;
    fn next_record(step: &Self::Step) -> &Self::Record;
    /// `next` starts a cycle that `prev` was not in: it needs the slot.
    fn starts_cycle(prev: &Self::Record, next: &Self::Record) -> bool;
    /// The cycle takes the node out of service: it counts against the budget.
    fn occupies_slot(rec: &Self::Record) -> bool;
    /// The observation's "another cycle holds the node" fact.
    fn held_by(obs: &mut Self::Observation) -> &mut Option<Holder>;
    /// The observation's "the rollout granted a slot" fact.
    fn slot(obs: &mut Self::Observation) -> &mut bool;
}

/// Steps `prev` under `obs`; when that starts a cycle, takes the node's slot
/// through `take` (the book, under its lock) in the same instant, and on a
/// refusal re-steps once with it in `obs` (held by another cycle: the node
/// waits naming it; over budget: the grant is withdrawn). The refusal is
/// returned for the log.
pub fn gate<K: Cycle>(
    take: impl FnOnce(Holder, Option<&Budget>) -> Result<(), Refused>,
    policy: &str,
    prev: &K::Record,
    obs: &mut K::Observation,
    want: &K::Desired,
    budget: &Budget,
) -> (K::Step, Option<Refused>) {
    let next = K::step(prev, obs, want);
    let rec = K::next_record(&next);
    if !K::starts_cycle(prev, rec) {
        return (next, None);
    }
    let budget = Some(budget).filter(|_| K::occupies_slot(rec));
    match take(K::holder(policy), budget) {
        Ok(()) => (next, None),
        Err(refused) => {
            match &refused {
                Refused::Held(other) => *K::held_by(obs) = Some(other.clone()),
                Refused::OverBudget { .. } => *K::slot(obs) = false,
            }
            (K::step(prev, obs, want), Some(refused))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_at_a_time() {
        let mut c = SlotBook::default();
        let (d, f) = (Holder::driver("d".into()), Holder::firmware("f".into()));
        assert_eq!(c.take("n", d.clone(), None), Ok(()));
        assert_eq!(
            c.take("n", d.clone(), None),
            Ok(()),
            "taken again by its holder"
        );
        assert_eq!(c.take("n", f.clone(), None), Err(Refused::Held(d.clone())));
        c.release("n", &f);
        assert_eq!(
            c.take("n", f.clone(), None),
            Err(Refused::Held(d.clone())),
            "only the holder releases"
        );
        assert_eq!(c.holder("n"), Some(&d));
        c.release("n", &d);
        assert_eq!(c.take("n", f.clone(), None), Ok(()));
        assert_eq!(c.holder("n"), Some(&f));
    }

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn starts_of_both_kinds_share_the_cap_as_they_happen() {
        let mut c = SlotBook::default();
        let (d, f) = (Holder::driver("d".into()), Holder::firmware("f".into()));
        // Both planned from caches where only the admin's node `x` is out:
        // each may take one more node out of service (cap 2).
        let budget = Budget {
            fleet: Arc::new(set(&["a", "b", "x"])),
            cap: 2,
            out: set(&["x"]),
        };
        assert_eq!(c.take("a", d.clone(), Some(&budget)), Ok(()));
        // The firmware's start a moment later would make three.
        assert_eq!(
            c.take("b", f.clone(), Some(&budget)),
            Err(Refused::OverBudget { out: 2, cap: 2 })
        );
        // A node out of service already takes no place.
        assert_eq!(c.take("x", f.clone(), Some(&budget)), Ok(()));
        c.release("x", &f);
        // Once `a`'s cycle ends (its slot given back), there is room.
        c.release("a", &d);
        assert_eq!(c.take("b", f.clone(), Some(&budget)), Ok(()));
        // A slot taken without a budget (a cycle that drains nothing, a
        // first install) does not count either.
        assert_eq!(c.take("a", d.clone(), None), Ok(()));
        c.release("b", &f);
        assert_eq!(c.take("b", f.clone(), Some(&budget)), Ok(()));
        c.release("a", &d);
        // A slot outside the fleet does not count.
        let other = Budget {
            fleet: Arc::new(set(&["c", "e"])),
            cap: 1,
            out: BTreeSet::new(),
        };
        assert_eq!(c.take("c", d.clone(), Some(&other)), Ok(()));
        assert_eq!(c.take("c", d, Some(&other)), Ok(()));
    }

    /// A toy kind: the record is "in a cycle", the step starts one when the
    /// slot is granted and nothing holds the node.
    struct Toy;
    #[derive(Default)]
    struct Obs {
        slot: bool,
        held_by: Option<Holder>,
    }
    impl Cycle for Toy {
        type Record = bool;
        type Observation = Obs;
        type Desired = bool; // occupies a slot
        type Step = (bool, bool);
        fn holder(policy: &str) -> Holder {
            Holder::firmware(policy.into())
        }
        fn step(_: &bool, obs: &Obs, want: &bool) -> (bool, bool) {
            (obs.slot && obs.held_by.is_none(), *want)
        }
        fn next_record(step: &(bool, bool)) -> &bool {
            &step.0
        }
        fn starts_cycle(prev: &bool, next: &bool) -> bool {
            !prev && *next
        }
        fn occupies_slot(_: &bool) -> bool {
            true
        }
        fn held_by(obs: &mut Obs) -> &mut Option<Holder> {
            &mut obs.held_by
        }
        fn slot(obs: &mut Obs) -> &mut bool {
            &mut obs.slot
        }
    }

    #[test]
    fn the_gate_takes_the_slot_or_re_steps_once_with_the_refusal() {
        let budget = Budget {
            fleet: Arc::new(set(&["n", "m"])),
            cap: 1,
            out: BTreeSet::new(),
        };
        let mut book = SlotBook::default();
        // Granted and free: the cycle starts, the book holds the node.
        let mut obs = Obs {
            slot: true,
            ..Obs::default()
        };
        let take = |h, b: Option<&Budget>| book.take("n", h, b);
        let (next, refused) = gate::<Toy>(take, "p", &false, &mut obs, &true, &budget);
        assert_eq!((next.0, refused), (true, None));
        assert_eq!(book.holder("n"), Some(&Holder::firmware("p".into())));

        // Held by another kind's cycle: the step is redone with held_by set.
        let mut held = SlotBook::default();
        held.take("n", Holder::driver("d".into()), None)
            .expect("free");
        let mut obs = Obs {
            slot: true,
            ..Obs::default()
        };
        let take = |h, b: Option<&Budget>| held.take("n", h, b);
        let (next, refused) = gate::<Toy>(take, "p", &false, &mut obs, &true, &budget);
        assert!(!next.0, "no start while another cycle holds the node");
        assert_eq!(refused, Some(Refused::Held(Holder::driver("d".into()))));
        assert_eq!(obs.held_by, Some(Holder::driver("d".into())));

        // Over budget (`n` took the one place): the grant is withdrawn.
        let mut obs = Obs {
            slot: true,
            ..Obs::default()
        };
        let take = |h, b: Option<&Budget>| book.take("m", h, b);
        let (next, refused) = gate::<Toy>(take, "q", &false, &mut obs, &true, &budget);
        assert!(!next.0 && !obs.slot);
        assert_eq!(refused, Some(Refused::OverBudget { out: 1, cap: 1 }));

        // No start, no booking.
        let mut obs = Obs::default();
        let take = |h, b: Option<&Budget>| book.take("m", h, b);
        let (_, refused) = gate::<Toy>(take, "q", &false, &mut obs, &true, &budget);
        assert_eq!((refused, book.holder("m")), (None, None));
    }
}
