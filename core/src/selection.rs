//! Which policy owns which node. A node is matched by a policy when the policy's
//! selector matches, the Tenstorrent PCI label is "true" (unless
//! [`Eligibility::require_tenstorrent_label`] is off, for clusters without NFD)
//! and the skip label is absent. [`Eligibility`] is the one definition: the
//! controller's selection and the installer DaemonSet's affinity both use it. When several policies match one node, the oldest (creationTimestamp,
//! then name) owns it and the others report a Conflict naming it.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Node;
use ttdrv_api::{TenstorrentDriverPolicy, labels};

/// Which nodes any policy may select at all, besides its own selector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Eligibility {
    /// The NFD label `feature.node.kubernetes.io/pci-1200_1e52.present=true` is
    /// required (the chart's `controller.requireTenstorrentLabel`, default on;
    /// off for clusters without NFD, where the policy's selector alone picks
    /// the Tenstorrent nodes).
    pub require_tenstorrent_label: bool,
}

impl Default for Eligibility {
    fn default() -> Self {
        Eligibility {
            require_tenstorrent_label: true,
        }
    }
}

impl Eligibility {
    /// The node-label requirements every selected node meets, as
    /// `(key, operator, values)`: the DaemonSet's affinity renders them, and
    /// [`Eligibility::eligible`] checks the same.
    pub fn requirements(&self) -> Vec<(&'static str, &'static str, &'static [&'static str])> {
        let mut out: Vec<(&'static str, &'static str, &'static [&'static str])> = vec![];
        if self.require_tenstorrent_label {
            out.push((labels::TT_PCI_PRESENT, "In", &["true"]));
        }
        out.push((labels::SKIP, "DoesNotExist", &[]));
        out
    }

    /// True when the node may be selected: it meets [`Self::requirements`]
    /// and is not being deleted.
    pub fn eligible(&self, node: &Node) -> bool {
        let empty = BTreeMap::new();
        let l = node.metadata.labels.as_ref().unwrap_or(&empty);
        node.metadata.deletion_timestamp.is_none()
            && self.requirements().iter().all(|(k, op, values)| match *op {
                "In" => l.get(*k).is_some_and(|v| values.contains(&v.as_str())),
                "DoesNotExist" => !l.contains_key(*k),
                _ => false,
            })
    }

    pub fn matches(&self, policy: &TenstorrentDriverPolicy, node: &Node) -> bool {
        let empty = BTreeMap::new();
        let node_labels = node.metadata.labels.as_ref().unwrap_or(&empty);
        self.eligible(node)
            && policy
                .spec
                .selector()
                .is_some_and(|s| s.matches(node_labels))
    }
}

/// True when the node is a Tenstorrent node that has not opted out (the
/// default [`Eligibility`]).
pub fn eligible(node: &Node) -> bool {
    Eligibility::default().eligible(node)
}

pub fn matches(policy: &TenstorrentDriverPolicy, node: &Node) -> bool {
    Eligibility::default().matches(policy, node)
}

/// Sort key of policy age: older first.
fn age_key(p: &TenstorrentDriverPolicy) -> (String, String) {
    (
        p.metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.to_string())
            .unwrap_or_default(),
        p.metadata.name.clone().unwrap_or_default(),
    )
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Assignment {
    /// policy -> nodes it owns (sorted).
    pub owned: BTreeMap<String, Vec<String>>,
    /// policy -> matched nodes owned by an older policy (sorted), with the owner.
    pub conflicts: BTreeMap<String, Vec<(String, String)>>,
}

impl Assignment {
    pub fn owner_of<'a>(&'a self, node: &str) -> Option<&'a str> {
        self.owned
            .iter()
            .find(|(_, nodes)| nodes.binary_search_by(|n| n.as_str().cmp(node)).is_ok())
            .map(|(p, _)| p.as_str())
    }
}

/// Who owns one node, and which other policies match it (the losers, by
/// name): one node's share of an [`Assignment`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct NodeClaim {
    pub owner: Option<String>,
    pub losers: Vec<String>,
}

impl Assignment {
    /// This assignment's decision for one node.
    pub fn claim(&self, node: &str) -> NodeClaim {
        let mut losers: Vec<String> = self
            .conflicts
            .iter()
            .filter(|(_, nodes)| {
                nodes
                    .binary_search_by(|(n, _)| n.as_str().cmp(node))
                    .is_ok()
            })
            .map(|(p, _)| p.clone())
            .collect();
        losers.sort();
        NodeClaim {
            owner: self.owner_of(node).map(String::from),
            losers,
        }
    }
}

/// Policies the cluster refuses (their DaemonSet cannot be applied): they
/// keep only the nodes they are in the middle of a cycle on, so a broken
/// policy cannot capture nodes from one that works.
pub type Refused = BTreeSet<String>;

/// `policy` may own `node`: it matches, and if refused it holds the node
/// already (its claim, or a cycle of its own under way there). A refused
/// spec captures nothing new, and lets go of nothing the accepted one held:
/// its claims, and so its installer pods, stay.
fn may_own(
    policy: &TenstorrentDriverPolicy,
    node: &Node,
    refused: &Refused,
    rules: Eligibility,
) -> bool {
    let name = policy.metadata.name.as_deref().unwrap_or_default();
    // A `spec.unmanage` policy owns its nodes like any other: it vacates
    // them (machine::vacate) and then leaves them alone.
    rules.matches(policy, node)
        && (!refused.contains(name)
            || crate::node::label(node, ttdrv_api::labels::CLAIM) == Some(name)
            || crate::node::record(node)
                .ok()
                .flatten()
                .is_some_and(|r| r.policy == name && r.state.is_in_progress()))
}

/// What [`assign`] would decide for `node` (None: the node is gone), without
/// looking at any other node: lets a change to a few nodes be checked against
/// the last assignment in O(policies) each.
pub fn claim_of<'a>(
    policies: impl IntoIterator<Item = &'a TenstorrentDriverPolicy>,
    node: Option<&Node>,
    refused: &Refused,
    rules: Eligibility,
) -> NodeClaim {
    let Some(node) = node else {
        return NodeClaim::default();
    };
    let mut matching: Vec<&TenstorrentDriverPolicy> = policies
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| may_own(p, node, refused, rules))
        .collect();
    matching.sort_by_key(|p| age_key(p));
    let mut names = matching
        .into_iter()
        .map(|p| p.metadata.name.clone().unwrap_or_default());
    let owner = names.next();
    let mut losers: Vec<String> = names.collect();
    losers.sort();
    NodeClaim { owner, losers }
}

pub fn assign<'a>(
    policies: impl IntoIterator<Item = &'a TenstorrentDriverPolicy>,
    nodes: impl IntoIterator<Item = &'a Node>,
    refused: &Refused,
    rules: Eligibility,
) -> Assignment {
    let mut policies: Vec<&TenstorrentDriverPolicy> = policies
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    policies.sort_by_key(|p| age_key(p));
    let mut out = Assignment::default();
    for p in &policies {
        out.owned
            .entry(p.metadata.name.clone().unwrap_or_default())
            .or_default();
    }
    let mut nodes: Vec<&Node> = nodes.into_iter().collect();
    nodes.sort_by_key(|n| n.metadata.name.clone());
    for node in nodes {
        let name = node.metadata.name.clone().unwrap_or_default();
        let mut matching = policies.iter().filter(|p| may_own(p, node, refused, rules));
        let Some(owner) = matching.next() else {
            continue;
        };
        let owner_name = owner.metadata.name.clone().unwrap_or_default();
        out.owned
            .entry(owner_name.clone())
            .or_default()
            .push(name.clone());
        for loser in matching {
            out.conflicts
                .entry(loser.metadata.name.clone().unwrap_or_default())
                .or_default()
                .push((name.clone(), owner_name.clone()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use ttdrv_api::TenstorrentDriverPolicySpec;

    /// A node named `name` with labels `l` (also for `eligibility_tests`).
    pub(super) fn node(name: &str, l: &[(&str, &str)]) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(
                    l.iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn policy(name: &str, created: i64, yaml: &str) -> TenstorrentDriverPolicy {
        let spec: TenstorrentDriverPolicySpec = serde_yaml::from_str(yaml).expect("spec");
        let mut p = TenstorrentDriverPolicy::new(name, spec);
        p.metadata.creation_timestamp = Some(Time(
            k8s_openapi::jiff::Timestamp::from_second(created).expect("ts"),
        ));
        p
    }

    const TT: (&str, &str) = (labels::TT_PCI_PRESENT, "true");

    /// Nodes a (prod), b (canary), c (prod, skipped), d (prod, not
    /// Tenstorrent); policies prod and canary by pool, and the newer "all".
    fn pools() -> (Vec<Node>, [TenstorrentDriverPolicy; 3]) {
        let nodes = vec![
            node("a", &[TT, ("pool", "prod")]),
            node("b", &[TT, ("pool", "canary")]),
            node("c", &[TT, ("pool", "prod"), (labels::SKIP, "true")]),
            node("d", &[("pool", "prod")]),
        ];
        let prod = policy(
            "prod",
            10,
            "version: \"2.7.0\"\nnodeAffinity: {matchLabels: {pool: prod}}",
        );
        let canary = policy(
            "canary",
            20,
            "version: \"2.8.0\"\nnodeAffinity: {matchLabels: {pool: canary}}",
        );
        let all = policy("all", 30, "version: \"2.8.0\"\nnodeAffinity: {}");
        (nodes, [prod, canary, all])
    }

    #[test]
    fn disjoint_pools_and_overlap() {
        let (nodes, [prod, canary, all]) = pools();
        let a = assign(
            [&prod, &canary, &all],
            &nodes,
            &Refused::new(),
            Eligibility::default(),
        );
        assert_eq!(a.owned["prod"], vec!["a"]);
        assert_eq!(a.owned["canary"], vec!["b"]);
        assert!(
            a.owned["all"].is_empty(),
            "the newest policy loses every shared node"
        );
        assert_eq!(
            a.conflicts["all"],
            vec![
                ("a".to_string(), "prod".to_string()),
                ("b".to_string(), "canary".to_string())
            ]
        );
        assert_eq!(a.owner_of("a"), Some("prod"));
        assert_eq!(a.owner_of("c"), None, "skip label opts out");
        assert_eq!(a.owner_of("d"), None, "non-Tenstorrent node");
    }

    #[test]
    fn one_nodes_claim_agrees_with_the_whole_assignment() {
        let (mut nodes, [prod, canary, all]) = pools();
        nodes.push(node("e", &[TT]));
        let also = policy("also", 30, "version: \"2.8.0\"\nnodeAffinity: {}");
        let policies = [&prod, &canary, &all, &also];
        let a = assign(policies, &nodes, &Refused::new(), Eligibility::default());
        for n in &nodes {
            let name = n.metadata.name.as_deref().unwrap_or_default();
            assert_eq!(
                claim_of(policies, Some(n), &Refused::new(), Eligibility::default()),
                a.claim(name),
                "node {name}"
            );
        }
        assert_eq!(
            a.claim("a"),
            NodeClaim {
                owner: Some("prod".into()),
                losers: vec!["all".into(), "also".into()]
            }
        );
        assert_eq!(
            claim_of(policies, None, &Refused::new(), Eligibility::default()),
            a.claim("gone")
        );
        // A relabelled node: its claim differs from the last assignment's.
        let moved = node("a", &[TT, ("pool", "canary")]);
        assert_ne!(
            claim_of(
                policies,
                Some(&moved),
                &Refused::new(),
                Eligibility::default()
            ),
            a.claim("a")
        );
    }

    #[test]
    fn same_age_breaks_ties_by_name() {
        let nodes = vec![node("a", &[TT])];
        let x = policy("x", 10, "version: \"2.7.0\"\nnodeAffinity: {}");
        let y = policy("y", 10, "version: \"2.7.0\"\nnodeAffinity: {}");
        let a = assign([&y, &x], &nodes, &Refused::new(), Eligibility::default());
        assert_eq!(a.owner_of("a"), Some("x"));
        assert_eq!(a.conflicts["y"].len(), 1);
    }

    #[test]
    fn a_refused_policy_keeps_only_its_nodes_mid_cycle() {
        let mut busy = node("b", &[TT]);
        let mut rec = crate::machine::NodeRecord::new("old", "2.8.0", 1);
        rec.state = ttdrv_api::NodeState::Draining;
        busy.metadata.annotations = Some(
            [(
                ttdrv_api::labels::UPGRADE_STATE.to_string(),
                serde_json::to_string(&rec).expect("record"),
            )]
            .into(),
        );
        let nodes = vec![node("a", &[TT]), busy];
        let old = policy("old", 10, "version: \"2.8.0\"\nnodeAffinity: {}");
        let new = policy("new", 20, "version: \"2.7.0\"\nnodeAffinity: {}");
        let refused: Refused = ["old".to_string()].into();
        let a = assign([&old, &new], &nodes, &refused, Eligibility::default());
        assert_eq!(
            a.owner_of("a"),
            Some("new"),
            "no capture by a broken policy"
        );
        assert_eq!(
            a.owner_of("b"),
            Some("old"),
            "its cycle under way stays its own"
        );
        for n in &nodes {
            let name = n.metadata.name.clone().unwrap_or_default();
            assert_eq!(
                claim_of([&old, &new], Some(n), &refused, Eligibility::default()),
                a.claim(&name)
            );
        }
        let a = assign(
            [&old, &new],
            &nodes,
            &Refused::new(),
            Eligibility::default(),
        );
        assert_eq!(
            a.owner_of("a"),
            Some("old"),
            "accepted again: the older owns"
        );
    }
}

#[cfg(test)]
mod eligibility_tests {
    use super::*;

    fn node(l: &[(&str, &str)]) -> Node {
        super::tests::node("n", l)
    }

    #[test]
    fn without_nfd_the_pci_label_is_not_required() {
        let strict = Eligibility::default();
        let lax = Eligibility {
            require_tenstorrent_label: false,
        };
        let bare = node(&[("pool", "a")]);
        let tt = node(&[(labels::TT_PCI_PRESENT, "true")]);
        let skipped = node(&[(labels::SKIP, "true")]);
        assert!(!strict.eligible(&bare));
        assert!(strict.eligible(&tt));
        assert!(lax.eligible(&bare));
        assert!(lax.eligible(&tt));
        assert!(!lax.eligible(&skipped), "the skip label still wins");
        let keys = |e: Eligibility| -> Vec<&str> {
            e.requirements().into_iter().map(|(k, _, _)| k).collect()
        };
        assert_eq!(keys(strict), [labels::TT_PCI_PRESENT, labels::SKIP]);
        assert_eq!(keys(lax), [labels::SKIP]);
    }

    #[test]
    fn assignment_follows_the_rules() {
        let spec: ttdrv_api::TenstorrentDriverPolicySpec =
            serde_yaml::from_str("version: \"2.8.0\"\nnodeAffinity: {matchLabels: {pool: a}}")
                .expect("spec");
        let p = TenstorrentDriverPolicy::new("fleet", spec);
        let n = node(&[("pool", "a")]);
        let none = assign([&p], [&n], &Refused::new(), Eligibility::default());
        assert_eq!(none.owner_of("n"), None);
        let lax = Eligibility {
            require_tenstorrent_label: false,
        };
        let some = assign([&p], [&n], &Refused::new(), lax);
        assert_eq!(some.owner_of("n"), Some("fleet"));
        assert_eq!(
            claim_of([&p], Some(&n), &Refused::new(), lax)
                .owner
                .as_deref(),
            Some("fleet")
        );
    }

    #[test]
    fn an_unmanaged_policy_owns_its_nodes_to_vacate_them() {
        let spec: ttdrv_api::TenstorrentDriverPolicySpec =
            serde_yaml::from_str("version: \"2.8.0\"\nnodeAffinity: {}\nunmanage: true")
                .expect("spec");
        assert!(spec.unmanage, "kept, not dropped");
        let p = TenstorrentDriverPolicy::new("vacate", spec);
        let n = node(&[(labels::TT_PCI_PRESENT, "true")]);
        let a = assign([&p], [&n], &Refused::new(), Eligibility::default());
        assert_eq!(a.owner_of("n"), Some("vacate"));
        assert_eq!(
            claim_of([&p], Some(&n), &Refused::new(), Eligibility::default())
                .owner
                .as_deref(),
            Some("vacate")
        );
    }
}
