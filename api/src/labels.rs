//! Node labels, annotations and well-known names shared by the controller, the
//! node agent and the kubectl plugin. Values match the Go operator we replace,
//! so existing workloads' nodeSelectors keep working.

/// Label set by node-feature-discovery on hosts with a Tenstorrent PCI device.
pub const TT_PCI_PRESENT: &str = "feature.node.kubernetes.io/pci-1200_1e52.present";
/// Opt-out: a node carrying this label (any value) is never touched.
pub const SKIP: &str = "driver.tenstorrent.com/skip";
/// Version of the module loaded right now, as read from sysfs by the agent.
pub const KMD_VERSION: &str = "driver.tenstorrent.com/kmd-version";
/// The host boot ID (`/proc/sys/kernel/random/boot_id`) at which the agent
/// last reported [`KMD_VERSION`]; set with it every time it is set or removed.
/// After a reboot the node's `status.nodeInfo.bootID` differs, so the
/// controller treats the module as not loaded until the agent reports again.
pub const KMD_BOOT_ID: &str = "driver.tenstorrent.com/kmd-boot-id";
/// The version whose verified module the agent holds in the node's cache for
/// the running kernel, built (at low priority) before any go-ahead: the swap
/// after the go-ahead loads it from the cache. Set by the agent.
pub const KMD_PREPARED: &str = "driver.tenstorrent.com/kmd-prepared";
/// The first installed, not running kernel (`/lib/modules/<kver>/build`
/// present) the agent could not build the target version for; absent when
/// every such kernel built. A warning: a reboot into it would find no module.
/// The value is the kernel release, or [`NEXT_KERNEL_UNNAMED`] when the
/// release is no label value.
pub const KMD_NEXT_KERNEL_FAILED: &str = "driver.tenstorrent.com/kmd-next-kernel-failed";
pub const NEXT_KERNEL_UNNAMED: &str = "unnamed";
/// Node annotation set by the agent: the tt-kmd module parameters in effect
/// (sysfs `/sys/module/tenstorrent/parameters/<name>` of every parameter
/// [`crate::module_params::PARAMETERS`] names that the loaded module has),
/// canonical (`name=value` sorted, booleans Y/N). Set and removed with
/// [`KMD_VERSION`]; the controller compares `spec.moduleParameters` with it.
pub const KMD_PARAMETERS: &str = "driver.tenstorrent.com/kmd-parameters";
/// Node annotation set by the agent: the host's own `options tenstorrent`
/// values (`/etc/modprobe.d` and the other modprobe.d directories) it
/// found, canonical, which it adopts at every load where the policy sets no
/// value; removed when the host has none.
pub const KMD_HOST_OPTIONS: &str = "driver.tenstorrent.com/kmd-host-options";
/// Version of the tt-smi binary the agent copied to the host.
pub const TT_SMI_VERSION: &str = "tt-smi.driver.tenstorrent.com/version";
/// `container` when the operator manages the module, `host` when DKMS does.
pub const INSTALL_MODE: &str = "driver.tenstorrent.com/install-mode";
pub const INSTALL_MODE_CONTAINER: &str = "container";
pub const INSTALL_MODE_HOST: &str = "host";

/// How many cards (device nodes) the module the agent reported serves; set
/// and removed with [`KMD_VERSION`], in the same patch. The scheduling-surface
/// check compares what the scheduler sees with it.
pub const KMD_CARDS: &str = "driver.tenstorrent.com/kmd-cards";
/// The tt-dra-driver chart's DRA kubelet plugin pods (the controller's
/// `--dra-plugin-selector` default).
pub const DEFAULT_DRA_PLUGIN_SELECTOR: &str = "app.kubernetes.io/name=tt-dra-driver";
/// The DRA driver of Tenstorrent cards: its ResourceSlices' `spec.driver`
/// (the controller's `--dra-driver` default).
pub const DEFAULT_DRA_DRIVER: &str = "tenstorrent.com";

/// The telemetry collector's deploy gate (tt-telemetry's chart default).
pub const DEFAULT_DEPLOY_GATE: &str = "tenstorrent.com/deploy.tt-telemetry";
/// The fabric-manager agent's deploy gate (tt-fabric-manager 0.2.29 and
/// later).
pub const FABRIC_MANAGER_DEPLOY_GATE: &str = "tenstorrent.com/deploy.tt-fabric-manager";
/// The deploy gates flipped to "false" while a node is upgraded, by default:
/// both holders of the device on a Tenstorrent stack (comma-separated, as
/// `--deploy-gates` takes them).
pub const DEFAULT_DEPLOY_GATES: &str =
    "tenstorrent.com/deploy.tt-telemetry,tenstorrent.com/deploy.tt-fabric-manager";
/// What every deploy-gate label's key starts with.
pub const DEPLOY_GATE_PREFIX: &str = "tenstorrent.com/deploy.";

/// Annotation on the DaemonSet pod template: sha256 of the rendered template.
pub const TEMPLATE_HASH: &str = "driver.tenstorrent.com/template-hash";

/// Node label naming the policy that owns the node when selectors overlap. The
/// DaemonSet of a policy requires this label to be absent or equal to its name.
pub const CLAIM: &str = "driver.tenstorrent.com/policy";

/// Node annotation holding the persisted per-node upgrade record (JSON), so a
/// restarted controller resumes without cordoning or evicting twice.
pub const UPGRADE_STATE: &str = "driver.tenstorrent.com/upgrade-state";

/// Node annotation holding the controller's go-ahead for a module swap (JSON:
/// policy, node, target version, cycle). Written by the controller only once
/// the node is cordoned and drained, removed when the cycle ends; the agent
/// unloads or replaces a loaded module only while it is present and matches.
/// The chart's admission policy keeps the agent from writing it.
pub const GO_AHEAD: &str = "driver.tenstorrent.com/go-ahead";
/// Node annotation: the controller's verdict that the swap of the cycle it
/// names (the go-ahead's cycle, Unix seconds) failed after the agent had
/// validated it (the scheduler did not see every card again). An agent that
/// finds its validated swap of that cycle rolls it back as for a failed
/// validation (`onValidationFailure: rollback`). Written by the controller
/// only with the node cordoned and the device's holders gone, removed when
/// the cycle ends; the chart's admission policy keeps the agent from
/// writing it.
pub const ROLLBACK_VERDICT: &str = "driver.tenstorrent.com/rollback";
/// Policy annotation set by `kubectl tt driver handback --wait` (its value:
/// when, RFC 3339): no new cycle starts, and the cycles under way go on to
/// their end (unlike `spec.paused`, which holds them where they are). The
/// hand-back replaces it with `spec.paused` once they have ended.
pub const HANDBACK: &str = "driver.tenstorrent.com/handback";

/// Node annotation the Go operator set on a node it cordoned, naming its
/// policy: a cordon with `cordoned-by=<policy>` is that policy's to undo.
pub const GO_CORDONED_BY: &str = "driver.tenstorrent.com/cordoned-by";
/// Node annotation the Go operator set with [`GO_CORDONED_BY`] (RFC 3339).
pub const GO_CORDONED_AT: &str = "driver.tenstorrent.com/cordoned-at";

/// Node annotation naming the firmware policy that flashed the node and
/// handed its cordon to the driver policy [`GO_CORDONED_BY`] names, so both
/// cycles share one cordon and drain. It goes with that cordon.
pub const CORDON_HANDED_OVER_BY: &str = "driver.tenstorrent.com/cordon-handed-over-by";

/// The marks of a cordon a driver policy inherited (the Go operator's, or
/// one handed over by a firmware policy): removed with the cordon.
pub const INHERITED_CORDON_MARKS: [&str; 3] =
    [GO_CORDONED_BY, GO_CORDONED_AT, CORDON_HANDED_OVER_BY];

/// The Go operator's label naming the policy of its installer DaemonSet and
/// pods. Our installer pods carry it too (outside the selector), for the
/// tools and dashboards that select on it.
pub const GO_CR: &str = "driver.tenstorrent.com/cr";
/// `app.kubernetes.io/component`: `driver` on installer pods (as the Go
/// operator's), `controller` on the controller's.
pub const COMPONENT: &str = "app.kubernetes.io/component";
/// [`COMPONENT`] of an installer pod.
pub const COMPONENT_DRIVER: &str = "driver";

/// Node annotation the Go operator's firmware controller sets on a node it
/// cordoned to flash, naming its TenstorrentFirmwarePolicy. Not ours to undo:
/// a rollout that waits on such a node names it.
pub const GO_FIRMWARE_CORDONED_BY: &str = "firmware.tenstorrent.com/cordoned-by";

/// Node label naming the `spec.unmanage` policy that vacated the node: its
/// module unloaded, our labels, record, cordon and gates gone. The node is
/// left alone while it carries the label (the policy's DaemonSet excludes it,
/// the controller writes nothing else to it); removed when the policy
/// manages it again or is deleted.
pub const UNMANAGED: &str = "driver.tenstorrent.com/unmanaged";

/// On a validation pod (`upgradePolicy.validation.podTemplateName`): the
/// cycle it checks (the cycle's start, Unix seconds), so that a pod of an
/// earlier cycle never passes for this one.
pub const VALIDATION_CYCLE: &str = "driver.tenstorrent.com/validation-cycle";
/// On a validation pod: the policy that runs it.
pub const VALIDATION_POLICY: &str = "driver.tenstorrent.com/validation-policy";

/// Operator namespace used by the chart.
pub const DEFAULT_NAMESPACE: &str = "tt-k8s-driver-manager-system";

/// Device directory the real driver exposes.
pub const DEVICE_DIR: &str = "/dev/tenstorrent";
/// Extended resources whose holders use the device (device plugin).
pub const RESOURCE_PREFIX: &str = "tenstorrent.com/";

/// Environment variables the controller sets on the agent pod.
/// The installer DaemonSet's container that runs the agent.
pub const INSTALLER_CONTAINER: &str = "installer";

pub mod env {
    pub const TT_KMD_VERSION: &str = "TT_KMD_VERSION";
    pub const NODE_NAME: &str = "NODE_NAME";
    pub const FORCE_UNLOAD: &str = "TT_FORCE_UNLOAD";
    /// "false" turns the agent's next-kernel preflight off
    /// (`upgradePolicy.prepare.nextKernels`); unset means on.
    pub const NEXT_KERNELS: &str = "TT_KMD_NEXT_KERNELS";
    /// `upgradePolicy.validation.timeoutSeconds`; unset means the default.
    pub const VALIDATION_TIMEOUT: &str = "TT_KMD_VALIDATION_TIMEOUT_SECONDS";
    /// `upgradePolicy.onValidationFailure` (`rollback` or `hold`); unset
    /// means rollback.
    pub const ON_VALIDATION_FAILURE: &str = "TT_KMD_ON_VALIDATION_FAILURE";
    /// `spec.moduleParameters` as the canonical parameter string
    /// (`ttdrv_api::module_params::canonical`); unset when empty.
    pub const MODULE_PARAMETERS: &str = "TT_KMD_MODULE_PARAMETERS";
    pub const SOURCE_REPOSITORY: &str = "TT_KMD_SOURCE_REPOSITORY";
    /// The commit the version's tag must name (a tag that moved is refused).
    pub const SOURCE_COMMIT: &str = "TT_KMD_SOURCE_COMMIT";
    /// Public keys one of which must have signed the version's tag.
    pub const TAG_KEYS: &str = "TT_KMD_TAG_KEYS";
    /// The private key (PEM) the agent signs the built module with
    /// (`installer.signingSecret`'s `tls.key`); set with [`SIGNING_CERT`].
    pub const SIGNING_KEY: &str = "TT_KMD_SIGNING_KEY";
    /// The certificate (PEM or DER) of [`SIGNING_KEY`] (`tls.crt`).
    pub const SIGNING_CERT: &str = "TT_KMD_SIGNING_CERT";
    /// `<namespace>/<name>` of the Secret the signing key pair comes from,
    /// for the agent's messages.
    pub const SIGNING_SECRET: &str = "TT_KMD_SIGNING_SECRET";
    pub const TT_SMI_VERSION: &str = "TT_SMI_VERSION";
    pub const HOST_ROOT: &str = "TTDRV_HOST_ROOT";
    /// Name of the policy whose DaemonSet runs the agent (its go-ahead must name it).
    pub const POLICY: &str = "TTDRV_POLICY";
    /// Set ("true") on the installer of a `spec.unmanage` policy: the agent
    /// installs nothing and only unloads, with the controller's go-ahead.
    pub const UNMANAGE: &str = "TTDRV_UNMANAGE";
}

/// Public tt-kmd repository, used when neither the CR nor the chart names a mirror.
pub const DEFAULT_SOURCE_REPOSITORY: &str = "https://github.com/tenstorrent/tt-kmd.git";
