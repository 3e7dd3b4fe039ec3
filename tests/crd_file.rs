//! The committed CRD is exactly what the types generate (`make crds` rewrites it).
use kube::CustomResourceExt;

#[test]
fn committed_crd_matches_generated() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/crds/tenstorrentdriverpolicies.yaml"
    );
    let committed =
        std::fs::read_to_string(path).expect("crds/tenstorrentdriverpolicies.yaml exists");
    let generated =
        serde_yaml::to_string(&ttdrv_api::TenstorrentDriverPolicy::crd()).expect("serializes");
    assert!(
        committed == generated,
        "crds/ is stale: run `make crds` and commit the result"
    );
}

#[test]
fn committed_firmware_crd_matches_generated() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/crds/tenstorrentfirmwarepolicies.yaml"
    );
    let committed =
        std::fs::read_to_string(path).expect("crds/tenstorrentfirmwarepolicies.yaml exists");
    let generated = serde_yaml::to_string(&ttdrv_api::firmware::TenstorrentFirmwarePolicy::crd())
        .expect("serializes");
    assert!(
        committed == generated,
        "crds/tenstorrentfirmwarepolicies.yaml is stale: run `make crds` and commit the result"
    );
}

/// The Go operator's printer columns come first, in its order; ours follow.
#[test]
fn printer_columns_start_with_the_go_operators() {
    let crd = ttdrv_api::TenstorrentDriverPolicy::crd();
    let cols: Vec<String> = crd.spec.versions[0]
        .additional_printer_columns
        .as_ref()
        .expect("printer columns")
        .iter()
        .map(|c| c.name.clone())
        .collect();
    assert_eq!(
        cols[..6],
        [
            "Version",
            "Matched",
            "UpToDate",
            "InProgress",
            "Failed",
            "Age"
        ]
    );
    assert!(cols[6..].iter().any(|c| c == "Phase"));
    assert!(cols[6..].iter().any(|c| c == "Done"));
}

/// A column named failed counts nodes that failed: `summary.failedNodes`,
/// not the Go summary's `failed` (desired − available), which is 3 on a
/// healthy rollout of 3 nodes. The Go field stays in the status, unprinted.
#[test]
fn the_failed_column_counts_failed_nodes_only() {
    let crd = ttdrv_api::TenstorrentDriverPolicy::crd();
    let cols = crd.spec.versions[0]
        .additional_printer_columns
        .as_ref()
        .expect("printer columns");
    let failed: Vec<&str> = cols
        .iter()
        .filter(|c| c.name.to_lowercase().contains("fail"))
        .map(|c| c.json_path.as_str())
        .collect();
    assert_eq!(failed, [".status.summary.failedNodes"]);
    assert!(
        cols.iter().all(|c| c.json_path != ".status.summary.failed"),
        "no column prints the Go summary's desired − available"
    );
    let status = serde_json::to_value(ttdrv_api::Summary::default()).expect("serializes");
    assert!(status.get("failed").is_some(), "the Go field is kept");
}
