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
                retry_hint(&want.policy, &obs.node, rec.cordoned_by_us())
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
        msg.push_str(&retry_hint(&want.policy, &obs.node, rec.cordoned_by_us()));
        let why = deadline_reason(obs, reason::DRAIN_TIMEOUT);
        return stay(&enter(rec, Failed, why, Some(msg), now), vec![]);
    }
    stay(&still_draining(rec, obs, want), vec![Command::Evict])
}

/// The record of a node still draining: while a budget refuses an eviction,
/// `EvictionBlocked` with the pods, the budgets and the deadline (a fixed
/// time, not a countdown: the record is written only when it changes);
/// otherwise the usual reason back.
fn still_draining(rec: &NodeRecord, obs: &Observation, want: &Desired) -> NodeRecord {
    let mut r = rec.clone();
    if obs.drain_blocked.is_empty() {
        if r.reason.as_deref() == Some(reason::EVICTION_BLOCKED) {
            let usual = if r.redrained.is_some() {
                reason::DRAIN_AGAIN
            } else {
                reason::DRAIN
            };
            r.reason = Some(usual.into());
            r.message = None;
        }
        return r;
    }
    r.reason = Some(reason::EVICTION_BLOCKED.into());
    r.message = Some(blocked_message(
        &obs.drain_blocked,
        rec.since + want.drain_timeout_seconds,
        want.drain_timeout_seconds,
    ));
    r
}

/// Pods named per budget at most: a budget over a large Deployment would
/// otherwise make the message (and the record on the Node) unbounded.
const PODS_NAMED: usize = 3;

/// `PodDisruptionBudget ml/web refuses to evict ml/web-0 (...); the drain
/// times out at <deadline> ...`, the budgets in the order first met.
pub(crate) fn blocked_message(
    blocked: &[crate::drain::BlockedEviction],
    deadline: i64,
    timeout: i64,
) -> String {
    let mut by_pdb: Vec<(&str, Vec<&str>)> = vec![];
    for b in blocked {
        match by_pdb.iter_mut().find(|(p, _)| *p == b.pdb) {
            Some((_, pods)) => pods.push(&b.pod),
            None => by_pdb.push((&b.pdb, vec![&b.pod])),
        }
    }
    let each: Vec<String> = by_pdb
        .iter()
        .map(|(pdb, pods)| {
            let mut named = pods[..pods.len().min(PODS_NAMED)].join(", ");
            if pods.len() > PODS_NAMED {
                named.push_str(&format!(" and {} more", pods.len() - PODS_NAMED));
            }
            format!("PodDisruptionBudget {pdb} refuses to evict {named}")
        })
        .collect();
    format!(
        "eviction blocked: {} (it allows no disruption now; retried each pass). The drain times out \
         at {} (drain.timeoutSeconds {timeout} after it began) and the node then fails with {}",
        each.join("; "),
        super::rfc3339(deadline),
        reason::DRAIN_TIMEOUT
    )
}
