//! The vacate cycle of `spec.unmanage` (the Go operator's): hand each node to
//! DKMS. Pending → Cordoning → Draining → Unloading → Unmanaged, or
//! UnloadFailed. Cordoning and Draining are the upgrade's own (slot before the
//! cordon, someone else's cordon kept, pause held); from Unloading the
//! installer of the unmanaged policy unloads the module with the go-ahead
//! of this cycle and loads nothing. At Unmanaged one node patch removes the
//! record, the go-ahead, our driver labels, our cordon and the gates, and
//! marks the node `unmanaged`; from then on the policy leaves it alone.
//! A host-managed node (DKMS already) is marked Unmanaged without a cycle.

use ttdrv_api::NodeState::{self, *};

use super::{
    Command, Desired, Failure, InstallerPod, NodeRecord, Observation, Step, enter,
    installer_summary, retry_hint, start_cordon, stay, wait, wait_for_slot,
};
use crate::reason;

/// The step of a node of an unmanaged policy, or `None` where the upgrade's
/// own step applies (Cordoning, Draining, Uncordoning, Failed).
pub(super) fn transition(rec: &NodeRecord, obs: &Observation, want: &Desired) -> Option<Step> {
    if !want.unmanage {
        return None;
    }
    let now = obs.now;
    let again = |r: &NodeRecord, why: &str| {
        let r = enter(r, Pending, why, None, now);
        super::again_without_slot(&r, obs, want)
    };
    Some(match rec.state {
        Pending => pending(rec, obs, want),
        Unloading => unloading(rec, obs, want),
        Unmanaged => stay(rec, vec![]),
        UnloadFailed if obs.retry_token.is_some() && obs.retry_token != rec.retry_token => {
            let mut r = rec.clone();
            r.retry_token = obs.retry_token.clone();
            again(&r, reason::RETRY)
        }
        UnloadFailed => stay(rec, vec![]),
        // Settled under the upgrade: the vacate cycle starts over.
        Done => again(rec, reason::RETARGET),
        // Cordoned and drained (or drain disabled) for an upgrade: unload
        // instead, in the same cycle and slot.
        Upgrading if !rec.no_drain => start_unload(rec, now),
        // A restart or first install without cordon: nothing held; start over.
        Upgrading => {
            let mut r = rec.clone();
            r.no_drain = false;
            again(&r, reason::RETARGET)
        }
        Cordoning | Draining | Uncordoning | Failed => return None,
    })
}

fn pending(rec: &NodeRecord, obs: &Observation, want: &Desired) -> Step {
    let now = obs.now;
    if obs.vacated {
        // Vacated before (the record went with it): left alone, nothing written.
        return stay(&enter(rec, Unmanaged, reason::VACATED, None, now), vec![]);
    }
    if want.paused {
        let r = enter(
            rec,
            Pending,
            reason::PAUSED,
            Some("policy is paused".into()),
            now,
        );
        return stay(&r, vec![]);
    }
    let mut rec = rec.clone();
    if obs.inherited_cordon && obs.unschedulable {
        rec.cordon = super::Cordon::Ours;
    }
    if obs.host_managed && !rec.cordoned_by_us() {
        // DKMS has it already: nothing to unload, no cordon.
        return vacated(&rec, reason::HOST_MANAGED, now);
    }
    if obs.nothing_loaded && !obs.host_managed {
        // The agent saw no module at this boot: nothing to unload, no cordon.
        return vacated(&rec, reason::VACATED, now);
    }
    let what = format!(
        "vacate for DKMS (unload {})",
        obs.loaded.as_deref().unwrap_or("whatever is loaded")
    );
    if !obs.ready {
        return wait(
            &rec,
            format!("waiting for the node to be Ready to {what}"),
            now,
        );
    }
    if want.refused {
        let why = "this policy is refused (see its Degraded condition: its spec, or its installer DaemonSet): nothing of it starts";
        return wait(&rec, why.into(), now);
    }
    if let Some(who) = &obs.held_by {
        let why =
            format!("{who} has the node out of service; one disruption at a time: {what} waits");
        return stay(
            &enter(&rec, Pending, reason::WAITING_FOR_FIRMWARE, Some(why), now),
            vec![],
        );
    }
    if !obs.slot {
        return wait_for_slot(
            &rec,
            format!("waiting for a maxUnavailable slot to {what}"),
            now,
        );
    }
    if want.drain_enabled {
        start_cordon(&rec, obs)
    } else {
        start_unload(&rec, now)
    }
}

/// Drained (or drain disabled): the installer pod is replaced; the new one
/// unloads with this cycle's go-ahead (written with the record).
pub(super) fn start_unload(rec: &NodeRecord, now: i64) -> Step {
    let mut r = enter(rec, Unloading, reason::UNLOAD, None, now);
    r.no_drain = false;
    r.started = r.started.or(Some(now));
    Step {
        record: r,
        commands: vec![Command::DeleteInstallerPod],
        needs_slot: false,
    }
}

fn unloading(rec: &NodeRecord, obs: &Observation, want: &Desired) -> Step {
    let now = obs.now;
    if obs.host_managed {
        return vacated(rec, reason::HOST_MANAGED, now);
    }
    // The installer of this policy is Ready only once it has unloaded and
    // removed the kmd-version label.
    if obs.installer == (InstallerPod::Current { ready: true }) && obs.loaded.is_none() {
        return vacated(rec, reason::VACATED, now);
    }
    let this_cycles =
        |f: &Failure| f.at().is_none_or(|c| c >= rec.since) && !super::drained_again_for(rec, f);
    if let (Some(f), InstallerPod::Current { .. }) = (&obs.installer_failure, &obs.installer)
        && this_cycles(f)
    {
        if let Some(step) = super::drain_again(rec, f, true, want, now) {
            return step;
        }
        let msg = format!(
            "{}{}",
            f.message,
            retry_hint(&want.policy, &obs.node, rec.cordoned_by_us())
        );
        return stay(&enter(rec, UnloadFailed, f.reason, Some(msg), now), vec![]);
    }
    if now - rec.since > want.upgrade_timeout_seconds {
        let msg = format!(
            "installer did not report tt-kmd unloaded within {}s (loaded: {}; installer pod: {}){}",
            want.upgrade_timeout_seconds,
            obs.loaded.as_deref().unwrap_or("none"),
            installer_summary(obs),
            retry_hint(&want.policy, &obs.node, rec.cordoned_by_us())
        );
        let why = if obs.ready {
            reason::UNLOAD_TIMEOUT
        } else {
            reason::NODE_NOT_READY
        };
        return stay(&enter(rec, UnloadFailed, why, Some(msg), now), vec![]);
    }
    // The pod that unloads is this cycle's: one from before it (not there
    // yet to be replaced when the cycle started, or left by an earlier one)
    // is replaced, so its failures never count and this cycle's always do.
    let before_cycle = obs.installer_created.is_some_and(|c| c < rec.since);
    match obs.installer {
        InstallerPod::Stale { deleting: false } => stay(rec, vec![Command::DeleteInstallerPod]),
        InstallerPod::Current { .. } if before_cycle => {
            stay(rec, vec![Command::DeleteInstallerPod])
        }
        _ => stay(rec, vec![]),
    }
}

/// The end of the cycle: one patch undoes our cordon, removes the gates and
/// marks the node vacated ([`Command::Vacate`]).
fn vacated(rec: &NodeRecord, why: &str, now: i64) -> Step {
    let mut cmds = vec![Command::OpenGates, Command::Vacate];
    if rec.cordoned_by_us() {
        cmds.insert(0, Command::Uncordon);
    }
    let mut r = enter(rec, Unmanaged, why, None, now);
    r.cordon = super::Cordon::None;
    r.no_drain = false;
    Step {
        record: r,
        commands: cmds,
        needs_slot: false,
    }
}

/// A node in a vacate state of a policy that manages its nodes again.
pub(super) fn manage_again(rec: &NodeRecord, obs: &Observation, want: &Desired) -> Step {
    let now = obs.now;
    match rec.state {
        // Cordoned and drained: the cycle goes on as an upgrade.
        Unloading => Step {
            record: enter(
                rec,
                NodeState::Upgrading,
                reason::REPLACE_INSTALLER,
                None,
                now,
            ),
            commands: vec![Command::DeleteInstallerPod],
            needs_slot: false,
        },
        // Still halted: the retry goes through Failed.
        UnloadFailed => stay(
            &enter(
                rec,
                Failed,
                rec.reason.as_deref().unwrap_or(reason::UNLOAD_TIMEOUT),
                rec.message.clone(),
                now,
            ),
            vec![],
        ),
        _ => {
            let r = enter(rec, Pending, reason::RETARGET, None, now);
            super::again_without_slot(&r, obs, want)
        }
    }
}
