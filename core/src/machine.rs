//! The per-node upgrade state machine, free of I/O.
//!
//! [`step`] maps (persisted record, fresh observation, desired policy) to the next
//! record and the commands that move the node there. NodeActors carry the
//! commands out; the record is persisted on the Node (annotation
//! `driver.tenstorrent.com/upgrade-state`) in the same patch that cordons or
//! uncordons, so a controller killed at any instant resumes without cordoning
//! twice or forgetting who cordoned the node.

use ttdrv_api::NodeState;

pub use crate::drain::DrainProgress;
pub use crate::installer::Failure;
use crate::node::Target;
use crate::reason;
use ttdrv_api::module_params::{self, Values};
use ttdrv_api::vfio::Passthrough;

// The record and the observation live in leaf modules (the modules that read
// a Node or a record need them without depending on the machine);
// re-exported here, where callers have always found them.
pub use crate::record::{Cordon, NodeRecord};
pub use observation::{InstallerPod, Observation, ValidationPod};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    pub policy: String,
    pub version: String,
    pub drain_enabled: bool,
    pub drain_timeout_seconds: i64,
    pub upgrade_timeout_seconds: i64,
    pub paused: bool,
    /// The cluster refuses the policy (its DaemonSet cannot be applied): no
    /// node starts a cycle, not even one without drain.
    pub refused: bool,
    /// `spec.unmanage`: vacate the nodes for DKMS instead of installing
    /// (see [`vacate`]).
    pub unmanage: bool,
    /// `upgradePolicy.prepare.enabled`: a node's cycle starts only once its
    /// agent has built the target ahead ([`prepare_ahead`]).
    pub prepare: bool,
    /// `spec.moduleParameters`, canonical values: part of the target (a
    /// node loaded with other values is reloaded in a drained cycle).
    pub parameters: Values,
    /// `spec.minFirmwareVersion`.
    pub min_firmware: Option<String>,
    /// A node with a flash due waits for it and takes its cordon: one cordon
    /// and drain for both ([`crate::claim`]). The controller's
    /// `--combine-firmware-and-driver` (on by default).
    pub combine_with_firmware: bool,
    /// `upgradePolicy.soakSeconds`: trouble on a node this long after its
    /// upgrade fails it ([`crate::soak`]).
    pub soak_seconds: i64,
    /// No new slot-holding cycle starts now (a soak, a closed maintenance
    /// window, a canary not promoted yet): the reason and why. Build-ahead
    /// and cycles in progress go on.
    pub hold: Option<Hold>,
    /// `upgradePolicy.validation.podTemplateName`: a pod of it must succeed
    /// on the node before a swapped node goes back into service.
    pub validation_pod: Option<String>,
    /// `upgradePolicy.validation.timeoutSeconds`.
    pub validation_timeout_seconds: i64,
}

/// Why no new cycle starts now ([`Desired::hold`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hold {
    /// One of [`reason::SOAKING`], [`reason::OUTSIDE_MAINTENANCE_WINDOW`],
    /// [`reason::WAITING_FOR_PROMOTION`] (`spec.promoteAfter`:
    /// [`crate::promotion::Gate::hold`]).
    pub reason: &'static str,
    pub why: String,
}

impl Desired {
    /// What `policy` asks of its nodes: the one reading of its spec for the
    /// machine. `refused` starts false: only the controller knows whether the
    /// cluster accepts the policy's DaemonSet, and `hold` starts `None`: only
    /// the controller reads the clock, the records and the canary.
    pub fn of(policy: &ttdrv_api::TenstorrentDriverPolicy, upgrade_timeout_seconds: i64) -> Self {
        let spec = &policy.spec;
        Self {
            policy: policy.metadata.name.clone().unwrap_or_default(),
            version: spec.version.clone(),
            drain_enabled: spec.upgrade_policy.drain.enable,
            drain_timeout_seconds: spec.upgrade_policy.drain.timeout_seconds,
            upgrade_timeout_seconds,
            paused: spec.paused,
            refused: false,
            unmanage: spec.unmanage,
            // Vacating builds nothing.
            prepare: spec.upgrade_policy.prepare.enabled && !spec.unmanage,
            parameters: spec.parameter_values(),
            min_firmware: spec.min_firmware_version.clone(),
            combine_with_firmware: true,
            soak_seconds: spec.upgrade_policy.soak_seconds,
            hold: None,
            validation_pod: spec.upgrade_policy.validation.pod_template_name.clone(),
            validation_timeout_seconds: spec.upgrade_policy.validation.timeout_seconds,
        }
    }

    /// What the policy wants loaded, for [`crate::node::is_loaded`].
    pub fn target(&self) -> Target<'_> {
        Target::new(&self.version, &self.parameters)
    }
}

/// Side effects a transition asks for. Node patches (cordon, gates) are applied
/// together with the record in one patch; the others after it is persisted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    Cordon,
    CloseGates,
    Evict,
    DeleteInstallerPod,
    Uncordon,
    OpenGates,
    /// Create the cycle's validation pod on the node from
    /// [`Desired::validation_pod`] (nothing if it exists).
    RunValidationPod,
    /// Delete the cycle's validation pod ([`Observation::validation_pod`]),
    /// which succeeded (a failed one stays, for its log).
    DeleteValidationPod,
    /// The vacate cycle ended: remove the record, the go-ahead and the driver
    /// labels we wrote, and mark the node `unmanaged` for this policy (in the
    /// same patch as the uncordon and the gates).
    Vacate,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub record: NodeRecord,
    pub commands: Vec<Command>,
    /// The node waits for a rollout slot only: with one ([`Observation::slot`])
    /// this step would start a disruptive cycle. A Pending node for which it
    /// is false goes on without one (left alone, or installed in place).
    pub needs_slot: bool,
}

fn enter(
    rec: &NodeRecord,
    state: NodeState,
    reason: &str,
    message: Option<String>,
    now: i64,
) -> NodeRecord {
    let mut r = rec.clone();
    if r.state != state {
        r.since = now;
    }
    if !state.is_in_progress() {
        // A bounded cycle's slot ends with the cycle, and so does its
        // one drain again.
        r.bounded = false;
        r.redrained = None;
    }
    r.state = state;
    r.reason = Some(reason.to_string());
    r.message = message;
    r
}

/// Stays Pending, waiting (reason WaitingForSlot), and says for what.
fn wait(rec: &NodeRecord, why: String, now: i64) -> Step {
    stay(
        &enter(rec, NodeState::Pending, reason::WAITING, Some(why), now),
        vec![],
    )
}

/// Pending until a slot is granted (see [`Step::needs_slot`]).
fn wait_for_slot(rec: &NodeRecord, why: String, now: i64) -> Step {
    Step {
        needs_slot: true,
        ..wait(rec, why, now)
    }
}

/// Upgrading, the module validated: the user's validation pod of this
/// cycle runs (created first), must succeed within the validation timeout,
/// and its failure fails the node, kept cordoned on the new version. None:
/// it succeeded, the node goes on.
fn user_validation(
    rec: &NodeRecord,
    obs: &Observation,
    want: &Desired,
    template: &str,
    now: i64,
) -> Option<Step> {
    use crate::drain::RunOutcome;
    // Failed, kept cordoned on the new version for a person.
    let fail = |msg: String| {
        Some(stay(
            &enter(
                rec,
                NodeState::Failed,
                reason::VALIDATION_FAILED,
                Some(msg),
                now,
            ),
            vec![],
        ))
    };
    let Some(run) = &obs.validation_pod else {
        if now - rec.since > want.upgrade_timeout_seconds {
            return fail(format!(
                "no validation pod of PodTemplate {template} was created within {}s (does it exist in the operator's namespace? the controller's Events and log say why); the node stays cordoned on tt-kmd {}{}",
                want.upgrade_timeout_seconds,
                want.version,
                retry_hint(&want.policy, rec.cordoned_by_us())
            ));
        }
        let why = format!("running validation pod template {template} on the node");
        return Some(stay(
            &enter(
                rec,
                NodeState::Upgrading,
                reason::VALIDATING,
                Some(why),
                now,
            ),
            vec![Command::RunValidationPod],
        ));
    };
    let failed = |what: String| {
        fail(format!(
            "{what}; the node stays cordoned on tt-kmd {} (read the pod's log){}",
            want.version,
            retry_hint(&want.policy, rec.cordoned_by_us())
        ))
    };
    match &run.outcome {
        RunOutcome::Succeeded => None,
        RunOutcome::Failed(why) => failed(format!("validation pod {} failed: {why}", run.pod)),
        RunOutcome::Running if now - run.created > want.validation_timeout_seconds => {
            failed(format!(
                "validation pod {} did not succeed within {}s (upgradePolicy.validation.timeoutSeconds)",
                run.pod, want.validation_timeout_seconds
            ))
        }
        RunOutcome::Running => Some(stay(
            &enter(
                rec,
                NodeState::Upgrading,
                reason::VALIDATING,
                Some(format!("validation pod {} runs", run.pod)),
                now,
            ),
            vec![],
        )),
    }
}

/// Pending, held by [`Desired::hold`]: the node still needs a slot (the
/// rollout grants none while the hold lasts), with the hold's reason.
fn held(rec: &NodeRecord, hold: &Hold, now: i64) -> Step {
    Step {
        needs_slot: true,
        ..stay(
            &enter(
                rec,
                NodeState::Pending,
                hold.reason,
                Some(hold.why.clone()),
                now,
            ),
            vec![],
        )
    }
}

/// The step from `rec`, a record just sent back to Pending within this
/// step: never with a slot (slots are granted to Pending nodes only, after
/// this step is seen), so it does not ask for one either.
fn again_without_slot(rec: &NodeRecord, obs: &Observation, want: &Desired) -> Step {
    let next = step(
        rec,
        &Observation {
            slot: false,
            ..obs.clone()
        },
        want,
    );
    Step {
        needs_slot: false,
        ..next
    }
}

fn stay(rec: &NodeRecord, commands: Vec<Command>) -> Step {
    Step {
        record: rec.clone(),
        commands,
        needs_slot: false,
    }
}

/// One transition. A node leaving Done or Failed is re-evaluated as Pending in
/// the same step, but never with a slot: slots are granted to Pending nodes only.
/// Idempotent: re-running a step on the same observation issues
/// the same (idempotent) commands and reaches the same record.
///
/// Around the transition proper: a paused policy holds every node mid-cycle
/// where it is (no command, the deadline stopped) and resumes it with the
/// deadline moved on by the time held; a node that is not Ready keeps its
/// slot and says so in its reason.
pub fn step(rec: &NodeRecord, obs: &Observation, want: &Desired) -> Step {
    let mut next = step_inner(rec, obs, want);
    // An installer pod replaced before the DaemonSet controller has seen the
    // template would come back on the old one: kept, and asked for again by
    // the next pass.
    if obs.template_pending {
        next.commands.retain(|c| *c != Command::DeleteInstallerPod);
    }
    // A vacate cycle fails as UnloadFailed, whichever step failed: the
    // policy's other nodes halt all the same, and the state says which cycle.
    if want.unmanage && next.record.state == NodeState::Failed && rec.state != NodeState::Failed {
        next.record.state = NodeState::UnloadFailed;
    }
    next
}

fn step_inner(rec: &NodeRecord, obs: &Observation, want: &Desired) -> Step {
    let mut rec = rec.clone();
    if rec.state.is_in_progress() {
        if want.paused {
            if rec.paused_at.is_none() {
                rec.paused_at = Some(obs.now);
            }
            return stay(&rec, vec![]);
        }
        if let Some(t) = rec.paused_at.take() {
            rec.since += (obs.now - t).max(0);
        }
    }
    let mut next = transition(&rec, obs, want);
    let r = &mut next.record;
    if r.state.is_in_progress() && r.state == rec.state {
        if !obs.ready && r.reason.as_deref() != Some(reason::NODE_NOT_READY) {
            r.reason = Some(reason::NODE_NOT_READY.into());
            r.message = Some(
                "the node is not Ready: it keeps its slot; the cycle goes on when it is back"
                    .into(),
            );
        } else if obs.ready && r.reason.as_deref() == Some(reason::NODE_NOT_READY) {
            r.reason = Some(usual_reason(r).into());
            r.message = None;
        }
    }
    next
}

/// The reason a node mid-cycle carries when nothing is wrong.
fn usual_reason(r: &NodeRecord) -> &'static str {
    match r.state {
        NodeState::Cordoning => reason::CORDON,
        NodeState::Draining => reason::DRAIN,
        NodeState::Upgrading if r.no_drain => reason::RESTART,
        NodeState::Upgrading => reason::REPLACE_INSTALLER,
        NodeState::Unloading => reason::UNLOAD,
        _ => reason::UNCORDON,
    }
}

/// The failure reason of a deadline that passed: the node's own unreadiness
/// when it is not Ready, else `timeout`.
fn deadline_reason(obs: &Observation, timeout: &'static str) -> &'static str {
    if obs.ready {
        timeout
    } else {
        reason::NODE_NOT_READY
    }
}

fn transition(rec: &NodeRecord, obs: &Observation, want: &Desired) -> Step {
    use NodeState::*;
    let now = obs.now;
    let module_ok = crate::node::is_loaded(
        obs.loaded.as_deref(),
        obs.parameters.as_ref(),
        want.target(),
    );
    let up_to_date = module_ok && obs.installer == InstallerPod::Current { ready: true };
    // The module stays for the target: at it, or a parameter the module
    // takes at run time differs (the new pod's agent writes it in sysfs).
    let module_kept = crate::node::keeps_module(
        obs.loaded.as_deref(),
        obs.parameters.as_ref(),
        want.target(),
    );
    let mut rec = rec.clone();
    if let Some(s) = vacate::transition(&rec, obs, want) {
        return s;
    }
    // A new target restarts the cycle of settled nodes (a version change is the
    // operator's action; in-flight nodes simply continue towards the new target).
    if rec.target != want.version {
        rec.target = want.version.clone();
        if matches!(rec.state, Done | Failed) {
            let r = enter(&rec, Pending, reason::RETARGET, None, now);
            return again_without_slot(&r, obs, want);
        }
    }
    match rec.state {
        Pending => {
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
            if obs.host_managed && !rec.cordoned_by_us() {
                return stay(
                    &enter(
                        &rec,
                        Done,
                        reason::HOST_MANAGED,
                        Some("DKMS install found; left alone".into()),
                        now,
                    ),
                    vec![],
                );
            }
            if let Passthrough::All { vfio } = obs.passthrough
                && !rec.cordoned_by_us()
            {
                let msg = format!(
                    "all {vfio} Tenstorrent PCI functions are bound to vfio-pci (VM passthrough): \
                     tt-kmd serves none of them, so the node is not cordoned, drained or swapped"
                );
                return stay(
                    &enter(&rec, Done, reason::VFIO_PASSTHROUGH, Some(msg), now),
                    vec![],
                );
            }
            if up_to_date && !rec.cordoned_by_us() && !obs.gates_present {
                return stay(&enter(&rec, Done, reason::UP_TO_DATE, None, now), vec![]);
            }
            if up_to_date {
                // Retried after the module landed, or left mid-cycle by the Go
                // operator (its cordon, its gates at "false"): only the cordon
                // and the gates are left to undo.
                let mut cmds = vec![Command::OpenGates];
                if rec.cordoned_by_us() {
                    cmds.insert(0, Command::Uncordon);
                }
                return Step {
                    record: enter(&rec, Uncordoning, reason::UNCORDON, None, now),
                    commands: cmds,
                    needs_slot: false,
                };
            }
            let upgrade = || change(obs, want);
            if !obs.ready {
                let why = format!("waiting for the node to be Ready to upgrade {}", upgrade());
                return wait(&rec, why, now);
            }
            if want.refused {
                let why = "this policy is refused (see its Degraded condition: its spec, or its installer DaemonSet): nothing of it starts";
                return wait(&rec, why.into(), now);
            }
            if let Some(who) = &obs.firmware_cycle {
                let why = format!(
                    "{who} has the node out of service; one disruption at a time: {} waits",
                    upgrade()
                );
                return stay(
                    &enter(&rec, Pending, reason::WAITING_FOR_FIRMWARE, Some(why), now),
                    vec![],
                );
            }
            if let Some(min) = firmware_too_old(obs, want) {
                let why = format!(
                    "tt-kmd {} needs card firmware {min} or newer (spec.minFirmwareVersion); the cards read back {}: \
                     {} waits for the firmware policy",
                    want.version,
                    obs.firmware_version.as_deref().unwrap_or("unknown"),
                    upgrade()
                );
                return stay(
                    &enter(
                        &rec,
                        Pending,
                        reason::WAITING_FOR_FIRMWARE_VERSION,
                        Some(why),
                        now,
                    ),
                    vec![],
                );
            }
            if let Some(fw) = defers_to_firmware(rec.cordoned_by_us(), obs, want) {
                if want.prepare && !obs.prepared {
                    // The build ahead goes on while the flash goes first.
                    return prepare_ahead(&rec, obs, want);
                }
                let why = format!(
                    "the firmware policy {fw} flashes this node first and hands its cordon to this upgrade \
                     (one cordon and drain for both): {} waits",
                    upgrade()
                );
                return stay(
                    &enter(&rec, Pending, reason::WAITING_FOR_FIRMWARE, Some(why), now),
                    vec![],
                );
            }
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
                    return held(&rec, h, now);
                }
                if bounded && !obs.slot {
                    let why = format!(
                        "waiting for a maxUnavailable slot to replace the installer pod in place (tt-kmd {} stays loaded)",
                        want.version
                    );
                    return wait_for_slot(&rec, why, now);
                }
                let mut r = enter(&rec, Upgrading, why, None, now);
                r.no_drain = true;
                r.bounded = bounded;
                r.started = Some(now);
                let cmds = if stale {
                    vec![Command::DeleteInstallerPod]
                } else {
                    vec![]
                };
                return Step {
                    record: r,
                    commands: cmds,
                    needs_slot: false,
                };
            }
            if want.prepare && !obs.prepared {
                return prepare_ahead(&rec, obs, want);
            }
            if !obs.slot
                && let Some(h) = &want.hold
            {
                return held(&rec, h, now);
            }
            if !obs.slot {
                let why = format!("waiting for a maxUnavailable slot to upgrade {}", upgrade());
                return wait_for_slot(&rec, why, now);
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
        Cordoning => {
            let cordoned = obs.unschedulable;
            if cordoned && obs.gates_closed && !want.paused {
                return Step {
                    record: enter(&rec, Draining, reason::DRAIN, None, now),
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
        Draining => {
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
                    return stay(&enter(&rec, Failed, why, Some(msg), now), vec![]);
                }
                return stay(&rec, vec![]);
            };
            if drain.remaining.is_empty() {
                if want.paused {
                    return stay(&rec, vec![]);
                }
                if want.unmanage {
                    return vacate::start_unload(&rec, now);
                }
                return Step {
                    record: enter(&rec, Upgrading, reason::REPLACE_INSTALLER, None, now),
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
                return stay(&enter(&rec, Failed, why, Some(msg), now), vec![]);
            }
            stay(&rec, vec![Command::Evict])
        }
        Upgrading => {
            if obs.host_managed {
                // The new agent found a DKMS install: it stands down, so do we.
                if rec.cordoned_by_us() || obs.gates_present {
                    let mut cmds = vec![Command::OpenGates];
                    if rec.cordoned_by_us() {
                        cmds.insert(0, Command::Uncordon);
                    }
                    return Step {
                        record: enter(&rec, Uncordoning, reason::HOST_MANAGED, None, now),
                        commands: cmds,
                        needs_slot: false,
                    };
                }
                let mut r = enter(
                    &rec,
                    Done,
                    reason::HOST_MANAGED,
                    Some("DKMS install found; left alone".into()),
                    now,
                );
                r.no_drain = false;
                return stay(&r, vec![]);
            }
            if module_ok && obs.installer == (InstallerPod::Current { ready: true }) {
                // The user's check, on the swapped node still cordoned (by
                // us, or by an admin in a drained cycle).
                let cordoned_cycle = rec.cordoned_by_us() || (!rec.no_drain && want.drain_enabled);
                if cordoned_cycle
                    && let Some(template) = &want.validation_pod
                    && let Some(step) = user_validation(&rec, obs, want, template, now)
                {
                    return step;
                }
                if !rec.cordoned_by_us() && (rec.no_drain || !want.drain_enabled) {
                    let mut r = enter(&rec, Done, reason::UPGRADED, None, now);
                    r.no_drain = false;
                    return stay(&r, vec![]);
                }
                let mut cmds = vec![Command::OpenGates];
                if rec.cordoned_by_us() {
                    cmds.insert(0, Command::Uncordon);
                }
                // A validation pod that succeeded has said all it had to.
                if obs.validation_pod.is_some() {
                    cmds.push(Command::DeleteValidationPod);
                }
                return Step {
                    record: enter(&rec, Uncordoning, reason::UNCORDON, None, now),
                    commands: cmds,
                    needs_slot: false,
                };
            }
            // The new installer failed for good: fail now, with its cause. (A
            // drained cycle replaces the pod it found, or keeps the one that
            // built ahead; failures from before the cycle are not its own,
            // nor is the refusal this cycle drained again for.)
            let this_cycles = |f: &Failure| {
                (rec.no_drain || f.at().is_none_or(|c| c >= rec.since))
                    && !drained_again_for(&rec, f)
            };
            if let (Some(f), InstallerPod::Current { .. }) =
                (&obs.installer_failure, &obs.installer)
                && this_cycles(f)
            {
                if let Some(step) = drain_again(&rec, f, !module_ok, want, now) {
                    return step;
                }
                // The new module failed validation and the agent put the
                // previous one back: the node returns to service on it, then
                // fails (the rollout halts either way).
                if f.reason == reason::VALIDATION_FAILED
                    && !module_ok
                    && let Some(back) = obs.loaded.as_deref()
                {
                    let msg = format!(
                        "{}; the node is back in service on tt-kmd {back}{}",
                        f.message,
                        retry_hint(&want.policy, false)
                    );
                    let mut cmds = vec![Command::OpenGates];
                    if rec.cordoned_by_us() {
                        cmds.insert(0, Command::Uncordon);
                    }
                    return Step {
                        record: enter(&rec, Uncordoning, f.reason, Some(msg), now),
                        commands: cmds,
                        needs_slot: false,
                    };
                }
                let msg = format!(
                    "{}{}",
                    f.message,
                    retry_hint(&want.policy, rec.cordoned_by_us())
                );
                return stay(&enter(&rec, Failed, f.reason, Some(msg), now), vec![]);
            }
            // A cycle without drain found a module of another version loaded
            // (the label was missing or stale): only a drained cycle may swap it.
            if rec.no_drain && !module_kept && obs.loaded.is_some() {
                let msg = format!(
                    "tt-kmd {} is loaded: it is replaced only after cordon and drain",
                    obs.loaded.as_deref().unwrap_or("")
                );
                let mut r = enter(&rec, Pending, reason::RETARGET, Some(msg), now);
                r.no_drain = false;
                return stay(&r, vec![]);
            }
            if now - rec.since > want.upgrade_timeout_seconds {
                let msg = format!(
                    "installer did not report {}{} within {}s (loaded: {}; installer pod: {}){}",
                    want.version,
                    if want.parameters.is_empty() {
                        String::new()
                    } else {
                        format!(
                            " with module parameters {}",
                            module_params::canonical(&want.parameters)
                        )
                    },
                    want.upgrade_timeout_seconds,
                    obs.loaded.as_deref().unwrap_or("none"),
                    installer_summary(obs),
                    retry_hint(&want.policy, rec.cordoned_by_us())
                );
                let why = deadline_reason(obs, reason::UPGRADE_TIMEOUT);
                return stay(&enter(&rec, Failed, why, Some(msg), now), vec![]);
            }
            match obs.installer {
                InstallerPod::Stale { deleting: false } => {
                    stay(&rec, vec![Command::DeleteInstallerPod])
                }
                _ => stay(&rec, vec![]),
            }
        }
        Uncordoning => {
            let schedulable_ok = !rec.cordoned_by_us() || !obs.unschedulable;
            if schedulable_ok && !obs.gates_present {
                if rec.halts_rollout() {
                    // Rolled back after a failed validation: back in
                    // service, and Failed until retried.
                    let mut r = enter(
                        &rec,
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
                let mut r = enter(&rec, Done, why, None, now);
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
            stay(&rec, cmds)
        }
        Done => {
            let soaking = want.soak_seconds > 0
                && rec.reason.as_deref() == Some(reason::UPGRADED)
                && now - rec.since < want.soak_seconds;
            if soaking && let Some(trouble) = crate::soak::trouble(obs) {
                let msg = format!(
                    "{trouble}, {}s after its upgrade to {} (upgradePolicy.soakSeconds: {}): the rollout halts{}",
                    now - rec.since,
                    rec.target,
                    want.soak_seconds,
                    retry_hint(&want.policy, rec.cordoned_by_us())
                );
                return stay(
                    &enter(&rec, Failed, reason::SOAK_FAILED, Some(msg), now),
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
                let r = enter(&rec, Pending, reason::RETARGET, None, now);
                return again_without_slot(&r, obs, want);
            }
            stay(&rec, vec![])
        }
        Unloading | Unmanaged | UnloadFailed => vacate::manage_again(&rec, obs, want),
        Failed => {
            if obs.retry_token.is_some() && obs.retry_token != rec.retry_token {
                let mut r = enter(&rec, Pending, reason::RETRY, None, now);
                r.retry_token = obs.retry_token.clone();
                return again_without_slot(&r, obs, want);
            }
            stay(&rec, vec![])
        }
    }
}

/// The installer pod a cycle needs once the node is drained: a new one, unless
/// the current one built the target ahead and waits for the go-ahead
/// (replacing it would put the pod's start back inside the window).
fn replace_installer(obs: &Observation, want: &Desired) -> Vec<Command> {
    if want.prepare && matches!(obs.installer, InstallerPod::Current { .. }) {
        vec![]
    } else {
        vec![Command::DeleteInstallerPod]
    }
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
                 `kubectl tt driver retry {policy} <node>`",
                f.message,
                policy = want.policy
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
        &enter(rec, NodeState::Pending, reason::PREPARING, Some(why), now),
        cmds,
    )
}

/// The firmware policy a Pending node's swap waits for, to share its cordon
/// and drain: a flash of the node waits only for its slot, and what this
/// policy has to do is a drained swap (a module of another version or
/// parameters is loaded). A node without tt-kmd gets it first (a flasher
/// may need the driver), and a change that keeps the module drains nothing.
/// A node this policy holds cordoned already (a retry, an inherited
/// cordon) does not wait.
pub fn defers_to_firmware<'a>(
    cordoned_by_us: bool,
    obs: &'a Observation,
    want: &Desired,
) -> Option<&'a str> {
    let fw = obs.firmware_first.as_deref()?;
    let swap = obs.loaded.is_some()
        && !crate::node::keeps_module(
            obs.loaded.as_deref(),
            obs.parameters.as_ref(),
            want.target(),
        );
    let cordoned = cordoned_by_us || (obs.inherited_cordon && obs.unschedulable);
    (want.combine_with_firmware && swap && !cordoned && !want.unmanage).then_some(fw)
}

/// `spec.minFirmwareVersion` when the node's cards read back older (or unknown).
pub fn firmware_too_old<'a>(obs: &Observation, want: &'a Desired) -> Option<&'a str> {
    let min = want.min_firmware.as_deref()?;
    let ok = obs
        .firmware_version
        .as_deref()
        .is_some_and(|v| ttdrv_api::firmware::version_at_least(v, min));
    (!ok).then_some(min)
}

/// The agent refused a drained cycle's swap (or unload) because a pod holds
/// the device, with the module untouched: a pod that reached the node after
/// its drain ended (a scheduler that had not seen the cordon yet, or a pod the
/// controller's cache did not hold when the drain finished). Back to
/// Draining, without the go-ahead, to evict it; once per cycle: a holder the
/// drain leaves (a bare pod, an exempt namespace) or one that keeps coming
/// back fails the node on the agent's next refusal, as before.
pub(crate) fn drain_again(
    rec: &NodeRecord,
    f: &Failure,
    untouched: bool,
    want: &Desired,
    now: i64,
) -> Option<Step> {
    let drained_cycle = !rec.no_drain && want.drain_enabled;
    if f.reason != reason::DEVICE_BUSY || !drained_cycle || !untouched || rec.redrained.is_some() {
        return None;
    }
    let what = if rec.state == NodeState::Unloading {
        "unload"
    } else {
        "swap"
    };
    let msg = format!(
        "the agent refused the {what} ({}); draining again, once in this cycle",
        f.message
    );
    let mut r = enter(
        rec,
        NodeState::Draining,
        reason::DRAIN_AGAIN,
        Some(msg),
        now,
    );
    r.redrained = Some(f.at().unwrap_or(now));
    Some(Step {
        record: r,
        commands: vec![Command::Evict],
        needs_slot: false,
    })
}

/// `f` is the refusal this cycle already drained again for
/// ([`drain_again`]): not a failure of the cycle any more.
pub(crate) fn drained_again_for(rec: &NodeRecord, f: &Failure) -> bool {
    rec.redrained.is_some() && f.at() == rec.redrained
}

/// Pending → Cordoning: the cycle starts (with its slot). A node someone
/// else cordoned keeps their cordon, never ours to undo.
fn start_cordon(rec: &NodeRecord, obs: &Observation) -> Step {
    let mut r = enter(rec, NodeState::Cordoning, reason::CORDON, None, obs.now);
    if r.cordon != Cordon::Ours {
        r.cordon = if obs.unschedulable && !obs.inherited_cordon {
            Cordon::Theirs
        } else {
            Cordon::Ours
        };
    }
    r.no_drain = false;
    r.started = Some(obs.now);
    let mut cmds = vec![Command::CloseGates];
    if r.cordoned_by_us() {
        cmds.insert(0, Command::Cordon);
    }
    Step {
        record: r,
        commands: cmds,
        needs_slot: false,
    }
}

/// The change a node waits for, for its message: `2.7.0 -> 2.8.0`, or for
/// the same version loaded with other module parameters `2.8.0 -> 2.8.0
/// (module parameters: max_devices=32 (wanted 4))`.
fn change(obs: &Observation, want: &Desired) -> String {
    let loaded = obs.loaded.as_deref().unwrap_or("none");
    let off = module_params::mismatches(&want.parameters, obs.parameters.as_ref());
    if crate::node::same_version(obs.loaded.as_deref(), &want.version) && !off.is_empty() {
        format!(
            "{loaded} -> {} (module parameters: {})",
            want.version,
            module_params::describe(&off)
        )
    } else {
        format!("{loaded} -> {}", want.version)
    }
}

/// The installer pod as a timeout message names it: its problem if it has
/// one, else its state.
fn installer_summary(obs: &Observation) -> &str {
    obs.installer_problem
        .as_deref()
        .unwrap_or(match obs.installer {
            InstallerPod::Missing => "missing",
            InstallerPod::Stale { .. } => "old template",
            InstallerPod::Current { ready: true } => "ready",
            InstallerPod::Current { ready: false } => "not ready",
        })
}

/// How to go on after a failure, and what became of the node: cordoned by
/// us (it stays so), or serving (never cordoned in this cycle, or returned
/// to service).
fn retry_hint(policy: &str, cordoned: bool) -> String {
    let node = if cordoned {
        "The node stays cordoned"
    } else {
        "The node is not cordoned"
    };
    format!(
        ". {node} and the rollout of {policy} is halted; after fixing the cause, retry with \
         `kubectl tt driver retry {policy} <node>` or `kubectl annotate node <node> driver.tenstorrent.com/retry=$(date +%s) --overwrite`"
    )
}

pub(crate) mod observation;
mod vacate;

#[cfg(test)]
mod tests;
