//! Metrics of where each policy's rollout stands, as the policy supervisor
//! exports them: its nodes by upgrade state (plus the host-managed ones),
//! whether it is paused, the version it asks for, and its unavailability
//! budget (`maxUnavailable` against the nodes out of service).

use ttdrv_api::NodeState;

use super::family::{Families, Value};
use super::registry::{Metrics, PolicyMetrics, bool_value};

/// `state` label value of `ttdriver_policy_nodes` for host-managed (DKMS) nodes.
pub const HOST_MANAGED: &str = "HostManaged";

impl PolicyMetrics {
    /// Creates and registers the families of this group.
    pub(super) fn register(families: &mut Families) -> Self {
        PolicyMetrics {
            policy_nodes: families.gauge(
                "ttdriver_policy_nodes",
                "Nodes matched by the policy, by upgrade state; state=\"HostManaged\" counts nodes with a host (DKMS) install.",
                &["cr", "state"],
            ),
            policy_paused: families.gauge(
                "ttdriver_policy_paused",
                "1 if the policy has spec.paused=true, else 0.",
                &["cr"],
            ),
            policy_rollout_held: families.gauge(
                "ttdriver_policy_rollout_held",
                "1 while no new node cycle may start because of the reason (Soaking: the last upgraded node soaks; OutsideMaintenanceWindow; WaitingForPromotion: spec.promoteAfter's canary is not there yet), else 0.",
                &["cr", "reason"],
            ),
            policy_promotion_blocked: families.gauge(
                "ttdriver_policy_promotion_blocked",
                "1 while the policy's promotion (spec.promoteAfter) is blocked: its canary policy has Failed nodes or does not exist; else 0.",
                &["cr"],
            ),
            policy_desired_version: families.gauge(
                "ttdriver_policy_desired_version",
                "Always 1; the version label carries the policy's spec.version.",
                &["cr", "version"],
            ),
            rollout_max_unavailable: families.gauge(
                "ttdriver_rollout_max_unavailable",
                "The policy's maxUnavailable, resolved to a number of nodes.",
                &["cr"],
            ),
            rollout_unavailable: families.gauge(
                "ttdriver_rollout_unavailable_nodes",
                "Nodes of the policy out of service: in a cycle of ours (Cordoning to Uncordoning), Failed, or unavailable for another reason (NotReady, cordoned by someone else).",
                &["cr"],
            ),
            rollout_in_progress: families.gauge(
                "ttdriver_rollout_in_progress_nodes",
                "Nodes of the policy in a disruptive cycle of ours (Cordoning to Uncordoning, or holding a slot); never above maxUnavailable.",
                &["cr"],
            ),
            rollout_braked: families.gauge(
                "ttdriver_rollout_braked",
                "1 while the fleet-health brake holds the policy's rollout (too many of its nodes NotReady), else 0.",
                &["cr"],
            ),
            rollout_not_ready: families.gauge(
                "ttdriver_rollout_not_ready_nodes",
                "Nodes of the policy whose Ready condition is not True.",
                &["cr"],
            ),
            prepared: families.gauge(
                "ttdriver_policy_prepared_nodes",
                "Nodes of the policy whose agent reports the policy's version built and verified into the node's cache (kmd-prepared) or loaded, at the current boot.",
                &["cr"],
            ),
            next_kernel_failed: families.gauge(
                "ttdriver_policy_next_kernel_build_failed_nodes",
                "Nodes of the policy with an installed, not running kernel the policy's version does not build for (kmd-next-kernel-failed).",
                &["cr"],
            ),
        }
    }
}

impl Metrics {
    /// `ttdriver_policy_nodes{cr,state}`: every NodeState is emitted, states
    /// missing from `counts` as 0. The `HostManaged` series is set separately by
    /// [`Metrics::set_policy_host_managed`].
    pub fn set_policy_nodes(&self, cr: &str, counts: &[(NodeState, i64)]) {
        self.ensure_cr(cr);
        let labels = NodeState::ALL.map(|s| [cr, s.as_str()]);
        let series: Vec<(&[&str], f64)> = NodeState::ALL
            .iter()
            .zip(&labels)
            .map(|(s, l)| {
                let n: i64 = counts
                    .iter()
                    .filter(|(state, _)| state == s)
                    .map(|(_, n)| *n)
                    .sum();
                (&l[..], n as f64)
            })
            .collect();
        self.policy.policy_nodes.set_many(&series);
    }

    /// `ttdriver_policy_nodes{cr,state="HostManaged"}`.
    pub fn set_policy_host_managed(&self, cr: &str, n: i64) {
        self.ensure_cr(cr);
        self.policy.policy_nodes.set(&[cr, HOST_MANAGED], n as f64);
    }

    /// `ttdriver_policy_paused{cr}` 1/0 (lets the stalled-rollout alert skip paused policies).
    pub fn set_policy_paused(&self, cr: &str, paused: bool) {
        self.ensure_cr(cr);
        self.policy.policy_paused.set(&[cr], bool_value(paused));
    }

    /// `ttdriver_policy_rollout_held{cr,reason}`: 1 for the reason holding
    /// new starts now (if any), 0 for the others.
    pub fn set_rollout_held(&self, cr: &str, held: Option<&str>) {
        self.ensure_cr(cr);
        for reason in [
            ttdrv_core::reason::SOAKING,
            ttdrv_core::reason::OUTSIDE_MAINTENANCE_WINDOW,
            ttdrv_core::reason::WAITING_FOR_PROMOTION,
        ] {
            self.policy
                .policy_rollout_held
                .set(&[cr, reason], bool_value(held == Some(reason)));
        }
    }

    /// `ttdriver_policy_promotion_blocked{cr}` 1/0: the canary of
    /// `spec.promoteAfter` is halted or missing (a person must act).
    pub fn set_policy_promotion_blocked(&self, cr: &str, blocked: bool) {
        self.ensure_cr(cr);
        self.policy
            .policy_promotion_blocked
            .set(&[cr], bool_value(blocked));
    }

    /// `ttdriver_policy_desired_version{cr,version}` = 1; the series of any other
    /// version of this policy is removed.
    pub fn set_desired_version(&self, cr: &str, version: &str) {
        self.ensure_cr(cr);
        let mut map = self.policy.policy_desired_version.lock();
        map.retain(|k, _| {
            !(k.first().map(String::as_str) == Some(cr)
                && k.get(1).map(String::as_str) != Some(version))
        });
        map.insert(
            vec![cr.to_string(), version.to_string()],
            Value::Scalar(1.0),
        );
    }

    /// `ttdriver_rollout_in_progress_nodes{cr}`, `ttdriver_rollout_braked{cr}`
    /// and `ttdriver_rollout_not_ready_nodes{cr}`.
    pub fn set_rollout_health(&self, cr: &str, in_progress: i64, braked: bool, not_ready: i64) {
        self.ensure_cr(cr);
        self.policy
            .rollout_in_progress
            .set(&[cr], in_progress as f64);
        self.policy.rollout_braked.set(&[cr], bool_value(braked));
        self.policy.rollout_not_ready.set(&[cr], not_ready as f64);
    }

    /// `ttdriver_policy_prepared_nodes{cr}` and
    /// `ttdriver_policy_next_kernel_build_failed_nodes{cr}`.
    pub fn set_policy_prepare(&self, cr: &str, prepared: i64, next_kernel_failed: i64) {
        self.ensure_cr(cr);
        self.policy.prepared.set(&[cr], prepared as f64);
        self.policy
            .next_kernel_failed
            .set(&[cr], next_kernel_failed as f64);
    }

    /// `ttdriver_rollout_max_unavailable{cr}` and `ttdriver_rollout_unavailable_nodes{cr}`.
    pub fn set_rollout_budget(&self, cr: &str, max_unavailable: i64, unavailable: i64) {
        self.ensure_cr(cr);
        self.policy
            .rollout_max_unavailable
            .set(&[cr], max_unavailable as f64);
        self.policy
            .rollout_unavailable
            .set(&[cr], unavailable as f64);
    }
}
