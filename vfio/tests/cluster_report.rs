//! The binder's report against the real API server: `ttdrv-vfio-manage
//! --once` over a planted sysfs tree writes its annotation and label on its
//! Node, and the driver policy's reading of that Node
//! (`ttdrv_core::node::passthrough`) is what the functions are. The policy's
//! side, from such a Node to a skipped node and a drain that keeps the VMs,
//! is tests/cluster_vfio.rs.

mod common;

use std::process::Command;

use common::*;
use ttdrv_api::vfio::{BOARD_TYPES, Passthrough};
use ttdrv_testkit::TestEnv;

/// One pass of the binary against the planted host, reporting on `node`.
fn binder_once(h: &Host, node: &str) {
    let config = h.path("config.yaml");
    std::fs::write(
        &config,
        "devices:\n- resourceName: tenstorrent.com/wormhole-vfio\n  vendorId: \"1e52\"\n  deviceId: [\"401e\"]\n",
    )
    .expect("config");
    let out = Command::new(env!("CARGO_BIN_EXE_ttdrv-vfio-manage"))
        .arg("--once")
        .arg("--host-root")
        .arg(h.dir.path())
        .arg("--config")
        .arg(&config)
        .args(["--metrics-addr=", "--state-dir="])
        .env("NODE_NAME", node)
        .status()
        .expect("running ttdrv-vfio-manage");
    // Its log is the test's output.
    assert!(out.success(), "ttdrv-vfio-manage --once: {out}");
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn the_binders_report_lands_on_its_node_as_the_driver_policy_reads_it() {
    let env = TestEnv::new("vfio-report").await;
    let node = env.tt_node_name("pt", &[]).await;
    // An n150 and an n300 already on vfio-pci (a restarted binder finds them
    // so), and a p150 (device 0xb140, not configured) on tt-kmd.
    let h = Host::new();
    h.function(A, 0x0018, Some("vfio-pci"), true);
    h.function(B, 0x0014, Some("vfio-pci"), true);
    binder_once(&h, &node);
    let n = env.get_node(&node).await;
    assert_eq!(
        ttdrv_core::node::passthrough(&n),
        Passthrough::All { vfio: 2 },
        "{:?}",
        n.metadata.annotations
    );
    assert_eq!(
        ttdrv_core::node::vfio_resources(&n),
        ["tenstorrent.com/wormhole-vfio"]
    );
    assert_eq!(ttdrv_core::node::label(&n, BOARD_TYPES), Some("n150.n300"));

    h.function("0000:03:00.0", 0x0041, Some("tenstorrent"), true);
    h.file("sys/devices/pci0000:00/0000:03:00.0/device", "0xb140\n");
    binder_once(&h, &node);
    let n = env.get_node(&node).await;
    assert_eq!(
        ttdrv_core::node::passthrough(&n),
        Passthrough::Some { vfio: 2, total: 3 },
        "a function tt-kmd serves: a mixed node"
    );
    env.teardown().await;
}
