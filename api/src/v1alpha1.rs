//! `TenstorrentDriverPolicy` (`driver.tenstorrent.com/v1alpha1`, short name `ttdp`).
//!
//! Field names, defaults and semantics match the Go operator this one replaces,
//! so existing objects apply unchanged. Validation lives in the schema (OpenAPI
//! patterns, enums and CEL rules) so a bad object is refused by the API server
//! with a message that names the field, before any controller sees it.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    Condition, LabelSelector, LabelSelectorRequirement, Time,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::podselector::{POD_SELECTOR_PATTERN, token_length_rule};
use crate::validation::{
    IMAGE_MAX_LENGTH, IMAGE_PATTERN, LABEL_KEY_HELP, LABEL_KEY_MAX_LENGTH, LABEL_VALUE_HELP,
    LABEL_VALUE_MAX_LENGTH, MATCH_EXPRESSIONS_MAX, MATCH_LABELS_MAX, POD_SELECTOR_MAX_LENGTH,
    SECRET_NAME_MAX_LENGTH, SECRET_NAME_PATTERN, SELECTOR_VALUES_MAX, SOURCE_REPOSITORY_MAX_LENGTH,
    SOURCE_REPOSITORY_PATTERN, VERSION_MAX_LENGTH, cel_string, invalid_message, label_key_rule,
    label_value_rule, version_pattern,
};

/// Desired tt-kmd version and rollout policy for the Tenstorrent nodes it selects.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "driver.tenstorrent.com",
    version = "v1alpha1",
    kind = "TenstorrentDriverPolicy",
    plural = "tenstorrentdriverpolicies",
    shortname = "ttdp",
    category = "tenstorrent",
    doc = "A TenstorrentDriverPolicy says which tt-kmd version the Tenstorrent nodes it selects run, and how the controller rolls it out: it cordons and drains a node, has the installer pod on that node swap the kernel module, uncordons it, never more than maxUnavailable nodes at a time. Cluster-scoped; status.nodes[] reports every selected node. See docs/crd-reference.md.",
    status = "TenstorrentDriverPolicyStatus",
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".spec.version","description":"tt-kmd version the policy asks for"}"#,
    printcolumn = r#"{"name":"Matched","type":"integer","jsonPath":".status.summary.matched","description":"Nodes the policy selects"}"#,
    printcolumn = r#"{"name":"UpToDate","type":"integer","jsonPath":".status.summary.upToDate","description":"Nodes with the target module loaded"}"#,
    printcolumn = r#"{"name":"InProgress","type":"integer","jsonPath":".status.summary.inProgress","description":"Nodes out of service for the rollout now"}"#,
    printcolumn = r#"{"name":"Failed","type":"integer","jsonPath":".status.summary.failedNodes","description":"Nodes in state Failed or UnloadFailed (the rollout halts). The Go operator's desired − available, which counts nodes mid-rollout, stays in .status.summary.failed, not printed"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase","description":"Ready, Progressing, Degraded or Paused"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status","description":"The Ready condition: True when no node is pending, in progress or failed and the policy is not paused"}"#,
    printcolumn = r#"{"name":"Done","type":"integer","jsonPath":".status.summary.done","description":"Nodes Done with the module this controller installed"}"#,
    printcolumn = r#"{"name":"Paused","type":"boolean","jsonPath":".spec.paused","description":"True while the controller leaves the policy alone"}"#,
    validation = crate::validation::policy_name_rule(),
    validation = crate::validation::promote_after_rule()
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "has(self.nodeAffinity) || has(self.nodeSelector)",
        "message": "spec.nodeAffinity is required (use {} to match every Tenstorrent node)",
        "fieldPath": ".nodeAffinity",
        "reason": "FieldValueRequired"
    },
    {
        "rule": "!(has(self.nodeAffinity) && has(self.nodeSelector))",
        "message": "spec.nodeSelector is the deprecated alias of spec.nodeAffinity: set only spec.nodeAffinity",
        "fieldPath": ".nodeSelector",
        "reason": "FieldValueForbidden"
    }
]))]
pub struct TenstorrentDriverPolicySpec {
    /// tt-kmd release tag without the `ttkmd-` prefix, e.g. `2.8.0`; each part has
    /// 1 to 9 digits (the agent's limit).
    // One definition: `validation::version_pattern`, also the agent's check.
    #[schemars(length(max = VERSION_MAX_LENGTH), extend("pattern" = version_pattern()))]
    pub version: String,

    /// Nodes this policy manages (standard LabelSelector; `{}` matches all). Always
    /// ANDed with the Tenstorrent PCI label and the absence of the skip label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_affinity: Option<NodeSelectorTerm>,

    /// Deprecated alias of `nodeAffinity`, accepted only when `nodeAffinity` is absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<NodeSelectorTerm>,

    /// Soft stop: the controller stops reconciling; the DaemonSet keeps running.
    #[serde(default)]
    pub paused: bool,

    /// How the nodes are taken out of service and how many at a time.
    #[serde(default)]
    pub upgrade_policy: UpgradePolicy,

    /// The installer pod (node agent) the DaemonSet runs on each selected node.
    #[serde(default)]
    pub installer: Installer,

    /// The Go operator's field: hand the policy's nodes to DKMS. While true
    /// the controller installs no module; it vacates each node in turn
    /// (cordon, drain, the installer unloads the module, uncordon) and marks
    /// it Unmanaged. `status.phase` is Unmanaged once every node is vacated
    /// (docs/migrating-from-go-operator.md).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unmanage: bool,

    /// tt-kmd module parameters the installer loads the module with
    /// (modprobe's `options tenstorrent ...`). Absent fields keep the
    /// module's default, or the host's own `options tenstorrent` line. A
    /// change reloads the module on every node, one drained cycle per node
    /// as for a version change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module_parameters: Option<crate::module_params::ModuleParameters>,

    /// The card firmware this tt-kmd version needs at least: a node's module
    /// is swapped only once every card reads back that version or newer (its
    /// label `firmware.tenstorrent.com/fw-version`, written by the firmware
    /// policy); until then it waits (reason WaitingForFirmwareVersion) and
    /// goes on when its firmware policy gets there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = crate::firmware::READBACK_MAX_LENGTH))]
    #[schemars(extend("pattern" = crate::firmware::READBACK_PATTERN))]
    pub min_firmware_version: Option<String>,

    /// Canary promotion: start new disruptive cycles (drained swaps, bounded
    /// restart-only cycles) only once the named policy, the canary, has been
    /// Ready at this same version for `soakSeconds`, with no Failed node.
    /// Until then the nodes wait (reason WaitingForPromotion); build-ahead
    /// goes on, cycles in progress finish, first installs are not held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promote_after: Option<PromoteAfter>,
}

/// `spec.promoteAfter`: the canary this policy's rollout follows.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PromoteAfter {
    /// Name of the canary TenstorrentDriverPolicy (not this one).
    #[schemars(length(min = 1, max = crate::validation::POLICY_NAME_MAX_LENGTH))]
    #[schemars(extend("pattern" = crate::validation::DNS_SUBDOMAIN_PATTERN))]
    pub policy: String,
    /// How long the canary must have been Ready at the version before this
    /// policy starts, in seconds (at most 7 days): counted from its Ready
    /// condition's lastTransitionTime or its nodes' latest one, whichever
    /// is later.
    #[serde(default)]
    #[schemars(range(min = 0, max = crate::validation::SOAK_SECONDS_MAX))]
    pub soak_seconds: i64,
}

impl TenstorrentDriverPolicySpec {
    /// The selector in effect (`nodeAffinity`, else the deprecated `nodeSelector`).
    pub fn selector(&self) -> Option<&NodeSelectorTerm> {
        self.node_affinity.as_ref().or(self.node_selector.as_ref())
    }

    /// The module parameters asked for, by module name, canonical
    /// ([`crate::module_params`]); empty when none.
    pub fn parameter_values(&self) -> crate::module_params::Values {
        self.module_parameters
            .as_ref()
            .map(crate::module_params::ModuleParameters::values)
            .unwrap_or_default()
    }

    /// True when the object relies on the deprecated alias.
    pub fn uses_deprecated_node_selector(&self) -> bool {
        self.node_affinity.is_none() && self.node_selector.is_some()
    }
}

/// A `metav1.LabelSelector`, typed so the schema can validate operators and values.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeSelectorTerm {
    /// Label key to value; keys and values follow the label syntax.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend(
        "maxProperties" = MATCH_LABELS_MAX,
        "additionalProperties" = {
            "type": "string",
            "maxLength": LABEL_VALUE_MAX_LENGTH,
            "x-kubernetes-validations": [{
                "rule": label_value_rule("self"),
                "message": format!("invalid label value: {LABEL_VALUE_HELP}")
            }]
        },
        "x-kubernetes-validations" = [{
            "rule": format!("self.all(k, {})", label_key_rule("k")),
            "messageExpression": invalid_message(
                "label key",
                &format!("self.filter(k, !{})[0]", label_key_rule("k")),
                LABEL_KEY_HELP
            ),
            "message": format!("invalid label key: {LABEL_KEY_HELP}")
        }]
    ))]
    pub match_labels: Option<BTreeMap<String, String>>,
    /// Label requirements, all of which a node must meet (ANDed with `matchLabels`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MATCH_EXPRESSIONS_MAX))]
    // atomic, as in metav1.LabelSelector: an apply replaces the whole list.
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub match_expressions: Option<Vec<SelectorRequirement>>,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "self.operator in ['In', 'NotIn'] ? (has(self.values) && size(self.values) > 0) : true",
        "message": "values must be non-empty when operator is In or NotIn",
        "fieldPath": ".values"
    },
    {
        "rule": "self.operator in ['Exists', 'DoesNotExist'] ? (!has(self.values) || size(self.values) == 0) : true",
        "message": "values must be empty when operator is Exists or DoesNotExist",
        "fieldPath": ".values"
    }
]))]
pub struct SelectorRequirement {
    /// The node label key the requirement applies to.
    #[schemars(
        length(min = 1, max = LABEL_KEY_MAX_LENGTH),
        extend("x-kubernetes-validations" = [{
            "rule": label_key_rule("self"),
            "message": format!("invalid label key: {LABEL_KEY_HELP}")
        }])
    )]
    pub key: String,
    /// How the key relates to the values: In, NotIn, Exists or DoesNotExist.
    pub operator: SelectorOperator,
    /// Label values: non-empty for In and NotIn, empty for Exists and DoesNotExist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = SELECTOR_VALUES_MAX),
        extend("x-kubernetes-list-type" = "atomic", "items" = {
            "type": "string",
            "maxLength": LABEL_VALUE_MAX_LENGTH,
            "x-kubernetes-validations": [{
                "rule": label_value_rule("self"),
                "message": format!("invalid label value: {LABEL_VALUE_HELP}")
            }]
        })
    )]
    pub values: Option<Vec<String>>,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum SelectorOperator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

impl SelectorOperator {
    pub fn as_str(self) -> &'static str {
        match self {
            SelectorOperator::In => "In",
            SelectorOperator::NotIn => "NotIn",
            SelectorOperator::Exists => "Exists",
            SelectorOperator::DoesNotExist => "DoesNotExist",
        }
    }
}

impl NodeSelectorTerm {
    /// True when a node with these labels is selected (`{}` selects every node).
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let labels_ok = self
            .match_labels
            .iter()
            .flatten()
            .all(|(k, v)| labels.get(k) == Some(v));
        let exprs_ok = self.match_expressions.iter().flatten().all(|r| {
            let values = r.values.as_deref().unwrap_or_default();
            match r.operator {
                SelectorOperator::In => labels.get(&r.key).is_some_and(|v| values.contains(v)),
                SelectorOperator::NotIn => labels.get(&r.key).is_none_or(|v| !values.contains(v)),
                SelectorOperator::Exists => labels.contains_key(&r.key),
                SelectorOperator::DoesNotExist => !labels.contains_key(&r.key),
            }
        });
        labels_ok && exprs_ok
    }

    pub fn to_label_selector(&self) -> LabelSelector {
        LabelSelector {
            match_labels: self.match_labels.clone(),
            match_expressions: self.match_expressions.as_ref().map(|exprs| {
                exprs
                    .iter()
                    .map(|r| LabelSelectorRequirement {
                        key: r.key.clone(),
                        operator: r.operator.as_str().to_string(),
                        values: r.values.clone(),
                    })
                    .collect()
            }),
        }
    }
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpgradePolicy {
    /// Cordon and drain of a node before its module is swapped.
    #[serde(default)]
    pub drain: DrainPolicy,

    /// Last resort: SIGKILL processes holding /dev/tenstorrent before unloading.
    #[serde(default)]
    pub force_unload: bool,

    /// Most nodes out of service at once during a rollout: an integer >= 1 or a
    /// percentage of matched nodes (rounded down, at least 1).
    #[serde(default = "default_max_unavailable")]
    #[schemars(extend("maxLength" = 4, "x-kubernetes-validations" = [{
        "rule": "type(self) == int ? self >= 1 : self.matches('^(100|[1-9][0-9]?)%$')",
        "message": "maxUnavailable must be an integer >= 1 or a percentage between 1% and 100%"
    }]))]
    pub max_unavailable: IntOrString,

    /// Build ahead: each node's installer builds and verifies the target
    /// version into the node's cache while the node keeps serving, before its
    /// cordon, so the disruptive window holds a load from the cache, not a
    /// build.
    #[serde(default)]
    pub prepare: PreparePolicy,

    /// The check after each swap, before the node goes back into service:
    /// the new module must serve every Tenstorrent function and device node
    /// the old one served, with every card's attributes readable.
    #[serde(default)]
    pub validation: ValidationPolicy,

    /// What the installer does when the new module fails validation:
    /// `rollback` loads the previous version again from the node's cache and
    /// returns the node to service on it; `hold` keeps the new version loaded
    /// and the node cordoned for a person. Either way the node is Failed
    /// (ValidationFailed) and the rollout halts.
    #[serde(default)]
    pub on_validation_failure: OnValidationFailure,

    /// Seconds to watch each upgraded node before the next one starts. The
    /// rollout halts (the node Failed, reason SoakFailed) when, during its
    /// soak, the node goes NotReady, its installer stops reporting the
    /// module, or a pod using its devices crash-loops. 0: no soak.
    #[serde(default)]
    #[schemars(range(min = 0, max = 604800))]
    pub soak_seconds: i64,

    /// When new cycles may start. Empty: any time. Outside every window no
    /// node starts a cycle (cycles in progress finish, build-ahead goes on).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), extend("x-kubernetes-list-type" = "atomic"))]
    pub maintenance_windows: Vec<MaintenanceWindow>,
}

/// One `upgradePolicy.maintenanceWindows[]` entry: a daily span of local
/// time on some days of the week.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "self.start != self.end",
    "message": "a maintenance window's start and end must differ (an end before the start runs past midnight)"
}]))]
pub struct MaintenanceWindow {
    /// The days the window opens on, in its time zone (a window past
    /// midnight belongs to the day it opens on). Empty: every day.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 7), extend("x-kubernetes-list-type" = "set"))]
    pub days: Vec<Weekday>,
    /// Opening time, `HH:MM` (24-hour clock, local time).
    #[schemars(length(max = 5), regex(pattern = r"^([01][0-9]|2[0-3]):[0-5][0-9]$"))]
    pub start: String,
    /// Closing time, `HH:MM`, or `24:00`; before `start` the window runs
    /// past midnight into the next day.
    #[schemars(
        length(max = 5),
        regex(pattern = r"^(([01][0-9]|2[0-3]):[0-5][0-9]|24:00)$")
    )]
    pub end: String,
    /// IANA time zone of `start` and `end`, e.g. `Europe/Berlin`.
    #[serde(default = "utc")]
    #[schemars(length(min = 1, max = 64), regex(pattern = r"^[A-Za-z0-9_+./-]+$"))]
    pub time_zone: String,
}

/// A day of the week.
#[derive(
    Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, JsonSchema,
)]
pub enum Weekday {
    Mon,
    Tue,
    Wed,
    Thu,
    Fri,
    Sat,
    Sun,
}

fn utc() -> String {
    "UTC".to_string()
}

impl Default for UpgradePolicy {
    fn default() -> Self {
        Self {
            drain: DrainPolicy::default(),
            force_unload: false,
            max_unavailable: default_max_unavailable(),
            prepare: PreparePolicy::default(),
            validation: ValidationPolicy::default(),
            on_validation_failure: OnValidationFailure::default(),
            soak_seconds: 0,
            maintenance_windows: Vec::new(),
        }
    }
}

/// `upgradePolicy.validation`.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ValidationPolicy {
    /// Seconds the new module has, after its load, to serve every card the
    /// old one served (cards probe and device nodes appear asynchronously).
    #[serde(default = "default_validation_timeout")]
    #[schemars(range(min = 1, max = 3600))]
    pub timeout_seconds: i64,
    /// Your own check, after the module's: the name of a PodTemplate in the
    /// operator's namespace. Once the new module validated, the controller
    /// runs a pod of it on the node (still cordoned), and the node goes back
    /// into service only when that pod succeeds within `timeoutSeconds`; a
    /// pod that fails or runs longer fails the node (`ValidationFailed`,
    /// kept cordoned on the new version).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub pod_template_name: Option<String>,
}

impl Default for ValidationPolicy {
    fn default() -> Self {
        Self {
            timeout_seconds: DEFAULT_VALIDATION_TIMEOUT_SECONDS,
            pod_template_name: None,
        }
    }
}

/// Default of `upgradePolicy.validation.timeoutSeconds`.
pub const DEFAULT_VALIDATION_TIMEOUT_SECONDS: i64 = 60;

fn default_validation_timeout() -> i64 {
    DEFAULT_VALIDATION_TIMEOUT_SECONDS
}

/// `upgradePolicy.onValidationFailure`.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OnValidationFailure {
    /// Load the previous version again and return the node to service on it.
    #[default]
    Rollback,
    /// Keep the new version loaded and the node cordoned for a person.
    Hold,
}

impl OnValidationFailure {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Rollback => "rollback",
            Self::Hold => "hold",
        }
    }

    /// From the installer's environment (`rollback` or `hold`).
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim() {
            "rollback" => Some(Self::Rollback),
            "hold" => Some(Self::Hold),
            _ => None,
        }
    }
}

/// `upgradePolicy.prepare`: build the target ahead of each node's cordon.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PreparePolicy {
    /// Replace installer pods ahead of their node's cycle so each builds the
    /// target at low priority (nice 19) while the node serves; a node is
    /// cordoned only once its cache holds the verified module, and a build
    /// that fails fails the node before any cordon. False builds inside the
    /// cordon window, as before.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Nodes building ahead at once (each pulls the installer image and
    /// clones the source): bounds the load on the registry and the git host.
    #[serde(default = "default_prepare_max_concurrent")]
    #[schemars(range(min = 1, max = 1000))]
    pub max_concurrent: i32,
    /// Next-kernel preflight: the installer also builds and caches the target
    /// for every other kernel installed with headers on its node, so a reboot
    /// into it loads from the cache; a kernel the target does not build for
    /// is reported (label `kmd-next-kernel-failed`, Event
    /// NextKernelBuildFailed) before anyone reboots into it.
    #[serde(default = "yes")]
    pub next_kernels: bool,
}

impl Default for PreparePolicy {
    fn default() -> Self {
        Self {
            enabled: true,
            max_concurrent: default_prepare_max_concurrent(),
            next_kernels: true,
        }
    }
}

/// Default of `upgradePolicy.prepare.maxConcurrent`.
pub const DEFAULT_PREPARE_MAX_CONCURRENT: i32 = 10;

fn default_prepare_max_concurrent() -> i32 {
    DEFAULT_PREPARE_MAX_CONCURRENT
}

fn default_max_unavailable() -> IntOrString {
    IntOrString::Int(1)
}

impl UpgradePolicy {
    /// Resolves `maxUnavailable` against the number of matched nodes (never below 1).
    pub fn max_unavailable_for(&self, matched: usize) -> usize {
        match &self.max_unavailable {
            IntOrString::Int(n) => usize::try_from(*n).unwrap_or(1).max(1),
            IntOrString::String(s) => {
                let pct: usize = s.trim_end_matches('%').parse().unwrap_or(0);
                (matched * pct / 100).max(1)
            }
        }
    }
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DrainPolicy {
    /// Cordon and evict device users before the module is swapped.
    #[serde(default = "yes")]
    pub enable: bool,
    /// Pass 2: evict every non-DaemonSet pod on the node (kubectl drain semantics).
    #[serde(default = "yes")]
    pub full_node: bool,
    /// Restricts pass 2 to matching pods: `key=value`, `key!=value`, `key`, `!key`,
    /// `key in (a,b)`, `key notin (a,b)`, comma-separated. Empty sweeps everything.
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
    /// Evict bare pods (no controller) instead of reporting them as blockers.
    #[serde(default)]
    pub force: bool,
    /// Evict pods with emptyDir volumes in pass 2 (their data is lost).
    #[serde(default = "yes")]
    pub delete_empty_dir: bool,
    /// Per-node drain deadline; the node goes Failed when pods remain after it.
    #[serde(default = "default_drain_timeout")]
    #[schemars(range(min = 1, max = 86400))]
    pub timeout_seconds: i64,
}

impl Default for DrainPolicy {
    fn default() -> Self {
        Self {
            enable: true,
            full_node: true,
            pod_selector_label: String::new(),
            force: false,
            delete_empty_dir: true,
            timeout_seconds: default_drain_timeout(),
        }
    }
}

fn yes() -> bool {
    true
}

fn default_drain_timeout() -> i64 {
    600
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Installer {
    /// Installer (node agent) image, `[registry/]repository[:tag][@sha256:<hex>]`;
    /// empty means the chart's `driver.image`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = IMAGE_MAX_LENGTH))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": format!("self == '' || self.matches({})", cel_string(IMAGE_PATTERN)),
        "message": "image must be an image reference [registry[:port]/]repository[:tag][@sha256:<64 hex>], with a lowercase repository and no whitespace"
    }]))]
    pub image: Option<String>,
    /// Pull policy of the installer image: Always, IfNotPresent or Never.
    #[serde(default)]
    pub image_pull_policy: PullPolicy,
    /// Git URL of tt-kmd sources (mirror for air-gapped sites); empty means the
    /// chart's default, itself defaulting to the public repository.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = SOURCE_REPOSITORY_MAX_LENGTH))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": format!("self.matches({})", cel_string(SOURCE_REPOSITORY_PATTERN)),
        "message": "sourceRepository must be a git URL over https or ssh (https://host/path, ssh://[user@]host/path or user@host:path) without whitespace or control characters"
    }]))]
    pub source_repository: Option<String>,
    /// The full git commit (40 or 64 hex digits) the version's tag
    /// `ttkmd-<version>` must name; a tag that moved is refused before any
    /// build. Empty means the chart's table (`driver.sourceCommits`), and
    /// a version in neither is built unpinned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self == '' || self.matches('^[0-9a-fA-F]{40}([0-9a-fA-F]{24})?$')",
        "message": "sourceCommit must be a full git commit: 40 or 64 hex digits"
    }]))]
    pub source_commit: Option<String>,
    /// A Secret in the operator's namespace (beside the installer DaemonSet)
    /// holding the key pair the installer signs the built module with, for
    /// hosts that enforce module signatures (Secure Boot): `tls.key` (the
    /// private key, PEM) and `tls.crt` (its X.509 certificate, PEM or DER),
    /// as `kubectl create secret tls` makes it. Each host must trust the
    /// certificate (enrolled with `mokutil --import`). Empty means the module
    /// is not signed. See docs/security.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = SECRET_NAME_MAX_LENGTH))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": format!("self == '' || self.matches({})", cel_string(SECRET_NAME_PATTERN)),
        "message": "signingSecret must be the name of a Secret: a lowercase DNS subdomain (a-z, 0-9, '-' and '.', starting and ending alphanumeric, at most 253 characters)"
    }]))]
    pub signing_secret: Option<String>,
}

impl Default for Installer {
    fn default() -> Self {
        Self {
            image: None,
            image_pull_policy: PullPolicy::IfNotPresent,
            source_repository: None,
            source_commit: None,
            signing_secret: None,
        }
    }
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum PullPolicy {
    Always,
    #[default]
    IfNotPresent,
    Never,
}

impl PullPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            PullPolicy::Always => "Always",
            PullPolicy::IfNotPresent => "IfNotPresent",
            PullPolicy::Never => "Never",
        }
    }
}

/// Observed state, written by the controller only when something changed.
// Read leniently (see the `Deserialize` impl below): a status this controller
// did not write (the Go operator's, or garbage) never fails to parse, so one
// such policy cannot break the list of every policy.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", remote = "Self")]
pub struct TenstorrentDriverPolicyStatus {
    /// Set (never stored) when the status on the object did not parse: why.
    /// The controller replaces such a status with its own, with an Event.
    #[serde(skip)]
    #[schemars(skip)]
    pub unreadable: Option<String>,
    /// The spec generation (metadata.generation) this status reflects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Ready, Progressing, Degraded, Paused, Conflict.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The tt-kmd version the controller is rolling out (spec.version as last read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_version: Option<String>,
    /// Derived from the summary (the Go operator's field): Ready, Progressing,
    /// Degraded, Paused. See docs/crd-reference.md for the mapping.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(default)]
    pub summary: Summary,
    /// Name of the DaemonSet rendered for this policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daemon_set: Option<String>,
    /// One entry per matched node, in rollout order.
    // Always written, an empty list too: the status is a merge patch, and an
    // omitted list would leave the entries of nodes the policy no longer has.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub nodes: Vec<NodeStatus>,
}

impl Serialize for TenstorrentDriverPolicyStatus {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        TenstorrentDriverPolicyStatus::serialize(self, s)
    }
}

impl<'de> Deserialize<'de> for TenstorrentDriverPolicyStatus {
    /// Never fails on a well-formed JSON value: a status that does not parse
    /// as ours (missing fields, unknown node states, another shape) reads as
    /// the empty status with [`Self::unreadable`] saying why.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = serde_json::Value::deserialize(d)?;
        Ok(
            TenstorrentDriverPolicyStatus::deserialize(&raw).unwrap_or_else(|e| {
                TenstorrentDriverPolicyStatus {
                    unreadable: Some(e.to_string()),
                    ..Default::default()
                }
            }),
        )
    }
}

impl TenstorrentDriverPolicyStatus {
    /// A status this controller did not write and cannot read.
    pub fn is_unreadable(&self) -> bool {
        self.unreadable.is_some()
    }
}

/// Node counts. The Go operator's fields (`matched, desired, ready,
/// available, failed, upToDate, inProgress`, with `failed = desired −
/// available`) keep their names and meaning; ours (`done, pending,
/// failedNodes, hostManaged`) sit beside them. See docs/crd-reference.md.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// Nodes the policy selects (Go and ours).
    #[serde(default)]
    pub matched: i32,
    /// Go: nodes that should run the installer; every matched node.
    #[serde(default)]
    pub desired: i32,
    /// Go: nodes with the target module loaded (Uncordoning or Done).
    #[serde(default)]
    pub ready: i32,
    /// Go: nodes back in service at the target (Done, host-managed too).
    #[serde(default)]
    pub available: i32,
    /// Go: `desired − available`, every node not yet Done (in a rollout too).
    /// The nodes in state Failed are `failedNodes`, which the printed Failed
    /// column shows; this field stays for tools that read it.
    #[serde(default)]
    pub failed: i32,
    /// Go: nodes at the target version (as `ready`).
    #[serde(default)]
    pub up_to_date: i32,
    /// Nodes in Cordoning, Draining, Upgrading or Uncordoning (Go and ours).
    #[serde(default)]
    pub in_progress: i32,
    /// Nodes Done with the module this controller installed.
    #[serde(default)]
    pub done: i32,
    /// Nodes waiting for a slot.
    #[serde(default)]
    pub pending: i32,
    /// Nodes in state Failed (the rollout halts while there is one).
    #[serde(default)]
    pub failed_nodes: i32,
    /// Nodes Done because DKMS manages the module there.
    #[serde(default)]
    pub host_managed: i32,
    /// Nodes holding the target: loaded, or built and verified ahead into
    /// their cache (`upgradePolicy.prepare`).
    #[serde(default)]
    pub prepared: i32,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    /// Name of the node.
    pub name: String,
    /// Where the node is in its upgrade.
    pub state: NodeState,
    /// tt-kmd version loaded on the node, as its agent reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_version: Option<String>,
    /// `container` when this operator installs the module, `host` when DKMS
    /// does (the node is left alone), as its agent reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub install_mode: Option<String>,
    /// tt-kmd version the agent built and verified into the node's cache for
    /// the running kernel before its go-ahead (the swap loads it from the
    /// cache), as its agent reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prepared_version: Option<String>,
    /// An installed, not yet running kernel the target does not build for, as
    /// its agent reports it: a reboot into it would find no module. A warning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_kernel_build_failed: Option<String>,
    /// The tt-kmd module parameters in effect on the node, as its agent
    /// reports them (annotation `driver.tenstorrent.com/kmd-parameters`,
    /// `name=value` sorted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module_parameters: Option<String>,
    /// Why the node is in its state, one CamelCase word (docs/crd-reference.md lists them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The Go operator's code for `reason` where it had one (HostManagedKMD,
    /// BuilderImagePullFailed, BuilderCrashLoop), for Go-era scripts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub go_reason: Option<String>,
    /// What happened, in words, for a person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When the node last changed state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
}

/// Per-node upgrade state, as the spec names them.
#[derive(
    Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
pub enum NodeState {
    Pending,
    Cordoning,
    Draining,
    Upgrading,
    Uncordoning,
    Done,
    Failed,
    /// `spec.unmanage`: the node is cordoned and drained, its installer
    /// unloads the module.
    Unloading,
    /// `spec.unmanage`: vacated and left alone (DKMS or nothing from here on).
    Unmanaged,
    /// `spec.unmanage`: the vacate cycle failed; the policy's other nodes wait.
    UnloadFailed,
}

impl NodeState {
    pub const ALL: [NodeState; 10] = [
        NodeState::Pending,
        NodeState::Cordoning,
        NodeState::Draining,
        NodeState::Upgrading,
        NodeState::Uncordoning,
        NodeState::Done,
        NodeState::Failed,
        NodeState::Unloading,
        NodeState::Unmanaged,
        NodeState::UnloadFailed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Pending => "Pending",
            NodeState::Cordoning => "Cordoning",
            NodeState::Draining => "Draining",
            NodeState::Upgrading => "Upgrading",
            NodeState::Uncordoning => "Uncordoning",
            NodeState::Done => "Done",
            NodeState::Failed => "Failed",
            NodeState::Unloading => "Unloading",
            NodeState::Unmanaged => "Unmanaged",
            NodeState::UnloadFailed => "UnloadFailed",
        }
    }

    /// A failed cycle: halts the policy's rollout until retried.
    pub fn is_failed(self) -> bool {
        matches!(self, NodeState::Failed | NodeState::UnloadFailed)
    }

    /// States in which the node is out of service because of us.
    pub fn is_in_progress(self) -> bool {
        matches!(
            self,
            NodeState::Cordoning
                | NodeState::Draining
                | NodeState::Upgrading
                | NodeState::Uncordoning
                | NodeState::Unloading
        )
    }
}

/// The condition types of a policy's `status.conditions[]` (each listed in
/// docs/crd-reference.md, checked by core/tests/documented_reasons.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ConditionType {
    Ready,
    Progressing,
    Degraded,
    Paused,
    Conflict,
    /// Build ahead (`upgradePolicy.prepare`): every node that will load the
    /// target holds it, loaded or built into its cache.
    Prepared,
    /// A warning: some node has an installed, not running kernel the target
    /// does not build for (`status.nodes[].nextKernelBuildFailed`).
    NextKernelBuildFailed,
}

impl ConditionType {
    pub const ALL: [ConditionType; 7] = [
        ConditionType::Ready,
        ConditionType::Progressing,
        ConditionType::Degraded,
        ConditionType::Paused,
        ConditionType::Conflict,
        ConditionType::Prepared,
        ConditionType::NextKernelBuildFailed,
    ];

    /// The `type` as written in the status.
    pub const fn as_str(self) -> &'static str {
        match self {
            ConditionType::Ready => "Ready",
            ConditionType::Progressing => "Progressing",
            ConditionType::Degraded => "Degraded",
            ConditionType::Paused => "Paused",
            ConditionType::Conflict => "Conflict",
            ConditionType::Prepared => "Prepared",
            ConditionType::NextKernelBuildFailed => "NextKernelBuildFailed",
        }
    }
}

impl std::fmt::Display for ConditionType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::labels;
    use kube::CustomResourceExt;

    #[test]
    fn minimum_cr_gets_documented_defaults() {
        let spec: TenstorrentDriverPolicySpec =
            serde_yaml::from_str("version: \"2.8.0\"\nnodeAffinity: {}\n").expect("parses");
        assert!(!spec.paused);
        assert_eq!(spec.upgrade_policy, UpgradePolicy::default());
        assert!(spec.upgrade_policy.drain.enable && spec.upgrade_policy.drain.full_node);
        assert_eq!(spec.upgrade_policy.drain.timeout_seconds, 600);
        assert_eq!(spec.upgrade_policy.max_unavailable, IntOrString::Int(1));
        assert_eq!(spec.installer.image_pull_policy, PullPolicy::IfNotPresent);
        assert_eq!(spec.selector(), Some(&NodeSelectorTerm::default()));
    }

    #[test]
    fn selector_matching() {
        let term: NodeSelectorTerm = serde_yaml::from_str(
            "matchLabels: {pool: prod}\nmatchExpressions:\n- {key: zone, operator: NotIn, values: [b]}\n- {key: gpu, operator: DoesNotExist}\n",
        )
        .expect("parses");
        assert!(term.matches(&labels(&[("pool", "prod")])));
        assert!(term.matches(&labels(&[("pool", "prod"), ("zone", "a")])));
        assert!(!term.matches(&labels(&[("pool", "prod"), ("zone", "b")])));
        assert!(!term.matches(&labels(&[("pool", "prod"), ("gpu", "x")])));
        assert!(!term.matches(&labels(&[("pool", "canary")])));
        assert!(NodeSelectorTerm::default().matches(&labels(&[])));
    }

    #[test]
    fn max_unavailable_resolution() {
        let mut p = UpgradePolicy::default();
        assert_eq!(p.max_unavailable_for(10), 1);
        p.max_unavailable = IntOrString::String("25%".into());
        assert_eq!(p.max_unavailable_for(10), 2);
        assert_eq!(p.max_unavailable_for(2), 1, "rounds down but never below 1");
        p.max_unavailable = IntOrString::Int(3);
        assert_eq!(p.max_unavailable_for(10), 3);
    }

    #[test]
    fn crd_has_identity_and_validations() {
        let crd = serde_json::to_string(&TenstorrentDriverPolicy::crd()).expect("serializes");
        for needle in [
            "\"scope\":\"Cluster\"",
            "\"shortNames\":[\"ttdp\"]",
            "x-kubernetes-validations",
            "x-kubernetes-int-or-string",
            "\"subresources\":{\"status\":{}}",
        ] {
            assert!(crd.contains(needle), "CRD lacks {needle}");
        }
    }

    /// Every string, list and map of the spec has a bound, so a policy has a
    /// bounded size (status is written by the controller only).
    #[test]
    fn every_spec_string_list_and_map_is_bounded() {
        fn walk(path: &str, s: &serde_json::Value, unbounded: &mut Vec<String>) {
            let ty = s["type"].as_str().unwrap_or_default();
            let has = |k: &str| s.get(k).is_some();
            match ty {
                "string" if !has("maxLength") && !has("enum") => unbounded.push(path.into()),
                "array" if !has("maxItems") => unbounded.push(path.into()),
                "object" if has("additionalProperties") && !has("maxProperties") => {
                    unbounded.push(path.into())
                }
                _ => {}
            }
            if s["x-kubernetes-int-or-string"] == true && !has("maxLength") {
                unbounded.push(path.into());
            }
            if let Some(props) = s["properties"].as_object() {
                for (k, v) in props {
                    walk(&format!("{path}.{k}"), v, unbounded);
                }
            }
            for k in ["items", "additionalProperties"] {
                if s[k].is_object() {
                    walk(&format!("{path}.{k}"), &s[k], unbounded);
                }
            }
        }
        let crd = serde_json::to_value(TenstorrentDriverPolicy::crd()).expect("serializes");
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        let mut unbounded = Vec::new();
        walk("spec", spec, &mut unbounded);
        assert!(unbounded.is_empty(), "unbounded: {unbounded:?}");
        let root = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
        assert_eq!(
            root["x-kubernetes-validations"][0]["rule"],
            "oldSelf.hasValue() || size(self.metadata.name) <= 63"
        );
    }

    /// What the Go operator writes: `phase`, a summary without `done`, a
    /// node state this controller does not have.
    const GO_STATUS: &str = r#"{
        "observedGeneration": 3, "phase": "Rolling", "desiredVersion": "2.7.0",
        "conditions": [{"type": "Progressing", "status": "True", "reason": "Rolling",
                        "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
        "summary": {"matched": 2, "desired": 2, "ready": 1, "available": 1, "failed": 1,
                    "upToDate": 1, "inProgress": 1},
        "daemonSet": "ttdrv-fleet",
        "nodes": [{"name": "n1", "state": "HostManaged", "reason": "HostManagedKMD"},
                  {"name": "n2", "state": "Upgrading", "currentVersion": "2.6.0"}]
    }"#;

    fn policy_with_status(status: &str) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "driver.tenstorrent.com/v1alpha1",
            "kind": "TenstorrentDriverPolicy",
            "metadata": {"name": "fleet"},
            "spec": {"version": "2.8.0"},
            "status": serde_json::from_str::<serde_json::Value>(status).expect("json"),
        })
    }

    #[test]
    fn a_foreign_status_reads_as_unreadable_not_as_an_error() {
        for status in [
            GO_STATUS,
            r#""garbage""#,
            r#"[1, 2, 3]"#,
            r#"{"summary": {"done": "many"}}"#,
            r#"{"nodes": [{"name": "n1", "state": "Unwell"}]}"#,
        ] {
            let p: TenstorrentDriverPolicy =
                serde_json::from_value(policy_with_status(status)).expect(status);
            let s = p.status.expect("a status");
            assert!(s.is_unreadable(), "{status}");
            assert_eq!(s.nodes, vec![], "{status}");
            // Never written back as such: the flag is not part of the object.
            let back = serde_json::to_value(&s).expect("serializes");
            assert!(back.get("unreadable").is_none());
        }
        // A list with one foreign status still parses, every item.
        let list = serde_json::json!({
            "apiVersion": "driver.tenstorrent.com/v1alpha1",
            "kind": "TenstorrentDriverPolicyList",
            "metadata": {},
            "items": [policy_with_status(GO_STATUS), policy_with_status("{}")],
        });
        let l: kube::core::ObjectList<TenstorrentDriverPolicy> =
            serde_json::from_value(list).expect("the list parses");
        assert_eq!(l.items.len(), 2);
        assert!(!l.items[1].status.as_ref().expect("status").is_unreadable());
    }

    #[test]
    fn our_status_round_trips_and_is_readable() {
        let s = TenstorrentDriverPolicyStatus {
            observed_generation: Some(2),
            desired_version: Some("2.8.0".into()),
            summary: Summary {
                matched: 1,
                done: 1,
                ..Summary::default()
            },
            nodes: vec![NodeStatus {
                name: "n1".into(),
                state: NodeState::Done,
                current_version: Some("2.8.0".into()),
                install_mode: None,
                prepared_version: None,
                next_kernel_build_failed: None,
                module_parameters: None,
                reason: None,
                go_reason: None,
                message: None,
                last_transition_time: None,
            }],
            ..Default::default()
        };
        let v = serde_json::to_value(&s).expect("serializes");
        let back: TenstorrentDriverPolicyStatus = serde_json::from_value(v).expect("parses");
        assert_eq!(back, s);
        assert!(!back.is_unreadable());
    }
}
