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
//! clocks) must be readable, and a card that had `tt_*` attributes before
//! the swap must have them again (within the validation timeout: Wormhole
//! under tt-kmd 2.10 adds them from a retry work item once its firmware
//! publishes telemetry; a Blackhole whose firmware was late at probe is
//! served with none until the next load, so that waits in vain and fails,
//! and the rollback's reload probes it again). Every function the driver
//! serves must answer on the bus: a card that fell off it (its config space
//! reads all ones) stays bound and keeps its device node, so only its
//! config space tells.
//!
//! A first install has no before: it is checked against the Tenstorrent
//! functions on the bus ([`present`]): every Wormhole and Blackhole not
//! handed to another driver (vfio-pci) must be bound to tt-kmd. A card
//! without telemetry there is a warning, not a failure (firmware without
//! telemetry exists, and there is nothing to roll back to).
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
    /// The functions whose class device has `tt_*` attributes (tt-kmd's
    /// telemetry). Absent from records of agents before this field.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub telemetry: BTreeSet<String>,
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

/// The function a class device belongs to (its `device` link's name).
fn parent_of(root: &HostRoot, card: &str) -> Option<String> {
    let link = root.path(format!("{CLASS_DIR}/{card}/device"));
    fs::read_link(&link)
        .ok()
        .and_then(|t| t.file_name().and_then(|n| n.to_str()).map(str::to_string))
}

/// What the driver serves now.
pub fn inventory(root: &HostRoot) -> Inventory {
    let mut functions: BTreeSet<String> = names(root, PCI_DRIVER_DIR)
        .into_iter()
        .filter(|n| is_pci_address(n))
        .collect();
    let mut telemetry = BTreeSet::new();
    for card in cards(root) {
        if let Some(parent) = parent_of(root, &card) {
            if names(root, &format!("{CLASS_DIR}/{card}"))
                .iter()
                .any(|a| a.starts_with("tt_"))
            {
                telemetry.insert(parent.clone());
            }
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
        telemetry,
    }
}

/// Where sysfs lists every PCI function.
pub const PCI_DEVICES_DIR: &str = "/sys/bus/pci/devices";

/// A Tenstorrent function on the bus that tt-kmd serves, and the driver it
/// is bound to now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Present {
    pub address: String,
    /// `Wormhole 1e52:401e`.
    pub kind: String,
    /// The bound driver's name; None when unbound.
    pub driver: Option<String>,
}

/// The Wormhole and Blackhole functions on the bus
/// ([`ttdrv_api::vfio::KMD_SERVED_DEVICE_IDS`]), sorted by address.
pub fn present(root: &HostRoot) -> Vec<Present> {
    let hex = |dir: &str, attr: &str| {
        fs::read_to_string(root.path(format!("{dir}/{attr}")))
            .ok()
            .and_then(|v| u16::from_str_radix(v.trim().trim_start_matches("0x"), 16).ok())
    };
    names(root, PCI_DEVICES_DIR)
        .into_iter()
        .filter(|a| is_pci_address(a))
        .filter_map(|address| {
            let dir = format!("{PCI_DEVICES_DIR}/{address}");
            if hex(&dir, "vendor")? != ttdrv_api::vfio::TT_VENDOR_ID {
                return None;
            }
            let device = hex(&dir, "device")?;
            let (_, name) = ttdrv_api::vfio::KMD_SERVED_DEVICE_IDS
                .iter()
                .find(|(id, _)| *id == device)?;
            let driver = fs::read_link(root.path(format!("{dir}/driver")))
                .ok()
                .and_then(|t| t.file_name().and_then(|n| n.to_str()).map(str::to_string))
                // Not bound yet, but promised to another driver (the VFIO
                // binder sets driver_override before vfio-pci binds it).
                .or_else(|| {
                    fs::read_to_string(root.path(format!("{dir}/driver_override")))
                        .ok()
                        .map(|o| o.trim().to_string())
                        .filter(|o| !o.is_empty() && o != "(null)")
                });
            Some(Present {
                kind: format!("{name} {:04x}:{device:04x}", ttdrv_api::vfio::TT_VENDOR_ID),
                address,
                driver,
            })
        })
        .collect()
}

/// What a first install must serve: every present function that no other
/// driver holds (a function on vfio-pci belongs to a VM).
pub fn expected_on_first_install(present: &[Present]) -> Inventory {
    Inventory {
        functions: present
            .iter()
            .filter(|p| {
                p.driver
                    .as_deref()
                    .is_none_or(|d| d == ttdrv_api::vfio::KMD_PCI_DRIVER)
            })
            .map(|p| p.address.clone())
            .collect(),
        ..Inventory::default()
    }
}

/// Whether a function's config space answers: a card that fell off the bus
/// (or hung its PCIe link) reads all ones. Judged from the first dword.
pub fn config_answers(config: &[u8]) -> bool {
    config.len() < 4 || config[..4] != [0xff; 4]
}

/// The served functions that do not answer on the bus, in words.
pub fn unresponsive(root: &HostRoot, now: &Inventory) -> Vec<String> {
    now.functions
        .iter()
        .filter(|f| is_pci_address(f))
        .filter_map(|f| {
            let mut head = [0u8; 4];
            let read = fs::File::open(root.path(format!("{PCI_DEVICES_DIR}/{f}/config")))
                .and_then(|mut c| std::io::Read::read_exact(&mut c, &mut head));
            // Unreadable (no such file on a planted host): not judged.
            (read.is_ok() && !config_answers(&head)).then(|| {
                format!(
                    "card {f} does not answer on the bus (its PCI config space reads all ones): \
                     it fell off the bus or its link is down"
                )
            })
        })
        .collect()
}

/// Everything wrong with what the driver serves now against `before`: the
/// inventory ([`problems`]), unreadable attributes and cards that do not
/// answer. Returns what it read too.
pub fn check(root: &HostRoot, before: &Inventory) -> (Inventory, Vec<String>) {
    let now = inventory(root);
    let mut out = problems(before, &now, &unreadable_attributes(root));
    out.extend(unresponsive(root, &now));
    (now, out)
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
    let silent: Vec<&str> = before
        .telemetry
        .iter()
        .filter(|f| now.functions.contains(*f) && !now.telemetry.contains(*f))
        .map(String::as_str)
        .collect();
    if !silent.is_empty() {
        out.push(format!(
            "{} served without tt_* attributes, which {} before the swap: the card's firmware \
             had not published its telemetry when tt-kmd probed it (a Blackhole reads it only \
             at probe; a reload probes it again)",
            silent.join(", "),
            if silent.len() == 1 {
                "it had"
            } else {
                "they had"
            }
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
    /// The new module validated; kept while the controller may still find
    /// the swap failed (the scheduling surface after it) and ask for its
    /// rollback ([`ttdrv_api::labels::ROLLBACK_VERDICT`]).
    Validated,
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
    /// The module parameters the previous version was loaded with
    /// (canonical): a rollback loads it with them again.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub previous_parameters: String,
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
    // Telemetry is the swap's check, not the readiness probe's: firmware
    // that stops reporting does not take the device from its users.
    before.telemetry.clear();
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
            telemetry: BTreeSet::new(),
        }
    }

    fn with_telemetry(mut i: Inventory, functions: &[&str]) -> Inventory {
        i.telemetry = functions.iter().map(|s| s.to_string()).collect();
        i
    }

    #[test]
    fn a_card_that_lost_its_telemetry_is_named() {
        let fs = ["0000:00:02.0", "0000:00:04.0"];
        let before = with_telemetry(inv(&fs, &["0", "1"]), &fs);
        let now = with_telemetry(inv(&fs, &["0", "1"]), &["0000:00:02.0"]);
        let p = problems(&before, &now, &[]);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            p[0].starts_with("0000:00:04.0 served without tt_* attributes"),
            "{p:?}"
        );
        // Never had any (old firmware): nothing expected.
        assert!(problems(&inv(&fs, &["0", "1"]), &now, &[]).is_empty());
        // Records of older agents have no telemetry field.
        let old: Inventory =
            serde_json::from_str(r#"{"functions":["0000:00:02.0"],"device_nodes":[]}"#)
                .expect("an older record");
        assert!(old.telemetry.is_empty());
    }

    #[test]
    fn config_space_of_all_ones_does_not_answer() {
        assert!(config_answers(&[0x52, 0x1e, 0x1e, 0x40]));
        assert!(!config_answers(&[0xff; 4]));
        assert!(config_answers(&[]), "unread: not judged");
    }

    fn planted_function(root: &HostRoot, address: &str, device: &str, driver: Option<&str>) {
        let dir = root.path(format!("{PCI_DEVICES_DIR}/{address}"));
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("vendor"), "0x1e52\n").expect("vendor");
        std::fs::write(dir.join("device"), format!("{device}\n")).expect("device");
        if let Some(d) = driver {
            let drv = root.path(format!("/sys/bus/pci/drivers/{d}"));
            std::fs::create_dir_all(&drv).expect("mkdir");
            std::os::unix::fs::symlink(&drv, dir.join("driver")).expect("driver link");
        }
    }

    #[test]
    fn a_first_install_expects_every_card_no_other_driver_holds() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = HostRoot::new(dir.path());
        planted_function(&root, "0000:00:02.0", "0x401e", Some("tenstorrent"));
        planted_function(&root, "0000:00:03.0", "0x401e", None);
        planted_function(&root, "0000:00:04.0", "0xb140", Some("vfio-pci"));
        planted_function(&root, "0000:00:05.0", "0xfaca", None); // Grayskull
        planted_function(&root, "0000:00:06.0", "0xb140", None);
        std::fs::write(
            root.path(format!("{PCI_DEVICES_DIR}/0000:00:06.0/driver_override")),
            "vfio-pci\n",
        )
        .expect("override");
        let found = present(&root);
        assert_eq!(
            found.iter().map(|p| p.address.as_str()).collect::<Vec<_>>(),
            [
                "0000:00:02.0",
                "0000:00:03.0",
                "0000:00:04.0",
                "0000:00:06.0"
            ]
        );
        assert_eq!(
            found[3].driver.as_deref(),
            Some("vfio-pci"),
            "promised to vfio-pci"
        );
        assert_eq!(found[2].kind, "Blackhole 1e52:b140");
        let want = expected_on_first_install(&found);
        assert_eq!(
            want.functions
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
            ["0000:00:02.0", "0000:00:03.0"]
        );
        // Only 02.0 bound: 03.0 is named.
        let p = problems(&want, &inv(&["0000:00:02.0"], &["0"]), &[]);
        assert!(p.iter().any(|m| m.contains("0000:00:03.0")), "{p:?}");
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
            previous_parameters: "max_devices=4".into(),
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
