//! `handback <policy>`: give a policy's nodes back to the Go operator before a
//! `helm rollback`. The decision is pure ([`decide`]); [`crate::commands`]
//! reads the cluster, prints the plan and carries it out.
//!
//! Why it is needed: the Go controller, brought back by `helm rollback`, finds
//! our `ttdrv-<policy>` DaemonSet with another template hash, cordons and
//! drains every matched node at once, then fails to update it (its selector
//! is immutable and differs). With our DaemonSet gone it creates its own
//! instead, which it does without any cordon or drain.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Node;
use serde::Serialize;
use ttdrv_api::labels;
use ttdrv_core::machine::Cordon;
use ttdrv_core::node::{self, RETRY_ANNOTATION};

/// What the hand-back does to one node of the policy.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeAction {
    pub name: String,
    /// Our cordon (our record says we set it): undone.
    pub uncordon: bool,
    /// A cordon that is not ours (an admin's, another tool's, or the Go
    /// operator's own `cordoned-by`): left as it is, with whose it is.
    pub kept_cordon: Option<String>,
    /// Our node labels removed (none the Go operator reads).
    pub remove_labels: Vec<String>,
    /// Our node annotations removed.
    pub remove_annotations: Vec<String>,
}

impl NodeAction {
    pub fn changes(&self) -> bool {
        self.uncordon || !self.remove_labels.is_empty() || !self.remove_annotations.is_empty()
    }

    /// The merge patch that carries the action out (None: nothing to change).
    pub fn patch(&self) -> Option<serde_json::Value> {
        if !self.changes() {
            return None;
        }
        let mut p = serde_json::json!({ "metadata": { "labels": {}, "annotations": {} } });
        for k in &self.remove_labels {
            p["metadata"]["labels"][k] = serde_json::Value::Null;
        }
        for k in &self.remove_annotations {
            p["metadata"]["annotations"][k] = serde_json::Value::Null;
        }
        if self.uncordon {
            p["spec"] = serde_json::json!({ "unschedulable": false });
        }
        Some(p)
    }
}

/// A node in a cycle of ours: the hand-back waits for it (or `--force`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InCycle {
    pub name: String,
    /// Its state, or `GoAhead` when only a go-ahead for a swap is on it.
    pub state: String,
}

/// A node of the policy whose loaded tt-kmd is not the policy's version:
/// once rolled back, the Go controller's DaemonSet swaps it in place, on
/// every such node at once, without cordon or drain.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Behind {
    pub name: String,
    /// Its `kmd-version` label.
    pub loaded: String,
}

/// The hand-back of one policy.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    pub policy: String,
    /// spec.paused is set (false when it already was).
    pub pause: bool,
    /// `ttdrv-<policy>` in the operator namespace, when it is ours to delete.
    pub delete_daemonset: Option<String>,
    /// A DaemonSet of that name that is not ours (the Go operator's, say): left.
    pub foreign_daemonset: Option<String>,
    /// Nodes mid-cycle: refused unless forced.
    pub in_cycle: Vec<InCycle>,
    /// The policy's version (`spec.version`).
    pub version: String,
    /// Nodes at another version than [`Plan::version`]: refused unless
    /// accepted ([`swap_refusal`]).
    pub behind: Vec<Behind>,
    pub nodes: Vec<NodeAction>,
    /// Nodes whose record cannot be read: their cordon is left alone.
    pub unreadable: Vec<String>,
}

/// Whether the node belongs to `policy` as far as our marks go: its claim
/// label or its record names the policy.
fn ours(n: &Node, policy: &str, record_policy: Option<&str>) -> bool {
    node::label(n, labels::CLAIM) == Some(policy) || record_policy == Some(policy)
}

/// Whether `ds` is the DaemonSet our controller made for `policy`: our claim
/// label in its selector (the Go DaemonSet selects on `driver.tenstorrent.com/cr`).
pub fn daemonset_is_ours(ds: &DaemonSet, policy: &str) -> bool {
    ds.spec
        .as_ref()
        .and_then(|s| s.selector.match_labels.as_ref())
        .and_then(|l| l.get(labels::CLAIM))
        .is_some_and(|p| p == policy)
}

/// The hand-back of `policy` at `version`, from the policy's `spec.paused`,
/// every node and the DaemonSet named `ttdrv-<policy>` (if any).
pub fn decide(
    policy: &str,
    version: &str,
    paused: bool,
    nodes: &[Node],
    ds: Option<&DaemonSet>,
) -> Plan {
    let mut plan = Plan {
        policy: policy.to_string(),
        version: version.to_string(),
        pause: !paused,
        ..Plan::default()
    };
    if let Some(ds) = ds {
        let name = ds.metadata.name.clone().unwrap_or_default();
        if daemonset_is_ours(ds, policy) {
            plan.delete_daemonset = Some(name);
        } else {
            plan.foreign_daemonset = Some(name);
        }
    }
    for n in nodes {
        let name = n.metadata.name.clone().unwrap_or_default();
        let record = match node::record(n) {
            Ok(r) => r,
            Err(_) => {
                if node::label(n, labels::CLAIM) == Some(policy) {
                    plan.unreadable.push(name.clone());
                }
                None
            }
        };
        if !ours(n, policy, record.as_ref().map(|r| r.policy.as_str())) {
            continue;
        }
        let record = record.filter(|r| r.policy == policy);
        let go_ahead = node::annotation(n, labels::GO_AHEAD).is_some();
        if let Some(r) = record.as_ref().filter(|r| r.state.is_in_progress()) {
            plan.in_cycle.push(InCycle {
                name: name.clone(),
                state: r.state.as_str().to_string(),
            });
        } else if go_ahead {
            plan.in_cycle.push(InCycle {
                name: name.clone(),
                state: "GoAhead".to_string(),
            });
        }
        let mut a = NodeAction {
            name: name.clone(),
            ..NodeAction::default()
        };
        let cordoned = node::unschedulable(n);
        let go_cordon = node::annotation(n, labels::GO_CORDONED_BY);
        let by_us = record
            .as_ref()
            .is_some_and(|r| r.cordon == Cordon::Ours && !plan.unreadable.contains(&name));
        if cordoned && by_us {
            a.uncordon = true;
            // A Go cordon we had taken over is undone with ours.
            if go_cordon == Some(policy) {
                a.remove_annotations
                    .push(labels::GO_CORDONED_BY.to_string());
                if node::annotation(n, labels::GO_CORDONED_AT).is_some() {
                    a.remove_annotations
                        .push(labels::GO_CORDONED_AT.to_string());
                }
            }
        } else if cordoned {
            a.kept_cordon = Some(match go_cordon {
                Some(cr) => format!("the Go operator's ({} = {cr})", labels::GO_CORDONED_BY),
                None => "not ours (an admin's or another tool's)".to_string(),
            });
        }
        if node::label(n, labels::CLAIM) == Some(policy) {
            a.remove_labels.push(labels::CLAIM.to_string());
        }
        // What our agent wrote that the Go operator neither writes nor reads
        // (it keeps kmd-version, install-mode and tt-smi's version, which it
        // reads): nothing of ours stays behind.
        if node::label(n, labels::KMD_PREPARED).is_some() {
            a.remove_labels.push(labels::KMD_PREPARED.to_string());
        }
        let loaded = node::label(n, labels::KMD_VERSION);
        let host = node::label(n, labels::INSTALL_MODE) == Some(labels::INSTALL_MODE_HOST);
        if let Some(v) = loaded.filter(|v| !host && !node::same_version(Some(v), version)) {
            plan.behind.push(Behind {
                name: name.clone(),
                loaded: v.to_string(),
            });
        }
        // Deploy gates we closed for a cycle (still closed while it runs or
        // after it failed) are opened as our uncordon opens them: removed,
        // which is also how the Go operator opens its own.
        if record
            .as_ref()
            .is_some_and(|r| r.state.is_in_progress() || r.state.is_failed())
        {
            let closed = n.metadata.labels.iter().flatten().filter(|(k, v)| {
                k.starts_with(labels::DEPLOY_GATE_PREFIX) && v.as_str() == "false"
            });
            a.remove_labels.extend(closed.map(|(k, _)| k.clone()));
        }
        if record.is_some() {
            a.remove_annotations.push(labels::UPGRADE_STATE.to_string());
        }
        for k in [
            labels::GO_AHEAD,
            labels::ROLLBACK_VERDICT,
            RETRY_ANNOTATION,
            labels::KMD_PARAMETERS,
        ] {
            if node::annotation(n, k).is_some() {
                a.remove_annotations.push(k.to_string());
            }
        }
        plan.nodes.push(a);
    }
    plan.nodes.sort_by(|a, b| a.name.cmp(&b.name));
    plan.in_cycle.sort_by(|a, b| a.name.cmp(&b.name));
    plan.behind.sort_by(|a, b| a.name.cmp(&b.name));
    plan
}

/// The flag that accepts handing back nodes at another version.
pub const ACCEPT_FLAG: &str = "--accept-go-swap";

/// Why the hand-back refuses, when nodes run another version than the
/// policy's and the operator has not accepted ([`ACCEPT_FLAG`]) what the Go
/// controller then does to them.
pub fn swap_refusal(plan: &Plan, accept: bool) -> Option<String> {
    if accept || plan.behind.is_empty() {
        return None;
    }
    Some(format!(
        "refusing to hand back policy {:?}: {}. Once rolled back, the Go controller installs tt-kmd {} \
         on all of them at once, without cordon or drain, with the pods that use the devices \
         running. Finish the rollout first (resume it, then `handback --wait`), or set spec.version \
         back to the version they run; or add {ACCEPT_FLAG} to hand back anyway",
        plan.policy,
        behind_text(plan),
        plan.version
    ))
}

fn behind_text(plan: &Plan) -> String {
    let nodes: Vec<String> = plan
        .behind
        .iter()
        .map(|b| format!("{} (tt-kmd {})", b.name, b.loaded))
        .collect();
    format!(
        "{} node(s) run another tt-kmd than its version {}: {}",
        nodes.len(),
        plan.version,
        nodes.join(", ")
    )
}

/// The lines `handback` prints: what it does (`done`), or would do.
pub fn render(plan: &Plan, namespace: &str, done: bool) -> String {
    let (will, did) = if done {
        ("", "")
    } else {
        ("would ", "would be ")
    };
    let mut out = String::new();
    let p = &plan.policy;
    if plan.pause {
        out.push_str(&format!(
            "policy {p:?}: {will}set spec.paused=true (our controller no longer applies its DaemonSet or starts a node)\n"
        ));
    } else {
        out.push_str(&format!("policy {p:?}: already paused\n"));
    }
    for c in &plan.in_cycle {
        out.push_str(&format!(
            "node {}: in a cycle ({}), handed back as it stands (--force)\n",
            c.name, c.state
        ));
    }
    if !plan.behind.is_empty() {
        out.push_str(&format!(
            "{}: the Go controller, once rolled back, swaps them all at once, without cordon or drain (refused without {ACCEPT_FLAG})\n",
            behind_text(plan)
        ));
    }
    match (&plan.delete_daemonset, &plan.foreign_daemonset) {
        (Some(ds), _) => out.push_str(&format!(
            "daemonset {namespace}/{ds}: {did}deleted, its installer pods with it (each agent exits on SIGTERM and leaves the loaded module loaded)\n"
        )),
        (None, Some(ds)) => out.push_str(&format!(
            "daemonset {namespace}/{ds}: not ours (no {} in its selector), left\n",
            labels::CLAIM
        )),
        (None, None) => out.push_str(&format!(
            "daemonset {namespace}/ttdrv-{p}: not found, nothing to delete\n"
        )),
    }
    for a in &plan.nodes {
        let mut what = vec![];
        if a.uncordon {
            what.push(format!("{will}uncordon (our cordon)"));
        }
        if let Some(whose) = &a.kept_cordon {
            what.push(format!("cordon kept: {whose}"));
        }
        let removed: Vec<&str> = a
            .remove_labels
            .iter()
            .chain(&a.remove_annotations)
            .map(String::as_str)
            .collect();
        if !removed.is_empty() {
            what.push(format!("{will}remove {}", removed.join(", ")));
        }
        if what.is_empty() {
            what.push("nothing to change".to_string());
        }
        out.push_str(&format!("node {}: {}\n", a.name, what.join("; ")));
    }
    for n in &plan.unreadable {
        out.push_str(&format!(
            "node {n}: its {} record cannot be read; its cordon is left alone\n",
            labels::UPGRADE_STATE
        ));
    }
    out.push_str(&format!(
        "kept on every node: {}, {}, {} (the loaded module, as the Go operator reads them)\n",
        labels::KMD_VERSION,
        labels::INSTALL_MODE,
        labels::TT_SMI_VERSION
    ));
    if done {
        out.push_str(&format!(
            "handed back: run `helm rollback` to the Go release; then `kubectl tt driver resume {p}` (or unset spec.paused): the Go controller creates its DaemonSet ttdrv-{p} without a cordon\n"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    use k8s_openapi::api::apps::v1::DaemonSetSpec;
    use k8s_openapi::api::core::v1::NodeSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

    fn record(policy: &str, state: &str, cordoned_by_us: bool, was_unschedulable: bool) -> String {
        serde_json::json!({
            "policy": policy, "state": state, "target": "2.8.0", "since": 1,
            "cordonedByUs": cordoned_by_us, "wasUnschedulable": was_unschedulable,
        })
        .to_string()
    }

    fn node(name: &str, cordoned: bool, labels: &[(&str, &str)], annos: &[(&str, &str)]) -> Node {
        let map = |kv: &[(&str, &str)]| -> BTreeMap<String, String> {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(map(labels)),
                annotations: Some(map(annos)),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                unschedulable: Some(cordoned),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn ds(selector: &[(&str, &str)]) -> DaemonSet {
        DaemonSet {
            metadata: ObjectMeta {
                name: Some("ttdrv-fleet".into()),
                ..Default::default()
            },
            spec: Some(DaemonSetSpec {
                selector: LabelSelector {
                    match_labels: Some(
                        selector
                            .iter()
                            .map(|(k, v)| (k.to_string(), v.to_string()))
                            .collect(),
                    ),
                    ..Default::default()
                },
                ..Default::default()
            }),
            status: None,
        }
    }

    const CLAIM: &str = labels::CLAIM;
    const STATE: &str = labels::UPGRADE_STATE;

    #[test]
    fn our_cordon_is_undone_and_anyone_elses_kept() {
        let ours = record("fleet", "Failed", true, false);
        let theirs = record("fleet", "Done", false, true);
        let done = record("fleet", "Done", false, false);
        let nodes = [
            node("a", true, &[(CLAIM, "fleet")], &[(STATE, &ours)]),
            node("b", true, &[(CLAIM, "fleet")], &[(STATE, &theirs)]),
            node("c", true, &[(CLAIM, "fleet")], &[(STATE, &done)]),
            node(
                "d",
                true,
                &[(CLAIM, "fleet")],
                &[(labels::GO_CORDONED_BY, "fleet")],
            ),
            node("e", false, &[(CLAIM, "fleet")], &[(STATE, &done)]),
        ];
        let p = decide("fleet", "2.8.0", false, &nodes, None);
        let by = |n: &str| p.nodes.iter().find(|a| a.name == n).expect(n).clone();
        assert!(by("a").uncordon);
        for n in ["b", "c", "d", "e"] {
            assert!(!by(n).uncordon, "{n} is not ours to uncordon");
        }
        assert!(by("b").kept_cordon.is_some() && by("c").kept_cordon.is_some());
        assert!(
            by("d")
                .kept_cordon
                .as_deref()
                .is_some_and(|w| w.contains("Go"))
        );
        assert_eq!(by("e").kept_cordon, None);
        assert!(p.in_cycle.is_empty() && p.pause);
        // Our marks go, the loaded-module labels are never named.
        assert_eq!(by("a").remove_labels, [CLAIM]);
        assert_eq!(by("a").remove_annotations, [STATE]);
        let patch = by("a").patch().expect("a patch");
        assert_eq!(patch["spec"]["unschedulable"], false);
        assert!(patch["metadata"]["labels"][CLAIM].is_null());
        assert!(by("d").patch().is_some_and(|p| p.get("spec").is_none()));
    }

    #[test]
    fn a_go_cordon_we_took_over_goes_with_ours() {
        let ours = record("fleet", "Failed", true, false);
        let n = node(
            "a",
            true,
            &[(CLAIM, "fleet")],
            &[
                (STATE, &ours),
                (labels::GO_CORDONED_BY, "fleet"),
                (labels::GO_CORDONED_AT, "2026-01-01T00:00:00Z"),
            ],
        );
        let p = decide("fleet", "2.8.0", true, &[n], None);
        assert!(!p.pause, "already paused");
        assert!(p.nodes[0].uncordon);
        for k in [labels::GO_CORDONED_BY, labels::GO_CORDONED_AT] {
            assert!(p.nodes[0].remove_annotations.iter().any(|a| a == k), "{k}");
        }
    }

    #[test]
    fn cycles_in_progress_and_go_aheads_are_reported() {
        let draining = record("fleet", "Draining", true, false);
        let done = record("fleet", "Done", false, false);
        let nodes = [
            node("a", true, &[(CLAIM, "fleet")], &[(STATE, &draining)]),
            node(
                "b",
                false,
                &[(CLAIM, "fleet")],
                &[(STATE, &done), (labels::GO_AHEAD, "{}")],
            ),
            node("c", false, &[(CLAIM, "fleet")], &[(STATE, &done)]),
        ];
        let p = decide("fleet", "2.8.0", false, &nodes, None);
        let states: Vec<_> = p
            .in_cycle
            .iter()
            .map(|c| (c.name.as_str(), c.state.as_str()))
            .collect();
        assert_eq!(states, [("a", "Draining"), ("b", "GoAhead")]);
        let b = p.nodes.iter().find(|a| a.name == "b").expect("b");
        assert!(b.remove_annotations.iter().any(|a| a == labels::GO_AHEAD));
    }

    #[test]
    fn gates_we_closed_are_opened_and_no_others() {
        let gate = labels::DEFAULT_DEPLOY_GATE;
        let failed = record("fleet", "Failed", true, false);
        let done = record("fleet", "Done", false, false);
        let nodes = [
            node(
                "a",
                true,
                &[(CLAIM, "fleet"), (gate, "false"), ("app/x", "false")],
                &[(STATE, &failed)],
            ),
            // Done: its gates were opened by us; a closed one is someone else's.
            node(
                "b",
                false,
                &[(CLAIM, "fleet"), (gate, "false")],
                &[(STATE, &done)],
            ),
        ];
        let p = decide("fleet", "2.8.0", false, &nodes, None);
        assert_eq!(p.nodes[0].remove_labels, [CLAIM, gate]);
        assert_eq!(p.nodes[1].remove_labels, [CLAIM]);
        let patch = p.nodes[0].patch().expect("a patch");
        assert!(patch["metadata"]["labels"][gate].is_null());
        assert!(patch["metadata"]["labels"].get("app/x").is_none());
    }

    #[test]
    fn other_policies_nodes_and_unreadable_records_are_left_alone() {
        let other = record("other", "Failed", true, false);
        let nodes = [
            node("x", true, &[(CLAIM, "other")], &[(STATE, &other)]),
            node("y", true, &[(CLAIM, "fleet")], &[(STATE, "{not json")]),
            node("z", false, &[], &[]),
        ];
        let p = decide("fleet", "2.8.0", false, &nodes, None);
        assert_eq!(p.nodes.len(), 1, "{p:?}");
        assert_eq!(p.nodes[0].name, "y");
        assert!(!p.nodes[0].uncordon);
        assert_eq!(p.unreadable, ["y"]);
    }

    #[test]
    fn only_our_daemonset_is_deleted() {
        let mine = ds(&[
            ("app.kubernetes.io/name", "tt-driver-installer"),
            (CLAIM, "fleet"),
        ]);
        let go = ds(&[
            ("app.kubernetes.io/name", "tt-kmd-installer"),
            ("app.kubernetes.io/component", "driver"),
            ("driver.tenstorrent.com/cr", "fleet"),
        ]);
        let p = decide("fleet", "2.8.0", false, &[], Some(&mine));
        assert_eq!(p.delete_daemonset.as_deref(), Some("ttdrv-fleet"));
        let p = decide("fleet", "2.8.0", false, &[], Some(&go));
        assert_eq!(p.delete_daemonset, None);
        assert_eq!(p.foreign_daemonset.as_deref(), Some("ttdrv-fleet"));
        assert!(render(&p, "ns", false).contains("not ours"));
    }

    /// What our agent wrote goes with the hand-back: `kmd-prepared` and
    /// `kmd-parameters`; what the Go operator reads stays.
    #[test]
    fn our_agents_marks_are_removed() {
        let done = record("fleet", "Done", false, false);
        let n = node(
            "a",
            false,
            &[
                (CLAIM, "fleet"),
                (labels::KMD_PREPARED, "2.8.0"),
                (labels::KMD_VERSION, "2.8.0"),
                (labels::INSTALL_MODE, "container"),
            ],
            &[(STATE, &done), (labels::KMD_PARAMETERS, "max_devices=4")],
        );
        let p = decide("fleet", "2.8.0", false, &[n], None);
        let a = &p.nodes[0];
        assert_eq!(a.remove_labels, [CLAIM, labels::KMD_PREPARED]);
        assert_eq!(a.remove_annotations, [STATE, labels::KMD_PARAMETERS]);
        let patch = a.patch().expect("a patch");
        assert!(patch["metadata"]["labels"][labels::KMD_PREPARED].is_null());
        assert!(patch["metadata"]["annotations"][labels::KMD_PARAMETERS].is_null());
        assert!(
            patch["metadata"]["labels"]
                .get(labels::KMD_VERSION)
                .is_none()
        );
        assert!(p.behind.is_empty(), "at the version: {p:?}");
        assert_eq!(swap_refusal(&p, false), None);
    }

    /// Nodes at another version (mid-rollout) are refused, with what the Go
    /// controller would do to them, unless accepted; DKMS nodes and nodes
    /// with nothing loaded are not counted.
    #[test]
    fn nodes_behind_the_version_are_refused_unless_accepted() {
        let draining = record("fleet", "Draining", true, false);
        let done = record("fleet", "Done", false, false);
        let at = |v: &str| (labels::KMD_VERSION, v.to_string());
        let nodes = [
            node(
                "old",
                true,
                &[(CLAIM, "fleet"), (at("2.7.0").0, "2.7.0")],
                &[(STATE, &draining)],
            ),
            node(
                "new",
                false,
                &[(CLAIM, "fleet"), (at("2.8.0").0, "2.8.0")],
                &[(STATE, &done)],
            ),
            node(
                "dkms",
                false,
                &[
                    (CLAIM, "fleet"),
                    (labels::KMD_VERSION, "2.6.0"),
                    (labels::INSTALL_MODE, "host"),
                ],
                &[(STATE, &done)],
            ),
            node("empty", false, &[(CLAIM, "fleet")], &[(STATE, &done)]),
        ];
        let p = decide("fleet", "2.8.0", false, &nodes, None);
        assert_eq!(
            p.behind,
            [Behind {
                name: "old".into(),
                loaded: "2.7.0".into()
            }]
        );
        let why = swap_refusal(&p, false).expect("refused");
        for part in [
            "old (tt-kmd 2.7.0)",
            "all of them at once",
            "without cordon or drain",
            ACCEPT_FLAG,
        ] {
            assert!(why.contains(part), "{part}: {why}");
        }
        assert_eq!(swap_refusal(&p, true), None, "accepted");
        assert!(render(&p, "ns", false).contains("without cordon or drain"));
    }

    #[test]
    fn the_dry_run_text_says_would() {
        let ours = record("fleet", "Failed", true, false);
        let n = node("a", true, &[(CLAIM, "fleet")], &[(STATE, &ours)]);
        let mine = ds(&[(CLAIM, "fleet")]);
        let p = decide("fleet", "2.8.0", false, &[n], Some(&mine));
        let dry = render(&p, "ns", false);
        assert!(dry.contains("would uncordon"), "{dry}");
        assert!(dry.contains("would be deleted"), "{dry}");
        assert!(!dry.contains("helm rollback"), "{dry}");
        let done = render(&p, "ns", true);
        assert!(!done.contains("would"), "{done}");
        assert!(done.contains("helm rollback"), "{done}");
    }
}
