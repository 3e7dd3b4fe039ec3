//! Prints a CRD as YAML; `make crds` writes them to crds/: with no argument
//! the TenstorrentDriverPolicy, with `firmware` the TenstorrentFirmwarePolicy.
use kube::CustomResourceExt;
use ttdrv_api::TenstorrentDriverPolicy;
use ttdrv_api::firmware::TenstorrentFirmwarePolicy;

fn main() -> anyhow::Result<()> {
    let crd = match std::env::args().nth(1).as_deref() {
        None | Some("driver") => TenstorrentDriverPolicy::crd(),
        Some("firmware") => TenstorrentFirmwarePolicy::crd(),
        Some(other) => anyhow::bail!("unknown CRD {other:?}: driver or firmware"),
    };
    print!("{}", serde_yaml::to_string(&crd)?);
    Ok(())
}
