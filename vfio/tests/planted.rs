//! The binder against a planted sysfs tree (tests/common): each test plays
//! the kernel's part and checks what the binder wrote.

mod common;

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

use ttdrv_agent::HostRoot;
use ttdrv_vfio::VfioError;
use ttdrv_vfio::binder::Options;
use ttdrv_vfio::sysfs::Sysfs;

use common::*;

#[test]
fn a_function_on_tt_kmd_is_moved_to_vfio_pci_and_reported() {
    let h = Host::new();
    h.function(A, 0x0018, Some("tenstorrent"), true);
    h.telemetry(A, "n150", "S-0001");
    let out = h.binder(Options::default()).pass().expect("pass");
    assert_eq!(out.bound, vec![A.to_string()]);
    assert_eq!(out.errors, 0);
    assert_eq!(h.read("sys/bus/pci/drivers/tenstorrent/unbind"), A);
    assert_eq!(h.override_of(A), "vfio-pci");
    assert_eq!(h.read("sys/bus/pci/drivers/vfio-pci/bind"), A);
    assert_eq!(
        out.report.to_annotation(),
        r#"{"bootId":"b0071d","drivers":{"vfio-pci":1},"vfioResources":["tenstorrent.com/wormhole"]}"#
    );
    assert_eq!(out.board_types.as_deref(), Some("n150"));
    let state = h.read("var/lib/tt-vfio/state.json");
    assert!(
        state.contains(r#""originalDriver": "tenstorrent""#) && state.contains("S-0001"),
        "{state}"
    );
    let m = h.metrics.encode();
    assert!(
        m.contains(r#"tt_vfio_devices_bound_total{resource="tenstorrent.com/wormhole"} 1"#),
        "{m}"
    );
    assert!(m.contains(r#"tt_vfio_device_info{bdf="0000:01:00.0",board_type="n150",resource="tenstorrent.com/wormhole",serial="S-0001"} 1"#), "{m}");
}

#[test]
fn a_second_pass_over_bound_functions_writes_nothing() {
    let h = Host::new();
    let mut b = h.bound();
    let out = b.pass().expect("second");
    assert!(out.bound.is_empty() && out.errors == 0);
    assert_eq!(out.on_vfio, 1);
    for f in ["tenstorrent/unbind", "vfio-pci/bind", "vfio-pci/unbind"] {
        assert_eq!(h.read(&format!("sys/bus/pci/drivers/{f}")), "", "{f}");
    }
}

#[test]
fn restore_puts_recorded_functions_back_and_leaves_the_others() {
    let h = Host::new();
    h.function(B, 0x0014, Some("vfio-pci"), true); // on vfio-pci before the binder
    let mut b = h.bound();
    let r = b.restore().expect("restore");
    assert_eq!((r.restored, r.errors), (vec![A.to_string()], 0));
    assert_eq!(
        h.read("sys/bus/pci/drivers/vfio-pci/unbind"),
        A,
        "B was not touched"
    );
    assert_eq!(
        h.override_of(A),
        "\n",
        "cleared with a newline, not an empty write"
    );
    assert_eq!(h.override_of(B), "(null)\n");
    assert_eq!(h.read("sys/bus/pci/drivers/tenstorrent/bind"), A);
    assert!(b.state().functions.is_empty());
    assert!(!h.read("var/lib/tt-vfio/state.json").contains(A));
}

#[test]
fn restore_lets_the_kernel_probe_when_the_original_driver_is_gone() {
    let h = Host::new();
    let mut b = h.bound();
    fs::remove_dir_all(h.path("sys/bus/pci/drivers/tenstorrent")).expect("unload tt-kmd");
    assert_eq!(b.restore().expect("restore").errors, 0);
    assert_eq!(h.read("sys/bus/pci/drivers_probe"), A);
}

#[test]
fn the_state_survives_a_restart() {
    let h = Host::new();
    h.function(A, 0x1234, Some("tenstorrent"), true);
    h.telemetry(A, "p150", "S-9");
    h.binder(Options::default()).pass().expect("pass");
    // Now on vfio-pci: tt-kmd's telemetry is gone, and so is the first binder.
    h.set_driver(A, Some("vfio-pci"));
    fs::remove_dir_all(h.path(&format!("{}/tenstorrent", Host::dev(A)))).expect("rm telemetry");
    let mut b = h.binder(Options::default());
    let out = b.pass().expect("pass after the restart");
    assert_eq!(
        out.board_types.as_deref(),
        Some("p150"),
        "identity from the state file"
    );
    assert!(h.metrics.encode().contains(r#"serial="S-9""#));
    assert_eq!(b.restore().expect("restore").restored, vec![A.to_string()]);
    assert_eq!(h.read("sys/bus/pci/drivers/tenstorrent/bind"), A);
}

#[test]
fn board_types_come_from_the_subsystem_then_telemetry_else_unknown() {
    let h = Host::new();
    h.function(A, 0x0014, Some("tenstorrent"), true);
    h.function(B, 0x1234, Some("tenstorrent"), true);
    h.telemetry(B, "P150", "S-2");
    h.function("0000:03:00.0", 0x4321, None, true);
    let out = h.binder(Options::default()).pass().expect("pass");
    assert_eq!(out.board_types.as_deref(), Some("n300.p150.unknown"));
}

#[test]
fn a_device_link_escaping_sysfs_is_refused_and_nothing_written() {
    let h = Host::new();
    h.function(A, 0x0018, Some("tenstorrent"), true);
    // A planted "function" whose link leads out of /sys/devices.
    h.file("etc/vendor", "0x1e52\n");
    h.file("etc/device", "0x401e\n");
    symlink(
        "../../../../../etc",
        h.path(&format!("sys/bus/pci/devices/{B}")),
    )
    .expect("link");
    symlink("/etc", h.path("sys/bus/pci/devices/0000:03:00.0")).expect("link");
    let sysfs = Sysfs::new(HostRoot::new(h.dir.path()));
    let (functions, refused) = sysfs.scan().expect("scan");
    assert_eq!(
        functions.iter().map(|f| f.bdf.as_str()).collect::<Vec<_>>(),
        vec![A]
    );
    assert_eq!(refused.len(), 2);
    assert!(
        refused
            .iter()
            .all(|e| matches!(e, VfioError::LinkEscapes { .. })),
        "{refused:?}"
    );
    assert!(
        refused[0].to_string().contains("outside /sys/devices"),
        "{}",
        refused[0]
    );
    // A link inside /sys/devices is refused by the link-free walk.
    fs::rename(h.path("sys/devices/pci0000:00"), h.path("sys/devices/real")).expect("mv");
    symlink("real", h.path("sys/devices/pci0000:00")).expect("link");
    let (functions, refused) = sysfs.scan().expect("scan");
    assert!(functions.is_empty());
    assert!(
        refused[0].to_string().contains("symbolic link"),
        "{}",
        refused[0]
    );
    let out = h.binder(Options::default()).pass().expect("pass");
    assert!(out.bound.is_empty());
    assert_eq!(h.read("sys/bus/pci/drivers/tenstorrent/unbind"), "");
}

#[test]
fn without_an_iommu_the_function_is_refused_untouched() {
    let h = Host::new();
    h.function(A, 0x0018, Some("tenstorrent"), false);
    let out = h.binder(Options::default()).pass().expect("pass");
    assert_eq!((out.bound.len(), out.errors), (0, 1));
    assert_eq!(
        h.read("sys/bus/pci/drivers/tenstorrent/unbind"),
        "",
        "not unbound"
    );
    assert_eq!(h.override_of(A), "(null)\n");
    assert!(
        h.metrics
            .encode()
            .contains(r#"tt_vfio_bind_errors_total{action="bind"} 1"#)
    );
    assert!(
        !h.path("var/lib/tt-vfio/state.json").exists(),
        "nothing recorded"
    );
}

#[test]
fn noiommu_turns_the_unsafe_mode_on_then_binds() {
    let h = Host::new();
    h.function(A, 0x0018, Some("tenstorrent"), false);
    let noiommu = Options {
        allow_noiommu: true,
        ..Options::default()
    };
    // A kernel without the mode: a clear error, nothing unbound.
    let out = h.binder(noiommu.clone()).pass().expect("pass");
    assert_eq!(out.errors, 1);
    assert_eq!(h.read("sys/bus/pci/drivers/tenstorrent/unbind"), "");

    h.file(
        "sys/module/vfio/parameters/enable_unsafe_noiommu_mode",
        "N\n",
    );
    let out = h.binder(noiommu).pass().expect("pass");
    assert_eq!((out.bound, out.errors), (vec![A.to_string()], 0));
    assert_eq!(
        h.read("sys/module/vfio/parameters/enable_unsafe_noiommu_mode"),
        "Y"
    );
    assert_eq!(h.read("sys/bus/pci/drivers/vfio-pci/bind"), A);
    assert!(h.metrics.encode().contains("tt_vfio_noiommu_mode 1"));
}

#[test]
fn a_failed_bind_clears_the_override() {
    let h = Host::new();
    h.function(A, 0x0018, Some("tenstorrent"), true);
    fs::remove_file(h.path("sys/bus/pci/drivers/vfio-pci/bind")).expect("rm");
    let out = h.binder(Options::default()).pass().expect("pass");
    assert_eq!(out.errors, 1);
    assert_eq!(h.override_of(A), "\n");
}

#[test]
fn vfio_pci_is_loaded_only_when_a_function_is_to_be_bound() {
    let h = Host::new();
    fs::remove_dir_all(h.path("sys/bus/pci/drivers/vfio-pci")).expect("rm");
    // Nothing to bind (no Tenstorrent function here): no modprobe, no error.
    let out = h.binder(Options::default()).pass().expect("pass");
    assert_eq!((out.errors, out.bound.len()), (0, 0));
    // A function to bind, and vfio-pci cannot be loaded (the planted host
    // has no modprobe): a bind error, the function left where it is.
    h.function(A, 0x0018, Some("tenstorrent"), true);
    let out = h.binder(Options::default()).pass().expect("pass");
    assert_eq!(out.errors, 1);
    assert_eq!(h.read("sys/bus/pci/drivers/tenstorrent/unbind"), "");
    assert_eq!(h.override_of(A), "(null)\n");
}

#[test]
fn the_hotplug_stub_is_offered_each_function_first() {
    let h = Host::new();
    h.function(A, 0x0018, Some("tenstorrent"), true);
    h.file("sys/bus/pci/drivers/tenstorrent-simple/bind", "");
    let stub = Options {
        hotplug_stub: Some("tenstorrent-simple".into()),
        ..Options::default()
    };
    let out = h.binder(stub).pass().expect("pass");
    assert_eq!(out.bound, vec![A.to_string()]);
    assert_eq!(h.read("sys/bus/pci/drivers/tenstorrent-simple/bind"), A);
    assert_eq!(h.override_of(A), "vfio-pci", "the stub's override replaced");
    assert!(Path::new(&h.path("sys/bus/pci/drivers/vfio-pci/bind")).exists());
}
