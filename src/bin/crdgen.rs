//! Prints the TenstorrentDriverPolicy CRD as YAML; `make crds` writes it to crds/.
use kube::CustomResourceExt;
use ttdrv_api::TenstorrentDriverPolicy;

fn main() -> anyhow::Result<()> {
    print!(
        "{}",
        serde_yaml::to_string(&TenstorrentDriverPolicy::crd())?
    );
    Ok(())
}
