//! The check after a swap, before the node goes back into service: the new
//! module serves every card the old one served. A module that loads but does
//! not probe a card (a regression in a release, a card the new version does
//! not know) would otherwise uncordon the node with fewer devices.
//!
//! What is compared ([`Inventory`], read from sysfs and devtmpfs as tt-kmd
//! lays them out):
//! - the functions the driver serves: the PCI functions bound to it
//!   (`/sys/bus/pci/drivers/tenstorrent/<address>`) and the parent device of
//!   each of its class devices (`/sys/class/tenstorrent/tenstorrent!N/device`);
//! - its device nodes, `/dev/tenstorrent/<N>`.
//!
//! And the driver's own view: every `tt_*` attribute of every card (tt-kmd's
//! telemetry: `tt_asic_id`, `tt_serial`, `tt_card_type`, firmware versions,
//! clocks) must be readable.
//!
//! The inventory before the unload is kept on the host ([`SwapRecord`], in
//! the module cache's directory) so that an agent restarted after the swap
//! (a crash, a kill, a reboot) still checks against it, and so that a swap
//! rolled back in one cycle is not tried again under the same go-ahead.

use std::collections::BTreeSet;
use std::fs;

use serde::{Deserialize, Serialize};

use crate::cache::CACHE_DIR;
use crate::host::HostRoot;
use crate::hostfs::HostFsError;

/// tt-kmd's device class.
pub const CLASS_DIR: &str = "/sys/class/tenstorrent";
/// tt-kmd's PCI driver: a link per bound function.
pub const PCI_DRIVER_DIR: &str = "/sys/bus/pci/drivers/tenstorrent";
/// The device nodes.
pub const DEV_DIR: &str = ttdrv_api::labels::DEVICE_DIR;
/// The swap record, in [`CACHE_DIR`].
pub const SWAP_RECORD_FILE: &str = "swap.json";
/// What the loaded module served when it last validated (or when the agent
/// found it at the target), in [`CACHE_DIR`]: the readiness probe's baseline.
pub const SERVED_FILE: &str = "served.json";
/// The PCI driver of functions handed to VMs: a function moved there was
/// not lost.
pub const VFIO_DRIVER_DIR: &str = "/sys/bus/pci/drivers/vfio-pci";
/// The largest swap record read back.
const SWAP_RECORD_MAX: u64 = 64 * 1024;

/// What the driver serves, as sysfs and devtmpfs show it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inventory {
    /// The functions served: PCI addresses (or, for a card without a PCI
    /// parent, its parent device's name).
    pub functions: BTreeSet<String>,
    /// The names under `/dev/tenstorrent` that are device numbers.
    pub device_nodes: BTreeSet<String>,
}

impl Inventory {
    pub fn is_empty(&self) -> bool {
        self.functions.is_empty() && self.device_nodes.is_empty()
    }

    /// `2 function(s) (0000:01:00.0, 0000:02:00.0), 2 device node(s)`.
    pub fn describe(&self) -> String {
        format!(
            "{} function(s){}, {} device node(s)",
            self.functions.len(),
            if self.functions.is_empty() {
                String::new()
            } else {
                format!(
                    " ({})",
                    self.functions
                        .iter()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            },
            self.device_nodes.len()
        )
    }
}

/// Names in a host directory (none when it does not exist or is unreadable).
fn names(root: &HostRoot, dir: &str) -> Vec<String> {
    let Ok(entries) = fs::read_dir(root.path(dir)) else {
        return Vec::new();
    };
    let mut out: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    out.sort();
    out
}

/// A PCI address as sysfs names it: `0000:01:00.0`.
pub fn is_pci_address(name: &str) -> bool {
    let b = name.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && name
            .char_indices()
            .all(|(i, c)| matches!(i, 4 | 7 | 10) || c.is_ascii_hexdigit())
}

/// The class devices of the driver (`tenstorrent!N`), sorted.
pub fn cards(root: &HostRoot) -> Vec<String> {
    names(root, CLASS_DIR)
        .into_iter()
        .filter(|n| n.starts_with("tenstorrent!"))
        .collect()
}

/// What the driver serves now.
pub fn inventory(root: &HostRoot) -> Inventory {
    let mut functions: BTreeSet<String> = names(root, PCI_DRIVER_DIR)
        .into_iter()
        .filter(|n| is_pci_address(n))
        .collect();
    for card in cards(root) {
        let link = root.path(format!("{CLASS_DIR}/{card}/device"));
        if let Some(parent) = fs::read_link(&link)
            .ok()
            .and_then(|t| t.file_name().and_then(|n| n.to_str()).map(str::to_string))
        {
            functions.insert(parent);
        }
    }
    let device_nodes = names(root, DEV_DIR)
        .into_iter()
        .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        .collect();
    Inventory {
        functions,
        device_nodes,
    }
}

/// The `tt_*` attributes of the cards that cannot be read, as
/// `tenstorrent!0/tt_serial: <error>`.
pub fn unreadable_attributes(root: &HostRoot) -> Vec<String> {
    let mut out = Vec::new();
    for card in cards(root) {
        let dir = format!("{CLASS_DIR}/{card}");
        for attr in names(root, &dir) {
            if !attr.starts_with("tt_") {
                continue;
            }
            if let Err(e) = fs::read(root.path(format!("{dir}/{attr}"))) {
                out.push(format!("{card}/{attr}: {e}"));
            }
        }
    }
    out
}

/// What is wrong with `now` against `before` (and the unreadable
/// attributes), in words; empty when the swap serves every card it did.
pub fn problems(before: &Inventory, now: &Inventory, unreadable: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let lost: Vec<&str> = before
        .functions
        .difference(&now.functions)
        .map(String::as_str)
        .collect();
    if !lost.is_empty() {
        out.push(format!(
            "{} of {} function(s) served before the swap are not served now: {}",
            lost.len(),
            before.functions.len(),
            lost.join(", ")
        ));
    }
    if now.device_nodes.len() < before.device_nodes.len() {
        out.push(format!(
            "{DEV_DIR} has {} device node(s), {} before the swap",
            now.device_nodes.len(),
            before.device_nodes.len()
        ));
    }
    if !unreadable.is_empty() {
        out.push(format!(
            "card attributes cannot be read: {}",
            unreadable.join("; ")
        ));
    }
    out
}

/// How a swap's validation ended, as the swap record keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum SwapOutcome {
    /// The new module is loaded (or about to be) and not yet validated.
    Validating,
    /// Validation failed and the previous version was put back: this
    /// cycle's go-ahead opens no second swap to the same target.
    RolledBack { to: String },
    /// Validation failed and the new module stays loaded
    /// (`onValidationFailure: hold`): the node is not Ready until it
    /// validates (after a person's fix) or a retry.
    Held,
}

/// A swap in flight or its failed end, kept on the host across agent
/// restarts: the inventory to check against, and what became of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SwapRecord {
    /// The version swapped to.
    pub target: String,
    /// The version swapped from.
    pub previous: Option<String>,
    /// The go-ahead's cycle (None: swapped without the controller).
    pub cycle: Option<i64>,
    /// What the driver served before the unload.
    pub before: Inventory,
    pub outcome: SwapOutcome,
    /// What failed, for the messages of a restarted agent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

/// The swap record on the host, if there is one (an unreadable one is
/// logged and treated as none: it only sharpens checks).
pub fn read_record(root: &HostRoot) -> Option<SwapRecord> {
    let dir = match root.dir(CACHE_DIR, false) {
        Ok(d) => d,
        Err(e) if e.is_not_found() => return None,
        Err(e) => {
            tracing::warn!(error = %e, "cannot open the cache directory for the swap record");
            return None;
        }
    };
    match dir.read_optional(SWAP_RECORD_FILE, SWAP_RECORD_MAX) {
        Ok(None) => None,
        Ok(Some(bytes)) => match serde_json::from_slice(&bytes) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!(error = %e, "the swap record is not readable; ignoring it");
                None
            }
        },
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the swap record; ignoring it");
            None
        }
    }
}

/// Writes the swap record atomically (0600).
pub fn write_record(root: &HostRoot, record: &SwapRecord) -> Result<(), HostFsError> {
    let dir = root.dir(CACHE_DIR, true)?;
    let bytes = serde_json::to_vec_pretty(record).unwrap_or_default();
    dir.write_atomic(SWAP_RECORD_FILE, &mut bytes.as_slice(), 0o600)
}

/// Removes the swap record (a validated swap, or nothing to keep).
pub fn clear_record(root: &HostRoot) -> Result<(), HostFsError> {
    match root.dir(CACHE_DIR, false) {
        Ok(dir) => dir.remove_file(SWAP_RECORD_FILE).map(|_| ()),
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(e),
    }
}

/// What a validated module served ([`SERVED_FILE`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Served {
    pub version: String,
    pub inventory: Inventory,
}

/// Notes what `version`, loaded and validated, serves now: the baseline of
/// [`lost`]. Best effort (a note that cannot be written only weakens the
/// readiness check).
pub fn note_served(root: &HostRoot, version: &str) {
    let served = Served {
        version: version.to_string(),
        inventory: inventory(root),
    };
    if served.inventory.is_empty() {
        // Nothing served, nothing to lose: no note (and none left of before).
        if let Ok(dir) = root.dir(CACHE_DIR, false)
            && let Err(e) = dir.remove_file(SERVED_FILE)
        {
            tracing::warn!(error = %e, "cannot remove the note of what the module served");
        }
        return;
    }
    let bytes = serde_json::to_vec_pretty(&served).unwrap_or_default();
    if let Err(e) = root
        .dir(CACHE_DIR, true)
        .and_then(|d| d.write_atomic(SERVED_FILE, &mut bytes.as_slice(), 0o600))
    {
        tracing::warn!(error = %e, "cannot note what the module serves");
    }
}

/// What the loaded module `version` no longer serves of what it served when
/// it validated, in words; empty when nothing is lost (or nothing was
/// noted for this version). A function moved to vfio-pci (VM passthrough)
/// is not lost. Cheap: directory listings only, for the readiness probe.
pub fn lost(root: &HostRoot, version: &str) -> Vec<String> {
    let Some(served) = root
        .dir(CACHE_DIR, false)
        .ok()
        .and_then(|d| d.read_optional(SERVED_FILE, SWAP_RECORD_MAX).ok().flatten())
        .and_then(|b| serde_json::from_slice::<Served>(&b).ok())
    else {
        return Vec::new();
    };
    if !ttdrv_core::node::same_version(Some(&served.version), version) {
        return Vec::new();
    }
    let vfio: BTreeSet<String> = names(root, VFIO_DRIVER_DIR).into_iter().collect();
    let mut before = served.inventory;
    let moved = before.functions.intersection(&vfio).count();
    before.functions.retain(|f| !vfio.contains(f));
    let keep = before.device_nodes.len().saturating_sub(moved);
    before.device_nodes = before.device_nodes.into_iter().take(keep).collect();
    problems(&before, &inventory(root), &[])
        .into_iter()
        .map(|p| p.replace("before the swap", "when it validated"))
        .collect()
}

/// Where the record lives on the host, for messages.
pub fn record_host_path() -> String {
    format!("{CACHE_DIR}/{SWAP_RECORD_FILE}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inv(functions: &[&str], nodes: &[&str]) -> Inventory {
        Inventory {
            functions: functions.iter().map(|s| s.to_string()).collect(),
            device_nodes: nodes.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn pci_addresses_are_recognised() {
        assert!(is_pci_address("0000:01:00.0"));
        assert!(is_pci_address("0000:af:1f.7"));
        assert!(!is_pci_address("module"));
        assert!(!is_pci_address("new_id"));
        assert!(!is_pci_address("0000-01:00.0"));
        assert!(!is_pci_address("0000:01:00.00"));
    }

    #[test]
    fn the_same_cards_validate() {
        let before = inv(&["0000:01:00.0", "0000:02:00.0"], &["0", "1"]);
        assert!(problems(&before, &before.clone(), &[]).is_empty());
        // More is fine (a card that was bound elsewhere came back).
        let more = inv(
            &["0000:01:00.0", "0000:02:00.0", "0000:03:00.0"],
            &["0", "1", "2"],
        );
        assert!(problems(&before, &more, &[]).is_empty());
        // Nothing before: nothing to lose.
        assert!(problems(&Inventory::default(), &Inventory::default(), &[]).is_empty());
    }

    #[test]
    fn a_lost_function_is_named() {
        let before = inv(&["0000:01:00.0", "0000:02:00.0"], &["0", "1"]);
        let now = inv(&["0000:01:00.0"], &["0"]);
        let p = problems(&before, &now, &[]);
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(
            p[0].contains("1 of 2") && p[0].contains("0000:02:00.0"),
            "{p:?}"
        );
        assert!(p[1].contains("1 device node(s), 2 before"), "{p:?}");
    }

    #[test]
    fn no_card_at_all_after_the_swap_fails() {
        let before = inv(&["tt-stub-pci.0"], &["0"]);
        let p = problems(&before, &Inventory::default(), &[]);
        assert!(p.iter().any(|m| m.contains("tt-stub-pci.0")), "{p:?}");
    }

    #[test]
    fn a_card_without_its_device_node_fails() {
        let before = inv(&["0000:01:00.0"], &["0"]);
        let now = inv(&["0000:01:00.0"], &[]);
        let p = problems(&before, &now, &[]);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].contains("0 device node(s), 1 before"), "{p:?}");
    }

    #[test]
    fn unreadable_attributes_fail() {
        let before = inv(&["0000:01:00.0"], &["0"]);
        let p = problems(
            &before,
            &before.clone(),
            &["tenstorrent!0/tt_serial: Input/output error".into()],
        );
        assert_eq!(p.len(), 1);
        assert!(p[0].contains("tenstorrent!0/tt_serial"), "{p:?}");
    }

    #[test]
    fn an_attribute_that_cannot_be_read_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = HostRoot::new(dir.path());
        let card = root.path(format!("{CLASS_DIR}/tenstorrent!0"));
        std::fs::create_dir_all(card.join("tt_serial"))
            .expect("a directory where a file should be");
        std::fs::write(card.join("tt_asic_id"), "5A17C0DE00000000\n").expect("asic id");
        std::fs::write(card.join("uevent"), "").expect("not ours");
        let bad = unreadable_attributes(&root);
        assert_eq!(bad.len(), 1, "{bad:?}");
        assert!(bad[0].starts_with("tenstorrent!0/tt_serial: "), "{bad:?}");
    }

    #[test]
    fn records_round_trip() {
        let r = SwapRecord {
            target: "2.8.0".into(),
            previous: Some("2.7.0".into()),
            cycle: Some(42),
            before: inv(&["0000:01:00.0"], &["0"]),
            outcome: SwapOutcome::RolledBack { to: "2.7.0".into() },
            problems: vec!["x".into()],
        };
        let json = serde_json::to_string(&r).expect("json");
        assert!(json.contains(r#""state":"rolledBack""#), "{json}");
        assert_eq!(serde_json::from_str::<SwapRecord>(&json).expect("back"), r);
    }
}
