//! What a Node says, read the same way by every program: readiness, whether it
//! is out of service for a reason that is not ours, its driver labels, the
//! upgrade record we persisted on it, and an operator's retry request.

use k8s_openapi::api::core::v1::{Node, Pod};
use ttdrv_api::labels;
use ttdrv_api::module_params::{self, Values};
use ttdrv_api::vfio::{self, Passthrough, PciFunctions};

use crate::firmware::FwRecord;
use crate::record::NodeRecord;

/// Annotation an operator sets (to any new value) to retry a Failed node.
pub const RETRY_ANNOTATION: &str = "driver.tenstorrent.com/retry";

/// A label's value, if the node carries it.
pub fn label<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

/// An annotation's value, if the node carries it.
pub fn annotation<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// The driver labels the agent set describe an earlier boot of the host: the
/// agent recorded the boot ID ([`labels::KMD_BOOT_ID`]) and the kubelet now
/// reports another one. Nothing is known to be loaded until the agent says so
/// again. (Labels from an agent that records no boot ID are taken as they are.)
pub fn driver_labels_stale(node: &Node) -> bool {
    let reported = label(node, labels::KMD_BOOT_ID);
    let booted = node
        .status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .map(|i| i.boot_id.as_str())
        .filter(|b| !b.is_empty());
    matches!((reported, booted), (Some(r), Some(b)) if r != b)
}

/// The module version loaded now, as far as the agent's labels tell: its
/// `kmd-version` label, unless that describes an earlier boot.
pub fn loaded_version(node: &Node) -> Option<&str> {
    if driver_labels_stale(node) {
        return None;
    }
    label(node, labels::KMD_VERSION)
}

/// The agent reported nothing loaded at this boot: it labels the boot ID
/// with every report, and no `kmd-version` with it means no module. (A node
/// without the boot-ID label has no such report: not assumed empty.)
pub fn reported_nothing_loaded(node: &Node) -> bool {
    label(node, labels::KMD_BOOT_ID).is_some()
        && !driver_labels_stale(node)
        && label(node, labels::KMD_VERSION).is_none()
}

/// A DKMS install manages the module (`install-mode=host`), as of this boot.
pub fn host_managed(node: &Node) -> bool {
    !driver_labels_stale(node)
        && label(node, labels::INSTALL_MODE) == Some(labels::INSTALL_MODE_HOST)
}

/// What the VFIO binder reported of the node's Tenstorrent functions at this
/// boot ([`ttdrv_api::vfio::PCI_FUNCTIONS`]); None without a report, with an
/// unreadable one, or with one from an earlier boot (bindings do not survive
/// a reboot): a node is never taken for a passthrough node on a guess.
pub fn pci_functions(node: &Node) -> Option<PciFunctions> {
    let boot = node
        .status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .map(|i| i.boot_id.as_str());
    PciFunctions::at_boot(annotation(node, vfio::PCI_FUNCTIONS)?, boot)
}

/// How the node's Tenstorrent functions are split between tt-kmd and vfio-pci.
pub fn passthrough(node: &Node) -> Passthrough {
    pci_functions(node).map_or(Passthrough::None, |p| p.passthrough())
}

/// The extended resources of the node's passthrough functions: pods using
/// only these run on vfio-pci, not on tt-kmd (a VM), and no drain of ours
/// evicts them.
pub fn vfio_resources(node: &Node) -> Vec<String> {
    pci_functions(node).map_or_else(Vec::new, |p| {
        if p.vfio() > 0 {
            p.vfio_resources
        } else {
            vec![]
        }
    })
}

/// Merge patch removing driver labels that describe an earlier boot, so
/// workloads selecting on `kmd-version` do not land on a node whose module is
/// not loaded yet; the parameters reported with them go too. The boot-ID
/// label stays: it still says the agent has not reported at this boot (the
/// controller keeps a Done node Done until it does).
pub fn stale_labels_patch() -> serde_json::Value {
    serde_json::json!({ "metadata": {
        "labels": { labels::KMD_VERSION: null },
        "annotations": { labels::KMD_PARAMETERS: null },
    } })
}

/// The node carries driver labels of an earlier boot that
/// [`stale_labels_patch`] removes.
pub fn has_stale_labels(node: &Node) -> bool {
    driver_labels_stale(node)
        && (label(node, labels::KMD_VERSION).is_some()
            || annotation(node, labels::KMD_PARAMETERS).is_some())
}

/// The status of the node's (first) Ready condition: "True", "False",
/// "Unknown", or `None` without one.
pub fn ready_status(node: &Node) -> Option<&str> {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.status.as_str())
}

/// The kubelet reports the node Ready (`Unknown` and a missing condition are not).
pub fn ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// What a policy wants loaded on its nodes: a tt-kmd version and the module
/// parameters it sets (`spec.moduleParameters`, canonical values).
#[derive(Clone, Copy, Debug)]
pub struct Target<'a> {
    pub version: &'a str,
    pub parameters: &'a Values,
}

static NO_PARAMETERS: Values = Values::new();

impl<'a> Target<'a> {
    /// `version` with no module parameters asked for.
    pub fn version(version: &'a str) -> Self {
        Self {
            version,
            parameters: &NO_PARAMETERS,
        }
    }

    pub fn new(version: &'a str, parameters: &'a Values) -> Self {
        Self {
            version,
            parameters,
        }
    }
}

/// Whether `loaded` is the version `target`: exact equality after trimming
/// whitespace. `2.10.0-rc1` does not satisfy `2.10.0`.
pub fn same_version(loaded: Option<&str>, target: &str) -> bool {
    loaded.is_some_and(|v| v.trim() == target.trim())
}

/// The one definition of "the target is loaded": the version loaded
/// (`loaded`, as a Node reports it or the agent reads it from sysfs) is the
/// target's ([`same_version`]), and every module parameter the target sets
/// is in effect in `in_effect` (the node's [`labels::KMD_PARAMETERS`]
/// annotation, or sysfs; [`module_params::mismatches`]). A node loaded with
/// other parameters is not at the target: its module is reloaded in a
/// drained cycle like a version change.
pub fn is_loaded(loaded: Option<&str>, in_effect: Option<&Values>, target: Target<'_>) -> bool {
    same_version(loaded, target.version)
        && module_params::mismatches(target.parameters, in_effect).is_empty()
}

/// The target's version is loaded and every parameter that differs is one
/// the module takes at run time ([`module_params::runtime_only`]): the agent
/// writes them through sysfs, so reaching the target needs no reload, no
/// cordon and no drain (the installer pod is replaced in place, a
/// restart-only change).
pub fn takes_at_run_time(
    loaded: Option<&str>,
    in_effect: Option<&Values>,
    target: Target<'_>,
) -> bool {
    same_version(loaded, target.version)
        && module_params::runtime_only(target.parameters, in_effect)
}

/// The loaded module stays for the target: it is the target
/// ([`is_loaded`]), or takes what differs at run time ([`takes_at_run_time`]).
pub fn keeps_module(loaded: Option<&str>, in_effect: Option<&Values>, target: Target<'_>) -> bool {
    is_loaded(loaded, in_effect, target) || takes_at_run_time(loaded, in_effect, target)
}

/// The module parameters in effect as the agent reported them (annotation
/// [`labels::KMD_PARAMETERS`]), unless that describes an earlier boot; None
/// when not reported or unreadable.
pub fn loaded_parameters(node: &Node) -> Option<Values> {
    if driver_labels_stale(node) {
        return None;
    }
    module_params::parse(annotation(node, labels::KMD_PARAMETERS)?).ok()
}

/// `spec.unschedulable`: cordoned, by anyone.
pub fn unschedulable(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

/// Out of service for a reason that is not our rollout: NotReady, or cordoned
/// when we did not cordon it.
pub fn externally_unavailable(node: &Node, cordoned_by_us: bool) -> bool {
    out_of_service_because(node, cordoned_by_us).is_some()
}

/// Why the node is out of service for a reason that is not our rollout, as
/// a rollout that waits on it names it (status, `plan`, an Event); `None`
/// when it is in service or out of service because of us.
pub fn out_of_service_because(node: &Node, cordoned_by_us: bool) -> Option<String> {
    if !ready(node) {
        return Some(format!(
            "NotReady (Ready={})",
            ready_status(node).unwrap_or("missing")
        ));
    }
    if !unschedulable(node) || cordoned_by_us {
        return None;
    }
    Some(foreign_cordon(node))
}

/// The driver policy a firmware policy handed the node's cordon to
/// ([`labels::CORDON_HANDED_OVER_BY`]), if it did.
pub fn handed_over_to(node: &Node) -> Option<&str> {
    annotation(node, labels::CORDON_HANDED_OVER_BY)?;
    annotation(node, labels::GO_CORDONED_BY)
}

/// Who holds a cordon that is not ours, as far as the node tells.
pub fn foreign_cordon(node: &Node) -> String {
    if let (Some(fw), Some(p)) = (
        annotation(node, labels::CORDON_HANDED_OVER_BY),
        handed_over_to(node),
    ) {
        return format!(
            "cordoned by this operator's firmware policy {fw} and handed to the driver policy {p} for its swap \
             (one cordon and drain for both; {}={p})",
            labels::GO_CORDONED_BY
        );
    }
    if let Some(r) = firmware_record(node)
        && annotation(node, labels::GO_FIRMWARE_CORDONED_BY) == Some(r.policy.as_str())
    {
        return format!(
            "cordoned by this operator's firmware policy {} ({}={})",
            r.policy,
            labels::GO_FIRMWARE_CORDONED_BY,
            r.policy
        );
    }
    if let Some(fw) = annotation(node, labels::GO_FIRMWARE_CORDONED_BY) {
        return format!(
            "cordoned by the Go firmware controller for TenstorrentFirmwarePolicy {fw} ({}={fw})",
            labels::GO_FIRMWARE_CORDONED_BY
        );
    }
    if let Some(p) = annotation(node, labels::GO_CORDONED_BY) {
        return format!(
            "cordoned by the Go driver operator for policy {p} ({}={p})",
            labels::GO_CORDONED_BY
        );
    }
    "cordoned by someone else (kubectl cordon or another tool; no annotation names who)".into()
}

/// The firmware record persisted on the node, if it has a readable one.
pub fn firmware_record(node: &Node) -> Option<FwRecord> {
    annotation(node, ttdrv_api::firmware::labels::RECORD).and_then(|r| serde_json::from_str(r).ok())
}

/// The upgrade record persisted on the node, if it has a readable one.
pub fn record(node: &Node) -> Result<Option<NodeRecord>, serde_json::Error> {
    annotation(node, labels::UPGRADE_STATE)
        .map(serde_json::from_str)
        .transpose()
}

/// The node's retry token (value of [`RETRY_ANNOTATION`]).
pub fn retry_token(node: &Node) -> Option<&str> {
    annotation(node, RETRY_ANNOTATION)
}

/// Merge patch that asks the controller to retry a Failed node.
pub fn retry_patch(token: &str) -> serde_json::Value {
    serde_json::json!({ "metadata": { "annotations": { RETRY_ANNOTATION: token } } })
}

/// The pod's Ready condition is True.
pub fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The node's scheduling surface ([`crate::surface::Surface`]) from its
/// Node, its pods, its slices' count and the gated stack's pods on it.
pub fn surface(
    config: &crate::surface::SurfaceConfig,
    node: &Node,
    pods: &[&crate::drain::PodFacts],
    dra_devices: Option<u32>,
    stack: Vec<crate::surface::StackPod>,
) -> crate::surface::Surface {
    use crate::surface::{PublisherPod, is_plugin};
    let plugin_pods = pods
        .iter()
        .filter(|p| !p.finished && is_plugin(config, p))
        .filter_map(|p| {
            let (created, ready_since) = p.daemon_run?;
            Some(PublisherPod {
                pod: p.pod.clone(),
                created,
                ready_since,
                deleting: p.deleting,
            })
        })
        .collect();
    crate::surface::Surface {
        driver: config.driver.clone(),
        plugin_selector: config
            .plugin_selector
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(","),
        cards: label(node, ttdrv_api::labels::KMD_CARDS).and_then(|v| v.parse().ok()),
        plugin_pods,
        dra_devices,
        extended: extended_resources(node),
        stack,
    }
}

/// The node's allocatable `tenstorrent.com/*` resources, summed (the VFIO
/// binder's passthrough resources are not tt-kmd's cards).
fn extended_resources(node: &Node) -> Option<u32> {
    let vfio = vfio_resources(node);
    let alloc = node.status.as_ref()?.allocatable.as_ref()?;
    let mut found = false;
    let mut sum = 0u32;
    for (k, q) in alloc {
        if k.starts_with(ttdrv_api::labels::RESOURCE_PREFIX) && !vfio.contains(k) {
            found = true;
            sum = sum.saturating_add(q.0.parse().unwrap_or(0));
        }
    }
    found.then_some(sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(ready: &str, unschedulable: bool) -> Node {
        crate::fixtures::node("n", ready, unschedulable, &[])
    }

    fn annotate(n: &mut Node, key: &str, value: &str) {
        n.metadata.annotations = Some([(key.to_string(), value.to_string())].into());
    }

    #[test]
    fn availability() {
        assert!(!externally_unavailable(&node("True", false), false));
        assert!(externally_unavailable(&node("False", false), false));
        assert!(
            externally_unavailable(&node("Unknown", false), true),
            "NotReady counts even when the cordon is ours"
        );
        assert!(externally_unavailable(&node("True", true), false));
        assert_eq!(
            out_of_service_because(&node("False", false), false).as_deref(),
            Some("NotReady (Ready=False)")
        );
        assert!(
            out_of_service_because(&node("True", true), false)
                .is_some_and(|w| w.starts_with("cordoned by someone else"))
        );
        let mut fw = node("True", true);
        annotate(&mut fw, labels::GO_FIRMWARE_CORDONED_BY, "fw-a");
        assert_eq!(
            out_of_service_because(&fw, false).as_deref(),
            Some(
                "cordoned by the Go firmware controller for TenstorrentFirmwarePolicy fw-a \
                 (firmware.tenstorrent.com/cordoned-by=fw-a)"
            )
        );
        assert_eq!(out_of_service_because(&fw, true), None, "our own cordon");
        assert!(
            !externally_unavailable(&node("True", true), true),
            "our own cordon is not someone else's"
        );
        assert!(!ready(&Node::default()), "no condition is not Ready");
    }

    #[test]
    fn ready_status_is_the_ready_conditions() {
        assert_eq!(ready_status(&node("Unknown", false)), Some("Unknown"));
        assert_eq!(ready_status(&node("True", true)), Some("True"));
        assert_eq!(ready_status(&Node::default()), None);
    }

    #[test]
    fn labels_of_an_earlier_boot_are_stale() {
        let mut n = node("True", false);
        n.metadata.labels = Some(
            [
                (labels::KMD_VERSION.to_string(), "2.8.0".to_string()),
                (
                    labels::INSTALL_MODE.to_string(),
                    labels::INSTALL_MODE_HOST.to_string(),
                ),
            ]
            .into(),
        );
        assert_eq!(
            loaded_version(&n),
            Some("2.8.0"),
            "no boot ID recorded: as is"
        );
        let boot = |n: &mut Node, id: &str| {
            if let Some(s) = n.status.as_mut() {
                s.node_info = Some(k8s_openapi::api::core::v1::NodeSystemInfo {
                    boot_id: id.into(),
                    ..Default::default()
                });
            }
        };
        boot(&mut n, "boot-1");
        if let Some(l) = n.metadata.labels.as_mut() {
            l.insert(labels::KMD_BOOT_ID.into(), "boot-1".into());
        }
        assert_eq!(loaded_version(&n), Some("2.8.0"));
        assert!(host_managed(&n));
        boot(&mut n, "boot-2");
        assert!(driver_labels_stale(&n));
        assert_eq!(loaded_version(&n), None, "rebooted: nothing known loaded");
        assert!(!host_managed(&n));
        // The clean-up removes kmd-version and keeps the boot ID: the node
        // still reads as rebooted and unreported, and is not patched again.
        assert!(has_stale_labels(&n));
        if let Some(l) = n.metadata.labels.as_mut() {
            l.remove(labels::KMD_VERSION);
        }
        assert!(!has_stale_labels(&n));
        assert!(driver_labels_stale(&n));
        assert!(
            !reported_nothing_loaded(&n),
            "not reported is not nothing loaded"
        );
    }

    #[test]
    fn passthrough_is_read_from_this_boots_report_only() {
        let mut n = node("True", false);
        assert_eq!(passthrough(&n), Passthrough::None, "no report");
        annotate(
            &mut n,
            vfio::PCI_FUNCTIONS,
            r#"{"bootId":"boot-1","drivers":{"vfio-pci":2},"vfioResources":["tenstorrent.com/wh-vfio"]}"#,
        );
        assert_eq!(passthrough(&n), Passthrough::All { vfio: 2 });
        assert_eq!(vfio_resources(&n), ["tenstorrent.com/wh-vfio"]);
        if let Some(s) = n.status.as_mut() {
            s.node_info = Some(k8s_openapi::api::core::v1::NodeSystemInfo {
                boot_id: "boot-2".into(),
                ..Default::default()
            });
        }
        assert_eq!(passthrough(&n), Passthrough::None, "an earlier boot's");
        assert!(vfio_resources(&n).is_empty());
        annotate(&mut n, vfio::PCI_FUNCTIONS, "all of them");
        assert_eq!(passthrough(&n), Passthrough::None, "unreadable: no guess");
    }

    #[test]
    fn the_target_is_its_version_and_its_parameters_in_effect() {
        let four: Values = [("max_devices".to_string(), "4".to_string())].into();
        let t = Target::new("2.8.0", &four);
        let sysfs = |v: &str| -> Values { module_params::parse(v).expect("values") };
        assert!(is_loaded(
            Some("2.8.0"),
            Some(&sysfs("max_devices=4 power_policy=Y")),
            t
        ));
        assert!(!is_loaded(Some("2.8.0"), Some(&sysfs("max_devices=32")), t));
        assert!(
            !is_loaded(Some("2.8.0"), None, t),
            "not reported is not in effect"
        );
        assert!(!is_loaded(Some("2.7.0"), Some(&sysfs("max_devices=4")), t));
        assert!(is_loaded(Some(" 2.8.0\n"), None, Target::version("2.8.0")));
        assert!(!is_loaded(
            Some("2.8.0-rc1"),
            None,
            Target::version("2.8.0")
        ));
        assert!(!is_loaded(None, None, Target::version("2.8.0")));
    }

    #[test]
    fn a_parameter_writable_at_run_time_keeps_the_module() {
        let sysfs = |v: &str| -> Values { module_params::parse(v).expect("values") };
        let want = sysfs("idle_power_down_grace_ms=50 max_devices=4");
        let t = Target::new("2.10.0", &want);
        let loaded = Some("2.10.0");
        // Only the run-time one differs: kept, not at the target yet.
        let only_idle = sysfs("idle_power_down_grace_ms=5000 max_devices=4");
        assert!(!is_loaded(loaded, Some(&only_idle), t));
        assert!(takes_at_run_time(loaded, Some(&only_idle), t));
        assert!(keeps_module(loaded, Some(&only_idle), t));
        // A load-time one differs too: a reload.
        let both = sysfs("idle_power_down_grace_ms=5000 max_devices=32");
        assert!(!takes_at_run_time(loaded, Some(&both), t));
        assert!(!keeps_module(loaded, Some(&both), t));
        // Another version, or nothing reported: a reload.
        assert!(!takes_at_run_time(Some("2.9.0"), Some(&only_idle), t));
        assert!(!takes_at_run_time(loaded, None, t));
        // Nothing differs: at the target, not "at run time".
        let same = sysfs("idle_power_down_grace_ms=50 max_devices=4");
        assert!(!takes_at_run_time(loaded, Some(&same), t));
        assert!(keeps_module(loaded, Some(&same), t));
        // The agent's annotation, stale after a reboot like its labels.
        let mut n = node("True", false);
        annotate(
            &mut n,
            labels::KMD_PARAMETERS,
            "max_devices=4 power_policy=Y",
        );
        assert_eq!(
            loaded_parameters(&n),
            Some(sysfs("max_devices=4 power_policy=Y"))
        );
        n.metadata.labels = Some([(labels::KMD_BOOT_ID.to_string(), "boot-1".to_string())].into());
        if let Some(st) = n.status.as_mut() {
            st.node_info = Some(k8s_openapi::api::core::v1::NodeSystemInfo {
                boot_id: "boot-2".into(),
                ..Default::default()
            });
        }
        assert_eq!(loaded_parameters(&n), None);
    }

    #[test]
    fn unreadable_record_is_an_error_not_a_default() {
        let mut n = Node::default();
        assert!(matches!(record(&n), Ok(None)));
        n.metadata.annotations =
            Some([(labels::UPGRADE_STATE.to_string(), "{not json".to_string())].into());
        assert!(record(&n).is_err());
    }
}
