//! The contract between the VFIO binder (`ttdrv-vfio-manage`, the chart's
//! `vfioManager` DaemonSet) and the driver policy: what the binder reports on
//! its Node, read by the controller (which nodes tt-kmd serves nothing on,
//! which pods on a node use passthrough functions and not tt-kmd's).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// PCI vendor ID of Tenstorrent.
pub const TT_VENDOR_ID: u16 = 0x1e52;
/// The PCI device IDs tt-kmd 2.x serves: Wormhole and Blackhole. Its ID
/// table also lists Grayskull (0xfaca), whose probe returns -ENODEV since
/// 2.0 (no class data): a Grayskull on the bus is never expected to bind.
pub const KMD_SERVED_DEVICE_IDS: [(u16, &str); 2] = [(0x401e, "Wormhole"), (0xb140, "Blackhole")];
/// The kernel driver VM passthrough binds functions to.
pub const VFIO_PCI_DRIVER: &str = "vfio-pci";
/// The name tt-kmd's PCI driver registers (the `tenstorrent` module).
pub const KMD_PCI_DRIVER: &str = "tenstorrent";
/// The key of functions bound to no driver in [`PciFunctions::drivers`].
pub const NO_DRIVER: &str = "none";

/// Node annotation the binder writes after every pass: a JSON
/// [`PciFunctions`]. Absent on nodes without the binder.
pub const PCI_FUNCTIONS: &str = "vfio.tenstorrent.com/pci-functions";
/// Node label the binder sets: the board kinds of the functions it binds
/// (from the PCI subsystem ID: n150, n300, p150, ...), sorted and joined
/// with '.', `unknown` for a board it cannot name.
pub const BOARD_TYPES: &str = "vfio.tenstorrent.com/board-types";

/// Every Tenstorrent PCI function of a node by the driver it is bound to, as
/// the binder saw it at one boot.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PciFunctions {
    /// The host boot ID of the scan: a report from an earlier boot says
    /// nothing about the bindings now (they do not survive a reboot).
    pub boot_id: String,
    /// Function count by driver name ([`NO_DRIVER`] for none).
    pub drivers: BTreeMap<String, u32>,
    /// The binder's resource names (`vfioManager.devices[].resourceName`)
    /// with at least one function bound to vfio-pci on this node: a pod
    /// whose Tenstorrent resources are all among them runs on passthrough
    /// functions (a VM), not on tt-kmd.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vfio_resources: Vec<String>,
}

/// How a node's Tenstorrent functions are split between tt-kmd and vfio-pci.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Passthrough {
    /// No function on vfio-pci (or no report from this boot).
    #[default]
    None,
    /// Some functions on vfio-pci, others not: tt-kmd serves the others.
    Some { vfio: u32, total: u32 },
    /// Every function on vfio-pci: tt-kmd has nothing to serve.
    All { vfio: u32 },
}

impl PciFunctions {
    /// Functions bound to vfio-pci.
    pub fn vfio(&self) -> u32 {
        self.drivers.get(VFIO_PCI_DRIVER).copied().unwrap_or(0)
    }

    pub fn total(&self) -> u32 {
        self.drivers.values().sum()
    }

    pub fn passthrough(&self) -> Passthrough {
        match (self.vfio(), self.total()) {
            (0, _) => Passthrough::None,
            (vfio, total) if vfio == total => Passthrough::All { vfio },
            (vfio, total) => Passthrough::Some { vfio, total },
        }
    }

    /// The annotation's value.
    pub fn to_annotation(&self) -> String {
        // A struct of strings and integers always serialises.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads the annotation; None when it is not a report (the node is then
    /// treated as having no passthrough functions, never skipped on a guess).
    pub fn parse(value: &str) -> Option<Self> {
        serde_json::from_str(value).ok()
    }

    /// The report, if it describes boot `boot_id` (the kubelet's
    /// `status.nodeInfo.bootID`); a report with no boot ID or an unknown
    /// current boot is taken as it is.
    pub fn at_boot(value: &str, boot_id: Option<&str>) -> Option<Self> {
        let p = Self::parse(value)?;
        match boot_id {
            Some(b) if !b.is_empty() && !p.boot_id.is_empty() && b != p.boot_id => None,
            _ => Some(p),
        }
    }
}

/// The board kind of a Tenstorrent PCI function from its subsystem device ID
/// (the board's UPI, as tt-umd and tt-feature-discovery read it). n150 and
/// n300 share the device ID 0x401e: only the subsystem ID tells them apart,
/// and it is readable whatever driver the function is bound to.
pub fn board_type(subsystem_device: u16) -> Option<&'static str> {
    Some(match subsystem_device {
        0x0014 => "n300",
        0x0018 => "n150",
        0x000b => "galaxy",
        0x0035 => "ubb",
        0x0036 | 0x0043 => "p100",
        0x0040..=0x0042 => "p150",
        0x0044..=0x0046 => "p300",
        0x0047 => "ubb_blackhole",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(drivers: &[(&str, u32)]) -> PciFunctions {
        PciFunctions {
            boot_id: "b1".into(),
            drivers: drivers.iter().map(|(d, n)| (d.to_string(), *n)).collect(),
            vfio_resources: vec![],
        }
    }

    #[test]
    fn passthrough_is_read_by_function() {
        assert_eq!(report(&[]).passthrough(), Passthrough::None);
        assert_eq!(
            report(&[("tenstorrent", 2)]).passthrough(),
            Passthrough::None
        );
        assert_eq!(
            report(&[("vfio-pci", 4)]).passthrough(),
            Passthrough::All { vfio: 4 }
        );
        assert_eq!(
            report(&[("vfio-pci", 1), ("tenstorrent", 3)]).passthrough(),
            Passthrough::Some { vfio: 1, total: 4 }
        );
        // An unbound function is one tt-kmd could serve once loaded.
        assert_eq!(
            report(&[("vfio-pci", 1), (NO_DRIVER, 1)]).passthrough(),
            Passthrough::Some { vfio: 1, total: 2 }
        );
    }

    #[test]
    fn the_annotation_round_trips_and_an_earlier_boot_is_ignored() {
        let mut r = report(&[("vfio-pci", 2)]);
        r.vfio_resources = vec!["tenstorrent.com/wormhole".into()];
        let v = r.to_annotation();
        assert_eq!(
            v,
            r#"{"bootId":"b1","drivers":{"vfio-pci":2},"vfioResources":["tenstorrent.com/wormhole"]}"#
        );
        assert_eq!(PciFunctions::parse(&v), Some(r.clone()));
        assert_eq!(PciFunctions::at_boot(&v, Some("b1")), Some(r.clone()));
        assert_eq!(PciFunctions::at_boot(&v, Some("b2")), None);
        assert_eq!(PciFunctions::at_boot(&v, None), Some(r));
        assert_eq!(PciFunctions::parse("vfio=2"), None);
    }

    #[test]
    fn board_types_follow_the_subsystem_id() {
        assert_eq!(board_type(0x0018), Some("n150"));
        assert_eq!(board_type(0x0014), Some("n300"));
        assert_eq!(board_type(0x0041), Some("p150"));
        assert_eq!(board_type(0x0045), Some("p300"));
        assert_eq!(board_type(0x0047), Some("ubb_blackhole"));
        assert_eq!(board_type(0x1234), None);
    }
}
