//! The hand-over from the Go operator's controller. A `helm upgrade` from the
//! Go chart rolls the same Deployment (same name and selector): the new pod,
//! ours, starts while the Go pod still runs, and the Go controller holds no
//! lease of ours. Until every Go controller pod in the operator's namespace
//! has stopped, ours must not act: two controllers would cordon and drain the
//! same nodes by different rules.

use k8s_openapi::api::core::v1::Pod;

use ttdrv_api::labels;

/// The Go chart's controller container; ours is named `controller`.
pub const GO_CONTROLLER_CONTAINER: &str = "manager";

/// The label selector that lists controller pods (the Go chart's and ours).
pub fn controller_pods_selector() -> String {
    format!("{}=controller", labels::COMPONENT)
}

/// Whether `pod` is a Go controller pod whose process may still run: it
/// carries the controller component label and a `manager` container, and
/// has not finished (a terminating pod runs until its grace period ends, so
/// it counts until it is gone).
pub fn is_running_go_controller(pod: &Pod) -> bool {
    let component = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(labels::COMPONENT))
        .is_some_and(|c| c == "controller");
    let manager = pod.spec.as_ref().is_some_and(|s| {
        s.containers
            .iter()
            .any(|c| c.name == GO_CONTROLLER_CONTAINER)
    });
    let finished = matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded") | Some("Failed")
    );
    component && manager && !finished
}

/// The names of the Go controller pods among `pods` that may still run, sorted.
pub fn running_go_controllers(pods: &[Pod]) -> Vec<String> {
    let mut names: Vec<String> = pods
        .iter()
        .filter(|p| is_running_go_controller(p))
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    names.sort();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, component: Option<&str>, container: &str, phase: Option<&str>) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": name,
                "labels": component.map(|c| serde_json::json!({ labels::COMPONENT: c })),
                "deletionTimestamp": (name == "terminating").then_some("2026-01-01T00:00:00Z"),
            },
            "spec": { "containers": [{ "name": container, "image": "x" }] },
            "status": { "phase": phase },
        }))
        .expect("pod fixture")
    }

    #[test]
    fn only_live_go_controller_pods_hold_ours_back() {
        let pods = [
            pod("go", Some("controller"), "manager", Some("Running")),
            pod("go-pending", Some("controller"), "manager", None),
            pod(
                "terminating",
                Some("controller"),
                "manager",
                Some("Running"),
            ),
            pod("go-done", Some("controller"), "manager", Some("Succeeded")),
            pod("go-failed", Some("controller"), "manager", Some("Failed")),
            pod("ours", Some("controller"), "controller", Some("Running")),
            pod("installer", Some("driver"), "manager", Some("Running")),
            pod("unlabelled", None, "manager", Some("Running")),
        ];
        assert_eq!(
            running_go_controllers(&pods),
            ["go", "go-pending", "terminating"]
        );
        assert_eq!(
            controller_pods_selector(),
            "app.kubernetes.io/component=controller"
        );
    }
}
