//! Cordoning and Uncordoning wait for nothing but our own write (the cordon
//! and the gates, or their undoing). Written on their own, each cost a node
//! patch and a round trip to the API server per node cycle (issue 52: at
//! 1000 nodes about 20 ms each, a third of the controller's own time per
//! node). Where the next step follows from that write alone, the two steps
//! are one write: the cordon with the Draining record, the uncordon with the
//! Done (or Failed) record. One patch is also one instant: a controller
//! killed between the two can no longer leave the first behind.
//!
//! The evictions of the drain still come after the patch that cordons, and
//! the drain is still judged finished by a later pass, on the pods seen
//! since the cordon.

use ttdrv_api::NodeState::{self, *};

use super::{Command, Desired, NodeRecord, Observation, Step, step};

/// `first`, the step just decided, folded with the step that follows it once
/// its own write is stored, when that is all the next step waits for.
/// Returns the step to carry out and the record folded into it (to report
/// its transition), or `first` unchanged and `None`.
pub fn through_own_write(
    first: Step,
    obs: &Observation,
    want: &Desired,
) -> (Step, Option<NodeRecord>) {
    let Some(written) = as_written(&first, obs) else {
        return (first, None);
    };
    let then = step(&first.record, &written, want);
    let carries_on = match first.record.state {
        Cordoning => {
            then.record.state == Draining && then.commands.iter().all(|c| *c == Command::Evict)
        }
        Uncordoning => matches!(then.record.state, Done | Failed) && then.commands.is_empty(),
        _ => false,
    };
    if !carries_on || then.needs_slot {
        return (first, None);
    }
    let mut commands = first.commands;
    commands.extend(then.commands);
    let folded = first.record;
    (
        Step {
            record: then.record,
            commands,
            needs_slot: false,
        },
        Some(folded),
    )
}

/// The observation once `step`'s node commands are stored, if the step
/// enters a state that waits only for them.
fn as_written(step: &Step, obs: &Observation) -> Option<Observation> {
    let state: NodeState = step.record.state;
    // Besides the node's own patch, only what goes after it and changes
    // nothing the next step reads: the DRA plugin restarted after a
    // rollback.
    let own_write_only = step.commands.iter().all(|c| match state {
        Cordoning => matches!(c, Command::Cordon | Command::CloseGates),
        Uncordoning => matches!(
            c,
            Command::Uncordon | Command::OpenGates | Command::RestartPublishers(_)
        ),
        _ => false,
    });
    if !matches!(state, Cordoning | Uncordoning) || !own_write_only {
        return None;
    }
    let mut after = obs.clone();
    for c in &step.commands {
        match c {
            Command::Cordon => after.unschedulable = true,
            Command::Uncordon => after.unschedulable = false,
            Command::CloseGates => after.gates_closed = true,
            Command::OpenGates => after.gates_present = false,
            _ => {}
        }
    }
    Some(after)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{desired as want, observation as obs};
    use crate::machine::{Cordon, InstallerPod};
    use Command::*;

    fn upgrading(cordon: Cordon) -> NodeRecord {
        let mut r = NodeRecord::new("fleet", "2.8.0", 900);
        r.state = Upgrading;
        r.cordon = cordon;
        r.started = Some(900);
        r
    }

    /// The step from `r` on `o`, as the NodeActor carries it out (folded).
    fn stepped(r: &NodeRecord, o: &Observation) -> (Step, Option<NodeRecord>) {
        through_own_write(step(r, o, &want()), o, &want())
    }

    /// The agent has loaded the target; the node is still cordoned, gated.
    fn swapped() -> Observation {
        Observation {
            loaded: Some("2.8.0".into()),
            installer: InstallerPod::Current { ready: true },
            unschedulable: true,
            gates_present: true,
            ..obs()
        }
    }

    #[test]
    fn a_cycle_starts_with_the_cordon_and_the_draining_record_in_one_write() {
        let r = NodeRecord::new("fleet", "2.8.0", 900);
        let (s, folded) = stepped(&r, &obs());
        assert_eq!(s.record.state, Draining);
        assert_eq!(s.record.cordon, Cordon::Ours);
        assert_eq!(s.record.started, Some(1000), "the cycle's start is kept");
        // The node commands go with the record's patch; the evictions after it.
        assert_eq!(s.commands, vec![Cordon, CloseGates, Evict]);
        assert_eq!(folded.map(|f| f.state), Some(Cordoning));
    }

    #[test]
    fn a_swapped_node_goes_back_into_service_with_its_done_record_in_one_write() {
        let (s, folded) = stepped(&upgrading(Cordon::Ours), &swapped());
        assert_eq!(s.record.state, Done);
        assert_eq!(s.record.cordon, Cordon::None);
        assert_eq!(s.commands, vec![Uncordon, OpenGates]);
        assert_eq!(folded.map(|f| f.state), Some(Uncordoning));
    }

    #[test]
    fn an_admins_cordon_stays_when_the_uncordon_is_folded() {
        let (s, folded) = stepped(&upgrading(Cordon::Theirs), &swapped());
        assert_eq!(s.record.state, Done);
        assert_eq!(s.commands, vec![OpenGates], "never their cordon");
        assert!(folded.is_some());
    }

    #[test]
    fn a_rolled_back_node_is_failed_in_the_write_that_returns_it_to_service() {
        let o = Observation {
            loaded: Some("2.7.0".into()),
            installer: InstallerPod::Current { ready: false },
            installer_failure: Some(crate::installer::Failure {
                reason: crate::reason::VALIDATION_FAILED,
                message: "tenstorrent 2.8.0 loaded but failed validation: x; rolled back".into(),
                pod_created: Some(950),
                terminated_at: Some(960),
            }),
            ..swapped()
        };
        let (s, folded) = stepped(&upgrading(Cordon::Ours), &o);
        assert_eq!(s.record.state, Failed);
        assert_eq!(
            s.record.reason.as_deref(),
            Some(crate::reason::VALIDATION_FAILED)
        );
        assert_eq!(s.commands, vec![Uncordon, OpenGates]);
        let mid = folded.expect("the rolled-back Uncordoning record, for its Event");
        assert!(mid.halts_rollout());
    }

    #[test]
    fn a_step_that_waits_for_more_than_its_own_write_is_left_alone() {
        // Paused mid-cordon: the node stays Cordoning.
        let mut r = NodeRecord::new("fleet", "2.8.0", 900);
        r.state = Cordoning;
        r.cordon = Cordon::Ours;
        let paused = Desired {
            paused: true,
            ..want()
        };
        let first = step(&r, &obs(), &paused);
        let (s, folded) = through_own_write(first.clone(), &obs(), &paused);
        assert_eq!((s, folded), (first, None));
        // Draining, Upgrading: not states of our own write.
        let first = step(&upgrading(Cordon::Ours), &obs(), &want());
        let (s, folded) = through_own_write(first.clone(), &obs(), &want());
        assert_eq!((s, folded), (first, None));
    }
}
