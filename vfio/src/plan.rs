//! The binder's decisions, free of I/O: which functions to bind or refuse,
//! what to record before moving one, which to put back, and what to report.

use std::collections::{BTreeMap, BTreeSet};

use ttdrv_api::vfio::{self, NO_DRIVER, PciFunctions, TT_VENDOR_ID, VFIO_PCI_DRIVER};

use crate::config::Config;
use crate::state::{Entry, State};

/// A PCI function as sysfs shows it: its IDs, the driver bound (None when
/// unbound), whether it has an `iommu_group` link (vfio-pci can take it with
/// the IOMMU on), and tt-kmd's telemetry (`tt_card_type`, `tt_serial`),
/// readable only while tt-kmd drives it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Function {
    pub bdf: String,
    pub ids: PciIds,
    pub driver: Option<String>,
    pub iommu_group: bool,
    pub telemetry: Telemetry,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PciIds {
    pub vendor: u16,
    pub device: u16,
    pub subsystem_device: Option<u16>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Telemetry {
    pub card_type: Option<String>,
    pub serial: Option<String>,
}

impl Function {
    pub fn on_vfio(&self) -> bool {
        self.driver.as_deref() == Some(VFIO_PCI_DRIVER)
    }
}

/// The kernel's side of the IOMMU question.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Iommu {
    /// vfio's `enable_unsafe_noiommu_mode` is Y.
    pub noiommu_on: bool,
    /// `--noiommu`: the binder may turn that mode on.
    pub allow_noiommu: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Unbind from `from` (if any) and bind to vfio-pci; first turn no-IOMMU
    /// mode on when `enable_noiommu`.
    Bind {
        bdf: String,
        resource: String,
        from: Option<String>,
        enable_noiommu: bool,
    },
    /// vfio-pci cannot take it: no IOMMU group and no no-IOMMU mode. Nothing
    /// is unbound.
    RefuseNoIommu { bdf: String, resource: String },
}

/// What one pass does to the functions the config matches.
pub fn plan(functions: &[Function], config: &Config, iommu: Iommu) -> Vec<Action> {
    let mut noiommu_on = iommu.noiommu_on;
    let mut out = Vec::new();
    for f in functions {
        let Some(resource) = config.resource_of(f.ids.vendor, f.ids.device) else {
            continue;
        };
        if f.on_vfio() {
            continue;
        }
        let (bdf, resource) = (f.bdf.clone(), resource.to_string());
        if f.iommu_group || noiommu_on {
            out.push(Action::Bind {
                bdf,
                resource,
                from: f.driver.clone(),
                enable_noiommu: false,
            });
        } else if iommu.allow_noiommu {
            // Turned on once, by the first function that needs it.
            noiommu_on = true;
            out.push(Action::Bind {
                bdf,
                resource,
                from: f.driver.clone(),
                enable_noiommu: true,
            });
        } else {
            out.push(Action::RefuseNoIommu { bdf, resource });
        }
    }
    out
}

/// A function's board kind and serial.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub board_type: String,
    pub serial: Option<String>,
}

pub const UNKNOWN_BOARD: &str = "unknown";

/// Board kind from the subsystem ID (readable on any driver), else tt-kmd's
/// `tt_card_type`, else what was recorded while tt-kmd still drove it, else
/// `unknown`; the serial from telemetry or the record.
pub fn identity(f: &Function, recorded: Option<&Entry>) -> Identity {
    let from_telemetry = f
        .telemetry
        .card_type
        .as_deref()
        .map(sanitize_board)
        .filter(|t| !t.is_empty() && t != UNKNOWN_BOARD);
    let from_record = recorded
        .map(|e| e.board_type.clone())
        .filter(|t| t != UNKNOWN_BOARD);
    let board_type = f
        .ids
        .subsystem_device
        .and_then(vfio::board_type)
        .map(str::to_string)
        .or(from_telemetry)
        .or(from_record)
        .unwrap_or_else(|| UNKNOWN_BOARD.to_string());
    let serial = f
        .telemetry
        .serial
        .clone()
        .filter(|s| !s.is_empty())
        .or_else(|| recorded.and_then(|e| e.serial.clone()));
    Identity { board_type, serial }
}

/// A telemetry card type as a label value's part: lower case, `[a-z0-9_-]`.
fn sanitize_board(s: &str) -> String {
    s.trim()
        .to_ascii_lowercase()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
        .collect()
}

/// The state with the functions about to be bound recorded (their original
/// driver the first time only) and the identities of recorded functions
/// brought up to date.
pub fn record(state: &State, functions: &[Function], actions: &[Action]) -> State {
    let mut next = state.clone();
    let by_bdf: BTreeMap<&str, &Function> = functions.iter().map(|f| (f.bdf.as_str(), f)).collect();
    for a in actions {
        if let Action::Bind { bdf, from, .. } = a
            && let Some(f) = by_bdf.get(bdf.as_str())
            && !next.functions.contains_key(bdf)
        {
            let id = identity(f, None);
            next.functions.insert(
                bdf.clone(),
                Entry {
                    original_driver: from.clone(),
                    board_type: id.board_type,
                    serial: id.serial,
                },
            );
        }
    }
    for (bdf, e) in next.functions.iter_mut() {
        if let Some(f) = by_bdf.get(bdf.as_str()) {
            let id = identity(f, Some(e));
            e.board_type = id.board_type;
            e.serial = id.serial;
        }
    }
    next
}

/// A recorded function to put back: unbind from vfio-pci, clear the
/// override, bind to `to` (or let the kernel probe when None or refused).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Restore {
    pub bdf: String,
    pub to: Option<String>,
}

/// The recorded functions still on vfio-pci; those never recorded (on
/// vfio-pci before the binder) are not touched.
pub fn restore_plan(functions: &[Function], state: &State) -> Vec<Restore> {
    functions
        .iter()
        .filter(|f| f.on_vfio())
        .filter_map(|f| {
            state.functions.get(&f.bdf).map(|e| Restore {
                bdf: f.bdf.clone(),
                to: e.original_driver.clone(),
            })
        })
        .collect()
}

/// The functions as they are after a pass: those bound moved to vfio-pci.
pub fn after_pass(functions: &[Function], bound: &BTreeSet<String>) -> Vec<Function> {
    functions
        .iter()
        .map(|f| {
            let mut f = f.clone();
            if bound.contains(&f.bdf) {
                f.driver = Some(VFIO_PCI_DRIVER.to_string());
            }
            f
        })
        .collect()
}

/// The Node annotation's report: every Tenstorrent function by driver, and
/// the configured resources with a function on vfio-pci.
pub fn report(functions: &[Function], config: &Config, boot_id: &str) -> PciFunctions {
    let mut drivers = BTreeMap::new();
    let mut vfio_resources = BTreeSet::new();
    for f in functions.iter().filter(|f| f.ids.vendor == TT_VENDOR_ID) {
        *drivers
            .entry(f.driver.clone().unwrap_or_else(|| NO_DRIVER.to_string()))
            .or_insert(0) += 1;
    }
    for f in functions.iter().filter(|f| f.on_vfio()) {
        if let Some(r) = config.resource_of(f.ids.vendor, f.ids.device) {
            vfio_resources.insert(r.to_string());
        }
    }
    PciFunctions {
        boot_id: boot_id.to_string(),
        drivers,
        vfio_resources: vfio_resources.into_iter().collect(),
    }
}

/// The board-types label: the kinds of the matched functions, sorted,
/// deduplicated, joined with '.'; None (no label) when nothing matched. Cut
/// at a kind boundary to a label value's 63 characters.
pub fn board_types<'a>(kinds: impl IntoIterator<Item = &'a str>) -> Option<String> {
    let kinds: BTreeSet<&str> = kinds.into_iter().collect();
    let mut out = String::new();
    for k in kinds {
        let extra = if out.is_empty() { k.len() } else { k.len() + 1 };
        if out.len() + extra > 63 {
            break;
        }
        if !out.is_empty() {
            out.push('.');
        }
        out.push_str(k);
    }
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        Config::parse("devices:\n- resourceName: tenstorrent.com/wormhole\n  vendorId: \"1e52\"\n  deviceId: [\"401e\"]\n")
            .expect("config")
    }

    fn f(bdf: &str, device: u16, driver: Option<&str>) -> Function {
        Function {
            bdf: bdf.into(),
            ids: PciIds {
                vendor: TT_VENDOR_ID,
                device,
                subsystem_device: Some(0x0018),
            },
            driver: driver.map(str::to_string),
            iommu_group: true,
            ..Default::default()
        }
    }

    const ON: Iommu = Iommu {
        noiommu_on: false,
        allow_noiommu: false,
    };

    #[test]
    fn only_matched_functions_off_vfio_are_bound() {
        let fs = [
            f("0000:01:00.0", 0x401e, Some("tenstorrent")),
            f("0000:02:00.0", 0x401e, Some("vfio-pci")),
            f("0000:03:00.0", 0xb140, Some("tenstorrent")),
            f("0000:04:00.0", 0x401e, None),
        ];
        let got = plan(&fs, &config(), ON);
        let bind = |bdf: &str, from: Option<&str>| Action::Bind {
            bdf: bdf.into(),
            resource: "tenstorrent.com/wormhole".into(),
            from: from.map(str::to_string),
            enable_noiommu: false,
        };
        assert_eq!(
            got,
            vec![
                bind("0000:01:00.0", Some("tenstorrent")),
                bind("0000:04:00.0", None)
            ]
        );
    }

    #[test]
    fn without_an_iommu_group_no_iommu_mode_decides() {
        let mut a = f("0000:01:00.0", 0x401e, Some("tenstorrent"));
        a.iommu_group = false;
        let mut b = a.clone();
        b.bdf = "0000:02:00.0".into();
        let fs = [a, b];
        assert!(matches!(
            &plan(&fs, &config(), ON)[..],
            [Action::RefuseNoIommu { .. }, Action::RefuseNoIommu { .. }]
        ));
        let on = plan(
            &fs,
            &config(),
            Iommu {
                noiommu_on: true,
                allow_noiommu: false,
            },
        );
        assert!(on.iter().all(|a| matches!(
            a,
            Action::Bind {
                enable_noiommu: false,
                ..
            }
        )));
        // Allowed: the first one turns the mode on, the second finds it on.
        let allowed = plan(
            &fs,
            &config(),
            Iommu {
                noiommu_on: false,
                allow_noiommu: true,
            },
        );
        assert!(matches!(
            &allowed[..],
            [
                Action::Bind {
                    enable_noiommu: true,
                    ..
                },
                Action::Bind {
                    enable_noiommu: false,
                    ..
                }
            ]
        ));
    }

    #[test]
    fn identity_falls_back_from_subsystem_to_telemetry_to_record() {
        let mut x = f("0000:01:00.0", 0x401e, Some("tenstorrent"));
        x.telemetry.serial = Some("S1".into());
        assert_eq!(
            identity(&x, None),
            Identity {
                board_type: "n150".into(),
                serial: Some("S1".into())
            }
        );
        x.ids.subsystem_device = Some(0x1234);
        x.telemetry.card_type = Some(" N300 \n".into());
        assert_eq!(identity(&x, None).board_type, "n300");
        // On vfio-pci: no telemetry; the record remembers.
        x.telemetry.card_type = None;
        x.telemetry.serial = None;
        let e = Entry {
            original_driver: None,
            board_type: "n300".into(),
            serial: Some("S1".into()),
        };
        assert_eq!(
            identity(&x, Some(&e)),
            Identity {
                board_type: "n300".into(),
                serial: Some("S1".into())
            }
        );
        assert_eq!(
            identity(&x, None),
            Identity {
                board_type: "unknown".into(),
                serial: None
            }
        );
        x.telemetry.card_type = Some("unknown".into());
        assert_eq!(identity(&x, None).board_type, "unknown");
    }

    #[test]
    fn the_original_driver_is_recorded_once_and_restored_only_for_recorded_functions() {
        let fs = [f("0000:01:00.0", 0x401e, Some("tenstorrent"))];
        let s1 = record(&State::default(), &fs, &plan(&fs, &config(), ON));
        assert_eq!(
            s1.functions["0000:01:00.0"].original_driver.as_deref(),
            Some("tenstorrent")
        );
        // Drifted back to some other driver: the first record stays.
        let drifted = [f("0000:01:00.0", 0x401e, Some("other"))];
        let s2 = record(&s1, &drifted, &plan(&drifted, &config(), ON));
        assert_eq!(
            s2.functions["0000:01:00.0"].original_driver.as_deref(),
            Some("tenstorrent")
        );

        let now = [
            f("0000:01:00.0", 0x401e, Some("vfio-pci")),
            f("0000:02:00.0", 0x401e, Some("vfio-pci")),
        ];
        assert_eq!(
            restore_plan(&now, &s2),
            vec![Restore {
                bdf: "0000:01:00.0".into(),
                to: Some("tenstorrent".into())
            }]
        );
        assert_eq!(
            restore_plan(&fs, &s2),
            vec![],
            "not on vfio-pci: nothing to restore"
        );
    }

    #[test]
    fn the_report_counts_every_tenstorrent_function_by_driver() {
        let mut other = f("0000:05:00.0", 0x401e, Some("e1000"));
        other.ids.vendor = 0x8086;
        let fs = [
            f("0000:01:00.0", 0x401e, Some("tenstorrent")),
            f("0000:02:00.0", 0x401e, None),
            f("0000:03:00.0", 0xb140, Some("vfio-pci")),
            other,
        ];
        let bound = BTreeSet::from(["0000:01:00.0".to_string()]);
        let r = report(&after_pass(&fs, &bound), &config(), "boot");
        assert_eq!(r.boot_id, "boot");
        assert_eq!(
            r.drivers,
            BTreeMap::from([("none".to_string(), 1), ("vfio-pci".to_string(), 2)])
        );
        // 0xb140 is on vfio-pci but not configured: not a resource of ours.
        assert_eq!(
            r.vfio_resources,
            vec!["tenstorrent.com/wormhole".to_string()]
        );
        assert!(report(&fs, &config(), "b").vfio_resources.is_empty());
    }

    #[test]
    fn board_types_are_sorted_unique_and_fit_a_label() {
        assert_eq!(
            board_types(["n300", "n150", "n300"]).as_deref(),
            Some("n150.n300")
        );
        assert_eq!(board_types(["unknown"]).as_deref(), Some("unknown"));
        assert_eq!(board_types([]), None);
        let long: Vec<String> = (0..20).map(|i| format!("kind{i:02}")).collect();
        let v = board_types(long.iter().map(String::as_str)).expect("some");
        assert!(v.len() <= 63 && !v.ends_with('.'), "{v}");
    }
}
