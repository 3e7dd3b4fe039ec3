//! A planted sysfs tree for the binder's tests: device links into
//! /sys/devices, driver links, driver directories with bind/unbind files.
//! Planted files are regular files, so the kernel's side is played by the
//! test (moving a `driver` link) and each test checks what the binder wrote.
#![allow(dead_code)]

use std::fs;
use std::os::unix::fs::symlink;
use std::path::PathBuf;
use std::sync::Arc;

use ttdrv_agent::HostRoot;
use ttdrv_vfio::binder::{Binder, Options};
use ttdrv_vfio::config::Config;
use ttdrv_vfio::metrics::Metrics;
use ttdrv_vfio::state::StateStore;
use ttdrv_vfio::sysfs::Sysfs;

pub const A: &str = "0000:01:00.0";
pub const B: &str = "0000:02:00.0";
pub const STATE_DIR: &str = "/var/lib/tt-vfio";

pub struct Host {
    pub dir: tempfile::TempDir,
    pub metrics: Arc<Metrics>,
}

impl Host {
    pub fn new() -> Host {
        let dir = tempfile::tempdir().expect("tempdir");
        let h = Host {
            dir,
            metrics: Arc::new(Metrics::new()),
        };
        for d in ["tenstorrent", "vfio-pci"] {
            h.file(&format!("sys/bus/pci/drivers/{d}/bind"), "");
            h.file(&format!("sys/bus/pci/drivers/{d}/unbind"), "");
        }
        fs::create_dir_all(h.path("sys/bus/pci/devices")).expect("mkdir");
        h.file("sys/bus/pci/drivers_probe", "");
        h.file("proc/sys/kernel/random/boot_id", "b0071d\n");
        h
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub fn file(&self, rel: &str, content: &str) {
        let p = self.path(rel);
        fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        fs::write(p, content).expect("write");
    }

    pub fn read(&self, rel: &str) -> String {
        fs::read_to_string(self.path(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
    }

    pub fn dev(bdf: &str) -> String {
        format!("sys/devices/pci0000:00/{bdf}")
    }

    /// A Tenstorrent function 1e52:401e with subsystem `sub`, tt-kmd's
    /// telemetry when on tenstorrent, an IOMMU group when `iommu`.
    pub fn function(&self, bdf: &str, sub: u16, driver: Option<&str>, iommu: bool) {
        let dev = Self::dev(bdf);
        self.file(&format!("{dev}/vendor"), "0x1e52\n");
        self.file(&format!("{dev}/device"), "0x401e\n");
        self.file(
            &format!("{dev}/subsystem_device"),
            &format!("0x{sub:04x}\n"),
        );
        self.file(&format!("{dev}/driver_override"), "(null)\n");
        if iommu {
            symlink(
                "../../../kernel/iommu_groups/7",
                self.path(&format!("{dev}/iommu_group")),
            )
            .expect("link");
        }
        symlink(
            format!("../../../devices/pci0000:00/{bdf}"),
            self.path(&format!("sys/bus/pci/devices/{bdf}")),
        )
        .expect("link");
        self.set_driver(bdf, driver);
    }

    pub fn telemetry(&self, bdf: &str, card_type: &str, serial: &str) {
        let t = format!("{}/tenstorrent/tenstorrent!0", Self::dev(bdf));
        self.file(&format!("{t}/tt_card_type"), &format!("{card_type}\n"));
        self.file(&format!("{t}/tt_serial"), &format!("{serial}\n"));
    }

    /// The kernel's part: the function's driver link.
    pub fn set_driver(&self, bdf: &str, driver: Option<&str>) {
        let link = self.path(&format!("{}/driver", Self::dev(bdf)));
        let _ = fs::remove_file(&link);
        if let Some(d) = driver {
            symlink(format!("../../../bus/pci/drivers/{d}"), link).expect("link");
        }
    }

    pub fn clear_writes(&self) {
        for f in [
            "tenstorrent/bind",
            "tenstorrent/unbind",
            "vfio-pci/bind",
            "vfio-pci/unbind",
        ] {
            self.file(&format!("sys/bus/pci/drivers/{f}"), "");
        }
        self.file("sys/bus/pci/drivers_probe", "");
    }

    pub fn binder(&self, options: Options) -> Binder {
        let root = HostRoot::new(self.dir.path());
        let config = Config::parse(
            "devices:\n- resourceName: tenstorrent.com/wormhole\n  vendorId: \"1e52\"\n  deviceId: [\"401e\"]\n",
        )
        .expect("config");
        let store = StateStore::new(root.clone(), STATE_DIR);
        Binder::new(
            Sysfs::new(root),
            config,
            options,
            Some(store),
            self.metrics.clone(),
        )
        .expect("binder")
    }

    /// A binder whose first pass moved A from tenstorrent to vfio-pci (the
    /// kernel's part played), the writes of that pass cleared.
    pub fn bound(&self) -> Binder {
        self.function(A, 0x0018, Some("tenstorrent"), true);
        let mut b = self.binder(Options::default());
        assert_eq!(b.pass().expect("first pass").bound, vec![A.to_string()]);
        self.set_driver(A, Some("vfio-pci"));
        self.clear_writes();
        b
    }

    pub fn override_of(&self, bdf: &str) -> String {
        self.read(&format!("{}/driver_override", Self::dev(bdf)))
    }
}
