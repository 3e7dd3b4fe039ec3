//! The in-process side of one disruption at a time ([`ttdrv_core::claim`]):
//! a driver cycle and a firmware cycle each take the node's claim here, in
//! the same instant as they decide to start, before anything is written. The
//! records on the Node carry the claim across restarts; this registry closes
//! the window between one actor's decision and its write showing in the
//! other's cache.
//!
//! It closes the same window for the budgets: each policy plans its starts
//! from its cache, where a cycle the other policy started a moment ago does
//! not show yet. A start that takes a node out of service is checked here,
//! under the registry's lock, against its policy's cap counting the nodes
//! the other starts have claimed meanwhile ([`Budget`]).

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

pub use ttdrv_core::claim::Holder;

#[derive(Default)]
pub struct Claims {
    /// Node → its holder, and whether its cycle took it out of service (was
    /// taken within a budget): only those count against a budget.
    held: Mutex<HashMap<String, (Holder, bool)>>,
}

/// What a start that takes a node out of service must stay within: its
/// policy's nodes, its cap, and those of its nodes the plan saw out of
/// service (in a cycle of ours, NotReady, cordoned, Failed).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Budget {
    pub fleet: BTreeSet<String>,
    pub cap: usize,
    pub out: BTreeSet<String>,
}

/// Why a node's claim was not taken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Another cycle holds the node.
    Held(Holder),
    /// Starting would put more of the policy's nodes out of service than its
    /// cap: cycles claimed since the plan (the other policy's) took the place.
    OverBudget { out: usize, cap: usize },
}

impl Claims {
    /// Takes `node` for `holder`, a start that takes it out of service
    /// within `budget` (a node out of service already takes no place).
    pub fn take_within(
        &self,
        node: &str,
        holder: Holder,
        budget: Option<&Budget>,
    ) -> Result<(), Refused> {
        let mut held = self
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match held.get(node) {
            Some((h, _)) if *h == holder => return Ok(()),
            Some((h, _)) => return Err(Refused::Held(h.clone())),
            None => {}
        }
        if let Some(b) = budget.filter(|b| !b.out.contains(node)) {
            let claimed = b.fleet.iter().filter(|n| {
                n.as_str() != node && held.get(n.as_str()).is_some_and(|(_, out)| *out)
            });
            let out: BTreeSet<&String> = b.out.iter().chain(claimed).collect();
            if out.len() + 1 > b.cap {
                return Err(Refused::OverBudget {
                    out: out.len(),
                    cap: b.cap,
                });
            }
        }
        held.insert(node.to_string(), (holder, budget.is_some()));
        Ok(())
    }

    /// Gives `node` back, if `holder` has it.
    pub fn release(&self, node: &str, holder: &Holder) {
        let mut held = self
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if held.get(node).is_some_and(|(h, _)| h == holder) {
            held.remove(node);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_at_a_time() {
        let c = Claims::default();
        let (d, f) = (Holder::Driver("d".into()), Holder::Firmware("f".into()));
        let take = |h: &Holder| c.take_within("n", h.clone(), None);
        assert_eq!(take(&d), Ok(()));
        assert_eq!(take(&d), Ok(()), "taken again by its holder");
        assert_eq!(take(&f), Err(Refused::Held(d.clone())));
        c.release("n", &f);
        assert_eq!(
            take(&f),
            Err(Refused::Held(d.clone())),
            "only the holder releases"
        );
        c.release("n", &d);
        assert_eq!(take(&f), Ok(()));
    }

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn starts_of_both_policies_share_the_cap_as_they_happen() {
        let c = Claims::default();
        let (d, f) = (Holder::Driver("d".into()), Holder::Firmware("f".into()));
        // Both planned from caches where only the admin's node `x` is out:
        // each may take one more node out of service (cap 2).
        let fleet = set(&["a", "b", "x"]);
        let budget = Budget {
            fleet: fleet.clone(),
            cap: 2,
            out: set(&["x"]),
        };
        assert_eq!(c.take_within("a", d.clone(), Some(&budget)), Ok(()));
        // The firmware's start a moment later would make three.
        assert_eq!(
            c.take_within("b", f.clone(), Some(&budget)),
            Err(Refused::OverBudget { out: 2, cap: 2 })
        );
        // A node out of service already takes no place.
        assert_eq!(c.take_within("x", f.clone(), Some(&budget)), Ok(()));
        c.release("x", &f);
        // Once `a`'s cycle ends (its claim given back), there is room.
        c.release("a", &d);
        assert_eq!(c.take_within("b", f.clone(), Some(&budget)), Ok(()));
        // A claim taken without a budget (a cycle that drains nothing, a
        // first install) does not count either.
        assert_eq!(c.take_within("a", d.clone(), None), Ok(()));
        c.release("b", &f);
        assert_eq!(c.take_within("b", f.clone(), Some(&budget)), Ok(()));
        c.release("a", &d);
        // A claim outside the fleet does not count.
        let other = Budget {
            fleet: set(&["c", "e"]),
            cap: 1,
            out: BTreeSet::new(),
        };
        assert_eq!(c.take_within("c", d.clone(), Some(&other)), Ok(()));
        // And a claim re-taken by its holder is never refused.
        assert_eq!(c.take_within("c", d, Some(&other)), Ok(()));
    }
}
