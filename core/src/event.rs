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
        }
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
