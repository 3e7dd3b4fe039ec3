//! One disruption at a time: which maintenance cycle has a node out of
//! service, as the Node tells. A driver cycle and a firmware cycle never
//! overlap on a node: each machine waits while the other holds it
//! ([`crate::machine::Observation::firmware_cycle`],
//! [`crate::firmware::Observation::driver_cycle`]). The records on the Node
//! are the persisted claim (a restarted controller reads them); the
//! controller's in-process registry closes the instant between two actors'
//! decisions and their writes.

use k8s_openapi::api::core::v1::Node;
use ttdrv_api::firmware::labels as fw;
use ttdrv_api::labels;

use crate::firmware::FwRecord;
use crate::node::{annotation, unschedulable};

/// Who holds a node's maintenance claim.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Holder {
    /// A TenstorrentDriverPolicy's cycle.
    Driver(String),
    /// A TenstorrentFirmwarePolicy's cycle (ours or the Go operator's).
    Firmware(String),
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Holder::Driver(p) => write!(f, "the driver policy {p}'s upgrade"),
            Holder::Firmware(p) => write!(f, "the firmware policy {p}'s flash cycle"),
        }
    }
}

/// A driver cycle holds the node: its record is mid-cycle, or its go-ahead
/// for a swap is on the node.
pub fn driver_cycle(node: &Node) -> Option<Holder> {
    if let Ok(Some(r)) = crate::node::record(node)
        && r.state.is_in_progress()
    {
        return Some(Holder::Driver(r.policy));
    }
    annotation(node, labels::GO_AHEAD)
        .and_then(|g| serde_json::from_str::<crate::go_ahead::GoAhead>(g).ok())
        .map(|g| Holder::Driver(g.policy))
}

/// The firmware record persisted on the node, if it has a readable one.
pub fn firmware_record(node: &Node) -> Option<FwRecord> {
    annotation(node, fw::RECORD).and_then(|r| serde_json::from_str(r).ok())
}

/// A firmware cycle holds the node: our firmware record is mid-cycle, or a
/// firmware cordon (ours kept over a failed flash, or the Go firmware
/// controller's) is on it.
pub fn firmware_cycle(node: &Node) -> Option<Holder> {
    if let Some(r) = firmware_record(node)
        && r.state.is_in_progress()
    {
        return Some(Holder::Firmware(r.policy));
    }
    annotation(node, fw::CORDONED_BY)
        .filter(|_| unschedulable(node))
        .map(|p| Holder::Firmware(p.to_string()))
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
        assert_eq!(firmware_cycle(&n), Some(Holder::Firmware("fw".into())));
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
        assert_eq!(firmware_cycle(&n), Some(Holder::Firmware("go-fw".into())));

        let mut d = crate::machine::NodeRecord::new("drv", "2.8.0", 0);
        d.state = ttdrv_api::NodeState::Draining;
        annotate(
            &mut n,
            labels::UPGRADE_STATE,
            &serde_json::to_string(&d).expect("json"),
        );
        assert_eq!(driver_cycle(&n), Some(Holder::Driver("drv".into())));
        assert!(Holder::Driver("drv".into()).to_string().contains("drv"));
    }
}
