//! Reasons a node's state carries (`status.nodes[].reason`, the record on the
//! Node, the `reason` label of `ttdriver_node_failures_total`). One bounded set,
//! defined here only: the state machine writes them, the metrics, the alert
//! rules and the docs name them, and a test keeps the docs in line.

/// Pending: another node holds the slot.
pub const WAITING: &str = "WaitingForSlot";
/// Pending: `spec.paused`.
pub const PAUSED: &str = "Paused";
/// Done: the module and installer were already current.
pub const UP_TO_DATE: &str = "UpToDate";
/// Done (or Uncordoning): the new module is loaded.
pub const UPGRADED: &str = "Upgraded";
/// Done: DKMS manages the module on this host; left alone.
pub const HOST_MANAGED: &str = "HostManaged";
/// Upgrading without a drain: the module version stays, only the pod changes.
pub const RESTART: &str = "RestartOnly";
/// Upgrading without a drain: nothing is loaded yet.
pub const INSTALL: &str = "FirstInstall";
/// Cordoning: the cycle starts.
pub const CORDON: &str = "Cordon";
/// Draining: evicting the pods that must go.
pub const DRAIN: &str = "Drain";
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

/// Reasons of the Failed state: the values of the `reason` label of
/// `ttdriver_node_failures_total` and of the failure alert.
pub const FAILURES: &[&str] = &[DRAIN_TIMEOUT, UPGRADE_TIMEOUT];

/// Every reason the state machine can write.
pub const ALL: &[&str] = &[
    WAITING,
    PAUSED,
    UP_TO_DATE,
    UPGRADED,
    HOST_MANAGED,
    RESTART,
    INSTALL,
    CORDON,
    DRAIN,
    REPLACE_INSTALLER,
    DRAIN_DISABLED,
    UNCORDON,
    DRAIN_TIMEOUT,
    UPGRADE_TIMEOUT,
    RETRY,
    RETARGET,
];
