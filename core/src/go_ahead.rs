//! The controller's go-ahead for a module swap: the second key. The agent may
//! unload or replace a loaded module only while the Node carries a go-ahead
//! that names its policy, its node, its target version and the node's current
//! cycle, and the controller's persisted record agrees (the node is in
//! Upgrading for that cycle). A go-ahead copied from another node or left
//! from an earlier cycle therefore opens nothing. A first install (nothing
//! loaded) and a restart with the target already loaded swap nothing and need
//! none. Both the real agent and the simulated one decide with [`decide`].

use k8s_openapi::api::core::v1::Node;
use serde::{Deserialize, Serialize};
use ttdrv_api::{NodeState, labels};

use crate::node::{self, Target};
use crate::record::NodeRecord;
use ttdrv_api::module_params::{self, Values};

/// The go-ahead as written on the Node (annotation [`labels::GO_AHEAD`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GoAhead {
    pub policy: String,
    pub node: String,
    pub target: String,
    /// The cycle: when it started (the record's `started`, Unix seconds).
    pub cycle: i64,
    /// The go-ahead of a vacate cycle (`spec.unmanage`): unload only, load
    /// nothing. Absent on swap go-aheads, so older records read the same.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unload: bool,
}

impl GoAhead {
    /// The go-ahead for `record`'s cycle on `node`, if the record has one.
    pub fn for_cycle(node: &str, record: &NodeRecord) -> Option<Self> {
        Some(Self {
            policy: record.policy.clone(),
            node: node.to_string(),
            target: record.target.clone(),
            cycle: record.started?,
            unload: record.state == NodeState::Unloading,
        })
    }
}

/// The go-ahead the controller writes with `record` on `node` (annotation
/// [`labels::GO_AHEAD`]), if its state allows a module swap (or, in a vacate
/// cycle, an unload); none otherwise, and the annotation is removed.
pub fn for_record(node: &str, record: &NodeRecord) -> Option<GoAhead> {
    let swap = record.state == NodeState::Upgrading && !record.no_drain;
    (swap || record.state == NodeState::Unloading)
        .then(|| GoAhead::for_cycle(node, record))
        .flatten()
}

/// What the agent may do with the module loaded on its node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Swap {
    /// Nothing is loaded: a first install needs no go-ahead.
    FirstInstall,
    /// The target is loaded already: nothing to swap.
    AlreadyLoaded,
    /// A valid go-ahead for this node's current cycle: swap.
    GoAhead(GoAhead),
    /// Leave the loaded module alone; why, for the log and the status.
    Wait(String),
}

impl Swap {
    pub fn allowed(&self) -> bool {
        !matches!(self, Swap::Wait(_))
    }
}

/// The go-ahead annotation on `node`, or why there is none to act on.
fn annotated(node: &Node) -> Result<GoAhead, String> {
    let Some(raw) = node::annotation(node, labels::GO_AHEAD) else {
        return Err("none on the node yet (it comes after cordon and drain)".into());
    };
    serde_json::from_str::<GoAhead>(raw)
        .map_err(|_| format!("{} is not readable", labels::GO_AHEAD))
}

/// The node's record (`what` names it in the reason when there is none).
fn record_of(node: &Node, what: &str) -> Result<NodeRecord, String> {
    match node::record(node) {
        Ok(Some(r)) => Ok(r),
        Ok(None) => Err(format!("no {what} on the node")),
        Err(e) => Err(format!("unreadable {what}: {e}")),
    }
}

/// The agent's decision, from the Node as the API server has it now, for
/// the module loaded now: version `loaded`, parameters `in_effect` (sysfs).
/// The same version loaded with other module parameters than the target's
/// is a swap too (a reload), with the same go-ahead.
pub fn decide(
    node: &Node,
    policy: &str,
    target: Target<'_>,
    loaded: Option<&str>,
    in_effect: Option<&Values>,
) -> Swap {
    let Some(loaded) = loaded else {
        return Swap::FirstInstall;
    };
    if node::is_loaded(Some(loaded), in_effect, target) {
        return Swap::AlreadyLoaded;
    }
    match swap_go_ahead(node, policy, target.version) {
        Ok(go) => Swap::GoAhead(go),
        Err(why) => Swap::Wait(format!(
            "waiting for the controller's go-ahead to {}: {why}",
            swap_description(loaded, in_effect, target)
        )),
    }
}

/// What a swap does, in words: `replace tt-kmd 2.7.0 with 2.8.0`, or for
/// the same version with other parameters `reload tt-kmd 2.8.0 with module
/// parameters max_devices=4 (now: max_devices=32 (wanted 4))`.
pub fn swap_description(loaded: &str, in_effect: Option<&Values>, target: Target<'_>) -> String {
    if node::same_version(Some(loaded), target.version) {
        format!(
            "reload tt-kmd {loaded} with module parameters {} (now: {})",
            module_params::canonical(target.parameters),
            module_params::describe(&module_params::mismatches(target.parameters, in_effect))
        )
    } else {
        format!("replace tt-kmd {loaded} with {}", target.version)
    }
}

/// The go-ahead for swapping to `target` in this node's current Upgrading
/// cycle, or why there is none.
fn swap_go_ahead(node: &Node, policy: &str, target: &str) -> Result<GoAhead, String> {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let go = annotated(node)?;
    if go.policy != policy || go.node != name || go.target != target || go.unload {
        return Err(format!(
            "the go-ahead is for policy {:?}, node {:?}, version {:?}",
            go.policy, go.node, go.target
        ));
    }
    let rec = record_of(node, "upgrade record")?;
    let current = rec.policy == policy
        && rec.target == target
        && rec.state == NodeState::Upgrading
        && rec.started == Some(go.cycle)
        && !rec.no_drain;
    if !current {
        return Err(format!(
            "the go-ahead is not for the current cycle (record: {} {} for {})",
            rec.policy,
            rec.state.as_str(),
            rec.target
        ));
    }
    Ok(go)
}

/// What the agent of a `spec.unmanage` policy may do: unload the module
/// (whatever is loaded, or nothing) only with a go-ahead for this node's
/// current Unloading cycle, written after cordon and drain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unload {
    GoAhead(GoAhead),
    Wait(String),
}

/// The unload decision, from the Node as the API server has it now.
pub fn decide_unload(node: &Node, policy: &str) -> Unload {
    match unload_go_ahead(node, policy) {
        Ok(go) => Unload::GoAhead(go),
        Err(why) => Unload::Wait(format!(
            "waiting for the controller's go-ahead to unload tt-kmd: {why}"
        )),
    }
}

/// The go-ahead for unloading in this node's current Unloading cycle, or why
/// there is none.
fn unload_go_ahead(node: &Node, policy: &str) -> Result<GoAhead, String> {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let go = annotated(node)?;
    if !go.unload || go.policy != policy || go.node != name {
        return Err(format!(
            "the go-ahead is for policy {:?}, node {:?}, unload {}",
            go.policy, go.node, go.unload
        ));
    }
    let rec = record_of(node, "record")?;
    let current = rec.policy == policy
        && rec.state == NodeState::Unloading
        && rec.started == Some(go.cycle)
        && rec.target == go.target;
    if !current {
        return Err(format!(
            "the go-ahead is not for the current cycle (record: {} {})",
            rec.policy,
            rec.state.as_str()
        ));
    }
    Ok(go)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::Cordon;

    fn record(state: NodeState, started: i64) -> NodeRecord {
        let mut r = NodeRecord::new("fleet", "2.8.0", started);
        r.state = state;
        r.started = Some(started);
        r.cordon = Cordon::Ours;
        r
    }

    fn node(rec: Option<&NodeRecord>, go: Option<&GoAhead>) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some("n1".into());
        let mut a = std::collections::BTreeMap::new();
        if let Some(r) = rec {
            a.insert(
                labels::UPGRADE_STATE.to_string(),
                serde_json::to_string(r).expect("record"),
            );
        }
        if let Some(g) = go {
            a.insert(
                labels::GO_AHEAD.to_string(),
                serde_json::to_string(g).expect("go-ahead"),
            );
        }
        n.metadata.annotations = Some(a);
        n
    }

    #[test]
    fn no_go_ahead_needed_when_nothing_is_swapped() {
        let n = node(None, None);
        assert_eq!(
            decide(&n, "fleet", Target::version("2.8.0"), None, None),
            Swap::FirstInstall
        );
        assert_eq!(
            decide(&n, "fleet", Target::version("2.8.0"), Some("2.8.0"), None),
            Swap::AlreadyLoaded
        );
    }

    #[test]
    fn other_module_parameters_are_a_swap_with_the_same_go_ahead() {
        let four: Values = [("max_devices".to_string(), "4".to_string())].into();
        let sysfs: Values = [("max_devices".to_string(), "32".to_string())].into();
        let target = Target::new("2.8.0", &four);
        let n = node(None, None);
        let d = decide(&n, "fleet", target, Some("2.8.0"), Some(&sysfs));
        assert!(
            matches!(&d, Swap::Wait(why) if why.contains(
                "reload tt-kmd 2.8.0 with module parameters max_devices=4 (now: max_devices=32 (wanted 4))"
            )),
            "{d:?}"
        );
        let r = record(NodeState::Upgrading, 100);
        let go = GoAhead::for_cycle("n1", &r).expect("cycle");
        let n = node(Some(&r), Some(&go));
        assert_eq!(
            decide(&n, "fleet", target, Some("2.8.0"), Some(&sysfs)),
            Swap::GoAhead(go)
        );
        let now: Values = [("max_devices".to_string(), "4".to_string())].into();
        assert_eq!(
            decide(&n, "fleet", target, Some("2.8.0"), Some(&now)),
            Swap::AlreadyLoaded
        );
    }

    #[test]
    fn a_valid_go_ahead_opens_the_swap() {
        let r = record(NodeState::Upgrading, 100);
        let go = GoAhead::for_cycle("n1", &r).expect("cycle");
        let n = node(Some(&r), Some(&go));
        assert_eq!(
            decide(&n, "fleet", Target::version("2.8.0"), Some("2.7.0"), None),
            Swap::GoAhead(go)
        );
    }

    #[test]
    fn every_mismatch_waits() {
        let r = record(NodeState::Upgrading, 100);
        let go = GoAhead::for_cycle("n1", &r).expect("cycle");
        let stale = GoAhead {
            cycle: 50,
            ..go.clone()
        };
        let copied = GoAhead {
            node: "n2".into(),
            ..go.clone()
        };
        let other_policy = GoAhead {
            policy: "other".into(),
            ..go.clone()
        };
        let other_target = GoAhead {
            target: "2.9.0".into(),
            ..go.clone()
        };
        let cases: Vec<(&str, Node)> = vec![
            ("no go-ahead", node(Some(&r), None)),
            ("stale cycle", node(Some(&r), Some(&stale))),
            ("copied from n2", node(Some(&r), Some(&copied))),
            ("another policy", node(Some(&r), Some(&other_policy))),
            ("another target", node(Some(&r), Some(&other_target))),
            ("no record", node(None, Some(&go))),
            (
                "record still Draining",
                node(Some(&record(NodeState::Draining, 100)), Some(&go)),
            ),
            (
                "record already Done",
                node(Some(&record(NodeState::Done, 100)), Some(&go)),
            ),
        ];
        for (name, n) in cases {
            let d = decide(&n, "fleet", Target::version("2.8.0"), Some("2.7.0"), None);
            assert!(
                matches!(&d, Swap::Wait(why) if why.contains("go-ahead")),
                "{name}: {d:?}"
            );
        }
        let mut restart = record(NodeState::Upgrading, 100);
        restart.no_drain = true;
        let go = GoAhead::for_cycle("n1", &restart).expect("cycle");
        assert!(
            !decide(
                &node(Some(&restart), Some(&go)),
                "fleet",
                Target::version("2.8.0"),
                Some("2.7.0"),
                None,
            )
            .allowed(),
            "a cycle without drain never swaps a loaded module"
        );
    }

    #[test]
    fn unload_needs_the_go_ahead_of_the_current_unloading_cycle() {
        let r = record(NodeState::Unloading, 100);
        let go = GoAhead::for_cycle("n1", &r).expect("cycle");
        assert!(go.unload);
        assert_eq!(
            decide_unload(&node(Some(&r), Some(&go)), "fleet"),
            Unload::GoAhead(go.clone())
        );
        let swap = GoAhead::for_cycle("n1", &record(NodeState::Upgrading, 100)).expect("cycle");
        assert!(!swap.unload);
        let cases: Vec<(&str, Node)> = vec![
            ("no go-ahead", node(Some(&r), None)),
            ("a swap go-ahead", node(Some(&r), Some(&swap))),
            (
                "stale cycle",
                node(
                    Some(&r),
                    Some(&GoAhead {
                        cycle: 50,
                        ..go.clone()
                    }),
                ),
            ),
            (
                "copied",
                node(
                    Some(&r),
                    Some(&GoAhead {
                        node: "n2".into(),
                        ..go.clone()
                    }),
                ),
            ),
            (
                "other policy",
                node(
                    Some(&r),
                    Some(&GoAhead {
                        policy: "o".into(),
                        ..go.clone()
                    }),
                ),
            ),
            ("no record", node(None, Some(&go))),
            (
                "still Draining",
                node(Some(&record(NodeState::Draining, 100)), Some(&go)),
            ),
        ];
        for (name, n) in cases {
            assert!(
                matches!(decide_unload(&n, "fleet"), Unload::Wait(_)),
                "{name}"
            );
        }
        // An unload go-ahead never opens a swap.
        let n = node(Some(&r), Some(&go));
        assert!(!decide(&n, "fleet", Target::version("2.8.0"), Some("2.7.0"), None).allowed());
    }

    mod written_go_aheads {
        use super::*;
        use proptest::prelude::*;

        const POLICIES: [&str; 2] = ["fleet", "other"];
        const TARGETS: [&str; 2] = ["2.8.0", "2.9.0"];
        const NODES: [&str; 2] = ["n1", "n2"];

        fn any_record() -> impl Strategy<Value = NodeRecord> {
            (
                0..NodeState::ALL.len(),
                0..2usize,
                0..2usize,
                any::<bool>(),
                proptest::option::of(0..3i64),
            )
                .prop_map(|(s, p, t, no_drain, started)| {
                    let mut r = NodeRecord::new(POLICIES[p], TARGETS[t], 0);
                    r.state = NodeState::ALL[s];
                    r.no_drain = no_drain;
                    r.started = started;
                    r.cordon = Cordon::Ours;
                    r
                })
        }

        /// A go-ahead on the Node: the one the controller writes with the
        /// record (`None`: whatever it writes, possibly none), or any other.
        fn any_go_ahead() -> impl Strategy<Value = Option<GoAhead>> {
            proptest::option::of(
                (0..2usize, 0..2usize, 0..2usize, 0..3i64, any::<bool>()).prop_map(
                    |(p, n, t, cycle, unload)| GoAhead {
                        policy: POLICIES[p].into(),
                        node: NODES[n].into(),
                        target: TARGETS[t].into(),
                        cycle,
                        unload,
                    },
                ),
            )
        }

        proptest! {
            /// The agent of policy `fleet` on `n1`, with 2.7.0 loaded and
            /// 2.8.0 its target, swaps exactly when the go-ahead on the Node
            /// is the one the controller writes with the record there, for
            /// that policy and target; likewise for an unload.
            #[test]
            fn decide_accepts_exactly_the_go_ahead_written_with_the_record(
                rec in any_record(),
                other in any_go_ahead(),
            ) {
                let written = for_record("n1", &rec);
                let go = other.or_else(|| written.clone());
                let n = node(Some(&rec), go.as_ref());
                let ours = rec.policy == "fleet" && written.is_some() && go == written;
                let swap = decide(&n, "fleet", Target::version("2.8.0"), Some("2.7.0"), None);
                prop_assert_eq!(
                    swap.allowed(),
                    ours && rec.target == "2.8.0" && rec.state == NodeState::Upgrading,
                    "{:?} with {:?}: {:?}", rec, go, swap
                );
                let unload = decide_unload(&n, "fleet");
                prop_assert_eq!(
                    matches!(unload, Unload::GoAhead(_)),
                    ours && rec.state == NodeState::Unloading,
                    "{:?} with {:?}: {:?}", rec, go, unload
                );
            }
        }
    }
}
