//! `TenstorrentFirmwarePolicy` (`firmware.tenstorrent.com/v1alpha1`, short
//! name `ttfwp`): the firmware bundle a set of Tenstorrent nodes runs, flashed
//! node by node by a Job running the flasher image.
//!
//! Group, version, kind, short name, every field and its default, the status
//! shape, the node states and the reasons match the Go operator's, so its
//! objects apply and read unchanged; our additions sit beside them
//! (`upgradePolicy.drain.fullNode`/`podSelectorLabel`, `status.nodes[].target`).
//! The node labels and annotations Go wrote are [`labels`]; the flasher's
//! contract (environment in, report out) is [`flasher`].

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::podselector::{POD_SELECTOR_PATTERN, token_length_rule};
use crate::v1alpha1::{NodeSelectorTerm, PullPolicy};
use crate::validation::{
    IMAGE_MAX_LENGTH, IMAGE_PATTERN, POD_SELECTOR_MAX_LENGTH, VERSION_MAX_LENGTH, cel_string,
    version_pattern,
};

/// Longest `spec.bundleURL`.
pub const BUNDLE_URL_MAX_LENGTH: usize = 2048;
/// `spec.bundleURL`: an http(s) URL that curl can use: optional userinfo, a
/// host (a name or IPv4 address, or an IPv6 literal in closed brackets), a
/// port from 1 to 65535 if any, then a path, query or fragment without
/// whitespace or control characters. A regular expression (RE2, as CEL's
/// `matches`), not CEL's URL library: its cost over a 2048-character string
/// passes the API server's budget.
pub const BUNDLE_URL_PATTERN: &str = concat!(
    r"^https?://([A-Za-z0-9._~%!$&'()*+,;=:-]+@)?",
    r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?)",
    r"(:(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3}))?",
    r"([/?#][^\x00-\x20\x7f-\x9f]*)?$"
);
/// Longest `spec.readbackVersion` (four parts of up to 9 digits).
pub const READBACK_MAX_LENGTH: usize = 39;
/// `spec.readbackVersion`: what tt-smi reports, dotted decimal parts.
pub const READBACK_PATTERN: &str = r"^[0-9]{1,9}(\.[0-9]{1,9}){1,3}$";

/// Desired firmware bundle version for the Tenstorrent nodes it selects.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "firmware.tenstorrent.com",
    version = "v1alpha1",
    kind = "TenstorrentFirmwarePolicy",
    plural = "tenstorrentfirmwarepolicies",
    shortname = "ttfwp",
    category = "tenstorrent",
    doc = "A TenstorrentFirmwarePolicy says which firmware bundle the Tenstorrent nodes it selects run, and how the controller flashes it: it cordons and drains a node, runs a flash Job on it (tt-flash, then a tt-smi readback of every card), uncordons it, never more than upgradePolicy.maxParallel nodes at a time and never while a driver policy has the same node out. Cluster-scoped; status.nodes[] reports every selected node. See docs/firmware.md.",
    status = "TenstorrentFirmwarePolicyStatus",
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".spec.version","description":"Firmware bundle version the policy asks for"}"#,
    printcolumn = r#"{"name":"Matched","type":"integer","jsonPath":".status.summary.matched","description":"Nodes the policy selects"}"#,
    printcolumn = r#"{"name":"UpToDate","type":"integer","jsonPath":".status.summary.upToDate","description":"Nodes whose cards read back the target"}"#,
    printcolumn = r#"{"name":"InProgress","type":"integer","jsonPath":".status.summary.inProgress","description":"Nodes in Cordoning, Draining, Flashing or Uncordoning"}"#,
    printcolumn = r#"{"name":"Failed","type":"integer","jsonPath":".status.summary.failed","description":"Nodes in state Failed (the rollout halts with haltOnFailure)"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status","description":"True when every matched node reads back the target"}"#,
    printcolumn = r#"{"name":"Paused","type":"boolean","jsonPath":".spec.paused","description":"True while the controller starts nothing new"}"#,
    validation = firmware_name_rule()
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "has(self.nodeAffinity) != has(self.nodeSelector)",
        "message": "exactly one of spec.nodeAffinity or spec.nodeSelector must be set (nodeSelector is the deprecated alias; {} matches every Tenstorrent node)",
        "reason": "FieldValueInvalid"
    }
]))]
pub struct TenstorrentFirmwarePolicySpec {
    /// Firmware bundle version, e.g. `19.8.0`: names the bundle
    /// (`fw_pack-<version>.fwbundle`) and, with `.0`, the default readback.
    #[schemars(length(max = VERSION_MAX_LENGTH), extend("pattern" = version_pattern()))]
    pub version: String,

    /// What tt-smi must report for every card after the flash
    /// (`fw_bundle_version`); empty means `<version>.0`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = READBACK_MAX_LENGTH))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": format!("self == '' || self.matches({})", cel_string(READBACK_PATTERN)),
        "message": "readbackVersion must be dotted decimal, as tt-smi reports it (e.g. 19.8.0.0)"
    }]))]
    pub readback_version: Option<String>,

    /// Where the flash Job downloads the bundle; empty means the
    /// tt-system-firmware release of `version` on GitHub.
    #[serde(default, rename = "bundleURL", skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = BUNDLE_URL_MAX_LENGTH))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": format!("self == '' || self.matches({})", cel_string(BUNDLE_URL_PATTERN)),
        "message": "bundleURL must be an http or https URL with a host (an IPv6 literal in closed brackets) and a port (if any) from 1 to 65535, without whitespace or control characters"
    }]))]
    pub bundle_url: Option<String>,

    /// The bundle's SHA-256 (64 lowercase hex digits). Set, the flash Job
    /// refuses a download with any other digest before a card is touched
    /// (reason BundleChecksumMismatch). Ours; the Go operator had none.
    #[serde(
        default,
        rename = "bundleSHA256",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(extend("pattern" = "^[0-9a-f]{64}$"))]
    pub bundle_sha256: Option<String>,

    /// Nodes this policy flashes (standard LabelSelector; `{}` matches all),
    /// always ANDed with the Tenstorrent PCI label and the absence of
    /// `firmware.tenstorrent.com/skip=true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_affinity: Option<NodeSelectorTerm>,

    /// Deprecated alias of `nodeAffinity` (the Go operator's first name for it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<NodeSelectorTerm>,

    /// Starts nothing new; a flash in progress is never interrupted, and a
    /// node mid-cycle finishes the step it is in and waits.
    #[serde(default)]
    pub paused: bool,

    /// How many nodes at a time and how each is taken out of service.
    #[serde(default)]
    pub upgrade_policy: FirmwareUpgradePolicy,

    /// Flasher image and its switches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flasher: Option<FlasherOverride>,

    /// The tt-kmd version this firmware needs at least: a node is flashed only
    /// once its loaded module (label `driver.tenstorrent.com/kmd-version`) is
    /// that version or newer; until then it waits (reason
    /// WaitingForDriverVersion) and goes on when its driver policy gets there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = VERSION_MAX_LENGTH), extend("pattern" = version_pattern()))]
    pub min_driver_version: Option<String>,
}

impl TenstorrentFirmwarePolicySpec {
    /// The selector in effect (`nodeAffinity`, else the deprecated `nodeSelector`).
    pub fn selector(&self) -> Option<&NodeSelectorTerm> {
        self.node_affinity.as_ref().or(self.node_selector.as_ref())
    }

    /// What every card must read back after the flash.
    pub fn readback(&self) -> String {
        match self.readback_version.as_deref() {
            Some(r) if !r.is_empty() => r.to_string(),
            _ => format!("{}.0", self.version),
        }
    }

    /// Where the bundle comes from.
    pub fn bundle(&self) -> String {
        match self.bundle_url.as_deref() {
            Some(u) if !u.is_empty() => u.to_string(),
            _ => default_bundle_url(&self.version),
        }
    }

    pub fn flasher(&self) -> FlasherOverride {
        self.flasher.clone().unwrap_or_default()
    }
}

/// The tt-system-firmware release asset of `version` (the Go operator's default).
pub fn default_bundle_url(version: &str) -> String {
    format!(
        "https://github.com/tenstorrent/tt-system-firmware/releases/download/v{version}/fw_pack-{version}.fwbundle"
    )
}

/// `metadata.name` is a label value (`firmware.tenstorrent.com/owned-by`).
fn firmware_name_rule() -> kube::core::Rule {
    kube::core::Rule::new(format!(
        "oldSelf.hasValue() || size(self.metadata.name) <= {}",
        crate::validation::POLICY_NAME_MAX_LENGTH
    ))
    .message(
        format!(
            "metadata.name must be at most {} characters: it is the value of the label {} on the nodes it flashes and of the label {} on its Jobs",
            crate::validation::POLICY_NAME_MAX_LENGTH,
            labels::OWNED_BY,
            labels::JOB_POLICY,
        )
        .as_str(),
    )
    .optional_old_self(true)
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FirmwareUpgradePolicy {
    /// False: report drift in status only, flash nothing.
    #[serde(default = "yes")]
    pub auto_upgrade: bool,
    /// Most nodes in a firmware cycle (cordoned, draining, flashing) at once.
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 10000))]
    pub max_parallel: i32,
    /// The flash Job's deadline (`activeDeadlineSeconds`); Galaxy systems
    /// need minutes, PCIe cards usually under two.
    #[serde(default = "default_flash_timeout")]
    #[schemars(range(min = 60, max = 86400))]
    pub flash_timeout_seconds: i64,
    /// Cordon and drain before the flash.
    #[serde(default)]
    pub drain: FirmwareDrainPolicy,
    /// Start nothing new while a node of this policy is Failed.
    #[serde(default = "yes")]
    pub halt_on_failure: bool,
}

impl Default for FirmwareUpgradePolicy {
    fn default() -> Self {
        Self {
            auto_upgrade: true,
            max_parallel: 1,
            flash_timeout_seconds: default_flash_timeout(),
            drain: FirmwareDrainPolicy::default(),
            halt_on_failure: true,
        }
    }
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FirmwareDrainPolicy {
    /// Cordon and evict device users before the flash. Off only where the
    /// controller runs on the very node it flashes (single-node clusters).
    #[serde(default = "yes")]
    pub enable: bool,
    /// Evict bare pods (no controller) instead of reporting them as blockers.
    #[serde(default)]
    pub force: bool,
    /// Evict pods with emptyDir volumes in pass 2 (their data is lost).
    #[serde(default = "yes")]
    pub delete_empty_dir: bool,
    /// Per-node drain deadline; the node goes Failed (DrainTimeout) after it.
    #[serde(default = "default_drain_timeout")]
    #[schemars(range(min = 1, max = 86400))]
    pub timeout_seconds: i64,
    /// Pass 2 after the device users: evict every other non-DaemonSet pod
    /// (kubectl drain semantics). Off by default, as the Go firmware
    /// controller evicted device users only.
    #[serde(default)]
    pub full_node: bool,
    /// Restricts pass 2 to matching pods, as the driver policy's field.
    #[serde(default)]
    #[schemars(length(max = POD_SELECTOR_MAX_LENGTH))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": format!("self.matches({})", cel_string(POD_SELECTOR_PATTERN)),
        "message": "podSelectorLabel must be a label selector: key=value, key!=value, key, !key, key in (a,b) or key notin (a,b), comma-separated, with keys and values in label syntax"
    }, {
        "rule": token_length_rule(),
        "message": "podSelectorLabel: a label key has a prefix of at most 253 characters and a name of at most 63; a label value has at most 63 characters"
    }]))]
    pub pod_selector_label: String,
}

impl Default for FirmwareDrainPolicy {
    fn default() -> Self {
        Self {
            enable: true,
            force: false,
            delete_empty_dir: true,
            timeout_seconds: default_drain_timeout(),
            full_node: false,
            pod_selector_label: String::new(),
        }
    }
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlasherOverride {
    /// Flasher image; empty means the chart's `flasher.image`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = IMAGE_MAX_LENGTH))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": format!("self == '' || self.matches({})", cel_string(IMAGE_PATTERN)),
        "message": "image must be an image reference [registry[:port]/]repository[:tag][@sha256:<64 hex>], with a lowercase repository and no whitespace"
    }]))]
    pub image: Option<String>,
    /// Pull policy of the flasher image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,
    /// Write even when every card already reads back the target (tt-flash
    /// `--force`): re-flash, downgrade, suspected ROM corruption.
    #[serde(default)]
    pub force_write: bool,
    /// Flash even when the readback before the flash fails (a wedged chip).
    #[serde(default)]
    pub continue_on_readback_failure: bool,
    /// Pass `--force` only when the node's cards report different versions
    /// from each other (so a card newer than the target is rewritten too).
    #[serde(default)]
    pub homogenize_firmware_versions: bool,
}

fn yes() -> bool {
    true
}

fn one() -> i32 {
    1
}

fn default_flash_timeout() -> i64 {
    900
}

fn default_drain_timeout() -> i64 {
    600
}

/// Observed state, written by the controller. Read leniently, as the driver
/// policy's: a status this controller cannot read (the Go operator's with a
/// state we do not have, or garbage) parses as empty with `unreadable` set.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", remote = "Self")]
pub struct TenstorrentFirmwarePolicyStatus {
    #[serde(skip)]
    #[schemars(skip)]
    pub unreadable: Option<String>,
    /// The spec generation (metadata.generation) this status reflects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// spec.version as last read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_version: Option<String>,
    /// Ready, Progressing, Paused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    #[serde(default)]
    pub summary: FirmwareSummary,
    /// One entry per matched node, by name.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub nodes: Vec<FirmwareNodeStatus>,
}

impl Serialize for TenstorrentFirmwarePolicyStatus {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        TenstorrentFirmwarePolicyStatus::serialize(self, s)
    }
}

impl<'de> Deserialize<'de> for TenstorrentFirmwarePolicyStatus {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = serde_json::Value::deserialize(d)?;
        Ok(
            TenstorrentFirmwarePolicyStatus::deserialize(&raw).unwrap_or_else(|e| Self {
                unreadable: Some(e.to_string()),
                ..Default::default()
            }),
        )
    }
}

/// The Go operator's counts, same names and meaning.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FirmwareSummary {
    #[serde(default)]
    pub matched: i32,
    /// Done: every card reads back the target.
    #[serde(default)]
    pub up_to_date: i32,
    /// Cordoning, Draining, Flashing or Uncordoning.
    #[serde(default)]
    pub in_progress: i32,
    /// Failed.
    #[serde(default)]
    pub failed: i32,
    /// Pending.
    #[serde(default)]
    pub pending: i32,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FirmwareNodeStatus {
    pub name: String,
    pub state: FirmwareNodeState,
    /// One CamelCase word: why the node is in its state ([`reason`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The firmware every card read back after the last flash on this node
    /// (the flasher's report), else the node's `current-version` annotation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_version: Option<String>,
    /// The last flash Job on this node, for `kubectl logs job/<name>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_flash_job: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
}

/// The Go operator's node states, same names.
#[derive(
    Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
pub enum FirmwareNodeState {
    Pending,
    Cordoning,
    Draining,
    Flashing,
    Uncordoning,
    Done,
    Failed,
}

impl FirmwareNodeState {
    pub const ALL: [FirmwareNodeState; 7] = [
        Self::Pending,
        Self::Cordoning,
        Self::Draining,
        Self::Flashing,
        Self::Uncordoning,
        Self::Done,
        Self::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Cordoning => "Cordoning",
            Self::Draining => "Draining",
            Self::Flashing => "Flashing",
            Self::Uncordoning => "Uncordoning",
            Self::Done => "Done",
            Self::Failed => "Failed",
        }
    }

    /// Out of service because of a firmware cycle (the Go summary's inProgress).
    pub fn is_in_progress(self) -> bool {
        matches!(
            self,
            Self::Cordoning | Self::Draining | Self::Flashing | Self::Uncordoning
        )
    }
}

/// The reasons a firmware node status carries: the Go operator's codes,
/// same spelling, and ours beside them.
pub mod reason {
    pub const FLASHING: &str = "Flashing";
    pub const FLASH_SUCCEEDED: &str = "FlashSucceeded";
    pub const FLASH_JOB_FAILED: &str = "FlashJobFailed";
    pub const FLASHER_IMAGE_PULL_FAILED: &str = "FlasherImagePullFailed";
    pub const DRAIN_TIMEOUT: &str = "DrainTimeout";
    pub const EVICTION_BLOCKED: &str = "EvictionBlocked";
    pub const NODE_CONFLICT: &str = "NodeConflict";
    pub const EXTERNAL_CORDON: &str = "ExternalCordon";
    pub const CORDONING: &str = "Cordoning";
    pub const DRAINING: &str = "Draining";
    pub const UNCORDONING: &str = "Uncordoning";
    pub const PAUSED: &str = "Paused";
    pub const ROLLOUT_HALTED: &str = "RolloutHalted";
    pub const AUTO_UPGRADE_DISABLED: &str = "AutoUpgradeDisabled";
    pub const TRANSIENT_API_ERROR: &str = "TransientAPIError";
    // Ours.
    /// Waiting for a `maxParallel` slot.
    pub const WAITING_FOR_SLOT: &str = "WaitingForSlot";
    /// A driver policy's cycle has the node (one disruption at a time).
    pub const WAITING_FOR_DRIVER: &str = "WaitingForDriver";
    /// The node is not Ready: nothing starts on it.
    pub const NODE_NOT_READY: &str = "NodeNotReady";
    /// The flash Job outlived `flashTimeoutSeconds`.
    pub const FLASH_TIMEOUT: &str = "FlashTimeout";
    /// The flasher's readback did not match the target.
    pub const READBACK_MISMATCH: &str = "ReadbackMismatch";
    /// Taken over from the Go firmware controller mid-cycle.
    pub const TAKEN_OVER: &str = "TakenOver";
    /// The node's tt-kmd is older than `spec.minDriverVersion`.
    pub const WAITING_FOR_DRIVER_VERSION: &str = "WaitingForDriverVersion";
    /// The downloaded bundle's SHA-256 is not `spec.bundleSHA256`: nothing
    /// was written to the cards.
    pub const BUNDLE_CHECKSUM_MISMATCH: &str = "BundleChecksumMismatch";
    /// The bundle could not be downloaded (`spec.bundleURL` unusable or
    /// unreachable): nothing was written to the cards.
    pub const BUNDLE_DOWNLOAD_FAILED: &str = "BundleDownloadFailed";
    /// Flashed, and the cordon handed to the driver policy waiting for the
    /// node: its swap follows under the same cordon and drain.
    pub const CORDON_HANDED_OVER: &str = "CordonHandedOver";
    /// Uncordoning: the flash read back; the deploy gates open with the
    /// node still cordoned, the gated stack comes back, the DRA plugin
    /// restarts, until the scheduler sees every card (the driver's reason).
    pub const REFRESHING_DEVICES: &str = "RefreshingDevices";
    /// The scheduler did not see every card within the bound after the
    /// flash: kept cordoned (the driver's reason).
    pub const DEVICES_NOT_PUBLISHED: &str = "DevicesNotPublished";

    /// Every reason, for the docs drift test.
    pub const ALL: [&str; 27] = [
        FLASHING,
        FLASH_SUCCEEDED,
        FLASH_JOB_FAILED,
        FLASHER_IMAGE_PULL_FAILED,
        DRAIN_TIMEOUT,
        EVICTION_BLOCKED,
        NODE_CONFLICT,
        EXTERNAL_CORDON,
        CORDONING,
        DRAINING,
        UNCORDONING,
        PAUSED,
        ROLLOUT_HALTED,
        AUTO_UPGRADE_DISABLED,
        TRANSIENT_API_ERROR,
        WAITING_FOR_SLOT,
        WAITING_FOR_DRIVER,
        NODE_NOT_READY,
        FLASH_TIMEOUT,
        READBACK_MISMATCH,
        TAKEN_OVER,
        WAITING_FOR_DRIVER_VERSION,
        CORDON_HANDED_OVER,
        REFRESHING_DEVICES,
        DEVICES_NOT_PUBLISHED,
        BUNDLE_CHECKSUM_MISMATCH,
        BUNDLE_DOWNLOAD_FAILED,
    ];

    /// Failures the flash Job reports before any card is touched: the node
    /// goes back into service (the rollout halts all the same).
    pub const BEFORE_ANY_CARD: [&str; 2] = [BUNDLE_CHECKSUM_MISMATCH, BUNDLE_DOWNLOAD_FAILED];
}

/// Node labels and annotations of the firmware policy. The Go firmware
/// controller's keys, same meaning, so its nodes are read on takeover and
/// Go-era selectors keep working.
pub mod labels {
    /// Label: the node's firmware state (a [`super::FirmwareNodeState`]).
    pub const UPGRADE_STATE: &str = "firmware.tenstorrent.com/upgrade-state";
    /// Label: `true` keeps every firmware policy off the node.
    pub const SKIP: &str = "firmware.tenstorrent.com/skip";
    /// Label: the firmware policy that owns the node (first come, first served).
    pub const OWNED_BY: &str = "firmware.tenstorrent.com/owned-by";
    /// Label: the firmware version every card read back after the last flash.
    pub const FW_VERSION: &str = "firmware.tenstorrent.com/fw-version";
    /// Annotation: as [`FW_VERSION`], for people.
    pub const CURRENT_VERSION: &str = "firmware.tenstorrent.com/current-version";
    /// Annotation: the version the last flash Job was started for.
    pub const DESIRED_VERSION: &str = "firmware.tenstorrent.com/desired-version";
    /// Annotation: the last flash Job's name.
    pub const LAST_FLASH_JOB: &str = "firmware.tenstorrent.com/last-flash-job";
    /// Annotation: the firmware policy whose cordon this is (Go's and ours).
    pub const CORDONED_BY: &str = "firmware.tenstorrent.com/cordoned-by";
    /// Annotation: when [`CORDONED_BY`] cordoned (RFC 3339).
    pub const CORDONED_AT: &str = "firmware.tenstorrent.com/cordoned-at";
    /// Annotation: our persisted firmware record (JSON), written with the
    /// cordon and every state change, so a restarted controller resumes.
    pub const RECORD: &str = "firmware.tenstorrent.com/record";
    /// Annotation: set to any new value to retry a Failed firmware node.
    pub const RETRY: &str = "firmware.tenstorrent.com/retry";

    /// Job and pod label: the policy.
    pub const JOB_POLICY: &str = "firmware.tenstorrent.com/cr";
    /// Job and pod label: the node.
    pub const JOB_NODE: &str = "firmware.tenstorrent.com/node";
    /// Job and pod label: the version, dots as dashes.
    pub const JOB_VERSION: &str = "firmware.tenstorrent.com/version";
}

/// The flasher's contract: the environment the flash Job's container gets
/// (the Go operator's names) and the report it leaves as its termination
/// message.
pub mod flasher {
    use serde::{Deserialize, Serialize};

    /// Where the init container wrote the bundle.
    pub const ENV_BUNDLE_PATH: &str = "TT_FW_BUNDLE_PATH";
    pub const ENV_VERSION: &str = "TT_FW_VERSION";
    /// What every card must read back.
    pub const ENV_READBACK: &str = "TT_FW_READBACK";
    /// Extra tt-flash arguments (`--force`).
    pub const ENV_FLASH_ARGS: &str = "TT_FLASH_ARGS";
    pub const ENV_FORCE_WRITE: &str = "TT_FORCE_WRITE";
    pub const ENV_CONTINUE_ON_READBACK_FAILURE: &str = "TT_CONTINUE_ON_READBACK_FAILURE";
    pub const ENV_HOMOGENIZE: &str = "TT_HOMOGENIZE_FIRMWARE_VERSIONS";
    /// The bundle URL (the init container's input).
    pub const ENV_BUNDLE_URL: &str = "TT_FW_BUNDLE_URL";
    /// The SHA-256 the downloaded bundle must have (`spec.bundleSHA256`).
    pub const ENV_BUNDLE_SHA256: &str = "TT_FW_BUNDLE_SHA256";
    /// Set to a directory: the flasher acts on a simulated host there (the
    /// test module's sysfs and a fake tt-smi/tt-flash), never on hardware.
    pub const ENV_SIMULATE: &str = "TTDRV_FLASH_SIMULATE";

    /// Where the report goes (the container's terminationMessagePath).
    pub const REPORT_PATH: &str = "/dev/termination-log";
    /// Names the report's path (else [`REPORT_PATH`], or the simulated
    /// host's directory when simulating): the Job sets it to [`REPORT_PATH`].
    pub const ENV_REPORT: &str = "TTDRV_FLASH_REPORT";

    /// The flasher's last word, JSON in the termination message, on success
    /// and on failure: what the controller shows as `currentVersion` and
    /// the failure reason.
    #[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct Report {
        /// `fw_bundle_version` of every card before the flash (empty when
        /// the readback failed).
        #[serde(default)]
        pub before: Vec<String>,
        /// `fw_bundle_version` of every card after the flash (or unchanged
        /// when skipped).
        #[serde(default)]
        pub after: Vec<String>,
        /// Every card already read back the target: nothing written.
        #[serde(default)]
        pub skipped: bool,
        /// On failure, one CamelCase word (a firmware [`super::reason`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub reason: Option<String>,
        /// On failure, what went wrong, for a person.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub message: Option<String>,
    }

    impl Report {
        /// The one version every card reads back, if they agree.
        pub fn uniform_after(&self) -> Option<&str> {
            let first = self.after.first()?;
            self.after
                .iter()
                .all(|v| v == first)
                .then_some(first.as_str())
        }
    }
}

/// Whether the dotted version `have` is `min` or newer, part by part as
/// numbers (a missing part counts as 0: `19.8.0.0` is at least `19.8.0`).
/// An unreadable `have` is not.
pub fn version_at_least(have: &str, min: &str) -> bool {
    let parts =
        |v: &str| -> Option<Vec<u64>> { v.trim().split('.').map(|p| p.parse().ok()).collect() };
    let (Some(h), Some(m)) = (parts(have), parts(min)) else {
        return false;
    };
    let n = h.len().max(m.len());
    let at = |v: &[u64], i: usize| v.get(i).copied().unwrap_or(0);
    (0..n)
        .map(|i| at(&h, i).cmp(&at(&m, i)))
        .find(|o| o.is_ne())
        .is_none_or(|o| o.is_gt())
}

/// Job names: `ttfwp-<policy>-<node>` cut to 48, the version, and a hash of
/// all three (the Go operator's scheme, so a Go Job is found by its name);
/// the prefix is cut further where Go's name would pass 63 characters (a Job
/// name is a label value of its pods: Go's was refused there).
pub fn job_name(policy: &str, node: &str, version: &str) -> String {
    use sha2::{Digest, Sha256};
    let h = Sha256::digest(format!("{policy}/{node}/{version}").as_bytes());
    let suffix: String = h[..4].iter().map(|b| format!("{b:02x}")).collect();
    let tail = format!("-{}-{suffix}", version.replace('.', "-"));
    let mut prefix = format!("ttfwp-{policy}-{node}");
    let mut cut = 48.min(63usize.saturating_sub(tail.len()));
    if prefix.len() > cut {
        while !prefix.is_char_boundary(cut) {
            cut -= 1;
        }
        prefix.truncate(cut);
    }
    // A cut that ends on '.' would leave an empty DNS label before the tail.
    let prefix = prefix.trim_end_matches('.');
    format!("{prefix}{tail}").to_lowercase()
}

/// The Job of a node's `attempt`-th retry of `version`: Go's name for the
/// first, a name of its own (`<version>-r<attempt>` in place of the version)
/// for each retry.
pub fn job_name_for(policy: &str, node: &str, version: &str, attempt: u32) -> String {
    if attempt == 0 {
        job_name(policy, node, version)
    } else {
        job_name(policy, node, &format!("{version}-r{attempt}"))
    }
}

/// The labels of a flash Job and its pod.
pub fn job_labels(policy: &str, node: &str, version: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (labels::JOB_POLICY.to_string(), policy.to_string()),
        (labels::JOB_NODE.to_string(), node.to_string()),
        (labels::JOB_VERSION.to_string(), version.replace('.', "-")),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundle_urls_curl_can_use_and_only_those() {
        let re = regex::Regex::new(BUNDLE_URL_PATTERN).expect("the pattern compiles");
        for ok in [
            "https://github.com/tenstorrent/tt-system-firmware/releases/download/v19.8.0/fw_pack-19.8.0.fwbundle",
            "https://mirror.example.com:8443/fw/fw_pack-19.8.0.fwbundle",
            "http://[fd00::1]:8080/fw_pack.fwbundle",
            "https://10.0.0.5/b?token=x#f",
            "https://user:secret@mirror.internal/fw",
            "http://mirror:65535",
        ] {
            assert!(re.is_match(ok), "{ok} refused");
        }
        for bad in [
            "https://[",
            "http://a:99999999/x",
            "http://mirror:0/fw.tar",
            "http://mirror:65536/fw.tar",
            "https:///path",
            "ftp://example.com/b",
            "https://exa mple.com/b",
            "https://-bad-.example/b",
        ] {
            assert!(!re.is_match(bad), "{bad} accepted");
        }
    }
    use kube::CustomResourceExt;

    #[test]
    fn go_sample_gets_go_defaults() {
        let spec: TenstorrentFirmwarePolicySpec =
            serde_yaml::from_str("version: \"19.8.0\"\nnodeSelector: {}\n").expect("parses");
        assert!(spec.upgrade_policy.auto_upgrade && spec.upgrade_policy.halt_on_failure);
        assert_eq!(spec.upgrade_policy.max_parallel, 1);
        assert_eq!(spec.upgrade_policy.flash_timeout_seconds, 900);
        let d = &spec.upgrade_policy.drain;
        assert!(d.enable && d.delete_empty_dir && !d.force && !d.full_node);
        assert_eq!(d.timeout_seconds, 600);
        assert_eq!(spec.readback(), "19.8.0.0");
        assert_eq!(
            spec.bundle(),
            "https://github.com/tenstorrent/tt-system-firmware/releases/download/v19.8.0/fw_pack-19.8.0.fwbundle"
        );
        assert_eq!(spec.selector(), Some(&NodeSelectorTerm::default()));
        assert_eq!(spec.flasher(), FlasherOverride::default());
    }

    #[test]
    fn crd_has_the_go_identity() {
        let crd = serde_json::to_value(TenstorrentFirmwarePolicy::crd()).expect("serializes");
        assert_eq!(
            crd["metadata"]["name"],
            "tenstorrentfirmwarepolicies.firmware.tenstorrent.com"
        );
        assert_eq!(crd["spec"]["scope"], "Cluster");
        assert_eq!(crd["spec"]["names"]["shortNames"][0], "ttfwp");
        let v = &crd["spec"]["versions"][0];
        assert_eq!(v["name"], "v1alpha1");
        let cols: Vec<&str> = v["additionalPrinterColumns"]
            .as_array()
            .expect("columns")
            .iter()
            .filter_map(|c| c["name"].as_str())
            .collect();
        // Go's columns first, in Go's order.
        assert_eq!(
            &cols[..6],
            [
                "Version",
                "Matched",
                "UpToDate",
                "InProgress",
                "Failed",
                "Age"
            ]
        );
        let spec = &v["schema"]["openAPIV3Schema"]["properties"]["spec"];
        assert!(spec["properties"]["bundleURL"].is_object());
        assert_eq!(
            spec["x-kubernetes-validations"][0]["rule"],
            "has(self.nodeAffinity) != has(self.nodeSelector)"
        );
    }

    #[test]
    fn go_job_names() {
        // What the Go operator's jobName gives for these (sha256 of
        // "fleet/node-a/19.8.0", first four bytes).
        let n = job_name("fleet", "node-a", "19.8.0");
        assert!(n.starts_with("ttfwp-fleet-node-a-19-8-0-"), "{n}");
        assert_eq!(n.len(), "ttfwp-fleet-node-a-19-8-0-".len() + 8);
        let long = job_name(&"p".repeat(63), &"n".repeat(63), "19.8.0");
        assert!(long.len() <= 63, "{} chars: {long}", long.len());
        assert_ne!(
            job_name("fleet", "node-a", "19.8.0"),
            job_name("fleet", "node-a", "19.9.0")
        );
    }

    #[test]
    fn a_go_status_reads() {
        let s: TenstorrentFirmwarePolicyStatus = serde_json::from_value(serde_json::json!({
            "observedGeneration": 2, "desiredVersion": "19.8.0",
            "summary": {"matched": 2, "upToDate": 1, "inProgress": 1, "failed": 0, "pending": 0},
            "nodes": [{"name": "a", "state": "Flashing", "reason": "Flashing",
                       "lastFlashJob": "ttfwp-x", "lastTransitionTime": "2026-01-01T00:00:00Z"}]
        }))
        .expect("parses");
        assert!(s.unreadable.is_none());
        assert_eq!(s.nodes[0].state, FirmwareNodeState::Flashing);
        let bad: TenstorrentFirmwarePolicyStatus =
            serde_json::from_value(serde_json::json!({"nodes": [{"name": "a", "state": "Odd"}]}))
                .expect("parses");
        assert!(bad.unreadable.is_some());
    }

    #[test]
    fn versions_compare_by_number() {
        assert!(version_at_least("19.8.0.0", "19.8.0"));
        assert!(version_at_least("19.10.0", "19.8.0"));
        assert!(!version_at_least("19.7.9.9", "19.8.0"));
        assert!(version_at_least("2.8.0", "2.8.0"));
        assert!(!version_at_least("2.7.0", "2.8.0"));
        assert!(!version_at_least("garbage", "2.8.0"));
    }

    #[test]
    fn report_uniform_after() {
        let r = flasher::Report {
            after: vec!["19.8.0.0".into(), "19.8.0.0".into()],
            ..Default::default()
        };
        assert_eq!(r.uniform_after(), Some("19.8.0.0"));
        let mixed = flasher::Report {
            after: vec!["19.8.0.0".into(), "19.7.0.0".into()],
            ..Default::default()
        };
        assert_eq!(mixed.uniform_after(), None);
        assert_eq!(flasher::Report::default().uniform_after(), None);
    }

    #[test]
    fn every_reason_is_listed_once() {
        let mut all = reason::ALL.to_vec();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), reason::ALL.len());
    }
}
