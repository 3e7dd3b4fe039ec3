//! Pending: what a node waiting for its cycle does next. Nothing, when
//! nothing is to change or it is left alone; wait, for its node, the
//! firmware, the build ahead or a slot; or start its cycle: in place, without
//! a drain, or cordoned.

use ttdrv_api::NodeState::{self, *};
use ttdrv_api::vfio::Passthrough;

use super::{
    Command, Cordon, Desired, InstallerPod, NodeRecord, Observation, Step, change,
    defers_to_firmware, enter, firmware_too_old, held, module_stays, replace_installer,
    start_cordon, stay, target_loaded, wait, wait_for_slot, with_holders,
};
use crate::reason;

/// The step of a Pending node (owned: an inherited cordon becomes ours).
pub(super) fn pending(mut rec: NodeRecord, obs: &Observation, want: &Desired) -> Step {
    let now = obs.now;
    if want.paused {
        return stay(
            &enter(
                &rec,
                Pending,
                reason::PAUSED,
                Some("policy is paused".into()),
                now,
            ),
            vec![],
        );
    }
    // A cordon this controller inherited (another policy's cycle cut
    // short, or the Go operator's cordon for this policy): ours to
    // undo, so the node goes through our cycle and ends uncordoned.
    if obs.inherited_cordon && obs.unschedulable {
        rec.cordon = Cordon::Ours;
    }
    if let Some(s) = no_cycle(&rec, obs, want) {
        return s;
    }
    if let Some(s) = waits_for_others(&rec, obs, want) {
        return s;
    }
    if let Some(s) = in_place(&rec, obs, want) {
        return s;
    }
    if want.prepare && !obs.prepared {
        return prepare_ahead(&rec, obs, want);
    }
    if !obs.slot
        && let Some(h) = &want.hold
    {
        let mut s = held(&rec, h, now);
        s.record.message = s.record.message.map(|m| with_holders(m, obs));
        return s;
    }
    if !obs.slot {
        let why = format!(
            "waiting for a maxUnavailable slot to upgrade {}",
            change(obs, want)
        );
        return wait_for_slot(&rec, with_holders(why, obs), now);
    }
    if want.drain_enabled {
        start_cordon(&rec, obs)
    } else {
        let mut r = enter(&rec, Upgrading, reason::DRAIN_DISABLED, None, now);
        r.no_drain = false;
        r.started = Some(now);
        Step {
            record: r,
            commands: replace_installer(obs, want),
            needs_slot: false,
        }
    }
}

/// Nothing to do on the node, or only our cordon and the gates to undo:
/// host-managed, every function passed through to VMs, or up to date.
fn no_cycle(rec: &NodeRecord, obs: &Observation, want: &Desired) -> Option<Step> {
    let now = obs.now;
    let up_to_date =
        target_loaded(obs, want) && obs.installer == InstallerPod::Current { ready: true };
    if obs.host_managed && !rec.cordoned_by_us() {
        return Some(stay(
            &enter(
                rec,
                Done,
                reason::HOST_MANAGED,
                Some("DKMS install found; left alone".into()),
                now,
            ),
            vec![],
        ));
    }
    if let Passthrough::All { vfio } = obs.passthrough
        && !rec.cordoned_by_us()
    {
        let msg = format!(
            "all {vfio} Tenstorrent PCI functions are bound to vfio-pci (VM passthrough): \
             tt-kmd serves none of them, so the node is not cordoned, drained or swapped"
        );
        return Some(stay(
            &enter(rec, Done, reason::VFIO_PASSTHROUGH, Some(msg), now),
            vec![],
        ));
    }
    if up_to_date && !rec.cordoned_by_us() && !obs.gates_present {
        return Some(stay(
            &enter(rec, Done, reason::UP_TO_DATE, None, now),
            vec![],
        ));
    }
    if up_to_date {
        // Retried after the module landed, or left mid-cycle by the Go
        // operator (its cordon, its gates at "false"): only the cordon
        // and the gates are left to undo.
        let mut cmds = vec![Command::OpenGates];
        if rec.cordoned_by_us() {
            cmds.insert(0, Command::Uncordon);
        }
        return Some(Step {
            record: enter(rec, Uncordoning, reason::UNCORDON, None, now),
            commands: cmds,
            needs_slot: false,
        });
    }
    None
}

/// The node waits for something other than a slot: to be Ready, the policy
/// accepted, a firmware cycle or the firmware the target needs.
fn waits_for_others(rec: &NodeRecord, obs: &Observation, want: &Desired) -> Option<Step> {
    let now = obs.now;
    let upgrade = || change(obs, want);
    if !obs.ready {
        let why = format!("waiting for the node to be Ready to upgrade {}", upgrade());
        return Some(wait(rec, why, now));
    }
    if want.refused {
        let why = "this policy is refused (see its Degraded condition: its spec, or its installer DaemonSet): nothing of it starts";
        return Some(wait(rec, why.into(), now));
    }
    if let Some(who) = &obs.held_by {
        let why = format!(
            "{who} has the node out of service; one disruption at a time: {} waits",
            upgrade()
        );
        return Some(stay(
            &enter(rec, Pending, reason::WAITING_FOR_FIRMWARE, Some(why), now),
            vec![],
        ));
    }
    if let Some(min) = firmware_too_old(obs, want) {
        let why = format!(
            "tt-kmd {} needs card firmware {min} or newer (spec.minFirmwareVersion); the cards read back {}: \
             {} waits for the firmware policy",
            want.version,
            obs.firmware_version.as_deref().unwrap_or("unknown"),
            upgrade()
        );
        return Some(stay(
            &enter(
                rec,
                Pending,
                reason::WAITING_FOR_FIRMWARE_VERSION,
                Some(why),
                now,
            ),
            vec![],
        ));
    }
    if let Some(fw) = defers_to_firmware(rec.cordoned_by_us(), obs, want) {
        if want.prepare && !obs.prepared {
            // The build ahead goes on while the flash goes first.
            return Some(prepare_ahead(rec, obs, want));
        }
        let why = format!(
            "the firmware policy {fw} flashes this node first and hands its cordon to this upgrade \
             (one cordon and drain for both): {} waits",
            upgrade()
        );
        return Some(stay(
            &enter(rec, Pending, reason::WAITING_FOR_FIRMWARE, Some(why), now),
            vec![],
        ));
    }
    None
}

/// A cycle without cordon or drain: the module stays (restart-only change,
/// a parameter written at run time) or none is loaded yet (first install).
fn in_place(rec: &NodeRecord, obs: &Observation, want: &Desired) -> Option<Step> {
    let now = obs.now;
    let module_kept = module_stays(obs, want);
    let stale = matches!(obs.installer, InstallerPod::Stale { .. });
    if !rec.cordoned_by_us() && (module_kept || obs.loaded.is_none()) {
        // Nothing can hold the device for a module swap: either the module
        // stays (restart-only change, or a parameter written at run
        // time) or there is none yet (first install).
        let why = if module_kept {
            reason::RESTART
        } else {
            reason::INSTALL
        };
        // Replacing the installer pod of a node that keeps its module
        // (a new installer template) takes a slot like any cycle: a
        // fleet's pods are replaced maxUnavailable at a time.
        let bounded = module_kept && stale;
        if bounded
            && !obs.slot
            && let Some(h) = &want.hold
        {
            return Some(held(rec, h, now));
        }
        if bounded && !obs.slot {
            let why = format!(
                "waiting for a maxUnavailable slot to replace the installer pod in place (tt-kmd {} stays loaded)",
                want.version
            );
            return Some(wait_for_slot(rec, why, now));
        }
        let mut r = enter(rec, Upgrading, why, None, now);
        r.no_drain = true;
        r.bounded = bounded;
        r.started = Some(now);
        let cmds = if stale {
            vec![Command::DeleteInstallerPod]
        } else {
            vec![]
        };
        return Some(Step {
            record: r,
            commands: cmds,
            needs_slot: false,
        });
    }
    None
}

/// Pending, build-ahead on, the target not yet in the node's cache: the
/// node serves on while its installer builds. Its stale installer pod is
/// replaced when the prepare plan gives it a place (`prepare_turn`); a build
/// that fails fails the node here, before any cordon (the rollout then halts
/// as for any Failed node); a pod older than this wait (a retry) that has
/// failed is replaced for a new build.
fn prepare_ahead(rec: &NodeRecord, obs: &Observation, want: &Desired) -> Step {
    let now = obs.now;
    let target = want.version.as_str();
    // A pod started since the node began to wait is this wait's: its failure
    // fails the node. One from before (the wait is a retry) may still be
    // failing on the cause just fixed: a new pod builds again.
    if let (Some(f), InstallerPod::Current { .. }) = (&obs.installer_failure, &obs.installer) {
        if f.pod_created.is_none_or(|t| t >= rec.since) {
            let msg = format!(
                "{} (while building {target} ahead; the node was not cordoned and kept serving). \
                 The rollout of {policy} is halted; after fixing the cause, retry with \
                 `kubectl tt driver retry {policy} {node}`",
                f.message,
                policy = want.policy,
                node = if obs.node.is_empty() {
                    "<node>"
                } else {
                    obs.node.as_str()
                },
            );
            return stay(
                &enter(rec, NodeState::Failed, f.reason, Some(msg), now),
                vec![],
            );
        }
        let why = format!("building {target} again in a new installer pod (the last one failed)");
        return stay(
            &enter(rec, NodeState::Pending, reason::PREPARING, Some(why), now),
            vec![Command::DeleteInstallerPod],
        );
    }
    let (why, cmds) = match obs.installer {
        InstallerPod::Stale { deleting: false } if obs.template_pending => (
            format!(
                "waiting for the DaemonSet controller to observe the installer template of {target} before replacing the pod"
            ),
            vec![],
        ),
        InstallerPod::Stale { deleting: false } if obs.prepare_turn => (
            format!("replacing the installer pod to build {target} ahead of the cordon"),
            vec![Command::DeleteInstallerPod],
        ),
        InstallerPod::Stale { deleting: false } => (
            format!(
                "waiting for a place to build {target} ahead (upgradePolicy.prepare.maxConcurrent)"
            ),
            vec![],
        ),
        // Said as it is: a DaemonSet controller that lags (after an
        // API-server outage, say) is not the installer building.
        InstallerPod::Missing | InstallerPod::Stale { deleting: true } => (
            format!(
                "waiting for the DaemonSet controller to create the installer pod that builds {target} ahead of the cordon"
            ),
            vec![],
        ),
        _ => (
            format!(
                "the installer builds {target} into the node's cache ahead of the cordon; the node serves meanwhile"
            ),
            vec![],
        ),
    };
    stay(
        &enter(
            rec,
            NodeState::Pending,
            reason::PREPARING,
            Some(with_holders(why, obs)),
            now,
        ),
        cmds,
    )
}
