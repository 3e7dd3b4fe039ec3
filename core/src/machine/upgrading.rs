//! Upgrading: the installer pod of the cycle is replaced and the module
//! swapped; the node goes on once the target is loaded (and validated), or
//! fails with the installer's cause or on its deadline.

use ttdrv_api::NodeState::{self, *};
use ttdrv_api::module_params;

use super::{
    Command, Desired, Failure, InstallerPod, NodeRecord, Observation, Step, deadline_reason,
    drain_again, drained_again_for, enter, installer_summary, module_stays, retry_hint, stay,
    target_loaded,
};
use crate::drain::PodRef;
use crate::reason;

/// The step of an Upgrading node.
pub(super) fn upgrading(rec: &NodeRecord, obs: &Observation, want: &Desired) -> Step {
    let now = obs.now;
    let module_ok = target_loaded(obs, want);
    let module_kept = module_stays(obs, want);
    if obs.host_managed {
        return stands_down(rec, obs);
    }
    if module_ok && obs.installer == (InstallerPod::Current { ready: true }) {
        return landed(rec, obs, want);
    }
    if let Some(s) = installer_failed(rec, obs, want, module_ok) {
        return s;
    }
    // A rollback under way: the agent's report of the previous module is
    // the rollback itself, not a swap still to come (its give-up follows).
    if !module_ok && rec.reason.as_deref() == Some(reason::ROLLING_BACK) {
        return rolling_back(rec, obs, want);
    }
    // A swap still to come after the surface check opened the gates (the
    // target changed meanwhile): the stack stands down again first, and
    // the check starts anew after that swap.
    if !module_ok && rec.surface_since.is_some() {
        let mut r = rec.clone();
        r.surface_since = None;
        return stay(&r, vec![Command::CloseGates]);
    }
    // A cycle without drain found a module of another version loaded
    // (the label was missing or stale): only a drained cycle may swap it.
    if rec.no_drain && !module_kept && obs.loaded.is_some() {
        let msg = format!(
            "tt-kmd {} is loaded: it is replaced only after cordon and drain",
            obs.loaded.as_deref().unwrap_or("")
        );
        let mut r = enter(rec, Pending, reason::RETARGET, Some(msg), now);
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
            retry_hint(&want.policy, &obs.node, rec.cordoned_by_us())
        );
        let why = deadline_reason(obs, reason::UPGRADE_TIMEOUT);
        return stay(&enter(rec, Failed, why, Some(msg), now), vec![]);
    }
    match obs.installer {
        InstallerPod::Stale { deleting: false } => stay(rec, vec![Command::DeleteInstallerPod]),
        _ => stay(rec, vec![]),
    }
}

/// The new agent found a DKMS install: it stands down, so do we.
fn stands_down(rec: &NodeRecord, obs: &Observation) -> Step {
    let now = obs.now;
    if rec.cordoned_by_us() || obs.gates_present {
        let mut cmds = vec![Command::OpenGates];
        if rec.cordoned_by_us() {
            cmds.insert(0, Command::Uncordon);
        }
        return Step {
            record: enter(rec, Uncordoning, reason::HOST_MANAGED, None, now),
            commands: cmds,
            needs_slot: false,
        };
    }
    let mut r = enter(
        rec,
        Done,
        reason::HOST_MANAGED,
        Some("DKMS install found; left alone".into()),
        now,
    );
    r.no_drain = false;
    stay(&r, vec![])
}

/// A cycle that cordoned the node (by us, or by an admin in a drained
/// cycle) and closed its gates.
fn cordoned_cycle(rec: &NodeRecord, want: &Desired) -> bool {
    rec.cordoned_by_us() || (!rec.no_drain && want.drain_enabled)
}

/// The target is loaded and the installer pod Ready: the user's
/// validation, then back into service (or Done, for a cycle that never
/// cordoned).
fn landed(rec: &NodeRecord, obs: &Observation, want: &Desired) -> Step {
    let now = obs.now;
    // The user's check, on the swapped node still cordoned (by
    // us, or by an admin in a drained cycle).
    let cordoned_cycle = cordoned_cycle(rec, want);
    if rec.reason.as_deref() == Some(reason::ROLLING_BACK) {
        return rolling_back(rec, obs, want);
    }
    // The scheduler sees every card again before anything else runs on
    // the node (a validation pod may claim a card through DRA).
    if cordoned_cycle && let Some(step) = scheduling_surface(rec, obs, want) {
        return step;
    }
    if cordoned_cycle
        && let Some(template) = &want.validation_pod
        && let Some(step) = user_validation(rec, obs, want, template, now)
    {
        return step;
    }
    if !rec.cordoned_by_us() && (rec.no_drain || !want.drain_enabled) {
        let mut r = enter(rec, Done, reason::UPGRADED, None, now);
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
    Step {
        record: enter(rec, Uncordoning, reason::UNCORDON, None, now),
        commands: cmds,
        needs_slot: false,
    }
}

/// Upgrading, the swap validated ([`crate::surface::next`]): the deploy
/// gates open with the node still cordoned, the node waits until every
/// gated DaemonSet it stood down has a Ready pod again, then its DRA plugin
/// pods from before are restarted, and it waits until the scheduler sees
/// as many cards as the agent counted; a shortfall at the deadline fails
/// the node, kept cordoned on the new version (its gates open). None: the
/// surface is whole, or nothing publishes the node's cards.
fn scheduling_surface(rec: &NodeRecord, obs: &Observation, want: &Desired) -> Option<Step> {
    use crate::surface::{Next, Progress, next};
    let now = obs.now;
    let since = rec.surface_since.unwrap_or(now);
    let what = format!("tt-kmd {}", want.version);
    let checking = |msg: String, commands: Vec<Command>| {
        let mut r = enter(
            rec,
            NodeState::Upgrading,
            reason::REFRESHING_DEVICES,
            Some(msg),
            now,
        );
        r.surface_since = Some(since);
        Some(stay(&r, commands))
    };
    match next(Progress {
        surface: &obs.surface,
        gates_present: obs.gates_present,
        stood_down: &rec.stood_down,
        since: rec.surface_since,
        now,
        timeout_seconds: want.surface_timeout_seconds,
        what: &what,
        count_required: true,
    }) {
        Next::Proceed => None,
        Next::OpenGates(msg) => checking(msg, vec![Command::OpenGates]),
        Next::Restart(pods, msg) => checking(msg, vec![Command::RestartPublishers(pods)]),
        Next::Wait(msg) => checking(msg, vec![]),
        // A validation failure: rolled back as the agent's own are.
        Next::Fail(why) if want.rollback => Some(stay(
            &enter(
                rec,
                NodeState::Upgrading,
                reason::ROLLING_BACK,
                Some(format!(
                    "{why} ({}s after the swap was validated): a failed validation, rolled back \
                     as upgradePolicy.onValidationFailure says{ROLLBACK_NOW}closing the deploy gates",
                    want.surface_timeout_seconds,
                )),
                now,
            ),
            vec![Command::CloseGates],
        )),
        Next::Fail(why) => Some(stay(
            &enter(
                rec,
                NodeState::Failed,
                reason::DEVICES_NOT_PUBLISHED,
                Some(format!(
                    "{why} ({}s after the swap was validated); the node stays cordoned on {what}{}",
                    want.surface_timeout_seconds,
                    retry_hint(&want.policy, &obs.node, rec.cordoned_by_us())
                )),
                now,
            ),
            vec![],
        )),
    }
}

/// A rollback's message: why, then this, then where the rollback is.
const ROLLBACK_NOW: &str = "; rollback: ";

/// Upgrading, the scheduler short of cards after a validated swap, rolled
/// back ([`reason::ROLLING_BACK`]): with the node still cordoned, the gates
/// close and the stack's pods leave (they hold the device); then the
/// record gives the verdict (the node's [`ttdrv_api::labels::ROLLBACK_VERDICT`]
/// travels with it) and, once the node shows it, the agent pod from before
/// is restarted to read it. The agent loads the previous version again and
/// fails `ValidationFailed`, which [`installer_failed`] takes from there.
/// An agent that does not roll back within the upgrade timeout (nothing to
/// go back to, a verdict it cannot read) fails the node, kept cordoned.
fn rolling_back(rec: &NodeRecord, obs: &Observation, want: &Desired) -> Step {
    let now = obs.now;
    let base = rec.message.as_deref().unwrap_or_default();
    let base = base.split(ROLLBACK_NOW).next().unwrap_or(base);
    let waiting = |what: &str, commands: Vec<Command>| {
        let mut r = rec.clone();
        r.message = Some(format!("{base}{ROLLBACK_NOW}{what}"));
        stay(&r, commands)
    };
    // From the verdict, or before it from the surface's deadline (a stack
    // pod that never leaves).
    let from = rec
        .rollback_at
        .or(rec.surface_since.map(|s| s + want.surface_timeout_seconds))
        .unwrap_or(now);
    if now - from > want.upgrade_timeout_seconds {
        let msg = format!(
            "{base}; not rolled back within {}s (the stack not gone, or the agent did not roll back: \
             no previous version to go back to? its log says); the node stays cordoned on tt-kmd {}{}",
            want.upgrade_timeout_seconds,
            want.version,
            retry_hint(&want.policy, &obs.node, rec.cordoned_by_us())
        );
        return stay(
            &enter(rec, Failed, reason::DEVICES_NOT_PUBLISHED, Some(msg), now),
            vec![],
        );
    }
    if !obs.gates_closed {
        return waiting("closing the deploy gates", vec![Command::CloseGates]);
    }
    let mut holders: Vec<&str> = obs
        .surface
        .stack
        .iter()
        .map(|p| p.daemon_set.as_str())
        .collect();
    holders.dedup();
    if !holders.is_empty() {
        let what = format!("waiting for {} to leave the node", holders.join(", "));
        return waiting(&what, vec![]);
    }
    let Some(at) = rec.rollback_at else {
        let mut r = rec.clone();
        r.rollback_at = Some(now);
        r.message = Some(format!("{base}{ROLLBACK_NOW}verdict given to the agent"));
        return stay(&r, vec![]);
    };
    // The agent from before the verdict idles: restarted, it reads it.
    let shown = obs.rollback_verdict.is_some() && obs.rollback_verdict == rec.started;
    if shown && obs.installer_created.is_some_and(|c| c < at) {
        return waiting(
            "restarting the agent with the verdict",
            vec![Command::DeleteInstallerPod],
        );
    }
    waiting("waiting for the agent to roll back", vec![])
}

/// The new installer failed for good: fail now, with its cause; or drain
/// again, once, for a pod that holds the device. (A drained cycle replaces
/// the pod it found, or keeps the one that built ahead; failures from
/// before the cycle are not its own, nor is the refusal this cycle drained
/// again for.)
fn installer_failed(
    rec: &NodeRecord,
    obs: &Observation,
    want: &Desired,
    module_ok: bool,
) -> Option<Step> {
    let now = obs.now;
    let this_cycles = |f: &Failure| {
        (rec.no_drain || f.at().is_none_or(|c| c >= rec.since)) && !drained_again_for(rec, f)
    };
    if let (Some(f), InstallerPod::Current { .. }) = (&obs.installer_failure, &obs.installer)
        && this_cycles(f)
    {
        if let Some(step) = drain_again(rec, f, !module_ok, want, now) {
            return Some(step);
        }
        // The new module failed validation and the agent put the
        // previous one back: the node returns to service on it, then
        // fails (the rollout halts either way).
        if f.reason == reason::VALIDATION_FAILED
            && !module_ok
            && let Some(back) = obs.loaded.as_deref()
        {
            // A rollback the controller asked for says first why.
            let why = (rec.reason.as_deref() == Some(reason::ROLLING_BACK))
                .then_some(rec.message.as_deref())
                .flatten()
                .and_then(|m| m.split(ROLLBACK_NOW).next())
                .map(|m| format!("{m}; "))
                .unwrap_or_default();
            let msg = format!(
                "{why}{}; the node is back in service on tt-kmd {back}{}",
                f.message,
                retry_hint(&want.policy, &obs.node, false)
            );
            let mut cmds = vec![Command::OpenGates];
            if rec.cordoned_by_us() {
                cmds.insert(0, Command::Uncordon);
            }
            let republish = republish_after_rollback(rec, obs, f.at().unwrap_or(now));
            if !republish.is_empty() {
                cmds.push(Command::RestartPublishers(republish));
            }
            return Some(Step {
                record: enter(rec, Uncordoning, f.reason, Some(msg), now),
                commands: cmds,
                needs_slot: false,
            });
        }
        let msg = format!(
            "{}{}",
            f.message,
            retry_hint(&want.policy, &obs.node, rec.cordoned_by_us())
        );
        return Some(stay(&enter(rec, Failed, f.reason, Some(msg), now), vec![]));
    }
    None
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
                retry_hint(&want.policy, &obs.node, rec.cordoned_by_us())
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
            retry_hint(&want.policy, &obs.node, rec.cordoned_by_us())
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

/// The node's DRA plugin pods to restart once a swap is rolled back: those
/// restarted by this cycle's surface check read the new module, and until
/// restarted again they publish its cards, not the previous version's.
/// Plugin pods started after the rollback (`back`) read the module that
/// stays; one started in its second may not have (creation times are whole
/// seconds), so it is restarted too (once: this is the step into
/// Uncordoning). None when this cycle never restarted the plugin: no check began,
/// and no verdict was given (a verdict follows a check; the check's start
/// is forgotten when the agent reports the previous module before its
/// give-up shows).
fn republish_after_rollback(rec: &NodeRecord, obs: &Observation, back: i64) -> Vec<PodRef> {
    if rec.surface_since.is_none() && rec.rollback_at.is_none() {
        return vec![];
    }
    obs.surface
        .plugin_pods
        .iter()
        .filter(|p| !p.deleting && p.created <= back)
        .map(|p| p.pod.clone())
        .collect()
}
