//! The rollout limits a driver policy's pass plans with, from plain facts:
//! `maxUnavailable` against the nodes the policy owns, closed to 0 while the
//! policy is refused or new cycles are held, and the budget the
//! `ttdriver_rollout_max_unavailable` metric reports.

use ttdrv_api::UpgradePolicy;

use crate::rollout::Limits;

/// What the limits of a pass depend on.
#[derive(Clone, Copy, Debug)]
pub struct Facts<'a> {
    pub policy: &'a UpgradePolicy,
    /// Nodes the policy owns: what a percentage `maxUnavailable` is of.
    pub owned: usize,
    /// The cluster (or the controller) refuses the policy's spec.
    pub refused: bool,
    /// New cycles are held: a soak, a closed window, a canary not promoted
    /// yet, a hand-back.
    pub held: bool,
    pub brake_percent: u32,
}

/// Why the budget a pass plans with is 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Zero {
    /// A refused policy starts no node: its installer would never come.
    Refused,
    /// Held: nothing new starts until the hold ends.
    Held,
}

/// The limits of a pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PassLimits {
    /// What the rollout plan keeps. Nodes mid-cycle go on either way.
    pub limits: Limits,
    /// The budget for `ttdriver_rollout_max_unavailable`: as configured
    /// while held (the 0 that holds new starts is not the policy's budget,
    /// and the nodes still in their cycle under it are not over budget,
    /// TTDriverTooManyUnavailable), 0 while refused.
    pub reported: usize,
    /// Why `limits.max_unavailable` is 0, when it is.
    pub zero: Option<Zero>,
}

/// The limits of a pass. A refusal outranks a hold: a refused policy reports
/// no budget.
pub fn of(facts: &Facts<'_>) -> PassLimits {
    let configured = facts.policy.max_unavailable_for(facts.owned);
    let zero = if facts.refused {
        Some(Zero::Refused)
    } else if facts.held {
        Some(Zero::Held)
    } else {
        None
    };
    let max_unavailable = if zero.is_some() { 0 } else { configured };
    PassLimits {
        limits: Limits {
            max_unavailable,
            brake_percent: facts.brake_percent,
        },
        reported: if zero == Some(Zero::Refused) {
            0
        } else {
            configured
        },
        zero,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    fn policy(max: IntOrString) -> UpgradePolicy {
        UpgradePolicy {
            max_unavailable: max,
            ..Default::default()
        }
    }

    fn facts(policy: &UpgradePolicy, refused: bool, held: bool) -> Facts<'_> {
        Facts {
            policy,
            owned: 8,
            refused,
            held,
            brake_percent: 40,
        }
    }

    #[test]
    fn an_open_pass_plans_with_the_configured_budget() {
        let p = policy(IntOrString::String("25%".into()));
        let l = of(&facts(&p, false, false));
        assert_eq!(
            l.limits,
            Limits {
                max_unavailable: 2,
                brake_percent: 40
            }
        );
        assert_eq!((l.reported, l.zero), (2, None));
    }

    #[test]
    fn a_held_pass_starts_nothing_but_reports_the_configured_budget() {
        let p = policy(IntOrString::Int(3));
        let l = of(&facts(&p, false, true));
        assert_eq!(l.limits.max_unavailable, 0);
        assert_eq!(l.limits.brake_percent, 40);
        assert_eq!((l.reported, l.zero), (3, Some(Zero::Held)));
    }

    #[test]
    fn a_refused_pass_starts_nothing_and_reports_no_budget() {
        let p = policy(IntOrString::Int(3));
        let l = of(&facts(&p, true, false));
        assert_eq!(l.limits.max_unavailable, 0);
        assert_eq!((l.reported, l.zero), (0, Some(Zero::Refused)));
    }

    #[test]
    fn a_refusal_outranks_a_hold() {
        let p = policy(IntOrString::Int(3));
        let l = of(&facts(&p, true, true));
        assert_eq!(l.limits.max_unavailable, 0);
        assert_eq!((l.reported, l.zero), (0, Some(Zero::Refused)));
    }

    #[test]
    fn a_percentage_of_a_small_fleet_still_lets_one_node_start() {
        let p = policy(IntOrString::String("10%".into()));
        let l = of(&Facts {
            owned: 3,
            ..facts(&p, false, false)
        });
        assert_eq!((l.limits.max_unavailable, l.reported), (1, 1));
    }
}
