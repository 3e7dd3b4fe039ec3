//! What a firmware policy reports, free of I/O: each node's slot facts for
//! the rollout plan, its status entry, the summary and the conditions
//! (Ready, Progressing and Paused, with Go's reasons, and Conflict).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use ttdrv_api::firmware::{
    FirmwareNodeState, FirmwareNodeStatus, FirmwareSummary, TenstorrentFirmwarePolicy,
    labels as fw, reason,
};
use ttdrv_core::condition::condition;
use ttdrv_core::firmware::{Desired, FwRecord};
use ttdrv_core::rollout::Candidate;

use super::clock::{now_secs, rfc3339};
use super::seen::Seen;

/// The node's slot facts for the rollout plan.
pub(super) fn candidate(s: &Seen, want: &Desired) -> Candidate {
    let obs = &s.view.obs;
    let rec = &s.prev;
    let ours = rec.cordon == ttdrv_core::machine::Cordon::Ours;
    let at_target = obs.current.as_deref() == Some(want.readback.as_str());
    let foreign_cordon = obs.unschedulable && !ours;
    let name = s.node.metadata.name.clone().unwrap_or_default();
    Candidate {
        // A node at the target without our cordon to undo has nothing to do.
        wants_slot: rec.state == FirmwareNodeState::Pending
            && (ours || !at_target)
            && obs.held_by.is_none()
            && !foreign_cordon,
        in_progress: rec.occupies_slot(),
        ready: obs.ready,
        unavailable: !obs.ready || foreign_cordon || obs.held_by.is_some(),
        unavailable_because: if !obs.ready {
            Some("NotReady".into())
        } else if let Some(d) = &obs.held_by {
            Some(format!("held by {d}"))
        } else if foreign_cordon {
            Some(ttdrv_core::node::foreign_cordon(&s.node))
        } else {
            None
        },
        failed: want.halted && rec.state == FirmwareNodeState::Failed,
        has_device_pods: s.view.has_device_pods,
        prepared: true,
        name,
    }
}

pub(super) fn node_status(name: &str, r: &FwRecord, s: &Seen) -> FirmwareNodeStatus {
    FirmwareNodeStatus {
        name: name.to_string(),
        state: r.state,
        reason: r.reason.clone(),
        current_version: r.current.clone().or(s.view.obs.current.clone()),
        last_flash_job: r.job.clone().or_else(|| {
            ttdrv_core::node::annotation(&s.node, fw::LAST_FLASH_JOB).map(String::from)
        }),
        message: r.message.clone(),
        last_transition_time: rfc3339(r.since),
    }
}

/// A status entry for a node another firmware policy owns: listed (as the Go
/// operator lists it), not this policy's to flash.
pub fn is_conflict(n: &FirmwareNodeStatus) -> bool {
    n.reason.as_deref() == Some(reason::NODE_CONFLICT)
}

/// The Go operator's counts, over the nodes this policy owns: a node another
/// policy owns is neither pending nor matched here (it is in the Conflict
/// condition), so a policy whose every other node is done settles.
pub fn summary(nodes: &[FirmwareNodeStatus]) -> FirmwareSummary {
    let mut s = FirmwareSummary::default();
    for n in nodes.iter().filter(|n| !is_conflict(n)) {
        s.matched += 1;
        match n.state {
            FirmwareNodeState::Done => s.up_to_date += 1,
            FirmwareNodeState::Failed => s.failed += 1,
            st if st.is_in_progress() => s.in_progress += 1,
            _ => s.pending += 1,
        }
    }
    s
}

/// Ready and Progressing as the Go operator sets them, Paused, and Conflict
/// (`conflicts`: node, the policy that owns it); each keeps its transition
/// time while its status stays.
pub fn conditions(
    p: &TenstorrentFirmwarePolicy,
    s: &FirmwareSummary,
    conflicts: &[(String, String)],
    old: &[Condition],
) -> Vec<Condition> {
    let halted = p.spec.upgrade_policy.halt_on_failure && s.failed > 0;
    let (ready, ready_reason, ready_msg) = if s.failed > 0 {
        (
            "False",
            "NodesFailed",
            format!("{} node(s) failed", s.failed),
        )
    } else if s.in_progress > 0 || s.pending > 0 {
        (
            "False",
            "NodesPending",
            format!("{}/{} up to date", s.up_to_date, s.matched),
        )
    } else {
        (
            "True",
            "AllUpToDate",
            "All matched nodes at desired version".to_string(),
        )
    };
    let (prog, prog_reason, prog_msg) = if halted {
        (
            "False",
            "Halted",
            "a node is Failed (haltOnFailure): retry it to go on".to_string(),
        )
    } else if p.spec.paused {
        ("False", "Paused", "spec.paused".to_string())
    } else if s.in_progress > 0 || s.pending > 0 {
        (
            "True",
            "NodesUpgrading",
            format!("{} in progress", s.in_progress),
        )
    } else {
        ("False", "Idle", String::new())
    };
    let paused = if p.spec.paused {
        (
            "True",
            "Paused",
            "spec.paused: no new firmware cycle starts".to_string(),
        )
    } else {
        ("False", "Running", String::new())
    };
    // Overlapping selectors: the node stays with the policy that owns it
    // (its owned-by label, as the Go operator decides), and this one says
    // so instead of waiting on it.
    let conflicts: Vec<String> = conflicts
        .iter()
        .map(|(n, owner)| format!("{n} (owned by {owner})"))
        .collect();
    let conflict = if conflicts.is_empty() {
        ("False", "NoOverlap", String::new())
    } else {
        (
            "True",
            "SelectorOverlap",
            format!(
                "nodes another TenstorrentFirmwarePolicy owns are left to it: {}",
                conflicts.join(", ")
            ),
        )
    };
    let now = k8s_openapi::jiff::Timestamp::from_second(now_secs())
        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    [
        ("Ready", ready, ready_reason, ready_msg),
        ("Progressing", prog, prog_reason, prog_msg),
        ("Paused", paused.0, paused.1, paused.2),
        ("Conflict", conflict.0, conflict.1, conflict.2),
    ]
    .into_iter()
    .map(|(t, status, reason, message)| {
        condition(
            t,
            status == "True",
            reason,
            message,
            p.metadata.generation,
            old,
            now,
        )
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, state: FirmwareNodeState, why: &str) -> FirmwareNodeStatus {
        FirmwareNodeStatus {
            name: name.into(),
            state,
            reason: Some(why.into()),
            current_version: None,
            last_flash_job: None,
            message: None,
            last_transition_time: None,
        }
    }

    fn policy() -> TenstorrentFirmwarePolicy {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "firmware.tenstorrent.com/v1alpha1",
            "kind": "TenstorrentFirmwarePolicy",
            "metadata": { "name": "prod-fw", "generation": 2 },
            "spec": { "version": "19.8.0" },
        }))
        .expect("policy")
    }

    fn cond<'a>(cs: &'a [Condition], t: &str) -> (&'a str, &'a str, &'a str) {
        let c = cs.iter().find(|c| c.type_ == t).expect("condition");
        (c.status.as_str(), c.reason.as_str(), c.message.as_str())
    }

    #[test]
    fn another_policys_nodes_are_a_conflict_not_pending_work() {
        let nodes = [
            node("a", FirmwareNodeState::Done, reason::FLASH_SUCCEEDED),
            node("b", FirmwareNodeState::Pending, reason::NODE_CONFLICT),
            node("c", FirmwareNodeState::Pending, reason::NODE_CONFLICT),
        ];
        let s = summary(&nodes);
        assert_eq!((s.matched, s.up_to_date, s.pending), (1, 1, 0));
        let conflicts = [
            ("b".to_string(), "fleet-fw".to_string()),
            ("c".to_string(), "fleet-fw".to_string()),
        ];
        let cs = conditions(&policy(), &s, &conflicts, &[]);
        assert_eq!(cond(&cs, "Ready").0, "True");
        assert_eq!(cond(&cs, "Progressing").0, "False", "settled: {cs:?}");
        assert_eq!(
            cond(&cs, "Conflict"),
            (
                "True",
                "SelectorOverlap",
                "nodes another TenstorrentFirmwarePolicy owns are left to it: b (owned by fleet-fw), c (owned by fleet-fw)"
            )
        );
        assert!(cs.iter().all(|c| c.observed_generation == Some(2)));
        // Every node another's: nothing to do here, settled all the same.
        let only = summary(&nodes[1..]);
        assert_eq!((only.matched, only.pending), (0, 0));
        let cs = conditions(&policy(), &only, &conflicts, &[]);
        assert_eq!(cond(&cs, "Progressing").0, "False");
    }

    #[test]
    fn without_overlap_the_conflict_condition_is_false() {
        let nodes = [node(
            "a",
            FirmwareNodeState::Pending,
            reason::WAITING_FOR_SLOT,
        )];
        let s = summary(&nodes);
        assert_eq!((s.matched, s.pending), (1, 1));
        let cs = conditions(&policy(), &s, &[], &[]);
        assert_eq!(cond(&cs, "Conflict"), ("False", "NoOverlap", ""));
        assert_eq!(cond(&cs, "Progressing").0, "True");
    }
}
