//! The per-node upgrade state machine, free of I/O.
//!
//! [`step`] maps (persisted record, fresh observation, desired policy) to the next
//! record and the commands that move the node there. NodeActors carry the
//! commands out; the record is persisted on the Node (annotation
//! `driver.tenstorrent.com/upgrade-state`) in the same patch that cordons or
//! uncordons, so a controller killed at any instant resumes without cordoning
//! twice or forgetting who cordoned the node.

use serde::{Deserialize, Serialize};
use ttdrv_api::NodeState;

/// What the controller remembers about one node, persisted on the Node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeRecord {
    pub policy: String,
    pub state: NodeState,
    /// Version this record's rollout aims at.
    pub target: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Unix seconds when `state` was entered.
    pub since: i64,
    /// Unix seconds when this node's cycle started (Cordoning or Upgrading).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<i64>,
    /// We set `spec.unschedulable`; we must undo it (and only then).
    #[serde(default)]
    pub cordoned_by_us: bool,
    /// The node was unschedulable before we touched it: never uncordon it.
    #[serde(default)]
    pub was_unschedulable: bool,
    /// Pod replaced without cordon/drain (module version unchanged, or first install).
    #[serde(default)]
    pub no_drain: bool,
    /// Last retry token acted upon (value of the retry annotation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_token: Option<String>,
}

impl NodeRecord {
    pub fn new(policy: &str, target: &str, now: i64) -> Self {
        Self {
            policy: policy.to_string(),
            state: NodeState::Pending,
            target: target.to_string(),
            reason: None,
            message: None,
            since: now,
            started: None,
            cordoned_by_us: false,
            was_unschedulable: false,
            no_drain: false,
            retry_token: None,
        }
    }

    /// True while the node is out of service because of this rollout.
    pub fn occupies_slot(&self) -> bool {
        self.state.is_in_progress() && !self.no_drain
    }
}

/// The node's installer pod as seen in the cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Installer {
    Missing,
    /// Rendered from an older template; `deleting` once deletion has begun.
    Stale {
        deleting: bool,
    },
    Current {
        ready: bool,
    },
}

/// The drain's progress, computed from the pods on the node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DrainProgress {
    /// Pods still to evict or still terminating, as `ns/name`.
    pub remaining: Vec<String>,
    /// `ns/name`s of PodDisruptionBudgets currently refusing those evictions.
    pub blocking_pdbs: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observation {
    pub now: i64,
    pub unschedulable: bool,
    /// `driver.tenstorrent.com/kmd-version` as the agent reported it.
    pub loaded: Option<String>,
    /// The agent found a DKMS install (`install-mode=host`).
    pub host_managed: bool,
    pub installer: Installer,
    /// Every configured deploy gate is "false".
    pub gates_closed: bool,
    /// Any configured deploy gate label is present.
    pub gates_present: bool,
    pub drain: DrainProgress,
    /// Value of the node's retry annotation, if any.
    pub retry_token: Option<String>,
    /// The RolloutActor allows this node to start a disruptive cycle now.
    pub slot: bool,
    /// Why the installer pod is unhealthy, for failure messages.
    pub installer_problem: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    pub policy: String,
    pub version: String,
    pub drain_enabled: bool,
    pub drain_timeout_seconds: i64,
    pub upgrade_timeout_seconds: i64,
    pub paused: bool,
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
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub record: NodeRecord,
    pub commands: Vec<Command>,
}

/// Reasons attached to states (bounded set; also metric labels for failures).
pub mod reason {
    pub const WAITING: &str = "WaitingForSlot";
    pub const PAUSED: &str = "Paused";
    pub const UP_TO_DATE: &str = "UpToDate";
    pub const UPGRADED: &str = "Upgraded";
    pub const HOST_MANAGED: &str = "HostManaged";
    pub const RESTART: &str = "RestartOnly";
    pub const INSTALL: &str = "FirstInstall";
    pub const DRAIN_TIMEOUT: &str = "DrainTimeout";
    pub const UPGRADE_TIMEOUT: &str = "UpgradeTimeout";
    pub const RETRY: &str = "RetryRequested";
    pub const RETARGET: &str = "TargetChanged";
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
    r.state = state;
    r.reason = Some(reason.to_string());
    r.message = message;
    r
}

fn stay(rec: &NodeRecord, commands: Vec<Command>) -> Step {
    Step {
        record: rec.clone(),
        commands,
    }
}

/// One transition. A node leaving Done or Failed is re-evaluated as Pending in
/// the same step, but never with a slot: slots are granted to Pending nodes only.
/// Idempotent: re-running a step on the same observation issues
/// the same (idempotent) commands and reaches the same record.
pub fn step(rec: &NodeRecord, obs: &Observation, want: &Desired) -> Step {
    use NodeState::*;
    let now = obs.now;
    let module_ok = obs.loaded.as_deref() == Some(want.version.as_str());
    let up_to_date = module_ok && obs.installer == Installer::Current { ready: true };
    let mut rec = rec.clone();
    // A new target restarts the cycle of settled nodes (a version change is the
    // operator's action; in-flight nodes simply continue towards the new target).
    if rec.target != want.version {
        rec.target = want.version.clone();
        if matches!(rec.state, Done | Failed) {
            let r = enter(&rec, Pending, reason::RETARGET, None, now);
            return step(
                &r,
                &Observation {
                    slot: false,
                    ..obs.clone()
                },
                want,
            );
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
            if obs.host_managed && !rec.cordoned_by_us {
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
            if up_to_date && !rec.cordoned_by_us {
                return stay(&enter(&rec, Done, reason::UP_TO_DATE, None, now), vec![]);
            }
            if up_to_date {
                // Retried after the module landed: only the cordon is left to undo.
                return Step {
                    record: enter(&rec, Uncordoning, "Uncordon", None, now),
                    commands: vec![Command::Uncordon, Command::OpenGates],
                };
            }
            let stale = matches!(obs.installer, Installer::Stale { .. });
            if !rec.cordoned_by_us && (module_ok || obs.loaded.is_none()) {
                // Nothing can hold the device for a module swap: either the module
                // stays (restart-only change) or there is none yet (first install).
                let why = if module_ok {
                    reason::RESTART
                } else {
                    reason::INSTALL
                };
                let mut r = enter(&rec, Upgrading, why, None, now);
                r.no_drain = true;
                r.started = Some(now);
                let cmds = if stale {
                    vec![Command::DeleteInstallerPod]
                } else {
                    vec![]
                };
                return Step {
                    record: r,
                    commands: cmds,
                };
            }
            if !obs.slot {
                let msg = format!(
                    "waiting for a maxUnavailable slot to upgrade {} -> {}",
                    obs.loaded.as_deref().unwrap_or("none"),
                    want.version
                );
                return stay(
                    &enter(&rec, Pending, reason::WAITING, Some(msg), now),
                    vec![],
                );
            }
            if want.drain_enabled {
                let mut r = enter(&rec, Cordoning, "Cordon", None, now);
                if !r.cordoned_by_us {
                    r.was_unschedulable = obs.unschedulable;
                }
                r.cordoned_by_us = !r.was_unschedulable;
                r.no_drain = false;
                r.started = Some(now);
                let mut cmds = vec![Command::CloseGates];
                if r.cordoned_by_us {
                    cmds.insert(0, Command::Cordon);
                }
                Step {
                    record: r,
                    commands: cmds,
                }
            } else {
                let mut r = enter(&rec, Upgrading, "DrainDisabled", None, now);
                r.no_drain = false;
                r.started = Some(now);
                Step {
                    record: r,
                    commands: vec![Command::DeleteInstallerPod],
                }
            }
        }
        Cordoning => {
            let cordoned = obs.unschedulable;
            if cordoned && obs.gates_closed && !want.paused {
                return Step {
                    record: enter(&rec, Draining, "Drain", None, now),
                    commands: vec![Command::Evict],
                };
            }
            let mut cmds = vec![];
            let mut r = rec.clone();
            if !cordoned {
                // Someone uncordoned an admin-cordoned node mid-cycle: the cordon
                // we now set is ours to undo.
                r.cordoned_by_us = true;
                r.was_unschedulable = false;
                cmds.push(Command::Cordon);
            }
            if !obs.gates_closed {
                cmds.push(Command::CloseGates);
            }
            stay(&r, cmds)
        }
        Draining => {
            if obs.drain.remaining.is_empty() {
                if want.paused {
                    return stay(&rec, vec![]);
                }
                return Step {
                    record: enter(&rec, Upgrading, "ReplaceInstaller", None, now),
                    commands: vec![Command::DeleteInstallerPod],
                };
            }
            if now - rec.since > want.drain_timeout_seconds {
                let mut msg = format!(
                    "drain did not finish within {}s; pods still on the node: {}",
                    want.drain_timeout_seconds,
                    obs.drain.remaining.join(", ")
                );
                if !obs.drain.blocking_pdbs.is_empty() {
                    msg.push_str(&format!(
                        "; blocked by PodDisruptionBudgets: {}",
                        obs.drain.blocking_pdbs.join(", ")
                    ));
                }
                msg.push_str(&retry_hint(&want.policy));
                return stay(
                    &enter(&rec, Failed, reason::DRAIN_TIMEOUT, Some(msg), now),
                    vec![],
                );
            }
            stay(&rec, vec![Command::Evict])
        }
        Upgrading => {
            if obs.host_managed {
                // The new agent found a DKMS install: it stands down, so do we.
                if rec.cordoned_by_us || obs.gates_present {
                    let mut cmds = vec![Command::OpenGates];
                    if rec.cordoned_by_us {
                        cmds.insert(0, Command::Uncordon);
                    }
                    return Step {
                        record: enter(&rec, Uncordoning, reason::HOST_MANAGED, None, now),
                        commands: cmds,
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
            if module_ok && obs.installer == (Installer::Current { ready: true }) {
                if !rec.cordoned_by_us && (rec.no_drain || !want.drain_enabled) {
                    let mut r = enter(&rec, Done, reason::UPGRADED, None, now);
                    r.no_drain = false;
                    return stay(&r, vec![]);
                }
                let mut cmds = vec![Command::OpenGates];
                if rec.cordoned_by_us {
                    cmds.insert(0, Command::Uncordon);
                }
                return Step {
                    record: enter(&rec, Uncordoning, "Uncordon", None, now),
                    commands: cmds,
                };
            }
            if now - rec.since > want.upgrade_timeout_seconds {
                let msg = format!(
                    "installer did not report {} within {}s (loaded: {}; installer pod: {}){}",
                    want.version,
                    want.upgrade_timeout_seconds,
                    obs.loaded.as_deref().unwrap_or("none"),
                    obs.installer_problem
                        .as_deref()
                        .unwrap_or(match obs.installer {
                            Installer::Missing => "missing",
                            Installer::Stale { .. } => "old template",
                            Installer::Current { ready: true } => "ready",
                            Installer::Current { ready: false } => "not ready",
                        }),
                    retry_hint(&want.policy)
                );
                return stay(
                    &enter(&rec, Failed, reason::UPGRADE_TIMEOUT, Some(msg), now),
                    vec![],
                );
            }
            match obs.installer {
                Installer::Stale { deleting: false } => {
                    stay(&rec, vec![Command::DeleteInstallerPod])
                }
                _ => stay(&rec, vec![]),
            }
        }
        Uncordoning => {
            let schedulable_ok = !rec.cordoned_by_us || !obs.unschedulable;
            if schedulable_ok && !obs.gates_present {
                let why = if obs.host_managed {
                    reason::HOST_MANAGED
                } else {
                    reason::UPGRADED
                };
                let mut r = enter(&rec, Done, why, None, now);
                r.cordoned_by_us = false;
                r.was_unschedulable = false;
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
            let host_done = rec.reason.as_deref() == Some(reason::HOST_MANAGED);
            let changed = if host_done {
                !obs.host_managed
            } else {
                obs.host_managed || !up_to_date
            };
            if changed {
                let r = enter(&rec, Pending, reason::RETARGET, None, now);
                return step(
                    &r,
                    &Observation {
                        slot: false,
                        ..obs.clone()
                    },
                    want,
                );
            }
            stay(&rec, vec![])
        }
        Failed => {
            if obs.retry_token.is_some() && obs.retry_token != rec.retry_token {
                let mut r = enter(&rec, Pending, reason::RETRY, None, now);
                r.retry_token = obs.retry_token.clone();
                return step(
                    &r,
                    &Observation {
                        slot: false,
                        ..obs.clone()
                    },
                    want,
                );
            }
            stay(&rec, vec![])
        }
    }
}

fn retry_hint(policy: &str) -> String {
    format!(
        ". The node stays cordoned and the rollout of {policy} is halted; after fixing the cause, retry with \
         `kubectl tt driver retry {policy} <node>` or `kubectl annotate node <node> driver.tenstorrent.com/retry=$(date +%s) --overwrite`"
    )
}

#[cfg(test)]
mod tests;
