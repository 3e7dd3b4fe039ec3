//! Waits, before this controller takes part in leader election, until no
//! controller pod of the Go operator runs in the operator's namespace
//! ([`ttdrv_core::handover`] says which pods those are). The wait does not
//! hold back readiness: a rolling `helm upgrade` from the Go chart stops the
//! Go pod only once ours is Ready.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Client};
use ttdrv_core::handover;

/// How often the namespace is listed while a Go controller pod runs.
const POLL: Duration = Duration::from_secs(2);

/// Returns once no Go controller pod runs in `namespace`. Says which pods it
/// waits for whenever that set changes; an error to list is logged and retried.
pub async fn wait_for_go_controller(client: &Client, namespace: &str) {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let lp = ListParams::default().labels(&handover::controller_pods_selector());
    let mut waited_for: Vec<String> = vec![];
    loop {
        match api.list(&lp).await {
            Ok(list) => {
                let running = handover::running_go_controllers(&list.items);
                if running.is_empty() {
                    if !waited_for.is_empty() {
                        tracing::info!(
                            namespace,
                            "the Go operator's controller has stopped; going on"
                        );
                    }
                    return;
                }
                if running != waited_for {
                    tracing::warn!(
                        namespace,
                        pods = running.join(", "),
                        "not acting while the Go operator's controller runs: waiting for pod(s) {} to stop (a helm upgrade from the Go chart stops them once this pod is Ready)",
                        running
                            .iter()
                            .map(|p| format!("{namespace}/{p}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                    waited_for = running;
                }
            }
            Err(e) => tracing::warn!(
                namespace,
                error = %e,
                "listing controller pods to check for the Go operator's controller; retrying"
            ),
        }
        tokio::time::sleep(POLL).await;
    }
}
