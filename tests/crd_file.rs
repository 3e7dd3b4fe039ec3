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
