//! Build ahead (issue 22): which nodes' installer pods may be replaced ahead
//! of their disruptive cycle, so that each new agent builds and verifies the
//! target into the node's cache while the node keeps serving, and whether a
//! node's cycle may start. What the agent reports is read here too.
//!
//! Replacing an installer pod ahead of its cycle is safe because a new agent
//! never swaps a loaded module without the controller's go-ahead
//! ([`crate::go_ahead`]): until then it only builds (at nice 19), caches,
//! labels [`labels::KMD_PREPARED`] and waits, not Ready.
//!
//! The bound is a count of nodes preparing at once (`maxConcurrent`), not the
//! DaemonSet's `rollingUpdate.maxUnavailable`: the DaemonSet stays OnDelete so
//! the controller alone decides when a pod is replaced (the machine's
//! Upgrading step deletes it too), and what the bound protects is not node
//! availability (a preparing node serves) but the shared sources a build
//! pulls from at once: the registry (image pulls) and the git host (clones).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use ttdrv_api::labels;

use ttdrv_api::NodeState;

use crate::machine::{InstallerPod, Observation};
use crate::node::{
    Target, driver_labels_stale, keeps_module, label, loaded_parameters, loaded_version,
    same_version,
};

/// Condition and Event reason: an installed, not running kernel of a node
/// cannot build the target version (the agent's
/// [`labels::KMD_NEXT_KERNEL_FAILED`]). A warning; the node is not failed.
pub const NEXT_KERNEL_BUILD_FAILED: &str = "NextKernelBuildFailed";

/// The version the agent reports built, verified and cached for the running
/// kernel; None when it reported none at this boot (a reboot may have changed
/// the kernel, so an earlier boot's report does not count).
pub fn prepared_version(node: &Node) -> Option<&str> {
    if driver_labels_stale(node) {
        return None;
    }
    label(node, labels::KMD_PREPARED)
}

/// The node can take `target` without building inside its disruptive window:
/// its agent prepared it (the version in its cache, the parameters checked
/// against the module), or it is loaded already with those parameters.
pub fn is_prepared(node: &Node, target: Target<'_>) -> bool {
    same_version(prepared_version(node), target.version)
        || keeps_module(
            loaded_version(node),
            loaded_parameters(node).as_ref(),
            target,
        )
}

/// The installed kernel the target does not build for, if the agent said so.
pub fn next_kernel_failed(node: &Node) -> Option<&str> {
    label(node, labels::KMD_NEXT_KERNEL_FAILED)
}

/// The next-kernel warnings to announce (one Event each): nodes whose
/// warning (node -> kernel) is new in `now` or names another kernel than in
/// `before`, sorted by node. A warning that stays is announced once.
pub fn new_next_kernel_warnings(
    before: &BTreeMap<String, String>,
    now: &BTreeMap<String, String>,
) -> Vec<(String, String)> {
    now.iter()
        .filter(|(n, k)| before.get(*n) != Some(*k))
        .map(|(n, k)| (n.clone(), k.clone()))
        .collect()
}

/// A node as the prepare plan sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub name: String,
    /// Its installer pod runs an older template (it prepares nothing new).
    pub stale_pod: bool,
    /// [`is_prepared`] for the policy's target.
    pub prepared: bool,
    /// Its agent gave up with BuildFailed.
    pub build_failed: bool,
    /// In a disruptive cycle (Cordoning..Uncordoning): the machine replaces
    /// its pod, not the prepare plan.
    pub in_cycle: bool,
}

impl Candidate {
    /// A current pod still building: holds one of the `maxConcurrent` places.
    fn preparing(&self) -> bool {
        !self.stale_pod && !self.prepared && !self.build_failed && !self.in_cycle
    }
}

/// What the prepare plan decided.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Replace these nodes' installer pods now (sorted by name).
    pub replace: Vec<String>,
    /// Nodes preparing now (before `replace`).
    pub preparing: usize,
    /// Nodes prepared (the summary count in status).
    pub prepared: usize,
    /// Nodes whose build failed before any cordon, sorted.
    pub build_failed: Vec<String>,
}

/// The node as the prepare plan sees it, or None when it has nothing to
/// build ahead: not Ready (a pod replaced there may never start, and would
/// hold a place), nothing loaded (a first install disrupts nothing), the
/// target loaded already, or a DKMS host.
pub fn candidate(
    name: &str,
    obs: &Observation,
    state: NodeState,
    target: Target<'_>,
) -> Option<Candidate> {
    let loaded = obs.loaded.as_deref()?;
    if !obs.ready
        || obs.host_managed
        || keeps_module(Some(loaded), obs.parameters.as_ref(), target)
        || obs.vacated
    {
        return None;
    }
    Some(Candidate {
        name: name.to_string(),
        stale_pod: obs.installer == (InstallerPod::Stale { deleting: false }),
        prepared: obs.prepared,
        build_failed: state.is_failed(),
        in_cycle: state.is_in_progress(),
    })
}

/// Which stale installer pods to replace now so that at most `max_concurrent`
/// nodes prepare at once, taken in the order given (the rollout's, so the
/// first nodes to cycle are the first prepared). A Failed node is not
/// replaced here (the rollout policy decides what a failure does); a node in
/// a cycle is left to the machine. `max_concurrent` 0 is read as 1: a bound
/// of nothing would stop every rollout.
pub fn plan<'a>(
    candidates: impl IntoIterator<Item = &'a Candidate>,
    max_concurrent: usize,
) -> Plan {
    let all: Vec<&Candidate> = candidates.into_iter().collect();
    let preparing = all.iter().filter(|c| c.preparing()).count();
    let free = max_concurrent.max(1).saturating_sub(preparing);
    Plan {
        replace: all
            .iter()
            .filter(|c| c.stale_pod && !c.in_cycle && !c.build_failed && !c.prepared)
            .take(free)
            .map(|c| c.name.clone())
            .collect(),
        preparing,
        prepared: all.iter().filter(|c| c.prepared).count(),
        build_failed: all
            .iter()
            .filter(|c| c.build_failed)
            .map(|c| c.name.clone())
            .collect(),
    }
}

/// Whether a node waiting for a slot may start its disruptive cycle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Gate {
    Start,
    /// Not yet: why (for the node's message).
    Wait(String),
}

/// With build-ahead on, a node's cycle starts only once the target is in its
/// cache, so the cordon window holds a load, not a build. Off (the opt-out),
/// or for a node with no module loaded (nothing to disrupt), it starts as
/// before; and so it does when the node's current installer pod is
/// `overdue`: it has run past the upgrade timeout without preparing (an
/// agent image from before build-ahead never says it prepared; waiting for
/// it would stall the rollout for good, while a cycle that builds inside
/// its window is still cordoned and drained first).
pub fn gate(enabled: bool, node: &Node, target: Target<'_>, overdue: bool) -> Gate {
    if !enabled || overdue || loaded_version(node).is_none() || is_prepared(node, target) {
        return Gate::Start;
    }
    Gate::Wait(format!(
        "waiting for the installer to prepare {} (build and verify into the node's cache) before cordoning",
        target.version.trim()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(l: &[(&str, &str)]) -> Node {
        let mut n = Node::default();
        n.metadata.labels = Some(
            l.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        );
        n
    }

    fn c(name: &str, stale: bool, prepared: bool, failed: bool, in_cycle: bool) -> Candidate {
        Candidate {
            name: name.into(),
            stale_pod: stale,
            prepared,
            build_failed: failed,
            in_cycle,
        }
    }

    #[test]
    fn prepared_means_the_target_cached_or_loaded_at_this_boot() {
        let n = node(&[
            (labels::KMD_VERSION, "2.7.0"),
            (labels::KMD_PREPARED, "2.8.0"),
        ]);
        let t = Target::version;
        assert!(is_prepared(&n, t("2.8.0")));
        assert!(is_prepared(&n, t(" 2.8.0 ")));
        assert!(!is_prepared(&n, t("2.9.0")));
        assert!(is_prepared(
            &node(&[(labels::KMD_VERSION, "2.9.0")]),
            t("2.9.0")
        ));
        // Loaded, but with other module parameters than the target's: not
        // prepared until the agent says so.
        let mut loaded = node(&[(labels::KMD_VERSION, "2.9.0")]);
        loaded.metadata.annotations = Some(
            [(
                labels::KMD_PARAMETERS.to_string(),
                "max_devices=32 power_policy=Y".to_string(),
            )]
            .into(),
        );
        let four: ttdrv_api::module_params::Values =
            [("max_devices".to_string(), "4".to_string())].into();
        let thirty_two: ttdrv_api::module_params::Values =
            [("max_devices".to_string(), "32".to_string())].into();
        assert!(!is_prepared(&loaded, Target::new("2.9.0", &four)));
        assert!(is_prepared(&loaded, Target::new("2.9.0", &thirty_two)));
        // Reported at an earlier boot: does not count.
        let mut stale = node(&[
            (labels::KMD_BOOT_ID, "boot-1"),
            (labels::KMD_PREPARED, "2.8.0"),
        ]);
        stale.status = Some(k8s_openapi::api::core::v1::NodeStatus {
            node_info: Some(k8s_openapi::api::core::v1::NodeSystemInfo {
                boot_id: "boot-2".into(),
                ..Default::default()
            }),
            ..Default::default()
        });
        assert_eq!(prepared_version(&stale), None);
        assert!(!is_prepared(&stale, t("2.8.0")));
    }

    #[test]
    fn the_next_kernel_warning_is_read_from_its_label() {
        assert_eq!(
            next_kernel_failed(&node(&[(labels::KMD_NEXT_KERNEL_FAILED, "6.12.0-1-amd64")])),
            Some("6.12.0-1-amd64")
        );
        assert_eq!(next_kernel_failed(&node(&[])), None);
    }

    #[test]
    fn a_next_kernel_warning_is_announced_once_and_again_for_another_kernel() {
        let m = |l: &[(&str, &str)]| -> BTreeMap<String, String> {
            l.iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect()
        };
        let before = m(&[("a", "6.12.0-1"), ("b", "6.12.0-1")]);
        let now = m(&[("a", "6.12.0-1"), ("b", "6.13.0-1"), ("c", "6.12.0-1")]);
        assert_eq!(
            new_next_kernel_warnings(&before, &now),
            vec![
                ("b".to_string(), "6.13.0-1".to_string()),
                ("c".to_string(), "6.12.0-1".to_string())
            ]
        );
        assert!(new_next_kernel_warnings(&now, &now).is_empty());
        // Gone and back: announced again.
        assert_eq!(new_next_kernel_warnings(&BTreeMap::new(), &now).len(), 3);
    }

    #[test]
    fn at_most_max_concurrent_nodes_prepare_at_once() {
        let nodes: Vec<Candidate> = (0..5)
            .map(|i| c(&format!("n{i}"), true, false, false, false))
            .collect();
        let p = plan(&nodes, 2);
        assert_eq!(p.replace, vec!["n0", "n1"]);
        assert_eq!(p.preparing, 0);

        // Two replaced and building: nothing more until one is prepared.
        let mut nodes = nodes;
        nodes[0].stale_pod = false;
        nodes[1].stale_pod = false;
        let p = plan(&nodes, 2);
        assert_eq!(p.preparing, 2);
        assert!(p.replace.is_empty(), "{p:?}");

        nodes[0].prepared = true;
        let p = plan(&nodes, 2);
        assert_eq!(p.replace, vec!["n2"]);
        assert_eq!(p.prepared, 1);
    }

    #[test]
    fn failed_nodes_and_nodes_in_a_cycle_are_not_replaced_ahead() {
        let nodes = vec![
            c("a", true, false, true, false),
            c("b", true, false, false, true),
            c("c", true, false, false, false),
            // A current pod whose build failed holds no place.
            c("d", false, false, true, false),
        ];
        let p = plan(&nodes, 1);
        assert_eq!(p.replace, vec!["c"]);
        assert_eq!(p.preparing, 0);
        assert_eq!(p.build_failed, vec!["a", "d"]);
    }

    #[test]
    fn a_bound_of_zero_still_lets_one_node_prepare() {
        let nodes = vec![
            c("a", true, false, false, false),
            c("b", true, false, false, false),
        ];
        assert_eq!(plan(&nodes, 0).replace, vec!["a"]);
    }

    #[test]
    fn the_cycle_waits_for_the_prepared_module_unless_opted_out() {
        let building = node(&[(labels::KMD_VERSION, "2.7.0")]);
        assert!(
            matches!(gate(true, &building, Target::version("2.8.0"), false), Gate::Wait(w) if w.contains("prepare 2.8.0"))
        );
        assert_eq!(
            gate(false, &building, Target::version("2.8.0"), false),
            Gate::Start
        );
        let ready = node(&[
            (labels::KMD_VERSION, "2.7.0"),
            (labels::KMD_PREPARED, "2.8.0"),
        ]);
        assert_eq!(
            gate(true, &ready, Target::version("2.8.0"), false),
            Gate::Start
        );
        // An installer that never says it prepared: after the upgrade
        // timeout the cycle starts and builds inside its window.
        assert_eq!(
            gate(true, &building, Target::version("2.8.0"), true),
            Gate::Start
        );
        // Nothing loaded: nothing to disrupt, nothing to wait for.
        assert_eq!(
            gate(true, &node(&[]), Target::version("2.8.0"), false),
            Gate::Start
        );
    }
}
