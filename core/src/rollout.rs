//! Rollout sequencing: which Pending nodes may start a disruptive cycle now.
//! The RolloutActor holds the slots it handed out and asks [`plan`] before it
//! hands out another, so these rules are enforced in one place:
//!
//! - **Hard cap.** At no instant are more than `maxUnavailable` nodes of a
//!   policy in our disruptive states (Cordoning through Uncordoning, or
//!   holding a slot to get there), whatever their availability.
//! - **Availability.** A node still in service starts only while the nodes out
//!   of service — ours, and those NotReady, cordoned by someone else or Failed —
//!   stay within `maxUnavailable`. A node already out of service for another
//!   reason but Ready (an admin's cordon) goes first, inside the cap: starting it
//!   takes no extra node out of service.
//! - **Readiness.** A node that is not Ready never starts.
//! - **Fleet-health brake.** When more than `brake_percent` of the policy's
//!   nodes are NotReady, nothing starts until enough are back.
//! - **Failure budget.** A Failed node halts the rollout.
//! - **Order.** Nodes start in the rollout's order. With build-ahead a node
//!   starts only once prepared, and one still building holds back the nodes
//!   after it (builds start in the same order, so this costs at most the
//!   spread of build times), so the order `kubectl tt driver plan` shows is
//!   the order nodes are cordoned in.

use std::collections::BTreeSet;

use crate::machine::{Hold, NodeRecord};
use crate::reason;
use crate::window::{self, Gate, Window};

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Candidate {
    pub name: String,
    /// Waiting in Pending for a module swap.
    pub wants_slot: bool,
    /// Occupies a slot because of us (Cordoning..Uncordoning with drain).
    pub in_progress: bool,
    /// The node's Ready condition is True.
    pub ready: bool,
    /// NotReady or unschedulable, independently of our in-progress states.
    pub unavailable: bool,
    /// Why, when `unavailable` ([`crate::node::out_of_service_because`]): a
    /// rollout that waits on the node names it.
    pub unavailable_because: Option<String>,
    pub failed: bool,
    /// Non-installer pods on the node use the device (drained last).
    pub has_device_pods: bool,
    /// Build-ahead lets it start ([`crate::prepare::gate`]; always true with
    /// build-ahead off).
    pub prepared: bool,
}

/// The limits a plan keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_unavailable: usize,
    /// Start nothing while more than this share (percent) of the nodes is
    /// NotReady.
    pub brake_percent: u32,
}

/// Default of the fleet-health brake: a quarter of the nodes NotReady.
pub const DEFAULT_BRAKE_PERCENT: u32 = 25;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Nodes allowed to start now (those holding a slot and still waiting
    /// to cordon included).
    pub granted: Vec<String>,
    /// Nodes in our disruptive states or holding a slot.
    pub in_progress: usize,
    /// Nodes out of service: ours and those unavailable for other reasons.
    pub unavailable: usize,
    pub max_unavailable: usize,
    /// Nodes whose Ready condition is not True.
    pub not_ready: usize,
    /// The fleet-health brake is on: the NotReady nodes, sorted.
    pub braked: Option<Vec<String>>,
    /// Why nothing more can start, for the Progressing condition.
    pub blocked: Option<String>,
    /// New starts are held ([`hold`]): the reason (`Soaking`,
    /// `OutsideMaintenanceWindow`), for the condition and the metrics.
    pub held: Option<&'static str>,
    /// When the budget is what holds the next node back: the nodes out of
    /// service for reasons that are not ours (node, why), sorted. Someone
    /// else's cordon is named instead of a silent stall.
    pub waiting_on: Vec<(String, String)>,
}

/// Deterministic rollout order: nodes without device users first, then by name.
pub fn order_key(c: &Candidate) -> (bool, String) {
    (c.has_device_pods, c.name.clone())
}

/// The plan over every known node. `held` are the nodes holding a slot
/// handed out earlier: they count as ours until given back.
pub fn plan<'a>(
    candidates: impl IntoIterator<Item = &'a Candidate>,
    held: &BTreeSet<String>,
    limits: Limits,
) -> Plan {
    let candidates: Vec<&Candidate> = candidates.into_iter().collect();
    let max = limits.max_unavailable;
    let ours_of = |c: &Candidate| c.in_progress || held.contains(&c.name);
    let mut ours = candidates.iter().filter(|c| ours_of(c)).count();
    let mut others = candidates
        .iter()
        .filter(|c| !ours_of(c) && (c.unavailable || c.failed))
        .count();
    let mut plan = Plan {
        in_progress: ours,
        unavailable: ours + others,
        max_unavailable: max,
        not_ready: candidates.iter().filter(|c| !c.ready).count(),
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
    let mut not_ready: Vec<String> = candidates
        .iter()
        .filter(|c| !c.ready)
        .map(|c| c.name.clone())
        .collect();
    not_ready.sort_unstable();
    // The brake matters only to a rollout with nodes waiting to start.
    let waiting_any = candidates.iter().any(|c| c.wants_slot);
    if waiting_any && not_ready.len() * 100 > limits.brake_percent as usize * candidates.len() {
        plan.blocked = Some(format!(
            "braked: {} of {} node(s) NotReady (more than {}%): {}",
            not_ready.len(),
            candidates.len(),
            limits.brake_percent,
            not_ready.join(", ")
        ));
        plan.braked = Some(not_ready);
        return plan;
    }
    // Holders still waiting to cordon keep their slot (if Ready).
    plan.granted = candidates
        .iter()
        .filter(|c| c.wants_slot && c.ready && held.contains(&c.name))
        .map(|c| c.name.clone())
        .collect();
    plan.granted.sort_unstable();
    let mut waiting: Vec<&Candidate> = candidates
        .iter()
        .copied()
        .filter(|c| c.wants_slot && !held.contains(&c.name))
        .collect();
    // Nodes already out of service first (starting them takes no extra node
    // out of service), then nodes without device users, then by name.
    waiting.sort_by(|a, b| {
        (!a.unavailable, a.has_device_pods, &a.name).cmp(&(
            !b.unavailable,
            b.has_device_pods,
            &b.name,
        ))
    });
    let mut skipped_not_ready = vec![];
    for c in waiting {
        if !c.ready {
            skipped_not_ready.push(c.name.as_str());
            continue;
        }
        if !c.prepared {
            plan.blocked = Some(format!(
                "next in order: {} has not prepared the target yet (built ahead of its cordon; its status message says how far it is)",
                c.name
            ));
            break;
        }
        let fits = ours < max && (c.unavailable || ours + others < max);
        if !fits {
            plan.waiting_on = out_of_service_for_others(&candidates, &ours_of);
            let named: Vec<String> = plan
                .waiting_on
                .iter()
                .map(|(n, why)| format!("{n} {why}"))
                .collect();
            let others_note = if named.is_empty() {
                String::new()
            } else {
                format!(
                    "; out of service, not by this rollout: {}",
                    named.join(", ")
                )
            };
            plan.blocked = Some(format!(
                "{} of at most {max} node(s) upgrading, {} out of service; next waiting: {}{others_note}",
                ours,
                ours + others,
                c.name
            ));
            break;
        }
        if c.unavailable {
            others -= 1;
        }
        ours += 1;
        plan.granted.push(c.name.clone());
    }
    if plan.blocked.is_none() && !skipped_not_ready.is_empty() {
        plan.blocked = Some(format!(
            "waiting for node(s) to be Ready: {}",
            skipped_not_ready.join(", ")
        ));
    }
    plan
}

/// The nodes that take the budget for reasons not ours, with why.
fn out_of_service_for_others(
    candidates: &[&Candidate],
    ours_of: &impl Fn(&Candidate) -> bool,
) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = candidates
        .iter()
        .filter(|c| !ours_of(c) && c.unavailable)
        .map(|c| {
            let why = c
                .unavailable_because
                .clone()
                .unwrap_or_else(|| "(out of service)".into());
            (c.name.clone(), why)
        })
        .collect();
    out.sort();
    out
}

/// The hold of a hand-back under way ([`labels::HANDBACK`] on the policy):
/// no new cycle, those under way end.
///
/// [`labels::HANDBACK`]: ttdrv_api::labels::HANDBACK
pub fn handback_hold(policy: &ttdrv_api::TenstorrentDriverPolicy) -> Option<Hold> {
    let since = policy
        .metadata
        .annotations
        .as_ref()?
        .get(ttdrv_api::labels::HANDBACK)?;
    Some(Hold {
        reason: reason::HANDING_BACK,
        why: format!(
            "kubectl tt driver handback (since {since}) waits for the cycles under way to end: \
             no new cycle starts"
        ),
    })
}

/// Why no node of a policy may start a new cycle at `now`, if so: outside
/// its maintenance windows, or while its last upgraded node soaks. Cycles in
/// progress and build-ahead go on either way.
pub fn hold<'a>(
    windows: &[Window],
    records: impl IntoIterator<Item = (&'a String, &'a NodeRecord)>,
    version: &str,
    soak_seconds: i64,
    now: i64,
) -> Option<Hold> {
    let instant = jiff::Timestamp::from_second(now).unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    if let Gate::Closed { why, .. } = window::gate(windows, instant) {
        return Some(Hold {
            reason: reason::OUTSIDE_MAINTENANCE_WINDOW,
            why,
        });
    }
    let (node, until) = crate::soak::soaking(records, version, soak_seconds, now)?;
    Some(Hold {
        reason: reason::SOAKING,
        why: crate::soak::waiting(&node, until, soak_seconds, now),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: usize) -> Limits {
        Limits {
            max_unavailable: max,
            brake_percent: DEFAULT_BRAKE_PERCENT,
        }
    }

    fn plan<'a>(cs: impl IntoIterator<Item = &'a Candidate>, max: usize) -> Plan {
        super::plan(cs, &BTreeSet::new(), limits(max))
    }

    fn c(name: &str) -> Candidate {
        Candidate {
            name: name.into(),
            wants_slot: true,
            ready: true,
            prepared: true,
            ..Default::default()
        }
    }

    #[test]
    fn a_budget_taken_by_someone_elses_cordon_names_it() {
        let mut fw = c("fw-node");
        fw.wants_slot = false;
        fw.unavailable = true;
        fw.unavailable_because = Some("cordoned by the Go firmware controller".into());
        let p = plan([&fw, &c("a")], 1);
        assert!(p.granted.is_empty(), "{p:?}");
        assert_eq!(
            p.waiting_on,
            [(
                "fw-node".to_string(),
                "cordoned by the Go firmware controller".to_string()
            )]
        );
        assert!(
            p.blocked
                .as_deref()
                .is_some_and(|b| b.contains("fw-node cordoned by the Go firmware controller")),
            "{p:?}"
        );
        // Our own cycle taking the slot names nobody else.
        let mut ours = c("b");
        ours.wants_slot = false;
        ours.in_progress = true;
        let p = plan([&ours, &c("a")], 1);
        assert!(p.waiting_on.is_empty(), "{p:?}");
        // Room for both: nothing waits, nothing named.
        assert!(plan([&fw, &c("a")], 2).waiting_on.is_empty());
    }

    #[test]
    fn a_node_still_building_ahead_holds_back_those_after_it() {
        let mut a = c("a");
        a.prepared = false;
        let (b, cc) = (c("b"), c("c"));
        let p = plan([&a, &b, &cc], 2);
        assert!(p.granted.is_empty(), "{p:?}");
        assert!(
            p.blocked
                .as_deref()
                .is_some_and(|m| m.contains("a has not prepared the target yet")),
            "{p:?}"
        );
        // Prepared: a and b start, in order.
        a.prepared = true;
        assert_eq!(plan([&a, &b, &cc], 2).granted, ["a", "b"]);
        // A NotReady node still building is skipped, as any NotReady node
        // (one of five: under the fleet brake).
        let mut down = c("a");
        down.prepared = false;
        down.ready = false;
        let (d, e) = (c("d"), c("e"));
        assert_eq!(plan([&down, &b, &cc, &d, &e], 1).granted, ["b"]);
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
        let mut cordoned = c("cordoned");
        cordoned.wants_slot = false;
        cordoned.unavailable = true;
        assert!(plan(&[busy.clone(), c("x")], 1).granted.is_empty());
        assert!(plan(&[cordoned.clone(), c("x")], 1).granted.is_empty());
        assert_eq!(plan(&[busy, cordoned, c("x")], 3).granted, ["x"]);
    }

    #[test]
    fn admin_cordoned_node_goes_first_inside_the_cap() {
        let mut cordoned = c("z-admin");
        cordoned.unavailable = true;
        let p = plan(&[c("a"), cordoned.clone()], 1);
        assert_eq!(
            p.granted,
            ["z-admin"],
            "first, at no extra availability cost"
        );
        // But never beyond the cap: two admin-cordoned nodes, one slot.
        let mut other = c("y-admin");
        other.unavailable = true;
        let p = plan(&[cordoned, other], 1);
        assert_eq!(p.granted, ["y-admin"]);
    }

    #[test]
    fn not_ready_nodes_never_start() {
        let mut down = c("a-down");
        down.ready = false;
        down.unavailable = true;
        let p = plan(&[down.clone(), c("b"), c("c"), c("d"), c("e")], 1);
        assert!(
            p.granted.is_empty(),
            "a-down never starts, and it takes the only unit of availability: {p:?}"
        );
        let p = plan(&[down, c("b"), c("c"), c("d"), c("e")], 2);
        assert_eq!(p.granted, ["b"]);
    }

    #[test]
    fn fleet_wide_not_ready_brakes() {
        let mut nodes: Vec<Candidate> = ["a", "b", "c", "d"].iter().map(|n| c(n)).collect();
        nodes[0].ready = false;
        nodes[0].unavailable = true;
        assert!(plan(&nodes, 4).braked.is_none(), "25% is not more than 25%");
        nodes[1].ready = false;
        nodes[1].unavailable = true;
        let mut settled = nodes.clone();
        settled.iter_mut().for_each(|c| c.wants_slot = false);
        assert!(
            plan(&settled, 4).braked.is_none(),
            "a settled rollout has nothing to brake"
        );
        let p = plan(&nodes, 4);
        assert!(p.granted.is_empty());
        assert_eq!(p.braked, Some(vec!["a".to_string(), "b".to_string()]));
        assert!(p.blocked.unwrap_or_default().contains("a, b"));
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
        let p = super::plan(&[c("a"), c("b")], &held, limits(1));
        assert_eq!(p.granted, ["b"]);
        assert_eq!(p.in_progress, 1);
        // b is mid-cycle and still holds: nothing to grant.
        let mut b = c("b");
        b.wants_slot = false;
        b.in_progress = true;
        let p = super::plan(&[c("a"), b.clone()], &held, limits(1));
        assert!(p.granted.is_empty());
        assert_eq!(p.in_progress, 1, "a held, in-progress node counts once");
        // Two slots: a gets the second.
        assert_eq!(super::plan(&[c("a"), b], &held, limits(2)).granted, ["a"]);
    }

    #[test]
    fn a_closed_window_holds_before_a_soak() {
        use crate::machine::NodeRecord;
        use ttdrv_api::{MaintenanceWindow, NodeState};
        let mut done = NodeRecord::new("fleet", "2.8.0", 1_000);
        done.state = NodeState::Done;
        done.reason = Some(reason::UPGRADED.into());
        let recs = [("a".to_string(), done)];
        let it = || recs.iter().map(|(n, r)| (n, r));
        // 1970-01-01 00:16:40 UTC, a Thursday.
        let night = window::parse(&[MaintenanceWindow {
            days: vec![],
            start: "22:00".into(),
            end: "04:00".into(),
            time_zone: "UTC".into(),
        }])
        .expect("valid");
        let h = hold(&night, it(), "2.8.0", 600, 1_100).expect("held");
        assert_eq!(h.reason, reason::SOAKING, "inside the window: the soak");
        assert!(h.why.contains("a was upgraded 100s ago"), "{}", h.why);
        assert_eq!(hold(&night, it(), "2.8.0", 600, 1_600), None, "soak over");
        assert_eq!(
            hold(&night, it(), "2.9.0", 600, 1_100),
            None,
            "other version"
        );
        let day = window::parse(&[MaintenanceWindow {
            days: vec![],
            start: "08:00".into(),
            end: "17:00".into(),
            time_zone: "UTC".into(),
        }])
        .expect("valid");
        let h = hold(&day, it(), "2.8.0", 600, 1_100).expect("held");
        assert_eq!(h.reason, reason::OUTSIDE_MAINTENANCE_WINDOW);
        assert!(h.why.contains("08:00"), "{}", h.why);
    }
}
