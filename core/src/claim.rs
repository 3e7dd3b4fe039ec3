//! One disruption at a time: which maintenance cycle has a node out of
//! service, as the Node tells. A driver cycle and a firmware cycle never
//! overlap on a node: each machine waits while the other holds it
//! (each machine's `Observation::held_by`, set from [`driver_cycle`] and
//! [`firmware_cycle`]). The records on the Node
//! are the persisted claim (a restarted controller reads them); the
//! controller's in-process registry closes the instant between two actors'
//! decisions and their writes.

use k8s_openapi::api::core::v1::Node;
use ttdrv_api::firmware::labels as fw;
use ttdrv_api::labels;

use crate::firmware::FwRecord;
use crate::node::{annotation, unschedulable};

pub use crate::slots::Holder;

/// A driver cycle holds the node: its record is mid-cycle, or its go-ahead
/// for a swap is on the node.
pub fn driver_cycle(node: &Node) -> Option<Holder> {
    if let Ok(Some(r)) = crate::node::record(node)
        && r.state.is_in_progress()
    {
        return Some(Holder::driver(r.policy));
    }
    annotation(node, labels::GO_AHEAD)
        .and_then(|g| serde_json::from_str::<crate::go_ahead::GoAhead>(g).ok())
        .map(|g| Holder::driver(g.policy))
}

/// The firmware record persisted on the node, if it has a readable one.
pub fn firmware_record(node: &Node) -> Option<FwRecord> {
    // Read in `node`, which names the firmware policy behind a cordon and
    // must not depend on this module.
    crate::node::firmware_record(node)
}

/// A firmware cycle holds the node: our firmware record is mid-cycle, or a
/// firmware cordon (ours kept over a failed flash, or the Go firmware
/// controller's) is on it.
pub fn firmware_cycle(node: &Node) -> Option<Holder> {
    if let Some(r) = firmware_record(node)
        && r.state.is_in_progress()
    {
        return Some(Holder::firmware(r.policy));
    }
    annotation(node, fw::CORDONED_BY)
        .filter(|_| unschedulable(node))
        .map(|p| Holder::firmware(p.to_string()))
}

/// Better than serial: when both policies have work for a node, the flash
/// goes first and hands its cordon to the driver's swap, so the node is
/// cordoned and drained once for both. The driver policy defers to a flash
/// that only waits for its slot ([`firmware_first`]); the flash, once its
/// cards read back, hands the cordon over ([`handover_to`]) instead of
/// uncordoning.
///
/// The firmware policy whose flash of this node only waits for its slot
/// (record Pending, reason WaitingForSlot): a driver swap due on the node
/// waits for it and takes its cordon after.
pub fn firmware_first(node: &Node) -> Option<String> {
    firmware_record(node)
        .filter(|r| {
            r.state == ttdrv_api::firmware::FirmwareNodeState::Pending
                && r.reason.as_deref() == Some(ttdrv_api::firmware::reason::WAITING_FOR_SLOT)
        })
        .map(|r| r.policy)
}

/// The driver policy a flash of this node hands its cordon to once the
/// cards read back `readback`: the node's driver record is Pending and
/// waits for the firmware (reason WaitingForFirmware), and its policy
/// (`driver`, looked up by the caller from the record's policy name) still
/// claims the node, is not paused and accepts `readback` as its
/// `spec.minFirmwareVersion`. `None`: the flash uncordons as usual.
pub fn handover_to(
    node: &Node,
    driver: impl FnOnce(&str) -> Option<std::sync::Arc<ttdrv_api::TenstorrentDriverPolicy>>,
    readback: &str,
) -> Option<String> {
    let rec = crate::node::record(node).ok().flatten()?;
    if rec.state != ttdrv_api::NodeState::Pending
        || rec.reason.as_deref() != Some(crate::reason::WAITING_FOR_FIRMWARE)
        || crate::node::label(node, labels::CLAIM) != Some(rec.policy.as_str())
    {
        return None;
    }
    let policy = driver(&rec.policy)?;
    let spec = &policy.spec;
    let firmware_ok = spec
        .min_firmware_version
        .as_deref()
        .is_none_or(|min| ttdrv_api::firmware::version_at_least(readback, min));
    (!spec.paused && !spec.unmanage && firmware_ok).then_some(rec.policy)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::node;
    use ttdrv_api::firmware::FirmwareNodeState;

    fn annotate(n: &mut Node, k: &str, v: &str) {
        n.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(k.into(), v.into());
    }

    #[test]
    fn records_and_cordons_name_the_holder() {
        let mut n = node("a", "True", false, &[]);
        assert_eq!((driver_cycle(&n), firmware_cycle(&n)), (None, None));

        let mut fw_rec = FwRecord::new("fw", "19.8.0", 0);
        fw_rec.state = FirmwareNodeState::Flashing;
        annotate(
            &mut n,
            fw::RECORD,
            &serde_json::to_string(&fw_rec).expect("json"),
        );
        assert_eq!(firmware_cycle(&n), Some(Holder::firmware("fw".into())));
        fw_rec.state = FirmwareNodeState::Done;
        annotate(
            &mut n,
            fw::RECORD,
            &serde_json::to_string(&fw_rec).expect("json"),
        );
        assert_eq!(firmware_cycle(&n), None);

        // A firmware cordon counts only while the node is cordoned.
        annotate(&mut n, fw::CORDONED_BY, "go-fw");
        assert_eq!(firmware_cycle(&n), None);
        n.spec.get_or_insert_with(Default::default).unschedulable = Some(true);
        assert_eq!(firmware_cycle(&n), Some(Holder::firmware("go-fw".into())));

        let mut d = crate::machine::NodeRecord::new("drv", "2.8.0", 0);
        d.state = ttdrv_api::NodeState::Draining;
        annotate(
            &mut n,
            labels::UPGRADE_STATE,
            &serde_json::to_string(&d).expect("json"),
        );
        assert_eq!(driver_cycle(&n), Some(Holder::driver("drv".into())));
        assert!(Holder::driver("drv".into()).to_string().contains("drv"));
    }

    fn driver_policy(
        paused: bool,
        min_fw: Option<&str>,
    ) -> std::sync::Arc<ttdrv_api::TenstorrentDriverPolicy> {
        let mut spec = serde_json::json!({"version": "2.8.0", "selector": {"matchLabels": {"pool": "a"}}, "paused": paused});
        if let Some(m) = min_fw {
            spec["minFirmwareVersion"] = m.into();
        }
        std::sync::Arc::new(
            serde_json::from_value(serde_json::json!({
                "apiVersion": "driver.tenstorrent.com/v1alpha1",
                "kind": "TenstorrentDriverPolicy",
                "metadata": {"name": "drv"},
                "spec": spec,
            }))
            .expect("policy"),
        )
    }

    #[test]
    fn a_flash_due_goes_first_and_hands_its_cordon_to_a_waiting_swap() {
        let mut n = node("a", "True", true, &[(labels::CLAIM, "drv")]);
        assert_eq!(firmware_first(&n), None);
        let mut fw_rec = FwRecord::new("fw", "19.8.0", 0);
        fw_rec.reason = Some(ttdrv_api::firmware::reason::WAITING_FOR_SLOT.into());
        annotate(
            &mut n,
            fw::RECORD,
            &serde_json::to_string(&fw_rec).expect("json"),
        );
        assert_eq!(firmware_first(&n), Some("fw".into()));
        fw_rec.reason = Some(ttdrv_api::firmware::reason::PAUSED.into());
        annotate(
            &mut n,
            fw::RECORD,
            &serde_json::to_string(&fw_rec).expect("json"),
        );
        assert_eq!(firmware_first(&n), None, "a paused flash is not waited for");

        let readback = "19.8.0.0";
        let found = |paused, min: Option<&'static str>| {
            move |p: &str| (p == "drv").then(|| driver_policy(paused, min))
        };
        // No driver record: nobody to hand over to.
        assert_eq!(handover_to(&n, found(false, None), readback), None);
        let mut d = crate::machine::NodeRecord::new("drv", "2.8.0", 0);
        d.reason = Some(crate::reason::WAITING_FOR_FIRMWARE.into());
        annotate(
            &mut n,
            labels::UPGRADE_STATE,
            &serde_json::to_string(&d).expect("json"),
        );
        assert_eq!(
            handover_to(&n, found(false, None), readback),
            Some("drv".into())
        );
        assert_eq!(
            handover_to(&n, found(false, Some("19.0.0")), readback),
            Some("drv".into())
        );
        // Not if the swap could not go on under it: paused, or this
        // firmware is still too old for it, or the policy is gone.
        assert_eq!(handover_to(&n, found(true, None), readback), None);
        assert_eq!(
            handover_to(&n, found(false, Some("20.0.0")), readback),
            None
        );
        assert_eq!(handover_to(&n, |_| None, readback), None);
        // Not to a record waiting for something else, or a policy that no
        // longer claims the node.
        d.reason = Some(crate::reason::WAITING.into());
        annotate(
            &mut n,
            labels::UPGRADE_STATE,
            &serde_json::to_string(&d).expect("json"),
        );
        assert_eq!(handover_to(&n, found(false, None), readback), None);
        d.reason = Some(crate::reason::WAITING_FOR_FIRMWARE.into());
        annotate(
            &mut n,
            labels::UPGRADE_STATE,
            &serde_json::to_string(&d).expect("json"),
        );
        n.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(labels::CLAIM.into(), "other".into());
        assert_eq!(handover_to(&n, found(false, None), readback), None);
    }
}
