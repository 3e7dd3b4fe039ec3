//! The policy-level decisions of a PolicySupervisor, pure: when a refusal or
//! takeover starts and ends, when the fleet-health brake's Event is due, which
//! conflicts and next-kernel warnings are news, whether the status is written
//! at once. [`PolicyMemo`] is what they remember between passes; [`decide`]
//! takes it and what a pass found to the memo after it and the [`Effect`]s the
//! supervisor carries out (Events, log lines, the manager told).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ttdrv_core::event::EventReason;

use crate::refusal::{Apply, Refusal, RefusalKind};

/// Least time between two status writes that only carry per-node progress.
pub const STATUS_INTERVAL: Duration = Duration::from_secs(1);

/// What a policy's supervisor remembers of earlier passes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicyMemo {
    /// Generation whose deprecated `spec.nodeSelector` was warned about.
    pub warned_generation: Option<i64>,
    /// Generation whose Go builder `spec.installer.image` was warned about.
    pub go_builder_warned_generation: Option<i64>,
    /// The fleet-health brake held the last pass.
    pub braked: bool,
    /// Nodes out of service not by us that held the rollout at the last pass
    /// (node, why): announced once per change.
    pub waiting_on: Vec<(String, String)>,
    /// What the cluster refuses about this policy, while it does.
    pub refusal: Option<Refusal>,
    /// Nodes left to older policies (node, owner) at the last pass.
    pub conflicts: Vec<(String, String)>,
    /// Next-kernel warnings announced with an Event (node -> kernel).
    pub next_kernel_warned: BTreeMap<String, String>,
    /// `resourceVersion` of the policy whose unreadable status (not ours:
    /// the Go operator's, or garbage) was last replaced by ours.
    pub replaced_unreadable: Option<String>,
    pub last_status_write: Option<Instant>,
}

/// The cluster's refusal of a policy's DaemonSet apply or drain selector, as
/// one pass found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    pub kind: RefusalKind,
    pub message: String,
    /// The API server was asked (and said no) in this pass.
    pub attempted: bool,
}

/// What happened, for [`decide`].
#[derive(Clone, Debug)]
pub enum Facts<'a> {
    /// A pass is about to run on the policy as it is now.
    PassStarts {
        generation: Option<i64>,
        uses_deprecated_node_selector: bool,
        /// `spec.installer.image` when it names the Go operator's builder,
        /// and the controller's installer image that runs instead.
        go_builder_image: Option<(&'a str, &'a str)>,
        conflicts: &'a [(String, String)],
    },
    /// A pass ran.
    PassEnded {
        generation: Option<i64>,
        refused: Option<&'a Refused>,
        /// The brake's NotReady nodes, when it holds the rollout.
        braked: Option<&'a [String]>,
        brake_percent: u32,
        /// Nodes out of service not by us, when they are what holds the next
        /// node back ([`ttdrv_core::rollout::Plan::waiting_on`]).
        waiting_on: &'a [(String, String)],
        version: &'a str,
        /// Nodes whose installed, not running kernel the target does not
        /// build for (node -> kernel).
        next_kernel_failed: BTreeMap<String, String>,
        now: Instant,
    },
    /// A status write succeeded; `replaced` is the `resourceVersion` whose
    /// unreadable status it replaced, if it did.
    StatusWritten {
        replaced: Option<Option<String>>,
        now: Instant,
    },
    /// The supervisor restarts: what the cluster refuses is found again.
    Restarted,
}

/// What the supervisor does about a decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    Event {
        warning: bool,
        reason: EventReason,
        action: &'static str,
        note: String,
    },
    /// Tell the PolicyManager the policy is now refused (or accepted again).
    RefusalChanged {
        refused: bool,
    },
    /// Count a refused attempt in the error metric.
    CountRefused,
    Log(Log),
}

/// The log lines of the decisions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Log {
    Accepted,
    BackingOff {
        attempts: u32,
        retry_in_s: u64,
        message: String,
    },
    Brake {
        braked: bool,
        note: String,
    },
    NextKernelFailed {
        node: String,
        kernel: String,
    },
}

/// The memo after `facts`, and what to do about them.
pub fn decide(prev: &PolicyMemo, facts: &Facts<'_>) -> (PolicyMemo, Vec<Effect>) {
    let mut next = prev.clone();
    let mut effects = vec![];
    match facts {
        Facts::PassStarts {
            generation,
            uses_deprecated_node_selector,
            go_builder_image,
            conflicts,
        } => {
            if let Some((named, instead)) = go_builder_image
                && prev.go_builder_warned_generation != *generation
            {
                next.go_builder_warned_generation = *generation;
                effects.push(event(
                    true,
                    EventReason::GoBuilderImageReplaced,
                    "Validate",
                    format!(
                        "spec.installer.image {named:?} is the Go operator's builder, which does not speak to this controller: the controller's installer image {instead:?} runs instead; remove spec.installer.image or name an agent image"
                    ),
                ));
            }
            if *uses_deprecated_node_selector && prev.warned_generation != *generation {
                next.warned_generation = *generation;
                effects.push(event(
                    true,
                    EventReason::DeprecatedField,
                    "Validate",
                    "spec.nodeSelector is deprecated: rename it to spec.nodeAffinity (same shape)"
                        .into(),
                ));
            }
            if prev.conflicts != *conflicts && !conflicts.is_empty() {
                let list: Vec<String> = conflicts
                    .iter()
                    .map(|(n, o)| format!("{n} (owned by {o})"))
                    .collect();
                effects.push(event(
                    true,
                    EventReason::SelectorConflict,
                    "Select",
                    format!(
                        "nodes also matched by older policies are left to them: {}",
                        list.join(", ")
                    ),
                ));
            }
            next.conflicts = conflicts.to_vec();
        }
        Facts::PassEnded {
            generation,
            refused,
            braked,
            brake_percent,
            waiting_on,
            version,
            next_kernel_failed,
            now,
        } => {
            brake(&mut next, &mut effects, *braked, *brake_percent);
            if next.waiting_on != *waiting_on && !waiting_on.is_empty() {
                let list: Vec<String> = waiting_on
                    .iter()
                    .map(|(n, why)| format!("{n} {why}"))
                    .collect();
                effects.push(event(
                    true,
                    EventReason::RolloutWaitingOnOthers,
                    "Rollout",
                    format!(
                        "rollout waits: maxUnavailable is taken by node(s) out of service, not by this rollout: {}; \
                         it goes on when they are back in service (or raise upgradePolicy.maxUnavailable)",
                        list.join(", ")
                    ),
                ));
            }
            next.waiting_on = waiting_on.to_vec();
            for (node, kernel) in ttdrv_core::prepare::new_next_kernel_warnings(
                &prev.next_kernel_warned,
                next_kernel_failed,
            ) {
                let note = format!(
                    "node {node}: tt-kmd {version} does not build for its installed kernel {kernel}; a reboot into that kernel would find no module (the installer's log has the build error)"
                );
                effects.push(Effect::Log(Log::NextKernelFailed { node, kernel }));
                effects.push(event(
                    true,
                    EventReason::NextKernelBuildFailed,
                    "Prepare",
                    note,
                ));
            }
            next.next_kernel_warned = next_kernel_failed.clone();
            refusal(&mut next, &mut effects, *generation, *refused, *now);
        }
        Facts::StatusWritten { replaced, now } => {
            if let Some(rv) = replaced {
                next.replaced_unreadable = rv.clone();
            }
            next.last_status_write = Some(*now);
        }
        Facts::Restarted => {
            if next.refusal.take().is_some() {
                effects.push(Effect::RefusalChanged { refused: false });
            }
        }
    }
    (next, effects)
}

fn event(warning: bool, reason: EventReason, action: &'static str, note: String) -> Effect {
    Effect::Event {
        warning,
        reason,
        action,
        note,
    }
}

/// An Event when the fleet-health brake engages or lets go.
fn brake(
    next: &mut PolicyMemo,
    effects: &mut Vec<Effect>,
    braked: Option<&[String]>,
    percent: u32,
) {
    if braked.is_some() == next.braked {
        return;
    }
    next.braked = braked.is_some();
    let (warning, reason, note) = match braked {
        Some(nodes) => (
            true,
            EventReason::FleetNotReady,
            format!(
                "rollout held: {} node(s) NotReady (more than {percent}% of the policy's nodes): {}",
                nodes.len(),
                nodes.join(", ")
            ),
        ),
        None => (
            false,
            EventReason::FleetReady,
            "enough nodes are Ready again: the rollout goes on".to_string(),
        ),
    };
    effects.push(Effect::Log(Log::Brake {
        braked: next.braked,
        note: note.clone(),
    }));
    effects.push(event(warning, reason, "Rollout", note));
}

/// Keeps the refusal in step with the pass: a refused attempt moves the
/// backoff on (Event and log line only for a new error), an accepted apply
/// ends it.
fn refusal(
    next: &mut PolicyMemo,
    effects: &mut Vec<Effect>,
    generation: Option<i64>,
    refused: Option<&Refused>,
    now: Instant,
) {
    let standing = next.refusal.clone();
    match refused {
        None => {
            if let Some(ended) = next.refusal.take() {
                effects.push(Effect::RefusalChanged { refused: false });
                effects.push(Effect::Log(Log::Accepted));
                let (reason, note) = match ended.kind {
                    RefusalKind::Takeover => (
                        EventReason::DaemonSetTakenOver,
                        "the installer DaemonSet was re-created as this controller's: the takeover is over",
                    ),
                    RefusalKind::Refused => (
                        EventReason::PolicyApplied,
                        "the installer DaemonSet was applied: the refusal is over",
                    ),
                };
                effects.push(event(false, reason, "Apply", note.into()));
            }
        }
        Some(r)
            if !r.attempted
                && standing
                    .as_ref()
                    .is_some_and(|s| s.message == r.message && s.generation == generation) => {}
        Some(r) => {
            let refusal = Refusal::refused(standing.as_ref(), generation, r.kind, &r.message, now);
            // A takeover has its own Event (DaemonSetTakeover, from the
            // renderer): it is not a refusal to report.
            let takeover = refusal.kind == RefusalKind::Takeover;
            let news = refusal.is_news(standing.as_ref());
            if news && !takeover {
                effects.push(event(
                    true,
                    EventReason::PolicyRefused,
                    "Apply",
                    refusal.message.clone(),
                ));
            }
            if r.attempted || news {
                effects.push(Effect::Log(Log::BackingOff {
                    attempts: refusal.attempts,
                    retry_in_s: refusal.retry_at.saturating_duration_since(now).as_secs(),
                    message: refusal.message.clone(),
                }));
            }
            if !takeover {
                effects.push(Effect::CountRefused);
            }
            if standing.is_none() {
                effects.push(Effect::RefusalChanged { refused: true });
            }
            next.refusal = Some(refusal);
        }
    }
}

impl PolicyMemo {
    /// Whether a pass at `now` applies the DaemonSet of `generation`.
    pub fn apply(&self, generation: Option<i64>, now: Instant) -> Apply {
        Refusal::next(self.refusal.as_ref(), generation, now)
    }

    /// Whether the status on the policy, unreadable to this controller, is
    /// replaced as a whole: once per version of the policy, so a watch that
    /// lags behind our write does not repeat it.
    pub fn replaces_unreadable(&self, unreadable: bool, resource_version: Option<&str>) -> bool {
        unreadable && self.replaced_unreadable.as_deref() != resource_version
    }

    /// Whether the status is written now: at once when a condition flips, the
    /// generation is new or an unreadable status is replaced; else (per-node
    /// progress) at most once per [`STATUS_INTERVAL`].
    pub fn status_due(&self, facts: &StatusFacts<'_>) -> bool {
        let urgent = facts.previous_flags != Some(facts.flags)
            || facts.previous_generation != Some(facts.generation);
        let due = self
            .last_status_write
            .is_none_or(|t| facts.now.saturating_duration_since(t) >= STATUS_INTERVAL);
        urgent || due || facts.replacing
    }
}

/// What [`PolicyMemo::status_due`] compares.
#[derive(Clone, Debug)]
pub struct StatusFacts<'a> {
    /// The condition flags of the status written last (none yet: `None`).
    pub previous_flags: Option<&'a [bool]>,
    pub flags: &'a [bool],
    /// `observedGeneration` of the status written last.
    pub previous_generation: Option<Option<i64>>,
    pub generation: Option<i64>,
    pub replacing: bool,
    pub now: Instant,
}

#[cfg(test)]
mod tests;
