//! Cordoning and Draining: the node is taken out of service for its cycle
//! (the cordon and the deploy gates, then the evictions), within the drain
//! timeout.

use ttdrv_api::NodeState::*;

use super::{
    Command, Cordon, Desired, NodeRecord, Observation, Step, deadline_reason, enter,
    replace_installer, retry_hint, stay,
};
use crate::reason;

/// The step of a Cordoning node: on to Draining once cordoned with its gates
/// closed.
pub(super) fn cordoning(rec: &NodeRecord, obs: &Observation, want: &Desired) -> Step {
    let now = obs.now;
    let cordoned = obs.unschedulable;
    if cordoned && obs.gates_closed && !want.paused {
        return Step {
            record: enter(rec, Draining, reason::DRAIN, None, now),
            commands: vec![Command::Evict],
            needs_slot: false,
        };
    }
    let mut cmds = vec![];
    let mut r = rec.clone();
    if !cordoned {
        // Someone uncordoned an admin-cordoned node mid-cycle: the cordon
        // we now set is ours to undo.
        r.cordon = Cordon::Ours;
        cmds.push(Command::Cordon);
    }
    if !obs.gates_closed {
        cmds.push(Command::CloseGates);
    }
    stay(&r, cmds)
}

/// The step of a Draining node: evict until nothing is left, then on to
/// Upgrading (or Unloading, for a vacate cycle).
pub(super) fn draining(rec: &NodeRecord, obs: &Observation, want: &Desired) -> Step {
    let now = obs.now;
    // Uncordoned mid-drain: cordon again before anything else; the
    // cordon is now ours to undo. Pods that landed meanwhile are in
    // the next drain plan.
    if !obs.unschedulable {
        let mut r = rec.clone();
        r.cordon = Cordon::Ours;
        let mut cmds = vec![Command::Cordon];
        if !obs.gates_closed {
            cmds.push(Command::CloseGates);
        }
        return stay(&r, cmds);
    }
    // Without a drain plan nothing is known about the pods: hold,
    // but the deadline still runs (a broken selector must not keep a
    // cordoned node forever).
    let Some(drain) = obs.drain.as_ref() else {
        if now - rec.since > want.drain_timeout_seconds {
            let msg = format!(
                "drain did not finish within {}s: its pods could not be planned{}",
                want.drain_timeout_seconds,
                retry_hint(&want.policy, rec.cordoned_by_us())
            );
            let why = deadline_reason(obs, reason::DRAIN_TIMEOUT);
            return stay(&enter(rec, Failed, why, Some(msg), now), vec![]);
        }
        return stay(rec, vec![]);
    };
    if drain.remaining.is_empty() {
        if want.paused {
            return stay(rec, vec![]);
        }
        if want.unmanage {
            return super::vacate::start_unload(rec, now);
        }
        return Step {
            record: enter(rec, Upgrading, reason::REPLACE_INSTALLER, None, now),
            commands: replace_installer(obs, want),
            needs_slot: false,
        };
    }
    if now - rec.since > want.drain_timeout_seconds {
        let mut msg = format!(
            "drain did not finish within {}s; pods still on the node: {}",
            want.drain_timeout_seconds,
            drain.remaining.join(", ")
        );
        if !drain.blocking_pdbs.is_empty() {
            msg.push_str(&format!(
                "; blocked by PodDisruptionBudgets: {}",
                drain.blocking_pdbs.join(", ")
            ));
        }
        msg.push_str(&retry_hint(&want.policy, rec.cordoned_by_us()));
        let why = deadline_reason(obs, reason::DRAIN_TIMEOUT);
        return stay(&enter(rec, Failed, why, Some(msg), now), vec![]);
    }
    stay(rec, vec![Command::Evict])
}
