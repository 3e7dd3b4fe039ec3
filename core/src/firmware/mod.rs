//! One node's firmware cycle, free of I/O: [`step`] maps (persisted record,
//! fresh observation, what the policy wants) to the next record and the
//! commands that get the node there, as [`crate::machine`] does for the
//! driver. The record is persisted on the Node (annotation
//! `firmware.tenstorrent.com/record`) in the same patch as the cordon or
//! uncordon, so a controller killed at any instant resumes without cordoning
//! twice, flashing twice, or forgetting whose cordon it is.
//!
//! ```text
//! Pending → Cordoning → Draining → Flashing → Uncordoning → Done
//!                                          ↘ Failed
//! ```
//! (drain disabled: Pending → Flashing → Done).
//!
//! One disruption at a time: a node a driver cycle holds ([`Observation::held_by`])
//! starts no firmware cycle, and the driver machine likewise waits for a
//! firmware cycle ([`crate::machine::Observation::held_by`]).

use serde::{Deserialize, Serialize};
use ttdrv_api::firmware::flasher::Report;
use ttdrv_api::firmware::{FirmwareNodeState, TenstorrentFirmwarePolicy, reason};

pub use crate::drain::DrainProgress;
pub use crate::record::Cordon;

/// What the controller remembers about one node's firmware, persisted on the
/// Node as JSON (annotation `firmware.tenstorrent.com/record`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FwRecord {
    pub policy: String,
    pub state: FirmwareNodeState,
    /// Firmware version this cycle aims at.
    pub target: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Unix seconds when `state` was entered.
    pub since: i64,
    /// Who cordoned the node for this cycle.
    #[serde(default, with = "cordon_wire")]
    pub cordon: Cordon,
    /// The flash Job of this cycle: named when the step that creates it is
    /// persisted, before the Job exists ([`Command::CreateJob`]). A record
    /// of an earlier controller version may be `Flashing` without it (it
    /// named the Job once it saw it run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// `job` was seen in the cache (running or finished): missing from then
    /// on, it vanished.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub job_seen: bool,
    /// The uid of the policy object `job` is created for: its Jobs go with
    /// it (garbage collection), so under a policy deleted and re-created
    /// under the same name the Job is gone, seen or not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_uid: Option<String>,
    /// What every card read back after the last flash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<String>,
    /// The last retry token acted upon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_token: Option<String>,
    /// Retries of this version on this node: each flashes with a Job of its
    /// own ([`ttdrv_api::firmware::job_name_for`]), so a retry never reads the
    /// Job that failed before it (kept for its logs).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attempt: u32,
    /// When this cycle's scheduling-surface check began (the deploy gates
    /// opened after the flash, Unix seconds): its deadline counts from it
    /// ([`crate::surface`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub surface_since: Option<i64>,
    /// The gated DaemonSets (`namespace/name`) that had a pod on the node
    /// when this cycle closed the gates: the DRA plugin is restarted only
    /// once each has a Ready pod there again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stood_down: Vec<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

mod cordon_wire {
    use super::Cordon;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(c: &Cordon, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(match c {
            Cordon::None => "none",
            Cordon::Ours => "ours",
            Cordon::Theirs => "theirs",
        })
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Cordon, D::Error> {
        Ok(match String::deserialize(d)?.as_str() {
            "ours" => Cordon::Ours,
            "theirs" => Cordon::Theirs,
            _ => Cordon::None,
        })
    }
}

impl FwRecord {
    pub fn new(policy: &str, target: &str, now: i64) -> Self {
        Self {
            policy: policy.into(),
            state: FirmwareNodeState::Pending,
            target: target.into(),
            reason: None,
            message: None,
            since: now,
            cordon: Cordon::None,
            job: None,
            job_seen: false,
            policy_uid: None,
            current: None,
            retry_token: None,
            attempt: 0,
            surface_since: None,
            stood_down: vec![],
        }
    }

    fn forget_job(&mut self) {
        self.job = None;
        self.job_seen = false;
        self.policy_uid = None;
    }

    /// The flash Job `name`, seen in the cache.
    fn saw_job(&mut self, name: &str) {
        self.job = Some(name.into());
        self.job_seen = true;
    }

    /// Holds a `maxParallel` slot: in a cycle.
    pub fn occupies_slot(&self) -> bool {
        self.state.is_in_progress()
    }
}

/// The flash Job of this cycle as the cache shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum FlashJob {
    #[default]
    Missing,
    Running {
        name: String,
        /// The flasher's image cannot be pulled (ErrImagePull, ImagePullBackOff).
        image_pull_failed: bool,
    },
    Succeeded {
        name: String,
        /// The flasher's report; `None` from a flasher that leaves none (the
        /// Go operator's: its success meant every card read back the target).
        report: Option<Report>,
    },
    Failed {
        name: String,
        report: Option<Report>,
        /// The Job's deadline (`flashTimeoutSeconds`) passed.
        deadline: bool,
    },
}

/// What this controller did itself about the flash Job the record names
/// ([`FwRecord::job`]), as the node's actor remembers it: how a step tells a
/// Job the cache has not shown yet from one that vanished. Only consulted
/// while the cache shows no Job of that name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OwnJob {
    /// Not created by this controller (since it started, for this very
    /// policy object), or seen in its cache since. A controller steps only
    /// once its caches have listed, so for it a missing Job is gone: it
    /// vanished, or was never created.
    #[default]
    NotMine,
    /// Created by this controller at `at` (Unix seconds; or found already
    /// there, a conflict), not in its cache yet: its watch lags behind its
    /// own create ([`JOB_CACHE_GRACE_SECONDS`]).
    CreatedUnseen { at: i64 },
    /// This controller named it in the record but did not create it (its
    /// create was refused, or the step's write failed before it): the Job
    /// does not exist, and creating it now is its first flash.
    NotCreated,
}

/// How long a Job this controller created may stay out of its cache before
/// it counts as vanished: far beyond any watch lag, far below a flash.
pub const JOB_CACHE_GRACE_SECONDS: i64 = 300;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observation {
    pub now: i64,
    /// The node's name (the flash Job's name is made of it).
    pub node: String,
    pub ready: bool,
    pub unschedulable: bool,
    /// Another kind's cycle holds the node (a driver record mid-cycle, or
    /// its go-ahead present: [`crate::claim::driver_cycle`]; or the slot book
    /// refused the start): who, for the message.
    pub held_by: Option<crate::slots::Holder>,
    /// The Go firmware controller's cordon annotation names this policy: a
    /// cordon it set for this very policy, ours to finish and undo.
    pub go_cordon_for_us: bool,
    /// The Go firmware controller left the node in this state (its
    /// `upgrade-state` label) with no record of ours.
    pub go_state: Option<FirmwareNodeState>,
    /// The firmware every card read back last (`fw-version` label).
    pub current: Option<String>,
    /// The tt-kmd loaded on the node (`kmd-version` label).
    pub driver_version: Option<String>,
    pub drain: Option<DrainProgress>,
    /// The Job the record names, looked up by that name (by
    /// [`ttdrv_api::firmware::job_name_for`] when the record names none).
    pub job: FlashJob,
    /// What this controller did about that Job, while the cache lacks it.
    pub own_job: OwnJob,
    pub retry_token: Option<String>,
    /// The rollout granted this node a slot.
    pub slot: bool,
    /// A driver policy waits for this node's flash to swap its module, and
    /// takes a cordon handed over ([`crate::claim::handover_to`]): the
    /// flash ends with the cordon handed to it instead of an uncordon.
    pub driver_waiting: Option<String>,
    /// Some configured deploy gate (`controller.deployGates`) is not yet
    /// `false` on the node (none configured: false). A drained cycle closes
    /// them with its cordon, as the driver's does: the telemetry collector
    /// and the fabric-manager agent hold the cards through `privileged`,
    /// which no drain reaches, and must not read a card being written.
    pub gates_open: bool,
    /// Some configured deploy gate label is on the node (ours to remove
    /// when the cycle gives the node back).
    pub gates_present: bool,
    /// Pods of DaemonSets the closed gates stand down that are still on the
    /// node (`namespace/name`): the flash waits for them to go
    /// ([`crate::drain::stood_down`]).
    pub gated_pods_left: Vec<String>,
    /// What the scheduler sees of the node's cards, and the gated stack's
    /// pods on it ([`crate::surface::Surface`]).
    pub surface: crate::surface::Surface,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    pub policy: String,
    /// The policy object's uid.
    pub uid: Option<String>,
    pub version: String,
    /// What every card must read back.
    pub readback: String,
    pub drain_enabled: bool,
    pub drain_timeout_seconds: i64,
    pub paused: bool,
    pub auto_upgrade: bool,
    /// `haltOnFailure` and some node of the policy is Failed.
    pub halted: bool,
    /// `spec.minDriverVersion`.
    pub min_driver: Option<String>,
    /// How long after the flash the scheduler has to see every card again
    /// (`--scheduling-surface-timeout-seconds`, the driver's bound).
    pub surface_timeout_seconds: i64,
}

impl Desired {
    pub fn of(p: &TenstorrentFirmwarePolicy) -> Self {
        let s = &p.spec;
        Self {
            policy: p.metadata.name.clone().unwrap_or_default(),
            uid: p.metadata.uid.clone(),
            version: s.version.clone(),
            readback: s.readback(),
            drain_enabled: s.upgrade_policy.drain.enable,
            drain_timeout_seconds: s.upgrade_policy.drain.timeout_seconds,
            paused: s.paused,
            auto_upgrade: s.upgrade_policy.auto_upgrade,
            halted: false,
            min_driver: s.min_driver_version.clone(),
            surface_timeout_seconds: crate::surface::DEFAULT_TIMEOUT_SECONDS,
        }
    }
}

/// Side effects of a step. Cordon and uncordon go in the record's patch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    Cordon,
    Evict,
    /// Create the flash Job the record names (idempotent: its name is fixed
    /// by policy, node, version and attempt). Issued once per Job: when the
    /// cycle reaches Flashing, and again only when this controller knows it
    /// never created it ([`OwnJob::NotCreated`]).
    CreateJob,
    Uncordon,
    /// Set every configured deploy gate to `false` (in the record's patch).
    CloseGates,
    /// Remove the configured deploy gate labels (in the record's patch).
    OpenGates,
    /// Evict these DRA plugin pods: their DaemonSet starts fresh ones,
    /// which read the flashed cards ([`crate::surface`]).
    RestartPublishers(Vec<crate::drain::PodRef>),
    /// Keep the cordon and hand it to this driver policy (its marks on the
    /// node, ours removed): its swap follows under the same cordon and
    /// drain, and its cycle uncordons.
    HandOver(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub record: FwRecord,
    pub commands: Vec<Command>,
    /// Waits for a slot only: with one, this step would start a cycle.
    pub needs_slot: bool,
}

fn enter(
    rec: &FwRecord,
    state: FirmwareNodeState,
    reason: &str,
    msg: Option<String>,
    now: i64,
) -> FwRecord {
    let mut r = rec.clone();
    if r.state != state {
        r.since = now;
    }
    // The surface check belongs to the flash it follows.
    if state != FirmwareNodeState::Uncordoning {
        r.surface_since = None;
    }
    if !state.is_in_progress() {
        r.stood_down.clear();
    }
    r.state = state;
    r.reason = Some(reason.into());
    r.message = msg;
    r
}

fn stay(rec: FwRecord, commands: Vec<Command>) -> Step {
    Step {
        record: rec,
        commands,
        needs_slot: false,
    }
}

/// The record a node starts from when it has none of ours: a node the Go
/// firmware controller left mid-cycle for this policy is taken over where
/// it was, never flashed twice blindly.
pub fn takeover(want: &Desired, obs: &Observation) -> FwRecord {
    use FirmwareNodeState::*;
    let mut r = FwRecord::new(&want.policy, &want.version, obs.now);
    r.current = obs.current.clone();
    if obs.go_cordon_for_us && obs.unschedulable {
        r.cordon = Cordon::Ours;
    }
    match (&obs.job, obs.go_state) {
        // Go's Job for this very version, found by its name: follow it.
        (FlashJob::Running { name, .. }, _)
        | (FlashJob::Succeeded { name, .. }, _)
        | (FlashJob::Failed { name, .. }, _) => {
            r = enter(
                &r,
                Flashing,
                reason::TAKEN_OVER,
                Some(format!(
                    "taken over from the Go firmware controller with its flash Job {name}"
                )),
                obs.now,
            );
            r.saw_job(name);
        }
        // Go says it was flashing, but its Job is gone: the outcome is unknown.
        (FlashJob::Missing, Some(Flashing)) => {
            r = enter(
                &r,
                Failed,
                reason::TAKEN_OVER,
                Some(
                    "the Go firmware controller left this node Flashing and its flash Job is gone: \
                     whether the cards were written is unknown, so nothing is flashed again by itself. \
                     Check the cards (tt-smi -s), then retry"
                        .into(),
                ),
                obs.now,
            );
        }
        // Cordoned (and maybe drained) by Go for this policy: the cordon is
        // ours to finish and undo, but the flash waits for a `maxParallel`
        // slot like any other (the Go controller cordons every matched node
        // at once; going on from each cordon would flash them all at once).
        // `pending` drains from the kept cordon once the slot is granted.
        (FlashJob::Missing, _) if r.cordon == Cordon::Ours => {
            r = enter(
                &r,
                Pending,
                reason::TAKEN_OVER,
                Some(
                    "taken over from the Go firmware controller with its cordon: \
                     drained and flashed when a maxParallel slot is free"
                        .into(),
                ),
                obs.now,
            );
        }
        _ => {}
    }
    r
}

/// One step. Idempotent: the same observation gives the same record and
/// (idempotent) commands.
pub fn step(rec: &FwRecord, obs: &Observation, want: &Desired) -> Step {
    use FirmwareNodeState::*;
    let now = obs.now;
    let mut rec = rec.clone();
    if rec.target != want.version && matches!(rec.state, Done | Failed | Pending) {
        rec.target = want.version.clone();
        rec.forget_job();
        rec.attempt = 0;
        if rec.state != Pending {
            rec = enter(&rec, Pending, reason::WAITING_FOR_SLOT, None, now);
        }
    }
    match rec.state {
        Pending => pending(rec, obs, want),
        Cordoning => {
            if want.paused {
                return stay(rec, vec![]);
            }
            if obs.unschedulable && !obs.gates_open {
                let r = enter(&rec, Draining, reason::DRAINING, None, now);
                return stay(r, vec![Command::Evict]);
            }
            let mut cmds = vec![];
            if !obs.unschedulable {
                rec.cordon = Cordon::Ours;
                cmds.push(Command::Cordon);
            }
            stay(rec, with_gates_closed(cmds, obs))
        }
        Draining => draining(rec, obs, want),
        Flashing => flashing(rec, obs, want),
        Uncordoning => uncordoning(rec, obs, want),
        Done => stay(rec, vec![]),
        Failed => {
            if obs.retry_token.is_some() && obs.retry_token != rec.retry_token {
                rec.retry_token = obs.retry_token.clone();
                rec.forget_job();
                rec.attempt += 1;
                let r = enter(
                    &rec,
                    Pending,
                    reason::WAITING_FOR_SLOT,
                    Some("retry requested".into()),
                    now,
                );
                return pending(r, obs, want);
            }
            stay(rec, vec![])
        }
    }
}

/// Uncordoning: while our cordon is on, the scheduler must see every card
/// again first ([`crate::surface::next`], the driver's rules: the gates
/// open with the node still cordoned, the stack comes back, the DRA plugin
/// restarts); then the uncordon and the gates, and Done.
fn uncordoning(rec: FwRecord, obs: &Observation, want: &Desired) -> Step {
    use crate::surface::{Next, Progress, next};
    use FirmwareNodeState::*;
    let now = obs.now;
    if rec.cordon == Cordon::Ours && obs.unschedulable {
        let since = rec.surface_since.unwrap_or(now);
        let what = format!("firmware {}", want.readback);
        let checking = |msg: String, cmds: Vec<Command>| {
            let mut r = enter(
                &rec,
                Uncordoning,
                reason::REFRESHING_DEVICES,
                Some(msg),
                now,
            );
            r.surface_since = Some(since);
            stay(r, cmds)
        };
        match next(Progress {
            surface: &obs.surface,
            gates_present: obs.gates_present,
            stood_down: &rec.stood_down,
            since: rec.surface_since,
            now,
            timeout_seconds: want.surface_timeout_seconds,
            what: &what,
            count_required: false,
        }) {
            Next::Proceed => {}
            Next::OpenGates(msg) => return checking(msg, vec![Command::OpenGates]),
            Next::Restart(pods, msg) => {
                return checking(msg, vec![Command::RestartPublishers(pods)]);
            }
            Next::Wait(msg) => return checking(msg, vec![]),
            Next::Fail(why) => {
                let msg = format!(
                    "{why} ({}s after the flash); the node keeps its cordon with {what} and the rollout halts; \
                     once the cards show, retry with `kubectl tt fw retry {} {}`",
                    want.surface_timeout_seconds, want.policy, obs.node
                );
                return stay(
                    enter(&rec, Failed, reason::DEVICES_NOT_PUBLISHED, Some(msg), now),
                    vec![],
                );
            }
        }
    }
    let mut cmds = vec![];
    if rec.cordon == Cordon::Ours && obs.unschedulable {
        cmds.push(Command::Uncordon);
    }
    if obs.gates_present {
        cmds.push(Command::OpenGates);
    }
    if !cmds.is_empty() {
        let reason = rec.reason.clone();
        let mut r = rec;
        if reason.as_deref() == Some(reason::REFRESHING_DEVICES) {
            r = enter(&r, Uncordoning, reason::UNCORDONING, None, now);
        }
        return stay(r, cmds);
    }
    let mut r = enter(&rec, Done, reason::FLASH_SUCCEEDED, None, now);
    r.cordon = Cordon::None;
    stay(r, vec![])
}

fn pending(rec: FwRecord, obs: &Observation, want: &Desired) -> Step {
    use FirmwareNodeState::*;
    let now = obs.now;
    let wait =
        |reason: &str, msg: String| stay(enter(&rec, Pending, reason, Some(msg), now), vec![]);
    let at_target = obs.current.as_deref() == Some(want.readback.as_str());
    if at_target && rec.cordon != Cordon::Ours {
        let mut r = enter(&rec, Done, reason::FLASH_SUCCEEDED, None, now);
        r.current = obs.current.clone();
        return stay(r, vec![]);
    }
    if !want.auto_upgrade {
        return wait(
            reason::AUTO_UPGRADE_DISABLED,
            format!(
                "upgradePolicy.autoUpgrade is false: {} -> {} is reported, not flashed",
                obs.current.as_deref().unwrap_or("unknown"),
                want.readback
            ),
        );
    }
    if want.paused {
        return wait(reason::PAUSED, "policy is paused".into());
    }
    if want.halted {
        return wait(
            reason::ROLLOUT_HALTED,
            "a node of this policy is Failed (haltOnFailure): retry or fix it first".into(),
        );
    }
    // At the target under our cordon, not paused (retried after the scheduler did not
    // see the cards, or a cordon taken over from Go after its flash):
    // nothing to flash, the node goes back into service.
    if at_target {
        let mut r = enter(&rec, Uncordoning, reason::UNCORDONING, None, now);
        r.current = obs.current.clone();
        return uncordoning(r, obs, want);
    }
    if !obs.ready {
        return wait(
            reason::NODE_NOT_READY,
            "waiting for the node to be Ready".into(),
        );
    }
    if let Some(who) = &obs.held_by {
        return wait(
            reason::WAITING_FOR_DRIVER,
            format!("{who} has the node out of service; one disruption at a time"),
        );
    }
    if let Some(min) = driver_too_old(obs, want) {
        return wait(
            reason::WAITING_FOR_DRIVER_VERSION,
            format!(
                "this firmware needs tt-kmd {min} or newer (spec.minDriverVersion); the node runs {}: \
                 it is flashed once its driver policy gets there",
                obs.driver_version.as_deref().unwrap_or("none")
            ),
        );
    }
    if obs.unschedulable && rec.cordon != Cordon::Ours {
        return wait(
            reason::EXTERNAL_CORDON,
            "node is cordoned but not by this operator: nothing is flashed while someone else has it out"
                .into(),
        );
    }
    if !obs.slot {
        return Step {
            needs_slot: true,
            ..wait(
                reason::WAITING_FOR_SLOT,
                format!(
                    "waiting for a maxParallel slot to flash {} -> {}",
                    obs.current.as_deref().unwrap_or("unknown"),
                    want.readback
                ),
            )
        };
    }
    if !want.drain_enabled {
        return start_flash(&rec, obs, want);
    }
    if rec.cordon == Cordon::Ours && obs.unschedulable {
        // Kept across a retry or taken over: the cordon is there already.
        let mut r = enter(&rec, Draining, reason::DRAINING, None, now);
        r.stood_down = crate::surface::standing(&obs.surface.stack);
        return stay(r, with_gates_closed(vec![Command::Evict], obs));
    }
    let mut r = enter(&rec, Cordoning, reason::CORDONING, None, now);
    r.cordon = Cordon::Ours;
    r.stood_down = crate::surface::standing(&obs.surface.stack);
    stay(r, with_gates_closed(vec![Command::Cordon], obs))
}

/// `cmds`, and the deploy gates closed if some is still open.
fn with_gates_closed(mut cmds: Vec<Command>, obs: &Observation) -> Vec<Command> {
    if obs.gates_open {
        cmds.push(Command::CloseGates);
    }
    cmds
}

/// Flashing, with the Job to create named in the record before it exists:
/// from then on a missing Job is either not in this controller's cache yet
/// (it remembers creating it) or gone, never a reason to create it again.
fn start_flash(rec: &FwRecord, obs: &Observation, want: &Desired) -> Step {
    let mut r = enter(
        rec,
        FirmwareNodeState::Flashing,
        reason::FLASHING,
        None,
        obs.now,
    );
    r.job = Some(ttdrv_api::firmware::job_name_for(
        &want.policy,
        &obs.node,
        &want.version,
        r.attempt,
    ));
    r.job_seen = false;
    r.policy_uid = want.uid.clone();
    stay(r, vec![Command::CreateJob])
}

/// `spec.minDriverVersion` when the node's tt-kmd is older (or unknown).
pub fn driver_too_old<'a>(obs: &Observation, want: &'a Desired) -> Option<&'a str> {
    let min = want.min_driver.as_deref()?;
    let ok = obs
        .driver_version
        .as_deref()
        .is_some_and(|v| ttdrv_api::firmware::version_at_least(v, min));
    (!ok).then_some(min)
}

fn draining(mut rec: FwRecord, obs: &Observation, want: &Desired) -> Step {
    use FirmwareNodeState::*;
    let now = obs.now;
    if want.paused {
        return stay(rec, vec![]);
    }
    if !obs.unschedulable {
        rec.cordon = Cordon::Ours;
        return stay(rec, with_gates_closed(vec![Command::Cordon], obs));
    }
    if obs.gates_open {
        // Opened behind our back (a relabel): closed again before the flash.
        return stay(rec, vec![Command::CloseGates]);
    }
    let Some(progress) = &obs.drain else {
        return stay(rec, vec![]);
    };
    let stood_down = progress.remaining.is_empty() && obs.gated_pods_left.is_empty();
    if stood_down {
        if let Some(who) = &obs.held_by {
            // Cannot happen through us (the claim); a driver cycle started by
            // another controller: never flash under its swap.
            return stay(
                enter(
                    &rec,
                    Draining,
                    reason::WAITING_FOR_DRIVER,
                    Some(format!("{who} has the node: the flash waits")),
                    now,
                ),
                vec![],
            );
        }
        return start_flash(&rec, obs, want);
    }
    let blocking: Vec<&str> = progress
        .remaining
        .iter()
        .chain(&obs.gated_pods_left)
        .map(String::as_str)
        .collect();
    if now - rec.since > want.drain_timeout_seconds {
        // Nothing was written to the cards: the node goes back into service.
        let r = enter(
            &rec,
            Failed,
            reason::DRAIN_TIMEOUT,
            Some(format!(
                "drain timeout after {}s; blocking pods: {}",
                want.drain_timeout_seconds,
                blocking.join(",")
            )),
            now,
        );
        return back_in_service(r, obs.gates_present);
    }
    if progress.remaining.is_empty() {
        // Evicted: what is left are the gated DaemonSets' pods, leaving.
        let msg = format!(
            "waiting for {} to leave (deploy gates closed): they may hold the cards",
            obs.gated_pods_left.join(", ")
        );
        return stay(
            enter(&rec, Draining, reason::DRAINING, Some(msg), now),
            vec![],
        );
    }
    let (why, msg) = if progress.blocking_pdbs.is_empty() {
        (
            reason::DRAINING,
            format!("waiting for {} pod(s) to evict", progress.remaining.len()),
        )
    } else {
        (
            reason::EVICTION_BLOCKED,
            format!(
                "eviction blocked by PodDisruptionBudget {}; will retry",
                progress.blocking_pdbs.join(", ")
            ),
        )
    };
    stay(
        enter(&rec, Draining, why, Some(msg), now),
        vec![Command::Evict],
    )
}

fn flashing(rec: FwRecord, obs: &Observation, want: &Desired) -> Step {
    let retry = ". The node keeps its cordon (the cards may be half-written) and the rollout halts; \
                 retry with `kubectl tt fw retry <policy> <node>`";
    // Uncordoned mid-flash (by hand, or another tool): cordon again at once,
    // so nothing new lands on a node whose cards are being written. The flash
    // itself goes on; its outcome is read as usual.
    let recordon = rec.cordon == Cordon::Ours && !obs.unschedulable;
    let mut next = flash_outcome(rec, obs, want, retry);
    if recordon && next.record.cordon == Cordon::Ours && !next.commands.contains(&Command::Uncordon)
    {
        next.commands.insert(0, Command::Cordon);
    }
    next
}

fn flash_outcome(mut rec: FwRecord, obs: &Observation, want: &Desired, retry: &str) -> Step {
    use FirmwareNodeState::*;
    let now = obs.now;
    match &obs.job {
        FlashJob::Missing => job_missing(rec, obs, want, retry),
        FlashJob::Running {
            name,
            image_pull_failed,
        } => {
            rec.saw_job(name);
            let (why, msg) = if *image_pull_failed {
                (
                    reason::FLASHER_IMAGE_PULL_FAILED,
                    Some("the flasher image cannot be pulled".into()),
                )
            } else {
                (reason::FLASHING, None)
            };
            stay(enter(&rec, Flashing, why, msg, now), vec![])
        }
        FlashJob::Succeeded { name, report } => {
            rec.saw_job(name);
            job_succeeded(rec, obs, want, name, report.as_ref(), retry)
        }
        FlashJob::Failed {
            name,
            report,
            deadline,
        } => {
            rec.saw_job(name);
            job_failed(&rec, obs, name, report.as_ref(), *deadline, retry)
        }
    }
}

/// Flashing, no Job of the record's name in the cache: create it (once,
/// never blindly), wait for the cache, or fail: whether the cards were
/// written is unknown.
fn job_missing(rec: FwRecord, obs: &Observation, want: &Desired, retry: &str) -> Step {
    use FirmwareNodeState::*;
    let now = obs.now;
    let unknown = |msg: String| {
        stay(
            enter(&rec, Failed, reason::FLASH_JOB_FAILED, Some(msg), now),
            vec![],
        )
    };
    match (rec.job.clone(), obs.own_job) {
        // Named, and this controller knows it never created it: the
        // create is the Job's first.
        (Some(_), OwnJob::NotCreated) => stay(rec, vec![Command::CreateJob]),
        // Created by this controller, its watch not there yet: wait.
        (Some(_), OwnJob::CreatedUnseen { at }) if now - at < JOB_CACHE_GRACE_SECONDS => {
            stay(rec, vec![])
        }
        (Some(name), OwnJob::CreatedUnseen { at }) => unknown(format!(
            "flash Job {name} vanished before it finished (created {}s ago, never seen since): \
             whether the cards were written is unknown{retry}",
            now - at
        )),
        // Seen and gone since, or created for a policy object that
        // is gone (its Jobs with it): never created again by itself.
        (Some(name), OwnJob::NotMine) if rec.job_seen || rec.policy_uid != want.uid => {
            unknown(format!(
                "flash Job {name} vanished before it finished: whether the cards were written is unknown{retry}"
            ))
        }
        // Named for this very policy object by a controller that
        // stopped before any pass saw the Job (its caches have
        // listed: the Job is not there): it stopped between writing
        // the record and creating the Job, so the create is the
        // Job's first.
        (Some(_), OwnJob::NotMine) => stay(rec, vec![Command::CreateJob]),
        // Left Flashing by an earlier controller version, which named
        // the Job only once it saw it run; looked up by its name, it
        // is not there. Never created blindly.
        (None, _) => unknown(format!(
            "flash Job {} vanished before it finished, or was never created: this node was left \
             Flashing by an earlier controller version that had not named its Job yet, \
             so whether the cards were written is unknown{retry}",
            ttdrv_api::firmware::job_name_for(&want.policy, &obs.node, &want.version, rec.attempt)
        )),
    }
}

/// The flash Job succeeded: the cards must read back the target; then the
/// cordon is handed to a waiting driver swap, undone, or was never ours.
fn job_succeeded(
    mut rec: FwRecord,
    obs: &Observation,
    want: &Desired,
    name: &str,
    report: Option<&Report>,
    retry: &str,
) -> Step {
    use FirmwareNodeState::*;
    let now = obs.now;
    let after = match report {
        None => Some(want.readback.clone()),
        Some(r) => r.uniform_after().map(String::from),
    };
    if after.as_deref() != Some(want.readback.as_str()) {
        let got = report
            .as_ref()
            .map(|r| r.after.join(", "))
            .unwrap_or_default();
        return stay(
            enter(
                &rec,
                Failed,
                reason::READBACK_MISMATCH,
                Some(format!(
                    "readback mismatch after flash Job {name}: wanted {} on every card, got [{got}]{retry}",
                    want.readback
                )),
                now,
            ),
            vec![],
        );
    }
    rec.current = after;
    if rec.cordon == Cordon::Ours
        && let Some(driver) = &obs.driver_waiting
    {
        let mut r = enter(
            &rec,
            Done,
            reason::CORDON_HANDED_OVER,
            Some(format!(
                "flashed; the cordon is handed to the driver policy {driver}, whose swap follows \
                 under the same cordon and drain (its cycle uncordons the node)"
            )),
            now,
        );
        r.cordon = Cordon::None;
        // The swap that takes the cordon over waits for them again.
        r.stood_down = rec.stood_down.clone();
        return stay(r, vec![Command::HandOver(driver.clone())]);
    }
    if rec.cordon == Cordon::Ours {
        let r = enter(&rec, Uncordoning, reason::UNCORDONING, None, now);
        return uncordoning(r, obs, want);
    }
    let mut r = enter(&rec, Done, reason::FLASH_SUCCEEDED, None, now);
    r.cordon = Cordon::None;
    stay(r, vec![])
}

/// The flash Job failed: Failed with the flasher's reason, kept cordoned
/// (the cards may be half-written), unless the bundle was refused before
/// anything was written.
fn job_failed(
    rec: &FwRecord,
    obs: &Observation,
    name: &str,
    report: Option<&Report>,
    deadline: bool,
    retry: &str,
) -> Step {
    use FirmwareNodeState::*;
    let now = obs.now;
    let (why, what) = match report {
        Some(Report {
            reason: Some(r),
            message,
            ..
        }) => (
            reason::ALL
                .iter()
                .find(|k| **k == r.as_str())
                .copied()
                .unwrap_or(reason::FLASH_JOB_FAILED),
            message.clone().unwrap_or_default(),
        ),
        _ if deadline => (
            reason::FLASH_TIMEOUT,
            "the flash Job passed upgradePolicy.flashTimeoutSeconds".into(),
        ),
        _ => (reason::FLASH_JOB_FAILED, "see the Job's logs".into()),
    };
    if reason::BEFORE_ANY_CARD.contains(&why) {
        // Refused before the flash: nothing was written to the cards,
        // so the node goes back into service (as for a drain timeout).
        let fix = if why == reason::BUNDLE_DOWNLOAD_FAILED {
            "fix spec.bundleURL or the mirror"
        } else {
            "fix spec.bundleSHA256 or the bundle"
        };
        let r = enter(
            rec,
            Failed,
            why,
            Some(format!(
                "flash Job {name} failed before any card was touched: {what}. The node is back in service \
                 and the rollout halts; {fix}, then retry with `kubectl tt fw retry <policy> <node>`"
            )),
            now,
        );
        return back_in_service(r, obs.gates_present);
    }
    stay(
        enter(
            rec,
            Failed,
            why,
            Some(format!("flash Job {name} failed: {what}{retry}")),
            now,
        ),
        vec![],
    )
}

/// A Failed record of a cycle that wrote nothing to the cards: our cordon
/// goes with it (the node is back in service; the rollout halts all the same).
fn back_in_service(mut r: FwRecord, gates_present: bool) -> Step {
    let mut cmds = if r.cordon == Cordon::Ours {
        r.cordon = Cordon::None;
        vec![Command::Uncordon]
    } else {
        vec![]
    };
    if gates_present {
        cmds.push(Command::OpenGates);
    }
    stay(r, cmds)
}

/// What becomes of a firmware record whose policy is gone, or no longer
/// selects the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stray {
    /// Nothing was written to the cards in this cycle (or it ended): the
    /// record, our marks and our cordon (`uncordon`) go.
    Release { uncordon: bool },
    /// The cards may be half-written (Flashing, or Failed after a flash):
    /// the cordon and the record stay for a person, who says why.
    Keep(String),
}

pub fn stray(rec: &FwRecord, unschedulable: bool) -> Stray {
    use FirmwareNodeState::*;
    let flashed = rec.job.is_some() || rec.state == Flashing;
    match rec.state {
        Flashing => Stray::Keep(format!(
            "its firmware policy {} is gone while the node was Flashing: whether the cards were written is unknown; \
             check them (tt-smi -s), then uncordon the node and remove its annotation {}",
            rec.policy,
            ttdrv_api::firmware::labels::RECORD
        )),
        Failed if flashed && rec.cordon == Cordon::Ours => Stray::Keep(format!(
            "its firmware policy {} is gone with the node Failed after a flash: the cordon stays; \
             check the cards, then uncordon the node and remove its annotation {}",
            rec.policy,
            ttdrv_api::firmware::labels::RECORD
        )),
        _ => Stray::Release {
            uncordon: rec.cordon == Cordon::Ours && unschedulable,
        },
    }
}

/// The firmware kind as the slot book's gate sees it ([`crate::slots::gate`]).
pub struct FirmwareCycle;

/// The firmware kind as a slot's holder.
pub static FIRMWARE_HOLDER: crate::slots::HolderKind = crate::slots::HolderKind {
    name: "firmware",
    noun: "firmware policy",
    cycle: "flash cycle",
};

impl crate::slots::Holder {
    /// A firmware policy's flash cycle (ours or the Go operator's).
    pub fn firmware(policy: String) -> Self {
        Self::new(&FIRMWARE_HOLDER, policy)
    }
}

impl crate::slots::Cycle for FirmwareCycle {
    type Record = FwRecord;
    type Observation = Observation;
    type Desired = Desired;
    type Step = Step;

    fn holder(policy: &str) -> crate::slots::Holder {
        crate::slots::Holder::firmware(policy.to_string())
    }
    fn step(rec: &FwRecord, obs: &Observation, want: &Desired) -> Step {
        step(rec, obs, want)
    }
    fn next_record(step: &Step) -> &FwRecord {
        &step.record
    }
    fn starts_cycle(prev: &FwRecord, next: &FwRecord) -> bool {
        !prev.state.is_in_progress() && next.state.is_in_progress()
    }
    fn occupies_slot(rec: &FwRecord) -> bool {
        rec.occupies_slot()
    }
    fn held_by(obs: &mut Observation) -> &mut Option<crate::slots::Holder> {
        &mut obs.held_by
    }
    fn slot(obs: &mut Observation) -> &mut bool {
        &mut obs.slot
    }
}

pub mod job;
pub mod observe;

#[cfg(test)]
mod tests;
