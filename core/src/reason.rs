//! Reasons a node's state carries (`status.nodes[].reason`, the record on the
//! Node, the `reason` label of `ttdriver_node_failures_total`). One bounded set,
//! defined here only: the state machine writes them, the metrics, the alert
//! rules and the docs name them, and a test keeps the docs in line.

/// Pending: another node holds the slot.
pub const WAITING: &str = "WaitingForSlot";
/// Pending: the installer builds the target into the node's cache ahead of
/// the cordon (`upgradePolicy.prepare`), or waits for a place to.
pub const PREPARING: &str = "Preparing";
/// Pending: `spec.paused`.
pub const PAUSED: &str = "Paused";
/// Pending: a firmware cycle (a TenstorrentFirmwarePolicy's, ours or the Go
/// operator's) has the node; one disruption at a time.
pub const WAITING_FOR_FIRMWARE: &str = "WaitingForFirmware";
/// Pending: the cards read back a firmware older than `spec.minFirmwareVersion`.
pub const WAITING_FOR_FIRMWARE_VERSION: &str = "WaitingForFirmwareVersion";
/// Pending: the last upgraded node soaks (`upgradePolicy.soakSeconds`);
/// the next starts after it.
pub const SOAKING: &str = "Soaking";
/// Pending: outside every `upgradePolicy.maintenanceWindows` entry; the
/// message says when the next opens.
pub const OUTSIDE_MAINTENANCE_WINDOW: &str = "OutsideMaintenanceWindow";
/// Pending: `spec.promoteAfter`: the canary policy has not been Ready at
/// this version for its soak yet, or is halted (a Failed node) or missing.
pub const WAITING_FOR_PROMOTION: &str = "WaitingForPromotion";
/// Done: the module and installer were already current.
pub const UP_TO_DATE: &str = "UpToDate";
/// Done (or Uncordoning): the new module is loaded.
pub const UPGRADED: &str = "Upgraded";
/// Done: DKMS manages the module on this host; left alone.
pub const HOST_MANAGED: &str = "HostManaged";
/// Done: every Tenstorrent function of the node is bound to vfio-pci (VM
/// passthrough): tt-kmd serves none of them, so the node is left alone.
pub const VFIO_PASSTHROUGH: &str = "VfioPassthrough";
/// Upgrading without a drain: the module version stays, only the pod changes.
pub const RESTART: &str = "RestartOnly";
/// Upgrading without a drain: nothing is loaded yet.
pub const INSTALL: &str = "FirstInstall";
/// Cordoning: the cycle starts.
pub const CORDON: &str = "Cordon";
/// Draining: evicting the pods that must go.
pub const DRAIN: &str = "Drain";
/// Draining: a PodDisruptionBudget refuses an eviction; the message names
/// the pod, the budget and when the drain times out.
pub const EVICTION_BLOCKED: &str = "EvictionBlocked";
/// Pending: `kubectl tt driver handback --wait` holds new cycles while the
/// ones under way end.
pub const HANDING_BACK: &str = "HandingBack";
/// Upgrading: the drain finished; the installer pod is replaced.
pub const REPLACE_INSTALLER: &str = "ReplaceInstaller";
/// Upgrading without cordon or drain: `drain.enable` is false.
pub const DRAIN_DISABLED: &str = "DrainDisabled";
/// Uncordoning: the module is loaded; undoing our cordon and gates.
pub const UNCORDON: &str = "Uncordon";
/// Failed: the drain outlived `drain.timeoutSeconds`.
pub const DRAIN_TIMEOUT: &str = "DrainTimeout";
/// Failed: the installer did not report the target within the upgrade timeout.
pub const UPGRADE_TIMEOUT: &str = "UpgradeTimeout";
/// Pending: an operator asked to retry a Failed node.
pub const RETRY: &str = "RetryRequested";
/// Pending: the policy's version changed, or the node's module did.
pub const RETARGET: &str = "TargetChanged";

/// Unloading: drained; the installer is replaced to unload the module.
pub const UNLOAD: &str = "Unload";
/// Unmanaged: the module is unloaded and the node vacated.
pub const VACATED: &str = "Vacated";
/// UnloadFailed: the installer did not report the module unloaded in time.
pub const UNLOAD_TIMEOUT: &str = "UnloadTimeout";
/// UnloadFailed (the agent's word): the module could not be removed.
pub const UNLOAD_ERROR: &str = "UnloadError";

/// Failed: the installer image cannot be pulled (ImagePullBackOff and kin).
pub const INSTALLER_IMAGE_PULL: &str = "InstallerImagePull";
/// Failed: the installer container restarted 3 times or more without an
/// answer from the agent.
pub const INSTALLER_CRASH_LOOP: &str = "InstallerCrashLoop";
/// Failed (the agent's word): a process still holds the device.
pub const DEVICE_BUSY: &str = "DeviceBusy";
/// Draining again: the agent refused the swap as `DeviceBusy` after the
/// drain had ended (a pod reached the node since); once per cycle.
pub const DRAIN_AGAIN: &str = "DrainAgain";
/// Failed (the agent's word): the module did not build.
pub const BUILD_FAILED: &str = "BuildFailed";
/// Failed (the agent's word): the kernel refused the module.
pub const LOAD_FAILED: &str = "LoadFailed";
/// Upgrading: the new module validated; the user's validation pod
/// (`upgradePolicy.validation.podTemplateName`) runs on the node.
pub const VALIDATING: &str = "Validating";
/// Upgrading: the swap validated; the node's DRA plugin is restarted and
/// the node waits until the scheduler sees every card again
/// ([`crate::surface`]).
pub const REFRESHING_DEVICES: &str = "RefreshingDevices";
/// Upgrading: the scheduler did not see every card after the swap, a
/// validation failure that `onValidationFailure: rollback` rolls back: the
/// deploy gates close, the stack leaves the node, and the agent, restarted
/// with the controller's verdict ([`ttdrv_api::labels::ROLLBACK_VERDICT`]),
/// loads the previous version again.
pub const ROLLING_BACK: &str = "RollingBack";
/// Failed: after the swap the scheduler did not see every card the agent
/// counted within `--scheduling-surface-timeout-seconds`; the node stays
/// cordoned on the new version.
pub const DEVICES_NOT_PUBLISHED: &str = "DevicesNotPublished";
/// Failed (the agent's word): the new module loaded but does not serve
/// every card the old one served (or a card's attributes cannot be read);
/// the previous version is back (`onValidationFailure: rollback`) or the
/// new one is held for a person (`hold`).
pub const VALIDATION_FAILED: &str = "ValidationFailed";
/// Failed: during its soak the upgraded node went NotReady, its installer
/// stopped reporting the module, or pods using its devices crash-looped.
pub const SOAK_FAILED: &str = "SoakFailed";
/// In a cycle, the node is not Ready (reason kept while it lasts); Failed when
/// a deadline passes while the node is not Ready.
pub const NODE_NOT_READY: &str = "NodeNotReady";

/// The Go operator's codes for the reasons it also had, written beside ours
/// as `status.nodes[].goReason` (ours stay in `reason`: they are the label
/// values of the metrics and alerts, and are kept on the Node).
pub const GO_CODES: &[(&str, &str)] = &[
    (HOST_MANAGED, "HostManagedKMD"),
    (INSTALLER_IMAGE_PULL, "BuilderImagePullFailed"),
    (INSTALLER_CRASH_LOOP, "BuilderCrashLoop"),
];

/// The Go operator's code for `reason`, if it had one.
pub fn go_code(reason: &str) -> Option<&'static str> {
    GO_CODES.iter().find(|(r, _)| *r == reason).map(|(_, g)| *g)
}

/// Reasons the agent gives for giving up, as the first word of its
/// container's termination message (`<Reason>: <what happened>`).
pub const AGENT_FAILURES: &[&str] = &[
    DEVICE_BUSY,
    BUILD_FAILED,
    LOAD_FAILED,
    VALIDATION_FAILED,
    UNLOAD_ERROR,
];

/// The agent's reason and words from a termination message, if it starts
/// with one of [`AGENT_FAILURES`].
pub fn from_termination_message(message: &str) -> Option<(&'static str, &str)> {
    let (head, rest) = message.trim().split_once(':')?;
    let reason = AGENT_FAILURES.iter().copied().find(|r| *r == head.trim())?;
    Some((reason, rest.trim()))
}

/// The termination message the agent writes when it gives up.
pub fn termination_message(reason: &str, message: &str) -> String {
    format!("{reason}: {message}")
}

/// Reasons of the Failed state: the values of the `reason` label of
/// `ttdriver_node_failures_total` and of the failure alert.
pub const FAILURES: &[&str] = &[
    DRAIN_TIMEOUT,
    UPGRADE_TIMEOUT,
    INSTALLER_IMAGE_PULL,
    INSTALLER_CRASH_LOOP,
    DEVICE_BUSY,
    BUILD_FAILED,
    LOAD_FAILED,
    VALIDATION_FAILED,
    DEVICES_NOT_PUBLISHED,
    SOAK_FAILED,
    NODE_NOT_READY,
    UNLOAD_TIMEOUT,
    UNLOAD_ERROR,
];

/// Every reason the state machine can write.
pub const ALL: &[&str] = &[
    WAITING,
    PREPARING,
    PAUSED,
    WAITING_FOR_FIRMWARE,
    WAITING_FOR_FIRMWARE_VERSION,
    WAITING_FOR_PROMOTION,
    HANDING_BACK,
    UP_TO_DATE,
    UPGRADED,
    HOST_MANAGED,
    VFIO_PASSTHROUGH,
    RESTART,
    INSTALL,
    CORDON,
    DRAIN,
    EVICTION_BLOCKED,
    DRAIN_AGAIN,
    REPLACE_INSTALLER,
    DRAIN_DISABLED,
    UNCORDON,
    DRAIN_TIMEOUT,
    UPGRADE_TIMEOUT,
    RETRY,
    RETARGET,
    INSTALLER_IMAGE_PULL,
    INSTALLER_CRASH_LOOP,
    DEVICE_BUSY,
    BUILD_FAILED,
    LOAD_FAILED,
    VALIDATING,
    REFRESHING_DEVICES,
    ROLLING_BACK,
    DEVICES_NOT_PUBLISHED,
    VALIDATION_FAILED,
    SOAK_FAILED,
    SOAKING,
    OUTSIDE_MAINTENANCE_WINDOW,
    NODE_NOT_READY,
    UNLOAD,
    VACATED,
    UNLOAD_TIMEOUT,
    UNLOAD_ERROR,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn termination_message_round_trip() {
        let m = termination_message(DEVICE_BUSY, "pid 42 (python) in pod ml/train-0");
        assert_eq!(
            from_termination_message(&m),
            Some((DEVICE_BUSY, "pid 42 (python) in pod ml/train-0"))
        );
        assert_eq!(from_termination_message("Error: something"), None);
        assert_eq!(from_termination_message("no colon"), None);
    }

    #[test]
    fn go_codes() {
        assert_eq!(go_code(HOST_MANAGED), Some("HostManagedKMD"));
        assert_eq!(
            go_code(INSTALLER_IMAGE_PULL),
            Some("BuilderImagePullFailed")
        );
        assert_eq!(go_code(INSTALLER_CRASH_LOOP), Some("BuilderCrashLoop"));
        assert_eq!(go_code(DRAIN_TIMEOUT), None);
        for (r, _) in GO_CODES {
            assert!(ALL.contains(r), "{r}");
        }
    }
}
