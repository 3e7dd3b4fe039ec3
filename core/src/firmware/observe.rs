//! One node as a firmware policy sees it, from plain facts (the Node, its
//! pods, the PDBs, the flash Job): which policy flashes it, and the
//! [`Observation`] its cycle steps on, with the drain's next evictions.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use ttdrv_api::firmware::{FirmwareNodeState, TenstorrentFirmwarePolicy, labels as fw};
use ttdrv_api::{DrainPolicy, PodSelector};

use super::{FlashJob, FwRecord, Observation};
use crate::drain::{self, DrainPass, PodFacts, PodRef};
use crate::node::{annotation, label};
use crate::selection::Eligibility;

/// How a firmware policy relates to a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selected {
    No,
    /// Selected, and no other firmware policy owns it.
    Owned,
    /// Selected, but another firmware policy owns it (`owned-by`): left
    /// alone, reported with reason NodeConflict.
    Conflict(String),
}

/// Whether `policy` flashes `node`: selected by its selector, a Tenstorrent
/// node (the chart's eligibility), not `firmware.tenstorrent.com/skip=true`,
/// and owned by no other firmware policy (first come, first served, as Go).
pub fn selects(policy: &TenstorrentFirmwarePolicy, node: &Node, e: Eligibility) -> Selected {
    let empty = Default::default();
    let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
    let tt = !e.require_tenstorrent_label
        || labels
            .get(ttdrv_api::labels::TT_PCI_PRESENT)
            .map(String::as_str)
            == Some("true");
    let picked = node.metadata.deletion_timestamp.is_none()
        && tt
        && labels.get(fw::SKIP).map(String::as_str) != Some("true")
        && policy.spec.selector().is_some_and(|s| s.matches(labels));
    if !picked {
        return Selected::No;
    }
    let name = policy.metadata.name.as_deref().unwrap_or_default();
    match labels.get(fw::OWNED_BY) {
        Some(o) if o != name => Selected::Conflict(o.clone()),
        _ => Selected::Owned,
    }
}

/// The drain settings of a firmware policy, in the driver's terms (the two
/// policies drain with the same code).
pub fn drain_policy(p: &TenstorrentFirmwarePolicy) -> DrainPolicy {
    let d = &p.spec.upgrade_policy.drain;
    DrainPolicy {
        enable: d.enable,
        full_node: d.full_node,
        pod_selector_label: d.pod_selector_label.clone(),
        force: d.force,
        delete_empty_dir: d.delete_empty_dir,
        timeout_seconds: d.timeout_seconds,
    }
}

/// The deploy gates a drained flash closes (`controller.deployGates`), and
/// the DaemonSets of the cluster, whose templates say which pods they stand
/// down ([`drain::stood_down`]).
#[derive(Clone, Copy)]
pub struct Gates<'a> {
    pub keys: &'a [String],
    pub daemon_sets: &'a drain::DaemonSets,
}

impl Gates<'_> {
    /// Some gate is not `false` on the node.
    pub fn open_on(&self, node: &Node) -> bool {
        self.keys.iter().any(|g| label(node, g) != Some("false"))
    }

    /// Some gate label is on the node.
    pub fn present_on(&self, node: &Node) -> bool {
        self.keys.iter().any(|g| label(node, g).is_some())
    }

    /// The node's pods these gates stand down that have not finished
    /// (`namespace/name`, sorted).
    pub fn pods_left(&self, pods: &[&PodFacts]) -> Vec<String> {
        let mut left: Vec<String> = pods
            .iter()
            .filter(|p| !p.finished && drain::stood_down(p, self.daemon_sets, self.keys))
            .map(|p| p.pod.to_string())
            .collect();
        left.sort_unstable();
        left
    }
}

/// The node's firmware facts, and the drain's next evictions when the node
/// drains (`draining`: its record is in Cordoning or Draining, or it may
/// start now).
pub struct NodeView {
    pub obs: Observation,
    pub evictions: Vec<(PodRef, DrainPass)>,
    pub has_device_pods: bool,
}

#[allow(clippy::too_many_arguments)]
pub fn observe<'p>(
    policy: &str,
    node: &Node,
    pods: &[&PodFacts],
    drain_policy: &DrainPolicy,
    selector: Option<&PodSelector>,
    exempt: &[String],
    draining: bool,
    pdbs: impl FnOnce() -> Vec<&'p PodDisruptionBudget>,
    gates: Gates<'_>,
    job: FlashJob,
    now: i64,
) -> NodeView {
    let vfio = crate::node::vfio_resources(node);
    let plan = selector
        .map(|sel| drain::plan_drain(pods.iter().copied(), drain_policy, sel, exempt, &vfio));
    let (progress, evictions) = match (&plan, draining) {
        (Some(plan), true) => {
            let pdbs = pdbs();
            let step = drain::sequence(plan, pods.iter().copied(), &pdbs);
            (Some(step.progress), step.evict)
        }
        _ => (None, vec![]),
    };
    let obs = Observation {
        now,
        node: node.metadata.name.clone().unwrap_or_default(),
        ready: crate::node::ready(node),
        unschedulable: crate::node::unschedulable(node),
        held_by: crate::claim::driver_cycle(node),
        go_cordon_for_us: annotation(node, fw::CORDONED_BY) == Some(policy),
        go_state: label(node, fw::UPGRADE_STATE).and_then(|s| {
            FirmwareNodeState::ALL
                .into_iter()
                .find(|st| st.as_str() == s)
        }),
        current: label(node, fw::FW_VERSION).map(String::from),
        driver_version: label(node, ttdrv_api::labels::KMD_VERSION).map(String::from),
        drain: progress,
        job,
        // The caller's actor knows what it created ([`super::OwnJob`]).
        own_job: super::OwnJob::NotMine,
        retry_token: annotation(node, fw::RETRY).map(String::from),
        slot: false,
        // The caller knows the driver policies ([`crate::claim::handover_to`]).
        driver_waiting: None,
        gates_open: gates.open_on(node),
        gates_present: gates.present_on(node),
        gated_pods_left: if draining {
            gates.pods_left(pods)
        } else {
            vec![]
        },
        // The caller reads the slices ([`crate::node::surface`]).
        surface: crate::surface::Surface::default(),
    };
    NodeView {
        obs,
        evictions,
        has_device_pods: plan.as_ref().map_or_else(
            || pods.iter().any(|p| p.device),
            drain::DrainPlan::has_device_users,
        ),
    }
}

/// The firmware record of `policy` persisted on the node, if any.
pub fn record_of(policy: &str, node: &Node) -> Option<FwRecord> {
    crate::claim::firmware_record(node).filter(|r| r.policy == policy)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::node;

    fn policy(sel: &str) -> TenstorrentFirmwarePolicy {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "firmware.tenstorrent.com/v1alpha1",
            "kind": "TenstorrentFirmwarePolicy",
            "metadata": {"name": "fw"},
            "spec": {"version": "19.8.0", "nodeAffinity": serde_json::from_str::<serde_json::Value>(sel).expect("json")}
        }))
        .expect("policy")
    }

    #[test]
    fn selection_follows_go() {
        let tt = (ttdrv_api::labels::TT_PCI_PRESENT, "true");
        let p = policy(r#"{"matchLabels": {"pool": "a"}}"#);
        let e = Eligibility::default();
        assert_eq!(
            selects(&p, &node("n", "True", false, &[tt, ("pool", "a")]), e),
            Selected::Owned
        );
        assert_eq!(
            selects(&p, &node("n", "True", false, &[("pool", "a")]), e),
            Selected::No
        );
        assert_eq!(
            selects(
                &p,
                &node("n", "True", false, &[("pool", "a")]),
                Eligibility {
                    require_tenstorrent_label: false
                }
            ),
            Selected::Owned
        );
        assert_eq!(
            selects(&p, &node("n", "True", false, &[tt, ("pool", "b")]), e),
            Selected::No
        );
        assert_eq!(
            selects(
                &p,
                &node("n", "True", false, &[tt, ("pool", "a"), (fw::SKIP, "true")]),
                e
            ),
            Selected::No
        );
        assert_eq!(
            selects(
                &p,
                &node(
                    "n",
                    "True",
                    false,
                    &[tt, ("pool", "a"), (fw::OWNED_BY, "other")]
                ),
                e
            ),
            Selected::Conflict("other".into())
        );
        assert_eq!(
            selects(
                &p,
                &node(
                    "n",
                    "True",
                    false,
                    &[tt, ("pool", "a"), (fw::OWNED_BY, "fw")]
                ),
                e
            ),
            Selected::Owned
        );
    }
}
