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
    /// agent has built the target ahead ([`pending::prepare_ahead`]).
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
    /// How long a swapped node waits for the scheduler to see every card
    /// again ([`crate::surface`]; the controller's
    /// `--scheduling-surface-timeout-seconds`).
    pub surface_timeout_seconds: i64,
    /// `upgradePolicy.onValidationFailure: rollback`: a swap the scheduler
    /// does not see whole is rolled back ([`reason::ROLLING_BACK`]).
    pub rollback: bool,
}

/// The default of [`Desired::surface_timeout_seconds`].
pub use crate::surface::DEFAULT_TIMEOUT_SECONDS as DEFAULT_SURFACE_TIMEOUT_SECONDS;

/// Why no new cycle starts now ([`Desired::hold`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hold {
    /// One of [`reason::HANDING_BACK`] ([`crate::rollout::handback_hold`]),
    /// [`reason::SOAKING`], [`reason::OUTSIDE_MAINTENANCE_WINDOW`],
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
            surface_timeout_seconds: DEFAULT_SURFACE_TIMEOUT_SECONDS,
            rollback: spec.upgrade_policy.on_validation_failure
                == ttdrv_api::OnValidationFailure::Rollback,
        }
    }

    /// The policy is refused: nothing of it starts, and a refused spec
    /// changes nothing the last accepted one set up, so cycles under way go
    /// on towards what the installers deploy (`deployed`: the DaemonSet's
    /// version and parameters, [`crate::installer::deployed_target`]), not
    /// the refused target. Without one (nothing accepted yet), the spec's:
    /// no cycle is under way to follow it.
    pub fn refused_keeping(mut self, deployed: Option<(String, Values)>) -> Self {
        self.refused = true;
        if let Some((version, parameters)) = deployed {
            self.version = version;
            self.parameters = parameters;
        }
        self
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
    /// Delete these DRA plugin pods of the node, started before its swap:
    /// their DaemonSet starts fresh ones that read the new driver
    /// ([`crate::surface`]).
    RestartPublishers(Vec<crate::drain::PodRef>),
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
        r.stood_down.clear();
    }
    // The surface check, and a verdict on it, belong to the swap they
    // follow.
    if state != NodeState::Upgrading {
        r.surface_since = None;
        r.rollback_at = None;
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

/// `why`, and what will still hold the device after the gates and the drain
/// when something will ([`Observation::ungated_holders`]).
fn with_holders(why: String, obs: &Observation) -> String {
    match &obs.ungated_holders {
        Some(w) => format!("{why}; {w}"),
        None => why,
    }
}

/// Pending until a slot is granted (see [`Step::needs_slot`]).
fn wait_for_slot(rec: &NodeRecord, why: String, now: i64) -> Step {
    Step {
        needs_slot: true,
        ..wait(rec, why, now)
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

/// The transition proper: the vacate cycle of `spec.unmanage` first, a new
/// target for a settled node, then one function per state (in `pending`,
/// `cordon`, `upgrading`, `settle`, `vacate`).
fn transition(rec: &NodeRecord, obs: &Observation, want: &Desired) -> Step {
    use NodeState::*;
    let now = obs.now;
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
        // A rollback under way is moot: the new target replaces the module,
        // and a verdict left on the node would name the new swap's cycle.
        if rec.reason.as_deref() == Some(reason::ROLLING_BACK) {
            rec.rollback_at = None;
            rec.reason = Some(reason::RETARGET.to_string());
            rec.message = None;
        }
    }
    match rec.state {
        Pending => pending::pending(rec, obs, want),
        Cordoning => cordon::cordoning(&rec, obs, want),
        Draining => cordon::draining(&rec, obs, want),
        Upgrading => upgrading::upgrading(&rec, obs, want),
        Uncordoning => settle::uncordoning(&rec, obs),
        Done => settle::done(&rec, obs, want),
        Unloading | Unmanaged | UnloadFailed => vacate::manage_again(&rec, obs, want),
        Failed => settle::failed(&rec, obs, want),
    }
}

/// The module the policy wants is loaded: its version, with its parameters.
fn target_loaded(obs: &Observation, want: &Desired) -> bool {
    crate::node::is_loaded(
        obs.loaded.as_deref(),
        obs.parameters.as_ref(),
        want.target(),
    )
}

/// The module stays for the target: at it, or a parameter the module
/// takes at run time differs (the new pod's agent writes it in sysfs).
fn module_stays(obs: &Observation, want: &Desired) -> bool {
    crate::node::keeps_module(
        obs.loaded.as_deref(),
        obs.parameters.as_ref(),
        want.target(),
    )
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
    let mut r = enter(
        rec,
        NodeState::Cordoning,
        reason::CORDON,
        obs.ungated_holders.clone(),
        obs.now,
    );
    if r.cordon != Cordon::Ours {
        r.cordon = if obs.unschedulable && !obs.inherited_cordon {
            Cordon::Theirs
        } else {
            Cordon::Ours
        };
    }
    r.no_drain = false;
    r.started = Some(obs.now);
    r.stood_down = crate::surface::standing(&obs.surface.stack);
    // A cordon handed over by a flash: the stack left with the flash.
    r.stood_down
        .extend(obs.handed_over_stood_down.iter().cloned());
    r.stood_down.sort();
    r.stood_down.dedup();
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

/// Unix seconds as RFC 3339 (UTC), for messages.
fn rfc3339(unix: i64) -> String {
    jiff::Timestamp::from_second(unix)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| unix.to_string())
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
fn retry_hint(policy: &str, node_name: &str, cordoned: bool) -> String {
    let node = if cordoned {
        "The node stays cordoned"
    } else {
        "The node is not cordoned"
    };
    // The node's name when the observation has it (a plan's made-up
    // observation does not).
    let n = if node_name.is_empty() {
        "<node>"
    } else {
        node_name
    };
    format!(
        ". {node} and the rollout of {policy} is halted; after fixing the cause, retry with \
         `kubectl tt driver retry {policy} {n}` or `kubectl annotate node {n} driver.tenstorrent.com/retry=$(date +%s) --overwrite`"
    )
}

/// The driver kind as the slot book's gate sees it ([`crate::slots::gate`]).
pub struct DriverCycle;

/// The driver kind as a slot's holder.
pub static DRIVER_HOLDER: crate::slots::HolderKind = crate::slots::HolderKind {
    name: "driver",
    noun: "driver policy",
    cycle: "upgrade",
};

impl crate::slots::Holder {
    /// A driver policy's upgrade.
    pub fn driver(policy: String) -> Self {
        Self::new(&DRIVER_HOLDER, policy)
    }
}

impl crate::slots::Cycle for DriverCycle {
    type Record = NodeRecord;
    type Observation = Observation;
    type Desired = Desired;
    type Step = Step;

    fn holder(policy: &str) -> crate::slots::Holder {
        crate::slots::Holder::driver(policy.to_string())
    }
    fn step(rec: &NodeRecord, obs: &Observation, want: &Desired) -> Step {
        step(rec, obs, want)
    }
    fn next_record(step: &Step) -> &NodeRecord {
        &step.record
    }
    /// A cycle starts when the node leaves the idle states for one that
    /// touches it (the cordon, the drain, the swap, the unload).
    fn starts_cycle(prev: &NodeRecord, next: &NodeRecord) -> bool {
        !prev.state.is_in_progress()
            && matches!(
                next.state,
                NodeState::Cordoning
                    | NodeState::Draining
                    | NodeState::Upgrading
                    | NodeState::Unloading
            )
    }
    fn occupies_slot(rec: &NodeRecord) -> bool {
        rec.occupies_slot()
    }
    fn held_by(obs: &mut Observation) -> &mut Option<crate::slots::Holder> {
        &mut obs.held_by
    }
    fn slot(obs: &mut Observation) -> &mut bool {
        &mut obs.slot
    }
}

mod cordon;
pub(crate) mod observation;
pub mod own_write;
mod pending;
mod settle;
mod upgrading;
mod vacate;

#[cfg(test)]
mod tests;
