//! The record of one node's driver cycle, as persisted on the Node
//! (annotation `driver.tenstorrent.com/upgrade-state`): a leaf, so that the
//! modules that read a Node ([`crate::node`], [`crate::claim`],
//! [`crate::go_ahead`]) need not depend on the machine that writes it.

use serde::{Deserialize, Serialize};
use ttdrv_api::NodeState;

/// Who cordoned the node, as far as this rollout is concerned.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Cordon {
    /// Not cordoned by us, and not found cordoned when our cycle started.
    #[default]
    None,
    /// We set `spec.unschedulable`: ours to undo, and only ours.
    Ours,
    /// Someone else had cordoned it when our cycle started: never uncordoned by us.
    Theirs,
}

/// What the controller remembers about one node, persisted on the Node
/// (annotation `driver.tenstorrent.com/upgrade-state`, JSON; the field names
/// are a contract with records already on clusters).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "wire::Record", into = "wire::Record")]
pub struct NodeRecord {
    pub policy: String,
    pub state: NodeState,
    /// Version this record's rollout aims at.
    pub target: String,
    pub reason: Option<String>,
    pub message: Option<String>,
    /// Unix seconds when `state` was entered.
    pub since: i64,
    /// Unix seconds when this node's cycle started (Cordoning or Upgrading).
    pub started: Option<i64>,
    pub cordon: Cordon,
    /// Pod replaced without cordon/drain (module version unchanged, or first install).
    pub no_drain: bool,
    /// A cycle without drain that holds a `maxUnavailable` slot all the same:
    /// a restart-only cycle that replaces the installer pod (a new installer
    /// template), bounded like any other so that a fleet's pods are not all
    /// replaced (and their images pulled) at once.
    pub bounded: bool,
    /// Last retry token acted upon (value of the retry annotation).
    pub retry_token: Option<String>,
    /// Unix seconds since when a paused policy holds this node mid-cycle; its
    /// deadline is moved on by the time held when the policy resumes.
    pub paused_at: Option<i64>,
    /// When the agent refused this cycle's swap as `DeviceBusy` and the
    /// cycle went back to Draining for it (the refusal's time, Unix seconds):
    /// once per cycle, so a holder the drain cannot move fails the node on
    /// the agent's next refusal instead of looping.
    pub redrained: Option<i64>,
    /// When this cycle's scheduling-surface check began (the swap
    /// validated, Unix seconds): DRA plugin pods created before it are
    /// restarted, and its deadline counts from it ([`crate::surface`]).
    pub surface_since: Option<i64>,
    /// The gated DaemonSets (`namespace/name`) that had a pod on the node
    /// when this cycle closed the gates: the DRA plugin is restarted only
    /// once each has a Ready pod there again ([`crate::surface::check`]).
    pub stood_down: Vec<String>,
    /// When the controller gave its verdict that this cycle's swap failed
    /// after the agent validated it (Unix seconds; reason `RollingBack`):
    /// while set in Upgrading, the node carries
    /// [`ttdrv_api::labels::ROLLBACK_VERDICT`], and the agent pod from
    /// before it is restarted to read it.
    pub rollback_at: Option<i64>,
}

/// The record as stored on the Node: cordon ownership as the two flags older
/// records carry.
mod wire {
    use serde::{Deserialize, Serialize};
    use ttdrv_api::NodeState;

    use super::{Cordon, NodeRecord};

    #[derive(Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct Record {
        policy: String,
        state: NodeState,
        target: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
        since: i64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        started: Option<i64>,
        #[serde(default)]
        cordoned_by_us: bool,
        #[serde(default)]
        was_unschedulable: bool,
        #[serde(default)]
        no_drain: bool,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        bounded: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_token: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        paused_at: Option<i64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        redrained: Option<i64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        surface_since: Option<i64>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        stood_down: Vec<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rollback_at: Option<i64>,
    }

    impl From<Record> for NodeRecord {
        fn from(w: Record) -> Self {
            // Both flags set never came from us; undoing our cordon is the
            // behaviour such a record always had.
            let cordon = match (w.cordoned_by_us, w.was_unschedulable) {
                (true, _) => Cordon::Ours,
                (false, true) => Cordon::Theirs,
                (false, false) => Cordon::None,
            };
            NodeRecord {
                policy: w.policy,
                state: w.state,
                target: w.target,
                reason: w.reason,
                message: w.message,
                since: w.since,
                started: w.started,
                cordon,
                no_drain: w.no_drain,
                bounded: w.bounded,
                retry_token: w.retry_token,
                paused_at: w.paused_at,
                redrained: w.redrained,
                surface_since: w.surface_since,
                stood_down: w.stood_down,
                rollback_at: w.rollback_at,
            }
        }
    }

    impl From<NodeRecord> for Record {
        fn from(r: NodeRecord) -> Self {
            Record {
                policy: r.policy,
                state: r.state,
                target: r.target,
                reason: r.reason,
                message: r.message,
                since: r.since,
                started: r.started,
                cordoned_by_us: r.cordon == Cordon::Ours,
                was_unschedulable: r.cordon == Cordon::Theirs,
                no_drain: r.no_drain,
                bounded: r.bounded,
                retry_token: r.retry_token,
                paused_at: r.paused_at,
                redrained: r.redrained,
                surface_since: r.surface_since,
                stood_down: r.stood_down,
                rollback_at: r.rollback_at,
            }
        }
    }
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
            cordon: Cordon::None,
            no_drain: false,
            bounded: false,
            retry_token: None,
            paused_at: None,
            redrained: None,
            surface_since: None,
            stood_down: vec![],
            rollback_at: None,
        }
    }

    /// We set the node's cordon and must undo it.
    pub fn cordoned_by_us(&self) -> bool {
        self.cordon == Cordon::Ours
    }

    /// The record halts the policy's rollout: Failed, or on its way there
    /// (returning a rolled-back node to service after a failed validation).
    pub fn halts_rollout(&self) -> bool {
        self.state.is_failed()
            || (self.state == NodeState::Uncordoning
                && self.reason.as_deref() == Some(crate::reason::VALIDATION_FAILED))
    }

    /// True while the node holds a `maxUnavailable` slot of this rollout:
    /// in a drained cycle (out of service because of it), or in a bounded
    /// one without drain.
    pub fn occupies_slot(&self) -> bool {
        self.state.is_in_progress() && (!self.no_drain || self.bounded)
    }
}
