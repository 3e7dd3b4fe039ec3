//! Uncordoning, Done and Failed: the cycle ends, a settled node starts a
//! new one when something changed (or its soak finds trouble), a failed one
//! when retried.

use ttdrv_api::NodeState::*;
use ttdrv_api::vfio::Passthrough;

use super::{
    Command, Cordon, Desired, InstallerPod, NodeRecord, Observation, Step, again_without_slot,
    enter, retry_hint, stay, target_loaded,
};
use crate::reason;

/// The step of an Uncordoning node: Done (or Failed, rolled back after a
/// failed validation) once our cordon and the gates are gone.
pub(super) fn uncordoning(rec: &NodeRecord, obs: &Observation) -> Step {
    let now = obs.now;
    let schedulable_ok = !rec.cordoned_by_us() || !obs.unschedulable;
    if schedulable_ok && !obs.gates_present {
        if rec.halts_rollout() {
            // Rolled back after a failed validation: back in
            // service, and Failed until retried.
            let mut r = enter(
                rec,
                Failed,
                reason::VALIDATION_FAILED,
                rec.message.clone(),
                now,
            );
            r.cordon = Cordon::None;
            return stay(&r, vec![]);
        }
        let why = if obs.host_managed {
            reason::HOST_MANAGED
        } else {
            reason::UPGRADED
        };
        let mut r = enter(rec, Done, why, None, now);
        r.cordon = Cordon::None;
        return stay(&r, vec![]);
    }
    let mut cmds = vec![];
    if !schedulable_ok {
        cmds.push(Command::Uncordon);
    }
    if obs.gates_present {
        cmds.push(Command::OpenGates);
    }
    stay(rec, cmds)
}

/// The step of a Done node: Failed on trouble during its soak; a new cycle
/// when what it runs no longer matches the target.
pub(super) fn done(rec: &NodeRecord, obs: &Observation, want: &Desired) -> Step {
    let now = obs.now;
    let module_ok = target_loaded(obs, want);
    let soaking = want.soak_seconds > 0
        && rec.reason.as_deref() == Some(reason::UPGRADED)
        && now - rec.since < want.soak_seconds;
    if soaking && let Some(trouble) = crate::soak::trouble(obs) {
        let msg = format!(
            "{trouble}, {}s after its upgrade to {} (upgradePolicy.soakSeconds: {}): the rollout halts{}",
            now - rec.since,
            rec.target,
            want.soak_seconds,
            retry_hint(&want.policy, &obs.node, rec.cordoned_by_us())
        );
        return stay(
            &enter(rec, Failed, reason::SOAK_FAILED, Some(msg), now),
            vec![],
        );
    }
    let host_done = rec.reason.as_deref() == Some(reason::HOST_MANAGED);
    let passthrough_done = rec.reason.as_deref() == Some(reason::VFIO_PASSTHROUGH);
    // Of the installer pod only a new template is a change: a pod
    // merely not Ready (its node unreachable, the kubelet not
    // reporting yet after a partition) or missing (the DaemonSet
    // recreates it) changes nothing on the node, and a cycle for it
    // would restart every installer of the fleet after a network
    // incident.
    let new_installer = matches!(obs.installer, InstallerPod::Stale { .. });
    // Nor is a reboot by itself: the module went with it, and the
    // agent loads the target again from the node's cache at boot and
    // reports. Until it does, nothing is known to have changed (the
    // labels are the last boot's) and what it reports decides; an
    // installer that fails meanwhile (its image, a crash loop) is a
    // change, so the node goes through a cycle that fails with the
    // cause instead of staying Done with nothing loaded.
    let changed = if obs.rebooted_unreported && obs.installer_failure.is_none() {
        new_installer
    } else if host_done {
        !obs.host_managed
    } else if passthrough_done {
        // Some function back on tt-kmd: it needs the target.
        !matches!(obs.passthrough, Passthrough::All { .. })
    } else {
        obs.host_managed || !module_ok || new_installer
    };
    if changed {
        let r = enter(rec, Pending, reason::RETARGET, None, now);
        return again_without_slot(&r, obs, want);
    }
    stay(rec, vec![])
}

/// The step of a Failed node: a new cycle when retried.
pub(super) fn failed(rec: &NodeRecord, obs: &Observation, want: &Desired) -> Step {
    let now = obs.now;
    if obs.retry_token.is_some() && obs.retry_token != rec.retry_token {
        let mut r = enter(rec, Pending, reason::RETRY, None, now);
        r.retry_token = obs.retry_token.clone();
        return again_without_slot(&r, obs, want);
    }
    stay(rec, vec![])
}
