//! What a firmware policy reports, free of I/O: each node's slot facts for
//! the rollout plan, its status entry, the summary and the conditions
//! (Ready, Progressing and Paused, with Go's reasons).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use ttdrv_api::firmware::{
    FirmwareNodeState, FirmwareNodeStatus, FirmwareSummary, TenstorrentFirmwarePolicy, labels as fw,
};
use ttdrv_core::firmware::{Desired, FwRecord};
use ttdrv_core::rollout::Candidate;

use super::policy::Seen;
use super::{now_secs, rfc3339};

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
            && obs.driver_cycle.is_none()
            && !foreign_cordon,
        in_progress: rec.occupies_slot(),
        ready: obs.ready,
        unavailable: !obs.ready || foreign_cordon || obs.driver_cycle.is_some(),
        unavailable_because: if !obs.ready {
            Some("NotReady".into())
        } else if let Some(d) = &obs.driver_cycle {
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

/// The Go operator's counts.
pub fn summary(nodes: &[FirmwareNodeStatus]) -> FirmwareSummary {
    let mut s = FirmwareSummary {
        matched: nodes.len() as i32,
        ..Default::default()
    };
    for n in nodes {
        match n.state {
            FirmwareNodeState::Done => s.up_to_date += 1,
            FirmwareNodeState::Failed => s.failed += 1,
            st if st.is_in_progress() => s.in_progress += 1,
            _ => s.pending += 1,
        }
    }
    s
}

/// Ready and Progressing as the Go operator sets them, and Paused; each
/// keeps its transition time while its status stays.
pub fn conditions(
    p: &TenstorrentFirmwarePolicy,
    s: &FirmwareSummary,
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
    let now = rfc3339(now_secs()).unwrap_or(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    [
        ("Ready", ready, ready_reason, ready_msg),
        ("Progressing", prog, prog_reason, prog_msg),
        ("Paused", paused.0, paused.1, paused.2),
    ]
    .into_iter()
    .map(|(t, status, reason, message)| {
        let since = old
            .iter()
            .find(|c| c.type_ == t && c.status == status)
            .map(|c| c.last_transition_time.clone())
            .unwrap_or_else(|| now.clone());
        Condition {
            type_: t.into(),
            status: status.into(),
            reason: reason.into(),
            message,
            observed_generation: p.metadata.generation,
            last_transition_time: since,
        }
    })
    .collect()
}
