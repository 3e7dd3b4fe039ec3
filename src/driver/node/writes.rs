//! What a NodeActor writes for one step, decided without I/O: whether the
//! record goes onto the Node (with the step's cordon, uncordon or gate
//! change, in one merge patch), which calls go to which port, in the step's
//! order, and what is given back when the step ends. The actor carries the
//! answer out.

use ttdrv_api::NodeState;
use ttdrv_core::drain::{DrainPass, PodRef};
use ttdrv_core::machine::{Command, NodeRecord, Step};
use ttdrv_core::reason;

/// What the write decision looks at besides the step.
pub struct Known<'a> {
    /// The record before the step.
    pub prev: &'a NodeRecord,
    /// The record as persisted on the Node (the cache's copy).
    pub persisted: Option<&'a NodeRecord>,
    /// This actor has written nothing yet: until it has, a record that
    /// differs from the cache's copy is written even if the step kept it.
    pub nothing_written: bool,
    /// Pods the drain would evict now.
    pub evictions: &'a [(PodRef, DrainPass)],
    /// The node's installer pod, if any.
    pub installer_pod: Option<&'a PodRef>,
    /// The installer pod this actor last deleted (the cache may still show it).
    pub already_deleted: Option<&'a PodRef>,
    /// The policy's validation PodTemplate, if it has one.
    pub validation_template: Option<&'a str>,
    /// The cycle's validation pod as observed (`namespace/name`).
    pub validation_pod: Option<&'a str>,
}

/// One call to a port other than the Node patch, for one command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PortCall {
    Evict(Vec<(PodRef, DrainPass)>),
    ReplaceInstallerPod(PodRef),
    RunValidationPod { template: String, cycle: i64 },
    DeleteValidationPod { namespace: String, name: String },
}

/// The writes of one step, in order: the record patch first, then the calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Writes {
    /// Persist the step's record (and its node commands) on the Node.
    pub patch_record: bool,
    pub calls: Vec<PortCall>,
}

/// What the step writes ([`Writes`]).
pub fn decide(next: &Step, known: &Known<'_>) -> Writes {
    let node_cmds = next.commands.iter().any(|c| {
        matches!(
            c,
            Command::Cordon
                | Command::Uncordon
                | Command::CloseGates
                | Command::OpenGates
                | Command::Vacate
        )
    });
    // Compare with the cache's copy only before this actor has written
    // anything: afterwards the cache may simply lag behind our write.
    let unpersisted = known.nothing_written && known.persisted != Some(&next.record);
    let changed = next.record != *known.prev || node_cmds || unpersisted;
    Writes {
        patch_record: changed && !derivable(next, known),
        calls: next
            .commands
            .iter()
            .filter_map(|c| port_call(c, &next.record, known))
            .collect(),
    }
}

/// The step's record follows from what the Node already says, so it is not
/// written.
fn derivable(next: &Step, known: &Known<'_>) -> bool {
    // Build-ahead's pod replacement of a Pending node changes nothing the
    // Node must say first: the new agent waits for a go-ahead that a
    // Pending record never gives.
    let replaces_only = next
        .commands
        .iter()
        .all(|c| *c == Command::DeleteInstallerPod);
    if replaces_only && only_words(next, known) {
        return true;
    }
    if !next.commands.is_empty() {
        return false;
    }
    // A Done node that a new version sends back to Pending: the Pending
    // record follows from the Done one and the policy, a restarted
    // controller derives it again, and the status shows it. At rollout start
    // that saves one patch per node (1000 patches, and seconds before the
    // first cordon, at 1000 nodes); the record is written with the cordon
    // that starts the cycle. Except a node waiting for the firmware: the
    // firmware policy reads that record to hand its cordon over
    // ([`ttdrv_core::claim::handover_to`]).
    let back_to_pending = next.record.state == NodeState::Pending
        && next.record.reason.as_deref() != Some(reason::WAITING_FOR_FIRMWARE)
        && known.prev.state == NodeState::Done
        && known.persisted.is_some_and(|p| p.state == NodeState::Done);
    // A vacated node is left alone: its Unmanaged record follows from its
    // `unmanaged` mark and is never written.
    back_to_pending || next.record.state == NodeState::Unmanaged
}

/// A Pending node whose record changed in its words only (reason, message:
/// waiting for a place to build ahead, for the installer, for a slot) from
/// the Pending or Done record on the Node. What it waits for follows from
/// the Node, its pods and the policy, and the policy's status shows it; a
/// restarted controller derives it again. Written, each of those words
/// cost a node patch per node (five per node with build-ahead, at 1000
/// nodes thousands of patches while the first nodes cycled: issue 52). The
/// firmware policy's handover reads the reason `WaitingForFirmware`: a
/// record into or out of it is written.
fn only_words(next: &Step, known: &Known<'_>) -> bool {
    let firmware = |r: &NodeRecord| r.reason.as_deref() == Some(reason::WAITING_FOR_FIRMWARE);
    let (rec, prev) = (&next.record, known.prev);
    let Some(on_node) = known.persisted else {
        return false;
    };
    let waiting = |r: &NodeRecord| r.state == NodeState::Pending && !firmware(r);
    let settled = |r: &NodeRecord| waiting(r) || r.state == NodeState::Done;
    let same_facts = |a: &NodeRecord, b: &NodeRecord| {
        a.policy == b.policy
            && a.cordon == b.cordon
            && a.started == b.started
            && a.retry_token == b.retry_token
            && a.paused_at == b.paused_at
    };
    waiting(rec)
        && settled(prev)
        && settled(on_node)
        && !firmware(on_node)
        && same_facts(rec, prev)
        && same_facts(rec, on_node)
}

/// The port call that carries out `command`, if it needs one and has what
/// it needs.
fn port_call(command: &Command, next: &NodeRecord, known: &Known<'_>) -> Option<PortCall> {
    match command {
        Command::Evict if !known.evictions.is_empty() => {
            Some(PortCall::Evict(known.evictions.to_vec()))
        }
        // Not twice: until the cache shows the deletion, the pod still
        // looks current-but-stale.
        // The node's DRA plugin pods from before the swap, through the
        // Eviction API as any drain (their DaemonSet starts fresh ones).
        Command::RestartPublishers(pods) if !pods.is_empty() => Some(PortCall::Evict(
            pods.iter()
                .map(|p| (p.clone(), DrainPass::Device))
                .collect(),
        )),
        Command::DeleteInstallerPod => known
            .installer_pod
            .filter(|p| known.already_deleted != Some(*p))
            .map(|p| PortCall::ReplaceInstallerPod(p.clone())),
        Command::RunValidationPod => {
            let (template, cycle) = (known.validation_template?, next.started?);
            Some(PortCall::RunValidationPod {
                template: template.to_string(),
                cycle,
            })
        }
        Command::DeleteValidationPod => {
            let (namespace, name) = known.validation_pod?.split_once('/')?;
            Some(PortCall::DeleteValidationPod {
                namespace: namespace.to_string(),
                name: name.to_string(),
            })
        }
        _ => None,
    }
}

/// What goes back when a step ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Releases {
    /// The policy's rollout slot.
    pub slot: bool,
    /// The node's claim (one disruption at a time).
    pub claim: bool,
}

/// `first`: the record before this observation; `next`: after its steps;
/// `granted`: the observation carried a slot.
pub fn releases(first: &NodeRecord, next: &NodeRecord, granted: bool) -> Releases {
    Releases {
        // The cycle ended (Done, Failed, back to Pending), or the step did
        // not use the slot it was granted. Idempotent, so also sent when the
        // slot was never held here.
        slot: !next.occupies_slot() && (first.occupies_slot() || granted),
        claim: !next.state.is_in_progress(),
    }
}

#[cfg(test)]
mod tests {
    use ttdrv_core::machine::Cordon;

    use super::*;

    fn record(state: NodeState) -> NodeRecord {
        let mut r = NodeRecord::new("fleet", "2.8.0", 900);
        r.state = state;
        r
    }

    fn step_to(record: NodeRecord, commands: Vec<Command>) -> Step {
        Step {
            record,
            commands,
            needs_slot: false,
        }
    }

    fn known<'a>(prev: &'a NodeRecord, persisted: Option<&'a NodeRecord>) -> Known<'a> {
        Known {
            prev,
            persisted,
            nothing_written: false,
            evictions: &[],
            installer_pod: None,
            already_deleted: None,
            validation_template: None,
            validation_pod: None,
        }
    }

    fn pod(namespace: &str, name: &str) -> PodRef {
        PodRef {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    #[test]
    fn an_unchanged_record_without_node_commands_is_not_written() {
        let prev = record(NodeState::Draining);
        let w = decide(&step_to(prev.clone(), vec![]), &known(&prev, Some(&prev)));
        assert_eq!(
            w,
            Writes {
                patch_record: false,
                calls: vec![]
            }
        );
    }

    #[test]
    fn a_node_command_writes_the_record_even_when_it_is_unchanged() {
        let prev = record(NodeState::Uncordoning);
        let w = decide(
            &step_to(prev.clone(), vec![Command::Uncordon]),
            &known(&prev, Some(&prev)),
        );
        assert!(w.patch_record);
        assert!(w.calls.is_empty(), "{w:?}");
    }

    #[test]
    fn the_first_write_catches_up_with_a_cache_copy_that_differs() {
        let prev = record(NodeState::Draining);
        let mut stale = prev.clone();
        stale.state = NodeState::Cordoning;
        let mut k = known(&prev, Some(&stale));
        k.nothing_written = true;
        assert!(decide(&step_to(prev.clone(), vec![]), &k).patch_record);
        // Once written, the cache's lag is no reason to write again.
        k.nothing_written = false;
        assert!(!decide(&step_to(prev.clone(), vec![]), &k).patch_record);
    }

    #[test]
    fn done_sent_back_to_pending_is_derived_not_written_unless_waiting_for_firmware() {
        let done = record(NodeState::Done);
        let pending = record(NodeState::Pending);
        let w = decide(
            &step_to(pending.clone(), vec![]),
            &known(&done, Some(&done)),
        );
        assert!(!w.patch_record, "derivable from the Done record");
        let mut waiting = pending.clone();
        waiting.reason = Some(reason::WAITING_FOR_FIRMWARE.into());
        let w = decide(&step_to(waiting, vec![]), &known(&done, Some(&done)));
        assert!(w.patch_record, "the firmware policy reads it");
        // A Done record not yet on the Node: nothing to derive it from.
        let w = decide(&step_to(pending, vec![]), &known(&done, None));
        assert!(w.patch_record);
    }

    #[test]
    fn a_pending_record_that_changes_its_words_only_is_not_written() {
        let mut waiting = record(NodeState::Pending);
        waiting.reason = Some(reason::PREPARING.into());
        waiting.message = Some("waiting for a place to build 2.8.0 ahead".into());
        let mut building = waiting.clone();
        building.message = Some("the installer builds 2.8.0".into());
        let w = decide(
            &step_to(building.clone(), vec![]),
            &known(&waiting, Some(&waiting)),
        );
        assert!(!w.patch_record, "words only: derived again from the Node");
        let done = record(NodeState::Done);
        let w = decide(
            &step_to(building.clone(), vec![]),
            &known(&waiting, Some(&done)),
        );
        assert!(!w.patch_record, "the Node still holds the Done record");
        // A cordon of ours, a command, the firmware's reason: written.
        let mut cordoned = building.clone();
        cordoned.cordon = Cordon::Ours;
        let w = decide(&step_to(cordoned, vec![]), &known(&waiting, Some(&waiting)));
        assert!(w.patch_record, "a cordon taken over is written");
        let w = decide(
            &step_to(building.clone(), vec![Command::DeleteInstallerPod]),
            &known(&waiting, Some(&waiting)),
        );
        assert!(!w.patch_record, "a pod replaced is no node write");
        let mut firmware = building.clone();
        firmware.reason = Some(reason::WAITING_FOR_FIRMWARE.into());
        let w = decide(
            &step_to(firmware.clone(), vec![]),
            &known(&waiting, Some(&waiting)),
        );
        assert!(w.patch_record, "the firmware policy reads it");
        let w = decide(
            &step_to(building.clone(), vec![]),
            &known(&firmware, Some(&firmware)),
        );
        assert!(w.patch_record, "out of WaitingForFirmware");
        // No record on the Node: nothing to derive it from.
        assert!(decide(&step_to(building, vec![]), &known(&waiting, None)).patch_record);
    }

    #[test]
    fn an_unmanaged_record_is_never_written() {
        let prev = record(NodeState::Unloading);
        let w = decide(
            &step_to(record(NodeState::Unmanaged), vec![]),
            &known(&prev, Some(&prev)),
        );
        assert!(!w.patch_record);
    }

    #[test]
    fn calls_follow_the_commands_in_order_and_skip_what_they_lack() {
        let prev = record(NodeState::Upgrading);
        let mut next = prev.clone();
        next.started = Some(900);
        next.cordon = Cordon::Ours;
        let evictions = [(pod("ml", "w"), DrainPass::Device)];
        let installer = pod("tt", "ttdrv-fleet-abc");
        let mut k = known(&prev, Some(&prev));
        k.evictions = &evictions;
        k.installer_pod = Some(&installer);
        k.validation_template = Some("check");
        k.validation_pod = Some("tt/ttdrv-validate-1");
        let commands = vec![
            Command::DeleteValidationPod,
            Command::Evict,
            Command::RunValidationPod,
            Command::DeleteInstallerPod,
        ];
        let w = decide(&step_to(next.clone(), commands.clone()), &k);
        assert_eq!(
            w.calls,
            vec![
                PortCall::DeleteValidationPod {
                    namespace: "tt".into(),
                    name: "ttdrv-validate-1".into()
                },
                PortCall::Evict(evictions.to_vec()),
                PortCall::RunValidationPod {
                    template: "check".into(),
                    cycle: 900
                },
                PortCall::ReplaceInstallerPod(installer.clone()),
            ]
        );
        // The pod deleted already, no template, no cycle, a pod name without
        // namespace, nothing to evict: no calls.
        k.already_deleted = Some(&installer);
        k.validation_template = None;
        k.validation_pod = Some("ttdrv-validate-1");
        k.evictions = &[];
        assert!(decide(&step_to(next, commands), &k).calls.is_empty());
    }

    #[test]
    fn the_validation_pod_needs_the_cycle_start() {
        let prev = record(NodeState::Upgrading);
        let mut k = known(&prev, Some(&prev));
        k.validation_template = Some("check");
        let w = decide(&step_to(prev.clone(), vec![Command::RunValidationPod]), &k);
        assert!(w.calls.is_empty(), "no cycle to name the pod by: {w:?}");
    }

    #[test]
    fn the_slot_goes_back_when_the_cycle_ends_or_a_granted_slot_was_not_used() {
        let draining = record(NodeState::Draining);
        let done = record(NodeState::Done);
        let pending = record(NodeState::Pending);
        assert_eq!(
            releases(&draining, &done, false),
            Releases {
                slot: true,
                claim: true
            }
        );
        assert_eq!(
            releases(&draining, &draining, false),
            Releases {
                slot: false,
                claim: false
            },
            "mid-cycle: kept"
        );
        assert!(releases(&pending, &pending, true).slot, "granted, unused");
        assert!(!releases(&pending, &pending, false).slot, "never held");
    }
}
