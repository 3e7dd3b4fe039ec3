//! Rollout sequencing: which Pending nodes may start a disruptive cycle now.
//! The RolloutActor holds the slots it handed out and asks [`plan`] before it
//! hands out another, so the rule below is enforced in one place.
//!
//! At most `maxUnavailable` nodes are out of service at once. Out of service means
//! in one of our disruptive states, or unavailable for another reason (NotReady,
//! cordoned by someone else, or Failed and left cordoned). A node that is already
//! out of service costs nothing to start. A Failed node halts the rollout.

use std::collections::BTreeSet;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub name: String,
    /// Waiting in Pending for a module swap.
    pub wants_slot: bool,
    /// Occupies a slot because of us (Cordoning..Uncordoning with drain).
    pub in_progress: bool,
    /// NotReady or unschedulable, independently of our in-progress states.
    pub unavailable: bool,
    pub failed: bool,
    /// Non-installer pods on the node use the device (drained last).
    pub has_device_pods: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Nodes allowed to start now.
    pub granted: Vec<String>,
    pub unavailable: usize,
    pub max_unavailable: usize,
    /// Why nothing more can start, for the Progressing condition.
    pub blocked: Option<String>,
}

/// Deterministic rollout order: nodes without device users first, then by name.
pub fn order_key(c: &Candidate) -> (bool, String) {
    (c.has_device_pods, c.name.clone())
}

/// The plan over every known node. `held` are the nodes holding a slot handed
/// out earlier (they count as in progress until given back); held nodes still
/// waiting to cordon are granted again, ahead of the rest.
pub fn plan<'a>(
    candidates: impl IntoIterator<Item = &'a Candidate>,
    held: &BTreeSet<String>,
    max_unavailable: usize,
) -> Plan {
    let candidates: Vec<&Candidate> = candidates.into_iter().collect();
    let holds = |c: &Candidate| held.contains(&c.name);
    let unavailable = candidates
        .iter()
        .filter(|c| c.in_progress || holds(c) || c.unavailable || c.failed)
        .count();
    let mut plan = Plan {
        unavailable,
        max_unavailable,
        ..Default::default()
    };
    let mut failed: Vec<&str> = candidates
        .iter()
        .filter(|c| c.failed)
        .map(|c| c.name.as_str())
        .collect();
    if !failed.is_empty() {
        failed.sort_unstable();
        plan.blocked = Some(format!(
            "halted: node(s) {} Failed; retry them to continue",
            failed.join(", ")
        ));
        return plan;
    }
    plan.granted = candidates
        .iter()
        .filter(|c| c.wants_slot && holds(c))
        .map(|c| c.name.clone())
        .collect();
    plan.granted.sort_unstable();
    let mut waiting: Vec<&Candidate> = candidates
        .into_iter()
        .filter(|c| c.wants_slot && !holds(c))
        .collect();
    // Already-unavailable nodes first (starting them costs no extra
    // availability), then nodes without device users, then by name.
    waiting.sort_by(|a, b| {
        (!a.unavailable, a.has_device_pods, &a.name).cmp(&(
            !b.unavailable,
            b.has_device_pods,
            &b.name,
        ))
    });
    let mut budget = max_unavailable.saturating_sub(unavailable);
    for c in waiting {
        if c.unavailable {
            plan.granted.push(c.name.clone());
        } else if budget > 0 {
            budget -= 1;
            plan.granted.push(c.name.clone());
        } else {
            plan.blocked = Some(format!(
                "{unavailable} of at most {max_unavailable} node(s) unavailable; next waiting: {}",
                c.name
            ));
            break;
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan<'a>(cs: impl IntoIterator<Item = &'a Candidate>, max: usize) -> Plan {
        super::plan(cs, &BTreeSet::new(), max)
    }

    fn c(name: &str) -> Candidate {
        Candidate {
            name: name.into(),
            wants_slot: true,
            in_progress: false,
            unavailable: false,
            failed: false,
            has_device_pods: false,
        }
    }

    #[test]
    fn one_at_a_time_in_order() {
        let mut b = c("b");
        b.has_device_pods = true;
        let nodes = vec![c("c"), b, c("a")];
        assert_eq!(plan(&nodes, 1).granted, ["a"]);
        assert_eq!(plan(&nodes, 2).granted, ["a", "c"]);
        assert_eq!(
            plan(&nodes, 3).granted,
            ["a", "c", "b"],
            "device users last"
        );
    }

    #[test]
    fn in_progress_and_external_unavailability_use_the_budget() {
        let mut busy = c("busy");
        busy.wants_slot = false;
        busy.in_progress = true;
        let mut notready = c("notready");
        notready.wants_slot = false;
        notready.unavailable = true;
        assert!(plan(&[busy.clone(), c("x")], 1).granted.is_empty());
        assert!(plan(&[notready.clone(), c("x")], 1).granted.is_empty());
        assert_eq!(plan(&[busy, notready, c("x")], 3).granted, ["x"]);
    }

    #[test]
    fn already_unavailable_node_starts_for_free() {
        let mut cordoned = c("z-admin");
        cordoned.unavailable = true;
        let p = plan(&[c("a"), cordoned], 1);
        assert_eq!(
            p.granted,
            ["z-admin"],
            "the admin-cordoned node fills the only slot, at no extra cost"
        );
    }

    #[test]
    fn failed_node_halts_everything() {
        let mut f = c("f");
        f.wants_slot = false;
        f.failed = true;
        let p = plan(&[f, c("a")], 5);
        assert!(p.granted.is_empty());
        assert!(p.blocked.unwrap_or_default().contains("f"));
    }

    #[test]
    fn held_slots_count_and_are_granted_again() {
        let held: BTreeSet<String> = ["b".to_string()].into();
        // b holds the only slot but has not cordoned yet: b again, nobody else.
        let p = super::plan(&[c("a"), c("b")], &held, 1);
        assert_eq!(p.granted, ["b"]);
        assert_eq!(p.unavailable, 1);
        // b is mid-cycle and still holds: nothing to grant.
        let mut b = c("b");
        b.wants_slot = false;
        b.in_progress = true;
        let p = super::plan(&[c("a"), b.clone()], &held, 1);
        assert!(p.granted.is_empty());
        assert_eq!(p.unavailable, 1, "a held, in-progress node counts once");
        // Two slots: a gets the second.
        assert_eq!(super::plan(&[c("a"), b], &held, 2).granted, ["a"]);
    }
}
