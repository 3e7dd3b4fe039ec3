//! The reasons of the Kubernetes Events the controller emits: one closed set,
//! each documented in docs/troubleshooting.md ("Events", checked by
//! `tests/documented_reasons.rs`).

/// An Event's `reason`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventReason {
    NodeUpgradeStarted,
    NodeUpgraded,
    NodeUpgradeFailed,
    NodeRolledBack,
    NodeNotReady,
    NodeDrainedAgain,
    PodsNotEvicted,
    DrainBlocked,
    NodeUnloading,
    NodeUnmanaged,
    NodeUnloadFailed,
    DaemonSetCreated,
    DaemonSetUpdated,
    DaemonSetDeleted,
    DaemonSetTakeover,
    DaemonSetTakenOver,
    PolicyRefused,
    PolicyApplied,
    FleetNotReady,
    FleetReady,
    NextKernelBuildFailed,
    UnreadableStatusReplaced,
    DeprecatedField,
    SelectorConflict,
    RolloutWaitingOnOthers,
    GoBuilderImageReplaced,
    NodePassthrough,
    FirmwareFlashStarted,
    FirmwareFlashed,
    FirmwareFlashFailed,
    FirmwareTakenOver,
    UngatedDeviceHolder,
    RefreshingDevices,
}

impl EventReason {
    /// Every reason, for the docs drift test.
    pub const ALL: &'static [EventReason] = &[
        Self::NodeUpgradeStarted,
        Self::NodeUpgraded,
        Self::NodeUpgradeFailed,
        Self::NodeRolledBack,
        Self::NodeNotReady,
        Self::NodeDrainedAgain,
        Self::PodsNotEvicted,
        Self::DrainBlocked,
        Self::NodeUnloading,
        Self::NodeUnmanaged,
        Self::NodeUnloadFailed,
        Self::DaemonSetCreated,
        Self::DaemonSetUpdated,
        Self::DaemonSetDeleted,
        Self::DaemonSetTakeover,
        Self::DaemonSetTakenOver,
        Self::PolicyRefused,
        Self::PolicyApplied,
        Self::FleetNotReady,
        Self::FleetReady,
        Self::NextKernelBuildFailed,
        Self::UnreadableStatusReplaced,
        Self::DeprecatedField,
        Self::SelectorConflict,
        Self::RolloutWaitingOnOthers,
        Self::GoBuilderImageReplaced,
        Self::NodePassthrough,
        Self::FirmwareFlashStarted,
        Self::FirmwareFlashed,
        Self::FirmwareFlashFailed,
        Self::FirmwareTakenOver,
        Self::UngatedDeviceHolder,
        Self::RefreshingDevices,
    ];

    /// The reason as Kubernetes shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NodeUpgradeStarted => "NodeUpgradeStarted",
            Self::NodeUpgraded => "NodeUpgraded",
            Self::NodeUpgradeFailed => "NodeUpgradeFailed",
            Self::NodeRolledBack => "NodeRolledBack",
            Self::NodeNotReady => crate::reason::NODE_NOT_READY,
            Self::NodeDrainedAgain => "NodeDrainedAgain",
            Self::PodsNotEvicted => "PodsNotEvicted",
            Self::DrainBlocked => "DrainBlocked",
            Self::NodeUnloading => "NodeUnloading",
            Self::NodeUnmanaged => "NodeUnmanaged",
            Self::NodeUnloadFailed => "NodeUnloadFailed",
            Self::DaemonSetCreated => "DaemonSetCreated",
            Self::DaemonSetUpdated => "DaemonSetUpdated",
            Self::DaemonSetDeleted => "DaemonSetDeleted",
            Self::DaemonSetTakeover => "DaemonSetTakeover",
            Self::DaemonSetTakenOver => "DaemonSetTakenOver",
            Self::PolicyRefused => "PolicyRefused",
            Self::PolicyApplied => "PolicyApplied",
            Self::FleetNotReady => "FleetNotReady",
            Self::FleetReady => "FleetReady",
            Self::NextKernelBuildFailed => crate::prepare::NEXT_KERNEL_BUILD_FAILED,
            Self::UnreadableStatusReplaced => "UnreadableStatusReplaced",
            Self::DeprecatedField => "DeprecatedField",
            Self::SelectorConflict => "SelectorConflict",
            Self::RolloutWaitingOnOthers => "RolloutWaitingOnOthers",
            Self::GoBuilderImageReplaced => "GoBuilderImageReplaced",
            Self::NodePassthrough => "NodePassthrough",
            Self::FirmwareFlashStarted => "FirmwareFlashStarted",
            Self::FirmwareFlashed => "FirmwareFlashed",
            Self::FirmwareFlashFailed => "FirmwareFlashFailed",
            Self::FirmwareTakenOver => "FirmwareTakenOver",
            Self::UngatedDeviceHolder => "UngatedDeviceHolder",
            Self::RefreshingDevices => "RefreshingDevices",
        }
    }
}

/// The message of the `NodeUpgraded` Event, from the record of the cycle that
/// just ended (`prev`, the last record before Done). Only a cycle that took
/// the node out of service (our cordon) brings it "back in service"; a first
/// install or a restart in place never cordoned it, and a node someone else
/// had cordoned stays cordoned.
pub fn node_upgraded_message(
    node: &str,
    prev: &crate::machine::NodeRecord,
    target: &str,
) -> String {
    use crate::machine::Cordon;
    if prev.no_drain && prev.cordon != Cordon::Ours {
        if prev.reason.as_deref() == Some(crate::reason::INSTALL) {
            return format!(
                "node {node}: tt-kmd {target} installed and loaded (first install: no module was loaded, \
                 so the node was not cordoned or drained)"
            );
        }
        return format!(
            "node {node}: tt-kmd {target} loaded; the installer pod was replaced in place \
             (the node was not cordoned or drained)"
        );
    }
    if prev.cordon == Cordon::Theirs {
        return format!(
            "node {node}: tt-kmd {target} loaded; the node stays cordoned, as it was found \
             (cordoned by someone else, not by this controller)"
        );
    }
    format!("node {node}: tt-kmd {target} loaded and node back in service")
}

/// The message of the `DrainBlocked` Event, on the step where a node's drain
/// becomes blocked by a PodDisruptionBudget (reason `EvictionBlocked`), and
/// only then: one Event per blocked drain, not one per pass. With the time
/// left, which the record's message (written only when it changes) gives as
/// a deadline.
pub fn drain_blocked_message(
    node: &str,
    prev: &crate::machine::NodeRecord,
    next: &crate::machine::NodeRecord,
    drain_timeout_seconds: i64,
    now: i64,
) -> Option<String> {
    let blocked = Some(crate::reason::EVICTION_BLOCKED);
    if next.reason.as_deref() != blocked || prev.reason.as_deref() == blocked {
        return None;
    }
    let left = (next.since + drain_timeout_seconds - now).max(0);
    Some(format!(
        "node {node}: {}; {} left before the drain times out",
        next.message
            .as_deref()
            .unwrap_or("eviction blocked by a PodDisruptionBudget"),
        minutes_seconds(left)
    ))
}

/// `9m50s`, `45s`.
fn minutes_seconds(s: i64) -> String {
    if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

impl std::fmt::Display for EventReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// "Back in service" only after a cycle that took the node out of it.
    #[test]
    fn node_upgraded_says_back_in_service_only_after_our_cordon() {
        use crate::machine::{Cordon, NodeRecord};
        use ttdrv_api::NodeState;
        let mut r = NodeRecord::new("fleet", "2.8.0", 0);
        r.state = NodeState::Upgrading;
        // A first install: no module loaded, installed in place.
        r.reason = Some(crate::reason::INSTALL.into());
        r.no_drain = true;
        let m = node_upgraded_message("n1", &r, "2.8.0");
        assert!(m.contains("first install"), "{m}");
        assert!(!m.contains("back in service"), "{m}");
        // A restart in place (the module stays).
        r.reason = Some(crate::reason::RESTART.into());
        let m = node_upgraded_message("n1", &r, "2.8.0");
        assert!(m.contains("not cordoned"), "{m}");
        assert!(!m.contains("back in service"), "{m}");
        // An upgrade under our cordon.
        r.no_drain = false;
        r.cordon = Cordon::Ours;
        r.state = NodeState::Uncordoning;
        assert_eq!(
            node_upgraded_message("n1", &r, "2.8.0"),
            "node n1: tt-kmd 2.8.0 loaded and node back in service"
        );
        // Someone else's cordon stays.
        r.cordon = Cordon::Theirs;
        let m = node_upgraded_message("n1", &r, "2.8.0");
        assert!(m.contains("stays cordoned"), "{m}");
    }

    /// One Event when the drain becomes blocked, none on the passes after,
    /// naming the pod, the budget and the time left.
    #[test]
    fn drain_blocked_is_reported_once_with_the_time_left() {
        use crate::machine::NodeRecord;
        use ttdrv_api::NodeState;
        let mut prev = NodeRecord::new("fleet", "2.8.0", 1000);
        prev.state = NodeState::Draining;
        prev.reason = Some(crate::reason::DRAIN.into());
        let mut next = prev.clone();
        next.reason = Some(crate::reason::EVICTION_BLOCKED.into());
        next.message =
            Some("eviction blocked: PodDisruptionBudget ml/web refuses to evict ml/web-0".into());
        let m = drain_blocked_message("n1", &prev, &next, 600, 1010).expect("an Event");
        assert!(m.starts_with("node n1: eviction blocked"), "{m}");
        assert!(m.contains("ml/web-0") && m.contains("ml/web"), "{m}");
        assert!(m.ends_with("9m50s left before the drain times out"), "{m}");
        // The next pass, still blocked: no second Event.
        assert_eq!(drain_blocked_message("n1", &next, &next, 600, 1020), None);
        // Unblocked: none either.
        assert_eq!(drain_blocked_message("n1", &next, &prev, 600, 1030), None);
    }

    #[test]
    fn all_lists_each_reason_once_with_a_distinct_name() {
        let names: BTreeSet<&str> = EventReason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(names.len(), EventReason::ALL.len());
        for r in EventReason::ALL {
            assert_eq!(
                format!("{r:?}"),
                r.as_str(),
                "the variant is named as shown"
            );
        }
    }
}
