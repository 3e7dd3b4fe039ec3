//! The host's PCI functions through the agent's hostfs: nothing on a host
//! path is followed but sysfs's own device links
//! (`/sys/bus/pci/devices/<bdf> -> ../../../devices/pci0000:00/...`), which
//! are read and resolved inside the host root and must land under
//! `/sys/devices` before the directory is opened, link-free, from the root.

use std::path::{Component, Path, PathBuf};
use std::process::Command;

use rustix::fs::FileType;
use rustix::io::Errno;
use ttdrv_agent::HostRoot;
use ttdrv_agent::hostfs::{HostDir, HostFsError, SMALL_FILE_MAX};

use crate::error::{Result, VfioError};
use crate::plan::{Function, PciIds, Telemetry};

pub const PCI_DEVICES: &str = "/sys/bus/pci/devices";
pub const PCI_DRIVERS: &str = "/sys/bus/pci/drivers";
pub const DRIVERS_PROBE: &str = "/sys/bus/pci/drivers_probe";
pub const NOIOMMU_PARAM: &str = "/sys/module/vfio/parameters/enable_unsafe_noiommu_mode";
pub const DMA_ENTRY_LIMIT: &str = "/sys/module/vfio_iommu_type1/parameters/dma_entry_limit";
const SYS_DEVICES: &str = "/sys/devices";

#[derive(Clone, Debug)]
pub struct Sysfs {
    root: HostRoot,
}

/// Go's `^[a-f0-9]{4}:[a-f0-9]{2}:[a-f0-9]{2}\.[0-9a-f]$`.
pub fn is_bdf(s: &str) -> bool {
    let b = s.as_bytes();
    let hex = |r: std::ops::Range<usize>| {
        b[r].iter()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
    };
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && hex(0..4)
        && hex(5..7)
        && hex(8..10)
        && hex(11..12)
}

/// `target` of a link in host directory `base`, resolved by name only
/// (`..` stops at the root, an absolute target starts from the host root).
pub fn resolve_link(base: &Path, target: &Path) -> PathBuf {
    let mut out = if target.is_absolute() {
        PathBuf::from("/")
    } else {
        base.to_path_buf()
    };
    for c in target.components() {
        match c {
            Component::Normal(p) => out.push(p),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

/// A sysfs hex attribute (`0x1e52\n`).
fn parse_hex(raw: &str) -> Option<u16> {
    let t = raw.trim();
    u16::from_str_radix(t.strip_prefix("0x").unwrap_or(t), 16).ok()
}

/// A driver name from a `driver` link: its last component, if it is one.
fn driver_name(target: &Path) -> Option<String> {
    match target.components().next_back()? {
        Component::Normal(n) => n.to_str().map(str::to_string),
        _ => None,
    }
}

fn text(b: Vec<u8>) -> String {
    String::from_utf8_lossy(&b).trim().to_string()
}

impl Sysfs {
    pub fn new(root: HostRoot) -> Self {
        Sysfs { root }
    }

    pub fn root(&self) -> &HostRoot {
        &self.root
    }

    /// How many entries /sys/bus/pci/devices has: a change means a function
    /// came or went.
    pub fn device_count(&self) -> Result<usize> {
        Ok(self.root.dir(PCI_DEVICES, false)?.entries()?.len())
    }

    /// The directory of function `bdf`, through its device link.
    pub fn device_dir(&self, bdf: &str) -> Result<HostDir> {
        let devices = self.root.dir(PCI_DEVICES, false)?;
        let target = devices.read_link(bdf)?.ok_or_else(|| {
            VfioError::HostFs(HostFsError::Invalid {
                path: format!("{PCI_DEVICES}/{bdf}"),
                reason: "it is not a device link",
            })
        })?;
        let resolved = resolve_link(Path::new(PCI_DEVICES), &target);
        if !resolved.starts_with(SYS_DEVICES) || resolved == Path::new(SYS_DEVICES) {
            return Err(VfioError::LinkEscapes {
                bdf: bdf.to_string(),
                link: format!("{PCI_DEVICES}/{bdf}"),
                target: target.display().to_string(),
            });
        }
        Ok(self.root.dir(&resolved, false)?)
    }

    /// Every PCI function, and why any could not be read (skipped).
    pub fn scan(&self) -> Result<(Vec<Function>, Vec<VfioError>)> {
        let mut functions = Vec::new();
        let mut refused = Vec::new();
        for (bdf, _) in self.root.dir(PCI_DEVICES, false)?.entries()? {
            if !is_bdf(&bdf) {
                continue;
            }
            match self.function(&bdf) {
                Ok(Some(f)) => functions.push(f),
                Ok(None) => {}
                Err(e) => refused.push(e),
            }
        }
        Ok((functions, refused))
    }

    /// One function; None when it has no readable vendor or device ID (as Go
    /// skips it).
    fn function(&self, bdf: &str) -> Result<Option<Function>> {
        let dir = self.device_dir(bdf)?;
        let attr = |name: &str| -> Result<Option<String>> {
            Ok(dir.read_optional(name, SMALL_FILE_MAX)?.map(text))
        };
        let (Some(vendor), Some(device)) = (
            attr("vendor")?.as_deref().and_then(parse_hex),
            attr("device")?.as_deref().and_then(parse_hex),
        ) else {
            return Ok(None);
        };
        let driver = dir.read_link("driver")?.as_deref().and_then(driver_name);
        let iommu_group = dir.stat("iommu_group")?.is_some();
        let mut f = Function {
            bdf: bdf.to_string(),
            ids: PciIds {
                vendor,
                device,
                subsystem_device: attr("subsystem_device")?.as_deref().and_then(parse_hex),
            },
            driver,
            iommu_group,
            telemetry: Telemetry::default(),
        };
        if vendor == ttdrv_api::vfio::TT_VENDOR_ID {
            f.telemetry = Telemetry {
                card_type: telemetry(&dir, "tt_card_type"),
                serial: telemetry(&dir, "tt_serial"),
            };
        }
        Ok(Some(f))
    }

    /// Writes `value` to the attribute `name` of function `bdf`.
    pub fn write_device(&self, bdf: &str, name: &str, value: &str) -> Result<()> {
        Ok(self
            .device_dir(bdf)?
            .write_existing(name, value.as_bytes())?)
    }

    /// Writes `value` to the host file `host_path` (a sysfs attribute).
    pub fn write(&self, host_path: &str, value: &str) -> Result<()> {
        let (dir, name) = ttdrv_agent::hostfs::split(Path::new(host_path))?;
        Ok(self
            .root
            .dir(dir, false)?
            .write_existing(name, value.as_bytes())?)
    }

    /// Writes `bdf` to `/sys/bus/pci/drivers/<driver>/<file>` (bind, unbind).
    pub fn driver_write(&self, driver: &str, file: &str, bdf: &str) -> Result<()> {
        if driver.is_empty() || driver == "." || driver == ".." || driver.contains('/') {
            return Err(HostFsError::Invalid {
                path: format!("{PCI_DRIVERS}/{driver}"),
                reason: "not a driver name",
            }
            .into());
        }
        self.write(&format!("{PCI_DRIVERS}/{driver}/{file}"), bdf)
    }

    /// The PCI driver `name` is registered.
    pub fn driver_exists(&self, name: &str) -> bool {
        !name.contains('/')
            && self
                .root
                .dir(Path::new(PCI_DRIVERS).join(name), false)
                .is_ok()
    }

    /// vfio's no-IOMMU mode: None when the parameter does not exist (vfio not
    /// loaded or built without it).
    pub fn noiommu_mode(&self) -> Result<Option<bool>> {
        Ok(self
            .root
            .read_small(NOIOMMU_PARAM)?
            .map(|v| matches!(v.trim(), "Y" | "1")))
    }

    pub fn boot_id(&self) -> String {
        self.root.boot_id().unwrap_or_default()
    }

    /// Loads a module with the host's modprobe (chrooted into the host root
    /// when it is not `/`, so the host's modules and configuration are used).
    pub fn modprobe(&self, module: &str) -> Result<()> {
        let mut cmd = if self.root.root() == Path::new("/") {
            Command::new("modprobe")
        } else {
            let mut c = Command::new("chroot");
            c.arg(self.root.root()).arg("modprobe");
            c
        };
        let out = cmd.arg(module).output().map_err(|e| VfioError::Modprobe {
            module: module.to_string(),
            reason: format!("cannot run: {e}"),
        })?;
        if !out.status.success() {
            return Err(VfioError::Modprobe {
                module: module.to_string(),
                reason: format!(
                    "{}: {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            });
        }
        Ok(())
    }
}

/// A tt-kmd telemetry attribute of the function: on its class device,
/// `tenstorrent/tenstorrent!<N>/<attr>` (or `tenstorrent!<N>/<attr>`).
fn telemetry(dir: &HostDir, attr: &str) -> Option<String> {
    let from = |d: &HostDir| -> Option<String> {
        let entries = d.entries().ok()?;
        entries
            .iter()
            .filter(|(n, t)| n.starts_with("tenstorrent!") && *t == FileType::Directory)
            .find_map(|(n, _)| {
                d.open_dir(n, false)
                    .ok()?
                    .read_optional(attr, SMALL_FILE_MAX)
                    .ok()?
                    .map(text)
            })
            .filter(|v| !v.is_empty())
    };
    dir.open_dir("tenstorrent", false)
        .ok()
        .and_then(|d| from(&d))
        .or_else(|| from(dir))
}

/// The declined bind of a hotplug stub (by design: -ENODEV after it flagged
/// the function).
pub fn is_enodev(e: &VfioError) -> bool {
    matches!(e, VfioError::HostFs(e)
        if e.io_error().and_then(std::io::Error::raw_os_error) == Some(Errno::NODEV.raw_os_error()))
}
